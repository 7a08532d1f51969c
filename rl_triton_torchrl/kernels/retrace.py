r"""Retrace(:math:`\lambda`) Q targets (Munos et al., 2016).

With the truncated traces :math:`c_t = \lambda_t \min(\bar c, \pi(a_t|s_t) / \mu(a_t|s_t))`, the Retrace target of
the taken action is

.. math::

    Q^{ret}_t = r_t + \gamma_t (1 - \mathrm{terminated}_t)\, \mathbb{E}_\pi Q(s'_t, \cdot)
                + \gamma_t (1 - \mathrm{done}_t)\, c_{t+1} \big(Q^{ret}_{t+1} - Q(s_{t+1}, a_{t+1})\big),

the trace of the *next* step, :math:`c_{t+1}`, weighting the correction it carries back. :math:`s'_t` is the
observation reached by step t, so :math:`\mathbb{E}_\pi Q(s'_t, \cdot)` (``next_expected_q``) bootstraps a
truncation from the true next state, a termination bootstraps from nothing, and a done step never reads the next
episode. The kernel scans :math:`Q^{ret}` itself:

.. math::

    Q^{ret}_t = \underbrace{r_t + \gamma_t (1 - \mathrm{terminated}_t)\, \mathbb{E}_\pi Q(s'_t, \cdot)
                - a_t\, Q(s_{t+1}, a_{t+1})}_{b_t}
          + \underbrace{\gamma_t (1 - \mathrm{done}_t)\, c_{t+1}}_{a_t}\, Q^{ret}_{t+1},

a reverse scan whose :math:`c_{t+1}` and :math:`Q(s_{t+1}, a_{t+1})` are plain loads one step later (not a scan);
:math:`Q^{ret}_t` never reads :math:`Q(s_t, a_t)`, so a non-finite value there stays in that step's advantage
:math:`g_t = Q^{ret}_t - Q(s_t, a_t)`. The carried state is :math:`u_T = c_T g_T`, the trace-weighted correction at
the first step of the following segment of the rollout (``initial_state``), since :math:`c_T` belongs to that
segment: the last step takes :math:`c_{t+1} = 1`, :math:`Q(s_{t+1}, a_{t+1}) = 0` and :math:`Q^{ret}_{t+1} = u_T`.
Without it :math:`u_T = 0`: the window end bootstraps from :math:`\mathbb{E}_\pi Q(s'_{T-1}, \cdot)` like a
truncation. The final state is :math:`u_0 = c_0 g_0`. Outputs are
:math:`Q^{ret}_t` and the advantage :math:`g_t = Q^{ret}_t - Q(s_t, a_t)`.

``retrace`` takes the generic per-step inputs (any action space): :math:`Q(s_t, a_t)`, the ratio
:math:`\pi / \mu` of the taken action (or its log) and :math:`\mathbb{E}_\pi Q(s'_t, \cdot)`. ``retrace_discrete``
takes the per-action tensors of a discrete action space and reduces them to those with a gather and a sum. Its
shifted input mode (``next_pi=None, next_q_values=None`` with ``last_pi`` and ``last_q_values``) reads
:math:`\pi(\cdot|s'_t)` and :math:`Q(s'_t, \cdot)` from ``pi`` and ``q_values`` one step on and from the last ones
after the last step, as GAE's reads :math:`V'_t`.
"""
from __future__ import annotations

import torch

from ._replay import replayable
from ._triton import tl, triton
from ._utils import (
    DEFAULT_TIME_DIM, InputError, check_coef, check_inputs, check_last_value_dtype, check_nonnegative, check_shifted,
    check_values, checks_values, resolve_backend, views_without_copy,
)
from .scan import (
    chunk, compiled_for_length, edge_column, empty_state, from_rows_time, launch, load_coef, load_gather, load_index,
    load_not_flags, load_tile, new_outputs, next_value_input, not_flag, row_prologue, rows_state, rows_time,
    rows_time_unless, scan_rows, scan_tile, state_out, store_state, store_tile, zero_where,
)

__all__ = ["retrace", "retrace_discrete"]


def retrace_coefficients(reward, next_expected_q, not_done, not_terminated, gamma, next_trace):
    """a_t and the part of b_t without the next step's Q of the recurrence of Q_ret, with next_trace = c_(t+1);
    plain arithmetic shared by the Triton kernel and the torch path. b_t = that - a_t Q(s_(t+1), a_(t+1))."""
    return gamma * not_done * next_trace, reward + gamma * not_terminated * next_expected_q


_retrace_coefficients = triton.jit(retrace_coefficients)


@triton.jit
def _clipped_trace(b_ratio, lmbda_ptr, c_bar_ptr, lmbda, c_bar, o_o, o_i, o_t, m,
                   s_lmbda_o, s_lmbda_t, s_lmbda_i, s_c_bar_o, s_c_bar_t, s_c_bar_i,
                   ACC: tl.constexpr, LMBDA_TENSOR: tl.constexpr, C_BAR_TENSOR: tl.constexpr):
    """The traces c = lmbda * min(c_bar, ratio) [BLOCK_R, BLOCK_T] of the steps o_t, from their ratios."""
    b_l = load_coef(lmbda_ptr, lmbda, o_o, o_i, o_t, s_lmbda_o, s_lmbda_t, s_lmbda_i, m, ACC, LMBDA_TENSOR)
    b_cb = load_coef(c_bar_ptr, c_bar, o_o, o_i, o_t, s_c_bar_o, s_c_bar_t, s_c_bar_i, m, ACC, C_BAR_TENSOR)
    return b_l * tl.minimum(b_ratio, b_cb, propagate_nan=tl.PropagateNan.ALL)  # a NaN ratio gives a NaN trace


@triton.jit
def _ratio(ratio_ptr, o_o, o_i, o_t, s_ratio_o, s_ratio_t, s_ratio_i, m, ACC: tl.constexpr,
           LOG_RATIO: tl.constexpr):
    """The ratios pi / mu [BLOCK_R, BLOCK_T] of the steps o_t, loaded (or their logs, exponentiated)."""
    b_ratio = load_tile(ratio_ptr, o_o, o_i, o_t, s_ratio_o, s_ratio_t, s_ratio_i, m, ACC)
    if LOG_RATIO:
        b_ratio = tl.exp(b_ratio)
    return b_ratio


