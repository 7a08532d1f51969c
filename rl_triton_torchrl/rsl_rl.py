r"""rsl_rl's PPO (``rsl-rl-lib`` 5.x, Isaac Lab's default) with its returns computed by our GAE kernel.

rsl_rl stores a rollout time-major, ``[T, N, 1]`` (T = ``num_steps_per_env``, N environments), one value per step,
and computes the targets in a Python loop over time, about ten small kernels per step. Its recurrence is GAE with
``done`` both ending the episode and cutting the bootstrap, and the values read one step on:

.. math::

    \delta_t = r_t + \gamma (1 - d_t) V_{t+1} - V_t, \qquad A_t = \delta_t + \gamma \lambda (1 - d_t) A_{t+1},
    \qquad R_t = A_t + V_t,

with :math:`V_T` the critic's value of the observation after the last step, and the advantages then normalised over
the whole batch (or later, per minibatch). :class:`PPO` computes exactly this in one launch of
:func:`rl_triton_torchrl.kernels.gae` in its shifted input mode (``next_state_value=None``,
``last_state_value=V_T``, ``time_dim=0``): it reads the storage's ``rewards``, ``values`` and ``dones`` where they are,
builds no next-value tensor and waits for nothing on the host.

Use it from a training config (rsl_rl resolves ``"module:Class"`` strings)::

    train_cfg["algorithm"]["class_name"] = "rl_triton_torchrl.rsl_rl:PPO"

Needs ``rsl-rl-lib>=5,<6`` (``pip install "rsl-rl-lib>=5,<6"``, or from the clone ``pip install -e ".[rsl-rl]"``);
``import rl_triton_torchrl`` never imports it, only this module does.
"""
from __future__ import annotations

import importlib.metadata

import torch

from .kernels import gae, normalize_

try:
    from rsl_rl.algorithms import PPO as _RslRlPPO
except ImportError as error:  # pragma: no cover - depends on the environment
    raise ImportError("rl_triton_torchrl.rsl_rl needs rsl_rl 5.x: pip install 'rsl-rl-lib>=5,<6' (or the "
                      "extra, from the clone: pip install -e '.[rsl-rl]')") from error

__all__ = ["PPO", "FINAL_OBSERVATIONS"]

RSL_RL_VERSION = importlib.metadata.version("rsl-rl-lib")
if int(RSL_RL_VERSION.split(".")[0]) != 5:  # pragma: no cover - depends on the environment
    raise ImportError(f"rl_triton_torchrl.rsl_rl is written for rsl_rl 5.x (its storage layout, critic and "
                      f"configuration); rsl-rl-lib {RSL_RL_VERSION} is installed: pip install 'rsl-rl-lib>=5,<6'")

# The ``extras`` entry of ``VecEnv.step`` with the observations each environment reached before it was reset (a
# TensorDict of the observation groups, like the observations themselves), read by ``exact_timeout_bootstrap``.
FINAL_OBSERVATIONS = "final_observations"
# rsl_rl's normalisation: (A - mean) / (std + eps), std with Bessel's correction
_EPS = 1e-8


