"""The lean launcher (kernels/_launcher.py): its cache key, its plain-path fallbacks, and its launches on the GPU.

On the CPU the lean path runs against a stand-in: a real ``JITFunction`` whose ``run`` records the plain launches
and returns a recording compiled kernel, on a stand-in driver. On the GPU it launches a real kernel, plain and lean,
eagerly and inside a CUDA graph.
"""
from __future__ import annotations

import itertools
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="the lean launcher launches Triton kernels")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from _helpers import assert_close
from rl_triton_torchrl.kernels import _launcher
from rl_triton_torchrl.kernels._launcher import Specializer, launcher

CUDA = torch.cuda.is_available()
ROOT = Path(__file__).resolve().parent.parent
INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"


def _axpy(x_ptr, y_ptr, out_ptr, alpha, n, s_x, BLOCK: tl.constexpr, HAS_Y: tl.constexpr):
    o_n = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m_n = o_n < n
    b_out = tl.load(x_ptr + o_n * s_x, mask=m_n, other=0.0) * alpha  # [BLOCK]
    if HAS_Y:
        b_out += tl.load(y_ptr + o_n, mask=m_n, other=0.0)
    tl.store(out_ptr + o_n, b_out, mask=m_n)


_axpy_kernel = triton.jit(_axpy)  # interpreted where TRITON_INTERPRET=1, compiled on a GPU


def _args(size=40, dtype=torch.float32, device="cpu", **changes) -> dict:
    """Arguments of ``_axpy`` over ``size`` elements, with ``changes`` applied (``n`` may claim another size)."""
    x = torch.randn(size, dtype=dtype, device=device)
    args = dict(x_ptr=x, y_ptr=torch.randn(size, dtype=dtype, device=device), out_ptr=torch.empty_like(x),
                alpha=0.5, n=size, s_x=1, BLOCK=16, HAS_Y=True)
    return {**args, **changes}


def _grid(args):
    return (triton.cdiv(args["n"], args["BLOCK"]),)


def _misaligned(n=40, device="cpu"):
    return torch.randn(n + 1, device=device)[1:]  # 4 bytes past a 16-byte aligned allocation


# name -> changes to _args() that Triton compiles separately (but "constexpr-type": Triton's cache takes True for 1)
SPECIALIZATIONS = {
    "misaligned-pointer": lambda: {"x_ptr": _misaligned()},
    "none-pointer": lambda: {"y_ptr": None, "HAS_Y": False},
    "none-pointer-only": lambda: {"y_ptr": None},
    "int-equal-1": lambda: {"n": 1},
    "int-divisible-by-16": lambda: {"n": 48},
    "int64": lambda: {"n": 2**33 + 3},
    "int64-divisible-by-16": lambda: {"n": 2**33},
    "uint64": lambda: {"n": 2**63 + 5},
    "constexpr-value": lambda: {"BLOCK": 32},
    "constexpr-type": lambda: {"HAS_Y": 1},
    "dtype": lambda: {"x_ptr": torch.randn(40, dtype=torch.float16)},
    "bool-flag-tensor": lambda: {"y_ptr": torch.zeros(40, dtype=torch.bool)},
    "int-scalar": lambda: {"alpha": 3},
    "bool-scalar": lambda: {"alpha": True},
}


def _jit() -> JITFunction:
    """A compiled-kind ``JITFunction`` of ``_axpy`` whatever TRITON_INTERPRET says (it is never compiled here)."""
    return JITFunction(_axpy)


def _key(specializer: Specializer, args: dict) -> tuple:
    return specializer.key(tuple(args[n] for n in specializer.names))


def _triton_specialization(kernel, args: dict) -> tuple:
    """What Triton 3.6's own binder specializes these arguments on (its cache key, less the options)."""
    from triton.backends.compiler import BaseBackend
    from triton.runtime.jit import create_function_from_signature

    binder = create_function_from_signature(kernel.signature, kernel.params, BaseBackend)
    return tuple(binder(**args)[1])


