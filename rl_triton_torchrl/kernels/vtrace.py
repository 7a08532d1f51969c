r"""V-trace off-policy targets (Espeholt et al., 2018, IMPALA).

With the truncated importance weights :math:`\rho_t = \min(\bar\rho, \pi_t / \mu_t)` and
:math:`c_t = \min(\bar c, \pi_t / \mu_t)` (:math:`\pi_t / \mu_t = \exp(\log\pi_t - \log\mu_t)`),

.. math::

    \delta_t = \rho_t \big(r_t + \gamma_t (1 - \mathrm{terminated}_t)\, V'_t - V_t\big), \qquad
    h_t = v_{s_t} - V_t = \delta_t + \gamma_t (1 - \mathrm{done}_t)\, c_t\, h_{t+1},

a reverse scan with :math:`a_t = \gamma_t (1 - \mathrm{done}_t) c_t` and :math:`b_t = \delta_t`. The value target is
:math:`v_{s_t} = h_t + V_t` and the advantage is :math:`\delta_t` with :math:`v_{s_{t+1}}` in place of :math:`V'_t`,

.. math::

    A_t = \rho_t \big(r_t + \gamma_t (1 - \mathrm{terminated}_t)\, v_{s_{t+1}} - V_t\big), \qquad
    v_{s_{t+1}} = \begin{cases} V'_t & \mathrm{done}_t \\ h_{t+1} + V_{t+1} & t < T - 1 \\
                                h_T + V'_{T-1} & t = T - 1, \end{cases}

so the advantage needs the state one step later in scan order (an exclusive scan): the kernel scans a tile
once and reads :math:`h_{t+1}` from the next column (past the last column: the state entering the tile from the
chunk after it).

:math:`V'_t` (``next_state_value``) is the value of the observation reached by step t, so a truncation bootstraps
from it, a termination does not, and a done step never reads the next episode. The carried state
:math:`h_T` is :math:`v_s - V` at the first step of the following segment of the same rollout (``initial_state``),
with :math:`V` there taken as :math:`V'_{T-1}`, which is the same number wherever the rollout goes on; without it
:math:`h_T = 0`, i.e. the window end bootstraps from :math:`V'_{T-1}` like a truncation. The same numbers as
TorchRL's loop ``vtrace_advantage_estimate``.
"""
from __future__ import annotations

import torch

from ._replay import replayable
from ._triton import tl, triton
from ._utils import check_coef, check_inputs, check_last_value_dtype, check_shifted, resolve_backend
from .scan import (
    WARP_LOCAL_T, chunk, empty_state, from_rows_time, last_step_value, launch, load_coef, load_next_step,
    load_not_flags, load_tile, new_outputs, next_column, next_value_input, next_value_rows, not_flag, row_prologue,
    rows_state, rows_time, scan_rows, scan_tile_enter, state_out, store_state, store_tile, stored_next_step,
    zero_where,
)

__all__ = ["vtrace"]


def vtrace_coefficients(reward, state_value, next_state_value, not_done, not_terminated, gamma, rho, c):
    """(a_t, b_t) of the V-trace recurrence, from the clipped weights rho_t and c_t; plain arithmetic shared by the
    Triton kernel and the torch path. With v_(s_(t+1)) as ``next_state_value``, b_t is the advantage."""
    delta = rho * (reward + gamma * not_terminated * next_state_value - state_value)
    return gamma * not_done * c, delta


_vtrace_coefficients = triton.jit(vtrace_coefficients)


