"""A ``BatchedEnv`` as rsl_rl 5.x's ``VecEnv``, the interface of Isaac Lab's ``RslRlVecEnvWrapper``.

``step(actions)`` steps every environment and resets the finished ones at once (Isaac Lab does too), returning the
observations after the resets in the ``"policy"`` group, the rewards ``[N]``, ``dones`` ``[N]`` (terminated or
truncated, as integers like Isaac Lab's), and ``extras`` with ``"time_outs"`` (truncated and not terminated: the
steps rsl_rl bootstraps) and ``"final_observations"``: the observations reached before the resets, which
``rl_triton_torchrl.rsl_rl.PPO(exact_timeout_bootstrap=True)`` bootstraps time-outs from. Actions are rsl_rl's
continuous ``[N, 1]``: CartPole pushes right where the action is positive, Pendulum clips it to ``[-2, 2]``.

It also keeps the returns and lengths of the episodes finished since ``episode_stats()`` was last called, on the
device (no synchronisation per step).
"""
from __future__ import annotations

import torch
from rsl_rl.env import VecEnv
from tensordict import TensorDict

from .dynamics import BatchedEnv

__all__ = ["RslRlVecEnv", "FINAL_OBSERVATIONS"]

FINAL_OBSERVATIONS = "final_observations"  # rl_triton_torchrl.rsl_rl.FINAL_OBSERVATIONS (without importing it)


class RslRlVecEnv(VecEnv):
    """rsl_rl's view of ``env`` (a ``BatchedEnv``)."""

    def __init__(self, env: BatchedEnv):
        self.env = env
        self.num_envs = env.num_envs
        self.num_actions = 1
        self.max_episode_length = env.max_episode_steps
        self.device = env.device
        self.cfg = {"env": type(env).__name__, "num_envs": env.num_envs, "max_episode_steps": env.max_episode_steps}
        self._observation = env.reset()
        self._return = torch.zeros(env.num_envs, dtype=env.dtype, device=env.device)  # of each running episode
        self._finished = torch.zeros(3, dtype=torch.float64, device=env.device)  # count, return sum, length sum

    @property
    def episode_length_buf(self) -> torch.Tensor:
        return self.env.steps

    @episode_length_buf.setter
    def episode_length_buf(self, value: torch.Tensor) -> None:  # OnPolicyRunner(init_at_random_ep_len=True)
        self.env.steps.copy_(value)

    def _group(self, observation: torch.Tensor) -> TensorDict:
        return TensorDict({"policy": observation}, batch_size=[self.num_envs], device=self.device)

    def get_observations(self) -> TensorDict:
        return self._group(self._observation)

    def step(self, actions: torch.Tensor):
        action = actions[:, 0] > 0 if self.env.discrete else actions
        lengths = self.env.steps + 1
        final, reward, terminated, truncated = self.env.step(action)
        done = terminated | truncated
        self._record(reward, done, lengths)
        self._observation = self.env.reset(done)
        extras = {"time_outs": truncated & ~terminated, FINAL_OBSERVATIONS: self._group(final)}
        return self.get_observations(), reward, done.long(), extras

    def _record(self, reward, done, lengths):
        self._return += reward
        finished = torch.stack([done.sum(), torch.where(done, self._return, 0).sum(), torch.where(done, lengths, 0)
                                .sum()]).to(torch.float64)
        self._finished += finished
        self._return.masked_fill_(done, 0.0)

    def episode_stats(self) -> tuple[int, float | None, float | None]:
        """(episodes finished, their mean return, their mean length) since the last call; one synchronisation."""
        count, return_sum, length_sum = self._finished.tolist()
        self._finished.zero_()
        if count == 0:
            return 0, None, None
        return int(count), return_sum / count, length_sum / count
