"""A lean launcher for ``@triton.jit`` kernels: the launch of ``kernel[grid](**kwargs)`` with less host time.

Triton's ``JITFunction.run`` binds the arguments, specializes each one, builds a string cache key, looks it up, and
prepares launch metadata and hooks, on every call: about 36 µs of host time per launch of our 45-argument GAE kernel
on an H200 host, four times the kernel's own time at common RL sizes. ``launcher(kernel)(grid, num_warps, **kwargs)``
does the same launch with less work. The first call of each specialization takes the plain path,
``kernel[grid](**kwargs, num_warps=num_warps)`` (which compiles, or finds the compiled kernel in Triton's cache), and
remembers the ``CompiledKernel`` it returns under a key of the specialization (``Specializer``); where a bundle of
precompiled kernels holds that specialization (``_aot``: ``RL_TRITON_TORCHRL_AOT_DIR``), the first call loads it from
there instead of compiling. Later calls with that key call the compiled kernel's own launcher,
``CompiledKernel.run(grid0, grid1, grid2, stream, function, packed_metadata, launch_metadata, enter_hook, exit_hook,
*args)``, on the current device and its current stream (a CUDA graph capture included), as ``JITFunction.run`` does
when no launch hook is set.

The key holds everything Triton 3.6 specializes a kernel on, or more (a finer key only costs a plain call):

- a constexpr parameter, or a ``tl.constexpr`` value passed to any parameter: its value and type;
- a tensor: its dtype and whether its data pointer is 16-byte aligned;
- an int: equal to 1 (a compile-time constant to Triton), divisible by 16, and its integer type (i32, i64, u64);
- a float, bool or None: its type (Triton passes floats as fp32 and makes None a constant);
- the current device, ``num_warps`` and Triton's debug and instrumentation settings.

``do_not_specialize`` parameters are keyed as the others (finer than Triton). Any argument of another type (a tuple,
a tensor descriptor, a numpy scalar, a tensor without a data pointer) takes the plain path, and so does every call
where the launch would differ from Triton's own: under the interpreter (``TRITON_INTERPRET=1``: no compiled
kernels), for a kernel that is not exactly a ``JITFunction`` (autotuned, Gluon), a callable grid, positional or
missing parameters or extra compile options, a pre-run hook on the kernel, a launch hook set in
``triton.knobs.runtime`` (profilers), a changed global the kernel reads (Triton raises), and anything unexpected,
such as an attribute missing in another Triton version. ``RL_TRITON_TORCHRL_LEAN_LAUNCH=0`` (or ``LEAN_LAUNCH =
False``) sends every call down the plain path.

A caller that prepares its arguments itself (``scan.launch``'s launch plans) uses the pieces: ``settings()`` (None
while every launch must take the plain path), ``compiled_for`` (the compiled kernel remembered for arguments just
launched) and ``replay`` (the launch itself; pointer arguments may be passed as ``data_ptr()`` ints, which Triton's C
launcher takes without asking the driver about them).
"""
from __future__ import annotations

import ctypes
import os
import struct
import threading
import warnings
from operator import attrgetter, itemgetter
from typing import Callable, NamedTuple

import torch

try:
    import triton
    from triton import knobs
    from triton.runtime.driver import driver
    from triton.runtime.jit import JITFunction
except ImportError:  # no Triton, or another one: every call takes the plain path
    triton = knobs = driver = JITFunction = None
_CONSTEXPR = getattr(getattr(triton, "language", None), "constexpr", None)

__all__ = ["LEAN_LAUNCH", "PREWARM", "VERIFIED_TRITON", "Launcher", "NativeLaunch", "Specializer", "launcher",
           "prewarm", "replay", "verified_triton"]

# Debugging aid: False sends every launch through ``kernel[grid]``.
LEAN_LAUNCH = os.environ.get("RL_TRITON_TORCHRL_LEAN_LAUNCH", "1") != "0"
# The Triton releases whose internals this module was checked against (specialization rules, ``JITFunction``'s
# attributes, ``CompiledKernel``'s launcher and the parameters it passes to the driver). Any other Triton takes the
# plain path, ``kernel[grid](...)``, for every launch, and says so once (``verified_triton``).
VERIFIED_TRITON = frozenset({"3.6.0"})
# Compiled kernels, and keys of int argument values, remembered per kernel; each is cleared when full (the next call
# of a forgotten compiled kernel takes the plain path again, a forgotten int key is recomputed).
MAX_SPECIALIZATIONS = 256

