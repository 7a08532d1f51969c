"""TorchRL's value estimators with the math on our kernels: swap one import, get the same numbers.

Each class here subclasses TorchRL 0.14's class of the same name and inherits everything around the math:
constructor arguments and defaults, buffers (``gamma``, ``lmbda``, ...; state_dicts load both ways), keys and
``set_keys``, value-network calls (vmap, ``shifted``, chunking, functional params), ``time_dim`` resolution,
``skip_existing``, ``average_gae``/``average_rewards``, ``differentiable``, ``steps_to_next_obs``,
``auto_reset_env``, NaN next-observations and ``MultiAgentGAE``'s agent broadcasting. Only the functional calls
change: TorchRL's own ``forward``/``value_estimate`` are re-bound (``_rebind``) so that the names they look up in
``torchrl.objectives.value.advantages`` resolve to ``rl_triton_torchrl.functional``. Nothing is copied from TorchRL
and nothing global is modified.

``vectorized`` is accepted and has no effect: TorchRL's loop and vectorised functionals both map to our exact
kernels. With ``differentiable=True`` and a value network whose outputs require grad, gradients flow through the
estimate: the coefficients are built with torch ops and the scan runs forward and backward on the Triton scan kernel
(``kernels.scan.scan_rows``).

The direct path: a call ``est(td)`` of ``GAE``, ``MultiAgentGAE``, ``TDLambdaEstimator``, ``TD1Estimator`` or
``TD0Estimator`` (the class itself, not a subclass) on a ``TensorDict`` that carries its values (no value network),
outside torch.compile tracing, without ``auto_reset_env``/``average_rewards``, keyword arguments or a
``"shifted_valid"`` entry, skips TorchRL's forward machinery (``dispatch``, ``skip_existing``, value-network
handling, ``shifted`` masks, our key check) and does only what that forward does for such a call: read the entries,
move the coefficient buffers to the reward's device, apply ``steps_to_next_obs``, call the same functional with the
same arguments under the same grad mode, write advantage and value target. Same numbers bit for bit, same entries
written, same errors (a missing entry sends the call to TorchRL's forward, which raises as before). Every other call
runs TorchRL's re-bound forward; ``est.direct_path = False`` forces that for every call (for comparisons).
``VTrace`` always runs TorchRL's forward (it evaluates its actor network on every call).
``tests/test_module_overhead.py`` pins both paths against each other and against TorchRL's classes.

One addition: a ``truncated`` key (``set_keys(truncated=...)``, default ``"truncated"``). A rollout that lacks
``("next", done)`` but has ``("next", terminated)`` and ``("next", truncated)`` gets ``done = terminated |
truncated`` written into it before the estimate, and one that lacks ``terminated`` gets ``done & ~truncated``.
"""
from __future__ import annotations

import dataclasses
import functools
import sys
import types

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey, unravel_key
from torch import Tensor
from torchrl.objectives.value import advantages as _trl

from . import functional

__all__ = [
    "GAE",
    "MultiAgentGAE",
    "TD0Estimator",
    "TD1Estimator",
    "TDLambdaEstimator",
    "VTrace",
    "MissingKeyError",
    "TORCHRL_FUNCTIONALS",
]

# The names TorchRL's estimator classes look up in torchrl.objectives.value.advantages -> ours.
TORCHRL_FUNCTIONALS = {
    name: getattr(functional, name)
    for name in (
        "generalized_advantage_estimate",
        "vec_generalized_advantage_estimate",
        "td0_return_estimate",
        "td_lambda_return_estimate",
        "vec_td_lambda_return_estimate",
        "vec_td1_return_estimate",
        "vtrace_advantage_estimate",
    )
}


def _shadow_module(namespace: dict, replacements: dict) -> types.ModuleType:
    """A module holding a copy of a TorchRL module's namespace with ``replacements`` in it (one per module).

    A real, importable module rather than a bare dict: torch.compile resolves a function's globals by the module
    name they carry, so the re-bound functions must carry a name that leads back to this namespace.
    """
    name = f"{__name__}._shadow_{namespace['__name__'].replace('.', '_')}"
    module = sys.modules.get(name)
    if module is None:
        module = types.ModuleType(name)
        module.__dict__.update({k: v for k, v in namespace.items() if k not in ("__name__", "__spec__", "__loader__")})
        module.__dict__.update(replacements)
        sys.modules[name] = module
    return module


