r"""TD(:math:`\lambda`) returns, and their special cases TD(0), TD(1) and discounted reward-to-go.

With the bootstrap :math:`\hat V_t = (1 - \mathrm{terminated}_t) V'_t` (the value of the observation reached by
step t, zero after a termination),

.. math::

    G_t = r_t + \gamma_t \big[(1 - \lambda_t) \hat V_t
          + \lambda_t \big((1 - \mathrm{done}_t)\, G_{t+1} + \mathrm{done}_t \hat V_t\big)\big],

a reverse scan with :math:`a_t = \gamma_t \lambda_t (1 - \mathrm{done}_t)` and
:math:`b_t = r_t + \gamma_t \hat V_t (1 - \lambda_t (1 - \mathrm{done}_t))`. A truncation bootstraps from
:math:`V'_t`, a termination from nothing. Past the last step :math:`G_T` is ``initial_state`` (the return carried in
from the following segment); without it the window end bootstraps like a truncation. Special cases:
:math:`\lambda = 0` is TD(0), :math:`r_t + \gamma_t \hat V_t`; :math:`\lambda = 1` is TD(1), the discounted return
bootstrapped at truncations and at the window end; with no ``next_state_value`` it is the plain discounted
reward-to-go within episodes. The same numbers as TorchRL's loop ``td_lambda_return_estimate`` (and
``td1_return_estimate``, ``td0_return_estimate``; ``rolling_gamma=True``).
"""
from __future__ import annotations

import torch

from ._replay import replayable
from ._triton import tl, triton
from ._utils import InputError, check_coef, check_inputs, resolve_backend
from .scan import (
    chunk, empty_state, from_rows_time, launch, load_coef, load_tile, new_outputs, not_flag, row_prologue,
    rows_state, rows_time, rows_time_unless, scan_rows, scan_tile, state_out, store_state, store_tile, zero_where,
)

__all__ = ["td_lambda_return", "td_lambda_advantage", "discounted_return"]


def td_lambda_coefficients(reward, next_state_value, not_done, not_terminated, gamma, lmbda):
    """(a_t, b_t) of the TD(lambda) recurrence; plain arithmetic shared by the Triton kernel and the torch path."""
    bootstrap = next_state_value * not_terminated
    return gamma * lmbda * not_done, reward + gamma * bootstrap * (1.0 - lmbda * not_done)


_td_lambda_coefficients = triton.jit(td_lambda_coefficients)