@triton.jit
def _retrace_tile(b_r, b_nq, b_nd, b_nterm, b_g, b_c1, b_q1, m_t1, b_h, m, CUT_A: tl.constexpr, lb_ptr, o_r, i_c,
                  n_chunks, LOOKBACK: tl.constexpr, STORE_FINAL_STATE: tl.constexpr):
    """Q_ret [BLOCK_R, BLOCK_T] of one tile and the state leaving it, from its rewards, expected next Q (already 0
    where terminated), not-done and not-terminated flags, discounts, and the next step's trace c_(t+1) and
    Q(s_(t+1), a_(t+1)) (``m_t1``: t + 1 inside the window; that Q loaded as 0 past it)."""
    # c_(t+1): past the window end 1, the carried state being c_T g_T already; not read after a done step (it
    # belongs to the next episode)
    b_c1 = tl.where(m_t1, zero_where(b_c1, b_nd == 0), 1.0)
    b_a, b_b = _retrace_coefficients(b_r, b_nq, b_nd, b_nterm, b_g, b_c1)
    b_q1 = zero_where(b_q1, b_a == 0)  # not read where a_t = 0
    return scan_tile(b_a, b_b - b_a * b_q1, b_h, m, True, CUT_A, lb_ptr, o_r, i_c, n_chunks, LOOKBACK,
                     STORE_FINAL_STATE)


@triton.jit
def _retrace_fwd_kernel(
    r_ptr, q_ptr, nq_ptr, ratio_ptr, d_ptr, term_ptr, gamma_ptr, lmbda_ptr, c_bar_ptr, qret_ptr, adv_ptr,
    h0_ptr, ht_ptr, lb_ptr,
    gamma, lmbda, c_bar, n_rows, inner, T,
    s_r_o, s_r_t, s_r_i, s_q_o, s_q_t, s_q_i, s_nq_o, s_nq_t, s_nq_i, s_ratio_o, s_ratio_t, s_ratio_i,
    s_d_o, s_d_t, s_d_i, s_term_o, s_term_t, s_term_i,
    s_gamma_o, s_gamma_t, s_gamma_i, s_lmbda_o, s_lmbda_t, s_lmbda_i, s_c_bar_o, s_c_bar_t, s_c_bar_i,
    ACC: tl.constexpr, GAMMA_TENSOR: tl.constexpr, LMBDA_TENSOR: tl.constexpr, C_BAR_TENSOR: tl.constexpr,
    LOG_RATIO: tl.constexpr, SAME_FLAGS: tl.constexpr, HAS_INITIAL_STATE: tl.constexpr,
    STORE_FINAL_STATE: tl.constexpr,
    CUT_A: tl.constexpr, LOOKBACK: tl.constexpr, WINDOW: tl.constexpr, INT64: tl.constexpr, ONE_CHUNK: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr,
):
    o_o, o_i, o_r, m_r, b_h, n_chunks, c_lo, c_hi = row_prologue(
        h0_ptr, lb_ptr, n_rows, inner, T, ACC, BLOCK_R, BLOCK_T, HAS_INITIAL_STATE, LOOKBACK, WINDOW, INT64, ONE_CHUNK)
    for i_c in tl.range(c_lo, c_hi, num_stages=NUM_STAGES):
        o_t, m, w = chunk(i_c, n_chunks, T, o_o, m_r, BLOCK_T, True, LOOKBACK, WINDOW, INT64)
        b_r = load_tile(r_ptr, o_o, o_i, o_t, s_r_o, s_r_t, s_r_i, m, ACC, w)  # [BLOCK_R, BLOCK_T]
        b_q = load_tile(q_ptr, o_o, o_i, o_t, s_q_o, s_q_t, s_q_i, m, ACC, w)  # [BLOCK_R, BLOCK_T]
        b_nd, b_nterm = load_not_flags(d_ptr, term_ptr, o_o, o_i, o_t, s_d_o, s_d_t, s_d_i,
                                       s_term_o, s_term_t, s_term_i, m, ACC, SAME_FLAGS, w)  # [BLOCK_R, BLOCK_T]
        # the expected Q' of a terminated step is never read (nor can a NaN there leak)
        b_nq = zero_where(load_tile(nq_ptr, o_o, o_i, o_t, s_nq_o, s_nq_t, s_nq_i, m, ACC, w), b_nterm == 0)
        b_g = load_coef(gamma_ptr, gamma, o_o, o_i, o_t, s_gamma_o, s_gamma_t, s_gamma_i, m, ACC, GAMMA_TENSOR)
        # c_(t+1) and Q(s_(t+1), a_(t+1)): loads one step later
        o_t1 = o_t + 1
        m_t1 = o_t1 < T
        m1 = m_r[:, None] & m_t1
        b_c1 = _clipped_trace(_ratio(ratio_ptr, o_o, o_i, o_t1, s_ratio_o, s_ratio_t, s_ratio_i, m1, ACC, LOG_RATIO),
                              lmbda_ptr, c_bar_ptr, lmbda, c_bar, o_o, o_i, o_t1, m1, s_lmbda_o, s_lmbda_t, s_lmbda_i,
                              s_c_bar_o, s_c_bar_t, s_c_bar_i, ACC, LMBDA_TENSOR, C_BAR_TENSOR)
        b_q1 = load_tile(q_ptr, o_o, o_i, o_t1, s_q_o, s_q_t, s_q_i, m1, ACC)
        b_qret, b_h = _retrace_tile(b_r, b_nq, b_nd, b_nterm, b_g, b_c1, b_q1, m_t1, b_h, m, CUT_A, lb_ptr, o_r,
                                    i_c, n_chunks, LOOKBACK, STORE_FINAL_STATE)
        store_tile(qret_ptr, b_qret, o_o, o_i, o_t, T, inner, m, w)
        store_tile(adv_ptr, b_qret - b_q, o_o, o_i, o_t, T, inner, m, w)
    if STORE_FINAL_STATE:  # u_0 = c_0 (Q_ret_0 - Q_0), from column 0 of a first-chunk tile
        o_t = tl.arange(0, BLOCK_T).to(tl.int64)[None, :]
        m_0 = m_r[:, None] & (o_t == 0)
        b_c0 = _clipped_trace(_ratio(ratio_ptr, o_o, o_i, o_t, s_ratio_o, s_ratio_t, s_ratio_i, m_0, ACC, LOG_RATIO),
                              lmbda_ptr, c_bar_ptr, lmbda, c_bar, o_o, o_i, o_t, m_0, s_lmbda_o, s_lmbda_t, s_lmbda_i,
                              s_c_bar_o, s_c_bar_t, s_c_bar_i, ACC, LMBDA_TENSOR, C_BAR_TENSOR)
        b_q0 = load_tile(q_ptr, o_o, o_i, o_t, s_q_o, s_q_t, s_q_i, m_0, ACC)  # [BLOCK_R, BLOCK_T]
        b_h = edge_column(b_c0, True) * (b_h - edge_column(b_q0, True))  # [BLOCK_R]
    store_state(ht_ptr, b_h, o_r, m_r, c_hi, n_chunks, STORE_FINAL_STATE)