@triton.jit
def _vtrace_step(
    lpi_ptr, lmu_ptr, r_ptr, v_ptr, d_ptr, term_ptr, gamma_ptr, rho_thresh_ptr, c_thresh_ptr,
    gamma, rho_thresh, c_thresh, o_o, o_i, o_t, m,
    s_lpi_o, s_lpi_t, s_lpi_i, s_lmu_o, s_lmu_t, s_lmu_i, s_r_o, s_r_t, s_r_i, s_v_o, s_v_t, s_v_i,
    s_d_o, s_d_t, s_d_i, s_term_o, s_term_t, s_term_i,
    s_gamma_o, s_gamma_t, s_gamma_i, s_rho_thresh_o, s_rho_thresh_t, s_rho_thresh_i,
    s_c_thresh_o, s_c_thresh_t, s_c_thresh_i,
    ACC: tl.constexpr, GAMMA_TENSOR: tl.constexpr, RHO_THRESH_TENSOR: tl.constexpr, C_THRESH_TENSOR: tl.constexpr,
    SAME_FLAGS: tl.constexpr, w,
):
    """Loads the steps o_t of a tile (``w``: its window, see ``load_tile``) but the next values; returns (rho, c,
    reward, value, not done, not terminated, gamma)."""
    b_lpi = load_tile(lpi_ptr, o_o, o_i, o_t, s_lpi_o, s_lpi_t, s_lpi_i, m, ACC, w)  # [BLOCK_R, BLOCK_T]
    b_lmu = load_tile(lmu_ptr, o_o, o_i, o_t, s_lmu_o, s_lmu_t, s_lmu_i, m, ACC, w)  # [BLOCK_R, BLOCK_T]
    b_ratio = tl.exp(b_lpi - b_lmu)  # [BLOCK_R, BLOCK_T]
    b_rt = load_coef(rho_thresh_ptr, rho_thresh, o_o, o_i, o_t, s_rho_thresh_o, s_rho_thresh_t, s_rho_thresh_i,
                     m, ACC, RHO_THRESH_TENSOR)
    b_ct = load_coef(c_thresh_ptr, c_thresh, o_o, o_i, o_t, s_c_thresh_o, s_c_thresh_t, s_c_thresh_i, m, ACC,
                     C_THRESH_TENSOR)
    # [BLOCK_R, BLOCK_T]; a NaN ratio clips to NaN, as torch.minimum does (the GPU's min would return the threshold)
    b_rho = tl.minimum(b_ratio, b_rt, propagate_nan=tl.PropagateNan.ALL)
    b_c = tl.minimum(b_ratio, b_ct, propagate_nan=tl.PropagateNan.ALL)
    b_r = load_tile(r_ptr, o_o, o_i, o_t, s_r_o, s_r_t, s_r_i, m, ACC, w)  # [BLOCK_R, BLOCK_T]
    b_v = load_tile(v_ptr, o_o, o_i, o_t, s_v_o, s_v_t, s_v_i, m, ACC, w)  # [BLOCK_R, BLOCK_T]
    b_nd, b_nterm = load_not_flags(d_ptr, term_ptr, o_o, o_i, o_t, s_d_o, s_d_t, s_d_i, s_term_o, s_term_t, s_term_i,
                                   m, ACC, SAME_FLAGS, w)  # [BLOCK_R, BLOCK_T]
    b_g = load_coef(gamma_ptr, gamma, o_o, o_i, o_t, s_gamma_o, s_gamma_t, s_gamma_i, m, ACC, GAMMA_TENSOR)
    return b_rho, b_c, b_r, b_v, b_nd, b_nterm, b_g


# vs_(t+1) read back from the stored output (``VS_RELOAD``) also in tiles whose rows share a warp (fewer than
# ``WARP_LOCAL_T`` steps: T <= 64), where the gather one column on converts the tile's layout through shared memory
# (sm_90 SASS at 65536 x 24: 2 conversions and 3 barriers, in the shifted mode 9 and 17;
# benchmarks/results/sm90_sass/vtrace_narrow_reload.md). Off until a GPU A/B (``ablate_kernels.py`` ``narrow``). A
# kernel global: set it before a process's first V-trace call (launch plans keep the kernel compiled before).
RELOAD_NARROW = tl.constexpr(False)


