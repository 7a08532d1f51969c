"""TorchRL's value functionals, same names, arguments, defaults and outputs, computed by our kernels.

A drop-in for ``torchrl.objectives.value.functional``: replace the import and nothing else changes, except speed.
Each function also takes a keyword-only ``backend`` (``"auto"``: Triton on CUDA, torch elsewhere; ``"triton"``;
``"torch"``).

The ``vec_*`` variants are the same exact computation as the loop ones: TorchRL's vectorised versions cut the
discount series off below 1e-7, ours do not, so ours equal TorchRL's loop functionals to rounding and its vectorised
ones to about 1e-7 relative. ``rolling_gamma=False`` (a per-step gamma tied to the whole remaining trajectory) is
not a first-order recurrence: it runs TorchRL's own code, so the loop names compute it (O(T^2)) and the ``vec_*``
names raise TorchRL's ``NotImplementedError``, exactly as TorchRL does.

TD(0) (``td0_return_estimate``, ``td0_advantage_estimate``) has no recursion along time: it is one elementwise torch
expression on every backend, on inputs of any shape (0-d and 1-D too, as DQN and CQL call it), with no
``time_dim``; how exact it is, is in ``_td0``.
"""
from __future__ import annotations

import warnings

import torch
from torchrl.objectives.value import functional as _trl_functional

from .kernels import InputError
from .kernels._utils import check_coef, check_inputs, resolve_backend
from .kernels.gae import gae
from .kernels.td_lambda import discounted_return, td_lambda_advantage, td_lambda_return
from .kernels.vtrace import vtrace

__all__ = [
    "generalized_advantage_estimate",
    "vec_generalized_advantage_estimate",
    "td0_advantage_estimate",
    "td0_return_estimate",
    "td1_return_estimate",
    "vec_td1_return_estimate",
    "td1_advantage_estimate",
    "vec_td1_advantage_estimate",
    "td_lambda_return_estimate",
    "vec_td_lambda_return_estimate",
    "td_lambda_advantage_estimate",
    "vec_td_lambda_advantage_estimate",
    "vtrace_advantage_estimate",
    "reward2go",
]


def generalized_advantage_estimate(
    gamma, lmbda, state_value, next_state_value, reward, done, terminated=None, *, time_dim=-2, backend="auto"
):
    """Generalized advantage estimate: ``(advantage, value_target)``.

    Args:
        gamma (float or Tensor): discount.
        lmbda (float or Tensor): GAE lambda.
        state_value (Tensor): ``[*B, T, *F]`` values of the observations.
        next_state_value (Tensor): ``[*B, T, *F]`` values of the next observations.
        reward (Tensor): ``[*B, T, *F]`` rewards.
        done (Tensor): ``[*B, T, *F]`` bool, end of trajectory (terminated or truncated).
        terminated (Tensor, optional): ``[*B, T, *F]`` bool, end of episode. Defaults to ``done``.

    Keyword Args:
        time_dim (int): the time dimension. Defaults to ``-2``.
        backend (str): ``"auto"``, ``"triton"`` or ``"torch"``.
    """
    return gae(reward, state_value, next_state_value, done, terminated, gamma=gamma, lmbda=lmbda, time_dim=time_dim,
               backend=backend)


def vec_generalized_advantage_estimate(
    gamma, lmbda, state_value, next_state_value, reward, done, terminated=None, *, time_dim=-2, backend="auto"
):
    """Same as :func:`generalized_advantage_estimate` (exact; no 1e-7 cut-off)."""
    return generalized_advantage_estimate(gamma, lmbda, state_value, next_state_value, reward, done, terminated,
                                          time_dim=time_dim, backend=backend)


