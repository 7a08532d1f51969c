r"""TensorDict modules, in TorchRL's style, for credit-assignment quantities TorchRL has no module for.

- :class:`Retrace`: Retrace(:math:`\lambda`) Q targets and advantages of a rollout (``kernels.retrace``, generic
  form, or ``kernels.retrace_discrete``).
- :class:`EligibilityTraces`: accumulating traces of a per-step tensor (``kernels.eligibility_traces``).
- :class:`EpisodicPrefixSum`: running per-episode sums of rollout entries, e.g. the return and the length of the
  episode so far (``kernels.episodic_prefix_sum``).

The recurrences are written once, in the docstrings of those kernel modules; here is only the TorchRL glue.

Conventions shared by the three modules:

- Rollouts are TensorDicts of batch size ``[*B, T]`` in TorchRL's layout: ``("next", "reward")``,
  ``("next", "done")`` and ``("next", "terminated")`` of shape ``[*B, T, 1]``. The time dimension is
  ``time_dim`` if given (an index into the batch dimensions), else the batch dimension named ``"time"`` if the
  tensordict has names, else the last batch dimension (TorchRL's rule).
- Entries are matched to the float input they go with without copies: TorchRL's trailing singleton is dropped where
  the float input has no trailing dim, missing trailing dims are added, and singletons are expanded with stride 0
  (``done`` ``[*B, T, 1]`` feeds traces ``[*B, T, F]`` as ``done.expand_as(x)``).
- Scalars (``gamma``, ``lmbda``, ``c_bar``) are buffers, as in TorchRL's value estimators: they follow ``.to()``
  and live in the state_dict.
- The path is the kernels' ``"auto"`` backend: Triton on CUDA tensors, the torch path elsewhere;
  ``$RL_TRITON_TORCHRL_BACKEND`` (``"torch"``/``"triton"``) overrides it.
- ``carry_state=True`` keeps the final state of every recurrence (one per output key, detached, in a non-persistent
  buffer: not in the state_dict) and feeds it as ``initial_state`` to the next call, so that consecutive pieces of
  one rollout give exactly what the uncut rollout gives. :class:`EligibilityTraces` and :class:`EpisodicPrefixSum`
  run forward in time: feed consecutive collector batches in order. :class:`Retrace` runs backwards: feed the pieces
  of a long rollout from its end to its start. ``reset_state()`` forgets the state. A call whose state shape (the
  batch size without the time dimension, plus the feature dims) differs from the carried one raises ``ValueError``
  (a different batch shape is a different stream; continuing or silently restarting would both be wrong): call
  ``reset_state()`` first.
"""
from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass

import torch
from tensordict import TensorDictBase
from tensordict.nn import TensorDictModuleBase, composite_lp_aggregate
from tensordict.utils import NestedKey, unravel_key

from ._checks import Described, check_coefficient, keyed_error

# made once, outside forward: torch.compile (torch 2.11's Dynamo) cannot trace building a str subclass
_LENGTHS = Described("the lengths")
from .kernels import InputError, eligibility_traces, episodic_prefix_sum, retrace, retrace_discrete
from .kernels.prefix_sum import check_reset

__all__ = ["Retrace", "EligibilityTraces", "EpisodicPrefixSum"]


def _next(key: NestedKey) -> NestedKey:
    return unravel_key(("next", key))


def _state_shape(shape: torch.Size, time_dim: int) -> torch.Size:
    return shape[:time_dim] + shape[time_dim + 1 :]