class PPO(_RslRlPPO):
    r"""rsl_rl's ``PPO`` whose ``compute_returns`` runs one fused GAE kernel on the rollout storage.

    Everything but the returns is rsl_rl's own code, so a config switches with one line::

        train_cfg["algorithm"]["class_name"] = "rl_triton_torchrl.rsl_rl:PPO"

    and the extra options below go into the same ``train_cfg["algorithm"]`` dict.

    ``compute_returns(obs)`` gives rsl_rl's numbers to float32 rounding: the critic's value of ``obs`` bootstraps the
    last step, with a recurrent critic's hidden state saved before that call and restored after it (the next rollout
    continues from the state the last step left); ``dones`` end the episode and cut the bootstrap; the storage's
    ``returns`` and ``advantages`` are replaced by the kernel's outputs (new tensors, as rsl_rl replaces
    ``advantages``; the two outputs are ours, so normalising works in place); the advantages are normalised over the
    batch, ``(A - mean) / (std + 1e-8)`` (``kernels.normalize_``, two launches on CUDA), unless
    ``normalize_advantage_per_mini_batch`` leaves that to ``update`` (rsl_rl's code). No call waits for the device. ``dones`` must hold 0 and 1 (as
    ``RolloutStorage`` writes them from bool or 0/1 flags): its uint8 buffer is read as bool without a copy.

    Time-outs (``extras["time_outs"]`` of ``env.step``), two behaviours:

    - default, rsl_rl's own: the reward of a step that timed out gets :math:`\gamma V(s_t)` added, the value of the
      observation *before* the step (``process_env_step``), since the environment has already reset by then and
      the observation reached is gone. Exact only when :math:`V(s_{t+1}) \approx V(s_t)`.
    - ``exact_timeout_bootstrap=True``: it gets :math:`\gamma V(s_{t+1})` instead, the critic's value of the true
      final observation, which the environment reports as ``extras["final_observations"]`` (``FINAL_OBSERVATIONS``):
      a TensorDict of the observation groups, like the observations, whose rows of timed-out environments hold the
      observation reached before the reset (other rows are not read). The critic is evaluated on it with its
      recurrent state saved and restored, as for the last value. An environment that times out without reporting it
      raises a ``KeyError``.

    Args:
        actor, critic, storage: as rsl_rl's ``PPO``; every other argument of rsl_rl's ``PPO`` passes through.

    Keyword Args:
        exact_timeout_bootstrap (bool): bootstrap time-outs from the value of the final observation, see above.
            Defaults to ``False`` (rsl_rl's behaviour).
        cuda_graph (bool): on CUDA, capture the kernel and the normalisation once in a CUDA graph and replay it on
            every call (captured again when the storage, gamma, lambda or the normalisation mode change): a few
            microseconds of host time instead of three launches. The storage's ``returns`` and ``advantages`` are
            then the graph's output tensors, overwritten in place by the next call. Defaults to ``False``.

    Examples:
        >>> from rsl_rl.runners import OnPolicyRunner
        >>> train_cfg["algorithm"]["class_name"] = "rl_triton_torchrl.rsl_rl:PPO"  # doctest: +SKIP
        >>> runner = OnPolicyRunner(env, train_cfg, log_dir=None, device="cuda")  # doctest: +SKIP
        >>> runner.learn(num_learning_iterations=1500)  # doctest: +SKIP
    """

    def __init__(self, actor, critic, storage, *args, exact_timeout_bootstrap: bool = False,
                 cuda_graph: bool = False, **kwargs) -> None:
        super().__init__(actor, critic, storage, *args, **kwargs)
        self.exact_timeout_bootstrap = bool(exact_timeout_bootstrap)
        if cuda_graph and torch.device(self.device).type != "cuda":
            raise ValueError(f"cuda_graph=True needs a CUDA device, got device={self.device!r}")
        self._graph = _ReturnsGraph() if cuda_graph else None

    def compute_returns(self, obs) -> None:
        """Targets of the stored rollout: ``storage.returns`` and ``storage.advantages`` (normalised unless per
        minibatch), ``obs`` the observations after the last step."""
        st = self.storage
        last_value = self._value_keeping_state(obs)
        normalize = not self.normalize_advantage_per_mini_batch
        if self._graph is not None:
            st.advantages, st.returns = self._graph(st, last_value, float(self.gamma), float(self.lam), normalize)
        else:
            st.advantages, st.returns = _targets(st, last_value, float(self.gamma), float(self.lam), normalize)

    def process_env_step(self, obs, rewards, dones, extras) -> None:
        """rsl_rl's ``process_env_step``; with ``exact_timeout_bootstrap`` the time-outs are bootstrapped from the
        value of ``extras["final_observations"]`` instead of the value before the step."""
        if self.exact_timeout_bootstrap and "time_outs" in extras:
            if FINAL_OBSERVATIONS not in extras:
                raise KeyError(f"exact_timeout_bootstrap=True: the environment reported time_outs but no "
                               f"extras[{FINAL_OBSERVATIONS!r}] (the observations reached before the reset)")
            final_value = self._value_keeping_state(extras[FINAL_OBSERVATIONS].to(self.device))
            time_outs = extras["time_outs"].to(self.device).bool().reshape(final_value.shape)
            bootstrap = torch.where(time_outs, self.gamma * final_value, 0.0).reshape(rewards.shape)
            rewards = rewards + bootstrap.to(rewards.dtype)
            extras = {key: value for key, value in extras.items() if key != "time_outs"}  # not bootstrapped again
        super().process_env_step(obs, rewards, dones, extras)

    def _value_keeping_state(self, obs) -> torch.Tensor:
        """The critic's value of ``obs``, a recurrent critic's hidden state left as it was before the call."""
        state = self.critic.get_hidden_state()
        value = self.critic(obs).detach()
        self.critic.reset(hidden_state=state)
        return value


