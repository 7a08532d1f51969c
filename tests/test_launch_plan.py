"""Launch plans (``scan.launch``): a call whose structure launched before replays that launch's arguments with its
own data pointers and numbers. Also the cheaper host-side pieces around it: ``new_outputs``, ``getenv`` and the
broadcast check of coefficient tensors.

On the CPU the kernels run through Triton's interpreter, which plans never serve. Here every algorithm kernel is
replaced by a compiled-kind ``JITFunction`` of it (``StandIn``) whose "compiled kernel" runs the interpreted kernel
on the arguments it is launched with: each pointer that a replayed launch passes as an int is read back as a tensor
of the dtype, shape and strides that the plain launch of the same key passed in its place. Replayed outputs must
equal the plain path's bit for bit. On the GPU the compiled kernels run, replayed and plain.
"""
from __future__ import annotations

import ctypes
import importlib
import itertools
import os
import shutil
import struct
import subprocess
import sys
import types
import warnings
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch

pytest.importorskip("triton", reason="launch plans launch Triton kernels")
import triton  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from _algos import DISCRETE, TABLE, as_tuple, make_rollout, state_shape
from _helpers import DEVICE
from rl_triton_torchrl.kernels import _fastcall, _launcher, _replay, _utils, scan
from rl_triton_torchrl.kernels import gae as gae_fn
from rl_triton_torchrl.kernels import linear_scan

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
CUDA = torch.cuda.is_available()
ROOT = Path(__file__).resolve().parent.parent
KERNEL_MODULES = ("gae", "td_lambda", "vtrace", "retrace", "prefix_sum", "scan")
INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
needs_interpreter = pytest.mark.skipif(not INTERPRET, reason="stand-ins run the kernels through the interpreter "
                                                             "(TRITON_INTERPRET=1, set by conftest without a GPU)")


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(INT_OF_SIZE[t.element_size()]).cpu()


def assert_identical(name: str, actual, expected):
    """The same outputs, bit for bit (NaN included), naming the first that differs."""
    actual, expected = as_tuple(actual), as_tuple(expected)
    assert len(actual) == len(expected), f"{name}: {len(actual)} outputs, expected {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        assert a.dtype == e.dtype and a.shape == e.shape, f"{name}[{i}]: {a.dtype} {tuple(a.shape)} != " \
                                                          f"{e.dtype} {tuple(e.shape)}"
        bad = _bits(a) != _bits(e)
        if bad.any():
            idx = tuple(int(j) for j in bad.nonzero()[0])
            raise AssertionError(f"{name}[{i}]: {int(bad.sum())} elements differ; first at {idx}: "
                                 f"{a[idx].item()!r} != {e[idx].item()!r}")


def _alias(ptr: int, dtype: torch.dtype, shape, stride) -> torch.Tensor:
    """A CPU tensor of ``dtype``, ``shape`` and ``stride`` on the memory at ``ptr`` (owned by another tensor)."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    extent = 1 + sum((n - 1) * s for n, s in zip(shape, stride))
    buffer = (ctypes.c_char * (extent * itemsize)).from_address(ptr)
    return torch.frombuffer(buffer, dtype=dtype, count=extent).as_strided(shape, stride)


class _Compiled:
    """Stands in for the ``CompiledKernel`` of one plain launch: ``run`` runs the interpreted kernel."""

    function = 1
    packed_metadata = (4, 1, 0)

    def __init__(self, stand_in: StandIn, kwargs: dict):
        self.stand_in = stand_in
        self.num_warps = kwargs["num_warps"]
        # what the plain launch passed for each pointer: how to read back an int passed in its place
        self.views = {k: (v.dtype, v.shape, v.stride()) for k, v in kwargs.items() if isinstance(v, torch.Tensor)}

    def run(self, grid0, grid1, grid2, stream, function, metadata, launch_metadata, enter_hook, exit_hook, *args):
        kwargs, ints = {}, False
        for name, value in zip(self.stand_in.jit.arg_names, args):
            if name in self.views and type(value) is int:
                kwargs[name], ints = _alias(value, *self.views[name]), True
            else:
                kwargs[name] = value
        if ints:
            self.stand_in.replayed += 1
        else:
            self.stand_in.lean += 1
        self.stand_in.interpreted[(grid0, grid1, grid2)](**kwargs, num_warps=self.num_warps)


class StandIn:
    """A compiled-kind ``JITFunction`` of an interpreted kernel (``jit``), "compiled" into ``_Compiled``s.

    Counts launches: ``plain`` through ``kernel[grid]``, ``lean`` by the lean launcher with tensors, ``replayed``
    by a launch plan (pointers passed as ints) through Triton's launcher, ``native`` by a launch plan through the
    driver (``_launcher.NativeLaunch``).
    """

    def __init__(self, interpreted):
        self.interpreted = interpreted
        self.jit = JITFunction(interpreted.fn)
        self.jit.run = self._compile
        self.plain = self.lean = self.replayed = self.native = 0
        self.compiled_type = _Compiled

    def _compile(self, *args, grid, warmup, **kwargs):
        self.plain += 1
        self.interpreted[grid](**kwargs)
        return self.compiled_type(self, kwargs)


class _Driver:
    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 0


# The native launch (``_launcher.NativeLaunch``) on the CPU: stand-ins with the metadata and signature of a compiled
# kernel, and a stand-in for the driver's cuLaunchKernel that decodes the parameter buffer it is given and runs the
# interpreted kernel on those values.

_SLOT_FORMATS = {"i1": "b", "i32": "i", "i64": "q", "u1": "B", "u64": "Q", "fp32": "f", "fp64": "d"}


def _signature(jit: JITFunction, kwargs: dict) -> dict:
    """The compiled signature Triton 3.6 gives these arguments: "constexpr" for constexpr parameters, None and ints
    equal to 1, else the type (pointers "*<dtype>")."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import make_backend
    from triton.runtime.jit import native_specialize_impl

    backend = make_backend(GPUTarget("cuda", 90, 32))
    return {p.name: "constexpr" if p.is_constexpr else native_specialize_impl(backend, kwargs[p.name], False, True,
                                                                                True)[0]
            for p in jit.params}


class _Metadata(NamedTuple):
    num_warps: int
    num_ctas: int = 1
    shared: int = 0
    global_scratch_size: int = 0
    profile_scratch_size: int = 0
    launch_pdl: bool = False
    launch_cooperative_grid: bool = False


class _NativeCompiled(_Compiled):
    """A ``_Compiled`` that ``_launcher.native`` can launch: metadata, signature and a function handle."""

    def __init__(self, stand_in, kwargs: dict):
        super().__init__(stand_in, kwargs)
        self.metadata = _Metadata(num_warps=self.num_warps)
        self.src = types.SimpleNamespace(signature=_signature(stand_in.jit, kwargs))
        self.kwargs = kwargs
        self.function = id(self)
        _NATIVE[self.function] = self


_NATIVE: dict[int, _NativeCompiled] = {}


def _fake_cu_launch_kernel(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
    """Decodes the parameters a native launch passes (``params``: the address of an array of pointers, one per
    runtime parameter, then the two scratch pointers) and runs the interpreted kernel on them."""
    compiled = _NATIVE[function]
    assert (bx, by, bz, shared, stream, extra) == (32 * compiled.num_warps, 1, 1, 0, 0, None)
    runtime = [(name, ty) for name, ty in compiled.src.signature.items() if ty != "constexpr"]
    pointers = (ctypes.c_void_p * (len(runtime) + 2)).from_address(params)
    kwargs = {}
    for (name, ty), address in zip(runtime, pointers):
        fmt = "Q" if ty.startswith("*") else _SLOT_FORMATS[ty]
        (value,) = struct.unpack("<" + fmt, ctypes.string_at(address, struct.calcsize(fmt)))
        kwargs[name] = _alias(value, *compiled.views[name]) if name in compiled.views else value
    assert [struct.unpack("<Q", ctypes.string_at(a, 8))[0] for a in pointers[-2:]] == [0, 0], "scratch not null"
    for name, value in compiled.kwargs.items():  # the compile-time constants, as the plain launch passed them
        if compiled.src.signature.get(name) == "constexpr" or name == "num_warps":
            kwargs.setdefault(name, value)
    compiled.stand_in.native += 1
    compiled.stand_in.interpreted[(gx, gy, gz)](**kwargs)
    return 0


@pytest.fixture
def native_stand_ins(stand_ins, monkeypatch):
    """``stand_ins`` whose compiled kernels launch natively, through ``_fake_cu_launch_kernel``."""
    monkeypatch.setattr(_launcher, "_LIBCUDA", (_fake_cu_launch_kernel, None))
    for stand_in in stand_ins.stand_ins:
        stand_in.compiled_type = _NativeCompiled
    return stand_ins


# cuLaunchKernel's C type, for a stand-in the C++ extension (``_fastcall``) can call
_CU_LAUNCH_KERNEL = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                                     ctypes.c_void_p, ctypes.c_void_p)