@triton.jit
def _taken(pi_ptr, q_ptr, act_ptr, mu_ptr, n_actions, s_pi_a, s_q_a, o_o, o_i, o_t, m,
           s_pi_o, s_pi_t, s_pi_i, s_q_o, s_q_t, s_q_i, s_act_o, s_act_t, s_act_i, s_mu_o, s_mu_t, s_mu_i,
           ACC: tl.constexpr, LOG_RATIO: tl.constexpr):
    """(pi(a_t|s_t) / mu(a_t|s_t), Q(s_t, a_t)) [BLOCK_R, BLOCK_T] of the taken actions a_t of the steps o_t, by a
    gather along the action dimension; NaN for an action index outside [0, n_actions) (on CUDA nothing checks it
    before the kernel: a NaN instead of a read out of bounds). ``mu`` is mu(a_t|s_t), or its log with
    ``LOG_RATIO``."""
    b_idx = load_index(act_ptr, o_o, o_i, o_t, s_act_o, s_act_t, s_act_i, m)
    b_ok = (b_idx >= 0) & (b_idx < n_actions)
    b_pi = load_gather(pi_ptr, b_idx, s_pi_a, o_o, o_i, o_t, s_pi_o, s_pi_t, s_pi_i, m & b_ok, ACC)
    b_q = load_gather(q_ptr, b_idx, s_q_a, o_o, o_i, o_t, s_q_o, s_q_t, s_q_i, m & b_ok, ACC)
    b_mu = load_tile(mu_ptr, o_o, o_i, o_t, s_mu_o, s_mu_t, s_mu_i, m, ACC)
    return _taken_ratio(b_idx, b_pi, b_q, b_mu, n_actions, LOG_RATIO)


@triton.jit
def _taken_ratio(b_idx, b_pi, b_q, b_mu, n_actions, LOG_RATIO: tl.constexpr):
    """(pi / mu, Q) of the taken actions ``b_idx`` from their pi and Q; NaN where an index is outside
    [0, n_actions)."""
    b_ok = (b_idx >= 0) & (b_idx < n_actions)
    if LOG_RATIO:
        b_ratio = tl.exp(tl.log(b_pi) - b_mu)
    else:
        b_ratio = b_pi / b_mu
    return tl.where(b_ok, b_ratio, float("nan")), tl.where(b_ok, b_q, float("nan"))


@triton.jit
def _expected_q(pi_ptr, q_ptr, s_pi_a, s_q_a, n_actions, o_o, o_i, o_t, s_pi_o, s_pi_t, s_pi_i, s_q_o, s_q_t, s_q_i,
                m, ACC: tl.constexpr):
    """sum_a pi(a) Q(a) of the steps o_t, a block of the shape of the mask ``m``, from per-action tensors: ``pi_ptr``
    and ``q_ptr`` point at action 0 (strides those of that entry's view, ``s_*_a`` the action dimension's); masked
    elements 0."""
    b_e = tl.zeros(m.shape, ACC)  # [BLOCK_R, BLOCK_T] (or [BLOCK_R, 1])
    for a in range(n_actions):
        o_a = tl.cast(a, tl.int64)  # the action offsets may pass int32 where the offsets of entry 0 do not
        b_e += (load_tile(pi_ptr + o_a * s_pi_a, o_o, o_i, o_t, s_pi_o, s_pi_t, s_pi_i, m, ACC)
                * load_tile(q_ptr + o_a * s_q_a, o_o, o_i, o_t, s_q_o, s_q_t, s_q_i, m, ACC))
    return b_e


@triton.jit
def _action_groups(pi_ptr, q_ptr, b_act, o_o, o_i, o_t, s_pi_o, s_pi_i, s_q_o, s_q_i, m_r, T,
                   A: tl.constexpr, ACC: tl.constexpr):
    """(pi(a|s), Q(s, a) of the actions ``b_act``, E_pi Q(s, .)) [BLOCK_R, BLOCK_T] of the steps o_t, from per-action
    tensors whose steps are contiguous groups of A actions (time stride A, action stride 1; A a power of two that
    divides BLOCK_T, and o_t's columns consecutive steps from a multiple of A). Steps at or past T and masked rows
    read 0; an action outside [0, A) gathers 0.

    Load i reads, in column j = A g + l, action l of step o_t[A g] + i: A tiles of the steps' own shape whose columns
    are contiguous in memory (vector loads, the layout of the per-step tiles), reduced over each column group in
    registers and placed back at column A g + i. No value changes layout."""
    BLOCK_R: tl.constexpr = m_r.shape[0]
    BLOCK_T: tl.constexpr = o_t.shape[1]
    G: tl.constexpr = BLOCK_T // A
    o_l = tl.arange(0, BLOCK_T) % A  # [BLOCK_T] each column's action
    o_l3 = tl.arange(0, A)[None, None, :]  # [1, 1, A]
    o_g = o_t // A * A  # [1 or BLOCK_R, BLOCK_T] the first step of each column's group
    p_pi = pi_ptr + (o_o * s_pi_o + o_i * s_pi_i)[:, None] + o_l[None, :]  # [BLOCK_R, BLOCK_T]
    p_q = q_ptr + (o_o * s_q_o + o_i * s_q_i)[:, None] + o_l[None, :]
    b_act3 = tl.reshape(tl.broadcast_to(b_act, [BLOCK_R, BLOCK_T]), [BLOCK_R, G, A])
    b_pt = tl.zeros([BLOCK_R, G, A], ACC)
    b_qt = tl.zeros([BLOCK_R, G, A], ACC)
    b_e = tl.zeros([BLOCK_R, G, A], ACC)
    for i in tl.static_range(A):
        o_s = (o_g + i) * A  # [1 or BLOCK_R, BLOCK_T] element offset of step o_g + i
        m_i = m_r[:, None] & (o_g + i < T)
        b_pi = tl.reshape(tl.load(p_pi + o_s, mask=m_i, other=0).to(ACC), [BLOCK_R, G, A])
        b_q = tl.reshape(tl.load(p_q + o_s, mask=m_i, other=0).to(ACC), [BLOCK_R, G, A])
        b_a = tl.sum(tl.where(o_l3 == i, b_act3, 0), axis=2)[:, :, None]  # [BLOCK_R, G, 1] step A g + i's action
        b_pt = tl.where(o_l3 == i, tl.sum(tl.where(o_l3 == b_a, b_pi, 0), axis=2)[:, :, None], b_pt)
        b_qt = tl.where(o_l3 == i, tl.sum(tl.where(o_l3 == b_a, b_q, 0), axis=2)[:, :, None], b_qt)
        b_e = tl.where(o_l3 == i, tl.sum(b_pi * b_q, axis=2)[:, :, None], b_e)
    return (tl.reshape(b_pt, [BLOCK_R, BLOCK_T]), tl.reshape(b_qt, [BLOCK_R, BLOCK_T]),
            tl.reshape(b_e, [BLOCK_R, BLOCK_T]))


