r"""Generalized advantage estimation (Schulman et al., 2016).

.. math::

    \delta_t = r_t + \gamma_t (1 - \mathrm{terminated}_t)\, V'_t - V_t, \qquad
    A_t = \delta_t + \gamma_t \lambda_t (1 - \mathrm{done}_t)\, A_{t+1}, \qquad
    \mathrm{value\_target}_t = A_t + V_t,

a reverse scan with :math:`a_t = \gamma_t \lambda_t (1 - \mathrm{done}_t)` and :math:`b_t = \delta_t`.
:math:`V'_t` is the value of the observation reached by step t, so a truncation (done, not terminated) bootstraps
from it and a termination does not; ``done`` stops the recursion either way. Past the last step
:math:`A_T` is ``initial_state`` (the advantage carried from the following segment of the same rollout) or zero.
The same numbers as TorchRL's loop ``generalized_advantage_estimate``.

Shifted input: with ``next_state_value=None`` and ``last_state_value`` given, :math:`V'_t` is read from
``state_value`` one step on, :math:`V'_t = V_{t+1}` for :math:`t < T - 1` and :math:`V'_{T-1}` = ``last_state_value``
(the layout of rollout buffers that store each value once, such as rsl_rl's and Stable-Baselines3's), with no
``next_state_value`` tensor built.
"""
from __future__ import annotations

import torch

from ._replay import replayable
from ._triton import tl, triton
from ._utils import check_coef, check_inputs, check_last_value_dtype, check_shifted, resolve_backend
from .scan import (
    WARP_LOCAL_T, chunk, empty_state, from_rows_time, last_step_value, launch, load_coef, load_next_step,
    load_not_flags, load_tile, new_outputs, next_value_input, next_value_rows, not_flag, row_prologue, rows_state,
    rows_time, scan_rows, scan_tile, state_out, store_state, store_tile, zero_where,
)

__all__ = ["gae"]


def gae_coefficients(reward, state_value, next_state_value, not_done, not_terminated, gamma, lmbda):
    """(a_t, b_t) of the GAE recurrence; plain arithmetic shared by the Triton kernel and the torch path."""
    delta = reward + gamma * not_terminated * next_state_value - state_value
    return gamma * lmbda * not_done, delta


_gae_coefficients = triton.jit(gae_coefficients)


