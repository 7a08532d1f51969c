"""rl_triton_torchrl.rsl_rl.PPO against rsl_rl's own PPO (rsl-rl-lib 5.x).

Every comparison runs rsl_rl's own method (``rsl_rl.algorithms.PPO.compute_returns`` / ``process_env_step``) on a
deep copy of the same algorithm, storage and critic, never ours against ours. Both of our paths run: the torch path
and the Triton kernel (through the interpreter without a GPU), chosen with ``RL_TRITON_TORCHRL_BACKEND``.
"""
from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytest.importorskip("rsl_rl")
from rsl_rl.algorithms import PPO as RslRlPPO  # noqa: E402
from rsl_rl.models import MLPModel, RNNModel  # noqa: E402
from rsl_rl.runners import OnPolicyRunner  # noqa: E402
from rsl_rl.storage import RolloutStorage  # noqa: E402
from rsl_rl.utils import resolve_callable  # noqa: E402
from tensordict import TensorDict  # noqa: E402

from _helpers import BACKENDS, DEVICE, assert_close  # noqa: E402
from rl_triton_torchrl.rsl_rl import FINAL_OBSERVATIONS, PPO  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
from gpu_envs import CartPole, Pendulum  # noqa: E402
from gpu_envs.rsl_rl_env import RslRlVecEnv  # noqa: E402

OBS_GROUPS = {"actor": ["policy"], "critic": ["policy"]}
GAMMA, LAM = 0.97, 0.9
OBS_DIM = 3


@pytest.fixture(params=BACKENDS)
def backend(request, monkeypatch):
    """Our path: "torch", or "triton" (the kernel; through the interpreter on CPU)."""
    monkeypatch.setenv("RL_TRITON_TORCHRL_BACKEND", request.param)
    return request.param


def make_algorithm(num_envs, steps, *, critic="mlp", per_minibatch=False, seed=0, device=DEVICE, **kwargs):
    """Our PPO with a small actor, a critic (``"mlp"``, ``"lstm"`` or ``"gru"``) and its storage; and an observation."""
    torch.manual_seed(seed)
    obs = TensorDict({"policy": torch.randn(num_envs, OBS_DIM, device=device)}, batch_size=[num_envs], device=device)
    actor = MLPModel(obs, OBS_GROUPS, "actor", 1, hidden_dims=[8],
                     distribution_cfg={"class_name": "GaussianDistribution"})
    if critic == "mlp":
        value = MLPModel(obs, OBS_GROUPS, "critic", 1, hidden_dims=[8])
    else:
        value = RNNModel(obs, OBS_GROUPS, "critic", 1, hidden_dims=[8], rnn_type=critic, rnn_hidden_dim=6)
    storage = RolloutStorage("rl", num_envs, steps, obs, [1], device=str(device))
    alg = PPO(actor, value, storage, gamma=GAMMA, lam=LAM, normalize_advantage_per_mini_batch=per_minibatch,
              device=str(device), **kwargs)
    return alg, obs


def fill(storage, pattern, seed=1):
    """Random rewards and values; dones none, all, or ~15% (as rsl_rl stores them: uint8 0/1)."""
    g = torch.Generator().manual_seed(seed)
    T, N = storage.num_transitions_per_env, storage.num_envs
    storage.rewards.copy_(torch.randn(T, N, 1, generator=g))
    storage.values.copy_(torch.randn(T, N, 1, generator=g))
    dones = {"none": torch.zeros(T, N, 1), "all": torch.ones(T, N, 1),
             "random": (torch.rand(T, N, 1, generator=g) < 0.15).float()}[pattern]
    storage.dones.copy_(dones)
    storage.step = T


def hidden(model):
    state = model.get_hidden_state()
    if state is None:
        return None
    return tuple(s.clone() for s in state) if isinstance(state, tuple) else (state.clone(),)


def assert_same_hidden(name, actual, expected):
    assert (actual is None) == (expected is None), f"{name}: {actual} vs {expected}"
    for i, (a, e) in enumerate(zip(actual or (), expected or ())):
        assert torch.equal(a, e), f"{name}[{i}] differs"


