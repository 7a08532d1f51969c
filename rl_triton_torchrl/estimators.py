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

One addition: a ``truncated`` key (``set_keys(truncated=...)``, default ``"truncated"``). A rollout that lacks
``("next", done)`` but has ``("next", terminated)`` and ``("next", truncated)`` gets ``done = terminated |
truncated`` written into it before the estimate, and one that lacks ``terminated`` gets ``done & ~truncated``.
"""
from __future__ import annotations

import dataclasses
import functools
import sys
import types

from tensordict import TensorDictBase
from tensordict.utils import NestedKey, unravel_key
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
    """Mixin: completes the episode flags of a rollout, checks its keys, then runs TorchRL's re-bound ``forward``."""

    _torchrl_forward = None
    # the entries an estimate reads besides the reward: each group is (field of tensor_keys, under "next"), one
    # entry of a group suffices. The value entries are read only without a value network.
    _needed_keys = ((("done", True),),)

    def forward(self, *args, **kwargs):
        # TorchRL's forward also takes its inputs as keyword tensors (tensordict's ``dispatch``): pass all along
        tensordict = args[0] if args else kwargs.get("tensordict")
        if isinstance(tensordict, TensorDictBase):
            self._complete_flags(tensordict)
            self._check_keys(tensordict)
        return self._torchrl_forward(*args, **kwargs)

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
    cls.value_estimate = _rebind(base.value_estimate)
    cls.__doc__ = f"Drop-in for :class:`torchrl.objectives.value.{base.__name__}`, the math on our kernels.\n\n" + (
        base.__doc__ or "")
    return cls


@_our_math
class GAE(_OurMath, _trl.GAE):
    pass


@_our_math
class MultiAgentGAE(_OurMath, _trl.MultiAgentGAE):
    pass


@_our_math
class TD0Estimator(_OurMath, _trl.TD0Estimator):
    _needed_keys = ((("terminated", True), ("done", True)),)  # TD(0) reads terminated, or done in its place


@_our_math
class TD1Estimator(_OurMath, _trl.TD1Estimator):
    pass


@_our_math
class TDLambdaEstimator(_OurMath, _trl.TDLambdaEstimator):
    pass


@_our_math
class VTrace(_OurMath, _trl.VTrace):
    _needed_keys = ((("done", True),), (("sample_log_prob", False),))