def _td0(gamma, state_value, next_state_value, reward, done, terminated, backend):
    """TD(0), elementwise on inputs of any shape (0-d too): ``reward + gamma * (1 - terminated) * next_state_value``
    (minus ``state_value`` when given). There is no recursion along time, so no scan and no ``time_dim``: one
    ``torch.addcmul`` on the CPU beside the flags' inversion; elsewhere the product with gamma, times the inverted
    flags, plus ``reward`` (TorchRL's expression takes five torch ops).

    Exactness: for float32 inputs the result is TorchRL's bit for bit, NaN and inf included (``0 * inf`` at a
    terminated step is NaN in both): the product ``gamma * next_state_value`` is rounded once and multiplied by an
    exact 0 or 1 before the one rounded addition, fused or not. float16/bfloat16 inputs are computed in float32 and
    rounded once (TorchRL returns float32 for them). A float64 call with a Python-number ``gamma`` multiplies by the
    float64 ``gamma`` (TorchRL's ``gamma * (~terminated).int()`` rounds it to float32 first).
    """
    floats = {"reward": reward, "next_state_value": next_state_value}
    if state_value is not None:
        floats["state_value"] = state_value
    flags = {"terminated": terminated} if done is None else {"done": done, "terminated": terminated}
    if type(reward) is torch.Tensor and reward.dim() == 0 and all(
            isinstance(x, torch.Tensor) and x.dim() == 0 for x in (*floats.values(), *flags.values())):
        # 0-d inputs: checked as one-element views (same dtypes, devices and, all being 0-d, shapes)
        layout = check_inputs(-1, {k: v.reshape(1) for k, v in floats.items()},
                              {k: v.reshape(1) for k, v in flags.items()})
    else:
        layout = check_inputs(-1, floats, flags)  # any time_dim in range: TD(0) reads none
    resolve_backend(backend, layout.device)  # the same backend errors as every functional; the path is torch ops
    gamma = check_coef("gamma", gamma, layout)
    if type(gamma) is torch.Tensor and gamma.is_cpu and gamma.numel() == 1:  # an estimator's buffer: its value
        gamma = gamma.item()
    acc = layout.acc_dtype  # float32 for float16/bfloat16 inputs: every op in it, one rounding at the end
    reward, next_state_value = _as(reward, acc), _as(next_state_value, acc)
    if type(gamma) is float and reward.is_cpu:
        # CPU's addcmul computes ``self + (value * t1) * t2``: the product rounded, times an exact 0 or 1
        out = torch.addcmul(reward, next_state_value, ~terminated, value=gamma)
    else:
        # the product with gamma rounded first, then times an exact 0 or 1; ``mul``/``add`` rather than addcmul on
        # CUDA: a process's first addcmul loads its kernel (lazy module loading, 20-70 ms on the H200), where
        # TorchRL's own ops have loaded these already
        out = reward + (next_state_value * gamma) * ~terminated
    if state_value is not None:
        out = out - _as(state_value, acc)
    return _as(out, layout.dtype)


