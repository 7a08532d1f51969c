"""Kernels compiled ahead of time: cubins made on a machine without a GPU, loaded and launched without Triton's JIT.

A process's first call of a kernel variant compiles it (Triton's JIT: 0.2-1.4 s per variant on an H200 host, and
Triton hashing its own installation first, 0.3-0.4 s once per process). A *bundle* holds that work done before:
``python -m rl_triton_torchrl.kernels.precompile --out DIR`` compiles the variants that given calls launch, for a
given GPU architecture, on any Linux machine with Triton (no GPU, no CUDA driver), and writes each as a cubin and
its launch metadata. A process that finds ``RL_TRITON_TORCHRL_AOT_DIR`` naming such folders (``os.pathsep``
between them) looks there before compiling: ``find`` loads the cubin of the launch's exact variant through the
driver (``cuModuleLoadData``) and launches it as a launch plan launches any kernel (``_launcher.NativeLaunch``).

A variant is named by a digest of everything its compiled code depends on: this format's version, Triton's
version, the kernel's name and Triton's hash of its source (``JITFunction.cache_key``: the kernel, every
``@triton.jit`` function it calls and the constexpr globals they read), the GPU architecture, ``num_warps`` and
``maxnreg``, the launcher's debug and instrumentation settings, Triton's cache-invalidating environment variables,
and what Triton specializes the arguments on (``specialization``: each tensor's dtype and 16-byte alignment, each
int's type, divisibility by 16 and equality to 1, every constexpr value). The same call on CPU tensors at build
time and on CUDA tensors later gives the same digest; any other argument, source, Triton or setting gives another,
which is not in the bundle: that launch compiles as before. The entry's metadata repeats the whole key, compared
before loading. Only the lean path consults a bundle (``Launcher.settings``: a verified Triton, no hooks, ...), so every
case that takes Triton's plain launch keeps taking it.
"""
from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import os
import warnings
from pathlib import Path

import torch

from . import _launcher
from ._launcher import NativeLaunch, launch_params

try:
    import triton
    import triton.runtime.jit
    from triton import knobs
except ImportError:  # no Triton: nothing is ever found
    triton = knobs = None

__all__ = ["DIRS", "FORMAT", "STATS", "build", "find", "key_of"]

FORMAT = 1  # the bundle's layout and key; a bundle of another format is never read
# The bundles consulted, in order; empty: none (the lean path then does nothing more than before).
DIRS = tuple(Path(p) for p in os.environ.get("RL_TRITON_TORCHRL_AOT_DIR", "").split(os.pathsep) if p)
# Launches of this process: variants found and loaded, looked for and not found, found but not loadable.
STATS = {"loaded": 0, "missing": 0, "failed": 0}


def key_of(kernel, target, settings: tuple, kwargs: dict, num_warps: int, maxnreg: int | None) -> tuple[str, str]:
    """(the key text, its sha256 digest) of launching ``kernel`` with ``kwargs`` (every parameter) for ``target``
    (a ``GPUTarget``) under the launcher's ``settings`` (device, debug, runtime debug, instrumentation)."""
    env = sorted(triton.runtime.jit.get_cache_invalidating_env_vars().items())
    text = repr((FORMAT, triton.__version__, kernel.__name__, kernel.cache_key, target.backend, target.arch,
                 num_warps, maxnreg, tuple(settings[1:]), env, specialization(kernel, kwargs)))
    return text, hashlib.sha256(text.encode()).hexdigest()


def specialization(kernel, kwargs: dict) -> tuple:
    """What Triton specializes each argument of ``kernel`` on, as ``_launcher.Specializer`` keys it (as finely as
    Triton, or finer: ``test_specialization_is_finer_than_triton``), in terms that mean the same in every process:
    a constexpr's type and value, a tensor's dtype and 16-byte alignment, an int's ``_int_key``, the type of a
    float, bool or None. Not Triton's own binder: its first call imports Triton's Gluon packages (150 ms on the H200
    host), which a launch of a precompiled kernel never needs."""
    out = []
    for param in kernel.params:
        value = kwargs[param.name]
        if param.is_constexpr or isinstance(value, _launcher._CONSTEXPR):
            out.append(("constexpr", type(value).__name__, repr(value)))
        elif isinstance(value, torch.Tensor):
            out.append(("tensor", str(value.dtype), value.data_ptr() & 15 == 0))
        elif type(value) is int:
            out.append(("int", _launcher._int_key(value)))
        elif type(value) in (float, bool, type(None)):
            out.append((type(value).__name__,))
        else:
            raise TypeError(f"no precompiled kernel for an argument of type {type(value).__name__}")
    return tuple(out)