@pytest.mark.parametrize("name", SPECIALIZATIONS)
def test_key_distinguishes_every_specialization(name):
    specializer = Specializer.of(_jit())
    base, changed = _args(), _args(**SPECIALIZATIONS[name]())
    assert _key(specializer, changed) != _key(specializer, base), f"{name}: shares the key of the base arguments"


def test_key_is_finer_than_triton():
    """Any two argument sets with one key are one specialization to Triton (the property the cache relies on)."""
    kernel = _jit()
    specializer = Specializer.of(kernel)
    variants = {"base": _args(), **{name: _args(**change()) for name, change in SPECIALIZATIONS.items()}}
    keys = {name: _key(specializer, args) for name, args in variants.items()}
    specs = {name: _triton_specialization(kernel, args) for name, args in variants.items()}
    for a, b in itertools.combinations(variants, 2):
        if keys[a] == keys[b]:
            assert specs[a] == specs[b], f"{a} and {b} share a key but Triton specializes them apart"


def test_key_ignores_what_triton_does_not_specialize():
    """Other data, sizes with the same divisibility and other float values share the key: one compiled kernel
    serves every call of a training loop."""
    specializer = Specializer.of(_jit())
    assert _key(specializer, _args(40, alpha=0.5)) == _key(specializer, _args(56, alpha=0.99))
    assert _key(specializer, _args(32)) == _key(specializer, _args(4096))


def test_key_survives_forgetting(monkeypatch):
    """The memo of int keys is cleared when full; keys stay the same, and still apart, afterwards."""
    monkeypatch.setattr(_launcher, "MAX_SPECIALIZATIONS", 2)
    specializer = Specializer.of(_jit())
    base, one = _key(specializer, _args()), _key(specializer, _args(**SPECIALIZATIONS["int-equal-1"]()))
    for size in range(41, 60):
        _key(specializer, _args(size))
    assert _key(specializer, _args()) == base
    assert _key(specializer, _args(**SPECIALIZATIONS["int-equal-1"]())) == one != base


@pytest.mark.parametrize("arg", [(1, 2), torch.tensor(3.0).numpy()[()], object()], ids=["tuple", "numpy", "object"])
def test_key_refuses_unknown_types(arg):
    with pytest.raises(TypeError):
        _key(Specializer.of(_jit()), _args(alpha=arg))


# ---------------------------------------------------------------------------------------------------------------
# The lean path on the CPU, against a recording stand-in for Triton's compile and launch
# ---------------------------------------------------------------------------------------------------------------


class _Compiled:
    """Stands in for a ``CompiledKernel``: records the calls of its launcher."""

    function = 1234
    packed_metadata = (4, 1, 0)

    def __init__(self):
        self.launches = []

    def run(self, *args):
        self.launches.append(args)


class _Driver:
    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 77


@pytest.fixture
def recorder(monkeypatch):
    """(launcher of a stand-in kernel, its plain launches, its compiled kernel)."""
    monkeypatch.setattr(_launcher.driver, "_active", _Driver())
    kernel, plain, compiled = _jit(), [], _Compiled()

    def run(*args, grid, warmup, **kwargs):
        plain.append((grid, kwargs))
        return compiled

    kernel.run = run  # what kernel[grid](...) calls
    return _launcher.Launcher(kernel), plain, compiled


def test_lean_path_after_first_call(recorder):
    lean, plain, compiled = recorder
    args = _args()
    assert lean((3,), 4, **args) is compiled  # compiles (here: records) through kernel[grid]
    assert plain == [((3,), {**args, "num_warps": 4})] and not compiled.launches
    second = _args()  # new tensors of the same specialization
    assert lean((3,), 4, **second) is compiled
    assert len(plain) == 1, "the second call took the plain path"
    expected = (3, 1, 1, 77, compiled.function, compiled.packed_metadata, None, None, None,
                *(second[n] for n in lean.specializer.names))
    assert len(compiled.launches) == 1
    launched = compiled.launches[0]
    assert len(launched) == len(expected) and all(
        a is b if isinstance(b, torch.Tensor) else a == b for a, b in zip(launched, expected)), launched