@triton.jit
def _td_lambda_fwd_kernel(
    r_ptr, nv_ptr, v_ptr, d_ptr, term_ptr, gamma_ptr, lmbda_ptr, out_ptr, adv_ptr, h0_ptr, ht_ptr, lb_ptr,
    gamma, lmbda, n_rows, inner, T,
    s_r_o, s_r_t, s_r_i, s_nv_o, s_nv_t, s_nv_i, s_v_o, s_v_t, s_v_i,
    s_d_o, s_d_t, s_d_i, s_term_o, s_term_t, s_term_i,
    s_gamma_o, s_gamma_t, s_gamma_i, s_lmbda_o, s_lmbda_t, s_lmbda_i,
    ACC: tl.constexpr, GAMMA_TENSOR: tl.constexpr, LMBDA_TENSOR: tl.constexpr,
    HAS_NEXT_VALUE: tl.constexpr, HAS_VALUE: tl.constexpr, STORE_ADVANTAGE: tl.constexpr, SAME_FLAGS: tl.constexpr,
    DONE_OR_TERMINATED: tl.constexpr, HAS_INITIAL_STATE: tl.constexpr, STORE_FINAL_STATE: tl.constexpr,
    CUT_A: tl.constexpr, LOOKBACK: tl.constexpr, WINDOW: tl.constexpr, INT64: tl.constexpr, ONE_CHUNK: tl.constexpr,
    NUM_STAGES: tl.constexpr, DESCENDING: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr,
):
    o_o, o_i, o_r, m_r, b_h, n_chunks, c_lo, c_hi = row_prologue(
        h0_ptr, lb_ptr, n_rows, inner, T, ACC, BLOCK_R, BLOCK_T, HAS_INITIAL_STATE, LOOKBACK, WINDOW, INT64, ONE_CHUNK)
    for i_c in tl.range(c_lo, c_hi, num_stages=NUM_STAGES):
        o_t, m, w = chunk(i_c, n_chunks, T, o_o, m_r, BLOCK_T, True, LOOKBACK, WINDOW, INT64, DESCENDING)
        b_r = load_tile(r_ptr, o_o, o_i, o_t, s_r_o, s_r_t, s_r_i, m, ACC, w)  # [BLOCK_R, BLOCK_T]
        b_d = load_tile(d_ptr, o_o, o_i, o_t, s_d_o, s_d_t, s_d_i, m, ACC, w)  # [BLOCK_R, BLOCK_T]
        if SAME_FLAGS:  # one tensor serves as done and terminated: read once
            b_term = b_d
        else:
            b_term = load_tile(term_ptr, o_o, o_i, o_t, s_term_o, s_term_t, s_term_i, m, ACC, w)  # [BLOCK_R, BLOCK_T]
            if DONE_OR_TERMINATED:
                b_d = tl.maximum(b_d, b_term)
        if (not HAS_INITIAL_STATE) and HAS_NEXT_VALUE:
            # the window end bootstraps like a truncation (without next values that is from zero, as h_T = 0 is)
            b_d = tl.where(o_t == T - 1, 1.0, b_d)
        if HAS_NEXT_VALUE:
            # V' of a terminated step is never read (nor can a NaN there leak)
            b_nv = zero_where(load_tile(nv_ptr, o_o, o_i, o_t, s_nv_o, s_nv_t, s_nv_i, m, ACC, w), b_term != 0)
        else:
            b_nv = tl.zeros_like(b_r)
        b_g = load_coef(gamma_ptr, gamma, o_o, o_i, o_t, s_gamma_o, s_gamma_t, s_gamma_i, m, ACC, GAMMA_TENSOR)
        b_l = load_coef(lmbda_ptr, lmbda, o_o, o_i, o_t, s_lmbda_o, s_lmbda_t, s_lmbda_i, m, ACC, LMBDA_TENSOR)
        b_a, b_b = _td_lambda_coefficients(b_r, b_nv, 1.0 - b_d, 1.0 - b_term, b_g, b_l)
        b_ret, b_h = scan_tile(b_a, b_b, b_h, m, not DESCENDING, CUT_A, lb_ptr, o_r, i_c, n_chunks, LOOKBACK,
                               STORE_FINAL_STATE)
        if HAS_VALUE:
            b_v = load_tile(v_ptr, o_o, o_i, o_t, s_v_o, s_v_t, s_v_i, m, ACC, w)
            if STORE_ADVANTAGE:  # G into out, and G as stored minus V: ``out - v`` in the outputs' dtype, exactly
                store_tile(adv_ptr, b_ret.to(out_ptr.dtype.element_ty).to(ACC) - b_v, o_o, o_i, o_t, T, inner, m, w)
            else:  # G - V into out, rounded once
                b_ret -= b_v
        store_tile(out_ptr, b_ret, o_o, o_i, o_t, T, inner, m, w)
    store_state(ht_ptr, b_h, o_r, m_r, c_hi, n_chunks, STORE_FINAL_STATE)