class _CLaunch:
    """A launch function (``fake``, such as ``_fake_cu_launch_kernel``) as a C function of cuLaunchKernel's type,
    ``c_function``. A C callback cannot raise: its exceptions are kept in ``errors`` and it returns an error code."""

    def __init__(self, fake=_fake_cu_launch_kernel):
        self.errors, self.fake = [], fake

        def launch(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
            try:  # (null pointers arrive as None)
                return self.fake(function or 0, gx, gy, gz, bx, by, bz, shared, stream or 0, params, extra)
            except BaseException as e:  # noqa: BLE001 - kept for the test to raise
                self.errors.append(e)
                return 999

        self.c_function = _CU_LAUNCH_KERNEL(launch)


def _c_hits() -> int:
    module = _fastcall.loaded()
    return 0 if module is None else module.hits()


@pytest.fixture
def c_stand_ins(native_stand_ins, monkeypatch):
    """``native_stand_ins`` whose replayed calls the C++ extension makes (``_fastcall``), launching through a C
    function that runs ``_fake_cu_launch_kernel``."""
    if not _fastcall.ENABLED:
        pytest.skip(_fastcall.status())
    module = _fastcall.load()
    assert module is not None, _fastcall.status()
    launch = _CLaunch()
    monkeypatch.setattr(_launcher, "_LIBCUDA", (launch.c_function, None))
    monkeypatch.setattr(_replay, "_FAST", module)
    native_stand_ins.__dict__["c_launch"] = launch
    module.forget()  # (no call remembered by another test, whose launch function is gone)
    yield native_stand_ins
    module.forget()
    if launch.errors:
        raise launch.errors[0]


class Counts:
    """The launches of every stand-in kernel, summed; ``calls_replayed``: the calls served by call replay since
    ``_count_call_replays``, in Python or by the C++ extension."""

    def __init__(self, stand_ins: list[StandIn]):
        self.stand_ins = stand_ins

    def __getattr__(self, name):
        if name == "calls_replayed":
            return self.python_replays + self.c_replays
        if name == "c_replays":
            return _c_hits() - self.__dict__["c_hits_before"]
        return sum(getattr(s, name) for s in self.__dict__["stand_ins"])

    def snapshot(self) -> tuple[int, int, int]:
        return self.plain, self.lean, self.replayed + self.native


# the algorithms whose calls read input values on the CPU (non-negative ratios, valid actions): never replayed there
VALUE_CHECKED = ("retrace_ratio", *DISCRETE)


@pytest.fixture
def plans(monkeypatch):
    """An empty plan cache: the cache of this test alone."""
    fresh = {}
    monkeypatch.setattr(scan, "_PLANS", fresh)
    monkeypatch.setattr(_replay, "_ENTRIES", {})  # and no call replayed from another test's kernels
    for name in ("_FAST", "_READY"):  # and calls replayed in Python unless the test says otherwise
        monkeypatch.setattr(_replay, name, None)
    if _fastcall.loaded() is not None:
        _fastcall.loaded().forget()  # (nor made in C++ from another test's entries)
    return fresh


@pytest.fixture
def stand_ins(monkeypatch, plans):
    """Every algorithm kernel replaced by a ``StandIn``, on a stand-in driver: ``Counts`` of their launches."""
    if not INTERPRET:
        pytest.skip("stand-ins run the kernels through the interpreter (TRITON_INTERPRET=1, set without a GPU)")
    monkeypatch.setattr(_launcher.driver, "_active", _Driver())
    counts = _count_call_replays(monkeypatch)
    made = []
    for name in KERNEL_MODULES:
        module = importlib.import_module(f"rl_triton_torchrl.kernels.{name}")
        for attr, value in list(vars(module).items()):
            if attr.endswith("_fwd_kernel"):
                made.append(StandIn(value))
                monkeypatch.setattr(module, attr, made[-1].jit)
    counts.stand_ins.extend(made)
    return counts


def _count_call_replays(monkeypatch) -> Counts:
    """``Counts`` (of no stand-in yet) whose ``calls_replayed`` counts the calls served by call replay."""
    counts = Counts([])
    counts.__dict__.update(python_replays=0, c_hits_before=_c_hits())
    replay_entry = _replay.Entry.replay

    def counting(entry, ptrs):
        out = replay_entry(entry, ptrs)
        counts.__dict__["python_replays"] += out is not None
        return out

    monkeypatch.setattr(_replay.Entry, "replay", counting)
    return counts


def _plain(monkeypatch, fn):
    """``fn()`` with every launch taking the plain path (the lean launcher switched off)."""
    with monkeypatch.context() as m:
        m.setattr(_launcher, "LEAN_LAUNCH", False)
        return fn()


# case -> (make_rollout arguments, extra call arguments (a function of the rollout), patches of scan)
CASES = {
    "contig": ({}, lambda x: {}, {}),
    "time-major": ({"shape": (20, 3, 2), "time_dim": 0}, lambda x: {"time_dim": 0}, {}),
    "sliced": ({"layout": "sliced"}, lambda x: {}, {}),
    "permuted": ({"layout": "permuted"}, lambda x: {}, {}),
    "broadcast": ({"layout": "broadcast"}, lambda x: {}, {}),
    "float64": ({"dtype": torch.float64}, lambda x: {}, {}),
    "bfloat16": ({"dtype": torch.bfloat16}, lambda x: {}, {}),
    "states": ({}, lambda x: {"initial_state": torch.randn(state_shape(x, -2)).to(DEVICE),
                              "output_final_state": True}, {}),
    "states-float64": ({"dtype": torch.float64},
                       lambda x: {"initial_state": torch.randn(state_shape(x, -2), dtype=torch.float64).to(DEVICE),
                                  "output_final_state": True}, {}),
    # chunks of 16 steps, of 2 segments of 8 in the segmented kernels (whose 32 x 128-step tiles the interpreter
    # would walk for 40 steps)
    "look-back": ({"shape": (2, 40, 1)}, lambda x: {"output_final_state": True},
                  {"LOOKBACK_MIN_T": 0, "LOOKBACK_MAX_ROWS": 10**9, "LOOKBACK_BLOCK_T": 16, "LOOKBACK_SEGMENTS": 2,
                   "LOOKBACK_SEGMENT_T": 8}),
    "chunks": ({}, lambda x: {}, {"MAX_BLOCK_T": 16, "TILE_ELEMENTS": 32, "WIDE_MAX_ROWS": 0}),
    "wide-chunks": ({}, lambda x: {}, {"MAX_BLOCK_T": 8, "WIDE_MAX_T": 16, "WIDE_LONG_MAX_ROWS": {}}),
    # contiguous rows of 20 steps: T and the strides compile-time constants (scan._constant_length)
    "constant-T": ({"shape": (3, 20, 1)}, lambda x: {}, {}),
}


def _coef_tensors(algo: str, kind: str) -> dict:
    """The algorithm's coefficients as 0-d tensors, or as broadcastable tensors (per step, per row)."""
    g = torch.Generator().manual_seed(3)
    out = {}
    for name, value in TABLE[algo][2].items():
        if kind == "0-d":
            out[name] = torch.tensor(value).to(DEVICE)
        elif name == "gamma":
            out[name] = (0.9 + 0.1 * torch.rand(3, 20, 2, generator=g)).to(DEVICE)
        else:
            out[name] = torch.full((3, 1, 1), value).to(DEVICE)
    return out


def _replays_equal_plain(monkeypatch, counts, algo, x, kw, calls=3, planned=True, call_replays=None):
    """Calls ``algo`` ``calls`` times on the lean path: the first launches plainly and builds the plan, the others
    replay it (``planned``), ``call_replays`` of them (unless None) as a whole call (``_replay``); every output
    equals the plain path's bit for bit."""
    call, _, coefs = TABLE[algo]
    kw = {**coefs, **kw}
    expected = _plain(monkeypatch, lambda: call(x, backend="triton", **kw))
    before, replays_before = counts.snapshot(), counts.calls_replayed
    for i in range(calls):
        assert_identical(f"{algo} call {i}", call(x, backend="triton", **kw), expected)
    plain, lean, replayed = (after - b for after, b in zip(counts.snapshot(), before))
    if planned:
        assert replayed == calls - 1 and lean == 0, f"{algo}: {plain} plain, {lean} lean, {replayed} replayed"
    else:
        assert replayed == 0, f"{algo}: replayed a launch that has no plan"
    if call_replays is not None:
        assert counts.calls_replayed - replays_before == call_replays, \
            f"{algo}: {counts.calls_replayed - replays_before} calls replayed whole, expected {call_replays}"


@needs_interpreter
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("algo", list(TABLE))
def test_replay_equals_plain(algo, case, stand_ins, monkeypatch):
    rollout, extra, patches = CASES[case]
    for name, value in patches.items():
        monkeypatch.setattr(scan, name, value)
    rollout = {"shape": (3, 20, 2), **rollout}
    x = make_rollout(**rollout)
    _replays_equal_plain(monkeypatch, stand_ins, algo, x, extra(x), call_replays=0 if algo in VALUE_CHECKED else 2)


@needs_interpreter
@pytest.mark.parametrize("kind", ["0-d", "broadcast"])
@pytest.mark.parametrize("algo", [a for a in TABLE if TABLE[a][2]])
def test_replay_coefficient_tensors(algo, kind, stand_ins, monkeypatch):
    _replays_equal_plain(monkeypatch, stand_ins, algo, make_rollout((3, 20, 2)), _coef_tensors(algo, kind))


@needs_interpreter
def test_replay_reads_each_calls_data(stand_ins, monkeypatch):
    """A replay launches on the call's own tensors and numbers: other data, other coefficients, new outputs."""
    call, _, _ = TABLE["gae"]
    for seed, gamma, lmbda in ((0, 0.97, 0.9), (1, 0.5, 0.2), (2, 1.0, 0.0), (3, 1e-40, 1.0)):
        x = make_rollout((3, 20, 2), seed=seed)
        expected = _plain(monkeypatch, lambda: call(x, backend="triton", gamma=gamma, lmbda=lmbda))
        first = call(x, backend="triton", gamma=gamma, lmbda=lmbda)
        assert_identical(f"seed {seed}", first, expected)
        again = call(x, backend="triton", gamma=gamma, lmbda=lmbda)
        assert_identical(f"seed {seed} again", again, expected)
        assert all(a.data_ptr() != b.data_ptr() for a, b in zip(first, again)), "outputs reused between calls"
    assert stand_ins.plain == 4 + 1 and stand_ins.replayed == 7, "every call after the first should replay"


# every algorithm in the common cases, GAE in every other
NATIVE_CASES = [(algo, case) for algo in TABLE for case in ("contig", "states", "look-back", "constant-T")] + [
    ("gae", case) for case in ("time-major", "broadcast", "float64", "bfloat16", "states-float64", "chunks",
                               "wide-chunks")]


@needs_interpreter
@pytest.mark.parametrize("algo,case", NATIVE_CASES)
def test_native_replay_equals_plain(algo, case, native_stand_ins, monkeypatch):
    """Replays through the driver itself: the parameter buffer holds exactly what Triton's launch passes."""
    rollout, extra, patches = CASES[case]
    for name, value in patches.items():
        monkeypatch.setattr(scan, name, value)
    x = make_rollout(**{"shape": (3, 20, 2), **rollout})
    before = native_stand_ins.native
    _replays_equal_plain(monkeypatch, native_stand_ins, algo, x, extra(x))
    assert native_stand_ins.native - before == 2, "the replays should have launched natively"


@needs_interpreter
def test_native_replay_reads_each_calls_data(native_stand_ins, monkeypatch):
    """Each native replay writes its own pointers and numbers into the plan's buffer."""
    call, _, _ = TABLE["gae"]
    for seed, gamma, lmbda in ((0, 0.97, 0.9), (1, 0.5, 0.2), (2, 1e-40, 1.0)):
        x = make_rollout((3, 20, 2), seed=seed)
        expected = _plain(monkeypatch, lambda: call(x, backend="triton", gamma=gamma, lmbda=lmbda))
        for i in range(2):
            assert_identical(f"seed {seed} call {i}", call(x, backend="triton", gamma=gamma, lmbda=lmbda), expected)
    assert native_stand_ins.native == 5


class _MetaCompiled:
    """Just enough of a ``CompiledKernel`` for ``_launcher.native``."""

    def __init__(self, signature: dict, **metadata):
        self.metadata = _Metadata(**{"num_warps": 4, **metadata})
        self.src = types.SimpleNamespace(signature=signature)
        self.function, self.run = 99, None


@pytest.mark.parametrize("case", ["scratch", "profile-scratch", "clusters", "pdl", "cooperative", "fp16-scalar",
                                  "tuple", "names", "no-driver"])
def test_no_native_launch_where_triton_launches_otherwise(case, monkeypatch):
    """Kernels whose launch is more than a plain cuLaunchKernel (or unknown) keep Triton's launcher."""
    monkeypatch.setattr(_launcher, "_LIBCUDA", (_fake_cu_launch_kernel, None))
    sig = {"x_ptr": "*fp32", "n": "i32", "a": "fp32", "B": "constexpr"}
    meta = {"scratch": {"global_scratch_size": 64}, "profile-scratch": {"profile_scratch_size": 8},
            "clusters": {"num_ctas": 2}, "pdl": {"launch_pdl": True}, "cooperative": {"launch_cooperative_grid": True}
            }.get(case, {})
    names = tuple(sig)
    if case == "fp16-scalar":
        sig["a"] = "fp16"
    elif case == "tuple":
        sig["n"] = ("i32", "i32")
    elif case == "names":
        names = ("x_ptr", "a", "n", "B")
    elif case == "no-driver":
        monkeypatch.setattr(_launcher, "_LIBCUDA", False)
    assert _launcher.native(_MetaCompiled(sig, **meta), names) is None
    monkeypatch.setattr(_launcher, "_LIBCUDA", (_fake_cu_launch_kernel, None))
    plain = _launcher.native(_MetaCompiled({"x_ptr": "*fp32", "n": "i32", "a": "fp32", "B": "constexpr"}),
                             ("x_ptr", "n", "a", "B"))
    assert plain == _launcher.NativeLaunch(99, 128, 0, (("x_ptr", "Q"), ("n", "i"), ("a", "f")))


def test_native_buffer_layout():
    """``prepare`` writes the fixed parameters once and the per-call ones at each launch, in the kernel's order."""
    seen = {}

    def launch(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        pointers = (ctypes.c_void_p * 6).from_address(params)
        fmts = ["Q", "i", "f", "q", "Q", "Q"]
        seen["values"] = [struct.unpack("<" + f, ctypes.string_at(a, struct.calcsize(f)))[0]
                          for f, a in zip(fmts, pointers)]
        seen["launch"] = (function, gx, gy, gz, bx, by, bz, shared, stream)
        return 0

    native = _launcher.NativeLaunch(7, 256, 1024, (("x_ptr", "Q"), ("n", "i"), ("a", "f"), ("s", "q")))
    prepared = native.prepare((5,), ("x_ptr", "a"), {"n": -3, "s": 2**40})
    with pytest.MonkeyPatch.context() as m:
        m.setattr(_launcher, "_LIBCUDA", (launch, None))
        prepared.launch(11, 0xDEADBEEF0, 0.5)
        assert seen["values"] == [0xDEADBEEF0, -3, 0.5, 2**40, 0, 0]
        assert seen["launch"] == (7, 5, 1, 1, 256, 1, 1, 1024, 11)
        prepared.launch(12, 16, 0.25)
        assert seen["values"][:3] == [16, -3, 0.25]


def test_native_launch_error_is_raised(monkeypatch):
    """A driver error is an exception naming it (``scan.launch`` then launches the plain way)."""
    monkeypatch.setattr(_launcher, "_LIBCUDA", (lambda *args: 1, None))
    prepared = _launcher.NativeLaunch(7, 128, 0, (("x_ptr", "Q"),)).prepare((1,), ("x_ptr",), {})
    with pytest.raises(_launcher.LaunchError, match="cuLaunchKernel failed: CUresult 1") as info:
        prepared.launch(0, 16)
    assert info.value.code == 1


@needs_interpreter
@pytest.mark.parametrize("code", [1, _launcher.NO_CONTEXT])
def test_failed_native_replay_launches_plainly(code, native_stand_ins, monkeypatch):
    """A native launch that fails (no context on a new thread, or anything else) leaves the call to Triton's
    launcher, with the same outputs, drops the plan, and warns once unless the thread only lacked its context."""
    call, _, coefs = TABLE["gae"]
    x = make_rollout((3, 20, 2))
    expected = _plain(monkeypatch, lambda: call(x, backend="triton", **coefs))
    call(x, backend="triton", **coefs)  # plain, builds the plan
    monkeypatch.setattr(_launcher, "_LIBCUDA", (lambda *args: code, None))
    monkeypatch.setattr(scan, "_FAILED_REPLAYS", 0)
    plain = native_stand_ins.plain + native_stand_ins.lean
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert_identical("after a failed native launch", call(x, backend="triton", **coefs), expected)
    assert native_stand_ins.plain + native_stand_ins.lean == plain + 1, "not launched through Triton's launcher"
    assert len([w for w in caught if "replayed launch failed" in str(w.message)]) == (code != _launcher.NO_CONTEXT)


@needs_interpreter
@pytest.mark.parametrize("algo,case", NATIVE_CASES)
def test_c_replay_equals_plain(algo, case, c_stand_ins, monkeypatch):
    """Calls made whole by the C++ extension: its signature finds the entry, its launch passes what Triton's does
    (the per-call buffers included: a final state, look-back status words, float64 numbers), bit for bit the plain
    path's outputs."""
    rollout, extra, patches = CASES[case]
    for name, value in patches.items():
        monkeypatch.setattr(scan, name, value)
    x = make_rollout(**{"shape": (3, 20, 2), **rollout})
    before = c_stand_ins.c_replays
    _replays_equal_plain(monkeypatch, c_stand_ins, algo, x, extra(x), call_replays=0 if algo in VALUE_CHECKED else 2)
    in_c = 0 if algo in VALUE_CHECKED else 2
    assert c_stand_ins.c_replays - before == in_c, f"{algo}: {c_stand_ins.c_replays - before} calls made in C++"


@needs_interpreter
def test_c_replay_reads_each_calls_data(c_stand_ins, monkeypatch):
    """Each call made in C++ launches on its own tensors and numbers, into new outputs."""
    call, _, _ = TABLE["gae"]
    for seed, gamma, lmbda in ((0, 0.97, 0.9), (1, 0.5, 0.2), (2, 1e-40, 1.0), (3, -0.0, 0.0)):
        x = make_rollout((3, 20, 2), seed=seed)
        expected = _plain(monkeypatch, lambda: call(x, backend="triton", gamma=gamma, lmbda=lmbda))
        outs = [call(x, backend="triton", gamma=gamma, lmbda=lmbda) for _ in range(3)]
        for i, out in enumerate(outs):
            assert_identical(f"seed {seed} call {i}", out, expected)
        assert all(a.data_ptr() != b.data_ptr() for a, b in zip(outs[1], outs[2])), "outputs reused between calls"
        assert all(o.is_contiguous() and o.shape == x["reward"].shape for o in outs[2])
        held = [sys.getrefcount(v) for v in x.values()]
        again = call(x, backend="triton", gamma=gamma, lmbda=lmbda)
        assert [sys.getrefcount(v) for v in x.values()] == held, "an input's reference kept"
        # held by the tuple, the loop variable and getrefcount's argument: no other reference kept, none lost
        assert [sys.getrefcount(o) for o in again] == [3, 3], "an output's reference kept or lost"
    assert c_stand_ins.c_replays == 12


@needs_interpreter
@pytest.mark.parametrize("poison", [True, False])
def test_c_replay_poisons_outputs(poison, c_stand_ins, monkeypatch):
    """Calls made in C++ fill their outputs with NaN before the launch where ``scan.POISON_OUTPUTS`` says so (the
    tests' setting), as ``new_outputs`` does: a launch that writes nothing leaves them NaN."""
    call, _, coefs = TABLE["gae"]
    x = make_rollout((3, 20, 2))
    call(x, backend="triton", **coefs)  # builds the plan and the entry
    monkeypatch.setattr(scan, "POISON_OUTPUTS", poison)
    c_stand_ins.c_launch.fake = lambda *args: 0
    before = c_stand_ins.c_replays
    outs = call(x, backend="triton", **coefs)
    assert c_stand_ins.c_replays == before + 1
    assert all(bool(o.isnan().all()) == poison for o in outs)


@needs_interpreter
@pytest.mark.parametrize("change", ["refused", "settings", "recording"])
def test_c_replay_declines_to_python(change, c_stand_ins, monkeypatch):
    """Where the C++ extension cannot make a call (the driver refuses the launch, other launcher settings, a call
    being recorded) it launches nothing and the Python path makes the call."""
    call, _, coefs = TABLE["gae"]
    x = make_rollout((3, 20, 2))
    expected = _plain(monkeypatch, lambda: call(x, backend="triton", **coefs))
    call(x, backend="triton", **coefs)  # builds the plan and the entry
    if change == "refused":
        c_stand_ins.c_launch.fake = lambda *args: 1
        monkeypatch.setattr(scan, "_FAILED_REPLAYS", 0)
    elif change == "settings":
        monkeypatch.setattr(_launcher, "LEAN_LAUNCH", False)
    before, python_before = c_stand_ins.c_replays, c_stand_ins.python_replays
    plain = c_stand_ins.plain + c_stand_ins.lean
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (a refused replay warns)
        if change == "recording":
            _replay._recordings().append(_replay._Recording())
            try:
                out = call(x, backend="triton", **coefs)
            finally:
                _replay._recordings().pop()
        else:
            out = call(x, backend="triton", **coefs)
    assert_identical(change, out, expected)
    assert c_stand_ins.c_replays == before, "made in C++"
    assert c_stand_ins.python_replays == python_before
    assert c_stand_ins.plain + c_stand_ins.lean - plain == (change in ("refused", "settings")), \
        "not launched through Triton's launcher"


@needs_interpreter
def test_c_extension_adopts_earlier_entries(c_stand_ins, monkeypatch):
    """Entries recorded before the extension was loaded (its thread still building) are made in C++ once a caller's
    thread adopts it, at its next call."""
    module = _replay._FAST
    for name in ("_FAST", "_READY"):
        monkeypatch.setattr(_replay, name, None)
    monkeypatch.setattr(_fastcall, "_module", None)  # not loaded yet: the entry gets no FastEntry
    call, _, coefs = TABLE["gae"]
    x = make_rollout((3, 20, 2))
    expected = _plain(monkeypatch, lambda: call(x, backend="triton", **coefs))
    call(x, backend="triton", **coefs)  # records the entry
    assert all(e.fast is None for e in _replay._ENTRIES.values() if type(e) is _replay.Entry)
    monkeypatch.setattr(_fastcall, "_module", module)
    _replay.adopt(module)  # (what the thread does once loaded)
    assert_identical("adopting", call(x, backend="triton", **coefs), expected)  # adopts, replays in Python
    before = c_stand_ins.c_replays
    assert_identical("made in C++", call(x, backend="triton", **coefs), expected)
    assert c_stand_ins.c_replays == before + 1 and _replay._FAST is module and _replay._READY is None


@needs_interpreter
def test_c_extension_starts_loading_at_the_first_python_replay(native_stand_ins, monkeypatch):
    """The first call of a process starts nothing; the first call replayed in Python of a native launch starts the
    extension's loading thread, once."""
    started = []
    monkeypatch.setattr(_fastcall, "start", lambda: started.append(1))
    monkeypatch.setattr(_replay, "_FAST_STARTED", False)
    call, _, coefs = TABLE["gae"]
    x = make_rollout((3, 20, 2))
    call(x, backend="triton", **coefs)  # records the entry
    assert started == []
    for _ in range(3):  # replayed in Python
        call(x, backend="triton", **coefs)
    assert started == [1]


def _fast_entry_stand_in(module) -> _replay.Entry:
    """An ``Entry`` with a ``FastEntry`` that launches nothing (no outputs, no pointers): what ``remember`` keeps."""
    fast = module.FastEntry(1, 0, (1, 1, 1), 32, 0, b"", (), (), 0, (), torch.empty(0), lambda: None, None,
                            lambda device: 0, 0, (), (), 0, -1, ())
    return _replay.Entry(None, None, None, 0, (), (), (), (), fast)


@pytest.mark.skipif(not _fastcall.ENABLED, reason="the C++ extension is built on Linux only")
def test_c_facts_are_the_signature(monkeypatch):
    """The C++ extension finds the call it remembered for exactly the calls whose signature (``_replay.signature``)
    is the remembered call's: every fact the signature keys tells two calls apart (each tensor's shape, strides,
    dtype, device, ``requires_grad`` and pointer alignment; each other argument's type, value and a zero's sign; the
    keyword names and their order; the grad mode, the backend variable, the launch constants' epoch and the
    deterministic flag), and a call the signature never keys is never remembered."""
    module = _fastcall.load()
    assert module is not None, _fastcall.status()
    _replay._bind()
    module.forget()
    entry = _fast_entry_stand_in(module)

    def fn():
        pass

    x = torch.randn(3, 4)
    w = torch.randn(3, 4, requires_grad=True)
    nan = float("nan")
    calls = [((), {}), ((x,), {}), ((x.clone(),), {}), ((x.t(),), {}), ((x[:, 1:],), {}), ((x[1:],), {}),
             ((x.double(),), {}), ((x > 0,), {}), ((w,), {}), ((x, x.t(), x > 0, x.to(torch.int64), w), {}),
             ((x,), {"gamma": 0.5, "lmbda": 0.0, "n": 3, "b": True, "s": "auto", "none": None}),
             ((x,), {"gamma": 0.5, "lmbda": -0.0, "n": 3, "b": True, "s": "auto", "none": None}),
             ((x,), {"lmbda": 0.0, "gamma": 0.5, "n": 3, "b": True, "s": "auto", "none": None}),
             ((x,), {"gamma": 0.5, "lmbda": 0.0, "n": 3, "b": True, "s": "torch", "none": None}),
             ((x, 1), {}), ((x, 1.0), {}), ((x, True), {}), ((x, 2), {}), ((x, nan), {}), ((x, float("nan")), {}),
             ((x, torch.nn.Parameter(x)), {}), ((x, [1]), {}), ((x,), {"gamma": np.float64(0.5)}),
             ((x, torch.empty(3, device="meta")), {})]
    for i, (args, kwargs) in enumerate(calls):
        remembered = _replay.signature(fn, args, kwargs)
        module.forget()
        assert module.remember(fn, args, kwargs, entry) == (remembered is not None), i
        for j, (other_args, other_kwargs) in enumerate(calls):
            other = _replay.signature(fn, other_args, other_kwargs)
            same = remembered is not None and other is not None and other[0] == remembered[0]
            assert (module.lookup(fn, other_args, other_kwargs) is entry) == same, (i, j)
    # the global state: each fact apart from the arguments
    module.forget()
    assert module.remember(fn, (x,), {"gamma": 0.5}, entry)
    found = lambda: module.lookup(fn, (x,), {"gamma": 0.5}) is entry  # noqa: E731
    assert found()
    with torch.no_grad():
        assert not found()
    assert module.lookup(fn, (x,), {"gamma": 0.5}) is entry
    with monkeypatch.context() as m:
        m.setenv(_utils.BACKEND_ENV, "torch")
        assert not found()
    with monkeypatch.context() as m:
        m.setattr(scan, "MAX_BLOCK_T", scan.MAX_BLOCK_T)  # (any launch constant assigned moves the epoch on)
        assert not found()
    assert not found()  # (the epoch moved on again when it was put back: the plans keyed by it are gone too)
    assert module.remember(fn, (x,), {"gamma": 0.5}, entry) and found()
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        assert not found()
    finally:
        torch.use_deterministic_algorithms(deterministic)
    assert found()
    with monkeypatch.context() as m:  # an os.environ it does not know: nothing is found, nothing wrong made
        m.setattr(os, "environ", dict(os.environ))
        assert not found()
    assert found()
    module.forget()
    assert not found()


def test_c_remembers_the_last_signatures_of_each_function():
    """Up to a ring of signatures per function are remembered (the oldest forgotten first), and the same signature
    remembered again takes its old place with the newer entry."""
    if not _fastcall.ENABLED:
        pytest.skip(_fastcall.status())
    module = _fastcall.load()
    assert module is not None, _fastcall.status()
    module.forget()
    entries = [_fast_entry_stand_in(module) for _ in range(10)]

    def fn():
        pass

    def other():
        pass

    for i in range(8):
        assert module.remember(fn, (torch.empty(i + 1),), {}, entries[i])
    assert module.remember(other, (torch.empty(1),), {}, entries[9])
    assert [module.lookup(fn, (torch.empty(i + 1),), {}) for i in range(8)] == entries[:8]
    assert module.lookup(other, (torch.empty(1),), {}) is entries[9]
    assert module.remember(fn, (torch.empty(3),), {}, entries[8])  # the same facts: the same place
    assert module.lookup(fn, (torch.empty(3),), {}) is entries[8]
    assert module.lookup(fn, (torch.empty(1),), {}) is entries[0]
    assert module.remember(fn, (torch.empty(100),), {}, entries[9])  # a ninth: the oldest place
    assert module.lookup(fn, (torch.empty(1),), {}) is None
    assert module.lookup(fn, (torch.empty(100),), {}) is entries[9]
    module.forget()


@pytest.mark.skipif(not _fastcall.ENABLED, reason="the C++ extension is built on Linux only")
@pytest.mark.parametrize("setting", ["built", "no-compiler", "off"])
def test_fastcall_build(setting, tmp_path):
    """Fresh processes build the extension once into their cache directory, two starting together too (the other
    waits for it), and load it from there after; a compiler that refuses C++17 builds it as C++20; without a
    compiler, or switched off, calls replay in Python and ``status`` says why."""
    env = {**os.environ, "RL_TRITON_TORCHRL_CACHE_DIR": str(tmp_path / "cache")}
    compiles = tmp_path / "compiles.log"
    if setting == "built":  # the C++ compiler through a wrapper that counts its runs and refuses C++17
        wrapper = tmp_path / "cxx"
        real = shutil.which(os.environ.get("CXX", "c++")) or shutil.which("g++") or shutil.which("clang++")
        wrapper.write_text(f'#!/bin/sh\ncase " $* " in *" -std=c++17 "*) echo c++17 >> "{compiles}"; exit 1;; esac\n'
                           f'echo c++20 >> "{compiles}"\nexec "{real}" "$@"\n')
        wrapper.chmod(0o755)
        env["CXX"] = str(wrapper)
    elif setting == "no-compiler":
        env["CXX"] = str(tmp_path / "no-such-cxx")
    elif setting == "off":
        env["RL_TRITON_TORCHRL_FASTCALL"] = "0"
    code = "from rl_triton_torchrl.kernels import _fastcall; print(_fastcall.load() is not None); " \
           "print(_fastcall.status())"

    def start():
        return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, cwd=ROOT)

    def result(proc):
        out, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
        return out.splitlines()

    def extensions():
        return [p for p in (tmp_path / "cache").glob("_fastcall_ext_*") if not p.name.endswith(".lock")]

    if setting == "built":
        (loaded, status), (loaded_too, _) = map(result, [start(), start()])  # two processes at once
        built = extensions()
        assert (loaded, loaded_too, len(built)) == ("True", "True", 1) and status.startswith("C++ ("), status
        assert compiles.read_text().split() == ["c++17", "c++20"], "built more than once"
        stamp = built[0].stat().st_mtime_ns
        assert result(start())[0] == "True" and built[0].stat().st_mtime_ns == stamp, "built again"
        assert compiles.read_text().split() == ["c++17", "c++20"], "built again"
    else:
        loaded, status = result(start())
        assert (loaded, extensions()) == ("False", [])
        assert ("no C++ compiler" if setting == "no-compiler" else "RL_TRITON_TORCHRL_FASTCALL=0") in status, status


def _gae_key(x: dict, **kw) -> tuple:
    """The plan key of the GAE launch of ``gae(x, **kw)`` (the launch is recorded, then its key computed)."""
    seen = {}
    real = scan.launch

    def launch(kernel, layout, **kwargs):
        seen.update(kernel=kernel, layout=layout, kwargs=kwargs)
        return real(kernel, layout, **kwargs)

    gae_module = importlib.import_module("rl_triton_torchrl.kernels.gae")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(gae_module, "launch", launch)
        m.setattr(_replay, "REPLAY", False)  # (a replayed call would not reach the launch)
        TABLE["gae"][0](x, backend="triton", **{**TABLE["gae"][2], **kw})
    k = dict(seen["kwargs"])
    coefs = k.pop("coefs")
    settings = _launcher.launcher(seen["kernel"]).settings()
    inputs = k.pop("inputs")
    key, _ = scan._plan_key(settings, seen["kernel"], seen["layout"], inputs, k.pop("outputs"), coefs,
                            tuple(coefs.values()), k.pop("initial_state"), k.pop("output_final_state"),
                            k.pop("finite_a"), scan.flag_constexprs(inputs, k))
    return key


def _misaligned(x: torch.Tensor) -> torch.Tensor:
    """``x``'s values at an address 4 bytes past a 16-byte boundary, same shape and strides."""
    buf = torch.empty(x.numel() + 4, dtype=x.dtype, device=x.device)
    offset = next(i for i in range(1, 4) if (buf.data_ptr() + i * x.element_size()) % 16)
    return buf[offset: offset + x.numel()].view(x.shape).copy_(x)


# change -> (rollout changes, call changes): each a structure of its own, first launched the plain way
KEY_CHANGES = {
    "stride": (lambda x: {"reward": x["reward"].transpose(0, 1).contiguous().transpose(0, 1)}, {}),
    "dtype": (lambda x: {k: v.double() if v.is_floating_point() else v for k, v in x.items()}, {}),
    "alignment": (lambda x: {"next_value": _misaligned(x["next_value"])}, {}),
    "flag-alignment": (lambda x: {"done": _misaligned(x["done"])}, {}),
    "initial-state": (lambda x: {}, {"initial_state": torch.zeros(3, 2).to(DEVICE)}),
    "final-state": (lambda x: {}, {"output_final_state": True}),
    "coef-0d-tensor": (lambda x: {}, {"gamma": torch.tensor(0.97).to(DEVICE)}),
    "coef-tensor-shape": (lambda x: {}, {"gamma": torch.full((3, 1, 1), 0.97).to(DEVICE)}),
    "coef-tensor-dtype": (lambda x: {}, {"gamma": torch.tensor(0.97, dtype=torch.float64).to(DEVICE)}),
    "time-dim": (lambda x: {}, {"time_dim": -1}),
    "shape": (lambda x: {k: v[:2] for k, v in x.items()}, {}),
    # one tensor as both flags compiles a kernel that reads it once: a call with two must not replay that one
    "same-flags": (lambda x: {"terminated": x["done"]}, {}),
}


@needs_interpreter
@pytest.mark.parametrize("change", KEY_CHANGES)
def test_changed_structure_misses(change, stand_ins, monkeypatch, plans):
    call, _, coefs = TABLE["gae"]
    x = make_rollout((3, 20, 2))
    call(x, backend="triton", **coefs)  # the base structure: plain, then planned
    base_key = _gae_key(x)
    assert len(plans) == 1 and stand_ins.replayed == 1
    edit, kw = KEY_CHANGES[change]
    y = {**x, **edit(x)}
    assert _gae_key(y, **kw) != base_key, f"{change}: the changed call shares the base call's key"
    before = stand_ins.snapshot()
    expected = _plain(monkeypatch, lambda: call(y, backend="triton", **{**coefs, **kw}))
    for i in range(2):
        assert_identical(f"{change} call {i}", call(y, backend="triton", **{**coefs, **kw}), expected)
    # (_gae_key made the changed structure's first call, which launched plainly and built its plan)
    assert stand_ins.replayed - before[2] == 2 and stand_ins.plain - before[0] == 1


@needs_interpreter
def test_key_ignores_data_and_numbers(stand_ins):
    """Other tensors of the same structure and other float coefficients share the key (one plan serves a loop).
    (No terminated flags, or one tensor as both, is another structure: ``KEY_CHANGES["same-flags"]``.)"""
    x, y = make_rollout((3, 20, 2), seed=0), make_rollout((3, 20, 2), seed=5)
    assert _gae_key(x) == _gae_key(y, gamma=0.5, lmbda=0.1) == _gae_key(y, time_dim=1)  # -2 and 1: one time dim
    assert _gae_key({**x, "terminated": None}) == _gae_key({**y, "terminated": y["done"]})


def test_unplannable_keys():
    """An int coefficient (Triton specializes ints on their values) and a non-tensor input are never planned."""
    layout = _utils.check_inputs(-2, {"x": torch.zeros(2, 5, 1)}, {}, {})
    kernel, x, y = object(), torch.zeros(2, 5, 1), torch.zeros(2, 5, 1)

    def key(inputs, coefs):
        return scan._plan_key((0,), kernel, layout, inputs, {"y": y}, coefs, tuple(coefs.values()), None, False,
                              False, {})[0]

    assert key({"x": x}, {"gamma": 0.5}) is not None
    assert key({"x": x}, {"gamma": 1}) is None
    assert key({"x": x}, {"gamma": torch.tensor(3.0).numpy()[()]}) is None
    assert key({"x": 1.0}, {"gamma": 0.5}) is None


@needs_interpreter
def test_settings_and_constants_in_key(stand_ins, monkeypatch, plans):
    """Launch settings, ``launch_config`` itself (a sweep replaces it), its constants and PyTorch's deterministic
    mode are in the key."""
    x = make_rollout((3, 20, 2))
    keys = {"base": _gae_key(x)}
    with monkeypatch.context() as m:
        m.setattr(scan, "launch_config", lambda *a, default=scan.launch_config: default(*a))
        keys["launch_config"] = _gae_key(x)
    with monkeypatch.context() as m:
        m.setattr(scan, "MAX_BLOCK_T", 16)
        keys["MAX_BLOCK_T"] = _gae_key(x)
    with monkeypatch.context() as m:
        m.setattr(scan, "LOOKBACK_SEGMENT_T", 8)
        keys["LOOKBACK_SEGMENT_T"] = _gae_key(x)
    with monkeypatch.context() as m:
        m.setattr(scan, "LOOKBACK_MIN_T", 0)
        keys["LOOKBACK_MIN_T"] = _gae_key(x)
    with monkeypatch.context() as m:
        m.setattr(triton.knobs.runtime, "debug", True)
        keys["debug"] = _gae_key(x)
    deterministic = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        keys["deterministic"] = _gae_key(x)
    finally:
        torch.use_deterministic_algorithms(deterministic)
    for a, b in itertools.combinations(keys, 2):
        assert keys[a] != keys[b], f"{a} and {b} share a key"


@needs_interpreter
def test_unplannable_structure_stays_plain(stand_ins, monkeypatch, plans):
    """Inputs whose dimensions do not merge are copied per call: no plan (remembered as None), plain launches."""
    call, _, coefs = TABLE["gae"]
    x = make_rollout((2, 3, 20, 1))
    # the two batch dimensions swapped in memory: (2, 3) do not merge into one strided dimension
    x = {k: v.transpose(0, 1).contiguous().transpose(0, 1) for k, v in x.items()}
    expected = _plain(monkeypatch, lambda: call(x, backend="triton", **coefs))
    for i in range(3):
        assert_identical(f"call {i}", call(x, backend="triton", **coefs), expected)
    assert list(plans.values()) == [None]
    assert stand_ins.replayed == 0


@needs_interpreter
def test_switched_off(stand_ins, monkeypatch, plans):
    """``LEAN_LAUNCH = False``: every launch plain, no plan built or replayed (one built before stays unused)."""
    call, _, coefs = TABLE["gae"]
    x = make_rollout((3, 20, 2))
    call(x, backend="triton", **coefs)
    assert len(plans) == 1
    monkeypatch.setattr(_launcher, "LEAN_LAUNCH", False)
    before = stand_ins.snapshot()
    for _ in range(3):
        call(make_rollout((3, 20, 2), seed=1), backend="triton", **coefs)
        call(make_rollout((3, 21, 2), seed=1), backend="triton", **coefs)
    assert stand_ins.snapshot() == (before[0] + 6, before[1], before[2]) and len(plans) == 1


@needs_interpreter
@pytest.mark.parametrize("case", ["launch-hook", "pre-run-hook"])
def test_hooks_take_plain_path(case, stand_ins, monkeypatch, plans):
    """While Triton's launch would do more than the compiled kernel's launcher, no plan is replayed."""
    call, _, coefs = TABLE["gae"]
    x = make_rollout((3, 20, 2))
    call(x, backend="triton", **coefs)
    if case == "launch-hook":
        hooks = triton.knobs.runtime.launch_enter_hook
        monkeypatch.setattr(hooks, "calls", [lambda metadata: None])
    else:
        kernel = importlib.import_module("rl_triton_torchrl.kernels.gae")._gae_fwd_kernel
        monkeypatch.setattr(kernel, "pre_run_hooks", [lambda *a, **k: None])
    before = stand_ins.snapshot()
    call(x, backend="triton", **coefs)
    assert stand_ins.snapshot() == (before[0] + 1, before[1], before[2])


def test_env_switch_off_leaves_plans_unbuilt(tmp_path):
    """``RL_TRITON_TORCHRL_LEAN_LAUNCH=0`` in a fresh process: GAE calls on a stand-in kernel launch plainly and
    build no plan (with the variable unset, the same calls replay a plan)."""
    code = f"""
import os, sys
sys.path.insert(0, {str(ROOT / 'tests')!r})
import torch
import test_launch_plan as t
from rl_triton_torchrl.kernels import _launcher, scan
if os.environ.get("TRITON_INTERPRET") != "1":
    print("skip"); sys.exit()
_launcher.driver._active = t._Driver()
module = sys.modules["rl_triton_torchrl.kernels.gae"]
stand_in = t.StandIn(module._gae_fwd_kernel)
module._gae_fwd_kernel = stand_in.jit
x = t.make_rollout((3, 20, 2))
for _ in range(3):
    t.TABLE["gae"][0](x, backend="triton", gamma=0.9, lmbda=0.8)
print(stand_in.plain, stand_in.lean, stand_in.replayed, len(scan._PLANS))
"""
    results = {}
    for value in ("0", None):
        env = {k: v for k, v in os.environ.items() if k != "RL_TRITON_TORCHRL_LEAN_LAUNCH"}
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
        if not CUDA:
            env["TRITON_INTERPRET"] = "1"
        if value is not None:
            env["RL_TRITON_TORCHRL_LEAN_LAUNCH"] = value
        result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300,
                                cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        results[value] = result.stdout.split()
    if results["0"] == ["skip"]:
        pytest.skip("the stand-in kernels need TRITON_INTERPRET=1")
    assert results["0"] == ["3", "0", "0", "0"], results["0"]
    assert results[None] == ["1", "0", "2", "1"], results[None]


@needs_interpreter
def test_interpreted_kernels_never_plan(plans):
    """Under the interpreter (no compiled kernel) every launch is plain: the plan cache stays empty."""
    call, _, coefs = TABLE["gae"]
    x = make_rollout((3, 20, 2))
    for _ in range(3):
        call(x, backend="triton", **coefs)
    assert not plans


@needs_interpreter
def test_uncached_layouts_not_planned(stand_ins, plans):
    """The scan custom op builds a layout per call (not kept): launched without building plans."""
    a, b = torch.rand(4, 30).to(DEVICE), torch.randn(4, 30).to(DEVICE)
    h, ht = scan._scan_op(a, b, None, True, True)
    h2, _ = scan._scan_op(a, b, None, True, True)
    assert_identical("h", h2, h)
    assert not plans and stand_ins.replayed == 0


@needs_interpreter
def test_full_cache_is_cleared(stand_ins, monkeypatch, plans):
    monkeypatch.setattr(scan, "_MAX_PLANS", 2)
    call, _, coefs = TABLE["gae"]
    for T in (20, 21, 22, 20, 21):
        x = make_rollout((3, T, 2))
        expected = _plain(monkeypatch, lambda: call(x, backend="triton", **coefs))
        for _ in range(2):
            assert_identical(f"T={T}", call(x, backend="triton", **coefs), expected)
        assert len(plans) <= 2


# ---------------------------------------------------------------------------------------------------------------
# new_outputs, getenv, the broadcast check
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64], ids=str)
def test_new_outputs_independent(dtype, monkeypatch):
    """Each output its own contiguous allocation of the layout's shape and dtype: freeing one frees its memory."""
    monkeypatch.setattr(scan, "POISON_OUTPUTS", False)
    x = torch.zeros(3, 7, 2, dtype=dtype, device=DEVICE)
    layout = _utils.check_inputs(-2, {"x": x}, {}, {})
    for _ in range(2):  # the first call makes the stride-0 tensor they are allocated like, the second reuses it
        outputs = scan.new_outputs(layout, 3)
        for y in outputs:
            assert y.shape == x.shape and y.dtype == dtype and y.device == x.device and y.is_contiguous()
            assert not y.requires_grad and y._base is None
            assert y.untyped_storage().nbytes() == y.numel() * y.element_size()
        assert len({y.untyped_storage().data_ptr() for y in outputs}) == 3