@pytest.mark.parametrize("name", ["misaligned-pointer", "none-pointer", "int-equal-1", "constexpr-value", "dtype"])
def test_new_specialization_takes_plain_path(recorder, name):
    lean, plain, compiled = recorder
    lean((3,), 4, **_args())
    lean((3,), 4, **_args(**SPECIALIZATIONS[name]()))
    assert len(plain) == 2 and not compiled.launches
    lean((3,), 8, **_args())  # num_warps
    assert len(plain) == 3
    lean((3,), 4, 40, **_args())  # maxnreg
    assert len(plain) == 4 and plain[-1][1]["maxnreg"] == 40
    lean((3,), 4, 40, **_args())
    assert len(plain) == 4 and len(compiled.launches) == 1


def test_switch_off(recorder, monkeypatch):
    lean, plain, compiled = recorder
    monkeypatch.setattr(_launcher, "LEAN_LAUNCH", False)
    for _ in range(3):
        lean((3,), 4, **_args())
    assert len(plain) == 3 and not compiled.launches


@pytest.mark.parametrize("value,expected", [(None, True), ("1", True), ("0", False)])
def test_env_switch(value, expected):
    env = {k: v for k, v in os.environ.items() if k != "RL_TRITON_TORCHRL_LEAN_LAUNCH"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    if value is not None:
        env["RL_TRITON_TORCHRL_LEAN_LAUNCH"] = value
    code = "from rl_triton_torchrl.kernels import _launcher; print(_launcher.LEAN_LAUNCH)"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(expected)


def _add_enter_hook(monkeypatch):
    hooks = triton.knobs.runtime.launch_enter_hook
    if hasattr(hooks, "add"):  # a HookChain (Triton 3.6)
        monkeypatch.setattr(hooks, "calls", [lambda metadata: None])
    else:
        monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", lambda metadata: None)


@pytest.mark.parametrize("case", ["launch-hook", "pre-run-hook", "callable-grid", "extra-option", "missing-arg",
                                  "unknown-type", "changed-global"])
def test_plain_path_cases(recorder, monkeypatch, case):
    """Each case launches through kernel[grid] every time, and never fails for being unusual."""
    lean, plain, compiled = recorder
    args, grid, options = _args(), (3,), {}
    if case == "launch-hook":
        _add_enter_hook(monkeypatch)
    elif case == "pre-run-hook":
        lean.kernel.pre_run_hooks.append(lambda *a, **k: None)
    elif case == "callable-grid":
        grid = _grid
    elif case == "extra-option":
        options = {"num_stages": 2}
    elif case == "missing-arg":
        del args["s_x"]
    elif case == "unknown-type":
        args["alpha"] = (0.5,)
    elif case == "changed-global":
        scope = {"G": 1}
        lean.kernel.used_global_vals = {("G", id(scope)): (1, scope)}
        lean((3,), 4, **args)
        scope["G"] = 2
    for _ in range(2):
        lean(grid, 4, **args, **options)
    assert not compiled.launches
    assert len(plain) == 2 + (case == "changed-global")


def test_settings(recorder, monkeypatch):
    """What a lean launch depends on besides its arguments; None while every launch takes the plain path."""
    lean, _, _ = recorder
    settings = lean.settings()
    assert settings is not None and settings[0] == 0  # the stand-in driver's current device
    with monkeypatch.context() as m:
        m.setattr(_launcher, "LEAN_LAUNCH", False)
        assert lean.settings() is None
    with monkeypatch.context() as m:
        _add_enter_hook(m)
        assert lean.settings() is None
    with monkeypatch.context() as m:
        m.setattr(lean.kernel, "pre_run_hooks", [lambda *a, **k: None])
        assert lean.settings() is None
    scope = {"G": 1}
    monkeypatch.setattr(lean.kernel, "used_global_vals", {("G", id(scope)): (1, scope)})
    assert lean.settings() == settings
    scope["G"] = 2
    assert lean.settings() is None


class _Counted:
    """A global's value that counts its ``==`` (as a ``tl.constexpr``, which Triton records as a deep copy)."""

    compared = 0

    def __init__(self, value):
        self.value = value

    def __eq__(self, other):
        type(self).compared += 1
        return isinstance(other, _Counted) and other.value == self.value

    __hash__ = None


def test_settings_compare_an_equal_global_once(recorder, monkeypatch):
    """A global equal to, but not the same object as, the value Triton recorded is compared once per binding: later
    checks of the same object are an identity test; a new binding is compared again, and a changed value refuses."""
    lean, _, _ = recorder
    scope = {"G": _Counted(1)}
    monkeypatch.setattr(_Counted, "compared", 0)
    monkeypatch.setattr(lean.kernel, "used_global_vals", {("G", id(scope)): (_Counted(1), scope)})
    settings = [lean.settings() for _ in range(3)]
    assert settings[0] is not None and settings.count(settings[0]) == 3 and _Counted.compared == 1
    scope["G"] = _Counted(1)  # another object, equal
    assert lean.settings() == settings[0] and lean.settings() == settings[0] and _Counted.compared == 2
    scope["G"] = _Counted(2)
    assert lean.settings() is None


def test_compiled_for_and_replay(recorder):
    """``compiled_for`` finds the compiled kernel a launch remembered; ``replay`` launches it on the current stream
    with the arguments as given (pointers as ints here), as a lean launch does."""
    lean, plain, compiled = recorder
    args, settings = _args(), lean.settings()
    assert lean.compiled_for(settings, 4, None, args) is None  # nothing launched yet
    lean((3,), 4, **args)
    hit = lean.compiled_for(settings, 4, None, _args())  # other tensors, same key
    assert hit is not None and hit.kernel is compiled
    assert lean.compiled_for(settings, 8, None, args) is None  # another num_warps
    assert lean.compiled_for(settings, 4, 40, args) is None  # another maxnreg
    assert lean.compiled_for(settings, 4, None, {**args, "num_stages": 2}) is None  # an option: not a lean launch
    assert lean.compiled_for(settings, 4, None, {**args, "alpha": (1,)}) is None  # a type the key refuses
    ints = tuple(args[n].data_ptr() if isinstance(args[n], torch.Tensor) else args[n]
                 for n in lean.specializer.names)
    _launcher.replay(hit, (3, 2), 0, ints)
    assert compiled.launches == [(3, 2, 1, 77, compiled.function, compiled.packed_metadata, None, None, None, *ints)]
    assert len(plain) == 1


def test_launcher_is_cached_per_kernel():
    kernel = _jit()
    assert launcher(kernel) is launcher(kernel)
    assert launcher(_jit()) is not launcher(kernel)


# ---------------------------------------------------------------------------------------------------------------
# Real launches: the interpreter on the CPU, compiled kernels on the GPU
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1 (set by conftest.py without a GPU)")
@pytest.mark.parametrize("case", ["base", "none-pointer", "misaligned-pointer"])
def test_interpreter_falls_back_to_plain(case):
    assert launcher(_axpy_kernel).specializer is None
    args = _args(**SPECIALIZATIONS[case]()) if case != "base" else _args()
    plain = {**args, "out_ptr": torch.full_like(args["out_ptr"], float("nan"))}
    _axpy_kernel[_grid(args)](**plain, num_warps=4)
    args["out_ptr"].fill_(float("nan"))
    assert launcher(_axpy_kernel)(_grid(args), 4, **args) is None
    assert_close("out", args["out_ptr"], plain["out_ptr"])
    assert_close("out", args["out_ptr"], _expected(args))


def _expected(args):
    y = args["y_ptr"] if args["HAS_Y"] else 0.0
    return args["x_ptr"][:: args["s_x"]][: args["n"]] * args["alpha"] + y


GPU_CASES = {
    "base": lambda: {},
    "no-y": lambda: {"y_ptr": None, "HAS_Y": False},
    "n1": lambda: {"size": 1},
    "stride2": lambda: {"s_x": 2, "x_ptr": torch.randn(80, device="cuda")},
    "misaligned": lambda: {"x_ptr": _misaligned(device="cuda")},
    "float16": lambda: {"dtype": torch.float16},
}


@pytest.fixture
def plain_runs(monkeypatch):
    """The grids of the launches of ``_axpy_kernel`` that go through Triton's ``JITFunction.run``."""
    grids, real = [], _axpy_kernel.run

    def run(*args, **kwargs):
        grids.append(kwargs["grid"])
        return real(*args, **kwargs)

    monkeypatch.setattr(_axpy_kernel, "run", run)
    return grids


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
@pytest.mark.parametrize("case", GPU_CASES)
def test_lean_launch_equals_plain_on_gpu(case, plain_runs):
    lean = launcher(_axpy_kernel)
    for call in range(3):  # the first call may compile through kernel[grid]; the next ones launch lean
        changes = GPU_CASES[case]()
        dtype = changes.pop("dtype", torch.float32)
        args = _args(dtype=dtype, device="cuda", **changes)
        compiled = lean(_grid(args), 4, **args)
        plain_out = torch.full_like(args["out_ptr"], float("nan"))
        plain = _axpy_kernel[_grid(args)](**{**args, "out_ptr": plain_out}, num_warps=4)
        assert compiled is plain, "lean and plain launches ran different compiled kernels"
        assert torch.equal(args["out_ptr"], plain_out), f"call {call}: lean and plain outputs differ"
        assert_close(f"out (call {call})", args["out_ptr"], _expected(args), dtype)
    assert len(plain_runs) <= 3 + 1, "the lean launcher went through kernel[grid] after its first call"


@pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
def test_lean_launch_in_cuda_graph(plain_runs):
    """Captured lean launches replay on the graph's stream and read the tensors' current contents."""
    args = _args(1000, device="cuda")
    lean, grid = launcher(_axpy_kernel), _grid(args)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):  # compiled (or found compiled), then lean
            lean(grid, 4, **args)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        lean(grid, 4, **args)
    assert len(plain_runs) <= 1, "the captured launch went through kernel[grid]"
    args["x_ptr"].copy_(torch.randn_like(args["x_ptr"]))
    args["out_ptr"].fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_close("out", args["out_ptr"], _expected(args))