def _td_lambda(reward, next_state_value, done, terminated, state_value, *, gamma, lmbda, time_dim, initial_state,
               output_final_state, backend, done_or_terminated=False, return_value_target=False):
    """Shared body of the public functions: returns (or advantages when ``state_value`` is given, and with
    ``return_value_target`` the pair ``(returns - state_value, returns)``, the subtraction in the inputs' dtype)."""
    layout = check_inputs(
        time_dim,
        {"reward": reward, "next_state_value": next_state_value, "state_value": state_value},
        {"done": done, "terminated": terminated},
        {"initial_state": initial_state},
        optional=("next_state_value", "state_value", "done", "terminated"),
    )
    if done is None and terminated is None:
        raise InputError("pass done (and/or terminated) flags")
    gamma = check_coef("gamma", gamma, layout)
    lmbda = check_coef("lmbda", lmbda, layout)
    terminated = done if terminated is None else terminated
    done = terminated if done is None else done
    n_outputs = 1 + return_value_target
    if layout.empty:
        out, *adv = new_outputs(layout, n_outputs)
        ht = empty_state(layout, initial_state)
    elif (path := resolve_backend(backend, layout.device, reward, next_state_value, state_value, gamma,
                                  lmbda, initial_state)) != "triton":
        r = rows_time(reward, layout)
        nv = torch.zeros_like(r) if next_state_value is None else rows_time_unless(next_state_value, terminated,
                                                                                    layout)
        if isinstance(lmbda, float) and lmbda == 0.0:  # TD(0): every a_t is 0, G_t = r_t + gamma_t V'_t, no scan
            h = r + rows_time(gamma, layout) * nv
            ht = h[:, 0].clone()
        else:
            nd, nterm = not_flag(done, layout), not_flag(terminated, layout)
            if done_or_terminated:
                nd = nd * nterm
            if initial_state is None:  # the window end bootstraps like a truncation
                nd[:, -1] = 0.0
            b_a, b_b = td_lambda_coefficients(r, nv, nd, nterm, rows_time(gamma, layout), rows_time(lmbda, layout))
            h, ht = scan_rows(b_a, b_b, rows_state(initial_state), True, path)
        if state_value is not None and not return_value_target:
            h = h - rows_time(state_value, layout)
        out, ht = from_rows_time(h, layout), state_out(ht, layout)
        adv = [out - state_value] if return_value_target else []  # the returns as returned, minus V
    else:  # the outputs are allocated here, on the path that writes them
        out, *adv = new_outputs(layout, n_outputs)
        inputs = {"r": reward, "nv": next_state_value, "v": state_value, "d": done, "term": terminated}
        ht = launch(
            _td_lambda_fwd_kernel, layout,
            inputs={k: (reward if x is None else x) for k, x in inputs.items()},  # absent ones are never read
            coefs={"gamma": gamma, "lmbda": lmbda},
            outputs={"out": out, "adv": adv[0] if adv else None},
            initial_state=initial_state, output_final_state=output_final_state, finite_a=True,
            HAS_NEXT_VALUE=next_state_value is not None, HAS_VALUE=state_value is not None,
            STORE_ADVANTAGE=return_value_target, DONE_OR_TERMINATED=done_or_terminated,
        )
    result = (*adv, out, *([ht] if output_final_state else []))
    return result if len(result) > 1 else out


def _require(name: str, x) -> None:
    """TD(lambda) needs the values it bootstraps from (and subtracts): a None would silently mean zeros."""
    if x is None:
        hint = " (discounted_return computes returns without a bootstrap)" if name == "next_state_value" else ""
        raise TypeError(f"{name} must be a floating-point torch.Tensor, got None{hint}")


_COMMON_ARGS = r"""
    Keyword Args:
        gamma (float or Tensor): discount, a number or a tensor broadcastable to the inputs.
        lmbda (float or Tensor): lambda, likewise (0 gives TD(0), 1 gives TD(1)).
        time_dim (int, optional): the time dimension. Defaults to ``-2`` (TorchRL's ``[*B, T, 1]``), except
            that 2-D inputs must name it (they raise without it): ``-1`` for ``[B, T]``, ``0`` for ``[T, B]``.
        initial_state (Tensor, optional): ``[*B, *F]`` return :math:`G_T` carried in from the following segment.
            Without it the window end bootstraps from ``next_state_value`` like a truncation.
        output_final_state (bool): also return :math:`G_0` (float32, or float64 for float64 inputs), the state to
            pass as ``initial_state`` to the preceding segment. Defaults to ``False``.
        done_or_terminated (bool): treat a terminated step as done even where ``done`` is not set (TorchRL's TD(1)
            does; TD(lambda) does not). Only matters for inconsistent flags. Defaults to ``False``.
        backend (str): ``"auto"`` (Triton on CUDA, torch elsewhere), ``"triton"`` or ``"torch"``.
"""


@replayable
def td_lambda_return(
    reward, next_state_value, done, terminated=None, *, gamma, lmbda, time_dim=None, initial_state=None,
    output_final_state=False, done_or_terminated=False, backend="auto",
):
    r"""TD(:math:`\lambda`) returns :math:`G_t`.

    Args:
        reward (Tensor): ``[*B, T, *F]`` rewards.
        next_state_value (Tensor): ``[*B, T, *F]`` values of the next observations.
        done (Tensor): ``[*B, T, *F]`` bool, the trajectory ends after step t (terminated or truncated).
        terminated (Tensor, optional): ``[*B, T, *F]`` bool, the episode terminated (no bootstrap). Defaults to
            ``done``.
    {common}
    Returns:
        The returns in the input shape and dtype, plus the final state if asked for.

    Examples:
        >>> reward = torch.ones(1, 3, 1)
        >>> next_value = torch.full((1, 3, 1), 10.0)
        >>> done = torch.zeros(1, 3, 1, dtype=torch.bool)
        >>> td_lambda_return(reward, next_value, done, gamma=0.5, lmbda=1.0)[0, :, 0]
        tensor([3.0000, 4.0000, 6.0000])
    """
    _require("next_state_value", next_state_value)
    return _td_lambda(reward, next_state_value, done, terminated, None, gamma=gamma, lmbda=lmbda, time_dim=time_dim,
                      initial_state=initial_state, output_final_state=output_final_state, backend=backend,
                      done_or_terminated=done_or_terminated)