def test_new_outputs_keep_nothing_while_compiling(monkeypatch):
    monkeypatch.setattr(scan, "POISON_OUTPUTS", False)
    monkeypatch.setattr(scan, "_OUTPUT_LIKE", {})
    layout = _utils.check_inputs(-2, {"x": torch.zeros(3, 9, 2, device=DEVICE)}, {}, {})
    with monkeypatch.context() as m:
        m.setattr(torch.compiler, "is_compiling", lambda: True)
        (y,) = scan.new_outputs(layout, 1)
    assert not scan._OUTPUT_LIKE and y.shape == layout.shape
    (y,) = scan.new_outputs(scan._rows_layout(torch.zeros(4, 9, device=DEVICE)), 1)  # a layout not kept
    assert not scan._OUTPUT_LIKE and y.shape == (4, 9)
    scan.new_outputs(layout, 1)
    assert len(scan._OUTPUT_LIKE) == 1


SHAPES = [s for n in range(4) for s in itertools.product((0, 1, 2, 3), repeat=n)]


def test_broadcast_check_agrees_with_torch():
    for shape, target in itertools.product(SHAPES, SHAPES):
        try:
            expected = torch.broadcast_shapes(shape, target) == torch.Size(target)
        except RuntimeError:
            expected = False
        got = _utils._broadcasts_to(torch.Size(shape), torch.Size(target))
        assert got == expected, f"{shape} -> {target}: {got}, torch says {expected}"