_HookChain = getattr(knobs, "HookChain", None)
_MISSING = object()
_DTYPE = attrgetter("dtype")


class Specializer:
    """Keys a kernel's arguments by what Triton specializes them on (see the module docstring), cheaply.

    The types of the arguments are looked up first: per tuple of types, a ``_Plan`` says which arguments are ints,
    tensors and constexprs (floats, bools and None need nothing but their type). The keys of the int arguments are
    looked up by their values, which repeat from call to call (sizes, strides). Both enter the key as small numbers
    that are never reused; what is left per call is the tensors' dtypes and alignments and the constexpr values.
    """

    def __init__(self, names: tuple[str, ...], constexpr: tuple[int, ...]):
        self.names = names  # every parameter, in order
        self.constexpr = constexpr  # indices of the constexpr parameters
        self._plans: dict[tuple, _Plan] = {}  # argument types -> plan
        self._int_ids: dict[tuple, int] = {}  # int argument values -> number of their keys
        self._ids: dict[tuple, int] = {}  # int keys, or argument types -> number (kept: a number means one thing)

    @classmethod
    def of(cls, kernel) -> Specializer | None:
        """The specializer of a ``JITFunction`` (exactly that type), else None (a kernel launched the plain way)."""
        if JITFunction is None or type(kernel) is not JITFunction:
            return None
        try:
            params = kernel.params
            return cls(tuple(p.name for p in params), tuple(p.num for p in params if p.is_constexpr))
        except AttributeError:
            return None

    def key(self, args: tuple) -> tuple:
        """The part of the cache key that depends on ``args`` (every parameter, in order); ``TypeError`` for an
        argument type the module docstring does not describe."""
        types = tuple(map(type, args))
        plan = self._plans.get(types)
        if plan is None:
            plan = self._plans[types] = _Plan.of(types, self.constexpr, self._number(types))
        ints = plan.ints(args)
        int_id = self._int_ids.get(ints)
        if int_id is None:
            if len(self._int_ids) >= MAX_SPECIALIZATIONS:
                self._int_ids.clear()
            int_id = self._int_ids[ints] = self._number(tuple(map(_int_key, ints)))
        tensors = plan.tensors(args)
        return (plan.id, int_id, tuple(map(_DTYPE, tensors)), tuple([x.data_ptr() & 15 == 0 for x in tensors]),
                plan.constexprs(args))

    def _number(self, value: tuple) -> int:
        """The number of ``value``: the same for equal values, never reused for another."""
        return self._ids.setdefault(value, len(self._ids))


class _Plan(NamedTuple):
    """Getters of the int, tensor and constexpr arguments of one tuple of argument types (numbered ``id``)."""

    id: int
    ints: Callable[[tuple], tuple]
    tensors: Callable[[tuple], tuple]
    constexprs: Callable[[tuple], tuple]

    @classmethod
    def of(cls, types: tuple, constexpr: tuple[int, ...], number: int) -> _Plan:
        # a ``tl.constexpr`` value passed to a runtime parameter is a compile-time constant too (Triton's rule)
        constexpr = tuple(sorted({*constexpr, *(i for i, t in enumerate(types) if t is _CONSTEXPR)}))
        runtime = [(i, t) for i, t in enumerate(types) if i not in constexpr]
        for _, t in runtime:
            if not (t in (int, float, bool, type(None)) or issubclass(t, torch.Tensor)):
                raise TypeError(f"no lean launch for an argument of type {t.__name__}")
        return cls(number, _getter([i for i, t in runtime if t is int]),
                   _getter([i for i, t in runtime if issubclass(t, torch.Tensor)]), _getter(constexpr))


def _getter(indices) -> Callable[[tuple], tuple]:
    """``args -> tuple(args[i] for i in indices)``, in C for two indices or more."""
    indices = tuple(indices)
    if len(indices) > 1:
        return itemgetter(*indices)
    return lambda args: tuple(args[i] for i in indices)


def _int_key(x: int):
    """What Triton specializes an int argument on: equal to 1, divisible by 16, its integer type (by range)."""
    if x == 1:
        return "1"
    if -0x80000000 <= x <= 0x7FFFFFFF:
        return "i32/16" if x & 15 == 0 else "i32"
    return "int", x & 15 == 0, x < 0, x.bit_length()  # i64 or u64 (or too wide, which Triton refuses)