class _RolloutModule(TensorDictModuleBase):
    """Time-dimension resolution, key look-ups and the carried states shared by the modules here."""

    def __init__(self, *, time_dim: int | None, carry_state: bool, n_states: int):
        super().__init__()
        if time_dim is not None and (isinstance(time_dim, bool) or not isinstance(time_dim, int)):
            raise TypeError(f"{type(self).__name__}: time_dim must be an int or None, got {type(time_dim).__name__}")
        self.time_dim = time_dim
        self.carry_state = bool(carry_state)
        self._n_states = n_states
        for i in range(n_states):
            self.register_buffer(f"_state_{i}", None, persistent=False)

    def _state_keys(self) -> list[NestedKey]:
        """The output key that names each carried state."""
        raise NotImplementedError

    def forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Writes the module's outputs into ``tensordict`` (batch size ``[*B, T]``) and returns it.

        An ``InputError`` or ``TypeError`` of the kernel names the tensordict entry that holds the bad argument:
        ``EligibilityTraces: ('next', 'done'): done must be a bool tensor ...``.
        """
        try:
            return self._forward(tensordict)
        except (InputError, TypeError) as err:
            keyed = keyed_error(type(self).__name__, err, self._argument_keys())
            if keyed is None:
                raise
            raise keyed from None

    def _forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        raise NotImplementedError

    def _argument_keys(self) -> dict:
        """Kernel argument name -> the tensordict entry it is read from (for error messages)."""
        return {}

    @property
    def carried_state(self) -> dict:
        """The states carried into the next call, by output key (``None`` where nothing is carried yet)."""
        return {key: getattr(self, f"_state_{i}") for i, key in enumerate(self._state_keys())}

    def reset_state(self) -> None:
        """Forgets the carried states: the next call starts from zero states, as if a new rollout began."""
        for i in range(self._n_states):
            setattr(self, f"_state_{i}", None)

    def _initial_states(self, shapes: list[torch.Size], time_dim: int) -> list[torch.Tensor | None]:
        """The carried states for inputs of ``shapes``; raises if one does not fit (checked before any kernel runs,
        so a refused call changes nothing)."""
        states = [None] * self._n_states
        if not self.carry_state:
            return states
        for i, (key, shape) in enumerate(zip(self._state_keys(), shapes)):
            state = getattr(self, f"_state_{i}")
            if state is None:
                continue
            expected = _state_shape(shape, time_dim)
            if state.shape != expected:
                raise InputError(
                    f"{type(self).__name__}: the state carried for {key!r} has shape {tuple(state.shape)}, but this "
                    f"batch needs {tuple(expected)} (its input shape {tuple(shape)} without time_dim {time_dim}). "
                    "A different batch shape is a different stream: call reset_state() before feeding it"
                )
            states[i] = state
        return states

    def _keep_state(self, i: int, state: torch.Tensor) -> None:
        setattr(self, f"_state_{i}", state.detach())

    def _resolve_time_dim(self, tensordict: TensorDictBase) -> int:
        """Non-negative index of the time dimension among the batch dimensions (TorchRL's rule)."""
        ndim = tensordict.batch_dims
        name = type(self).__name__
        if ndim == 0:
            raise InputError(f"{name}: the tensordict has batch size [] but needs a time dimension ([*B, T])")
        if self.time_dim is not None:
            if not -ndim <= self.time_dim < ndim:
                raise InputError(f"{name}: time_dim={self.time_dim} is out of range for a tensordict of batch size "
                                 f"{list(tensordict.batch_size)}")
            return self.time_dim % ndim
        if "time" in tensordict.names:
            return tensordict.names.index("time")
        return ndim - 1

    def _get(self, tensordict: TensorDictBase, key: NestedKey, hint: str = "") -> torch.Tensor:
        value = tensordict.get(key, None)
        if value is None:
            raise KeyError(f"{type(self).__name__}: the tensordict has no {key!r} entry{hint}")
        return value

    def _fit(self, key: NestedKey, x: torch.Tensor, shape: torch.Size) -> torch.Tensor:
        """The entry ``x`` (``[*B, T, *F_x]``) as a view of ``shape`` (``[*B, T, *F]``), without a copy."""
        if x.shape == shape:
            return x
        view = x
        if view.dim() == len(shape) + 1 and view.shape[-1] == 1:
            view = view.squeeze(-1)  # TorchRL's [*B, T, 1] for a [*B, T] input
        elif view.dim() < len(shape):
            view = view[(...,) + (None,) * (len(shape) - view.dim())]
        try:
            return view.expand(shape)
        except RuntimeError:
            raise InputError(f"{type(self).__name__}: {key!r} has shape {tuple(x.shape)}, which does not fit the "
                             f"shape {tuple(shape)} of the input it goes with") from None


class _KeyedRolloutModule(_RolloutModule):
    """TorchRL's ``_AcceptedKeys`` / ``set_keys`` / ``tensor_keys`` pattern (ValueEstimatorBase)."""

    @dataclass
    class _AcceptedKeys:
        pass

    default_keys = _AcceptedKeys

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._tensor_keys = None

    @property
    def tensor_keys(self):
        """The tensordict keys in use (an ``_AcceptedKeys`` instance); change them with :meth:`set_keys`."""
        if self._tensor_keys is None:
            self.set_keys()
        return self._tensor_keys

    def set_keys(self, **kwargs) -> None:
        """Sets tensordict key names, e.g. ``set_keys(reward="rew", value_target=("q", "target"))``.

        Raises:
            KeyError: for a name that is not a field of ``_AcceptedKeys``.
            ValueError: for a key that is not a string or a tuple of strings.
        """
        accepted = [f.name for f in dataclasses.fields(self._AcceptedKeys)]
        for name, key in kwargs.items():
            if name not in accepted:
                raise KeyError(f"{name!r} is not an accepted tensordict key of {type(self).__name__}; accepted: "
                               f"{', '.join(accepted)}")
            if not isinstance(key, (str, tuple)):
                raise ValueError(f"{type(self).__name__}: the key for {name!r} must be a NestedKey (a str or a tuple "
                                 f"of str), got {type(key).__name__}")
        current = {} if self._tensor_keys is None else dataclasses.asdict(self._tensor_keys)
        current.update({name: unravel_key(key) for name, key in kwargs.items()})
        self._tensor_keys = self._AcceptedKeys(**current)

    def _get(self, tensordict, key, hint=" (rename the key with set_keys(...))"):
        return super()._get(tensordict, key, hint)


def _buffer(value, device) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    return torch.tensor(float(value), device=device)  # gamma=1 as a float buffer (the kernels take float ones)


class Retrace(_KeyedRolloutModule):
    r"""Retrace(:math:`\lambda`) Q targets and advantages of a rollout (Munos et al., 2016).

    Writes :math:`Q^{ret}_t` (``"value_target"``) and :math:`Q^{ret}_t - Q(s_t, a_t)` (``"advantage"``) into a
    rollout of batch size ``[*B, T]``; the recursion, its traces :math:`c_t = \lambda \min(\bar c, \pi/\mu)` and its
    handling of terminations and truncations are in :mod:`rl_triton_torchrl.kernels.retrace`.

    The form is chosen from the keys present (the generic form wins when both are complete):

    - generic (any action space): ``"state_action_value"`` :math:`Q(s_t, a_t)` and
      ``("next", "expected_state_value")`` :math:`\mathbb{E}_\pi Q(s'_t, \cdot)`, both ``[*B, T, *F]`` (the output
      shape), and ``"target_log_prob"`` :math:`\log\pi(a_t|s_t)`, ``[*B, T]`` or ``[*B, T, *F]``. Runs
      :func:`~rl_triton_torchrl.kernels.retrace`.
    - discrete: ``"action_value"`` and ``("next", "action_value")`` :math:`Q(\cdot, \cdot)` and ``"target_probs"``
      and ``("next", "target_probs")`` :math:`\pi(\cdot|\cdot)`, all ``[*B, T, A]`` (actions last), and ``"action"``,
      an index ``[*B, T]`` (or ``[*B, T, 1]``) or one-hot ``[*B, T, A]`` (read with argmax). Runs
      :func:`~rl_triton_torchrl.kernels.retrace_discrete`; outputs are ``[*B, T, 1]``.

    Both forms also read the behaviour policy's log-probability of the taken action (TorchRL's
    ``"sample_log_prob"`` key, whose default name follows TorchRL: ``"action_log_prob"`` unless
    ``tensordict.nn.composite_lp_aggregate()`` is set) or, where that is absent, its probability (``"sample_prob"``),
    ``[*B, T]``; and ``("next", "reward")``, ``("next", "done")`` and ``("next", "terminated")`` (``done`` when
    absent), ``[*B, T, 1]``. A missing key raises a ``KeyError`` that names this module and every missing key
    (those of both forms when neither is complete).

    Keyword Args:
        gamma (float): discount.
        lmbda (float): trace decay :math:`\lambda` in [0, 1]. Defaults to ``1.0``.
        c_bar (float): clip :math:`\bar c \geq 0` of the importance ratio in the traces. Defaults to ``1.0``.
        time_dim (int, optional): the time dimension among the tensordict's batch dims. Defaults to the one named
            ``"time"``, else the last.
        carry_state (bool): keep the final state :math:`c_0 (Q^{ret}_0 - Q(s_0, a_0))` of each call and feed it to
            the next one as the correction entering the last step. The recursion runs backwards in time, so this
            is for a long rollout processed in pieces from its end backwards (call on steps ``[k:T]``, then on
            ``[0:k]``); pieces fed in collection order would be wrong, since the steps after a collector batch are
            not collected yet. Defaults to ``False``.
        differentiable (bool): if ``False``, the targets are computed under ``torch.no_grad()`` (targets of a Q
            loss carry no gradient). Defaults to ``False``.
        device (torch.device, optional): device of the buffers. Defaults to ``torch.get_default_device()``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from rl_triton_torchrl.modules import Retrace
        >>> B, T, A = 2, 5, 3
        >>> td = TensorDict({
        ...     "action_value": torch.zeros(B, T, A),
        ...     "target_probs": torch.full((B, T, A), 1 / A),
        ...     "action": torch.zeros(B, T, dtype=torch.int64),
        ...     "action_log_prob": torch.full((B, T), 1 / A).log(),
        ...     "next": {
        ...         "action_value": torch.zeros(B, T, A),
        ...         "target_probs": torch.full((B, T, A), 1 / A),
        ...         "reward": torch.ones(B, T, 1),
        ...         "done": torch.zeros(B, T, 1, dtype=torch.bool),
        ...         "terminated": torch.zeros(B, T, 1, dtype=torch.bool),
        ...     },
        ... }, batch_size=[B, T])
        >>> td = Retrace(gamma=0.5, lmbda=1.0)(td)
        >>> td["value_target"][0, :, 0]
        tensor([1.9375, 1.8750, 1.7500, 1.5000, 1.0000])
    """

    @dataclass
    class _AcceptedKeys:
        r"""Maintains default values for all configurable tensordict keys.

        This class defines which tensordict keys can be set using ``.set_keys(key_name=key_value)`` and their
        default values. Keys read under ``"next"`` are given without the ``"next"`` prefix, as in TorchRL.

        Attributes:
            state_action_value (NestedKey): :math:`Q(s_t, a_t)` of the taken action (generic form). Defaults to
                ``"state_action_value"``.
            expected_state_value (NestedKey): :math:`\mathbb{E}_\pi Q(s'_t, \cdot)`, read under ``"next"`` (generic
                form). Defaults to ``"expected_state_value"``.
            target_log_prob (NestedKey): :math:`\log\pi(a_t|s_t)` of the taken action under the target policy
                (generic form). Defaults to ``"target_log_prob"``.
            action_value (NestedKey): :math:`Q` over the actions, read at the root and under ``"next"`` (discrete
                form). Defaults to ``"action_value"``.
            action (NestedKey): the taken action, index or one-hot (discrete form). Defaults to ``"action"``.
            target_probs (NestedKey): :math:`\pi` over the actions, read at the root and under ``"next"`` (discrete
                form). Defaults to ``"target_probs"``.
            sample_log_prob (NestedKey): behaviour log-probability of the taken action. Defaults to
                ``"sample_log_prob"`` when :func:`~tensordict.nn.composite_lp_aggregate` returns ``True``,
                ``"action_log_prob"`` otherwise (TorchRL's rule).
            sample_prob (NestedKey): behaviour probability of the taken action, read where ``sample_log_prob`` is
                absent. Defaults to ``"sample_prob"``.
            reward (NestedKey): the reward, read under ``"next"``. Defaults to ``"reward"``.
            done (NestedKey): the done flag, read under ``"next"``. Defaults to ``"done"``.
            terminated (NestedKey): the terminated flag, read under ``"next"``; ``done`` where absent. Defaults to
                ``"terminated"``.
            value_target (NestedKey): where :math:`Q^{ret}_t` is written. Defaults to ``"value_target"``.
            advantage (NestedKey): where :math:`Q^{ret}_t - Q(s_t, a_t)` is written. Defaults to ``"advantage"``.
        """

        state_action_value: NestedKey = "state_action_value"
        expected_state_value: NestedKey = "expected_state_value"
        target_log_prob: NestedKey = "target_log_prob"
        action_value: NestedKey = "action_value"
        action: NestedKey = "action"
        target_probs: NestedKey = "target_probs"
        sample_log_prob: NestedKey | None = None
        sample_prob: NestedKey = "sample_prob"
        reward: NestedKey = "reward"
        done: NestedKey = "done"
        terminated: NestedKey = "terminated"
        value_target: NestedKey = "value_target"
        advantage: NestedKey = "advantage"

        def __post_init__(self):
            if self.sample_log_prob is None:
                self.sample_log_prob = "sample_log_prob" if composite_lp_aggregate(nowarn=True) else "action_log_prob"

    default_keys = _AcceptedKeys

    def __init__(
        self,
        *,
        gamma: float | torch.Tensor,
        lmbda: float | torch.Tensor = 1.0,
        c_bar: float | torch.Tensor = 1.0,
        time_dim: int | None = None,
        carry_state: bool = False,
        differentiable: bool = False,
        device: torch.device | None = None,
    ):
        super().__init__(time_dim=time_dim, carry_state=carry_state, n_states=1)
        for name, value, high in (("gamma", gamma, 1.0), ("lmbda", lmbda, 1.0), ("c_bar", c_bar, None)):
            check_coefficient("Retrace", name, value, 0.0, high)
        device = torch.get_default_device() if device is None else device
        self.register_buffer("gamma", _buffer(gamma, device))
        self.register_buffer("lmbda", _buffer(lmbda, device))
        self.register_buffer("c_bar", _buffer(c_bar, device))
        self.differentiable = differentiable

    def _generic_keys(self) -> list[NestedKey]:
        k = self.tensor_keys
        return [k.state_action_value, _next(k.expected_state_value), k.target_log_prob]

    def _discrete_keys(self) -> list[NestedKey]:
        k = self.tensor_keys
        return [k.action_value, _next(k.action_value), k.action, k.target_probs, _next(k.target_probs)]

    @property
    def in_keys(self) -> list[NestedKey]:
        """Every key this module may read (both forms; a rollout needs one form's keys)."""
        k = self.tensor_keys
        return [*self._generic_keys(), *self._discrete_keys(), k.sample_log_prob, k.sample_prob, _next(k.reward),
                _next(k.done), _next(k.terminated)]

    @property
    def out_keys(self) -> list[NestedKey]:
        return [self.tensor_keys.value_target, self.tensor_keys.advantage]

    def _state_keys(self):
        return [self.tensor_keys.value_target]

    def _form(self, tensordict: TensorDictBase) -> str:
        """``"generic"`` or ``"discrete"``, from the keys present; a KeyError naming the missing keys otherwise."""
        present = tensordict.keys(include_nested=True)
        missing = {form: [key for key in keys if key not in present]
                   for form, keys in (("generic", self._generic_keys()), ("discrete", self._discrete_keys()))}
        for form in ("generic", "discrete"):
            if not missing[form]:
                return form
        # name the keys of the nearer form first, and the other form's too
        near, far = sorted(missing, key=lambda f: len(missing[f]))
        raise KeyError(
            f"Retrace: the tensordict lacks {', '.join(map(repr, missing[near]))} for the {near} form (and "
            f"{', '.join(map(repr, missing[far]))} for the {far} form); provide one complete form, or rename the keys "
            "with set_keys(...)"
        )

    def _argument_keys(self) -> dict:
        k = self.tensor_keys
        return {"q_taken": k.state_action_value, "next_expected_q": _next(k.expected_state_value),
                "log_ratio": Described(f"{k.target_log_prob!r} minus {k.sample_log_prob!r} (or the log of "
                                       f"{k.sample_prob!r})"),
                "pi": k.target_probs, "next_pi": _next(k.target_probs), "q_values": k.action_value,
                "next_q_values": _next(k.action_value), "action": k.action, "behavior_prob": k.sample_prob,
                "behavior_log_prob": k.sample_log_prob, "reward": _next(k.reward), "done": _next(k.done),
                "terminated": _next(k.terminated)}

    def _forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Writes the Retrace targets and advantages into ``tensordict`` (batch size ``[*B, T]``) and returns it."""
        keys = self.tensor_keys
        form = self._form(tensordict)
        time_dim = self._resolve_time_dim(tensordict)
        reward = self._get(tensordict, _next(keys.reward))
        done = self._get(tensordict, _next(keys.done))
        terminated = tensordict.get(_next(keys.terminated), done)
        log_mu, mu = tensordict.get(keys.sample_log_prob, None), tensordict.get(keys.sample_prob, None)
        if log_mu is None and mu is None:
            raise KeyError(f"Retrace: the tensordict has neither a {keys.sample_log_prob!r} nor a {keys.sample_prob!r} "
                           "entry (the behaviour log-probability or probability of the taken action); rename the "
                           "keys with set_keys(...)")
        coefs = {"gamma": self.gamma, "lmbda": self.lmbda, "c_bar": self.c_bar, "time_dim": time_dim}
        grad = contextlib.nullcontext() if self.differentiable else torch.no_grad()
        with grad:
            if form == "generic":
                q = tensordict.get(keys.state_action_value)
                shape = q.shape
                (initial_state,) = self._initial_states([shape], time_dim)
                next_q = self._fit(_next(keys.expected_state_value), tensordict.get(_next(keys.expected_state_value)),
                                   shape)
                log_pi = self._fit(keys.target_log_prob, tensordict.get(keys.target_log_prob), shape)
                log_ratio = log_pi - (self._fit(keys.sample_log_prob, log_mu, shape) if log_mu is not None
                                      else self._fit(keys.sample_prob, mu, shape).log())
                out = retrace(
                    q, next_q, self._fit(_next(keys.reward), reward, shape), self._fit(_next(keys.done), done, shape),
                    self._fit(_next(keys.terminated), terminated, shape), log_ratio=log_ratio, **coefs,
                    initial_state=initial_state, output_final_state=self.carry_state,
                )
                value_target, advantage = out[0], out[1]
            else:
                q_values = tensordict.get(keys.action_value)
                shape = q_values.shape[:-1]  # one step: [*B, T] (the action dim dropped)
                (initial_state,) = self._initial_states([shape], time_dim)
                action = self._action_index(tensordict.get(keys.action), q_values.shape)
                behaviour = ({"behavior_log_prob": self._fit(keys.sample_log_prob, log_mu, shape)} if log_mu is not None
                             else {"behavior_prob": self._fit(keys.sample_prob, mu, shape)})
                out = retrace_discrete(
                    tensordict.get(keys.target_probs), action, q_values, tensordict.get(_next(keys.target_probs)),
                    tensordict.get(_next(keys.action_value)), self._fit(_next(keys.reward), reward, shape),
                    self._fit(_next(keys.done), done, shape), self._fit(_next(keys.terminated), terminated, shape),
                    **behaviour, **coefs, initial_state=initial_state, output_final_state=self.carry_state,
                )
                value_target, advantage = out[0].unsqueeze(-1), out[1].unsqueeze(-1)
        if self.carry_state:
            self._keep_state(0, out[2])
        tensordict.set(keys.value_target, value_target)
        tensordict.set(keys.advantage, advantage)
        return tensordict

    def _action_index(self, action: torch.Tensor, q_shape: torch.Size) -> torch.Tensor:
        """The int64 index ``[*B, T]`` of the taken action, from an index or a one-hot entry."""
        key = self.tensor_keys.action
        shape, n_actions = q_shape[:-1], q_shape[-1]
        if action.shape == q_shape:  # one-hot (with one action, index 0 read either way)
            hot = action != 0
            if action.device.type == "cpu" and not (hot.sum(-1) == 1).all():
                raise InputError(f"Retrace: {key!r} has the shape {tuple(q_shape)} of the action values, so it is "
                                 "read as one-hot, but some of its rows do not hold exactly one nonzero")
            return hot.to(torch.int8).argmax(-1)
        if action.shape == (*shape, 1):
            action = action.squeeze(-1)
        if action.shape != shape:
            raise InputError(f"Retrace: {key!r} has shape {tuple(action.shape)}; expected an index {tuple(shape)} "
                             f"or a one-hot {tuple(q_shape)} (the action values have {n_actions} actions)")
        if action.is_floating_point():
            raise TypeError(f"Retrace: {key!r} is an index tensor of dtype {action.dtype}; expected an integer dtype")
        return action.to(torch.int64)


class EligibilityTraces(_KeyedRolloutModule):
    r"""Accumulating eligibility traces of a per-step tensor, forward in time.

    Writes :math:`e_t = \gamma\lambda\,(1 - \mathrm{done}_{t-1})\, e_{t-1} + x_t` (the recursion is in
    :mod:`rl_triton_torchrl.kernels.eligibility_traces`) for an entry ``x`` of any shape ``[*B, T, *F]`` (e.g. the
    per-parameter gradient of the value at every step), elementwise over ``*F``. ``("next", "done")``
    (``[*B, T, 1]``) restarts the traces at the step after an episode's last one; it is expanded over ``*F`` with
    stride 0. The traces have the shape and dtype of ``x``.

    Keyword Args:
        gamma (float): discount.
        lmbda (float): trace decay :math:`\lambda`.
        time_dim (int, optional): the time dimension among the tensordict's batch dims. Defaults to the one named
            ``"time"``, else the last.
        carry_state (bool): keep the last trace of each call, :math:`(1 - \mathrm{done}_{T-1}) e_{T-1}`, and
            continue from it in the next call: consecutive collector batches (in collection order) then give the
            traces of the uncut rollout. Defaults to ``False``.
        device (torch.device, optional): device of the buffers. Defaults to ``torch.get_default_device()``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from rl_triton_torchrl.modules import EligibilityTraces
        >>> td = TensorDict({
        ...     "trace_input": torch.ones(1, 4, 2),
        ...     "next": {"done": torch.tensor([False, True, False, False]).view(1, 4, 1)},
        ... }, batch_size=[1, 4])
        >>> EligibilityTraces(gamma=0.5, lmbda=1.0)(td)["eligibility_trace"][0, :, 0]
        tensor([1.0000, 1.5000, 1.0000, 1.5000])
    """

    @dataclass
    class _AcceptedKeys:
        """Maintains default values for all configurable tensordict keys.

        This class defines which tensordict keys can be set using ``.set_keys(key_name=key_value)`` and their
        default values.

        Attributes:
            trace_input (NestedKey): the per-step increments :math:`x_t`. Defaults to ``"trace_input"``.
            done (NestedKey): the done flag, read under ``"next"``. Defaults to ``"done"``.
            eligibility_trace (NestedKey): where the traces are written. Defaults to ``"eligibility_trace"``.
        """

        trace_input: NestedKey = "trace_input"
        done: NestedKey = "done"
        eligibility_trace: NestedKey = "eligibility_trace"

    default_keys = _AcceptedKeys

    def __init__(
        self,
        *,
        gamma: float | torch.Tensor,
        lmbda: float | torch.Tensor,
        time_dim: int | None = None,
        carry_state: bool = False,
        device: torch.device | None = None,
    ):
        super().__init__(time_dim=time_dim, carry_state=carry_state, n_states=1)
        check_coefficient("EligibilityTraces", "gamma", gamma)
        check_coefficient("EligibilityTraces", "lmbda", lmbda)
        device = torch.get_default_device() if device is None else device
        self.register_buffer("gamma", _buffer(gamma, device))
        self.register_buffer("lmbda", _buffer(lmbda, device))

    @property
    def in_keys(self) -> list[NestedKey]:
        return [self.tensor_keys.trace_input, _next(self.tensor_keys.done)]

    @property
    def out_keys(self) -> list[NestedKey]:
        return [self.tensor_keys.eligibility_trace]

    def _state_keys(self):
        return [self.tensor_keys.eligibility_trace]

    def _argument_keys(self) -> dict:
        return {"x": self.tensor_keys.trace_input, "done": _next(self.tensor_keys.done)}

    def _forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Writes the traces into ``tensordict`` (batch size ``[*B, T]``) and returns it."""
        keys = self.tensor_keys
        x = self._get(tensordict, keys.trace_input)
        done = self._fit(_next(keys.done), self._get(tensordict, _next(keys.done)), x.shape)
        time_dim = self._resolve_time_dim(tensordict)
        (initial_state,) = self._initial_states([x.shape], time_dim)
        out = eligibility_traces(x, done, gamma=self.gamma, lmbda=self.lmbda, time_dim=time_dim,
                                 initial_state=initial_state, output_final_state=self.carry_state)
        if self.carry_state:
            out, state = out
            self._keep_state(0, state)
        tensordict.set(keys.eligibility_trace, out)
        return tensordict


class EpisodicPrefixSum(_RolloutModule):
    r"""Running sums of rollout entries within each episode: the return so far, the length so far.

    For every pair ``in_key -> out_key`` writes :math:`S_t = (1 - \mathrm{reset}_t)\, S_{t-1} + x_t`, the sum of
    ``x`` since the episode began (the recursion is in :mod:`rl_triton_torchrl.kernels.prefix_sum`), in the shape and
    dtype of ``x`` (``[*B, T, *F]``; the boundary flag is expanded over ``*F`` with stride 0). With ``length_key`` it
    also writes the number of steps since the episode began, counting the current one (an int64 ``[*B, T, 1]``
    like TorchRL's ``step_count``, summed from ones in float64: exact up to :math:`2^{53}` steps).

    Args:
        in_keys (list of NestedKey, optional): the entries to sum. Defaults to ``[("next", "reward")]``.
        out_keys (list of NestedKey, optional): where their sums go, one per in_key; required with ``in_keys``.
            Defaults to ``["episode_return_so_far"]``.

    Keyword Args:
        length_key (NestedKey, optional): where the episode length so far goes; ``None`` for none. Defaults to
            ``"episode_length_so_far"``.
        reset (str): ``"after_done"`` (the boundary flag marks the last step of an episode, TorchRL's ``done``) or
            ``"at_start"`` (it marks the first step, TorchRL's ``is_init`` from ``InitTracker``). Anything else
            raises ``ValueError``. Defaults to ``"after_done"``.
        boundary_key (NestedKey, optional): the boundary flag. Defaults to ``("next", "done")`` for
            ``"after_done"`` and ``"is_init"`` for ``"at_start"``.
        time_dim (int, optional): the time dimension among the tensordict's batch dims. Defaults to the one named
            ``"time"``, else the last.
        carry_state (bool): keep the sums at the end of each call (zeroed where the last step ends an episode,
            under ``"after_done"``) and continue from them in the next call: consecutive collector batches (in
            collection order) then give the sums of the uncut rollout. Defaults to ``False``.

    The module's ``in_keys`` are the summed keys followed by ``boundary_key``; its ``out_keys`` the sums' keys
    followed by ``length_key``.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from rl_triton_torchrl.modules import EpisodicPrefixSum
        >>> td = TensorDict({"next": {
        ...     "reward": torch.ones(1, 5, 1),
        ...     "done": torch.tensor([False, True, False, False, True]).view(1, 5, 1),
        ... }}, batch_size=[1, 5])
        >>> td = EpisodicPrefixSum()(td)
        >>> td["episode_return_so_far"][0, :, 0]
        tensor([1., 2., 1., 2., 3.])
        >>> td["episode_length_so_far"][0, :, 0]
        tensor([1, 2, 1, 2, 3])
    """

    def __init__(
        self,
        in_keys: list[NestedKey] | None = None,
        out_keys: list[NestedKey] | None = None,
        *,
        length_key: NestedKey | None = "episode_length_so_far",
        reset: str = "after_done",
        boundary_key: NestedKey | None = None,
        time_dim: int | None = None,
        carry_state: bool = False,
    ):
        if in_keys is None:
            if out_keys is not None:
                raise ValueError("EpisodicPrefixSum: out_keys were given without in_keys")
            in_keys, out_keys = [("next", "reward")], ["episode_return_so_far"]
        elif out_keys is None:
            raise ValueError("EpisodicPrefixSum: in_keys need out_keys, one per in_key")
        in_keys, out_keys = [unravel_key(k) for k in in_keys], [unravel_key(k) for k in out_keys]
        if len(in_keys) != len(out_keys):
            raise ValueError(f"EpisodicPrefixSum: {len(in_keys)} in_keys but {len(out_keys)} out_keys; give one "
                             "out_key per in_key")
        if not in_keys and length_key is None:
            raise ValueError("EpisodicPrefixSum: nothing to compute (no in_keys and length_key=None)")
        check_reset(reset)
        if boundary_key is None:
            boundary_key = ("next", "done") if reset == "after_done" else "is_init"
        length_keys = [] if length_key is None else [unravel_key(length_key)]
        super().__init__(time_dim=time_dim, carry_state=carry_state, n_states=len(out_keys) + len(length_keys))
        self.reset = reset
        self.boundary_key = unravel_key(boundary_key)
        self.length_key = length_keys[0] if length_keys else None
        self.sum_keys = list(zip(in_keys, out_keys))
        self.in_keys = [*in_keys, self.boundary_key]
        self.out_keys = [*out_keys, *length_keys]

    def _state_keys(self):
        return list(self.out_keys)

    def _argument_keys(self) -> dict:
        return {"boundary": self.boundary_key, "x": self._summed_key}

    _summed_key = None  # the in_key being summed (for error messages)

    def _forward(self, tensordict: TensorDictBase) -> TensorDictBase:
        """Writes the sums (and the lengths) into ``tensordict`` (batch size ``[*B, T]``) and returns it."""
        boundary = self._get(tensordict, self.boundary_key)
        inputs = [(self._get(tensordict, in_key), out_key) for in_key, out_key in self.sum_keys]
        if self.length_key is not None:  # ones, stride 0: no allocation
            inputs.append((torch.ones((), dtype=torch.float64, device=boundary.device).expand(boundary.shape),
                           self.length_key))
        time_dim = self._resolve_time_dim(tensordict)
        states = self._initial_states([x.shape for x, _ in inputs], time_dim)
        outputs, final_states = [], []
        for ((x, out_key), initial_state), in_key in zip(zip(inputs, states),
                                                         [*self.in_keys[:-1], _LENGTHS]):
            self._summed_key = in_key
            out = episodic_prefix_sum(x, self._fit(self.boundary_key, boundary, x.shape), reset=self.reset,
                                      time_dim=time_dim, initial_state=initial_state,
                                      output_final_state=self.carry_state)
            if self.carry_state:
                out, state = out
                final_states.append(state)
            outputs.append((out_key, out))
        for i, state in enumerate(final_states):  # only once every sum is computed: a failed call changes nothing
            self._keep_state(i, state)
        for out_key, out in outputs:
            tensordict.set(out_key, out.to(torch.int64) if out_key == self.length_key else out)
        return tensordict