@triton.jit
def _gae_fwd_kernel(
    r_ptr, v_ptr, nv_ptr, d_ptr, term_ptr, gamma_ptr, lmbda_ptr, adv_ptr, vt_ptr, h0_ptr, ht_ptr, lb_ptr,
    gamma, lmbda, n_rows, inner, T,
    s_r_o, s_r_t, s_r_i, s_v_o, s_v_t, s_v_i, s_nv_o, s_nv_t, s_nv_i,
    s_d_o, s_d_t, s_d_i, s_term_o, s_term_t, s_term_i,
    s_gamma_o, s_gamma_t, s_gamma_i, s_lmbda_o, s_lmbda_t, s_lmbda_i,
    ACC: tl.constexpr, GAMMA_TENSOR: tl.constexpr, LMBDA_TENSOR: tl.constexpr,
    SAME_FLAGS: tl.constexpr, HAS_INITIAL_STATE: tl.constexpr, STORE_FINAL_STATE: tl.constexpr,
    CUT_A: tl.constexpr, LOOKBACK: tl.constexpr, WINDOW: tl.constexpr, INT64: tl.constexpr, ONE_CHUNK: tl.constexpr,
    NUM_STAGES: tl.constexpr, DESCENDING: tl.constexpr,
    SHIFTED: tl.constexpr, SHIFT_IN_TILE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr,
):
    # SHIFTED: V' is v one step on, and nv holds the last value [*B, *F] (time stride 0), read at t = T - 1 only
    o_o, o_i, o_r, m_r, b_h, n_chunks, c_lo, c_hi = row_prologue(
        h0_ptr, lb_ptr, n_rows, inner, T, ACC, BLOCK_R, BLOCK_T, HAS_INITIAL_STATE, LOOKBACK, WINDOW, INT64, ONE_CHUNK)
    # SHIFT_IN_TILE: batch-major rows of several chunks, whose next step is the next element (``load_next_step``);
    # time-major rows read a whole row of steps on, aligned
    b_v_after = tl.zeros([BLOCK_R], dtype=ACC)  # [BLOCK_R] v at the first step of the chunk after this one
    for i_c in tl.range(c_lo, c_hi, num_stages=NUM_STAGES):
        o_t, m, w = chunk(i_c, n_chunks, T, o_o, m_r, BLOCK_T, True, LOOKBACK, WINDOW, INT64, DESCENDING)
        b_r = load_tile(r_ptr, o_o, o_i, o_t, s_r_o, s_r_t, s_r_i, m, ACC, w)  # [BLOCK_R, BLOCK_T]
        b_v = load_tile(v_ptr, o_o, o_i, o_t, s_v_o, s_v_t, s_v_i, m, ACC, w)  # [BLOCK_R, BLOCK_T]
        b_nd, b_nterm = load_not_flags(d_ptr, term_ptr, o_o, o_i, o_t, s_d_o, s_d_t, s_d_i,
                                       s_term_o, s_term_t, s_term_i, m, ACC, SAME_FLAGS, w)  # [BLOCK_R, BLOCK_T]
        if SHIFTED:
            b_nv, b_v_after = load_next_step(v_ptr, b_v, b_v_after, o_o, o_i, o_t, s_v_o, s_v_t, s_v_i, m, T, ACC,
                                             SHIFT_IN_TILE, LOOKBACK, w=w)
            b_nv = last_step_value(b_nv, nv_ptr, o_o, o_i, o_t, s_nv_o, s_nv_i, m_r, T, ACC)  # [BLOCK_R, BLOCK_T]
        else:
            b_nv = load_tile(nv_ptr, o_o, o_i, o_t, s_nv_o, s_nv_t, s_nv_i, m, ACC, w)  # [BLOCK_R, BLOCK_T]
        # V' of a terminated step is never read (nor can a NaN there leak)
        b_nv = zero_where(b_nv, b_nterm == 0)
        b_g = load_coef(gamma_ptr, gamma, o_o, o_i, o_t, s_gamma_o, s_gamma_t, s_gamma_i, m, ACC, GAMMA_TENSOR)
        b_l = load_coef(lmbda_ptr, lmbda, o_o, o_i, o_t, s_lmbda_o, s_lmbda_t, s_lmbda_i, m, ACC, LMBDA_TENSOR)
        b_a, b_b = _gae_coefficients(b_r, b_v, b_nv, b_nd, b_nterm, b_g, b_l)
        b_adv, b_h = scan_tile(b_a, b_b, b_h, m, not DESCENDING, CUT_A, lb_ptr, o_r, i_c, n_chunks, LOOKBACK,
                               STORE_FINAL_STATE)
        store_tile(adv_ptr, b_adv, o_o, o_i, o_t, T, inner, m, w)
        store_tile(vt_ptr, b_adv + b_v, o_o, o_i, o_t, T, inner, m, w)
    store_state(ht_ptr, b_h, o_r, m_r, c_hi, n_chunks, STORE_FINAL_STATE)


