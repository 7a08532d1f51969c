"""The training examples run end to end with both estimators (a couple of tiny iterations each) and write their
CSV log and plot; on the same batches the two estimator classes agree."""
from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytest.importorskip("gymnasium")
pytest.importorskip("matplotlib")
pytest.importorskip("tqdm")

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def load(name):
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def read_rows(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def check_outputs(out, iterations, columns):
    rows = read_rows(out / "progress.csv")
    assert len(rows) == iterations, f"progress.csv has {len(rows)} rows, expected {iterations}"
    missing = set(columns) - set(rows[0])
    assert not missing, f"progress.csv lacks columns {sorted(missing)}"
    assert [int(r["frames"]) for r in rows] == sorted(int(r["frames"]) for r in rows)
    assert all(float(r["estimator_time_s"]) > 0 for r in rows)
    png = (out / "curves.png").read_bytes()
    assert png.startswith(PNG_MAGIC), "curves.png is not a PNG"
    return rows


def assert_estimators_agree(rows, tol=1e-4):
    for r in rows:
        for key in ("adv_max_abs_diff", "target_max_abs_diff"):
            assert float(r[key]) <= tol, f"iteration {r['iteration']}: {key} = {r[key]} > {tol}"


TINY_PPO = ["--num-envs", "2", "--rollout-len", "16", "--total-frames", "64", "--epochs", "2",
            "--minibatch-size", "16", "--no-progress", "--cross-check"]


@pytest.mark.parametrize("estimator", ["torchrl", "triton"])
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_ppo_gymnasium(tmp_path, env_id, estimator):
    rows = load("ppo_gymnasium").main(["--env-id", env_id, "--estimator", estimator, "--out", str(tmp_path),
                                       *TINY_PPO])
    assert len(rows) == 2
    rows = check_outputs(tmp_path, 2, ["frames", "wall_time_s", "return_mean", "loss_objective", "loss_critic",
                                       "loss_entropy", "collection_time_s", "estimator_time_s", "update_time_s",
                                       "iteration_time_s"])
    assert_estimators_agree(rows)


def test_ppo_vectorization_default_and_error(tmp_path):
    ppo = load("ppo_gymnasium")
    assert ppo.parse_args(["--env-id", "CartPole-v1"]).vectorization == "vector_entry_point"
    assert ppo.parse_args(["--env-id", "Pendulum-v1"]).vectorization == "sync"
    with pytest.raises(ValueError, match="Pendulum-v1 has no vector entry point"):
        ppo.main(["--env-id", "Pendulum-v1", "--vectorization", "vector_entry_point", "--out", str(tmp_path),
                  *TINY_PPO])


def test_vector_entry_point_episodes():
    """Gymnasium's numpy CartPole with DISABLED autoreset, through TorchRL's GymWrapper: every transition is a real
    step (reward 1), the episode return counts the steps since the last reset, a finished environment restarts from
    a fresh initial state while the others carry on, and truncation comes exactly at max_episode_steps."""
    ppo = load("ppo_gymnasium")
    env = ppo.make_env("CartPole-v1", 6, "vector_entry_point", torch.device("cpu"), max_episode_steps=20)
    assert isinstance(env.base_env._env.unwrapped, ppo.CartPoleVectorEnvDisabledAutoreset)
    env.set_seed(0)
    torch.manual_seed(0)
    data = env.rollout(150, break_when_any_done=False)  # random actions; TorchRL resets finished environments
    nxt = data["next"]
    assert (nxt["reward"] == 1).all(), "a transition with reward != 1: an autoreset step was recorded"
    done, terminated, truncated = (nxt[k].squeeze(-1) for k in ("done", "terminated", "truncated"))
    assert terminated.any() and truncated.any() and not (done ^ (terminated | truncated)).any()
    for b in range(6):
        length = 0
        for t in range(150):
            length += 1
            where = f"env {b}, step {t}"
            assert nxt["episode_reward"][b, t].item() == length, where
            assert bool(truncated[b, t]) == (length == 20), where
            if t + 1 == 150:
                break
            if done[b, t]:
                assert terminated[b, t] or length == 20, where
                assert (data["observation"][b, t + 1].abs() <= 0.05).all(), f"{where}: not a fresh initial state"
                length = 0
            else:
                assert torch.equal(data["observation"][b, t + 1], nxt["observation"][b, t]), f"{where}: jumped"


@pytest.mark.parametrize("estimator", ["torchrl", "triton"])
def test_impala_vtrace(tmp_path, estimator):
    load("impala_vtrace").main(["--estimator", estimator, "--out", str(tmp_path), "--num-envs", "4",
                                "--rollout-len", "8", "--total-frames", "96", "--policy-lag", "2", "--log-every", "1",
                                "--no-progress", "--cross-check"])
    rows = check_outputs(tmp_path, 3, ["frames", "wall_time_s", "return_mean", "loss_objective", "loss_critic",
                                       "loss_entropy", "rho_mean", "estimator_time_s", "iteration_time_s"])
    assert_estimators_agree(rows)
    # the behaviour policy lags: batch 0 is on-policy, batch 1 was collected before the learner's first update
    # was copied to the actors (policy lag 2), so its importance ratios are not all 1
    assert float(rows[0]["abs_log_rho_mean"]) < 1e-6
    assert float(rows[1]["abs_log_rho_mean"]) > 0


def test_impala_rejects_continuous_actions(tmp_path):
    with pytest.raises(SystemExit, match="continuous"):
        load("impala_vtrace").main(["--env-id", "Pendulum-v1", "--out", str(tmp_path), "--total-frames", "8",
                                    "--num-envs", "2", "--rollout-len", "4", "--no-progress"])


def test_compare_curves(tmp_path):
    load("compare_curves").main(["--example", "ppo", "--seeds", "1", "--out", str(tmp_path), *TINY_PPO[:-2]])
    for estimator in ("torchrl", "triton"):
        check_outputs(tmp_path / f"{estimator}_seed0", 2, ["adv_max_abs_diff", "target_max_abs_diff"])
    curves = read_rows(tmp_path / "curves.csv")
    assert {r["estimator"] for r in curves} == {"torchrl", "triton"}
    runs = read_rows(tmp_path / "runs.csv")
    assert len(runs) == 2 and all(float(r["adv_max_abs_diff"]) <= 1e-4 for r in runs)
    assert (tmp_path / "curves.png").read_bytes().startswith(PNG_MAGIC)
    assert "final return" in (tmp_path / "summary.md").read_text()
    assert all(float(r["process_s"]) > 0 and r["triton_compiled"] == "" for r in runs)


def test_compare_curves_alternates_order(tmp_path, monkeypatch):
    """The runs go seed by seed, which estimator runs first alternating from seed to seed."""
    module = load("compare_curves")
    order = []

    def fake_run(cmd, **kwargs):
        out = Path(cmd[cmd.index("--out") + 1])
        out.mkdir(parents=True)
        (out / "progress.csv").write_text("frames\n")
        order.append((cmd[cmd.index("--seed") + 1], cmd[cmd.index("--estimator") + 1]))
        return subprocess.CompletedProcess(cmd, 0, stdout="done\n", stderr=None)

    monkeypatch.setattr(module.subprocess, "run", fake_run)
    args = module.parse_args(["--example", "ppo", "--seeds", "3", "--out", str(tmp_path)])[0]
    module.run_all(args, [])
    assert order == [("0", "torchrl"), ("0", "triton"), ("1", "triton"), ("1", "torchrl"), ("2", "torchrl"),
                     ("2", "triton")]


def test_compare_curves_fresh_triton_cache(tmp_path):
    """Each run gets an empty Triton cache of its own and the bundle's folder, without the cross-check; the
    summary counts what Triton compiled there (nothing on the CPU path) and says how the runs were made."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    load("compare_curves").main(["--example", "ppo", "--seeds", "1", "--out", str(tmp_path / "cmp"),
                                 "--fresh-triton-cache", "--aot-dir", str(bundle), "--target-return", "1",
                                 "--no-cross-check", *TINY_PPO[:-2]])
    runs = read_rows(tmp_path / "cmp" / "runs.csv")
    assert [r["triton_compiled"] for r in runs] == ["0", "0"] and "adv_max_abs_diff" not in runs[0]
    assert all((tmp_path / "cmp" / f"{r['estimator']}_seed0" / "triton_cache").is_dir() for r in runs)
    assert all(r["seconds_to_target"] == "" or float(r["seconds_to_target"]) >= 0 for r in runs)
    summary = (tmp_path / "cmp" / "summary.md").read_text()
    assert "--fresh-triton-cache" in summary and f"RL_TRITON_TORCHRL_AOT_DIR={bundle}" in summary


# ---- PPO with the environments on the device: rsl_rl's runner and TorchRL (examples/gpu_envs) ----

TINY_GPU_PPO = ["--device", "cpu", "--num-envs", "8", "--rollout-len", "8", "--total-frames", "128", "--epochs", "2",
                "--minibatch-size", "16", "--no-progress"]


@pytest.mark.parametrize("extra", [[], ["--recompute-advantage", "--env", "Pendulum"]], ids=["CartPole", "Pendulum"])
@pytest.mark.parametrize("estimator", ["torchrl", "triton"])
def test_ppo_gpu(tmp_path, estimator, extra):
    rows = load("ppo_gpu").main(["--estimator", estimator, "--out", str(tmp_path), "--cross-check", *TINY_GPU_PPO,
                                 *extra])
    assert len(rows) == 2
    rows = check_outputs(tmp_path, 2, ["frames", "fps", "wall_time_s", "return_mean", "loss_objective", "loss_critic",
                                       "collection_time_s", "estimator_time_s", "update_time_s", "iteration_time_s"])
    assert_estimators_agree(rows)


def test_ppo_gpu_rejects_cudagraphs_on_cpu(tmp_path):
    with pytest.raises(SystemExit, match="needs a CUDA device"):
        load("ppo_gpu").main(["--update", "cudagraphs", "--out", str(tmp_path), *TINY_GPU_PPO])


@pytest.mark.parametrize("extra", [[], ["--exact-timeouts", "--env", "Pendulum", "--max-episode-steps", "5"],
                                   ["--recurrent", "--per-minibatch-normalization"]],
                         ids=["default", "exact-timeouts", "recurrent"])
@pytest.mark.parametrize("algorithm", ["rsl_rl", "triton"])
def test_rsl_rl_ppo(tmp_path, algorithm, extra):
    pytest.importorskip("rsl_rl")
    if algorithm == "rsl_rl" and "--exact-timeouts" in extra:
        with pytest.raises(SystemExit, match="options of our PPO"):
            load("rsl_rl_ppo").parse_args(["--algorithm", algorithm, *extra])
        return
    load("rsl_rl_ppo").main(["--algorithm", algorithm, "--device", "cpu", "--num-envs", "8", "--steps", "6",
                             "--iterations", "3", "--out", str(tmp_path), "--no-progress", "--cross-check",
                             *extra])
    rows = read_rows(tmp_path / "progress.csv")
    assert [int(r["frames"]) for r in rows] == [48, 96, 144]
    assert_estimators_agree(rows)  # the other PPO class's compute_returns on the same storage
    assert all(float(r["compute_returns_time_s"]) > 0 and float(r["fps"]) > 0 for r in rows)
    assert all(r["loss_value"] != "" for r in rows)
    assert (tmp_path / "curves.png").read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize("example, args", [
    ("rsl_rl", ["--device", "cpu", "--num-envs", "8", "--steps", "6", "--iterations", "3"]),
    ("ppo_gpu", TINY_GPU_PPO[:-1] + ["--recompute-advantage"]),
], ids=["rsl_rl", "ppo_gpu"])
def test_compare_curves_gpu_examples(tmp_path, example, args):
    """compare_curves runs the examples with the environments on the device: both classes, one seed."""
    if example == "rsl_rl":
        pytest.importorskip("rsl_rl")
    load("compare_curves").main(["--example", example, "--seeds", "1", "--out", str(tmp_path), *args])
    estimators = ("rsl_rl", "triton") if example == "rsl_rl" else ("torchrl", "triton")
    runs = read_rows(tmp_path / "runs.csv")
    assert sorted(r["estimator"] for r in runs) == sorted(estimators)
    assert all(float(r["fps"]) > 0 and float(r["estimator_ms_per_call"]) > 0 for r in runs)
    assert all(float(r["adv_max_abs_diff"]) <= 1e-4 for r in runs)
    summary = (tmp_path / "summary.md").read_text()
    assert f"Same seed, {estimators[0]} run vs triton run" in summary and "frames/s" in summary
    assert (tmp_path / "curves.png").read_bytes().startswith(PNG_MAGIC)


SCRIPTS = ("ppo_gymnasium", "ppo_ddp", "impala_vtrace", "compare_curves", "sb3_ppo", "gae_quickstart", "ppo_gpu",
           "rsl_rl_ppo")


def test_help_does_not_import_torch():
    """Every example parses its arguments before its heavy imports: ``--help`` prints the flags and exits without
    importing torch, TorchRL, Gymnasium or SB3 (one interpreter runs each script's ``--help`` in turn)."""
    code = textwrap.dedent(f"""
        import contextlib, io, json, runpy, sys
        out = {{}}
        for name in {SCRIPTS!r}:
            path = {str(EXAMPLES)!r} + "/" + name + ".py"
            sys.argv = [path, "--help"]
            text = io.StringIO()
            try:
                with contextlib.redirect_stdout(text):
                    runpy.run_path(path, run_name="__main__")
                code = None
            except SystemExit as exit:
                code = exit.code
            heavy = sorted(m for m in ("torch", "torchrl", "tensordict", "gymnasium", "stable_baselines3")
                           if m in sys.modules)
            out[name] = [code, text.getvalue(), heavy]
        print(json.dumps(out))
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    for name in SCRIPTS:
        code, text, heavy = out[name]
        assert code == 0 and text.startswith("usage:"), f"{name} --help: exit {code}, printed {text[:300]!r}"
        assert heavy == [], f"{name} --help imported {heavy}"