def test_getenv_reads_every_change(monkeypatch):
    name = "RL_TRITON_TORCHRL_TEST_VARIABLE"
    monkeypatch.delenv(name, raising=False)
    assert _utils.getenv(name) == "" == os.environ.get(name, "")
    for value in ("torch", "", "é ü", "triton"):
        monkeypatch.setenv(name, value)
        assert _utils.getenv(name) == value
    monkeypatch.delenv(name)
    assert _utils.getenv(name) == ""
    monkeypatch.setattr(os, "environ", {name: "replaced"})  # not CPython's mapping: read with get
    assert _utils.getenv(name) == "replaced"


# ---------------------------------------------------------------------------------------------------------------
# Call replay (``_replay``): a call whose signature was recorded launches its plan with no checks and no plan key
# ---------------------------------------------------------------------------------------------------------------


def _gae_call(x, terminated="terminated", **kw):
    return gae_fn(x["reward"], x["value"], x["next_value"], x["done"], x[terminated],
                  **{"gamma": 0.97, "lmbda": 0.9, "backend": "triton", **kw})


@needs_interpreter
def test_call_replay_checks_nothing(stand_ins, monkeypatch):
    """A replayed call runs no input check (they held for its signature when it was recorded) and equals the plain
    path bit for bit, on its own data."""
    _gae_call(make_rollout((3, 20, 2)))
    for seed in (1, 2):
        y = make_rollout((3, 20, 2), seed=seed)
        with pytest.MonkeyPatch.context() as m:  # any check would raise now
            m.setattr(_utils, "_uniform_layout", None)
            m.setattr(_utils, "_checked_layout", None)
            out = _gae_call(y)
        assert_identical(f"seed {seed}", out, _plain(monkeypatch, lambda: _gae_call(y)))
    assert stand_ins.calls_replayed == 2