def _target(device: int):
    """The ``GPUTarget`` of CUDA device ``device`` as Triton's CUDA driver names it; None on ROCm (no bundles)."""
    target = _TARGETS.get(device)
    if target is None and torch.version.hip is None:
        major, minor = torch.cuda.get_device_capability(device)
        target = _TARGETS[device] = triton.backends.compiler.GPUTarget("cuda", 10 * major + minor, 32)
    return target


_TARGETS: dict = {}


def _entry(root: Path, kernel, arch, digest: str) -> Path:
    return root / kernel.__name__ / f"{arch}-{digest}.json"


def find(kernel, settings: tuple, kwargs: dict, num_warps: int, maxnreg: int | None):
    """The ``_launcher._Compiled`` of this launch loaded from a bundle (``DIRS``), or None: no bundle, not in one,
    or not loadable here (said once, as a warning)."""
    if not DIRS:
        return None
    try:
        target = _target(settings[0])
        if target is None:
            return None
        text, digest = key_of(kernel, target, settings, kwargs, num_warps, maxnreg)
        path = next((p for p in (_entry(d, kernel, target.arch, digest) for d in DIRS) if p.is_file()), None)
    except Exception:  # noqa: BLE001 - an argument of another type, another Triton: compiled as before
        return None
    if path is None:
        STATS["missing"] += 1
        return None
    loaded = (path, settings[0])
    if loaded not in _LOADED:  # once per entry and device (a module per context); None: not loadable
        _LOADED[loaded] = None
        try:
            meta = json.loads(path.read_text())
            if meta["key"] != text:
                raise ValueError("the entry's key is not this launch's")
            if _launcher._driver_launch() is None:  # what a NativeLaunch calls
                raise RuntimeError("no cuLaunchKernel: the CUDA driver's library could not be loaded")
            function = _load(path.with_suffix(".cubin").read_bytes(), meta["name"], meta["shared"])
            native = NativeLaunch(function, 32 * meta["num_warps"], meta["shared"],
                                  tuple(map(tuple, meta["params"])))
        except Exception as e:  # noqa: BLE001 - a damaged entry, no driver, no context: compiled as before
            _failed(f"loaded from {path}", e)
            return None
        STATS["loaded"] += 1
        names = tuple(p.name for p in kernel.params)
        _LOADED[loaded] = _launcher._Compiled(None, _runner(native, names), function, None, native)
    return _LOADED[loaded]


_LOADED: dict = {}  # (entry, device) -> its _Compiled, or None where it could not be loaded


def launch_failed(compiled, error: Exception) -> None:
    """A loaded kernel's launch raised (the caller compiles it instead): never launched again in this process."""
    for loaded, entry in _LOADED.items():
        if entry is compiled:
            _LOADED[loaded] = None
    _failed("launched", error)


def _failed(what: str, error: Exception) -> None:
    """Counts a precompiled kernel that could not be used; the first is said, as a warning."""
    STATS["failed"] += 1
    if STATS["failed"] == 1:
        warnings.warn(f"rl_triton_torchrl: a precompiled kernel could not be {what} ({error!r}); it is compiled "
                      "instead", RuntimeWarning, stacklevel=5)


def _runner(native: NativeLaunch, names: tuple):
    """Stands in for ``CompiledKernel.run`` (``_launcher.replay``'s arguments) on a loaded cubin."""
    index = {name: i for i, name in enumerate(names)}
    picks = [index[name] for name, _ in native.params]
    per_call = tuple(name for name, _ in native.params)

    def run(grid0, grid1, grid2, stream, *rest):  # rest: function, metadata, launch metadata, two hooks, arguments
        args = rest[5:]
        values = [args[i] for i in picks]
        values = [v.data_ptr() if isinstance(v, torch.Tensor) else v for v in values]
        native.prepare((grid0, grid1, grid2), per_call, {}).launch(stream, *values)

    return run


_CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8
_STATIC_SHARED = 48 * 1024  # what a kernel may use without opting in
_CUDA = None


