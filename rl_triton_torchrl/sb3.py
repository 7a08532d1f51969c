r"""Stable-Baselines3 rollout buffers whose GAE runs on our kernels.

:class:`RolloutBuffer` and :class:`DictRolloutBuffer` are SB3's classes of the same names with one method replaced,
``compute_returns_and_advantage``: everything else (storage, ``add``, ``get``, minibatches, ``reset``) is SB3's.
One argument swaps them into PPO or A2C:

.. code-block:: python

    from stable_baselines3 import PPO
    import rl_triton_torchrl.sb3

    model = PPO("MlpPolicy", "CartPole-v1", rollout_buffer_class=rl_triton_torchrl.sb3.RolloutBuffer)
    # Dict observation spaces: rollout_buffer_class=rl_triton_torchrl.sb3.DictRolloutBuffer

SB3's conventions, mapped onto :func:`rl_triton_torchrl.kernels.gae` (the recurrence is in its module docstring):

- SB3 stores ``[buffer_size, n_envs]`` float32 numpy arrays, time first: ``gae(..., time_dim=0)``.
- ``episode_starts[t]`` marks the first step of an episode, so the episode ended after step t when
  ``episode_starts[t + 1]`` is set; after the last step it ended when the ``dones`` argument is set. That is our
  ``done``.
- Every such end is a termination (no bootstrap): SB3 folds the bootstrap of a time-limit truncation into the
  reward while it collects the rollout (``reward += gamma * V(terminal observation)``), so ``terminated = done``.
- The value of the observation reached by step t (``next_state_value``) is ``values[t + 1]``, and ``last_values``
  after the last step. Where the episode ended it is multiplied by zero, as in SB3.
- ``gamma`` and ``gae_lambda`` are the buffer's; nothing is carried past the end of the rollout.

Results are written back as SB3 writes them: ``advantages`` in place (the same array), ``returns`` as a new float32
array ``advantages + values`` (SB3 rebinds it too).

Which path runs is the kernels' ``"auto"`` backend, on the buffer's device (SB3 gives it the policy's): on a CPU
device the torch path, reading ``rewards``, ``values`` and ``episode_starts`` in place (``torch.from_numpy``, no
copy); on a CUDA device the Triton kernel, after copying those three arrays to the GPU, and the results come back to
the numpy arrays. ``$RL_TRITON_TORCHRL_BACKEND`` (``"torch"``/``"triton"``) overrides the choice. Either way two
``[buffer_size, n_envs]`` inputs are built, the next values and the done flags (both shifted by one step, with
``last_values`` and ``dones`` appended). The numbers equal SB3's loop up to float32 rounding (both accumulate in
float32, in a different order).

Needs Stable-Baselines3 (``pip install "stable-baselines3>=2.9,<3"``, or from the clone ``pip install -e ".[sb3]"``); the rest of the package does not.
"""
from __future__ import annotations

import numpy as np
import torch

try:
    from stable_baselines3.common import buffers as sb3_buffers
except ImportError as err:  # pragma: no cover - exercised in a subprocess by tests/test_sb3.py
    raise ImportError(
        'rl_triton_torchrl.sb3 needs Stable-Baselines3: pip install "stable-baselines3>=2.9,<3" (or, from the '
        'clone, pip install -e ".[sb3]")'
    ) from err

from .kernels import gae

__all__ = ["RolloutBuffer", "DictRolloutBuffer"]


class _KernelGAE:
    """``compute_returns_and_advantage`` on :func:`rl_triton_torchrl.kernels.gae`, for SB3's rollout buffers."""

    def compute_returns_and_advantage(self, last_values: torch.Tensor, dones: np.ndarray) -> None:
        """Computes the GAE(lambda) advantages and the TD(lambda) returns of the stored rollout, as SB3 does.

        Args:
            last_values (Tensor): ``[n_envs]`` or ``[n_envs, 1]`` values of the observations after the last step.
            dones (ndarray): ``[n_envs]`` whether each environment's episode ended at the last step.
        """
        device = self.device
        # [T, N] = [buffer_size, n_envs], time first; no copy on a CPU device
        reward = torch.from_numpy(self.rewards).to(device)  # [T, N]
        value = torch.from_numpy(self.values).to(device)  # [T, N]
        starts = torch.from_numpy(self.episode_starts).to(device)  # [T, N]
        last_value = last_values.detach().to(device=device, dtype=value.dtype).reshape(1, self.n_envs)  # [1, N]
        last_done = torch.from_numpy(np.asarray(dones).reshape(1, self.n_envs) != 0).to(device)  # [1, N]
        next_value = torch.cat([value[1:], last_value])  # [T, N]
        done = torch.cat([starts[1:] != 0, last_done])  # [T, N]
        advantage, returns = gae(
            reward, value, next_value, done, gamma=float(self.gamma), lmbda=float(self.gae_lambda), time_dim=0,
        )
        torch.from_numpy(self.advantages).copy_(advantage)  # in place, as SB3 writes it
        self.returns = returns.cpu().numpy()  # a new array, as SB3 rebinds it


class RolloutBuffer(_KernelGAE, sb3_buffers.RolloutBuffer):
    """SB3's ``RolloutBuffer`` with ``compute_returns_and_advantage`` on our GAE kernel (see the module docstring).

    Examples:
        >>> import numpy as np, torch
        >>> from gymnasium import spaces
        >>> buf = RolloutBuffer(3, spaces.Box(-1, 1, (2,)), spaces.Discrete(2), device="cpu", gamma=0.9,
        ...                     gae_lambda=1.0, n_envs=1)
        >>> for _ in range(3):
        ...     buf.add(np.zeros((1, 2)), np.zeros(1), np.ones(1), np.zeros(1), torch.zeros(1), torch.zeros(1))
        >>> buf.compute_returns_and_advantage(torch.zeros(1), np.zeros(1, dtype=bool))
        >>> buf.advantages[:, 0]
        array([2.71, 1.9 , 1.  ], dtype=float32)
    """


class DictRolloutBuffer(_KernelGAE, sb3_buffers.DictRolloutBuffer):
    """SB3's ``DictRolloutBuffer`` (Dict observation spaces) with ``compute_returns_and_advantage`` on our GAE
    kernel (see the module docstring)."""