@pytest.mark.parametrize("version", ["3.7.1", "3.9.0", "4.0.0"])
def test_unverified_triton_takes_plain_path_and_says_so(recorder, monkeypatch, version):
    """On a Triton the lean launcher was not verified on, every launch is plain, and one warning says so."""
    lean, plain, compiled = recorder
    monkeypatch.setattr(_launcher.triton, "__version__", version)
    monkeypatch.setattr(_launcher, "_VERIFIED", None)
    with pytest.warns(RuntimeWarning, match=f"Triton {version} is not one its lean launcher was verified on"):
        assert lean.settings() is None
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # said once only
        for _ in range(3):
            lean((1,), 4, **_args())
    assert len(plain) == 3 and not compiled.launches


def test_verified_triton_is_the_installed_one_in_ci():
    """CI's pinned Triton is a verified one (else the lean path would never be tested here)."""
    assert _launcher.VERIFIED_TRITON >= {"3.6.0"}


# ---- prewarm: Triton's one-time hash of its installation, in a background thread ----


def test_prewarm_computes_triton_key_in_the_background(monkeypatch):
    key = _launcher._triton_key()
    assert key is not None, "Triton 3.6 memoises triton.runtime.cache.triton_key"
    monkeypatch.setattr(_launcher, "_PREWARM_THREAD", None)
    key.cache_clear()
    thread = _launcher.prewarm(force=True)
    assert thread is not None and thread.daemon
    assert _launcher.prewarm(force=True) is None  # once per process
    _launcher._join_prewarm()
    assert not thread.is_alive() and key.cache_info().currsize == 1