CASES = [(T, pattern, per_mb) for T in (1, 3, 24) for pattern in ("none", "all", "random")
         for per_mb in (False, True)]


@pytest.mark.parametrize("steps,pattern,per_minibatch", CASES,
                         ids=[f"T{T}-{p}-{'per_minibatch' if m else 'global'}" for T, p, m in CASES])
def test_compute_returns_matches_rsl_rl(backend, steps, pattern, per_minibatch):
    alg, obs = make_algorithm(37, steps, per_minibatch=per_minibatch)
    fill(alg.storage, pattern)
    inputs = {k: getattr(alg.storage, k).clone() for k in ("rewards", "values", "dones")}
    ref = copy.deepcopy(alg)
    RslRlPPO.compute_returns(ref, obs)
    alg.compute_returns(obs)
    assert_close("returns", alg.storage.returns, ref.storage.returns)
    assert_close("advantages", alg.storage.advantages, ref.storage.advantages)
    for k, v in inputs.items():
        assert torch.equal(getattr(alg.storage, k), v), f"storage.{k} was modified"


@pytest.mark.parametrize("critic", ["lstm", "gru"])
@pytest.mark.parametrize("per_minibatch", [False, True], ids=["global", "per_minibatch"])
def test_recurrent_critic(backend, critic, per_minibatch):
    """The last value comes from the critic's running hidden state, which the call leaves as it found it."""
    alg, obs = make_algorithm(11, 5, critic=critic, per_minibatch=per_minibatch)
    fill(alg.storage, "random")
    with torch.inference_mode():  # as OnPolicyRunner calls it: a few rollout steps give the critic a state
        for _ in range(3):
            alg.critic(TensorDict({"policy": torch.randn(11, OBS_DIM, device=DEVICE)}, batch_size=[11], device=DEVICE))
    before = hidden(alg.critic)
    assert before is not None
    ref = copy.deepcopy(alg)
    with torch.inference_mode():
        RslRlPPO.compute_returns(ref, obs)
        alg.compute_returns(obs)
    assert_close("returns", alg.storage.returns, ref.storage.returns)
    assert_close("advantages", alg.storage.advantages, ref.storage.advantages)
    assert_same_hidden("critic hidden state", hidden(alg.critic), before)
    assert_same_hidden("critic hidden state (rsl_rl)", hidden(ref.critic), before)


def step_inputs(num_envs, seed=2):
    g = torch.Generator().manual_seed(seed)
    obs = TensorDict({"policy": torch.randn(num_envs, OBS_DIM, generator=g)}, batch_size=[num_envs])
    final = TensorDict({"policy": torch.randn(num_envs, OBS_DIM, generator=g)}, batch_size=[num_envs])
    rewards = torch.randn(num_envs, generator=g)
    time_outs = torch.rand(num_envs, generator=g) < 0.5
    dones = (time_outs | (torch.rand(num_envs, generator=g) < 0.3)).long()
    return obs.to(DEVICE), final.to(DEVICE), rewards.to(DEVICE), dones.to(DEVICE), time_outs.to(DEVICE)


@pytest.mark.parametrize("critic", ["mlp", "lstm"])
def test_timeout_bootstrap(critic):
    """Default: rsl_rl's own reward + gamma V(s_t). Exact: reward + gamma V(final observation) where timed out,
    from the critic's state after the step's act(), which is left as rsl_rl's process_env_step leaves it."""
    n = 9
    obs0, _, _, _, _ = step_inputs(n, seed=5)
    obs, final, rewards, dones, time_outs = step_inputs(n)
    extras = {"time_outs": time_outs, FINAL_OBSERVATIONS: final}
    for exact in (False, True):
        alg, _ = make_algorithm(n, 4, critic=critic, exact_timeout_bootstrap=exact)
        with torch.inference_mode():
            alg.act(obs0)
            ref = copy.deepcopy(alg)
            expected_final = copy.deepcopy(alg).critic(final)[:, 0]  # the critic as it stands after act()
            alg.process_env_step(obs, rewards, dones, dict(extras))
            if exact:  # rsl_rl without time-outs: the reward alone, and the hidden state after its resets
                RslRlPPO.process_env_step(ref, obs, rewards, dones, {FINAL_OBSERVATIONS: final})
                expected = ref.storage.rewards[0, :, 0] + torch.where(time_outs, GAMMA * expected_final, 0.0)
            else:
                RslRlPPO.process_env_step(ref, obs, rewards, dones, dict(extras))
                expected = ref.storage.rewards[0, :, 0]
        assert_close(f"rewards (exact={exact})", alg.storage.rewards[0, :, 0], expected)
        if exact:
            assert not torch.allclose(alg.storage.rewards[0, :, 0], ref.storage.rewards[0, :, 0])
        assert_same_hidden("critic hidden state", hidden(alg.critic), hidden(ref.critic))
        assert torch.equal(alg.storage.dones, ref.storage.dones)


