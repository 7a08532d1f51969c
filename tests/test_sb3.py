"""The Stable-Baselines3 rollout buffers against SB3's own.

Parity of ``compute_returns_and_advantage`` with SB3's ``RolloutBuffer`` / ``DictRolloutBuffer`` on random rollouts
(buffer sizes from 1, several n_envs, episode-start patterns none/all/random, several gamma/gae_lambda), on both
paths (the torch path and the Triton kernel, forced with RL_TRITON_TORCHRL_BACKEND and checked to have run); short
PPO and A2C runs on CartPole-v1 from one seed with SB3's buffer and with ours end with the same parameters; and the
package imports without SB3 while ``rl_triton_torchrl.sb3`` says what to install.
"""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

sb3 = pytest.importorskip("stable_baselines3")

from gymnasium import spaces  # noqa: E402
from stable_baselines3.common import buffers as sb3_buffers  # noqa: E402
from stable_baselines3.common.env_util import make_vec_env  # noqa: E402

import rl_triton_torchrl.sb3 as ours  # noqa: E402
from _helpers import DEVICE, assert_close  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
SB3_PATTERNS = ("none", "all", "random")
# (buffer_size, n_envs)
SIZES = [(1, 1), (1, 4), (7, 3), (64, 8), (257, 2)]
COEFS = [(0.99, 0.95), (1.0, 1.0), (0.9, 0.0), (0.0, 0.5)]


@pytest.fixture(params=["torch", "triton"])
def backend(request, monkeypatch):
    """Forces a path and counts the Triton launches of ``kernels.gae``, so that the test knows which path ran."""
    monkeypatch.setenv("RL_TRITON_TORCHRL_BACKEND", request.param)
    gae_module = sys.modules["rl_triton_torchrl.kernels.gae"]
    launches = []
    launch = gae_module.launch
    monkeypatch.setattr(gae_module, "launch", lambda *a, **k: launches.append(1) or launch(*a, **k))
    yield request.param, launches


def rollout(buffer_size, n_envs, pattern, obs_space, seed=0):
    """The arguments of ``buffer_size`` calls of ``add``, plus ``last_values`` and ``dones``."""
    rng = np.random.default_rng(seed)
    if pattern == "none":
        starts = np.zeros((buffer_size, n_envs), dtype=bool)
        dones = np.zeros(n_envs, dtype=bool)
    elif pattern == "all":
        starts = np.ones((buffer_size, n_envs), dtype=bool)
        dones = np.ones(n_envs, dtype=bool)
    else:
        starts = rng.random((buffer_size, n_envs)) < 0.2
        dones = rng.random(n_envs) < 0.5
    obs_space.seed(seed)
    steps = [
        dict(
            obs={k: np.stack([s.sample() for _ in range(n_envs)]) for k, s in obs_space.spaces.items()}
            if isinstance(obs_space, spaces.Dict) else np.stack([obs_space.sample() for _ in range(n_envs)]),
            action=rng.integers(0, 2, n_envs),
            reward=rng.standard_normal(n_envs).astype(np.float32),
            episode_start=starts[t],
            value=torch.from_numpy(rng.standard_normal((n_envs, 1)).astype(np.float32)),
            log_prob=torch.from_numpy(rng.standard_normal(n_envs).astype(np.float32)),
        )
        for t in range(buffer_size)
    ]
    last_values = torch.from_numpy(rng.standard_normal((n_envs, 1)).astype(np.float32))
    return steps, last_values, dones


def check_parity(sb3_cls, our_cls, obs_space, buffer_size, n_envs, pattern, gamma, lmbda):
    steps, last_values, dones = rollout(buffer_size, n_envs, pattern, obs_space)
    kw = dict(device=DEVICE, gae_lambda=lmbda, gamma=gamma, n_envs=n_envs)
    theirs = sb3_cls(buffer_size, obs_space, spaces.Discrete(2), **kw)
    mine = our_cls(buffer_size, obs_space, spaces.Discrete(2), **kw)
    for buf in (theirs, mine):
        for step in steps:
            buf.add(**step)
    inputs = {k: getattr(mine, k).copy() for k in ("rewards", "values", "episode_starts")}
    advantages = mine.advantages
    mine.advantages[:] = np.nan  # a step the kernel fails to write fails the comparison
    theirs.compute_returns_and_advantage(last_values=last_values.clone(), dones=dones.copy())
    mine.compute_returns_and_advantage(last_values=last_values, dones=dones)

    assert mine.advantages is advantages, "advantages must be written in place, as SB3 does"
    for name in ("advantages", "returns"):
        got, expected = getattr(mine, name), getattr(theirs, name)
        assert isinstance(got, np.ndarray) and got.dtype == np.float32, f"{name}: {type(got)} {got.dtype}"
        assert_close(name, torch.from_numpy(got), torch.from_numpy(expected))
    for name, before in inputs.items():
        np.testing.assert_array_equal(getattr(mine, name), before, err_msg=f"{name} was modified")

    # SB3's minibatch generator reads what we wrote (same permutation from the same numpy seed)
    samples = []
    for buf in (theirs, mine):
        np.random.seed(0)
        samples.append(next(buf.get(batch_size=None)))
    assert_close("get().advantages", samples[1].advantages, samples[0].advantages)
    assert_close("get().returns", samples[1].returns, samples[0].returns)