def _as(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``x.to(dtype)``, without the call where it is a no-op (a dispatch of 1-4 µs of host time per tensor)."""
    return x if x.dtype == dtype else x.to(dtype)


def td0_return_estimate(gamma, next_state_value, reward, terminated=None, *, done=None, backend="auto"):
    """TD(0) targets ``reward + gamma * (1 - terminated) * next_state_value``, elementwise.

    Args:
        gamma (float or Tensor): discount; a tensor broadcastable to the inputs (e.g. ``gamma ** steps``).
        next_state_value (Tensor): values of the next observations, any shape (``[*B, T, *F]``, ``[B]``, 0-d).
        reward (Tensor): rewards, of the same shape.
        terminated (Tensor): bool, end of episode, of the same shape.

    Keyword Args:
        done (Tensor): deprecated alias of ``terminated``, read only when ``terminated`` is not given, with
            TorchRL's ``UserWarning``.
        backend (str): ``"auto"``, ``"triton"`` or ``"torch"``: validated as everywhere; TD(0) is one elementwise
            torch expression on every backend (no recursion along time).

    Returns:
        The targets, of the inputs' shape and dtype.

    Examples:
        >>> td0_return_estimate(0.5, torch.tensor([2.0, 2.0]), torch.ones(2), torch.tensor([False, True]))
        tensor([2., 1.])
    """
    if done is not None and terminated is None:
        terminated = done  # read, never written: no copy
        warnings.warn("done for td0_return_estimate is deprecated. Pass ``terminated`` instead.")
    if terminated is None:
        raise InputError("td0_return_estimate needs terminated flags")
    return _td0(gamma, None, next_state_value, reward, None, terminated, backend)


def td0_advantage_estimate(gamma, state_value, next_state_value, reward, done, terminated=None, *, backend="auto"):
    """TD(0) advantages ``reward + gamma * (1 - terminated) * next_state_value - state_value``, elementwise.

    Args:
        gamma (float or Tensor): discount; a tensor broadcastable to the inputs.
        state_value (Tensor): values of the observations, any shape.
        next_state_value (Tensor): values of the next observations, of the same shape.
        reward (Tensor): rewards, of the same shape.
        done (Tensor): bool, end of trajectory, of the same shape (checked, as in TorchRL; TD(0) reads
            ``terminated`` only).
        terminated (Tensor, optional): bool, end of episode. Defaults to ``done``.

    Keyword Args:
        backend (str): as in :func:`td0_return_estimate`.
    """
    return _td0(gamma, state_value, next_state_value, reward, done, done if terminated is None else terminated,
                backend)


# TorchRL's own functionals, taken before anything (``patch_torchrl``) can replace them by ours.
_TORCHRL = {name: getattr(_trl_functional, name) for name in _trl_functional.__all__}


def _torchrl_rolling(name, *args, **kwargs):
    """rolling_gamma=False: not a first-order recurrence; TorchRL's own loop computes it."""
    return _TORCHRL[name](*args, **kwargs)


def td1_return_estimate(
    gamma, next_state_value, reward, done, terminated=None, rolling_gamma=None, *, time_dim=-2, backend="auto"
):
    """TD(1) returns: discounted returns bootstrapped at truncations and at the window end.

    Args:
        gamma (float or Tensor): discount (a per-step tensor of the input shape is tied to its step).
        next_state_value (Tensor): ``[*B, T, *F]`` values of the next observations.
        reward (Tensor): ``[*B, T, *F]`` rewards.
        done (Tensor): ``[*B, T, *F]`` bool, end of trajectory.
        terminated (Tensor, optional): ``[*B, T, *F]`` bool, end of episode. Defaults to ``done``.
        rolling_gamma (bool, optional): as in TorchRL; ``False`` runs TorchRL's loop.

    Keyword Args:
        time_dim (int): the time dimension. Defaults to ``-2``.
        backend (str): ``"auto"``, ``"triton"`` or ``"torch"``.
    """
    if rolling_gamma is False:
        return _torchrl_rolling("td1_return_estimate", gamma, next_state_value, reward, done, terminated,
                                rolling_gamma, time_dim=time_dim)
    return td_lambda_return(reward, next_state_value, done, terminated, gamma=gamma, lmbda=1.0, time_dim=time_dim,
                            done_or_terminated=True, backend=backend)


def td1_advantage_estimate(
    gamma, state_value, next_state_value, reward, done, terminated=None, rolling_gamma=None, time_dim=-2, *,
    backend="auto",
):
    """TD(1) advantages: :func:`td1_return_estimate` minus ``state_value``."""
    if rolling_gamma is False:
        return _torchrl_rolling("td1_advantage_estimate", gamma, state_value, next_state_value, reward, done,
                                terminated, rolling_gamma, time_dim)
    return td_lambda_advantage(reward, state_value, next_state_value, done, terminated, gamma=gamma, lmbda=1.0,
                               time_dim=time_dim, done_or_terminated=True, backend=backend)


def vec_td1_return_estimate(
    gamma, next_state_value, reward, done, terminated=None, rolling_gamma=None, time_dim=-2, *, backend="auto"
):
    """Same as :func:`td1_return_estimate` (exact; no 1e-7 cut-off); ``rolling_gamma=False`` as TorchRL's."""
    if rolling_gamma is False:
        return _torchrl_rolling("vec_td1_return_estimate", gamma, next_state_value, reward, done, terminated,
                                rolling_gamma, time_dim)
    return td1_return_estimate(gamma, next_state_value, reward, done, terminated, rolling_gamma, time_dim=time_dim,
                               backend=backend)


def vec_td1_advantage_estimate(
    gamma, state_value, next_state_value, reward, done, terminated=None, rolling_gamma=None, time_dim=-2, *,
    backend="auto",
):
    """Same as :func:`td1_advantage_estimate` (exact; no 1e-7 cut-off); ``rolling_gamma=False`` as TorchRL's."""
    if rolling_gamma is False:
        return _torchrl_rolling("vec_td1_advantage_estimate", gamma, state_value, next_state_value, reward, done,
                                terminated, rolling_gamma, time_dim)
    return td1_advantage_estimate(gamma, state_value, next_state_value, reward, done, terminated, rolling_gamma,
                                  time_dim, backend=backend)


def td_lambda_return_estimate(
    gamma, lmbda, next_state_value, reward, done, terminated=None, rolling_gamma=None, *, time_dim=-2,
    backend="auto",
):
    """TD(lambda) returns.

    Args:
        gamma (float or Tensor): discount (a per-step tensor of the input shape is tied to its step).
        lmbda (float or Tensor): lambda, likewise.
        next_state_value (Tensor): ``[*B, T, *F]`` values of the next observations.
        reward (Tensor): ``[*B, T, *F]`` rewards.
        done (Tensor): ``[*B, T, *F]`` bool, end of trajectory.
        terminated (Tensor, optional): ``[*B, T, *F]`` bool, end of episode. Defaults to ``done``.
        rolling_gamma (bool, optional): as in TorchRL; ``False`` runs TorchRL's loop.

    Keyword Args:
        time_dim (int): the time dimension. Defaults to ``-2``.
        backend (str): ``"auto"``, ``"triton"`` or ``"torch"``.
    """
    if rolling_gamma is False:
        return _torchrl_rolling("td_lambda_return_estimate", gamma, lmbda, next_state_value, reward, done,
                                terminated, rolling_gamma, time_dim=time_dim)
    return td_lambda_return(reward, next_state_value, done, terminated, gamma=gamma, lmbda=lmbda, time_dim=time_dim,
                            backend=backend)


def td_lambda_advantage_estimate(
    gamma, lmbda, state_value, next_state_value, reward, done, terminated=None, rolling_gamma=None, time_dim=-2, *,
    backend="auto",
):
    """TD(lambda) advantages: :func:`td_lambda_return_estimate` minus ``state_value``."""
    if rolling_gamma is False:
        return _torchrl_rolling("td_lambda_advantage_estimate", gamma, lmbda, state_value, next_state_value,
                                reward, done, terminated, rolling_gamma, time_dim)
    return td_lambda_advantage(reward, state_value, next_state_value, done, terminated, gamma=gamma, lmbda=lmbda,
                               time_dim=time_dim, backend=backend)


def vec_td_lambda_return_estimate(
    gamma, lmbda, next_state_value, reward, done, terminated=None, rolling_gamma=None, *, time_dim=-2,
    backend="auto",
):
    """Same as :func:`td_lambda_return_estimate` (exact; no 1e-7 cut-off); ``rolling_gamma=False`` as TorchRL's."""
    if rolling_gamma is False:
        return _torchrl_rolling("vec_td_lambda_return_estimate", gamma, lmbda, next_state_value, reward, done,
                                terminated, rolling_gamma, time_dim=time_dim)
    return td_lambda_return_estimate(gamma, lmbda, next_state_value, reward, done, terminated, rolling_gamma,
                                     time_dim=time_dim, backend=backend)


def vec_td_lambda_advantage_estimate(
    gamma, lmbda, state_value, next_state_value, reward, done, terminated=None, rolling_gamma=None, time_dim=-2, *,
    backend="auto",
):
    """Same as :func:`td_lambda_advantage_estimate` (exact; no 1e-7 cut-off); ``rolling_gamma=False`` as
    TorchRL's."""
    if rolling_gamma is False:
        return _torchrl_rolling("vec_td_lambda_advantage_estimate", gamma, lmbda, state_value, next_state_value,
                                reward, done, terminated, rolling_gamma, time_dim)
    return td_lambda_advantage_estimate(gamma, lmbda, state_value, next_state_value, reward, done, terminated,
                                        rolling_gamma, time_dim, backend=backend)


def vtrace_advantage_estimate(
    gamma, log_pi, log_mu, state_value, next_state_value, reward, done, terminated=None, rho_thresh=1.0,
    c_thresh=1.0, time_dim=-2, *, backend="auto",
):
    """V-trace off-policy targets (IMPALA): ``(advantage, value_target)``.

    Args:
        gamma (float or Tensor): discount.
        log_pi (Tensor): ``[*B, T, *F]`` log-probabilities of the taken actions under the learner's policy.
        log_mu (Tensor): ``[*B, T, *F]`` log-probabilities of the taken actions under the behaviour policy.
        state_value (Tensor): ``[*B, T, *F]`` values of the observations.
        next_state_value (Tensor): ``[*B, T, *F]`` values of the next observations.
        reward (Tensor): ``[*B, T, *F]`` rewards.
        done (Tensor): ``[*B, T, *F]`` bool, end of trajectory.
        terminated (Tensor, optional): ``[*B, T, *F]`` bool, end of episode. Defaults to ``done``.
        rho_thresh (float or Tensor): clip of the importance weights of the TD errors. Defaults to ``1.0``.
        c_thresh (float or Tensor): clip of the trace weights. Defaults to ``1.0``.
        time_dim (int): the time dimension. Defaults to ``-2``.

    Keyword Args:
        backend (str): ``"auto"``, ``"triton"`` or ``"torch"``.
    """
    return vtrace(log_pi, log_mu, state_value, next_state_value, reward, done, terminated, gamma=gamma,
                  rho_thresh=rho_thresh, c_thresh=c_thresh, time_dim=time_dim, backend=backend)


def reward2go(reward, done, gamma, *, time_dim=-2, backend="auto"):
    """Discounted cumulative reward within episodes (reward-to-go), reset after each done step, no bootstrap.

    Args:
        reward (Tensor): ``[*B, T, *F]`` rewards.
        done (Tensor): ``[*B, T, *F]`` bool, end of episode.
        gamma (float or Tensor): discount.

    Keyword Args:
        time_dim (int): the time dimension. Defaults to ``-2``.
        backend (str): ``"auto"``, ``"triton"`` or ``"torch"``.

    Examples:
        >>> reward = torch.ones(1, 10)
        >>> done = torch.zeros(1, 10, dtype=torch.bool)
        >>> done[:, [3, 7]] = True
        >>> reward2go(reward, done, 0.5, time_dim=-1)
        tensor([[1.8750, 1.7500, 1.5000, 1.0000, 1.8750, 1.7500, 1.5000, 1.0000, 1.5000, 1.0000]])
    """
    if isinstance(done, torch.Tensor) and isinstance(reward, torch.Tensor) and reward.shape != done.shape:
        raise InputError(f"reward and done must share the same shape, got {getattr(reward, 'shape', None)} and "
                         f"{getattr(done, 'shape', None)}")
    return discounted_return(reward, done, gamma=gamma, time_dim=time_dim, backend=backend)