def _idle(hook) -> bool:
    """Whether a launch hook of ``triton.knobs.runtime`` does nothing (None, or an empty HookChain)."""
    return hook is None or (type(hook) is _HookChain and not hook.calls)


class _Compiled(NamedTuple):
    """What a lean launch needs of a ``CompiledKernel`` (or of a precompiled kernel: ``_aot.find``)."""

    kernel: object  # the CompiledKernel, returned as kernel[grid] returns it (None: a precompiled kernel)
    run: object
    function: int
    packed_metadata: tuple
    native: NativeLaunch | None  # the same launch without Triton's launcher, where it can be made (``native``)


class Launcher:
    """``kernel[grid](**kwargs, num_warps=num_warps)``, reusing the compiled kernel (see the module docstring)."""

    def __init__(self, kernel):
        self.kernel = kernel
        self.name = getattr(kernel, "__name__", None)
        self.specializer = Specializer.of(kernel)
        self.compiled: dict[tuple, _Compiled] = {}
        self._equal_globals: dict[tuple, object] = {}  # (name, id of scope) -> the object last found equal

    def __call__(self, grid, num_warps: int, maxnreg: int | None = None, **kwargs):
        """Launches the kernel over ``grid`` (up to three ints) with ``kwargs`` naming every parameter and at most
        ``maxnreg`` registers per thread (None: Triton's choice); returns what ``kernel[grid]`` returns (the
        compiled kernel, or None under the interpreter), or None for a kernel loaded from a bundle (``_aot``)."""
        key = precompiled = None
        try:
            settings = None if callable(grid) else self.settings()
            if settings is not None:
                args = self.args(kwargs)
                if args is not None:
                    key = self.key(settings, (num_warps, maxnreg), args)
                    hit = self.compiled.get(key)
                    if hit is not None:
                        replay(hit, grid, settings[0], args)
                        return hit.kernel
                    precompiled = _aot.find(self.kernel, settings, kwargs, num_warps, maxnreg)
                    if precompiled is not None:
                        replay(precompiled, grid, settings[0], args)
                        self._keep(key, precompiled)
                        return None
        except Exception as e:  # noqa: BLE001 - anything unexpected: the plain path (which raises Triton's own error)
            if precompiled is not None:
                _aot.launch_failed(precompiled, e)
            key = None
        options = {"num_warps": num_warps} if maxnreg is None else {"num_warps": num_warps, "maxnreg": maxnreg}
        _join_prewarm(whole=False)  # rather than hashing Triton's installation a second time (``prewarm``)
        compiled = self.kernel[grid](**kwargs, **options)
        if key is not None:
            self._remember(key, compiled)
        return compiled

    def settings(self) -> tuple | None:
        """What a lean launch depends on besides its arguments, if one may run now: (current device, the kernel's
        and Triton's debug settings, Triton's instrumentation mode). None where every launch takes the plain path
        now: ``LEAN_LAUNCH`` off, not a ``JITFunction``, a hook set, a changed global, or anything unexpected.
        Read on every replayed call, so written out in one function (0.68 µs a call on an H100 host as three)."""
        try:
            if LEAN_LAUNCH and self.specializer is not None and (_VERIFIED or verified_triton()):
                kernel, runtime = self.kernel, knobs.runtime
                if (not kernel.pre_run_hooks and _idle(runtime.launch_enter_hook) and _idle(runtime.launch_exit_hook)
                        and (not kernel.used_global_vals or self._globals_unchanged())):
                    return (active_driver().get_current_device(), kernel.debug, runtime.debug,
                            knobs.compilation.instrumentation_mode)
        except Exception:  # noqa: BLE001 - e.g. an attribute missing in another Triton: the plain path
            pass
        return None

    def args(self, kwargs: dict) -> tuple | None:
        """``kwargs`` as every parameter in order; None if one is missing or ``kwargs`` holds more (options)."""
        try:
            args = tuple(map(kwargs.__getitem__, self.specializer.names))
        except KeyError:
            return None
        return args if len(args) == len(kwargs) else None

    def key(self, settings: tuple, options: tuple, args: tuple) -> tuple:
        """The cache key of a launch with ``args`` (every parameter, in order) under ``settings`` with ``options``
        (``num_warps``, ``maxnreg``)."""
        return (settings, options, *self.specializer.key(args))

    def compiled_for(self, settings: tuple, num_warps: int, maxnreg: int | None, kwargs: dict) -> _Compiled | None:
        """The compiled kernel remembered for a launch with ``kwargs`` under ``settings``, if any: what a caller
        that launched these arguments once may launch again with ``replay``, with other data of the same key."""
        try:
            args = self.args(kwargs)
            return None if args is None else self.compiled.get(self.key(settings, (num_warps, maxnreg), args))
        except Exception:  # noqa: BLE001 - an argument the key cannot describe: not remembered
            return None

    def _globals_unchanged(self) -> bool:
        """Whether the globals the kernel read when compiled still hold those values (else Triton raises). Triton
        keeps a deep copy of each value, so a ``tl.constexpr`` global is never the recorded object itself, and ``==``
        of two of them goes through Triton's operators (11% of a replayed GAE call's host time on the H200 host):
        the object found equal is remembered, and the next check of the same binding is one ``is``. A global bound
        to another object is compared again."""
        used = self.kernel.used_global_vals
        equal = self._equal_globals
        for key, (value, scope) in used.items():
            now = scope.get(key[0], _MISSING)
            if now is value or now is equal.get(key, _MISSING):
                continue
            if not now == value:
                return False
            equal[key] = now
        return True

    def _remember(self, key: tuple, compiled) -> None:
        """Keeps what a plain call returned, if it is a ready compiled kernel (not a future of one)."""
        try:
            if hasattr(compiled, "result") or compiled.function is None:
                return
            entry = _Compiled(compiled, compiled.run, compiled.function, compiled.packed_metadata,
                              native(compiled, self.specializer.names))
        except AttributeError:  # the interpreter's None, or another Triton
            return
        self._keep(key, entry)

    def _keep(self, key: tuple, entry: _Compiled) -> None:
        if len(self.compiled) >= MAX_SPECIALIZATIONS:
            self.compiled.clear()
        self.compiled[key] = entry


