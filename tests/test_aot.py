"""Kernels compiled ahead of time (kernels/_aot.py, kernels/precompile.py): the variant key, the bundle, the lean
launcher's use of it and its fallbacks.

On the CPU the key and the lookup run against a stand-in driver that names sm_90 and a stand-in loader; the
precompile command runs for real in a subprocess (Triton's compiler needs no GPU). On the GPU a bundle made with no
GPU visible is loaded by a fresh process with an empty Triton cache: every kernel comes from the bundle, none is
compiled, and the outputs equal the JIT's bit for bit.
"""
from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("triton", reason="precompiled kernels are Triton kernels")
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

from rl_triton_torchrl.kernels import _aot, _launcher, precompile  # noqa: E402
from test_launcher import SPECIALIZATIONS, _Compiled, _args, _axpy, _triton_specialization  # noqa: E402

pytestmark = pytest.mark.triton
CUDA = torch.cuda.is_available()
ROOT = Path(__file__).resolve().parent.parent
SETTINGS = (0, None, False, "")


class _Sm90Driver(_aot._TargetDriver):
    """The build's stand-in driver for sm_90, with a stream of its own to recognise in launches."""

    def __init__(self):
        super().__init__(90)

    def get_current_stream(self, device=None):
        return 77


SM90 = GPUTarget("cuda", 90, 32)


@pytest.fixture
def sm90(monkeypatch):
    monkeypatch.setattr(_launcher.driver, "_active", _Sm90Driver())
    monkeypatch.setattr(_aot, "_target", lambda device: SM90)
    monkeypatch.setattr(_aot, "STATS", {"loaded": 0, "missing": 0, "failed": 0})
    monkeypatch.setattr(_aot, "_LOADED", {})


def _key(kernel, args, num_warps=4, maxnreg=None, settings=SETTINGS, target=SM90):
    return _aot.key_of(kernel, target, settings, args, num_warps, maxnreg)


def test_key_is_the_same_for_the_same_structure(sm90):
    kernel = JITFunction(_axpy)
    text, digest = _key(kernel, _args())
    assert (text, digest) == _key(kernel, _args()) == _key(JITFunction(_axpy), _args())
    assert len(digest) == 64 and triton.__version__ in text and kernel.cache_key in text


def test_specialization_is_finer_than_triton():
    """Two argument sets of one key are one specialization to Triton: a cubin compiled for one serves the other."""
    kernel = JITFunction(_axpy)
    variants = {"base": _args(), **{name: _args(**change()) for name, change in SPECIALIZATIONS.items()}}
    ours = {name: _aot.specialization(kernel, args) for name, args in variants.items()}
    triton_s = {name: _triton_specialization(kernel, args) for name, args in variants.items()}
    for a, b in itertools.combinations(variants, 2):
        if ours[a] == ours[b]:
            assert triton_s[a] == triton_s[b], f"{a} and {b} share a key but Triton specializes them apart"
    assert len(set(ours.values())) == len(variants)


@pytest.mark.parametrize("name", SPECIALIZATIONS)
def test_key_distinguishes_every_specialization(sm90, name):
    kernel = JITFunction(_axpy)
    assert _key(kernel, _args())[1] != _key(kernel, _args(**SPECIALIZATIONS[name]()))[1], name


@pytest.mark.parametrize("change", ["num_warps", "maxnreg", "debug", "instrumentation", "arch", "source"])
def test_key_distinguishes_options_settings_target_and_source(sm90, monkeypatch, change):
    kernel, args = JITFunction(_axpy), _args()
    before = _key(kernel, args)[1]
    if change == "num_warps":
        after = _key(kernel, args, num_warps=8)
    elif change == "maxnreg":
        after = _key(kernel, args, maxnreg=64)
    elif change == "debug":
        after = _key(kernel, args, settings=(0, True, False, ""))
    elif change == "instrumentation":
        after = _key(kernel, args, settings=(0, None, False, "consan"))
    elif change == "arch":
        after = _key(kernel, args, target=GPUTarget("cuda", 100, 32))
    else:
        def _axpy2(x_ptr, y_ptr, out_ptr, alpha, n, s_x, BLOCK: triton.language.constexpr,
                   HAS_Y: triton.language.constexpr):
            pass

        _axpy2.__name__ = "_axpy"
        after = _key(JITFunction(_axpy2), args)
    assert after[1] != before