@triton.jit
def _vtrace_fwd_kernel(
    lpi_ptr, lmu_ptr, r_ptr, v_ptr, nv_ptr, d_ptr, term_ptr, gamma_ptr, rho_thresh_ptr, c_thresh_ptr,
    adv_ptr, vs_ptr, h0_ptr, ht_ptr, lb_ptr,
    gamma, rho_thresh, c_thresh, n_rows, inner, T,
    s_lpi_o, s_lpi_t, s_lpi_i, s_lmu_o, s_lmu_t, s_lmu_i, s_r_o, s_r_t, s_r_i, s_v_o, s_v_t, s_v_i,
    s_nv_o, s_nv_t, s_nv_i, s_d_o, s_d_t, s_d_i, s_term_o, s_term_t, s_term_i,
    s_gamma_o, s_gamma_t, s_gamma_i, s_rho_thresh_o, s_rho_thresh_t, s_rho_thresh_i,
    s_c_thresh_o, s_c_thresh_t, s_c_thresh_i,
    ACC: tl.constexpr, GAMMA_TENSOR: tl.constexpr, RHO_THRESH_TENSOR: tl.constexpr, C_THRESH_TENSOR: tl.constexpr,
    SAME_FLAGS: tl.constexpr,
    HAS_INITIAL_STATE: tl.constexpr, STORE_FINAL_STATE: tl.constexpr,
    CUT_A: tl.constexpr, LOOKBACK: tl.constexpr, WINDOW: tl.constexpr, INT64: tl.constexpr, ONE_CHUNK: tl.constexpr,
    NUM_STAGES: tl.constexpr, DESCENDING: tl.constexpr,
    SHIFTED: tl.constexpr, V_IN_TILE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr,
):
    # SHIFTED: V' is v one step on, and nv holds the last value [*B, *F] (time stride 0), read at t = T - 1 only
    o_o, o_i, o_r, m_r, b_h, n_chunks, c_lo, c_hi = row_prologue(
        h0_ptr, lb_ptr, n_rows, inner, T, ACC, BLOCK_R, BLOCK_T, HAS_INITIAL_STATE, LOOKBACK, WINDOW, INT64, ONE_CHUNK)
    # V_IN_TILE: batch-major rows of several chunks, whose next step is the next element (``load_next_step``)
    # VS_RELOAD: one row over several warps (with RELOAD_NARROW also rows sharing a warp; DESCENDING tiles), no
    # look-back: vs_(t+1) read back from the output just stored (``stored_next_step``), not gathered one column on
    # through shared memory (sm_90 SASS at 512 x 512: 536 -> 440 instructions, 13 -> 5 barriers, 64 -> 48 registers)
    VS_RELOAD: tl.constexpr = (((BLOCK_R == 1 and BLOCK_T > WARP_LOCAL_T) or DESCENDING
                                or (RELOAD_NARROW and BLOCK_T < WARP_LOCAL_T))
                               and not LOOKBACK and vs_ptr.dtype.element_ty == ACC)
    b_v_after = tl.zeros([BLOCK_R], dtype=ACC)  # [BLOCK_R] v at the first step of the chunk after this one
    for i_c in tl.range(c_lo, c_hi, num_stages=NUM_STAGES):
        o_t, m, w = chunk(i_c, n_chunks, T, o_o, m_r, BLOCK_T, True, LOOKBACK, WINDOW, INT64, DESCENDING)
        b_rho, b_c, b_r, b_v, b_nd, b_nterm, b_g = _vtrace_step(
            lpi_ptr, lmu_ptr, r_ptr, v_ptr, d_ptr, term_ptr, gamma_ptr, rho_thresh_ptr, c_thresh_ptr,
            gamma, rho_thresh, c_thresh, o_o, o_i, o_t, m,
            s_lpi_o, s_lpi_t, s_lpi_i, s_lmu_o, s_lmu_t, s_lmu_i, s_r_o, s_r_t, s_r_i, s_v_o, s_v_t, s_v_i,
            s_d_o, s_d_t, s_d_i, s_term_o, s_term_t, s_term_i,
            s_gamma_o, s_gamma_t, s_gamma_i, s_rho_thresh_o, s_rho_thresh_t, s_rho_thresh_i,
            s_c_thresh_o, s_c_thresh_t, s_c_thresh_i,
            ACC, GAMMA_TENSOR, RHO_THRESH_TENSOR, C_THRESH_TENSOR, SAME_FLAGS, w,
        )
        if SHIFTED:  # V'_t = V_(t+1), the last value at t = T - 1 [BLOCK_R, BLOCK_T]
            b_v1, b_v_after1 = load_next_step(v_ptr, b_v, b_v_after, o_o, o_i, o_t, s_v_o, s_v_t, s_v_i, m, T, ACC,
                                              V_IN_TILE, LOOKBACK, True, w)
            b_nv = last_step_value(b_v1, nv_ptr, o_o, o_i, o_t, s_nv_o, s_nv_i, m_r, T, ACC)
        else:
            b_nv = load_tile(nv_ptr, o_o, o_i, o_t, s_nv_o, s_nv_t, s_nv_i, m, ACC, w)  # [BLOCK_R, BLOCK_T]
        # V' of a terminated step is never read (nor can a NaN there leak)
        b_nv = zero_where(b_nv, b_nterm == 0)
        b_a, b_b = _vtrace_coefficients(b_r, b_v, b_nv, b_nd, b_nterm, b_g, b_rho, b_c)
        # [BLOCK_R, BLOCK_T] h_t = vs_t - V_t, and the state entering the tile (h of the step after its last column)
        b_hc, b_h, b_enter = scan_tile_enter(b_a, b_b, b_h, m, not DESCENDING, CUT_A, lb_ptr, o_r, i_c, n_chunks,
                                             LOOKBACK, STORE_FINAL_STATE)
        # vs_(t+1) [BLOCK_R, BLOCK_T]; past the window end h_T + V'_(T-1); at a done step V'_t alone
        if VS_RELOAD:
            b_vs = b_hc + b_v  # [BLOCK_R, BLOCK_T]
            store_tile(vs_ptr, b_vs, o_o, o_i, o_t, T, inner, m, w)
            b_vs1 = stored_next_step(vs_ptr, b_vs, o_o, o_i, o_t, T, inner, m, ACC, w)
            b_vs1 = tl.where(o_t + 1 < T, b_vs1, b_enter[:, None] + b_nv)
        else:
            # h_(t+1): the next column in time (in a DESCENDING tile the one before; masked columns past T hold the
            # entering state), past the tile the entering state [BLOCK_R, BLOCK_T]
            b_h1 = next_column(b_hc, b_enter, DESCENDING)
            # V_(t+1): the shifted mode has it from before the scan, but in tiles whose rows span several warps,
            # where it reads it again (``load_next_step``'s ``OWN_LOAD``). H100
            # (results/h100/bench_peers_vtrace_*.md): reading it again cost the 4 x 128 look-back chunks 512 x 4096
            # 32.6 -> 37.7 µs; not reading it again cost the wide tiles 512 x 2048 16.0 -> 35.3 µs.
            if SHIFTED and BLOCK_T <= WARP_LOCAL_T:
                b_v_after = b_v_after1
            else:
                b_v1, b_v_after = load_next_step(v_ptr, b_v, b_v_after, o_o, o_i, o_t, s_v_o, s_v_t, s_v_i, m, T,
                                                 ACC, V_IN_TILE, LOOKBACK, w=w)
            b_vs1 = b_h1 + tl.where(o_t + 1 < T, b_v1, b_nv)
        b_vs1 = tl.where(b_nd > 0.0, b_vs1, b_nv)  # [BLOCK_R, BLOCK_T]
        _, b_adv = _vtrace_coefficients(b_r, b_v, b_vs1, b_nd, b_nterm, b_g, b_rho, b_rho)
        store_tile(adv_ptr, b_adv, o_o, o_i, o_t, T, inner, m, w)
        if not VS_RELOAD:
            store_tile(vs_ptr, b_hc + b_v, o_o, o_i, o_t, T, inner, m, w)
    store_state(ht_ptr, b_h, o_r, m_r, c_hi, n_chunks, STORE_FINAL_STATE)