class _TorchGetters:
    """The current device and stream as Triton's GPU drivers get them (torch's own functions), without making that
    driver: making it compiles Triton's C utilities (0.4-0.5 s with an empty Triton cache), which launching a
    precompiled kernel (``_aot``) never needs."""

    get_current_device = staticmethod(torch.cuda.current_device)
    get_current_stream = staticmethod(getattr(torch._C, "_cuda_getCurrentRawStream", None)
                                      or (lambda device: torch.cuda.current_stream(device).cuda_stream))


_TORCH_GETTERS = _TorchGetters()


def active_driver():
    """Triton's active driver where one was made (a plain launch made it, or one was set), else torch's getters."""
    active = driver._active
    return _TORCH_GETTERS if active is None else active


def current_stream(device: int) -> int:
    """The handle of the current CUDA stream of ``device`` (Triton's ``get_current_stream``)."""
    return active_driver().get_current_stream(device)


def replay(hit: _Compiled, grid, device: int, args: tuple) -> None:
    """``CompiledKernel.run`` on the current stream, as ``JITFunction.run`` calls it when no launch hook is set.
    A pointer argument may be a tensor or its ``data_ptr()`` (Triton's C launcher takes either)."""
    n = len(grid)
    hit.run(grid[0], grid[1] if n > 1 else 1, grid[2] if n > 2 else 1, active_driver().get_current_stream(device),
            hit.function, hit.packed_metadata, None, None, None, *args)


_LAUNCHERS: dict[int, Launcher] = {}


def launcher(kernel) -> Launcher:
    """The ``Launcher`` of ``kernel``, one per kernel (which it keeps alive). Anything but a ``JITFunction`` (an
    interpreted kernel, a stand-in) gets one that launches the plain way."""
    lean = _LAUNCHERS.get(id(kernel))
    if lean is None or lean.kernel is not kernel:
        lean = _LAUNCHERS[id(kernel)] = Launcher(kernel)
    return lean