@replayable
def gae(
    reward: torch.Tensor,
    state_value: torch.Tensor,
    next_state_value: torch.Tensor | None,
    done: torch.Tensor,
    terminated: torch.Tensor | None = None,
    *,
    gamma: float | torch.Tensor,
    lmbda: float | torch.Tensor,
    time_dim: int | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    last_state_value: torch.Tensor | None = None,
    backend: str = "auto",
):
    r"""Generalized advantage estimate and value target in one pass.

    Args:
        reward (Tensor): ``[*B, T, *F]`` rewards.
        state_value (Tensor): ``[*B, T, *F]`` values :math:`V(s_t)`.
        next_state_value (Tensor or None): ``[*B, T, *F]`` values of the next observations :math:`V(s_{t+1})`;
            ``None`` with ``last_state_value`` to read them from ``state_value`` one step on (shifted mode).
        done (Tensor): ``[*B, T, *F]`` bool, the trajectory ends after step t (terminated or truncated).
        terminated (Tensor, optional): ``[*B, T, *F]`` bool, the episode terminated at step t (no bootstrap).
            Defaults to ``done``.

    Keyword Args:
        gamma (float or Tensor): discount, a number or a tensor broadcastable to the inputs (e.g. per-step
            ``gamma ** steps_to_next_obs``).
        lmbda (float or Tensor): GAE lambda, likewise.
        time_dim (int, optional): the time dimension. Defaults to ``-2`` (TorchRL's ``[*B, T, 1]``), except
            that 2-D inputs must name it (they raise without it): ``-1`` for ``[B, T]``, ``0`` for ``[T, B]``.
        initial_state (Tensor, optional): ``[*B, *F]`` advantage :math:`A_T` carried in from the segment that
            follows this one. Defaults to zero.
        output_final_state (bool): also return :math:`A_0` (float32, or float64 for float64 inputs), the state to
            pass as ``initial_state`` to the preceding segment. Defaults to ``False``.
        last_state_value (Tensor, optional): ``[*B, *F]`` value of the observation after the last step,
            :math:`V(s_T)`, in the inputs' dtype. Given (with ``next_state_value=None``), :math:`V(s_{t+1})` is read
            from ``state_value`` at step t + 1 for t < T - 1 and from ``last_state_value`` at t = T - 1, with no
            next-value tensor built: the storage of rollout buffers that keep one value per step (rsl_rl,
            Stable-Baselines3). After a done step, ``state_value`` at t + 1 belongs to the next episode, so no step
            that is done may bootstrap: leave ``terminated`` to default to ``done``, as those libraries do (they
            bootstrap time-outs in the reward). Mutually exclusive with ``next_state_value``.
        backend (str): ``"auto"`` (Triton on CUDA, torch elsewhere), ``"triton"`` or ``"torch"``.

    Returns:
        ``(advantage, value_target)`` in the input shape and dtype, plus the final state if asked for.

    Examples:
        >>> reward = torch.ones(2, 4, 1)
        >>> value = torch.zeros(2, 4, 1)
        >>> done = torch.zeros(2, 4, 1, dtype=torch.bool)
        >>> adv, target = gae(reward, value, value, done, gamma=0.9, lmbda=1.0)
        >>> adv[0, :, 0]
        tensor([3.4390, 2.7100, 1.9000, 1.0000])

        The same rollout stored time-major, each value once (rsl_rl's ``[T, N, 1]`` storage):

        >>> value = torch.zeros(4, 2, 1)
        >>> last_value = torch.zeros(2, 1)
        >>> adv, target = gae(reward.transpose(0, 1), value, None, done.transpose(0, 1), gamma=0.9, lmbda=1.0,
        ...                   time_dim=0, last_state_value=last_value)
        >>> adv[:, 0, 0]
        tensor([3.4390, 2.7100, 1.9000, 1.0000])
    """
    shifted = check_shifted(next_state_value, last_state_value)
    layout = check_inputs(
        time_dim,
        {"reward": reward, "state_value": state_value, "next_state_value": next_state_value},
        {"done": done, "terminated": terminated},
        {"initial_state": initial_state, "last_state_value": last_state_value},
        optional=("terminated", "next_state_value") if shifted else ("terminated",),
    )
    if shifted:
        check_last_value_dtype(last_state_value, layout, "reward")
    gamma = check_coef("gamma", gamma, layout)
    lmbda = check_coef("lmbda", lmbda, layout)
    terminated = done if terminated is None else terminated
    if layout.empty:
        adv, vt = new_outputs(layout, 2)
        ht = empty_state(layout, initial_state)
    elif (path := resolve_backend(backend, layout.device, reward, state_value, next_state_value, gamma, lmbda,
                                  initial_state, last_state_value)) != "triton":
        v = rows_time(state_value, layout)
        nv = next_value_rows(v, next_state_value, last_state_value, terminated, layout)
        b_a, b_b = gae_coefficients(
            rows_time(reward, layout), v, nv,
            not_flag(done, layout),
            not_flag(terminated, layout), rows_time(gamma, layout), rows_time(lmbda, layout),
        )
        h, ht = scan_rows(b_a, b_b, rows_state(initial_state), True, path)
        adv, vt, ht = from_rows_time(h, layout), from_rows_time(h + v, layout), state_out(ht, layout)
    else:  # the outputs are allocated here, on the path that writes them
        adv, vt = new_outputs(layout, 2)
        ht = launch(
            _gae_fwd_kernel, layout,
            inputs={"r": reward, "v": state_value,
                    "nv": next_value_input(next_state_value, last_state_value, layout),
                    "d": done, "term": terminated},
            coefs={"gamma": gamma, "lmbda": lmbda},
            outputs={"adv": adv, "vt": vt},
            initial_state=initial_state, output_final_state=output_final_state, finite_a=True, SHIFTED=shifted,
            SHIFT_IN_TILE=shifted and layout.inner == 1 and layout.T > WARP_LOCAL_T.value,
        )
    return (adv, vt, ht) if output_final_state else (adv, vt)