@replayable
def vtrace(
    log_pi: torch.Tensor,
    log_mu: torch.Tensor,
    state_value: torch.Tensor,
    next_state_value: torch.Tensor,
    reward: torch.Tensor,
    done: torch.Tensor,
    terminated: torch.Tensor | None = None,
    *,
    gamma: float | torch.Tensor,
    rho_thresh: float | torch.Tensor = 1.0,
    c_thresh: float | torch.Tensor = 1.0,
    time_dim: int | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    last_state_value: torch.Tensor | None = None,
    backend: str = "auto",
):
    r"""V-trace advantage and value target :math:`v_s` in one pass.

    Args:
        log_pi (Tensor): ``[*B, T, *F]`` log-probabilities of the taken actions under the target (learner)
            policy.
        log_mu (Tensor): ``[*B, T, *F]`` log-probabilities of the taken actions under the behaviour (actor)
            policy.
        state_value (Tensor): ``[*B, T, *F]`` values :math:`V(s_t)`.
        next_state_value (Tensor or None): ``[*B, T, *F]`` values of the next observations :math:`V(s_{t+1})`;
            ``None`` with ``last_state_value`` to read them from ``state_value`` one step on (shifted mode).
        reward (Tensor): ``[*B, T, *F]`` rewards.
        done (Tensor): ``[*B, T, *F]`` bool, the trajectory ends after step t (terminated or truncated).
        terminated (Tensor, optional): ``[*B, T, *F]`` bool, the episode terminated at step t (no bootstrap).
            Defaults to ``done``.

    Keyword Args:
        gamma (float or Tensor): discount, a number or a tensor broadcastable to the inputs.
        rho_thresh (float or Tensor): :math:`\bar\rho`, the clip of the weights of the TD errors (finite,
            non-negative, no upper bound), a number or a broadcastable tensor. Defaults to ``1.0``.
        c_thresh (float or Tensor): :math:`\bar c`, the clip of the trace weights, likewise. Defaults to ``1.0``.
        time_dim (int, optional): the time dimension. Defaults to ``-2`` (TorchRL's ``[*B, T, 1]``), except
            that 2-D inputs must name it (they raise without it): ``-1`` for ``[B, T]``, ``0`` for ``[T, B]``.
        initial_state (Tensor, optional): ``[*B, *F]`` :math:`h_T = v_s - V` at the first step of the segment
            that follows this one (its :math:`V` being this segment's last ``next_state_value``). Defaults to
            zero: the window end bootstraps from ``next_state_value`` like a truncation.
        output_final_state (bool): also return :math:`h_0 = v_{s_0} - V_0` (float32, or float64 for float64
            inputs), the state to pass as ``initial_state`` to the preceding segment. Defaults to ``False``.
        last_state_value (Tensor, optional): ``[*B, *F]`` value of the observation after the last step,
            :math:`V(s_T)`, in the inputs' dtype. Given (with ``next_state_value=None``), :math:`V(s_{t+1})` is read
            from ``state_value`` at step t + 1 for t < T - 1 and from ``last_state_value`` at t = T - 1, with no
            next-value tensor built or read: the storage of learners that keep the values of T + 1 observations
            (IMPALA's bootstrap value). After a done step, ``state_value`` at t + 1 belongs to the next episode, so
            no step that is done may bootstrap: leave ``terminated`` to default to ``done``. Mutually exclusive with
            ``next_state_value``.
        backend (str): ``"auto"`` (Triton on CUDA, torch elsewhere), ``"triton"`` or ``"torch"``.

    Returns:
        ``(advantage, value_target)`` in the input shape and dtype, plus the final state if asked for.

    Examples:
        >>> log_pi = torch.zeros(1, 3, 1)
        >>> log_mu = torch.full((1, 3, 1), 0.5)
        >>> value = torch.zeros(1, 3, 1)
        >>> reward = torch.ones(1, 3, 1)
        >>> done = torch.zeros(1, 3, 1, dtype=torch.bool)
        >>> adv, vs = vtrace(log_pi, log_mu, value, value, reward, done, gamma=0.9)
        >>> vs[0, :, 0]
        tensor([1.1184, 0.9376, 0.6065])
    """
    shifted = check_shifted(next_state_value, last_state_value)
    layout = check_inputs(
        time_dim,
        {"log_pi": log_pi, "log_mu": log_mu, "state_value": state_value, "next_state_value": next_state_value,
         "reward": reward},
        {"done": done, "terminated": terminated},
        {"initial_state": initial_state, "last_state_value": last_state_value},
        optional=("terminated", "next_state_value") if shifted else ("terminated",),
    )
    if shifted:
        check_last_value_dtype(last_state_value, layout, "log_pi")
    gamma = check_coef("gamma", gamma, layout)
    rho_thresh = check_coef("rho_thresh", rho_thresh, layout, high=None)
    c_thresh = check_coef("c_thresh", c_thresh, layout, high=None)
    terminated = done if terminated is None else terminated
    if layout.empty:
        adv, vs = new_outputs(layout, 2)
        ht = empty_state(layout, initial_state)
    elif (path := resolve_backend(backend, layout.device, log_pi, log_mu, state_value, next_state_value, reward,
                                  gamma, rho_thresh, c_thresh, initial_state, last_state_value)) != "triton":
        ratio = torch.exp(rows_time(log_pi, layout) - rows_time(log_mu, layout))
        rho = ratio.clamp_max(rows_time(rho_thresh, layout))
        r, v = rows_time(reward, layout), rows_time(state_value, layout)
        nv = next_value_rows(v, next_state_value, last_state_value, terminated, layout)
        nd, nterm, g = not_flag(done, layout), not_flag(terminated, layout), rows_time(gamma, layout)
        b_a, b_b = vtrace_coefficients(r, v, nv, nd, nterm, g, rho, ratio.clamp_max(rows_time(c_thresh, layout)))
        h0 = rows_state(initial_state)
        h0 = torch.zeros_like(v[:, 0]) if h0 is None else h0.to(v.dtype)
        h, ht = scan_rows(b_a, b_b, h0, True, path)
        h1 = torch.cat([h[:, 1:], h0[:, None]], dim=1)  # h_(t+1)
        v1 = torch.cat([v[:, 1:], nv[:, -1:]], dim=1)  # V_(t+1), V'_(T-1) past the window end
        vs1 = torch.where(rows_time(done, layout), nv, h1 + v1)
        _, b_adv = vtrace_coefficients(r, v, vs1, nd, nterm, g, rho, rho)
        adv, vs, ht = from_rows_time(b_adv, layout), from_rows_time(h + v, layout), state_out(ht, layout)
    else:  # the outputs are allocated here, on the path that writes them
        adv, vs = new_outputs(layout, 2)
        ht = launch(
            _vtrace_fwd_kernel, layout,
            inputs={"lpi": log_pi, "lmu": log_mu, "r": reward, "v": state_value,
                    "nv": next_value_input(next_state_value, last_state_value, layout), "d": done,
                    "term": terminated},
            coefs={"gamma": gamma, "rho_thresh": rho_thresh, "c_thresh": c_thresh},
            outputs={"adv": adv, "vs": vs},
            initial_state=initial_state, output_final_state=output_final_state, SHIFTED=shifted,
            V_IN_TILE=layout.inner == 1 and layout.T > WARP_LOCAL_T.value,
        )
    return (adv, vs, ht) if output_final_state else (adv, vs)