def verified_triton() -> bool:
    """Whether the installed Triton is one this module was verified on (``VERIFIED_TRITON``). On any other the
    lean path is off, and the first launch says so once (a ``RuntimeWarning``)."""
    global _VERIFIED
    if _VERIFIED is None:
        version = getattr(triton, "__version__", None)
        _VERIFIED = version in VERIFIED_TRITON
        if not _VERIFIED and triton is not None:
            warnings.warn(f"rl_triton_torchrl: Triton {version} is not one its lean launcher was verified on "
                          f"({', '.join(sorted(VERIFIED_TRITON))}); every kernel launches through Triton's own "
                          "launcher (same results, more host time per call)", RuntimeWarning, stacklevel=3)
    return _VERIFIED


_VERIFIED: bool | None = None


# ---------------------------------------------------------------------------------------------------------------
# The process's first look into Triton's kernel cache, ahead of the first launch
# ---------------------------------------------------------------------------------------------------------------
# Whatever the kernel, Triton's first lookup in its on-disk cache in a process hashes Triton's own installation
# (``triton.runtime.cache.triton_key``: its compiler and language sources and its libtriton binary), once per process.
# On the development machine (CPU, sm_90 as the target, the cache filled) that is 0.34 s of the 0.41 s of a first GAE
# launch: the rest of a "warm" first call. ``prewarm`` computes it in a daemon thread (hashing and reading files
# release the GIL), started when the kernels are imported by a CUDA build of torch, so that the first launch finds
# it done while the caller was building its environments and models. Then each kernel's own hash (Triton's walk of
# its source and of every ``@triton.jit`` function it calls: 19 of the 30 ms of the first GAE launch of a process on
# an H200 host with the cache filled, 50 ms for all nine kernels on the development machine; pure Python, so it
# shares the GIL with the caller for that long). Once the kernels are imported (Triton's language, compiler and
# backends with them), neither imports anything: the thread only reads and hashes files and sources, so it never
# holds an import lock the caller's thread could wait on (``test_prewarm_imports_nothing``).

# ``RL_TRITON_TORCHRL_PREWARM=0``: no such thread.
PREWARM = os.environ.get("RL_TRITON_TORCHRL_PREWARM", "1") != "0"
_PREWARM_THREAD: threading.Thread | None = None


def _triton_key():
    """Triton's memoised hash of its installation, or None where this Triton has none (another version)."""
    cache = getattr(getattr(triton, "runtime", None), "cache", None)
    key = getattr(cache, "triton_key", None)
    return key if callable(key) and hasattr(key, "cache_info") else None


def prewarm(force: bool = False, kernels=()) -> threading.Thread | None:
    """Starts computing Triton's hash of its installation (``_triton_key``), then each of ``kernels``' own hash
    (``cache_key``), in a daemon thread, once per process; returns the thread, or None where none is started:
    ``PREWARM`` off, no such hash in this Triton, or (unless ``force``) no kernel will be compiled here (a CPU-only
    build of torch, or Triton's interpreter). A kernel's hash is computed there only where Triton guards it with a
    lock (``JITFunction._hash_lock``, Triton 3.6): the first launch of a kernel the thread is hashing waits for it
    rather than reading a half-made hash. A ``fork`` waits for the thread to end (``os.register_at_fork``), so that
    no child starts with a thread that held a lock of its parent, and Python's warning about forking a
    multi-threaded process never names this one."""
    global _PREWARM_THREAD
    key = _triton_key()
    if _PREWARM_THREAD is not None or not PREWARM or key is None:
        return None
    # a CUDA build of torch, not ``torch.cuda.is_available()``, which would query the driver at import (PyTorch
    # documents that query as able to poison a later fork, unless PYTORCH_NVML_BASED_CUDA_CHECK=1)
    if not force and (os.environ.get("TRITON_INTERPRET") == "1" or not torch.backends.cuda.is_built()):
        return None
    locked = tuple(k for k in kernels if getattr(k, "_hash_lock", None) is not None)
    _TRITON_KEY_READY.clear()
    _PREWARM_THREAD = threading.Thread(target=_prewarm, args=(key, locked), name="rl_triton_torchrl-prewarm",
                                       daemon=True)
    _PREWARM_THREAD.start()
    return _PREWARM_THREAD


def _prewarm(key, kernels) -> None:
    try:
        _quietly(key)
    finally:
        _TRITON_KEY_READY.set()
    for kernel in kernels:
        _quietly(attrgetter("cache_key"), kernel)


def _quietly(fn, *args) -> None:
    try:
        fn(*args)
    except Exception:  # noqa: BLE001 - the first launch computes it again, and raises there if it must
        pass