@pytest.mark.parametrize("pattern", SB3_PATTERNS)
@pytest.mark.parametrize("buffer_size,n_envs", SIZES, ids=[f"T{t}-N{n}" for t, n in SIZES])
def test_rollout_buffer_parity(buffer_size, n_envs, pattern, backend):
    check_parity(sb3_buffers.RolloutBuffer, ours.RolloutBuffer, spaces.Box(-1, 1, (3,)), buffer_size, n_envs,
                 pattern, 0.99, 0.95)
    assert bool(backend[1]) == (backend[0] == "triton")


@pytest.mark.parametrize("gamma,lmbda", COEFS, ids=[f"g{g}-l{l}" for g, l in COEFS])
def test_coefficients(gamma, lmbda, backend):
    check_parity(sb3_buffers.RolloutBuffer, ours.RolloutBuffer, spaces.Box(-1, 1, (3,)), 33, 5, "random",
                 gamma, lmbda)
    assert bool(backend[1]) == (backend[0] == "triton")


@pytest.mark.parametrize("pattern", SB3_PATTERNS)
def test_dict_rollout_buffer_parity(pattern, backend):
    obs_space = spaces.Dict({"image": spaces.Box(0, 255, (2, 3), dtype=np.uint8), "index": spaces.Discrete(4)})
    check_parity(sb3_buffers.DictRolloutBuffer, ours.DictRolloutBuffer, obs_space, 19, 3, pattern, 0.98, 0.9)
    assert bool(backend[1]) == (backend[0] == "triton")


def _train(algo, buffer_class, **kwargs):
    """(parameters before, parameters after, advantages of the last rollout) of two updates from seed 0."""
    env = make_vec_env("CartPole-v1", n_envs=2, seed=0)
    model = algo("MlpPolicy", env, seed=0, device="cpu", rollout_buffer_class=buffer_class, **kwargs)
    assert type(model.rollout_buffer) is buffer_class

    def flat():
        return torch.cat([p.detach().flatten() for p in model.policy.parameters()])

    before = flat().clone()
    model.learn(total_timesteps=2 * model.n_steps * env.num_envs)
    return before, flat(), torch.from_numpy(model.rollout_buffer.advantages.copy())


@pytest.mark.parametrize("algo", ["PPO", "A2C"])
def test_training_matches_sb3(algo):
    cls, kwargs = {
        "PPO": (sb3.PPO, dict(n_steps=64, batch_size=32, n_epochs=2)),
        "A2C": (sb3.A2C, dict(n_steps=8)),
    }[algo]
    before, theirs, adv_theirs = _train(cls, sb3_buffers.RolloutBuffer, **kwargs)
    _, mine, adv_mine = _train(cls, ours.RolloutBuffer, **kwargs)
    assert (theirs - before).abs().max() > 1e-4, "training did not change the parameters: the test proves nothing"
    assert_close(f"{algo} advantages of the last rollout", adv_mine, adv_theirs)
    assert_close(f"{algo} parameters after two updates", mine, theirs)


def test_optional_dependency():
    """The package and its kernels import without SB3; ``rl_triton_torchrl.sb3`` says what to install."""
    code = textwrap.dedent("""
        import sys
        sys.modules["stable_baselines3"] = None  # `import stable_baselines3` now raises ImportError
        import torch
        import rl_triton_torchrl
        from rl_triton_torchrl.kernels import gae
        gae(torch.ones(3, 2), torch.zeros(3, 2), torch.zeros(3, 2), torch.zeros(3, 2, dtype=torch.bool),
            gamma=0.9, lmbda=0.9, time_dim=0)
        try:
            import rl_triton_torchrl.sb3
        except ImportError as err:
            print(err)
        else:
            print("imported")
    """)
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert 'pip install "stable-baselines3' in out.stdout, out.stdout
    assert 'pip install -e ".[sb3]"' in out.stdout, out.stdout