def test_prewarm_off(monkeypatch):
    monkeypatch.setattr(_launcher, "_PREWARM_THREAD", None)
    monkeypatch.setattr(_launcher, "PREWARM", False)
    assert _launcher.prewarm(force=True) is None
    monkeypatch.setattr(_launcher, "PREWARM", True)
    monkeypatch.setattr(_launcher, "_triton_key", lambda: None)  # a Triton without it
    assert _launcher.prewarm(force=True) is None


class _Hashed:
    """Stands in for a kernel: its ``cache_key`` waits for ``release`` and counts its reads; ``locked``: it has
    Triton's ``_hash_lock``."""

    def __init__(self, locked: bool):
        self.release, self.reads = threading.Event(), 0
        if locked:
            self._hash_lock = threading.RLock()

    @property
    def cache_key(self):
        self.reads += 1
        self.release.wait(10)
        return "key"


def test_prewarm_hashes_kernels_after_the_installation(monkeypatch):
    """After Triton's hash of its installation the thread reads each kernel's ``cache_key``, only where Triton locks
    it; a plain launch waits for the installation's hash alone, a fork for the whole thread."""
    monkeypatch.setattr(_launcher, "_PREWARM_THREAD", None)
    locked, unlocked = _Hashed(locked=True), _Hashed(locked=False)
    thread = _launcher.prewarm(force=True, kernels=(unlocked, locked))
    try:
        _launcher._join_prewarm(whole=False)  # returns while the thread waits in the locked kernel's hash
        deadline = time.monotonic() + 10
        while locked.reads == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert thread.is_alive() and locked.reads == 1
    finally:
        locked.release.set()
    _launcher._join_prewarm()
    assert not thread.is_alive() and unlocked.reads == 0


