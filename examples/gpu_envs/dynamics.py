"""CartPole and Pendulum, N environments stepped at once on any device: pure torch, no Python loop over them.

The dynamics, rewards, terminations and initial-state distributions are Gymnasium's ``CartPole-v1`` and
``Pendulum-v1`` (tests/test_gpu_envs.py checks them step for step against Gymnasium in float64); the time limits are
Gymnasium's too (500 and 200 steps), counted per environment. ``step`` never resets: an environment that is done
stays at its final state until ``reset(mask)`` draws a fresh initial state for the masked environments, leaving
the others mid-episode. Nothing here synchronises with the host: masks select with ``torch.where``, random numbers
come from a ``torch.Generator`` on the environments' device.
"""
from __future__ import annotations

import math

import torch

__all__ = ["BatchedEnv", "CartPole", "Pendulum", "ENVS"]


class BatchedEnv:
    """``num_envs`` copies of one environment, their states one ``[num_envs, state_size]`` tensor.

    Args:
        num_envs (int): how many environments.

    Keyword Args:
        device: where the states live and every step runs. Defaults to ``"cpu"``.
        dtype: of the states, observations and rewards. Defaults to ``torch.float32``.
        max_episode_steps (int, optional): steps after which an episode is truncated (Gymnasium's ``TimeLimit``:
            truncated once an episode has taken this many steps). Defaults to the class's Gymnasium limit.
        seed (int): seed of the environments' own generator. Defaults to 0.

    Subclasses define ``observation_size``, ``discrete`` (actions are indices, else ``[num_envs, action_size]``
    floats), ``action_size``, ``default_max_episode_steps``, ``initial_state(n)``, ``observation(state)`` and
    ``dynamics(state, action) -> (next state, reward, terminated)``.
    """

    observation_size: int
    action_size: int
    discrete: bool
    default_max_episode_steps: int

    def __init__(self, num_envs: int, *, device="cpu", dtype=torch.float32, max_episode_steps: int | None = None,
                 seed: int = 0):
        self.num_envs = int(num_envs)
        self.device = torch.device(device)
        self.dtype = dtype
        self.max_episode_steps = int(max_episode_steps or self.default_max_episode_steps)
        self.generator = torch.Generator(device=self.device)
        self.generator.manual_seed(seed)
        self.state = self.initial_state(self.num_envs)
        self.steps = torch.zeros(self.num_envs, dtype=torch.int64, device=self.device)  # steps in each episode

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def uniform(self, low, high, *shape) -> torch.Tensor:
        """Uniform samples in ``[low, high)`` from the environments' generator."""
        u = torch.rand(*shape, generator=self.generator, device=self.device, dtype=self.dtype)
        return low + (high - low) * u

    def reset(self, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Fresh initial states for the environments where ``mask`` (``[num_envs]`` bool) is set, or for all;
        returns every environment's observation."""
        fresh = self.initial_state(self.num_envs)
        if mask is None:
            self.state = fresh
            self.steps.zero_()
        else:
            mask = mask.reshape(self.num_envs)
            self.state = torch.where(mask[:, None], fresh, self.state)
            self.steps.masked_fill_(mask, 0)
        return self.observation(self.state)

    def step(self, action: torch.Tensor):
        """One step of every environment: (observation, reward, terminated, truncated), each ``[num_envs, ...]``;
        the flags are bool. No environment is reset."""
        self.state, reward, terminated = self.dynamics(self.state, action)
        self.steps += 1
        truncated = self.steps >= self.max_episode_steps
        return self.observation(self.state), reward, terminated, truncated

    def initial_state(self, n: int) -> torch.Tensor:
        raise NotImplementedError

    def observation(self, state: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def dynamics(self, state: torch.Tensor, action: torch.Tensor):
        raise NotImplementedError


class CartPole(BatchedEnv):
    """Gymnasium's ``CartPole-v1``: push the cart left (action 0) or right (1) to keep the pole upright.

    State and observation ``(x, x_dot, theta, theta_dot)``; reward 1 for every step, the terminating one included;
    terminated once ``|x| > 2.4`` or ``|theta| > 12°``; 500 steps per episode at most. The equations of motion are
    Florian's (2005) corrected Barto-Sutton-Anderson cart-pole, integrated with explicit Euler steps of 20 ms.
    Initial states uniform in ``[-0.05, 0.05]^4``. Actions are ``[num_envs]`` integers (or bool: push right).
    """

    observation_size, action_size, discrete, default_max_episode_steps = 4, 2, True, 500
    gravity, cart_mass, pole_mass, half_length, force_mag, tau = 9.8, 1.0, 0.1, 0.5, 10.0, 0.02
    x_threshold, theta_threshold = 2.4, 12 * 2 * math.pi / 360

    def initial_state(self, n):
        return self.uniform(-0.05, 0.05, n, 4)

    def observation(self, state):
        return state

    def dynamics(self, state, action):
        x, x_dot, theta, theta_dot = state.unbind(-1)
        total_mass = self.cart_mass + self.pole_mass
        pole_moment = self.pole_mass * self.half_length
        force = torch.where(action.reshape(x.shape).bool(), self.force_mag, -self.force_mag).to(state.dtype)
        cos, sin = torch.cos(theta), torch.sin(theta)
        # the pole's angular acceleration first, then the cart's, from the force and the pole's reaction
        common = (force + pole_moment * theta_dot.square() * sin) / total_mass
        theta_acc = (self.gravity * sin - cos * common) / (
            self.half_length * (4.0 / 3.0 - self.pole_mass * cos.square() / total_mass))
        x_acc = common - pole_moment * theta_acc * cos / total_mass
        # explicit Euler: positions move with the old velocities
        state = torch.stack([x + self.tau * x_dot, x_dot + self.tau * x_acc,
                             theta + self.tau * theta_dot, theta_dot + self.tau * theta_acc], dim=-1)
        x, theta = state[:, 0], state[:, 2]
        terminated = (x.abs() > self.x_threshold) | (theta.abs() > self.theta_threshold)
        return state, torch.ones_like(x), terminated


class Pendulum(BatchedEnv):
    """Gymnasium's ``Pendulum-v1``: swing a pendulum up and hold it with a torque in ``[-2, 2]``.

    State ``(theta, theta_dot)``, observation ``(cos theta, sin theta, theta_dot)``; reward
    ``-(angle^2 + 0.1 theta_dot^2 + 0.001 u^2)`` with the angle wrapped to ``[-pi, pi)`` and ``u`` the clipped
    torque; never terminates, 200 steps per episode. ``theta_dot`` is clipped to ``[-8, 8]`` after each
    semi-implicit Euler step of 50 ms (g = 10, m = l = 1). Initial states uniform in ``[-pi, pi] x [-1, 1]``.
    Actions are ``[num_envs, 1]`` floats (clipped).
    """

    observation_size, action_size, discrete, default_max_episode_steps = 3, 1, False, 200
    g, mass, length, dt, max_speed, max_torque = 10.0, 1.0, 1.0, 0.05, 8.0, 2.0

    def initial_state(self, n):
        return torch.stack([self.uniform(-math.pi, math.pi, n), self.uniform(-1.0, 1.0, n)], dim=-1)

    def observation(self, state):
        theta, theta_dot = state.unbind(-1)
        return torch.stack([torch.cos(theta), torch.sin(theta), theta_dot], dim=-1)

    def dynamics(self, state, action):
        theta, theta_dot = state.unbind(-1)
        u = action.reshape(theta.shape).to(state.dtype).clamp(-self.max_torque, self.max_torque)
        angle = torch.remainder(theta + math.pi, 2 * math.pi) - math.pi
        reward = -(angle.square() + 0.1 * theta_dot.square() + 0.001 * u.square())
        theta_acc = 3 * self.g / (2 * self.length) * torch.sin(theta) + 3.0 / (self.mass * self.length**2) * u
        theta_dot = (theta_dot + theta_acc * self.dt).clamp(-self.max_speed, self.max_speed)
        state = torch.stack([theta + theta_dot * self.dt, theta_dot], dim=-1)
        return state, reward, torch.zeros_like(theta, dtype=torch.bool)


ENVS = {"CartPole": CartPole, "Pendulum": Pendulum}