def _join_prewarm(whole: bool = True) -> None:
    """Waits for the prewarm thread, if one runs: for all of it (``whole``: before a fork), or until Triton's hash
    of its installation is done (before a plain launch, which would compute it a second time otherwise; the
    kernels' hashes are each behind Triton's own lock)."""
    thread = _PREWARM_THREAD
    if thread is not None and thread.is_alive() and thread is not threading.current_thread():
        if whole:
            thread.join()
        else:
            _TRITON_KEY_READY.wait()


_TRITON_KEY_READY = threading.Event()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_join_prewarm)


# ---------------------------------------------------------------------------------------------------------------
# Native launches: the driver's cuLaunchKernel on a prepared parameter buffer
# ---------------------------------------------------------------------------------------------------------------
# Triton's launcher (``CompiledKernel.run``: a Python wrapper and a generated C module) parses every argument of
# every launch. A launch plan (``scan.launch``) knows every argument of its launches but the data pointers and the
# float numbers: ``NativeLaunch.prepare`` keeps all parameters in one buffer, in the layout the driver reads, and
# each launch writes only the per-call values into it (one ``struct.pack_into``) and calls ``cuLaunchKernel``
# itself. The parameters are those Triton 3.6's launcher passes (``VERIFIED_TRITON``): the kernel's parameters
# that are not compile-time constants (constexprs, ints equal to 1 and None, which the compiled signature marks
# "constexpr"), in order, then its global and profile scratch pointers (null: kernels that need scratch memory get
# no native launch). The call holds the GIL (``ctypes.PyDLL``), so that no other thread writes a buffer between
# its pack and the driver's copy of the parameters.

# struct formats of the scalar parameter types of Triton's signatures; pointers ("*fp32", ...) are "Q"
_FORMATS = {"i1": "b", "i8": "b", "i16": "h", "i32": "i", "i64": "q", "u1": "B", "u8": "B", "u16": "H",
            "u32": "I", "u64": "Q", "fp32": "f", "f32": "f", "fp64": "d"}
_SLOT = 8  # bytes per parameter in a buffer: every parameter type above fits, 8-byte aligned


class NativeLaunch(NamedTuple):
    """What ``cuLaunchKernel`` needs of a compiled kernel: its function handle, threads per block, dynamic shared
    memory and the (name, struct format) of each parameter it receives, in order (the two scratch pointers
    excluded)."""

    function: int
    block: int
    shared: int
    params: tuple

    def prepare(self, grid, per_call: tuple, fixed: dict) -> PreparedLaunch:
        """A launch of this kernel over ``grid`` whose parameters named in ``per_call`` change from call to call
        (pointers as ints, numbers) and whose others take their values from ``fixed`` (name -> value)."""
        formats = dict(self.params)
        names = [name for name, _ in self.params]
        order = list(per_call) + [name for name in names if name not in per_call]
        if set(per_call) - set(names):
            raise KeyError(f"not runtime parameters of the kernel: {sorted(set(per_call) - set(names))}")
        slot = {name: i for i, name in enumerate(order)}
        n = len(order) + 2  # the global and profile scratch pointers, null
        buffer = ctypes.create_string_buffer(n * _SLOT)
        base = ctypes.addressof(buffer)
        for name in order[len(per_call):]:
            value = fixed[name]
            if value is None or isinstance(value, bool) and formats[name] == "Q":
                value = 0
            struct.pack_into("<" + formats[name], buffer, slot[name] * _SLOT, value)
        params = (ctypes.c_void_p * n)(*[base + slot[name] * _SLOT for name in names],
                                       base + len(order) * _SLOT, base + (len(order) + 1) * _SLOT)
        pack = struct.Struct("<" + "".join(formats[name] + "x" * (_SLOT - struct.calcsize(formats[name]))
                                           for name in per_call)).pack_into
        grid = tuple(grid) + (1,) * (3 - len(grid))
        return PreparedLaunch(self.function, grid, self.block, self.shared, buffer, params,
                              ctypes.addressof(params), pack)


class LaunchError(RuntimeError):
    """``cuLaunchKernel`` returned an error (``code``, a ``CUresult``)."""

    def __init__(self, code: int):
        super().__init__(f"cuLaunchKernel failed: {_driver_error(code)}")
        self.code = code