def test_prewarm_hashes_every_kernel():
    """In a process that compiles kernels, the thread started at import leaves every kernel's hash computed."""
    code = (
        "import rl_triton_torchrl.kernels as k\n"
        "from rl_triton_torchrl.kernels import _launcher\n"
        "kernels = k._kernels()\n"
        "assert len(kernels) == 9, kernels\n"
        "(_launcher._PREWARM_THREAD or _launcher.prewarm(force=True, kernels=kernels)).join()\n"
        "assert all(x.hash is not None for x in kernels), [x for x in kernels if x.hash is None]\n"
    )
    _run_with_prewarm(code)


@pytest.mark.skipif(not INTERPRET, reason="under the interpreter no kernel is compiled")
def test_prewarm_not_under_the_interpreter(monkeypatch):
    monkeypatch.setattr(_launcher, "_PREWARM_THREAD", None)
    assert _launcher.prewarm() is None


def _run_with_prewarm(code: str) -> None:
    """Runs ``code`` in a fresh process that compiles kernels (no interpreter), the prewarm switched on; it must
    exit 0."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["RL_TRITON_TORCHRL_PREWARM"] = "1"
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_fork_waits_for_prewarm():
    """A fork right after the prewarm started: the child starts without the thread (no warning about forking a
    multi-threaded process, Python 3.12+) and computes the hash itself without waiting on a lock of its parent."""
    code = (
        "import os, threading, warnings\n"
        "warnings.simplefilter('error', DeprecationWarning)\n"
        "from rl_triton_torchrl.kernels import _launcher\n"
        "assert (_launcher._PREWARM_THREAD or _launcher.prewarm(force=True)) is not None  # (CUDA builds: at import)\n"
        "pid = os.fork()\n"
        "if pid == 0:\n"
        "    ok = threading.active_count() == 1 and _launcher._triton_key()()\n"
        "    os._exit(0 if ok else 3)\n"
        "_, status = os.waitpid(pid, 0)\n"
        "raise SystemExit(os.waitstatus_to_exitcode(status))\n"
    )
    _run_with_prewarm(code)


def test_prewarm_imports_nothing():
    """The thread reads and hashes files only: after the kernels' import it imports no module (no import lock)."""
    code = (
        "import sys\n"
        "from rl_triton_torchrl.kernels import _launcher\n"
        "before = set(sys.modules)\n"
        "(_launcher._PREWARM_THREAD or _launcher.prewarm(force=True)).join()  # (CUDA builds: started at import)\n"
        "new = sorted(set(sys.modules) - before)\n"
        "assert not new, new\n"
    )
    _run_with_prewarm(code)
