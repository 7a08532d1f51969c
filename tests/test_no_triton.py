"""Without Triton (macOS, Windows, CPU-only environments) the package imports and its torch path works.

Each test runs a fresh interpreter in which ``import triton`` fails (``tests/_no_triton.py``: a ``sys.meta_path``
finder), so they run in every environment; CI also runs the CPU tests where Triton is really not installed
(``.ci/run``). Checked there: the package, its estimators, modules, functionals, ``patch_torchrl()`` and the SB3
buffers import with no ``triton`` module loaded; every algorithm's torch path against the float64 references;
``GAE`` against TorchRL's; SB3's buffer against ours; ``backend="triton"`` raises an ``InputError`` that says how to
install Triton, ``"auto"`` takes the torch path on CUDA tensors too and warns once; a kernel launched anyway raises;
and the test suite's own Triton tests skip rather than fail.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent
RUNNER = TESTS / "_no_triton.py"


def run_without_triton(code: str, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    """``python tests/_no_triton.py -c code`` (or ``-m`` for args), the tests folder and the checkout importable."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("RL_TRITON_TORCHRL_BACKEND", None)
    # the platforms without Triton that this checks are CPU-only (macOS, Windows CPU, CPU images); CUDA without
    # Triton (a Windows CUDA build) is not tested here
    env["CUDA_VISIBLE_DEVICES"] = ""
    argv = [sys.executable, str(RUNNER), *(args or ("-c", textwrap.dedent(code)))]
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def last_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, f"exit {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_package_works_without_triton():
    pytest.importorskip("stable_baselines3")
    out = last_json(run_without_triton("""
        import json, os, sys, warnings

        import numpy as np
        import torch
        from tensordict import TensorDict

        import rl_triton_torchrl as rtt
        import rl_triton_torchrl.sb3
        from rl_triton_torchrl import functional as F
        from rl_triton_torchrl import kernels as K
        from rl_triton_torchrl.kernels import _triton, _utils, scan
        from _algos import TABLE, as_tuple, make_rollout
        from _helpers import assert_close

        result = {"has_triton": _triton.HAS_TRITON, "error": _triton.TRITON_IMPORT_ERROR}

        # every algorithm's torch path (the default on CPU tensors) against its float64 reference
        for name, (call, ref, coefs) in TABLE.items():
            x = make_rollout((3, 17, 2), -2, "random", seed=1)
            out = as_tuple(call(x, **coefs))
            expected = as_tuple(ref(x, **coefs)[0])
            for i, (o, e) in enumerate(zip(out, expected)):
                assert_close(f"{name}[{i}]", o, e, torch.float32)
        result["algorithms"] = len(TABLE)

        # the estimator class against TorchRL's, on one rollout; and through patch_torchrl()
        from torchrl.objectives import ValueEstimators
        from torchrl.objectives.value import GAE as TorchRLGAE
        B, T = 4, 33
        g = torch.Generator().manual_seed(0)
        td = TensorDict({
            "state_value": torch.randn(B, T, 1, generator=g),
            "next": {"state_value": torch.randn(B, T, 1, generator=g), "reward": torch.randn(B, T, 1, generator=g),
                     "done": torch.rand(B, T, 1, generator=g) < 0.1,
                     "terminated": torch.rand(B, T, 1, generator=g) < 0.05},
        }, batch_size=[B, T])
        td["next", "done"] |= td["next", "terminated"]
        ours = rtt.GAE(gamma=0.99, lmbda=0.95, value_network=None)(td.clone())
        theirs = TorchRLGAE(gamma=0.99, lmbda=0.95, value_network=None)(td.clone())
        for key in ("advantage", "value_target"):
            assert_close(key, ours[key], theirs[key])
        rtt.patch_torchrl()
        import torchrl.objectives.value as V
        result["patched"] = V.GAE is rtt.GAE
        rtt.unpatch_torchrl()
        result["unpatched"] = V.GAE is TorchRLGAE
        F.generalized_advantage_estimate(0.99, 0.95, td["state_value"], td["next", "state_value"],
                                         td["next", "reward"], td["next", "done"], td["next", "terminated"])

        # Stable-Baselines3's buffer and ours
        from gymnasium import spaces
        from stable_baselines3.common.buffers import RolloutBuffer
        rng = np.random.default_rng(0)
        bufs = [cls(16, spaces.Box(-1, 1, (2,)), spaces.Discrete(2), n_envs=3, gamma=0.99, gae_lambda=0.95)
                for cls in (RolloutBuffer, rl_triton_torchrl.sb3.RolloutBuffer)]
        steps = [(rng.standard_normal((3, 2)).astype(np.float32), rng.integers(0, 2, 3),
                  rng.standard_normal(3).astype(np.float32), rng.random(3) < 0.2,
                  torch.from_numpy(rng.standard_normal((3, 1)).astype(np.float32)), torch.zeros(3)) for _ in range(16)]
        for buf in bufs:
            for step in steps:
                buf.add(*step)
            buf.compute_returns_and_advantage(last_values=torch.ones(3, 1), dones=np.array([True, False, False]))
        for key in ("advantages", "returns"):
            assert_close(key, torch.from_numpy(getattr(bufs[1], key)), torch.from_numpy(getattr(bufs[0], key)))

        # backend="triton" (argument or environment variable) raises; "auto" takes the torch path, CUDA included
        x = torch.randn(2, 5, 1)
        d = torch.zeros(2, 5, 1, dtype=torch.bool)
        try:
            K.gae(x, x, x, d, gamma=0.9, lmbda=0.9, backend="triton")
        except K.InputError as err:
            result["triton_error"] = str(err)
        os.environ["RL_TRITON_TORCHRL_BACKEND"] = "triton"
        try:
            K.gae(x, x, x, d, gamma=0.9, lmbda=0.9)
        except K.InputError as err:
            result["env_error"] = str(err)
        del os.environ["RL_TRITON_TORCHRL_BACKEND"]
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result["auto_cpu"] = _utils.resolve_backend("auto", torch.device("cpu"))
            result["auto_cuda"] = [_utils.resolve_backend("auto", torch.device("cuda")) for _ in range(3)]
        result["warnings"] = [str(w.message) for w in caught]
        try:
            scan._linear_scan_fwd_kernel[(1,)](x)
        except _triton.TritonNotInstalledError as err:
            result["launch_error"] = str(err)

        result["triton_modules"] = sorted(m for m in sys.modules if m == "triton" or m.startswith("triton."))
        print(json.dumps(result))
    """))
    assert out["has_triton"] is False and "No module named 'triton'" in out["error"], out
    assert out["triton_modules"] == [], out["triton_modules"]
    assert out["algorithms"] >= 10, out
    assert out["patched"] and out["unpatched"], out
    assert out["triton_error"].startswith("backend='triton' needs Triton: Triton is not installed"), out
    assert "pip install triton" in out["triton_error"] and "backend='torch'" in out["triton_error"], out
    assert out["env_error"] == out["triton_error"], out
    assert out["auto_cpu"] == "torch" and out["auto_cuda"] == ["torch"] * 3, out
    assert len(out["warnings"]) == 1 and "CUDA tensors take the torch path" in out["warnings"][0], out["warnings"]
    assert "_linear_scan_fwd_kernel" in out["launch_error"] and "not installed" in out["launch_error"], out


def test_triton_tests_skip_without_triton():
    """The test files that need Triton skip, module-level imports of it included, and so do the Triton-parametrized
    tests of a file whose torch-path tests run."""
    files = ("test_launcher.py", "test_launch_plan.py", "test_compile_sm90.py", "test_launch_modes.py")
    proc = run_without_triton("", "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rs", "tests/test_scan.py",
                              *(f"tests/{name}" for name in files), timeout=600)
    out = proc.stdout
    assert proc.returncode == 0, f"exit {proc.returncode}\n{out[-3000:]}\n{proc.stderr[-3000:]}"
    summary = out.strip().splitlines()[-1]
    assert " passed" in summary and " skipped" in summary and "failed" not in summary and "error" not in summary, \
        summary
    skipped = [line for line in out.splitlines() if line.startswith("SKIPPED")]
    for name in files:
        assert any(f"tests/{name}" in line for line in skipped), f"{name} not skipped:\n" + "\n".join(skipped)
    assert any("test_scan.py" in line and "needs Triton: Triton is not installed" in line for line in skipped), \
        "\n".join(skipped)