def _done_flags(dones: torch.Tensor) -> torch.Tensor:
    """The storage's ``dones`` as a bool tensor: uint8 0/1 reinterpreted in place (no copy), bool as is."""
    if dones.dtype == torch.bool:
        return dones
    if dones.dtype == torch.uint8:
        return dones.view(torch.bool)
    return dones != 0


def _targets(st, last_value: torch.Tensor, gamma: float, lmbda: float, normalize: bool):
    """(advantages, returns) of rsl_rl's ``RolloutStorage`` ``st``: one GAE launch, then the batch normalisation
    in place on our own output (``kernels.normalize_``: two launches on CUDA)."""
    advantages, returns = gae(st.rewards, st.values, None, _done_flags(st.dones), gamma=gamma, lmbda=lmbda,
                              time_dim=0, last_state_value=last_value.to(st.values.dtype))
    if normalize:
        normalize_(advantages, _EPS)
    return advantages, returns


class _ReturnsGraph:
    """``_targets`` captured in a CUDA graph, replayed while its inputs stay the same buffers.

    The graph reads the storage's ``rewards``, ``values`` and ``dones`` in place (RolloutStorage allocates them once
    and writes each step into them) and a static copy of the last value; its outputs are static tensors that every
    replay overwrites. A different storage, shape, gamma, lambda or normalisation mode captures a new graph.
    """

    def __init__(self):
        self.key = None
        self.graph = self.last_value = self.outputs = None

    def __deepcopy__(self, memo):
        """A copy captures its own graph on its first call (a CUDA graph cannot be copied, and the copy's storage
        is another one anyway)."""
        return _ReturnsGraph()

    def __call__(self, st, last_value: torch.Tensor, gamma: float, lmbda: float, normalize: bool):
        key = (st.rewards.data_ptr(), st.values.data_ptr(), st.dones.data_ptr(), tuple(st.values.shape),
               st.values.dtype, st.dones.dtype, tuple(last_value.shape), gamma, lmbda, normalize,
               torch.cuda.current_device())
        if key != self.key:
            self._capture(st, last_value, gamma, lmbda, normalize)
            self.key = key
        else:
            self.last_value.copy_(last_value)
        self.graph.replay()
        return self.outputs

    def _capture(self, st, last_value, gamma, lmbda, normalize):
        self.graph = self.outputs = None  # the previous graph's memory is released first
        self.last_value = last_value.detach().to(st.values.dtype).clone()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):  # compiles the kernel and builds its launch plan outside the capture
            for _ in range(2):
                _targets(st, self.last_value, gamma, lmbda, normalize)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            outputs = _targets(st, self.last_value, gamma, lmbda, normalize)
        self.graph, self.outputs = graph, outputs