# The load per action compiled without its chunk loop in rows of one chunk (``ONE_CHUNK``), as at f6ebe50-16d0127,
# where it read NaN or wrong values in 3 release cells on an H200 (see the kernel's docstring). Off: the path keeps its
# loop. ``ablate_kernels.py``'s ``onechunkpa`` turns it on, to isolate the cause on a GPU (``bench_peers.py --parts
# release --algorithms retrace_discrete --variant onechunkpa_nogroup`` checks every cell against float64). A kernel
# global: set it before a process's first ``retrace_discrete`` call.
ONE_CHUNK_PER_ACTION = tl.constexpr(False)


@triton.jit
def _retrace_discrete_fwd_kernel(
    r_ptr, q_ptr, nq_ptr, pi_ptr, npi_ptr, act_ptr, mu_ptr, d_ptr, term_ptr, gamma_ptr, lmbda_ptr, c_bar_ptr,
    qret_ptr, adv_ptr, h0_ptr, ht_ptr, lb_ptr,
    gamma, lmbda, c_bar, n_rows, inner, T, n_actions, s_q_a, s_nq_a, s_pi_a, s_npi_a,
    s_r_o, s_r_t, s_r_i, s_q_o, s_q_t, s_q_i, s_nq_o, s_nq_t, s_nq_i, s_pi_o, s_pi_t, s_pi_i,
    s_npi_o, s_npi_t, s_npi_i, s_act_o, s_act_t, s_act_i, s_mu_o, s_mu_t, s_mu_i,
    s_d_o, s_d_t, s_d_i, s_term_o, s_term_t, s_term_i,
    s_gamma_o, s_gamma_t, s_gamma_i, s_lmbda_o, s_lmbda_t, s_lmbda_i, s_c_bar_o, s_c_bar_t, s_c_bar_i,
    ACC: tl.constexpr, GAMMA_TENSOR: tl.constexpr, LMBDA_TENSOR: tl.constexpr, C_BAR_TENSOR: tl.constexpr,
    LOG_RATIO: tl.constexpr, SAME_FLAGS: tl.constexpr, HAS_INITIAL_STATE: tl.constexpr,
    STORE_FINAL_STATE: tl.constexpr,
    CUT_A: tl.constexpr, LOOKBACK: tl.constexpr, WINDOW: tl.constexpr, INT64: tl.constexpr, ONE_CHUNK: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    SHIFTED: tl.constexpr, A_GROUP: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """``_retrace_fwd_kernel`` on the per-action tensors of a discrete action space: ``q``, ``nq``, ``pi`` and
    ``npi`` point at action 0 of ``[*B, T, A]`` tensors (their strides those of that entry's view, ``s_*_a`` the
    action dimension's), ``act`` the taken actions, ``mu`` their behaviour probabilities (or logs). The gathers of
    the taken action and the expectation over the next step's actions happen here, in ACC. ``SHIFTED``: the next
    step's ``pi`` and ``q`` are those one step on, and ``npi`` and ``nq`` hold the last ones ``[*B, A]`` (time stride
    0), read once per row. ``A_GROUP``: the number of actions where every per-action tensor stepping along time
    holds each step's actions contiguously (time stride A_GROUP, action stride 1, A_GROUP a power of two; T a
    multiple of 16 or a constant: ``_action_group``), else 0: then the chunks of ``BLOCK_T`` steps (a multiple of
    A_GROUP; no ``WINDOW``; row tiles, not ``LOOKBACK`` chunks) read them in groups (``_action_groups``). Look-back
    chunks keep the load per action: the groups were slower there on an H200 (512 x 4096, 50-call graph: 87.8 -> 114
    µs with truncations, 78.5 -> 88.8 without; benchmarks/results/h200/bench_peers_rd_nogroup_af85518.md against
    bench_peers_af85518.md), faster in the 22 other release cells. The load per action keeps its chunk loop
    (``ONE_CHUNK`` ignored unless ``ONE_CHUNK_PER_ACTION``): compiled without it (f6ebe50), it read NaN or wrong
    values in 3 of 24 release cells on an H200 (128 x 1024, 256 x 1024, 512 x 2048: one-row tiles of one chunk;
    benchmarks/results/h200/bench_peers_16d0127.md), where its last GPU run with the loop (a911ce8, H100) was right
    in all 24; the cause is not isolated."""
    GROUPED: tl.constexpr = A_GROUP > 0 and BLOCK_T % max(A_GROUP, 1) == 0 and not WINDOW and not LOOKBACK
    o_o, o_i, o_r, m_r, b_h, n_chunks, c_lo, c_hi = row_prologue(
        h0_ptr, lb_ptr, n_rows, inner, T, ACC, BLOCK_R, BLOCK_T, HAS_INITIAL_STATE, LOOKBACK, WINDOW, INT64,
        ONE_CHUNK and (GROUPED or ONE_CHUNK_PER_ACTION))
    if SHIFTED:  # E_pi Q after the last step [BLOCK_R, 1] (npi and nq of time stride 0)
        b_nq_last = _expected_q(npi_ptr, nq_ptr, s_npi_a, s_nq_a, n_actions, o_o, o_i, 0, s_npi_o, s_npi_t, s_npi_i,
                                s_nq_o, s_nq_t, s_nq_i, m_r[:, None], ACC)
    for i_c in tl.range(c_lo, c_hi, num_stages=NUM_STAGES):
        o_t, m, w = chunk(i_c, n_chunks, T, o_o, m_r, BLOCK_T, True, LOOKBACK, WINDOW, INT64)
        b_r = load_tile(r_ptr, o_o, o_i, o_t, s_r_o, s_r_t, s_r_i, m, ACC, w)  # [BLOCK_R, BLOCK_T]
        b_nd, b_nterm = load_not_flags(d_ptr, term_ptr, o_o, o_i, o_t, s_d_o, s_d_t, s_d_i,
                                       s_term_o, s_term_t, s_term_i, m, ACC, SAME_FLAGS, w)  # [BLOCK_R, BLOCK_T]
        # c_(t+1) and Q(s_(t+1), a_(t+1)): the taken actions one step later
        o_t1 = o_t + 1
        m_t1 = o_t1 < T
        m1 = m_r[:, None] & m_t1
        if GROUPED:  # every per-action tile in the steps' layout; the steps one on through pointers one step on
            b_act = load_index(act_ptr, o_o, o_i, o_t, s_act_o, s_act_t, s_act_i, m)
            b_act1 = load_index(act_ptr, o_o, o_i, o_t1, s_act_o, s_act_t, s_act_i, m1)
            _, b_q, _ = _action_groups(pi_ptr, q_ptr, b_act, o_o, o_i, o_t, s_pi_o, s_pi_i, s_q_o, s_q_i, m_r, T,
                                       A_GROUP, ACC)
            b_q = tl.where((b_act >= 0) & (b_act < n_actions), b_q, float("nan"))
            b_pi1, b_q1, b_e1 = _action_groups(pi_ptr + A_GROUP, q_ptr + A_GROUP, b_act1, o_o, o_i, o_t, s_pi_o,
                                               s_pi_i, s_q_o, s_q_i, m_r, T - 1, A_GROUP, ACC)
            b_ratio1, b_q1 = _taken_ratio(b_act1, b_pi1, b_q1,
                                          load_tile(mu_ptr, o_o, o_i, o_t1, s_mu_o, s_mu_t, s_mu_i, m1, ACC),
                                          n_actions, LOG_RATIO)
            if SHIFTED:
                b_nq = tl.where(o_t == T - 1, b_nq_last, b_e1)
            else:
                _, _, b_nq = _action_groups(npi_ptr, nq_ptr, b_act, o_o, o_i, o_t, s_npi_o, s_npi_i, s_nq_o,
                                            s_nq_i, m_r, T, A_GROUP, ACC)
        else:  # gathers, and a load per action
            _, b_q = _taken(pi_ptr, q_ptr, act_ptr, mu_ptr, n_actions, s_pi_a, s_q_a, o_o, o_i, o_t, m,
                            s_pi_o, s_pi_t, s_pi_i, s_q_o, s_q_t, s_q_i, s_act_o, s_act_t, s_act_i, s_mu_o, s_mu_t,
                            s_mu_i, ACC, LOG_RATIO)
            # E_pi Q(s'_t, .) = sum_a pi(a|s'_t) Q(s'_t, a)
            if SHIFTED:  # pi and q one step on, then the last ones
                b_nq = tl.where(o_t == T - 1, b_nq_last,
                                _expected_q(pi_ptr, q_ptr, s_pi_a, s_q_a, n_actions, o_o, o_i, o_t + 1, s_pi_o,
                                            s_pi_t, s_pi_i, s_q_o, s_q_t, s_q_i, m_r[:, None] & (o_t + 1 < T), ACC))
            else:
                b_nq = _expected_q(npi_ptr, nq_ptr, s_npi_a, s_nq_a, n_actions, o_o, o_i, o_t, s_npi_o, s_npi_t,
                                   s_npi_i, s_nq_o, s_nq_t, s_nq_i, m, ACC)  # [BLOCK_R, BLOCK_T]
            b_ratio1, b_q1 = _taken(pi_ptr, q_ptr, act_ptr, mu_ptr, n_actions, s_pi_a, s_q_a, o_o, o_i, o_t1, m1,
                                    s_pi_o, s_pi_t, s_pi_i, s_q_o, s_q_t, s_q_i, s_act_o, s_act_t, s_act_i, s_mu_o,
                                    s_mu_t, s_mu_i, ACC, LOG_RATIO)
        # a terminated step's E_pi Q is never read (nor can a NaN leak)
        b_nq = zero_where(b_nq, b_nterm == 0)
        b_g = load_coef(gamma_ptr, gamma, o_o, o_i, o_t, s_gamma_o, s_gamma_t, s_gamma_i, m, ACC, GAMMA_TENSOR)
        b_c1 = _clipped_trace(b_ratio1, lmbda_ptr, c_bar_ptr, lmbda, c_bar, o_o, o_i, o_t1, m1, s_lmbda_o,
                              s_lmbda_t, s_lmbda_i, s_c_bar_o, s_c_bar_t, s_c_bar_i, ACC, LMBDA_TENSOR, C_BAR_TENSOR)
        b_qret, b_h = _retrace_tile(b_r, b_nq, b_nd, b_nterm, b_g, b_c1, b_q1, m_t1, b_h, m, CUT_A, lb_ptr, o_r,
                                    i_c, n_chunks, LOOKBACK, STORE_FINAL_STATE)
        store_tile(qret_ptr, b_qret, o_o, o_i, o_t, T, inner, m, w)
        store_tile(adv_ptr, b_qret - b_q, o_o, o_i, o_t, T, inner, m, w)
    if STORE_FINAL_STATE:  # u_0 = c_0 (Q_ret_0 - Q_0), from column 0 of a first-chunk tile
        o_t = tl.arange(0, BLOCK_T).to(tl.int64)[None, :]
        m_0 = m_r[:, None] & (o_t == 0)
        b_ratio0, b_q0 = _taken(pi_ptr, q_ptr, act_ptr, mu_ptr, n_actions, s_pi_a, s_q_a, o_o, o_i, o_t, m_0,
                                s_pi_o, s_pi_t, s_pi_i, s_q_o, s_q_t, s_q_i, s_act_o, s_act_t, s_act_i, s_mu_o,
                                s_mu_t, s_mu_i, ACC, LOG_RATIO)
        b_c0 = _clipped_trace(b_ratio0, lmbda_ptr, c_bar_ptr, lmbda, c_bar, o_o, o_i, o_t, m_0, s_lmbda_o,
                              s_lmbda_t, s_lmbda_i, s_c_bar_o, s_c_bar_t, s_c_bar_i, ACC, LMBDA_TENSOR, C_BAR_TENSOR)
        b_h = edge_column(b_c0, True) * (b_h - edge_column(b_q0, True))  # [BLOCK_R]
    store_state(ht_ptr, b_h, o_r, m_r, c_hi, n_chunks, STORE_FINAL_STATE)


@replayable
def retrace(
    q_taken: torch.Tensor,
    next_expected_q: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor | None = None,
    *,
    ratio: torch.Tensor | None = None,
    log_ratio: torch.Tensor | None = None,
    gamma: float | torch.Tensor,
    lmbda: float | torch.Tensor = 1.0,
    c_bar: float | torch.Tensor = 1.0,
    time_dim: int | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    backend: str = "auto",
):
    r"""Retrace(:math:`\lambda`) targets from per-step inputs (any action space, e.g. continuous actions).

    Args:
        q_taken (Tensor): ``[*B, T, *F]`` :math:`Q(s_t, a_t)` of the taken actions.
        next_expected_q (Tensor): ``[*B, T, *F]`` :math:`\mathbb{E}_{a \sim \pi} Q(s'_t, a)` at the observation
            :math:`s'_t` reached by step t (the true next state, also at a truncation).
        reward (Tensor): ``[*B, T, *F]`` rewards.
        done (Tensor): ``[*B, T, *F]`` bool, the trajectory ends after step t (terminated or truncated).
        terminated (Tensor, optional): ``[*B, T, *F]`` bool, the episode terminated at step t (no bootstrap).
            Defaults to ``done``.

    Keyword Args:
        ratio (Tensor, optional): ``[*B, T, *F]`` :math:`\pi(a_t|s_t) / \mu(a_t|s_t)` of the taken actions.
        log_ratio (Tensor, optional): ``[*B, T, *F]`` its logarithm :math:`\log\pi - \log\mu`. Pass exactly one of
            ``ratio`` and ``log_ratio``.
        gamma (float or Tensor): discount, a number or a tensor broadcastable to the inputs.
        lmbda (float or Tensor): :math:`\lambda` in :math:`[0, 1]`, likewise. Defaults to ``1.0``.
        c_bar (float or Tensor): :math:`\bar c`, the clip of the ratio in the traces (finite, non-negative, no
            upper bound), likewise. Defaults to ``1.0``.
        time_dim (int, optional): the time dimension. Defaults to ``-2`` (TorchRL's ``[*B, T, 1]``), except
            that 2-D inputs must name it (they raise without it): ``-1`` for ``[B, T]``, ``0`` for ``[T, B]``.
        initial_state (Tensor, optional): ``[*B, *F]`` :math:`u_T = c_T (Q^{ret}_T - Q(s_T, a_T))` at the first
            step of the segment that follows this one. Defaults to zero: the window end bootstraps from
            ``next_expected_q`` like a truncation.
        output_final_state (bool): also return :math:`u_0 = c_0 (Q^{ret}_0 - Q(s_0, a_0))` (float32, or float64 for
            float64 inputs), the state to pass as ``initial_state`` to the preceding segment. Defaults to
            ``False``.
        backend (str): ``"auto"`` (Triton on CUDA, torch elsewhere), ``"triton"`` or ``"torch"``.

    Returns:
        ``(q_ret, advantage)``: :math:`Q^{ret}_t` and :math:`Q^{ret}_t - Q(s_t, a_t)` in the input shape and dtype,
        plus the final state if asked for.

    Examples:
        >>> q = torch.zeros(1, 3, 1)
        >>> next_q = torch.ones(1, 3, 1)
        >>> reward = torch.ones(1, 3, 1)
        >>> done = torch.zeros(1, 3, 1, dtype=torch.bool)
        >>> ratio = torch.full((1, 3, 1), 0.5)
        >>> q_ret, adv = retrace(q, next_q, reward, done, ratio=ratio, gamma=0.9)
        >>> q_ret[0, :, 0]
        tensor([3.1398, 2.7550, 1.9000])
    """
    if (ratio is None) == (log_ratio is None):
        raise InputError("pass exactly one of ratio and log_ratio")
    layout = check_inputs(
        time_dim,
        {"q_taken": q_taken, "next_expected_q": next_expected_q, "reward": reward, "ratio": ratio,
         "log_ratio": log_ratio},
        {"done": done, "terminated": terminated},
        {"initial_state": initial_state},
        optional=("ratio", "log_ratio", "terminated"),
    )
    check_nonnegative("ratio", ratio)
    gamma = check_coef("gamma", gamma, layout)
    lmbda = check_coef("lmbda", lmbda, layout)
    c_bar = check_coef("c_bar", c_bar, layout, high=None)
    terminated = done if terminated is None else terminated
    if layout.empty:
        q_ret, adv = new_outputs(layout, 2)
        ht = empty_state(layout, initial_state)
    elif (path := resolve_backend(backend, layout.device, q_taken, next_expected_q, reward, ratio, log_ratio, gamma,
                                  lmbda, c_bar, initial_state)) != "triton":
        w = rows_time(ratio, layout) if log_ratio is None else torch.exp(rows_time(log_ratio, layout))
        c = rows_time(lmbda, layout) * w.clamp_max(rows_time(c_bar, layout))
        c = c.expand_as(w)  # lmbda and c_bar may both be numbers
        c1 = torch.cat([c[:, 1:], torch.ones_like(c[:, :1])], dim=1)  # c_(t+1), 1 past the window end
        c1 = torch.where(rows_time(done, layout), 0.0, c1)  # not read after a done step (the next episode's)
        q = rows_time(q_taken, layout)
        b_a, b_b = retrace_coefficients(
            rows_time(reward, layout), rows_time_unless(next_expected_q, terminated, layout),
            not_flag(done, layout), not_flag(terminated, layout), rows_time(gamma, layout), c1,
        )
        q1 = torch.cat([q[:, 1:], torch.zeros_like(q[:, :1])], dim=1)  # Q(s_(t+1), a_(t+1)), 0 past the window end
        b_b = b_b - torch.where(b_a == 0, 0.0, b_a * q1)  # not read where a_t = 0
        h, ht = scan_rows(b_a, b_b, rows_state(initial_state), True, path)
        q_ret, adv = from_rows_time(h, layout), from_rows_time(h - q, layout)
        ht = state_out(c[:, 0] * (ht - q[:, 0]), layout)
    else:  # the outputs are allocated here, on the path that writes them
        q_ret, adv = new_outputs(layout, 2)
        ht = launch(
            _retrace_fwd_kernel, layout,
            inputs={"r": reward, "q": q_taken, "nq": next_expected_q, "d": done, "term": terminated,
                    "ratio": ratio if log_ratio is None else log_ratio},
            coefs={"gamma": gamma, "lmbda": lmbda, "c_bar": c_bar},
            outputs={"qret": q_ret, "adv": adv},
            initial_state=initial_state, output_final_state=output_final_state, LOG_RATIO=log_ratio is not None,
        )
    return (q_ret, adv, ht) if output_final_state else (q_ret, adv)


@replayable
def retrace_discrete(
    pi: torch.Tensor,
    action: torch.Tensor,
    q_values: torch.Tensor,
    next_pi: torch.Tensor | None,
    next_q_values: torch.Tensor | None,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor | None = None,
    *,
    behavior_prob: torch.Tensor | None = None,
    behavior_log_prob: torch.Tensor | None = None,
    gamma: float | torch.Tensor,
    lmbda: float | torch.Tensor = 1.0,
    c_bar: float | torch.Tensor = 1.0,
    time_dim: int | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    last_pi: torch.Tensor | None = None,
    last_q_values: torch.Tensor | None = None,
    backend: str = "auto",
):
    r"""Retrace(:math:`\lambda`) targets for a discrete action space, from per-action tensors.

    :func:`retrace` on the reductions of the per-action tensors, in the accumulation dtype (float32, or float64
    for float64 inputs): :math:`Q(s_t, a_t)` and :math:`\pi(a_t|s_t)` by a gather along the action dimension,
    :math:`\mathbb{E}_\pi Q(s'_t, \cdot) = \sum_a \pi(a|s'_t) Q(s'_t, a)`, and the ratio by a division (or a
    difference of logs). On the Triton path one kernel does it all, the gathers and the sum over actions on chip,
    reading each per-action tensor where it is; on the torch path (and where autograd or torch.compile needs the
    differentiable scan) a few torch ops reduce them for :func:`retrace`, whose outputs are cast to the input
    dtype.

    Args:
        pi (Tensor): ``[*B, T, A]`` target-policy probabilities :math:`\pi(\cdot|s_t)`, actions last.
        action (Tensor): ``[*B, T]`` int64 index of the taken action :math:`a_t`.
        q_values (Tensor): ``[*B, T, A]`` :math:`Q(s_t, \cdot)`.
        next_pi (Tensor or None): ``[*B, T, A]`` :math:`\pi(\cdot|s'_t)` at the observation reached by step t.
            ``None`` with ``last_pi`` to read it from ``pi`` one step on (shifted mode).
        next_q_values (Tensor or None): ``[*B, T, A]`` :math:`Q(s'_t, \cdot)` at the observation reached by step t
            (the true next state, also at a truncation). ``None`` with ``last_q_values`` to read it from
            ``q_values`` one step on (shifted mode).
        reward (Tensor): ``[*B, T]`` rewards.
        done (Tensor): ``[*B, T]`` bool, the trajectory ends after step t.
        terminated (Tensor, optional): ``[*B, T]`` bool, the episode terminated at step t. Defaults to ``done``.

    Keyword Args:
        behavior_prob (Tensor, optional): ``[*B, T]`` :math:`\mu(a_t|s_t)`, the behaviour probability of the taken
            action.
        behavior_log_prob (Tensor, optional): ``[*B, T]`` its logarithm. Pass exactly one of the two.
        gamma, lmbda, c_bar, initial_state, output_final_state, backend: as in :func:`retrace` (states are
            ``[*B]``).
        time_dim (int, optional): the time dimension of the ``[*B, T, A]`` inputs (not the last one). Defaults to
            ``-2``, also for ``[T, A]`` inputs (actions are last: nothing to mistake).
        last_pi (Tensor, optional): ``[*B, A]`` :math:`\pi(\cdot|s_T)` at the observation after the last step,
            in the dtype of ``pi``. With ``last_q_values`` (and ``next_pi=None, next_q_values=None``),
            :math:`s'_t = s_{t+1}`: the next step's probabilities and Q values are ``pi`` and ``q_values`` at step
            t + 1 for t < T - 1 and these at t = T - 1, with no next-step tensors built (the inputs of a rollout
            whose T + 1 observations were evaluated once; half the per-action bytes). As for GAE's shifted mode,
            a truncated step then bootstraps from the next episode's first observation: leave ``terminated`` to
            default to ``done``.
        last_q_values (Tensor, optional): ``[*B, A]`` :math:`Q(s_T, \cdot)`, in the dtype of ``pi``.

    Returns:
        ``(q_ret, advantage)`` of shape ``[*B, T]`` in the input dtype, plus the final state if asked for.

    Examples:
        >>> pi = torch.tensor([[[0.5, 0.5], [1.0, 0.0]]])  # [1, 2, 2]
        >>> action = torch.tensor([[0, 0]])
        >>> q = torch.zeros(1, 2, 2)
        >>> reward = torch.ones(1, 2)
        >>> done = torch.zeros(1, 2, dtype=torch.bool)
        >>> mu = torch.full((1, 2), 0.5)
        >>> q_ret, adv = retrace_discrete(pi, action, q, pi, q, reward, done, behavior_prob=mu, gamma=0.9)
        >>> q_ret[0]
        tensor([1.9000, 1.0000])
    """
    if (behavior_prob is None) == (behavior_log_prob is None):
        raise InputError("pass exactly one of behavior_prob and behavior_log_prob")
    shifted = check_shifted(next_pi, last_pi, "next_pi", "last_pi", "pi", "pi(.|s_(t+1))", "[*B, A]")
    if check_shifted(next_q_values, last_q_values, "next_q_values", "last_q_values", "q_values", "Q(s_(t+1), .)",
                     "[*B, A]") != shifted:
        raise InputError("pass next_pi and next_q_values, or last_pi and last_q_values (the shifted input mode, "
                         "which reads both one step on), not one of each")
    time_dim = DEFAULT_TIME_DIM if time_dim is None else time_dim
    layout = check_inputs(
        time_dim, {"pi": pi, "q_values": q_values, "next_pi": next_pi, "next_q_values": next_q_values}, {},
        {"last_pi": last_pi, "last_q_values": last_q_values},
        optional=("next_pi", "next_q_values") if shifted else (),
    )
    if shifted:
        check_last_value_dtype(last_pi, layout, "pi", "last_pi")
        check_last_value_dtype(last_q_values, layout, "pi", "last_q_values")
    if layout.time_dim == len(layout.shape) - 1:
        raise InputError(f"time_dim={time_dim} is the action dimension of inputs of shape {tuple(layout.shape)}: "
                         "actions must be the last dimension, time another one")
    if not isinstance(action, torch.Tensor):
        raise TypeError(f"action must be a torch.Tensor, got {type(action).__name__}")
    if action.dtype != torch.int64:
        raise TypeError(f"action must be an int64 tensor of action indices, got {action.dtype}")
    if action.shape != layout.shape[:-1]:
        raise InputError(f"action has shape {tuple(action.shape)}, expected {tuple(layout.shape[:-1])} (the shape "
                         "of pi without its action dimension)")
    if action.device != layout.device:
        raise InputError(f"action is on {action.device} but pi is on {layout.device}")
    n_actions = layout.shape[-1]
    if n_actions == 0 and action.numel():
        raise InputError(f"pi has shape {tuple(layout.shape)}: no actions to index")
    checked = checks_values(action)  # on CUDA an index out of range reads NaN below instead (no sync, no crash)
    if checked and not (0 <= action.min() and action.max() < n_actions):
        raise InputError(f"action holds indices outside [0, {n_actions}): {action.min().item()}.."
                         f"{action.max().item()}")
    mu = behavior_prob if behavior_log_prob is None else behavior_log_prob
    mu_name = "behavior_prob" if behavior_log_prob is None else "behavior_log_prob"
    if not isinstance(mu, torch.Tensor):
        raise TypeError(f"{mu_name} must be a torch.Tensor, got {type(mu).__name__}")
    if mu.dtype != layout.dtype:
        raise TypeError(f"{mu_name} has dtype {mu.dtype} but pi has {layout.dtype}: pass one float dtype")
    if mu.shape != action.shape:
        raise InputError(f"{mu_name} has shape {tuple(mu.shape)}, expected {tuple(action.shape)}")
    if mu.device != layout.device:
        raise InputError(f"{mu_name} is on {mu.device} but pi is on {layout.device}")
    steps = check_inputs(layout.time_dim, {"reward": reward, mu_name: mu}, {"done": done, "terminated": terminated},
                         {"initial_state": initial_state}, optional=("terminated",))  # the per-step inputs, [*B, T]
    for name, p in (("pi", pi), ("next_pi", next_pi), ("last_pi", last_pi), ("behavior_prob", behavior_prob)):
        check_nonnegative(name, p)
    if behavior_log_prob is None and checks_values(pi):
        pi_taken = pi.gather(-1, action.unsqueeze(-1)).squeeze(-1)  # the indices are checked: all valid
        check_values("behavior_prob", behavior_prob, (pi_taken == 0) & (behavior_prob == 0),
                     "must not be 0 where pi of the taken action is 0 too (the ratio 0/0)")
    path = resolve_backend(backend, layout.device, pi, q_values, next_pi, next_q_values, reward, mu, gamma, lmbda,
                           c_bar, initial_state)
    if path != "triton" or steps.empty:
        # the reductions in the accumulation dtype; the generic torch path (or scan) runs on them, and the outputs
        # are cast back
        acc, dtype = layout.acc_dtype, layout.dtype
        idx = action.unsqueeze(-1)
        if not checked:
            valid = (action >= 0) & (action < n_actions)
            idx = torch.where(valid, action, 0).unsqueeze(-1)
        q_taken = q_values.gather(-1, idx).squeeze(-1).to(acc)
        pi_taken = pi.gather(-1, idx).squeeze(-1).to(acc)
        if not checked:
            q_taken, pi_taken = (torch.where(valid, x, float("nan")) for x in (q_taken, pi_taken))
        if shifted:  # E_pi Q of every step's observation, one step on, then of the last one
            expected_q = (pi.to(acc) * q_values.to(acc)).sum(-1)
            last = (last_pi.to(acc) * last_q_values.to(acc)).sum(-1).unsqueeze(steps.time_dim)
            next_expected_q = (torch.cat([expected_q.narrow(steps.time_dim, 1, steps.T - 1), last], steps.time_dim)
                               if steps.T else expected_q)
        else:
            next_expected_q = (next_pi.to(acc) * next_q_values.to(acc)).sum(-1)
        if behavior_log_prob is None:
            weights = {"ratio": pi_taken / behavior_prob.to(acc)}
        else:
            weights = {"log_ratio": pi_taken.log() - behavior_log_prob.to(acc)}
        out = retrace(q_taken, next_expected_q, reward.to(acc), done, terminated, **weights, gamma=gamma,
                      lmbda=lmbda, c_bar=c_bar, time_dim=layout.time_dim, initial_state=initial_state,
                      output_final_state=output_final_state, backend=backend)
        q_ret, adv = out[0].to(dtype), out[1].to(dtype)
        return (q_ret, adv, out[2]) if output_final_state else (q_ret, adv)
    # one kernel: the gathers and the expectation over actions on chip, each per-action tensor read where it is
    per_action = {name: _action_entry(x, steps) for name, x in
                  (("q", q_values), ("pi", pi), ("nq", next_value_input(next_q_values, last_q_values, layout)),
                   ("npi", next_value_input(next_pi, last_pi, layout)))}
    q_ret, adv = new_outputs(steps, 2)
    inputs = {"r": reward, **{name: view for name, (view, _) in per_action.items()}, "act": action, "mu": mu,
              "d": done, "term": done if terminated is None else terminated}
    ht = launch(
        _retrace_discrete_fwd_kernel, steps, inputs=inputs,
        coefs={"gamma": check_coef("gamma", gamma, steps), "lmbda": check_coef("lmbda", lmbda, steps),
               "c_bar": check_coef("c_bar", c_bar, steps, high=None)},
        outputs={"qret": q_ret, "adv": adv},
        initial_state=initial_state, output_final_state=output_final_state, LOG_RATIO=behavior_log_prob is not None,
        SHIFTED=shifted, A_GROUP=_action_group(per_action, steps, n_actions, shifted, inputs.values()),
        n_actions=n_actions,
        **{f"s_{name}_a": stride for name, (_, stride) in per_action.items()},
    )
    return (q_ret, adv, ht) if output_final_state else (q_ret, adv)


def _action_entry(x: torch.Tensor, steps) -> tuple[torch.Tensor, int]:
    """``x[..., 0]`` of a ``[*B, T, A]`` tensor, a view of the per-step layout ``steps`` that the kernel offsets by
    the action dimension's stride, and that stride. ``x`` is copied (contiguous) first where that view's batch
    dimensions do not merge, since the launch would copy the view alone."""
    view = x[..., 0]
    if not views_without_copy(view, steps):
        x = x.contiguous()
        view = x[..., 0]
    return view, x.stride(-1)


# The most actions that the kernel reads in groups (``_action_groups``: A loads per tensor and tile, unrolled). sm_90
# SASS at 4096 x 128 (benchmarks/results/sm90_sass/retrace_discrete_groups.md): 8 actions take 94-128 registers and
# 1312-1360 instructions, 16 actions 154-190 and 2416, where the load per action keeps 115-128 registers and loops
# over the actions at run time. Static counts only: 16 stays on the load per action until a GPU A/B.
MAX_ACTION_GROUP = 8


def _action_group(per_action: dict, steps, n_actions: int, shifted: bool, inputs) -> int:
    """``A_GROUP`` of ``_retrace_discrete_fwd_kernel``: ``n_actions`` where every per-action tensor stepping along
    time (``q`` and ``pi``, and ``nq`` and ``npi`` unless ``shifted``: then they hold the last step's) keeps each
    step's actions contiguous, one step after the other (time stride A, action stride 1: a ``[*B, T, A]`` tensor
    contiguous in its last two dimensions), and A is a power of two up to ``MAX_ACTION_GROUP``; else 0.

    Rows whose length T is no multiple of 16 are read in groups only where the launch of ``inputs`` is compiled
    for that length (``scan.compiled_for_length``: contiguous tensors, per-action views of contiguous ones). With T
    at run time, groups in one-row tiles of one chunk read wrong values on an H100 and an H200 (3 x 520 to 64 x 1000,
    4 actions; benchmarks/results/h100/rd_diag_56b3228_a10070b.md), and right ones with T a constant."""
    if n_actions > MAX_ACTION_GROUP or n_actions & (n_actions - 1):
        return 0
    names = ("q", "pi") if shifted else ("q", "pi", "nq", "npi")
    for name in names:
        view, stride_a = per_action[name]
        if stride_a != 1 or view.stride(steps.time_dim) != n_actions:
            return 0
    if steps.T % 16 and not compiled_for_length(steps, inputs):  # last: it reads every input's strides
        return 0
    return n_actions
