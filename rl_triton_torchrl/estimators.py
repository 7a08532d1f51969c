"""TorchRL's value estimators with the math on our kernels: swap one import, get the same numbers.

Each class here subclasses TorchRL 0.14's class of the same name and inherits everything around the math:
constructor arguments and defaults, buffers (``gamma``, ``lmbda``, ...; state_dicts load both ways), keys and
``set_keys`` (lists of keys too, e.g. a composite distribution's ``sample_log_prob``), value-network calls (vmap,
``shifted``, chunking, functional params), ``time_dim`` resolution, ``skip_existing``,
``average_gae``/``average_rewards``, ``differentiable``, ``steps_to_next_obs``, ``auto_reset_env``, NaN
next-observations and ``MultiAgentGAE``'s agent broadcasting. The functional calls change: TorchRL's own
``forward``/``value_estimate`` are re-bound (``_rebind``: the same code objects with a copy of their module globals)
so that the names they look up in ``torchrl.objectives.value.advantages`` resolve to ``rl_triton_torchrl.functional``.
No TorchRL module is modified by importing this one (``patch_torchrl()`` does that, on request).

The coupling is checked at import (``check_rebound``): every re-bound method, its decorators' closures and nested
code included, must reach TorchRL's functionals only through global look-ups that now resolve to ours, and each class
must still call the functionals it is expected to (``EXPECTED_FUNCTIONALS``). A TorchRL release that calls a
functional another way (an attribute, a local import, a helper that is not re-bound) makes the import fail with
``TorchRLCouplingError`` (an ``ImportError``) naming the class, the method and the functional, instead of silently
computing TorchRL's math.

``vectorized`` is accepted and has no effect: TorchRL's loop and vectorised functionals both map to our exact
kernels. With ``differentiable=True`` and a value network whose outputs require grad, gradients flow through the
estimate: the coefficients are built with torch ops and the scan runs forward and backward on the Triton scan kernel
(``kernels.scan.scan_rows``). TD(0) is elementwise (``functional.td0_return_estimate``): any shape, 0-d included.

The direct path re-implements part of TorchRL's ``forward``, and is therefore enabled only on the TorchRL versions it
was verified against (``DIRECT_PATH_VERSIONS``: 0.14.1; ``torchrl.__version__`` is read at every call); on any other
version every call runs TorchRL's re-bound forward. There, a call ``est(td)`` of ``GAE``, ``MultiAgentGAE``,
``TDLambdaEstimator``, ``TD1Estimator`` or ``TD0Estimator`` (the class itself, not a subclass) on a ``TensorDict``
that carries its values (no value network), outside torch.compile tracing, without
``auto_reset_env``/``average_rewards``, keyword arguments, list-valued keys or a ``"shifted_valid"`` entry, skips
TorchRL's forward machinery (``dispatch``, ``skip_existing``, value-network handling, ``shifted`` masks, our key
check) and does what TorchRL 0.14.1's forward does for such a call, written here again: read the entries (through
tensordict's private ``_get_tuple``), move the coefficient buffers to the reward's device, apply
``steps_to_next_obs``, call the same functional with the same arguments under the same grad mode (GAE's
``_normalize_advantage`` and ``_group_ids`` for ``average_gae``), write advantage and value target. Same numbers bit
for bit, same entries written, same errors (a missing entry sends the call to TorchRL's forward, which raises as
before). Every other call runs TorchRL's re-bound forward; ``est.direct_path = False`` forces that for every call
(for comparisons). ``VTrace`` always runs TorchRL's forward (it evaluates its actor network on every call).
``tests/test_module_overhead.py`` pins both paths against each other and against TorchRL's classes.

Additions to TorchRL's classes:

- A ``truncated`` key (``set_keys(truncated=...)``, default ``"truncated"``). For a rollout that lacks
  ``("next", done)`` but has ``("next", terminated)`` and ``("next", truncated)``, the estimate uses
  ``done = terminated | truncated``; for one that lacks ``terminated``, ``terminated = done & ~truncated``. The
  completed flag is never written into the input: the direct path uses the computed tensor, TorchRL's forward runs
  on a shallow copy of the tensordict (and of its "next" entry) whose new entries are copied back, so the input
  gets exactly the entries TorchRL writes.
- A missing entry raises ``MissingKeyError`` naming the class and every missing entry.
- An ``InputError``/``TypeError`` of a functional names the tensordict entry behind the bad argument
  (``GAE: ('next', 'done'): done must be a bool tensor ...``), same exception type.
- ``gamma``, ``lmbda`` (and ``VTrace``'s ``rho_thresh``, ``c_thresh``) are range-checked in the constructor, after
  TorchRL's constructor accepted them (Python numbers and CPU tensors; CUDA tensors are not read).
"""
from __future__ import annotations