def _bundle(tmp_path, kernel, args, **meta) -> Path:
    """A bundle holding one entry for launching ``kernel`` with ``args`` (a stand-in cubin)."""
    text, digest = _key(kernel, args)
    path = _aot._entry(tmp_path, kernel, 90, digest)
    path.parent.mkdir(parents=True)
    path.with_suffix(".cubin").write_bytes(b"\x7fELF stand-in")
    entry = {"key": text, "name": "axpy_0d1d", "num_warps": 4, "shared": 0,
             "params": [["x_ptr", "Q"], ["y_ptr", "Q"], ["out_ptr", "Q"], ["alpha", "f"], ["n", "i"]], **meta}
    path.write_text(json.dumps(entry))
    return path


@pytest.fixture
def loads(monkeypatch):
    """The cubins the stand-in loader was asked to load: (bytes, name, shared); each gets handle 4321."""
    calls = []

    def load(cubin, name, shared):
        calls.append((cubin, name, shared))
        return 4321

    monkeypatch.setattr(_aot, "_load", load)
    monkeypatch.setattr(_launcher, "_driver_launch", lambda: load)  # a driver launch exists (never called here)
    return calls


def test_find_loads_an_entry_once(sm90, tmp_path, monkeypatch, loads):
    kernel, args = JITFunction(_axpy), _args()
    _bundle(tmp_path, kernel, args)
    monkeypatch.setattr(_aot, "DIRS", (tmp_path / "elsewhere", tmp_path))
    hit = _aot.find(kernel, SETTINGS, args, 4, None)
    assert hit is not None and hit.kernel is None and hit.function == 4321
    assert hit.native == _launcher.NativeLaunch(4321, 128, 0, (("x_ptr", "Q"), ("y_ptr", "Q"), ("out_ptr", "Q"),
                                                                ("alpha", "f"), ("n", "i")))
    assert _aot.find(kernel, SETTINGS, _args(), 4, None) is hit
    assert loads == [(b"\x7fELF stand-in", "axpy_0d1d", 0)] and _aot.STATS == {"loaded": 1, "missing": 0, "failed": 0}


def test_find_misses_another_variant_and_needs_a_bundle(sm90, tmp_path, monkeypatch, loads):
    kernel = JITFunction(_axpy)
    _bundle(tmp_path, kernel, _args())
    assert _aot.find(kernel, SETTINGS, _args(), 4, None) is None  # no bundle: DIRS empty
    monkeypatch.setattr(_aot, "DIRS", (tmp_path,))
    assert _aot.find(kernel, SETTINGS, _args(n=48), 4, None) is None
    assert _aot.find(kernel, SETTINGS, _args(), 8, None) is None
    assert not loads and _aot.STATS == {"loaded": 0, "missing": 2, "failed": 0}


def test_a_bundle_is_not_consulted_without_dirs(sm90, monkeypatch):
    def key_of(*args):
        raise AssertionError("a key was computed with no bundle to look in")

    monkeypatch.setattr(_aot, "key_of", key_of)
    assert _aot.find(JITFunction(_axpy), SETTINGS, _args(), 4, None) is None


@pytest.mark.parametrize("damage", ["key", "cubin", "load", "driver"])
def test_a_damaged_entry_is_compiled_instead_and_said_once(sm90, tmp_path, monkeypatch, loads, damage):
    kernel, args = JITFunction(_axpy), _args()
    path = _bundle(tmp_path, kernel, args)
    monkeypatch.setattr(_aot, "DIRS", (tmp_path,))
    if damage == "key":  # an entry whose key is not the launch's (a collision, an edited file)
        path.write_text(json.dumps({**json.loads(path.read_text()), "key": "another"}))
    elif damage == "cubin":
        path.with_suffix(".cubin").unlink()
    elif damage == "driver":  # no libcuda to launch with
        monkeypatch.setattr(_launcher, "_driver_launch", lambda: None)
    else:
        def fail(*args):
            raise RuntimeError("cuModuleLoadData failed: CUresult 200")

        monkeypatch.setattr(_aot, "_load", fail)
    with pytest.warns(RuntimeWarning, match="could not be loaded from"):
        assert _aot.find(kernel, SETTINGS, args, 4, None) is None
    assert _aot.find(kernel, SETTINGS, args, 4, None) is None  # not tried again, not said again
    assert _aot.STATS["failed"] == 1 and _aot.STATS["loaded"] == 0