@needs_interpreter
@pytest.mark.parametrize("change", ["gamma", "sign-of-zero", "int-gamma", "time_dim", "config", "shape", "dtype"])
def test_call_replay_keys_each_argument(change, stand_ins, monkeypatch):
    """Another value of any argument (its type and the sign of a zero included), or another launch constant, is
    another signature: recorded anew, never served by the other's launch."""
    x = make_rollout((3, 20, 2))
    first = {"gamma": 0.0, "lmbda": 0.0, "time_dim": 1}
    second = dict(first)
    y = x
    if change == "gamma":
        second["gamma"] = 0.5
    elif change == "sign-of-zero":
        second["lmbda"] = -0.0
    elif change == "int-gamma":
        first["gamma"], second["gamma"] = 1.0, 1
    elif change == "time_dim":
        second["time_dim"] = -2  # the same dimension, another value: a call of its own
    elif change == "shape":
        y = make_rollout((3, 21, 2))
    elif change == "dtype":
        y = make_rollout((3, 20, 2), dtype=torch.float64)
    for i, (kw, rollout) in enumerate(((first, x), (first, x), (second, y), (second, y))):
        if change == "config" and i == 2:
            monkeypatch.setattr(scan, "MAX_BLOCK_T", 8)
        expected = _plain(monkeypatch, lambda: _gae_call(rollout, **kw))
        assert_identical(f"{change} {kw}", _gae_call(rollout, **kw), expected)
    assert stand_ins.calls_replayed == 2
    if change == "config":
        # the four plain calls of the expected outputs, the first call, and the first under the new constants
        assert stand_ins.plain == 4 + 2, "the new launch constants should have launched plainly"