import dataclasses
import dis
import functools
import numbers
import sys
import types

import torch
from tensordict import TensorDict, TensorDictBase
from tensordict.utils import NestedKey, unravel_key
from torch import Tensor
import torchrl as _torchrl_package
from torchrl.objectives.value import advantages as _trl
from torchrl.objectives.value import functional as _trl_functional

from . import functional
from ._checks import Described, check_coefficient, keyed_error
from .kernels import InputError
from .kernels.td_lambda import td_lambda_advantage as _td_lambda_pair

__all__ = [
    "GAE",
    "MultiAgentGAE",
    "TD0Estimator",
    "TD1Estimator",
    "TDLambdaEstimator",
    "VTrace",
    "MissingKeyError",
    "TorchRLCouplingError",
    "TORCHRL_FUNCTIONALS",
    "DIRECT_PATH_VERSIONS",
    "direct_path_verified",
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


def _same_facts(value: Tensor, reward: Tensor) -> bool:
    """Whether ``value`` has the reward's shape, dtype and device: then the TD(lambda) functional's kernel also
    writes ``value_target - value`` (``_td_lambda_pair``), the same numbers as the subtraction after it."""
    return value.shape == reward.shape and value.dtype == reward.dtype and value.device == reward.device


def _key_tuple(key: NestedKey) -> tuple:
    """``key`` unravelled into a tuple, as ``TensorDictBase.get`` does before its look-up."""
    key = unravel_key(key)
    return key if isinstance(key, tuple) else (key,)


def _read(tensordict: TensorDict, key: tuple):
    """``tensordict.get(key, None)`` for a key tuple: one dictionary look-up for a key of one name (what
    ``TensorDict._get_str`` does), ``_get_tuple`` for a nested one."""
    if len(key) == 1:
        return tensordict._tensordict.get(key[0])
    return tensordict._get_tuple(key, None)


def _write(tensordict: TensorDict, key: tuple, value, shape: torch.Size, device: torch.device) -> None:
    """``tensordict.set(key, value)``, where ``shape`` and ``device`` are those of one of the tensordict's own
    leaves (so its batch shape comes first, and the device is the tensordict's where it has one). An unlocked
    TensorDict takes a tensor of that shape on that device under a key of one name as ``set`` does after validating
    it: into its dictionary. Anything else goes through ``set``, which validates (and moves or refuses) the value
    and creates nested entries."""
    if (len(key) == 1 and type(value) is Tensor and not tensordict._is_locked and value.shape == shape
            and value.device == device):
        tensordict._tensordict[key[0]] = value
    else:
        tensordict.set(key, value)


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
    _torchrl_value_estimate = None
    # the entries an estimate reads besides the reward: each group is (field of tensor_keys, under "next"), one
    # entry of a group suffices. The value entries are read only without a value network.
    _needed_keys = ((("done", True),),)
    # constructor coefficients range-checked after TorchRL's constructor accepted them: name -> (low, high)
    _coefficients = {"gamma": (0.0, 1.0), "lmbda": (0.0, 1.0)}
    # The direct path, per class: its estimate (one of the ``_direct_*`` methods below, or None: TorchRL's forward
    # always), the buffers moved to the reward's device before ``steps_to_next_obs`` is applied (TorchRL's order),
    # and the option that sends a call to TorchRL's forward when set.
    _direct_estimate = None
    _direct_buffers = ("gamma",)
    _direct_unless = None
    _direct_class = None  # set by @_our_math; a subclass of ours (it may override any method) takes TorchRL's forward
    direct_path = True  # False: every call through TorchRL's re-bound forward (for comparisons; same results)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)  # TorchRL's constructor first: where it refuses a value, its error wins
        for name, (low, high) in self._coefficients.items():
            if name not in kwargs:
                continue
            value = kwargs[name]
            integral = (isinstance(value, numbers.Integral) and not isinstance(value, bool)) or (
                isinstance(value, Tensor) and not value.is_floating_point() and value.dtype is not torch.bool
                and not value.is_complex())
            if integral:
                # TorchRL stores an integer coefficient (gamma=1) as an int64 buffer and computes with it; our
                # functionals take floating coefficients: the buffer is kept as the default float dtype instead
                buffer = getattr(self, name)
                setattr(self, name, buffer.to(torch.get_default_dtype()))
                value = value.to(torch.get_default_dtype()) if isinstance(value, Tensor) else float(value)
            check_coefficient(type(self).__name__, name, value, low, high)

    def forward(self, *args, **kwargs):
        try:
            return self._forward(*args, **kwargs)
        except (InputError, TypeError) as err:
            keyed = self._keyed_error(err)
            if keyed is None:
                raise
            raise keyed from None

    def _forward(self, *args, **kwargs):
        # TorchRL's forward also takes its inputs as keyword tensors (tensordict's ``dispatch``): pass all along
        tensordict = args[0] if args else kwargs.get("tensordict")
        if not isinstance(tensordict, TensorDictBase):
            return self._torchrl_forward(*args, **kwargs)
        if (len(args) == 1 and not kwargs and self._direct_estimate is not None and self.direct_path
                and direct_path_verified()):
            entries = self._direct_entries(tensordict)
            if entries is not None:
                return self._direct_forward(tensordict, *entries)
        completed, completed_key = self._completed_flags(tensordict)
        self._check_keys(completed)
        if completed is tensordict:
            return self._torchrl_forward(*args, **kwargs)
        # TorchRL's forward runs on a shallow copy that holds the completed flag; what it writes is copied back
        if args:
            args = (completed, *args[1:])
        else:
            kwargs = {**kwargs, "tensordict": completed}
        out = self._torchrl_forward(*args, **kwargs)
        _copy_back(completed, tensordict, skip=completed_key)
        return tensordict if out is completed else out

    def _keyed_error(self, err):
        """``err`` naming the tensordict entry of the functional argument it is about (``_checks.keyed_error``)."""
        keys = self.tensor_keys
        names = {"reward": _entry(keys.reward, True), "done": _entry(keys.done, True),
                 "terminated": _entry(keys.terminated, True), "state_value": _entry(keys.value, False),
                 "next_state_value": _entry(keys.value, True)}
        if hasattr(keys, "sample_log_prob"):
            names["log_mu"] = _entry(keys.sample_log_prob, False)
            names["log_pi"] = Described(f"the actor_network's log-probability ({keys.sample_log_prob!r})")
        return keyed_error(type(self).__name__, err, names)

    # -- the direct path ------------------------------------------------------------------------------------------
    # TorchRL's forward, for values precomputed in the rollout, is: read the entries, move the coefficient buffers to
    # the reward's device, apply ``steps_to_next_obs``, call one functional, write advantage and value target. The
    # direct path does exactly that (same functional, same arguments, same order of side effects, under the same
    # grad mode), without the machinery that only matters otherwise: value-network calls, ``shifted`` outputs,
    # ``dispatch``'s keyword inputs, ``skip_existing``. It runs only where nothing else can happen:
    # ``_direct_entries`` returns None (-> TorchRL's forward) for anything else. TD(lambda) and TD(1), whose forward
    # subtracts the value after the functional, get both outputs from the functional's kernel (the same numbers:
    # ``td_lambda_advantage(return_value_target=True)``), one torch op fewer per call
    # (benchmarks/results/h200/module_td_lambda.md).

    def _direct_keys(self):
        """The entries the direct path reads and writes, as key tuples, cached per content of ``tensor_keys``."""
        keys = self.tensor_keys
        state = vars(keys)
        cached = self.__dict__.get("_direct_key_cache")
        if cached is not None and cached[0] == state:
            return cached[1]
        state = dict(state)
        # a list of keys (TorchRL's set_keys accepts them): its forward
        if any(isinstance(k, list) for k in state.values()):
            self.__dict__["_direct_key_cache"] = (state, None)
            return None
        # under "next": the key without its leading "next" (read from the "next" sub-tensordict)
        nxt = [_key_tuple(("next", getattr(keys, f)))[1:] for f in ("reward", "done", "terminated", "truncated",
                                                                     "value")]
        root = [_key_tuple(getattr(keys, f)) for f in ("value", "steps_to_next_obs")]
        resolved = (*nxt, *root, _key_tuple(keys.advantage), _key_tuple(keys.value_target))
        self.__dict__["_direct_key_cache"] = (state, resolved)
        return resolved

    def _direct_entries(self, tensordict):
        """``(keys, reward, done, terminated, value, next_value, steps_to_next_obs)`` when the direct path gives what
        TorchRL's forward gives, else None. Completes the episode flags as ``_completed_flags`` does (in the
        returned tensors, never in ``tensordict``)."""
        if (torch.compiler.is_compiling() or type(tensordict) is not TensorDict or type(self) is not self._direct_class
                or self.value_network is not None or getattr(self, self._direct_unless)
                or tensordict.batch_dims < 1):
            return None
        keys = self._direct_keys()
        if keys is None:
            return None
        r_k, d_k, term_k, trunc_k, nv_k, v_k, steps_k = keys[:7]
        # ``get(key)`` is ``_get_tuple(key as a tuple)`` (``_read``); a key under "next" is read from the "next" entry
        # the way ``_get_tuple`` recurses into it
        entries = tensordict._tensordict
        nxt = entries.get("next")
        if type(nxt) is not TensorDict:
            return None
        try:
            reward, done, term, trunc = _read(nxt, r_k), _read(nxt, d_k), _read(nxt, term_k), _read(nxt, trunc_k)
            next_value, value, steps = _read(nxt, nv_k), _read(tensordict, v_k), _read(tensordict, steps_k)
        except Exception:  # noqa: BLE001 - e.g. a key nested under a tensor: TorchRL's forward says what is wrong
            return None
        shifted_valid = entries.get("shifted_valid")
        if not (isinstance(reward, Tensor) and isinstance(value, Tensor) and isinstance(next_value, Tensor)
                and shifted_valid is None and (steps is None or isinstance(steps, Tensor))
                and (done is None or isinstance(done, Tensor)) and (term is None or isinstance(term, Tensor))
                and (trunc is None or isinstance(trunc, Tensor))):
            return None
        if trunc is not None:  # as _completed_flags, without writing the flag into the user's tensordict
            if done is None and term is not None:
                done = term | trunc
            elif term is None and done is not None:
                term = done & ~trunc
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
        shape = value.shape  # (a leaf of the tensordict, on the reward's device)
        _write(tensordict, keys[7], advantage, shape, device)
        _write(tensordict, keys[8], value_target, shape, device)
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
        time_dim = self._get_time_dim(None, tensordict)
        if _same_facts(value, reward):
            return _td_lambda_pair(reward, value, next_value, done, terminated, gamma=gamma, lmbda=lmbda,
                                   time_dim=time_dim, return_value_target=True)
        fn = "vec_td_lambda_return_estimate" if self.vectorized else "td_lambda_return_estimate"
        value_target = _MATH[fn](gamma, lmbda, next_value, reward, done=done, terminated=terminated,
                                 time_dim=time_dim)
        return value_target - value, value_target

    def _direct_td1(self, tensordict, gamma, reward, done, terminated, value, next_value):
        time_dim = self._get_time_dim(None, tensordict)
        if _same_facts(value, reward):
            return _td_lambda_pair(reward, value, next_value, done, terminated, gamma=gamma, lmbda=1.0,
                                   time_dim=time_dim, done_or_terminated=True, return_value_target=True)
        value_target = _MATH["vec_td1_return_estimate"](gamma, next_value, reward, done=done, terminated=terminated,
                                                        time_dim=time_dim)
        return value_target - value, value_target

    def _direct_td0(self, tensordict, gamma, reward, done, terminated, value, next_value):
        value_target = _MATH["td0_return_estimate"](gamma=gamma, next_state_value=next_value, reward=reward,
                                                    done=done, terminated=terminated)
        return value_target - value, value_target

    # -- TorchRL's forward: our additions around it ----------------------------------------------------------------

    def _check_keys(self, tensordict: TensorDictBase) -> None:
        """A ``MissingKeyError`` naming this class and every missing entry. (TorchRL's own code fails on ``None``
        with an ``AttributeError``, or with a ``ValueError`` for a missing value entry.)

        A field may hold a list of keys (TorchRL's ``set_keys`` accepts them, e.g. the ``sample_log_prob`` of a
        composite action distribution): every key of the list is needed.
        """
        keys = self.tensor_keys
        groups = [(("reward", True),), *self._needed_keys]
        if self.value_network is None:
            groups += [(("value", False),), (("value", True),)]
        present = tensordict.keys(include_nested=True)
        missing, hint = [], "rename the keys with set_keys(...)"
        for group in groups:
            # each alternative of a group: the entries it needs (one, or a list's)
            alternatives = [_entries(getattr(keys, f), nxt) for f, nxt in group]
            absent = [[e for e in entries if isinstance(e, (str, tuple)) and e not in present]
                      for entries in alternatives]
            if all(absent):
                missing.append(" or ".join(" and ".join(map(repr, a)) for a in absent))
                if group[0][0] == "value":
                    hint = "rename the keys with set_keys(...), or pass a value_network"
        if missing:
            raise MissingKeyError(f"{type(self).__name__}: the tensordict has no {' and no '.join(missing)} entry "
                                  f"({hint})")

    def _completed_flags(self, tensordict: TensorDictBase) -> tuple[TensorDictBase, tuple | None]:
        """``(tensordict, None)``, or, where ``("next", truncated)`` completes a missing done or terminated flag
        (``done = terminated | truncated``, ``terminated = done & ~truncated``), a shallow copy of it (and of its
        "next" entry) holding the completed flag, and the flag's key. The user's tensordict is never written here."""
        keys = self.tensor_keys
        if any(isinstance(k, list) for k in (keys.done, keys.terminated, keys.truncated)):
            return tensordict, None
        done, term, trunc = (unravel_key(("next", k)) for k in (keys.done, keys.terminated, keys.truncated))
        present = tensordict.keys(include_nested=True)
        if trunc not in present:
            return tensordict, None
        if done not in present and term in present:
            key, flag = done, tensordict.get(term) | tensordict.get(trunc)
        elif term not in present and done in present:
            key, flag = term, tensordict.get(done) & ~tensordict.get(trunc)
        else:
            return tensordict, None
        copy = tensordict.copy()  # new TensorDicts down the tree, the same tensors
        copy.set(key, flag)
        return copy, key


def _entries(key, under_next: bool) -> list:
    """The entries a key field names: one key, or each key of a list, unravelled (under "next" if asked)."""
    return [unravel_key(("next", k) if under_next else k) for k in (key if isinstance(key, list) else [key])]


def _entry(key, under_next: bool):
    """The entry (or, for a list of keys, the list of entries) a key field names, as ``_entries``."""
    entries = _entries(key, under_next)
    return entries if isinstance(key, list) else entries[0]


def _copy_back(source: TensorDictBase, target: TensorDictBase, skip) -> None:
    """Sets into ``target`` every leaf of ``source`` (a shallow copy of ``target``) that is new or another tensor
    than ``target``'s: what TorchRL's forward wrote into the copy. ``skip`` (the completed flag) is left out."""
    present = set(target.keys(include_nested=True, leaves_only=True))
    for key in source.keys(include_nested=True, leaves_only=True):
        if key == skip:
            continue
        value = source.get(key)
        if key not in present or target.get(key) is not value:
            target.set(key, value)


# TorchRL versions whose forwards the direct path was verified against (it re-implements them: see the module
# docstring). On any other version every call runs TorchRL's re-bound forward.
DIRECT_PATH_VERSIONS = ("0.14.1",)


def direct_path_verified() -> bool:
    """Whether the installed TorchRL (``torchrl.__version__``, read at every call) is one the direct path was
    verified against."""
    version = getattr(_torchrl_package, "__version__", "")
    return version.split("+", 1)[0] in DIRECT_PATH_VERSIONS


class MissingKeyError(KeyError, ValueError):
    """An entry an estimator needs is missing from the tensordict. A ``KeyError``, and also a ``ValueError`` because
    TorchRL raises ``ValueError`` for a missing value entry: code catching either keeps working."""

    def __str__(self):
        return str(self.args[0]) if self.args else ""


class TorchRLCouplingError(ImportError):
    """The installed TorchRL calls its value functionals in a way our re-bound methods do not reach: our classes
    would silently compute TorchRL's math. Raised when ``rl_triton_torchrl.estimators`` is imported."""


# The functionals each class's re-bound methods (``forward``, ``value_estimate``) must call, verified at import.
EXPECTED_FUNCTIONALS = {
    "GAE": {"generalized_advantage_estimate", "vec_generalized_advantage_estimate"},
    "MultiAgentGAE": {"generalized_advantage_estimate", "vec_generalized_advantage_estimate"},
    "TD0Estimator": {"td0_return_estimate"},
    "TD1Estimator": {"vec_td1_return_estimate"},
    "TDLambdaEstimator": {"td_lambda_return_estimate", "vec_td_lambda_return_estimate"},
    "VTrace": {"vtrace_advantage_estimate"},
}
# every name of a TorchRL value functional: a reference to one that does not resolve to ours is an error
_FUNCTIONAL_NAMES = frozenset(_trl_functional.__all__) | frozenset(TORCHRL_FUNCTIONALS)
_GLOBAL_LOADS = frozenset({"LOAD_GLOBAL", "LOAD_NAME"})


def _reachable(fn: types.FunctionType):
    """``(function, code object)`` of every code ``fn`` runs by itself: its own, nested ones (lambdas,
    comprehensions, inner functions) and those of the functions in its closure (decorators), recursively. Each
    code object comes with the function whose globals it resolves names in."""
    seen, stack = set(), [fn]
    while stack:
        f = stack.pop()
        codes = [f.__code__]
        while codes:
            code = codes.pop()
            if id(code) in seen:
                continue
            seen.add(id(code))
            yield f, code
            codes.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        for cell in f.__closure__ or ():
            try:
                content = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            if isinstance(content, types.FunctionType):
                stack.append(content)


def check_rebound(owner: str, methods: dict, expected: set, replacements: dict = TORCHRL_FUNCTIONALS) -> None:
    """Verifies that re-bound ``methods`` (name -> function) compute with ``replacements`` (ours).

    Follows closures and nested code. Every reference to a TorchRL value functional must be a global look-up that
    resolves to ours in the globals of the function that makes it; a functional reached another way (an attribute,
    ``functional.gae(...)``; a local import) or resolving to TorchRL's is an error, and so is an ``expected``
    functional that no method calls (the call moved elsewhere, e.g. into a base-class helper that is not re-bound).

    Raises:
        TorchRLCouplingError: naming ``owner``, the method and the functional.
    """
    called = set()
    for method, fn in methods.items():
        for func, code in _reachable(fn):
            for ins in dis.get_instructions(code):
                name = ins.argval
                if not isinstance(name, str) or name not in _FUNCTIONAL_NAMES:
                    continue
                where = f"{owner}.{method} (code {code.co_qualname})"
                if ins.opname not in _GLOBAL_LOADS:
                    raise TorchRLCouplingError(
                        f"{where} reaches TorchRL's {name} through {ins.opname} (an attribute or a local import), "
                        f"which rl_triton_torchrl's re-binding does not replace: this TorchRL version "
                        f"({getattr(_torchrl_package, '__version__', '?')}) is not supported by "
                        "rl_triton_torchrl.estimators")
                resolved = func.__globals__.get(name)
                if name in replacements and resolved is not replacements[name] or name not in replacements:
                    raise TorchRLCouplingError(
                        f"{where} looks {name} up as a global, which resolves to {resolved!r}, not "
                        "rl_triton_torchrl's: this TorchRL version "
                        f"({getattr(_torchrl_package, '__version__', '?')}) is not supported by "
                        "rl_triton_torchrl.estimators")
                called.add(name)
    if expected - called:
        raise TorchRLCouplingError(
            f"{owner}: no re-bound method ({', '.join(methods)}) calls {', '.join(sorted(expected - called))}: this "
            f"TorchRL version ({getattr(_torchrl_package, '__version__', '?')}) computes the estimate elsewhere, "
            "and rl_triton_torchrl.estimators does not support it")


def _keyed_value_estimate(rebound):
    """TorchRL's re-bound ``value_estimate``, its errors naming the tensordict entry (as ``forward``'s)."""

    @functools.wraps(rebound)
    def value_estimate(self, *args, **kwargs):
        try:
            return rebound(self, *args, **kwargs)
        except (InputError, TypeError) as err:
            keyed = self._keyed_error(err)
            if keyed is None:
                raise
            raise keyed from None

    return value_estimate


def _our_math(cls):
    """Class decorator: re-binds the methods of the TorchRL base that call functionals (and verifies that they now
    call ours), and adds the truncated key."""
    base = cls.__mro__[2]  # (cls, _OurMath, TorchRL's class, ...)
    cls._AcceptedKeys = cls.default_keys = _with_truncated(base._AcceptedKeys)
    cls._torchrl_forward = _rebind(base.forward)
    cls._torchrl_value_estimate = _rebind(base.value_estimate)
    check_rebound(cls.__name__, {"forward": cls._torchrl_forward, "value_estimate": cls._torchrl_value_estimate},
                  EXPECTED_FUNCTIONALS[cls.__name__])
    cls._direct_class = cls
    cls.value_estimate = _keyed_value_estimate(cls._torchrl_value_estimate)
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
    _coefficients = {"gamma": (0.0, 1.0), "rho_thresh": (0.0, None), "c_thresh": (0.0, None)}