def _rebind(fn, replacements=TORCHRL_FUNCTIONALS):
    """A copy of ``fn`` whose global look-ups of the ``replacements`` names resolve to the replacements.

    Decorators (``functools.wraps`` closures) are followed: every function reachable through closures is copied the
    same way, so a decorated method keeps its decorators around the re-bound body.
    """
    if not isinstance(fn, types.FunctionType):
        return fn
    cells = None
    if fn.__closure__ is not None:
        cells = []
        for cell in fn.__closure__:
            try:
                content = cell.cell_contents
            except ValueError:  # an empty cell
                cells.append(cell)
                continue
            cells.append(types.CellType(_rebind(content, replacements)) if isinstance(content, types.FunctionType)
                         else cell)
        cells = tuple(cells)
    new = types.FunctionType(fn.__code__, _shadow_module(fn.__globals__, replacements).__dict__, fn.__name__,
                             fn.__defaults__, cells)
    new.__kwdefaults__ = fn.__kwdefaults__
    functools.update_wrapper(new, fn, updated=())
    new.__dict__.update(fn.__dict__)
    return new


# the namespace our re-bound methods resolve the functionals in; the direct path calls them from there too
_MATH = _shadow_module(vars(_trl), TORCHRL_FUNCTIONALS).__dict__


def _key_tuple(key: NestedKey) -> tuple:
    """``key`` unravelled into a tuple, as ``TensorDictBase.get`` does before its look-up."""
    key = unravel_key(key)
    return key if isinstance(key, tuple) else (key,)


def _with_truncated(keys_cls):
    """The class's ``_AcceptedKeys`` plus a ``truncated`` key.

    Every field is declared again on the subclass: TorchRL's ``set_keys`` looks accepted names up in the class's
    own ``__dict__``.
    """
    fields = [(f.name, f.type, dataclasses.field(default=f.default)) for f in dataclasses.fields(keys_cls)]
    return dataclasses.make_dataclass(
        keys_cls.__name__,
        fields + [("truncated", NestedKey, dataclasses.field(default="truncated"))],
        bases=(keys_cls,),
        namespace={"__doc__": (keys_cls.__doc__ or "") + "\n    truncated (NestedKey): the truncation flag under "
                   '"next", used to complete a missing done or terminated flag. Defaults to ``"truncated"``.\n'},
    )