@needs_interpreter
def test_call_replay_keeps_bool_and_int_apart(stand_ins):
    """``time_dim=True`` equals ``time_dim=1`` as a dict key; the call must still raise as it does unrecorded."""
    x = make_rollout((3, 20, 2))
    for _ in range(2):
        _gae_call(x, time_dim=1)
    with pytest.raises(TypeError, match="time_dim"):
        _gae_call(x, time_dim=True)


@needs_interpreter
def test_call_replay_not_recorded_for_shared_arguments(stand_ins, monkeypatch):
    """A call passing one tensor as two arguments (``done`` as ``terminated``) is not recorded: which argument the
    launch read would be a guess. A later call of the same signature with two tensors records; one with the same
    tensor twice then replays it correctly, each argument read as itself."""
    x = make_rollout((3, 20, 2))
    for terminated in ("done", "done", "terminated", "terminated", "done"):
        expected = _plain(monkeypatch, lambda: _gae_call(x, terminated))
        assert_identical(terminated, _gae_call(x, terminated), expected)
    assert stand_ins.calls_replayed == 2


@needs_interpreter
def test_call_replay_not_recorded_where_outputs_change_after_the_launch(stand_ins):
    """A function that works on its outputs after the launch (here in place) is never replayed: the replay would
    skip that work. After ``RECORDINGS`` tries it runs unrecorded, and the ``linear_scan`` inside it replays."""

    @_replay.replayable
    def doubled(a, b):
        return linear_scan(a, b, backend="triton").mul_(2)

    g = torch.Generator().manual_seed(0)
    a, b = torch.rand(3, 20, 2, generator=g), torch.randn(3, 20, 2, generator=g)
    expected = 2 * linear_scan(a, b, backend="torch")
    for i in range(_replay.RECORDINGS + 2):
        torch.testing.assert_close(doubled(a, b), expected, msg=f"call {i}")
    assert stand_ins.calls_replayed == 2, "the inner linear_scan replays; the outer function never does"