def test_timeout_bootstrap_needs_final_observations():
    alg, _ = make_algorithm(4, 2, exact_timeout_bootstrap=True)
    obs, _, rewards, dones, time_outs = step_inputs(4)
    with torch.inference_mode():
        alg.act(obs)
        with pytest.raises(KeyError, match="final_observations"):
            alg.process_env_step(obs, rewards, dones, {"time_outs": time_outs})


def test_cuda_graph_needs_cuda():
    if torch.cuda.is_available():
        pytest.skip("checks the CPU refusal")
    with pytest.raises(ValueError, match="cuda_graph=True needs a CUDA device"):
        make_algorithm(4, 2, cuda_graph=True)


def train_cfg(class_name, *, recurrent=False, steps=8, **algorithm):
    model = {"class_name": "RNNModel", "rnn_type": "lstm", "rnn_hidden_dim": 8} if recurrent else \
        {"class_name": "MLPModel"}
    return {
        "num_steps_per_env": steps,
        "save_interval": 100,
        "obs_groups": OBS_GROUPS,
        "algorithm": {"class_name": class_name, "num_learning_epochs": 2, "num_mini_batches": 2,
                      "learning_rate": 1e-3, "gamma": 0.99, "lam": 0.95, **algorithm},
        "actor": {**model, "hidden_dims": [16], "distribution_cfg": {"class_name": "GaussianDistribution"}},
        "critic": {**model, "hidden_dims": [16]},
    }


def test_class_name_resolves():
    assert resolve_callable("rl_triton_torchrl.rsl_rl:PPO") is PPO
    assert resolve_callable("rl_triton_torchrl.rsl_rl.PPO") is PPO


@pytest.mark.parametrize("options", [{}, {"exact_timeout_bootstrap": True}, {"recurrent": True},
                                     {"normalize_advantage_per_mini_batch": True}],
                         ids=["default", "exact_timeouts", "recurrent", "per_minibatch"])
def test_on_policy_runner(options, capsys):
    """rsl_rl's OnPolicyRunner builds our class from the documented config line and trains with it."""
    options = dict(options)
    recurrent = options.pop("recurrent", False)
    env = RslRlVecEnv(Pendulum(8, max_episode_steps=5, seed=0))  # time-outs every 5 steps
    cfg = train_cfg("rl_triton_torchrl.rsl_rl:PPO", recurrent=recurrent, **options)
    runner = OnPolicyRunner(env, cfg, log_dir=None, device="cpu")
    assert type(runner.alg) is PPO
    calls = []
    compute_returns = runner.alg.compute_returns
    runner.alg.compute_returns = lambda obs: calls.append(1) or compute_returns(obs)
    runner.learn(num_learning_iterations=3)
    assert len(calls) == 3
    assert torch.isfinite(runner.alg.storage.advantages).all()
    assert all(torch.isfinite(p).all() for p in runner.alg.actor.parameters())


