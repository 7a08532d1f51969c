"""The examples' batched environments (examples/gpu_envs) against Gymnasium's CartPole-v1 and Pendulum-v1, step for
step in float64: the same state, observation, reward, termination and truncation from the same start and actions;
then their resets and the TorchRL and rsl_rl wrappers."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

gymnasium = pytest.importorskip("gymnasium")

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "examples"))
from gpu_envs import CartPole, Pendulum  # noqa: E402

N = 4
STEPS = {"CartPole-v1": 400, "Pendulum-v1": 450}


def gym_envs(env_id, seed, **kwargs):
    envs = [gymnasium.make(env_id, **kwargs) for _ in range(N)]
    for i, env in enumerate(envs):
        env.reset(seed=seed + i)
    return envs


def gym_state(envs):
    return torch.tensor(np.stack([np.asarray(e.unwrapped.state, dtype=np.float64) for e in envs]))


def random_actions(env_id, rng, n):
    if env_id == "CartPole-v1":
        return rng.integers(0, 2, size=n)
    return rng.uniform(-2.5, 2.5, size=(n, 1))  # beyond the torque limit too: both clip


@pytest.mark.parametrize("max_episode_steps", [None, 23], ids=["gym-limit", "limit23"])
@pytest.mark.parametrize("env_id,cls", [("CartPole-v1", CartPole), ("Pendulum-v1", Pendulum)],
                         ids=["CartPole", "Pendulum"])
def test_matches_gymnasium(env_id, cls, max_episode_steps):
    kwargs = {} if max_episode_steps is None else {"max_episode_steps": max_episode_steps}
    envs = gym_envs(env_id, seed=10, **kwargs)
    ours = cls(N, dtype=torch.float64, max_episode_steps=max_episode_steps)
    if max_episode_steps is None:
        assert ours.max_episode_steps == envs[0].spec.max_episode_steps
    ours.state = gym_state(envs)
    rng = np.random.default_rng(0)
    counts = {"terminated": 0, "truncated": 0}
    for t in range(STEPS[env_id]):
        actions = random_actions(env_id, rng, N)
        obs, reward, terminated, truncated = ours.step(torch.as_tensor(actions))
        for i, env in enumerate(envs):
            g_obs, g_reward, g_term, g_trunc, _ = env.step(actions[i])
            where = f"{env_id} env {i} step {t}"
            assert torch.allclose(ours.state[i], torch.as_tensor(env.unwrapped.state, dtype=torch.float64),
                                  rtol=1e-12, atol=1e-12), f"{where}: state {ours.state[i]} != {env.unwrapped.state}"
            # Gymnasium's observations are float32
            assert torch.allclose(obs[i].float(), torch.as_tensor(g_obs), rtol=1e-6, atol=1e-6), f"{where}: obs"
            assert abs(reward[i].item() - float(g_reward)) <= 1e-12 * max(1.0, abs(float(g_reward))), \
                f"{where}: reward {reward[i].item()} != {g_reward}"
            assert bool(terminated[i]) == g_term, f"{where}: terminated"
            assert bool(truncated[i]) == g_trunc, f"{where}: truncated"
            counts["terminated"] += g_term
            counts["truncated"] += g_trunc
            if g_term or g_trunc:  # both start the next episode from Gymnasium's fresh state
                env.reset()
                mask = torch.zeros(N, dtype=torch.bool)
                mask[i] = True
                ours.reset(mask)
                ours.state[i] = torch.as_tensor(env.unwrapped.state, dtype=torch.float64)
    if env_id == "CartPole-v1":
        assert counts["terminated"] > 10
    assert counts["truncated"] > 0 or max_episode_steps is None and env_id == "CartPole-v1"


@pytest.mark.parametrize("cls", [CartPole, Pendulum], ids=["CartPole", "Pendulum"])
def test_reset_mask_and_initial_states(cls):
    env = cls(1000, dtype=torch.float64, seed=3)
    env.step(torch.ones(1000, 1) if not cls.discrete else torch.ones(1000, dtype=torch.long))
    before, steps = env.state.clone(), env.steps.clone()
    assert (steps == 1).all()
    mask = torch.arange(1000) % 3 == 0
    obs = env.reset(mask)
    assert torch.equal(env.state[~mask], before[~mask]), "an environment outside the mask was reset"
    assert (env.steps[mask] == 0).all() and (env.steps[~mask] == 1).all()
    assert torch.equal(obs, env.observation(env.state))
    fresh = env.state[mask]
    if cls is CartPole:  # Gymnasium: uniform in [-0.05, 0.05]^4
        assert fresh.abs().max() <= 0.05 and fresh.abs().max() > 0.045
    else:  # uniform angle in [-pi, pi], velocity in [-1, 1]
        assert fresh[:, 0].abs().max() <= np.pi and fresh[:, 0].abs().max() > 3.0
        assert fresh[:, 1].abs().max() <= 1.0 and fresh[:, 1].abs().max() > 0.95
    again = cls(1000, dtype=torch.float64, seed=3)
    assert torch.equal(again.state, cls(1000, dtype=torch.float64, seed=3).state), "the seed does not fix the state"


def test_torchrl_wrapper():
    from torchrl.envs.utils import check_env_specs

    from gpu_envs.torchrl_env import TorchRLEnv

    for cls in (CartPole, Pendulum):
        env = TorchRLEnv(cls(6, max_episode_steps=9))
        check_env_specs(env)
        data = env.rollout(40, break_when_any_done=False)
        nxt = data["next"]
        truncated, done = nxt["truncated"].squeeze(-1), nxt["done"].squeeze(-1)
        assert truncated.any()
        for b in range(6):  # an episode is at most 9 steps; after a done step the next one starts fresh
            length = 0
            for t in range(40):
                length += 1
                assert bool(truncated[b, t]) == (length == 9), f"env {b} step {t}: truncated"
                if done[b, t]:
                    length = 0
                elif t + 1 < 40:
                    assert torch.equal(data["observation"][b, t + 1], nxt["observation"][b, t]), f"env {b} step {t}"


def cartpole_terminated(obs):
    return (obs[:, 0].abs() > CartPole.x_threshold) | (obs[:, 2].abs() > CartPole.theta_threshold)


def test_rsl_rl_wrapper():
    pytest.importorskip("rsl_rl")
    from gpu_envs.rsl_rl_env import FINAL_OBSERVATIONS, RslRlVecEnv
    from rl_triton_torchrl.rsl_rl import FINAL_OBSERVATIONS as OURS

    assert FINAL_OBSERVATIONS == OURS
    env = RslRlVecEnv(CartPole(5, max_episode_steps=6, seed=1))
    obs = env.get_observations()
    assert obs["policy"].shape == (5, 4) and env.num_actions == 1 and env.max_episode_length == 6
    episodes = 0
    for t in range(30):
        obs, reward, dones, extras = env.step(torch.randn(5, 1))
        final = extras[FINAL_OBSERVATIONS]["policy"]
        done = dones.bool()
        episodes += int(done.sum())
        # not done: the observation is the state reached; done: a fresh state, and the one reached is reported
        assert torch.equal(obs["policy"][~done], final[~done]), f"step {t}"
        assert (obs["policy"][done].abs() <= 0.05).all(), f"step {t}"
        assert torch.equal(done, cartpole_terminated(final) | extras["time_outs"]), f"step {t}"
        assert not (extras["time_outs"] & cartpole_terminated(final)).any(), f"step {t}"
        assert reward.shape == (5,) and (reward == 1).all()
    count, mean_return, mean_length = env.episode_stats()
    assert count == episodes > 0 and mean_return == mean_length and 1 <= mean_length <= 6
    assert env.episode_stats() == (0, None, None)
    env.episode_length_buf = torch.full((5,), 5)  # OnPolicyRunner(init_at_random_ep_len=True) sets it
    _, _, dones, extras = env.step(torch.zeros(5, 1))
    final = extras[FINAL_OBSERVATIONS]["policy"]
    assert dones.all() and torch.equal(extras["time_outs"], ~cartpole_terminated(final))