# CUDA_ERROR_INVALID_CONTEXT: the calling thread has no current context (a thread's first launch, which Triton's
# launcher makes current)
NO_CONTEXT = 201


class PreparedLaunch(NamedTuple):
    """A ``NativeLaunch`` with its grid and fixed parameters in place: ``launch(stream, *values)``."""

    function: int
    grid: tuple
    block: int
    shared: int
    buffer: object  # the parameters (ctypes buffer), kept alive
    params: object  # the pointers to them (ctypes array), kept alive
    params_address: int
    pack: Callable

    def launch(self, stream: int, *values) -> None:
        """Writes ``values`` (the per-call parameters, in ``prepare``'s order) and launches on ``stream``."""
        self.pack(self.buffer, 0, *values)
        g = self.grid
        result = _LIBCUDA[0](self.function, g[0], g[1], g[2], self.block, 1, 1, self.shared, stream,
                             self.params_address, None)
        if result:
            raise LaunchError(result)


def native(compiled, names: tuple) -> NativeLaunch | None:
    """The ``NativeLaunch`` of a ``CompiledKernel`` whose parameters are ``names``, or None where its launch is not
    a plain ``cuLaunchKernel`` as Triton 3.6 makes it (``launch_params``), there is no driver library, or anything
    is unexpected."""
    try:
        params = launch_params(compiled.metadata, compiled.src.signature, names)
        if params is None or _driver_launch() is None:
            return None
        compiled.run  # loads the binary: the function handle
        md = compiled.metadata
        return NativeLaunch(int(compiled.function), 32 * md.num_warps, md.shared, params)
    except Exception:  # noqa: BLE001 - e.g. another Triton's metadata: Triton's launcher
        return None


def launch_params(metadata, signature: dict, names: tuple) -> tuple | None:
    """The (name, struct format) of each parameter the driver passes a kernel compiled with ``metadata`` and
    ``signature`` (name -> Triton type) whose parameters are ``names``, in order; None where its launch is not a
    plain ``cuLaunchKernel`` as Triton 3.6 makes it: clusters, programmatic dependent launch, a cooperative grid,
    scratch memory, a parameter type outside ``_FORMATS``, parameters other than ``names``."""
    md = metadata
    if (getattr(md, "num_ctas", 1) != 1 or getattr(md, "launch_pdl", False)
            or getattr(md, "launch_cooperative_grid", False) or md.global_scratch_size or md.profile_scratch_size):
        return None
    if tuple(signature) != tuple(names):
        return None
    params = []
    for name, ty in signature.items():
        if ty == "constexpr":
            continue
        fmt = "Q" if isinstance(ty, str) and ty.startswith("*") else _FORMATS.get(ty)
        if fmt is None:
            return None
        params.append((name, fmt))
    return tuple(params)


_LIBCUDA = None  # the driver's cuLaunchKernel, or False where it cannot be loaded


def _driver_launch():
    """``cuLaunchKernel`` of libcuda (through ``ctypes.PyDLL``: the GIL stays held), or None without a driver."""
    global _LIBCUDA
    if _LIBCUDA is None:
        try:
            lib = ctypes.PyDLL("libcuda.so.1")
            fn = lib.cuLaunchKernel
            fn.argtypes = [ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
            fn.restype = ctypes.c_int
            err = lib.cuGetErrorString
            err.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]
            err.restype = ctypes.c_int
            _LIBCUDA = (fn, err)
        except (OSError, AttributeError):
            _LIBCUDA = False
    return _LIBCUDA[0] if _LIBCUDA else None


def launch_address() -> int | None:
    """The address of the ``cuLaunchKernel`` native launches call (for ``_fastcall``'s C calls), or None."""
    fn = _driver_launch()
    try:
        return None if fn is None else ctypes.cast(fn, ctypes.c_void_p).value
    except (TypeError, ctypes.ArgumentError):  # not a C function (a stand-in in the tests)
        return None


def _driver_error(code: int) -> str:
    text = ctypes.c_char_p()
    if _LIBCUDA and _LIBCUDA[1] is not None and _LIBCUDA[1](code, ctypes.byref(text)) == 0 and text.value:
        return f"{text.value.decode()} (CUresult {code})"
    return f"CUresult {code}"


from . import _aot  # noqa: E402  (it builds on this module)