def test_same_training_as_rsl_rl(backend):
    """Three iterations of OnPolicyRunner from one seed, rsl_rl's PPO and ours: the same targets in the last
    iteration and the same parameters at the end, to float32 rounding (only compute_returns differs)."""
    results = {}
    for name in ("PPO", "rl_triton_torchrl.rsl_rl:PPO"):
        torch.manual_seed(0)
        env = RslRlVecEnv(CartPole(16, device=DEVICE, max_episode_steps=12, seed=0))
        runner = OnPolicyRunner(env, train_cfg(name, steps=6), log_dir=None, device=str(DEVICE))
        runner.learn(num_learning_iterations=3)
        st = runner.alg.storage
        results[name] = [st.returns.clone(), st.advantages.clone(), *(p.detach().clone() for p in (
            *runner.alg.actor.parameters(), *runner.alg.critic.parameters()))]
    assert type(runner.alg) is PPO
    names = ["returns", "advantages"] + [f"parameter {i}" for i in range(len(results["PPO"]) - 2)]
    for name, ours, theirs in zip(names, results["rl_triton_torchrl.rsl_rl:PPO"], results["PPO"]):
        assert_close(name, ours, theirs)


def test_import_does_not_need_rsl_rl():
    code = ("import sys, rl_triton_torchrl, rl_triton_torchrl.kernels; "
            "assert 'rsl_rl' not in sys.modules and 'rl_triton_torchrl.rsl_rl' not in sys.modules")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert result.returncode == 0, result.stderr


def test_benchmark_smoke(tmp_path):
    """benchmarks/bench_rsl_rl.py at tiny sizes on the CPU: both implementations checked, timed and reported."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "bench_rsl_rl.py", "--sizes", "8x3,5x1", "--repeats", "3",
                             "--out", str(tmp_path)], cwd=ROOT / "benchmarks", capture_output=True, text=True,
                            env=env, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = json.loads((tmp_path / "bench_rsl_rl.json").read_text())["rows"]
    assert {(r["num_envs"], r["steps"]) for r in rows} == {(8, 3), (5, 1)}
    assert all(r["max_abs_diff_returns"] < 1e-4 and r["rsl_rl_wall_us"] > 0 and r["ours_wall_us"] > 0 for r in rows)
    assert "compute_returns" in (tmp_path / "bench_rsl_rl.md").read_text()


# ---- on the GPU: the Triton kernel itself, CUDA graphs, no synchronisation ----

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@needs_cuda
@pytest.mark.parametrize("cuda_graph", [False, True], ids=["eager", "cuda_graph"])
@pytest.mark.parametrize("per_minibatch", [False, True], ids=["global", "per_minibatch"])
@pytest.mark.parametrize("critic", ["mlp", "lstm"])
def test_gpu_matches_rsl_rl(cuda_graph, per_minibatch, critic):
    """On CUDA, several calls in a row on new data (the graph replayed), then a new gamma (captured again)."""
    alg, obs = make_algorithm(4096, 24, critic=critic, per_minibatch=per_minibatch, cuda_graph=cuda_graph,
                              device=torch.device("cuda"))
    for call in range(4):
        fill(alg.storage, ("random", "none", "all", "random")[call], seed=call)
        if call == 3:
            alg.gamma = 0.9
        obs = TensorDict({"policy": torch.randn(4096, OBS_DIM, device="cuda")}, batch_size=[4096], device="cuda")
        ref = copy.deepcopy(alg)
        with torch.inference_mode():
            RslRlPPO.compute_returns(ref, obs)
            alg.compute_returns(obs)
        assert_close(f"returns, call {call}", alg.storage.returns, ref.storage.returns)
        assert_close(f"advantages, call {call}", alg.storage.advantages, ref.storage.advantages)
        assert_same_hidden("critic hidden state", hidden(alg.critic), hidden(ref.critic))


@needs_cuda
@pytest.mark.parametrize("cuda_graph", [False, True], ids=["eager", "cuda_graph"])
def test_gpu_no_sync(cuda_graph):
    alg, obs = make_algorithm(4096, 24, cuda_graph=cuda_graph, device=torch.device("cuda"))
    fill(alg.storage, "random")
    with torch.inference_mode():
        alg.compute_returns(obs)  # compiles, captures
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode("error")
        try:
            for _ in range(3):
                alg.compute_returns(obs)
        finally:
            torch.cuda.set_sync_debug_mode("default")