def test_the_runner_launches_with_the_runtime_parameters(sm90, tmp_path, monkeypatch, loads):
    """``replay`` of a loaded entry: every runtime parameter, pointers as addresses, through the driver's launch."""
    kernel, args = JITFunction(_axpy), _args()
    _bundle(tmp_path, kernel, args)
    monkeypatch.setattr(_aot, "DIRS", (tmp_path,))
    hit = _aot.find(kernel, SETTINGS, args, 4, None)
    launched = []

    def launch(self, stream, *values):
        launched.append((self.function, self.grid, self.block, stream, values))

    monkeypatch.setattr(_launcher.PreparedLaunch, "launch", launch)
    _launcher.replay(hit, (3,), 0, tuple(args[p.name] for p in kernel.params))
    assert launched == [(4321, (3, 1, 1), 128, 77, (args["x_ptr"].data_ptr(), args["y_ptr"].data_ptr(),
                                                    args["out_ptr"].data_ptr(), 0.5, 40))]


@pytest.fixture
def recorder(monkeypatch, sm90):
    """(launcher of a stand-in kernel, its plain launches, the bundle's entries found): the bundle's lookup stands
    in too, returning a recording compiled kernel for every launch."""
    kernel, plain, found = JITFunction(_axpy), [], []

    def run(*args, grid, warmup, **kwargs):
        plain.append(kwargs)
        return _Compiled()

    kernel.run = run

    def find(kernel, settings, kwargs, num_warps, maxnreg):
        entry = _Compiled()
        found.append(entry)
        return _launcher._Compiled(None, entry.run, entry.function, entry.packed_metadata, None)

    monkeypatch.setattr(_aot, "find", find)
    return _launcher.Launcher(kernel), plain, found


def test_launcher_launches_a_precompiled_kernel_without_compiling(recorder):
    lean, plain, found = recorder
    assert lean((3,), 4, **_args()) is None  # a precompiled kernel: no CompiledKernel to return
    assert lean((3,), 4, **_args()) is None
    assert not plain and len(found) == 1, "the second call looked again, or the first compiled"
    assert len(found[0].launches) == 2 and found[0].launches[0][:4] == (3, 1, 1, 77)


def test_launcher_compiles_where_the_precompiled_launch_fails(recorder, monkeypatch):
    lean, plain, found = recorder

    def fail(*args):
        raise _launcher.LaunchError(700)

    monkeypatch.setattr(_Compiled, "run", fail)
    with pytest.warns(RuntimeWarning, match="could not be launched .*cuLaunchKernel failed"):
        lean((3,), 4, **_args())
    assert len(plain) == 1 and len(found) == 1 and not lean.compiled  # compiled the plain way; nothing kept
    assert _aot.STATS["failed"] == 1


def test_plain_path_never_consults_a_bundle(recorder, monkeypatch):
    lean, plain, found = recorder
    monkeypatch.setattr(_launcher, "LEAN_LAUNCH", False)
    lean((3,), 4, **_args())
    assert len(plain) == 1 and not found


def test_the_lean_path_never_makes_tritons_driver(monkeypatch):
    """Until Triton's driver is made (by a plain launch) or set, the launcher reads the device and stream with the
    torch functions that driver would use: making it compiles Triton's C utilities, which a precompiled kernel's
    launch does not need."""
    monkeypatch.setattr(_launcher.driver, "_active", None)
    assert _launcher.active_driver() is _launcher._TORCH_GETTERS and _launcher.driver._active is None
    set_one = _Sm90Driver()
    monkeypatch.setattr(_launcher.driver, "_active", set_one)
    assert _launcher.active_driver() is set_one