def _cuda():
    """libcuda's module functions (ctypes), loaded once."""
    global _CUDA
    if _CUDA is None:
        lib = ctypes.CDLL("libcuda.so.1")
        lib.cuModuleLoadData.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p]
        lib.cuModuleGetFunction.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p, ctypes.c_char_p]
        lib.cuFuncSetAttribute.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        _CUDA = lib
    return _CUDA


def _load(cubin: bytes, name: str, shared: int) -> int:
    """The function handle of kernel ``name`` in ``cubin``, loaded into the current context (as Triton loads its
    own: more than 48 KB of shared memory opted into)."""
    lib, module, function = _cuda(), ctypes.c_void_p(), ctypes.c_void_p()
    _check(lib.cuModuleLoadData(ctypes.byref(module), cubin), "cuModuleLoadData")
    _check(lib.cuModuleGetFunction(ctypes.byref(function), module, name.encode()), "cuModuleGetFunction")
    if shared > _STATIC_SHARED:
        _check(lib.cuFuncSetAttribute(function, _CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, shared),
               "cuFuncSetAttribute")
    return int(function.value)


def _check(result: int, what: str) -> None:
    if result:
        raise RuntimeError(f"{what} failed: CUresult {result}")


# ---------------------------------------------------------------------------------------------------------------
# Building a bundle (no GPU needed)
# ---------------------------------------------------------------------------------------------------------------


class _TargetDriver:
    """Enough of Triton's driver for ``JITFunction.warmup`` to compile for ``arch`` without a GPU."""

    def __init__(self, arch: int):
        self.target = triton.backends.compiler.GPUTarget("cuda", arch, 32)

    def get_current_target(self):
        return self.target

    def get_current_device(self):
        return 0

    def get_current_stream(self, device=None):
        return 0


@contextlib.contextmanager
def build(out: str | os.PathLike, arch: int = 90):
    """Within this context, every kernel launch (of calls with ``backend="triton"`` on CPU tensors) is compiled for
    ``arch`` (90: H100/H200) instead of run, and written to the bundle ``out``; yields the list of entries written
    (paths of their metadata files, a variant launched twice written once). Outputs are left unwritten."""
    from triton.runtime.driver import driver

    out = Path(out)
    written: list[Path] = []
    saved = (_launcher.Launcher.__call__, _launcher.Launcher.settings, os.environ.get("TRITON_INTERPRET"))
    target_driver = _TargetDriver(arch)

    def compile_instead(self, grid, num_warps, maxnreg=None, **kwargs):
        kernel = self.kernel
        if not isinstance(kernel, triton.runtime.jit.JITFunction):
            raise RuntimeError(f"cannot precompile {self.name}: the kernels were imported under Triton's interpreter "
                               "(TRITON_INTERPRET=1); import them without it")
        settings = (0, kernel.debug, knobs.runtime.debug, knobs.compilation.instrumentation_mode)
        text, digest = key_of(kernel, target_driver.target, settings, kwargs, num_warps, maxnreg)
        path = _entry(out, kernel, arch, digest)
        if path in written or path.is_file():
            return None
        options = {} if maxnreg is None else {"maxnreg": maxnreg}
        compiled = kernel.warmup(grid=grid, num_warps=num_warps, **kwargs, **options)
        params = launch_params(compiled.metadata, compiled.src.signature, tuple(p.name for p in kernel.params))
        if params is None:  # not a plain launch: compiled by the JIT where it runs
            return None
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_suffix(".cubin").write_bytes(compiled.asm["cubin"])
        md = compiled.metadata
        path.write_text(json.dumps({"key": text, "name": md.name, "num_warps": md.num_warps, "shared": md.shared,
                                    "params": params, "grid": list(grid)}, indent=1))
        written.append(path)
        return None

    previous = driver._active  # None until a driver is asked for (none can be, without a GPU)
    driver.set_active(target_driver)
    _launcher.Launcher.__call__, _launcher.Launcher.settings = compile_instead, lambda self: None
    os.environ["TRITON_INTERPRET"] = "1"  # only lets backend="triton" take CPU tensors: the kernels are JIT functions
    try:
        yield written
    finally:
        _launcher.Launcher.__call__, _launcher.Launcher.settings = saved[0], saved[1]
        if saved[2] is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved[2]
        driver._active = previous