@replayable
def td_lambda_advantage(
    reward, state_value, next_state_value, done, terminated=None, *, gamma, lmbda, time_dim=None, initial_state=None,
    output_final_state=False, done_or_terminated=False, return_value_target=False, backend="auto",
):
    r"""TD(:math:`\lambda`) advantages :math:`G_t - V_t`, the subtraction fused into the scan.

    Args:
        reward (Tensor): ``[*B, T, *F]`` rewards.
        state_value (Tensor): ``[*B, T, *F]`` values :math:`V_t`.
        next_state_value (Tensor): ``[*B, T, *F]`` values of the next observations.
        done (Tensor): ``[*B, T, *F]`` bool, the trajectory ends after step t.
        terminated (Tensor, optional): ``[*B, T, *F]`` bool, the episode terminated. Defaults to ``done``.
    {common}        return_value_target (bool): also return the returns :math:`G_t` (TorchRL's ``value_target``), from the
            same kernel; the advantages are then exactly ``value_target - state_value`` in the inputs' dtype (as
            TorchRL's TD(lambda) estimator computes them; without it :math:`G_t - V_t` is rounded once, which
            differs only for inputs narrower than float32). Defaults to ``False``.

    Returns:
        The advantages in the input shape and dtype (``(advantage, value_target)`` with ``return_value_target``),
        plus the final state (of :math:`G`) if asked for.
    """
    _require("next_state_value", next_state_value)
    _require("state_value", state_value)
    return _td_lambda(reward, next_state_value, done, terminated, state_value, gamma=gamma, lmbda=lmbda,
                      time_dim=time_dim, initial_state=initial_state, output_final_state=output_final_state,
                      backend=backend, done_or_terminated=done_or_terminated,
                      return_value_target=return_value_target)


@replayable
def discounted_return(
    reward, done, *, gamma, next_state_value=None, terminated=None, time_dim=None, initial_state=None,
    output_final_state=False, backend="auto",
):
    r"""Discounted reward-to-go within episodes, :math:`G_t = r_t + \gamma_t (1 - \mathrm{done}_t) G_{t+1}`.

    Args:
        reward (Tensor): ``[*B, T, *F]`` rewards.
        done (Tensor): ``[*B, T, *F]`` bool, the episode ends after step t.

    Keyword Args:
        gamma (float or Tensor): discount, a number or a tensor broadcastable to the inputs.
        next_state_value (Tensor, optional): ``[*B, T, *F]`` values of the next observations. If given, the
            return bootstraps from it at truncations (done and not terminated) and at the window end: TD(1).
            Defaults to no bootstrap.
        terminated (Tensor, optional): ``[*B, T, *F]`` bool; with ``next_state_value``, the steps that do not
            bootstrap. Defaults to ``done``.
        time_dim (int, optional): the time dimension. Defaults to ``-2`` (TorchRL's ``[*B, T, 1]``), except
            that 2-D inputs must name it (they raise without it): ``-1`` for ``[B, T]``, ``0`` for ``[T, B]``.
        initial_state (Tensor, optional): ``[*B, *F]`` return carried in from the following segment.
        output_final_state (bool): also return :math:`G_0`. Defaults to ``False``.
        backend (str): ``"auto"``, ``"triton"`` or ``"torch"``.

    Returns:
        The returns in the input shape and dtype, plus the final state if asked for.

    Examples:
        >>> reward = torch.ones(1, 4, 1)
        >>> done = torch.tensor([False, True, False, False]).view(1, 4, 1)
        >>> discounted_return(reward, done, gamma=0.5)[0, :, 0]
        tensor([1.5000, 1.0000, 1.5000, 1.0000])
    """
    return _td_lambda(reward, next_state_value, done, terminated, None, gamma=gamma, lmbda=1.0, time_dim=time_dim,
                      initial_state=initial_state, output_final_state=output_final_state, backend=backend,
                      done_or_terminated=True)


td_lambda_return.__doc__ = td_lambda_return.__doc__.format(common=_COMMON_ARGS)
td_lambda_advantage.__doc__ = td_lambda_advantage.__doc__.format(common=_COMMON_ARGS)