class _OurMath:
    """Mixin: the direct path when it applies, else completes the episode flags of a rollout, checks its keys and
    runs TorchRL's re-bound ``forward``."""

    _torchrl_forward = None
    # the entries an estimate reads besides the reward: each group is (field of tensor_keys, under "next"), one
    # entry of a group suffices. The value entries are read only without a value network.
    _needed_keys = ((("done", True),),)
    # The direct path, per class: its estimate (one of the ``_direct_*`` methods below, or None: TorchRL's forward
    # always), the buffers moved to the reward's device before ``steps_to_next_obs`` is applied (TorchRL's order),
    # and the option that sends a call to TorchRL's forward when set.
    _direct_estimate = None
    _direct_buffers = ("gamma",)
    _direct_unless = None
    _direct_class = None  # set by @_our_math; a subclass of ours (it may override any method) takes TorchRL's forward
    direct_path = True  # False: every call through TorchRL's re-bound forward (for comparisons; same results)

    def forward(self, *args, **kwargs):
        # TorchRL's forward also takes its inputs as keyword tensors (tensordict's ``dispatch``): pass all along
        tensordict = args[0] if args else kwargs.get("tensordict")
        if isinstance(tensordict, TensorDictBase):
            if len(args) == 1 and not kwargs and self._direct_estimate is not None and self.direct_path:
                entries = self._direct_entries(tensordict)
                if entries is not None:
                    return self._direct_forward(tensordict, *entries)
            self._complete_flags(tensordict)
            self._check_keys(tensordict)
        return self._torchrl_forward(*args, **kwargs)

    # -- the direct path ------------------------------------------------------------------------------------------
    # TorchRL's forward, for values precomputed in the rollout, is: read the entries, move the coefficient buffers to
    # the reward's device, apply ``steps_to_next_obs``, call one functional, write advantage and value target. The
    # direct path does exactly that (same functional, same arguments, same order of side effects, under the same
    # grad mode), without the machinery that only matters otherwise: value-network calls, ``shifted`` outputs,
    # ``dispatch``'s keyword inputs, ``skip_existing``. It runs only where nothing else can happen:
    # ``_direct_entries`` returns None (-> TorchRL's forward) for anything else.

    def _direct_keys(self):
        """The entries the direct path reads and writes, as key tuples, cached per content of ``tensor_keys``."""
        keys = self.tensor_keys
        state = tuple(vars(keys).values())
        cached = self.__dict__.get("_direct_key_cache")
        if cached is not None and cached[0] == state:
            return cached[1]
        # under "next": the key without its leading "next" (read from the "next" sub-tensordict)
        nxt = [_key_tuple(("next", getattr(keys, f)))[1:] for f in ("reward", "done", "terminated", "truncated",
                                                                     "value")]
        root = [_key_tuple(getattr(keys, f)) for f in ("value", "steps_to_next_obs")]
        resolved = (*nxt, *root, keys.advantage, keys.value_target)
        self.__dict__["_direct_key_cache"] = (state, resolved)
        return resolved

    def _direct_entries(self, tensordict):
        """``(keys, reward, done, terminated, value, next_value, steps_to_next_obs)`` when the direct path gives what
        TorchRL's forward gives, else None. Completes the episode flags as ``_complete_flags`` does."""
        if (torch.compiler.is_compiling() or type(tensordict) is not TensorDict or type(self) is not self._direct_class
                or self.value_network is not None or getattr(self, self._direct_unless)
                or tensordict.batch_dims < 1):
            return None
        keys = self._direct_keys()
        r_k, d_k, term_k, trunc_k, nv_k, v_k, steps_k = keys[:7]
        # ``get(key)`` is ``_get_tuple(key as a tuple)``; a key under "next" is read from the "next" entry the way
        # ``_get_tuple`` recurses into it
        nxt = tensordict._get_tuple(("next",), None)
        if type(nxt) is not TensorDict:
            return None
        get, get_next = tensordict._get_tuple, nxt._get_tuple
        try:
            reward, done, term, trunc = get_next(r_k, None), get_next(d_k, None), get_next(term_k, None), get_next(
                trunc_k, None)
            next_value, value, steps = get_next(nv_k, None), get(v_k, None), get(steps_k, None)
            shifted_valid = get(("shifted_valid",), None)
        except Exception:  # noqa: BLE001 - e.g. a key nested under a tensor: TorchRL's forward says what is wrong
            return None
        if not (isinstance(reward, Tensor) and isinstance(value, Tensor) and isinstance(next_value, Tensor)
                and shifted_valid is None and (steps is None or isinstance(steps, Tensor))
                and (done is None or isinstance(done, Tensor)) and (term is None or isinstance(term, Tensor))
                and (trunc is None or isinstance(trunc, Tensor))):
            return None
        if trunc is not None:  # as _complete_flags
            if done is None and term is not None:
                tensordict.set(("next", *d_k), term | trunc)
                done = nxt._get_tuple(d_k, None)
            elif term is None and done is not None:
                tensordict.set(("next", *term_k), done & ~trunc)
                term = nxt._get_tuple(term_k, None)
        if done is None:
            return None
        return keys, reward, done, done if term is None else term, value, next_value, steps

    def _direct_forward(self, tensordict, keys, reward, done, terminated, value, next_value, steps):
        if torch.is_grad_enabled() == self.differentiable:
            return self._direct_run(tensordict, keys, reward, done, terminated, value, next_value, steps)
        with torch.set_grad_enabled(self.differentiable):  # TorchRL's forward runs under this grad mode
            return self._direct_run(tensordict, keys, reward, done, terminated, value, next_value, steps)

    def _direct_run(self, tensordict, keys, reward, done, terminated, value, next_value, steps):
        device, buffers = reward.device, self._buffers  # (``self.gamma`` is ``self._buffers["gamma"]``, read faster)
        for name in self._direct_buffers:
            if buffers[name].device != device:
                setattr(self, name, buffers[name].to(device))
        gamma = buffers["gamma"]
        if steps is not None:
            gamma = gamma ** steps.view_as(reward)
        advantage, value_target = self._direct_estimate(tensordict, gamma, reward, done, terminated, value,
                                                        next_value)
        tensordict.set(keys[7], advantage)
        tensordict.set(keys[8], value_target)
        return tensordict

    def _direct_gae(self, tensordict, gamma, reward, done, terminated, value, next_value):
        """GAE's (and MultiAgentGAE's, through its hooks) forward from the functional call on."""
        time_dim = self._get_time_dim(None, tensordict)
        reward, done, terminated = self._prepare_signals(reward, done, terminated, value)
        fn = "vec_generalized_advantage_estimate" if self.vectorized else "generalized_advantage_estimate"
        advantage, value_target = _MATH[fn](gamma, self._buffers["lmbda"], value, next_value, reward, done=done,
                                            terminated=terminated, time_dim=time_dim)
        if self.average_gae:
            advantage = self._normalize_advantage(advantage, None, groups=self._group_ids(tensordict))
        return advantage, value_target

    def _direct_td_lambda(self, tensordict, gamma, reward, done, terminated, value, next_value):
        if self._buffers["lmbda"].device != reward.device:  # TD(lambda) moves lmbda after steps_to_next_obs
            self.lmbda = self._buffers["lmbda"].to(reward.device)
        lmbda = self._buffers["lmbda"]
        fn = "vec_td_lambda_return_estimate" if self.vectorized else "td_lambda_return_estimate"
        value_target = _MATH[fn](gamma, lmbda, next_value, reward, done=done, terminated=terminated,
                                 time_dim=self._get_time_dim(None, tensordict))
        return value_target - value, value_target

    def _direct_td1(self, tensordict, gamma, reward, done, terminated, value, next_value):
        value_target = _MATH["vec_td1_return_estimate"](gamma, next_value, reward, done=done, terminated=terminated,
                                                        time_dim=self._get_time_dim(None, tensordict))
        return value_target - value, value_target

    def _direct_td0(self, tensordict, gamma, reward, done, terminated, value, next_value):
        value_target = _MATH["td0_return_estimate"](gamma=gamma, next_state_value=next_value, reward=reward,
                                                    done=done, terminated=terminated)
        return value_target - value, value_target

    # -- TorchRL's forward: our additions around it ----------------------------------------------------------------

    def _check_keys(self, tensordict: TensorDictBase) -> None:
        """A ``MissingKeyError`` naming this class and every missing entry. (TorchRL's own code fails on ``None``
        with an ``AttributeError``, or with a ``ValueError`` for a missing value entry.)"""
        keys = self.tensor_keys
        groups = [(("reward", True),), *self._needed_keys]
        if self.value_network is None:
            groups += [(("value", False),), (("value", True),)]
        present = tensordict.keys(include_nested=True)
        missing, hint = [], "rename the keys with set_keys(...)"
        for group in groups:
            entries = [unravel_key(("next", getattr(keys, f)) if nxt else getattr(keys, f)) for f, nxt in group]
            if all(isinstance(e, (str, tuple)) and e not in present for e in entries):
                missing.append(" or ".join(map(repr, entries)))
                if group[0][0] == "value":
                    hint = "rename the keys with set_keys(...), or pass a value_network"
        if missing:
            raise MissingKeyError(f"{type(self).__name__}: the tensordict has no {' and no '.join(missing)} entry "
                                  f"({hint})")

    def _complete_flags(self, tensordict: TensorDictBase) -> None:
        keys = self.tensor_keys
        done, term, trunc = (unravel_key(("next", k)) for k in (keys.done, keys.terminated, keys.truncated))
        present = tensordict.keys(include_nested=True)
        if trunc not in present:
            return
        if done not in present and term in present:
            tensordict.set(done, tensordict.get(term) | tensordict.get(trunc))
        elif term not in present and done in present:
            tensordict.set(term, tensordict.get(done) & ~tensordict.get(trunc))