def _no_interpreter_env(**extra) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return {**env, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")])), **extra}


def _precompile(out, *args, env=None):
    proc = subprocess.run([sys.executable, "-m", "rl_triton_torchrl.kernels.precompile", "--out", str(out), *args],
                          env=env or _no_interpreter_env(), capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return proc.stdout


def test_precompile_writes_each_variant_once(tmp_path):
    """The command on a machine without a GPU: a cubin and its metadata per variant, the second run adds none."""
    out = _precompile(tmp_path, "--shapes", "64x24", "--algorithms", "discounted_return,eligibility_traces")
    entries = sorted(tmp_path.rglob("*.json"))
    assert f"{len(entries)} kernel variants written" in out and len(entries) >= 2
    for path in entries:
        meta = json.loads(path.read_text())
        assert meta["key"].startswith(f"({_aot.FORMAT}, '{triton.__version__}', '{path.parent.name}'")
        assert path.with_suffix(".cubin").read_bytes()[:4] == b"\x7fELF"
        assert meta["num_warps"] >= 1 and all(fmt in "Qifb" for _, fmt in meta["params"])
    assert "0 kernel variants written" in _precompile(tmp_path, "--shapes", "64x24", "--algorithms",
                                                       "discounted_return,eligibility_traces")


def test_precompile_forms_are_variants_of_their_own(tmp_path):
    """Each call form ``precompile.FORMS`` lists for GAE, V-trace and retrace_discrete (next values with
    ``terminated``, with ``done`` alone, and the shifted input mode) compiles a kernel variant of its own: none is
    redundant, and a bundle holds the shifted modes' launches."""
    algorithms = ("gae", "vtrace", "retrace_discrete")
    _precompile(tmp_path, "--shapes", "64x24", "--layouts", "batch", "--coefficients", "float", "--algorithms",
                ",".join(algorithms))
    assert len(list(tmp_path.rglob("*.json"))) == sum(len(precompile.FORMS[a]) for a in algorithms)


_MODULES_CHILD = r"""
import sys, torch
from tensordict import TensorDict
from rl_triton_torchrl import GAE, TD1Estimator, TDLambdaEstimator
from rl_triton_torchrl.kernels import _aot
B, T = 64, 24
g = torch.Generator().manual_seed(0)
term = torch.rand(B, T, 1, generator=g) < 0.05
rollout = {"state_value": torch.rand(B, T, 1, generator=g),
           "next": {"reward": torch.rand(B, T, 1, generator=g), "state_value": torch.rand(B, T, 1, generator=g),
                    "terminated": term, "done": term | (torch.rand(B, T, 1, generator=g) < 0.05)}}
with _aot.build(sys.argv[1]):  # each estimator as a PPO script builds and calls it
    for module in (GAE(gamma=0.99, lmbda=0.95, value_network=None, average_gae=True),
                   GAE(gamma=0.99, lmbda=0.95, value_network=None),
                   TDLambdaEstimator(gamma=0.99, lmbda=0.95, value_network=None),
                   TD1Estimator(gamma=0.99, value_network=None)):
        module(TensorDict(rollout, [B, T]))
"""


def test_precompile_covers_torchrl_estimator_modules(tmp_path):
    """What TorchRL's estimator modules launch (gamma and lmbda as their tensors, ``[B, T, 1]`` rollouts) is in a
    bundle of the torchrl layout: a PPO script's first estimator call loads rather than compiles."""
    env = _no_interpreter_env(RL_TRITON_TORCHRL_BACKEND="triton")
    proc = subprocess.run([sys.executable, "-c", _MODULES_CHILD, str(tmp_path / "modules")], env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    launched = {p.relative_to(tmp_path / "modules") for p in (tmp_path / "modules").rglob("*.json")}
    assert len(launched) >= 2
    _precompile(tmp_path / "bundle", "--shapes", "64x24", "--layouts", "torchrl",
                "--algorithms", "gae,td_lambda,discounted_return")
    bundle = {p.relative_to(tmp_path / "bundle") for p in (tmp_path / "bundle").rglob("*.json")}
    assert launched <= bundle, f"launched by the modules, not in the bundle: {sorted(map(str, launched - bundle))}"
    _precompile(tmp_path / "floats", "--shapes", "64x24", "--layouts", "torchrl", "--coefficients", "float",
                "--algorithms", "gae,td_lambda,discounted_return")
    floats = {p.relative_to(tmp_path / "floats") for p in (tmp_path / "floats").rglob("*.json")}
    assert not launched <= floats, "tensor coefficients are no variant of their own: --coefficients is moot"


@pytest.mark.parametrize("argv, message", [
    (["--shapes", "64by24"], "a shape is BxT"),
    (["--shapes", "0x24"], "at least 1"),
    (["--algorithms", "gae,ppo"], "unknown algorithm ['ppo']"),
    (["--dtypes", "float8"], "unknown dtype ['float8']"),
    (["--layouts", "rows"], "unknown layout ['rows']"),
    (["--coefficients", "int"], "unknown coefficient kind ['int']"),
])
def test_precompile_names_a_bad_argument(tmp_path, capsys, argv, message):
    from rl_triton_torchrl.kernels import precompile

    with pytest.raises(SystemExit) as e:
        precompile.main(["--out", str(tmp_path), *argv])
    assert e.value.code == 2 and message in capsys.readouterr().err


def _build_state():
    return (_launcher.Launcher.__call__, _launcher.Launcher.settings, os.environ.get("TRITON_INTERPRET"),
            _launcher.driver._active)


def test_readme_precompile_command_parses():
    from rl_triton_torchrl.kernels import precompile

    readme = (ROOT / "README.md").read_text()
    lines = [ln for ln in readme.splitlines() if ln.startswith("python -m rl_triton_torchrl.kernels.precompile")]
    assert lines, "the README no longer shows the precompile command"
    for line in lines:
        args = precompile.parse_args(line.split("#")[0].split()[3:])
        assert args.out and args.shapes and args.layouts


@pytest.mark.skipif(CUDA, reason="the interpreter's case: on a GPU the kernels are compiled ones")
def test_build_needs_compiled_kernels(tmp_path):
    """Under the interpreter (this process) the kernels cannot be precompiled: said by name, nothing written."""
    from rl_triton_torchrl import kernels as K

    before = _build_state()
    with pytest.raises(RuntimeError, match="cannot precompile _prefix_sum_fwd_kernel"):
        with _aot.build(tmp_path):
            K.eligibility_traces(torch.rand(4, 8), torch.zeros(4, 8, dtype=torch.bool), gamma=0.9, lmbda=0.9,
                                 time_dim=-1, backend="triton")
    assert _build_state() == before and not list(tmp_path.rglob("*.cubin"))


def test_build_restores_the_launcher_driver_and_environment(tmp_path):
    before = _build_state()
    with pytest.raises(KeyError):
        with _aot.build(tmp_path):
            assert _launcher.Launcher.settings(None) is None and os.environ["TRITON_INTERPRET"] == "1"
            raise KeyError("an error inside the block")
    assert _build_state() == before


# ---------------------------------------------------------------------------------------------------------------
# On the GPU: a bundle made with no GPU visible, loaded by a fresh process with an empty Triton cache
# ---------------------------------------------------------------------------------------------------------------

_CHILD = r"""
import itertools, json, sys, torch
from rl_triton_torchrl.kernels import _aot, precompile, scan
scan.POISON_OUTPUTS = True
outs = {}
for shape in sys.argv[2].split(","):
    B, T = map(int, shape.split("x"))
    for layout, time_dims in precompile.LAYOUTS.items():
        x = precompile._rollout(B, T, torch.float32, precompile.ACTIONS)
        x = {k: v.cuda() for k, v in precompile._laid_out(x, layout).items()}
        for (coefs, c), (algo, forms) in itertools.product(precompile.COEFFICIENTS.items(),
                                                           precompile.FORMS.items()):
            time_dim = time_dims[algo in precompile.PER_ACTION]
            if time_dim is None:
                continue
            for form, call in forms.items():
                y = call({**x, **c("cuda")}, {"time_dim": time_dim, "backend": "triton"})
                outs[f"{shape}/{layout}/{coefs}/{algo}/{form}"] = [
                    t.cpu() for t in (y if isinstance(y, tuple) else (y,)) if isinstance(t, torch.Tensor)]
torch.save(outs, sys.argv[1])
from triton.runtime.driver import driver
print("STATS " + json.dumps(dict(_aot.STATS, driver_made=driver._active is not None)))
"""


@pytest.mark.skipif(not CUDA, reason="loads cubins on a GPU")
def test_precompiled_kernels_on_gpu_equal_the_jit(tmp_path):
    shapes = "64x24,300x130"
    bundle = tmp_path / "bundle"
    # made with no GPU visible: Triton's compiler and a stand-in driver naming the GPU's architecture
    major, minor = torch.cuda.get_device_capability()
    _precompile(bundle, "--shapes", shapes, "--layouts", "batch,time,torchrl", "--arch", str(10 * major + minor),
                env=_no_interpreter_env(CUDA_VISIBLE_DEVICES=""))
    n_entries = len(list(bundle.rglob("*.json")))
    results = {}
    for name, extra in (("aot", {"RL_TRITON_TORCHRL_AOT_DIR": str(bundle)}), ("jit", {})):
        cache = tmp_path / f"triton_cache_{name}"
        env = _no_interpreter_env(TRITON_CACHE_DIR=str(cache), **extra)
        proc = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / f"{name}.pt"), shapes], env=env,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        stats = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("STATS "))[6:])
        compiled = {p.name for p in cache.rglob("*.json") if p.name.startswith("_")}
        results[name] = torch.load(tmp_path / f"{name}.pt"), stats, compiled
    (aot, stats, compiled), (jit, jit_stats, jit_compiled) = results["aot"], results["jit"]
    assert stats == {"loaded": n_entries, "missing": 0, "failed": 0, "driver_made": False}, stats
    assert jit_stats["driver_made"]
    assert not compiled, f"the process with the bundle compiled {sorted(compiled)}"
    assert jit_compiled, "the JIT process compiled nothing: is the cache where this test looks?"
    assert aot.keys() == jit.keys()
    for k in jit:
        assert len(aot[k]) == len(jit[k]), k
        for a, j in zip(aot[k], jit[k]):
            assert not a.isnan().any(), f"{k}: an output the precompiled kernel left unwritten (NaN)"
            assert torch.equal(a, j), f"{k}: the precompiled kernel's output differs from the JIT's"