@needs_interpreter
def test_call_replay_follows_the_launcher_settings(stand_ins, monkeypatch):
    """With the lean launcher switched off after a call was recorded, its signature launches the plain way."""
    x = make_rollout((3, 20, 2))
    for _ in range(2):
        _gae_call(x)
    monkeypatch.setattr(_launcher, "LEAN_LAUNCH", False)
    before = stand_ins.plain
    expected = _gae_call(x)
    assert stand_ins.plain == before + 1 and stand_ins.calls_replayed == 1
    monkeypatch.undo()
    assert_identical("after", _plain(monkeypatch, lambda: _gae_call(x)), expected)


@needs_interpreter
def test_call_replay_off(stand_ins, monkeypatch):
    monkeypatch.setattr(_replay, "REPLAY", False)
    x = make_rollout((3, 20, 2))
    for _ in range(3):
        _gae_call(x)
    assert stand_ins.calls_replayed == 0 and not _replay._ENTRIES
    assert stand_ins.replayed + stand_ins.native == 2, "the launch plans still replay"


@pytest.mark.parametrize("env", [{}, {"TRITON_INTERPRET": "1"}, {"RL_TRITON_TORCHRL_REPLAY": "0"}])
def test_call_replay_on_where_kernels_can_launch(env):
    """On by default with a CUDA build of torch or under the interpreter (where the CPU tests launch), off with a
    CPU-only build outside it (no call would launch: the signature would only cost) and when switched off."""
    clean = {k: v for k, v in os.environ.items() if k not in ("TRITON_INTERPRET", "RL_TRITON_TORCHRL_REPLAY")}
    out = subprocess.run([sys.executable, "-c", "import rl_triton_torchrl.kernels._replay as r; print(r.REPLAY)"],
                         capture_output=True, text=True, env={**clean, **env}, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stderr
    expected = "RL_TRITON_TORCHRL_REPLAY" not in env and (torch.backends.cuda.is_built() or bool(env))
    assert out.stdout.strip() == str(expected)


def test_call_replay_remembers_calls_that_launch_nothing(monkeypatch):
    """A signature whose call launched nothing (the torch path) is remembered as such: later calls run it as they
    are, unrecorded."""
    monkeypatch.setattr(_replay, "_ENTRIES", {})
    x = make_rollout((3, 20, 2))
    for _ in range(2):
        out = _gae_call(x, backend="torch")
    assert list(_replay._ENTRIES.values()) == [_replay.RECORDINGS]
    assert_identical("torch path", out, _gae_call(x, backend="torch"))


# ---------------------------------------------------------------------------------------------------------------
# On the GPU: compiled kernels, replayed and plain
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("case", ["contig", "sliced", "float64", "states"])  # (look-back: not bitwise repeatable)
@pytest.mark.parametrize("algo", list(TABLE))
def test_gpu_replay_equals_plain(algo, case, monkeypatch, plans):
    _gpu_calls_equal_plain(algo, case, monkeypatch)
    assert any(plan is not None for plan in plans.values()), f"{algo}: no plan built"


def _gpu_calls_equal_plain(algo: str, case: str, monkeypatch, calls: int = 3) -> None:
    """``calls`` calls of ``algo`` on the lean path, each bit for bit the plain path's (``CASES[case]``)."""
    rollout, extra, patches = CASES[case]
    for name, value in patches.items():
        monkeypatch.setattr(scan, name, value)
    x = make_rollout(**{"shape": (3, 20, 2), **rollout})
    call, _, coefs = TABLE[algo]
    kw = {**coefs, **extra(x)}
    expected = _plain(monkeypatch, lambda: call(x, backend="triton", **kw))
    for i in range(calls):
        assert_identical(f"{algo} call {i}", call(x, backend="triton", **kw), expected)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("case", ["contig", "time-major", "states", "float64"])
@pytest.mark.parametrize("algo", list(TABLE))
def test_gpu_call_replay_equals_plain(algo, case, monkeypatch, plans):
    """On CUDA no call checks values, so every algorithm's calls after the first are replayed whole."""
    counts = _count_call_replays(monkeypatch)
    _gpu_calls_equal_plain(algo, case, monkeypatch)
    assert counts.calls_replayed == 2, f"{algo}: {counts.calls_replayed} of 3 calls replayed whole"


def _with_c_extension(monkeypatch) -> None:
    """Calls replayed by the C++ extension from now on (built here if need be)."""
    module = _fastcall.load()
    assert module is not None, _fastcall.status()
    monkeypatch.setattr(_replay, "_FAST", module)


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.skipif(not _fastcall.ENABLED, reason="the C++ extension is built on Linux only")
@pytest.mark.parametrize("case", ["contig", "time-major", "states", "float64"])
@pytest.mark.parametrize("algo", list(TABLE))
def test_gpu_c_call_replay_equals_plain(algo, case, monkeypatch, plans):
    """With the C++ extension every call after the first is made in C++, bit for bit the plain path's."""
    _with_c_extension(monkeypatch)
    counts = _count_call_replays(monkeypatch)
    _gpu_calls_equal_plain(algo, case, monkeypatch)
    assert counts.calls_replayed == 2, f"{algo}: {counts.calls_replayed} of 3 calls replayed whole"
    assert counts.c_replays == 2, f"{algo}: {counts.c_replays} of 3 calls made in C++"


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.skipif(not _fastcall.ENABLED, reason="the C++ extension is built on Linux only")
def test_gpu_c_replay_in_cuda_graph(monkeypatch, plans):
    """A call made in C++ while a CUDA graph is captured launches on the capture's stream into the capture's memory,
    and the graph reads the inputs at replay."""
    _with_c_extension(monkeypatch)
    counts = _count_call_replays(monkeypatch)
    x = make_rollout((64, 50, 1))
    kw = {"gamma": 0.97, "lmbda": 0.9}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # compiled and planned, then made in C++
            TABLE["gae"][0](x, backend="triton", **kw)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = TABLE["gae"][0](x, backend="triton", **kw)
    assert counts.c_replays == 2, f"{counts.c_replays} calls made in C++, the captured one among them"
    fresh = make_rollout((64, 50, 1), seed=9)
    for k, v in x.items():
        v.copy_(fresh[k])
    graph.replay()
    torch.cuda.synchronize()
    assert_identical("captured", captured, _plain(monkeypatch, lambda: TABLE["gae"][0](x, backend="triton", **kw)))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_gpu_cpu_coefficient_is_moved_not_planned(monkeypatch, plans):
    """A one-element CPU coefficient is copied to the device per call: replayed launches would need the copy."""
    call, _, coefs = TABLE["gae"]
    x = make_rollout((3, 20, 2))
    kw = {**coefs, "gamma": torch.tensor(0.97)}
    expected = _plain(monkeypatch, lambda: call(x, backend="triton", **kw))
    for i in range(3):
        assert_identical(f"call {i}", call(x, backend="triton", **kw), expected)
    assert list(plans.values()) == [None]


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_gpu_replay_in_cuda_graph(plans):
    """A replayed launch captured in a CUDA graph runs on the capture's stream and reads the inputs at replay."""
    x = make_rollout((64, 50, 1))
    kw = {"gamma": 0.97, "lmbda": 0.9, "output_final_state": True}
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # compiled, planned
            TABLE["gae"][0](x, backend="triton", **kw)
    torch.cuda.current_stream().wait_stream(stream)
    assert len(plans) == 1
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = TABLE["gae"][0](x, backend="triton", **kw)
    fresh = make_rollout((64, 50, 1), seed=9)
    for k, v in x.items():
        v.copy_(fresh[k])
    graph.replay()
    torch.cuda.synchronize()
    assert_identical("captured", captured, TABLE["gae"][0](x, backend="triton", **kw))


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_gpu_gae_functional_unchanged():
    """The public call on CUDA tensors, replayed, against the torch path (a sanity check of the whole chain)."""
    x = make_rollout((8, 33, 1))
    ref = gae_fn(x["reward"], x["value"], x["next_value"], x["done"], x["terminated"], gamma=0.97, lmbda=0.9,
                 backend="torch")
    for _ in range(3):
        out = gae_fn(x["reward"], x["value"], x["next_value"], x["done"], x["terminated"], gamma=0.97, lmbda=0.9)
        for o, r in zip(out, ref):
            torch.testing.assert_close(o, r, rtol=1e-5, atol=1e-4)


@needs_interpreter
def test_shifted_gae_is_planned_and_replays(native_stand_ins, monkeypatch, plans):
    """GAE's shifted input mode (the last value broadcast along time as ``nv``) builds a plan and replays it natively,
    equal to the plain path bit for bit."""
    x = make_rollout((3, 20, 2), seed=5)
    lv = torch.randn(3, 2, generator=torch.Generator().manual_seed(1)).to(DEVICE)

    def call():
        return gae_fn(x["reward"], x["value"], None, x["done"], gamma=0.97, lmbda=0.9, time_dim=-2,
                      last_state_value=lv, backend="triton")

    expected = _plain(monkeypatch, call)
    before = native_stand_ins.native
    for i in range(3):
        assert_identical(f"shifted call {i}", call(), expected)
    assert native_stand_ins.native - before == 2 and len(plans) == 1
