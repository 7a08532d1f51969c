"""A ``BatchedEnv`` as a TorchRL environment (``EnvBase``): batch size ``[num_envs]``, on the environments' device.

Keys: ``observation`` ``[N, obs]``; ``action`` one-hot ``[N, 2]`` for CartPole (as TorchRL's ``GymEnv`` gives it),
``[N, 1]`` in ``[-2, 2]`` for Pendulum; ``("next", "reward")`` ``[N, 1]``; ``done``, ``terminated`` and ``truncated``
``[N, 1]`` bool. ``step`` never resets; TorchRL resets finished environments itself (``_reset`` with the
``"_reset"`` mask: only those environments get fresh initial states), so ``("next", "observation")`` of a done step
is the true final observation and GAE bootstraps a truncation from it.
"""
from __future__ import annotations

import torch
from tensordict import TensorDict
from torchrl.data import Bounded, Categorical, Composite, OneHot, Unbounded
from torchrl.envs import EnvBase

from .dynamics import BatchedEnv

__all__ = ["TorchRLEnv"]


class TorchRLEnv(EnvBase):
    """TorchRL's view of ``env`` (a ``BatchedEnv``); the physics are stepped by it, nothing is copied to the host."""

    def __init__(self, env: BatchedEnv):
        super().__init__(device=env.device, batch_size=torch.Size([env.num_envs]))
        self.env = env
        n = env.num_envs
        self.observation_spec = Composite(
            observation=Unbounded(shape=(n, env.observation_size), dtype=env.dtype, device=env.device), shape=(n,))
        if env.discrete:
            self.action_spec = OneHot(env.action_size, shape=(n, env.action_size), device=env.device)
        else:
            self.action_spec = Bounded(low=-env.max_torque, high=env.max_torque, shape=(n, env.action_size),
                                       dtype=env.dtype, device=env.device)
        self.reward_spec = Unbounded(shape=(n, 1), dtype=env.dtype, device=env.device)
        flag = Categorical(2, shape=(n, 1), dtype=torch.bool, device=env.device)
        self.done_spec = Composite(done=flag, terminated=flag.clone(), truncated=flag.clone(), shape=(n,))

    def _flags(self, terminated, truncated):
        return {"done": (terminated | truncated)[:, None], "terminated": terminated[:, None],
                "truncated": truncated[:, None]}

    def _reset(self, tensordict=None, **kwargs):
        mask = None
        if tensordict is not None and "_reset" in tensordict.keys():
            mask = tensordict.get("_reset").reshape(self.env.num_envs)
        observation = self.env.reset(mask)
        no = torch.zeros(self.env.num_envs, dtype=torch.bool, device=self.device)
        return TensorDict({"observation": observation, **self._flags(no, no)}, batch_size=self.batch_size,
                          device=self.device)

    def _step(self, tensordict):
        action = tensordict.get("action")
        if self.env.discrete:  # one-hot -> index
            action = action[..., 1].bool()  # [N, 2] one-hot: push right where its second entry is set
        observation, reward, terminated, truncated = self.env.step(action)
        return TensorDict({"observation": observation, "reward": reward[:, None], **self._flags(terminated, truncated)},
                          batch_size=self.batch_size, device=self.device)

    def _set_seed(self, seed: int | None):
        if seed is not None:
            self.env.seed(seed)
