"""Batched environments on the GPU (pure torch) for the examples: CartPole and Pendulum with Gymnasium's dynamics.

- ``dynamics``: ``CartPole`` and ``Pendulum`` over N environments, with their own resets, terminations and
  time-limit truncations, on any device (needs torch only).
- ``torchrl_env.TorchRLEnv``: the same as a TorchRL ``EnvBase`` (``examples/ppo_gpu.py``).
- ``rsl_rl_env.RslRlVecEnv``: the same as rsl_rl 5.x's ``VecEnv`` (``examples/rsl_rl_ppo.py``; needs rsl-rl-lib).

``examples/`` is a folder of scripts, not a package: the examples put it on ``sys.path`` and import ``gpu_envs``.
"""
from .dynamics import ENVS, BatchedEnv, CartPole, Pendulum

__all__ = ["ENVS", "BatchedEnv", "CartPole", "Pendulum"]