class MissingKeyError(KeyError, ValueError):
    """An entry an estimator needs is missing from the tensordict. A ``KeyError``, and also a ``ValueError`` because
    TorchRL raises ``ValueError`` for a missing value entry: code catching either keeps working."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""


def _our_math(cls):
    """Class decorator: re-binds the methods of the TorchRL base that call functionals, and adds the truncated key."""
    base = cls.__mro__[2]  # (cls, _OurMath, TorchRL's class, ...)
    cls._AcceptedKeys = cls.default_keys = _with_truncated(base._AcceptedKeys)
    cls._torchrl_forward = _rebind(base.forward)
    cls._direct_class = cls
    cls.value_estimate = _rebind(base.value_estimate)
    cls.__doc__ = f"Drop-in for :class:`torchrl.objectives.value.{base.__name__}`, the math on our kernels.\n\n" + (
        base.__doc__ or "")
    return cls


@_our_math
class GAE(_OurMath, _trl.GAE):
    _direct_estimate, _direct_buffers, _direct_unless = _OurMath._direct_gae, ("gamma", "lmbda"), "auto_reset_env"


@_our_math
class MultiAgentGAE(_OurMath, _trl.MultiAgentGAE):
    _direct_estimate, _direct_buffers, _direct_unless = _OurMath._direct_gae, ("gamma", "lmbda"), "auto_reset_env"


@_our_math
class TD0Estimator(_OurMath, _trl.TD0Estimator):
    _needed_keys = ((("terminated", True), ("done", True)),)  # TD(0) reads terminated, or done in its place
    _direct_estimate, _direct_unless = _OurMath._direct_td0, "average_rewards"


@_our_math
class TD1Estimator(_OurMath, _trl.TD1Estimator):
    _direct_estimate, _direct_unless = _OurMath._direct_td1, "average_rewards"


@_our_math
class TDLambdaEstimator(_OurMath, _trl.TDLambdaEstimator):
    _direct_estimate, _direct_unless = _OurMath._direct_td_lambda, "average_rewards"


@_our_math
class VTrace(_OurMath, _trl.VTrace):
    _needed_keys = ((("done", True),), (("sample_log_prob", False),))
