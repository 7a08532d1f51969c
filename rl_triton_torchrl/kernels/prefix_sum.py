r"""Episodic prefix sums: running totals of a per-step quantity that restart at episode boundaries.

.. math::

    S_t = \gamma_t \, (1 - \mathrm{reset}_t)\, S_{t-1} + x_t,

a forward scan with :math:`a_t = \gamma_t (1 - \mathrm{reset}_t)` and :math:`b_t = x_t`. With the default
:math:`\gamma = 1` it is the plain sum since the episode started: the episode return so far (``x`` = rewards), the
episode length so far (``x`` = ones). A discount :math:`\gamma_t < 1` gives the exponentially decayed running sum
:math:`S_t = \gamma S_{t-1} + x_t` that reward normalisers track (not :math:`\sum_k \gamma^k x_k` counted from the
episode start). :math:`\gamma_t` is the decay applied on entering step t.

``boundary`` marks episode boundaries in one of two conventions, chosen by ``reset`` (nothing else is accepted):

- ``"after_done"``: the flag marks the last step of an episode (TorchRL's ``done``); the sum restarts at the
  following step, :math:`\mathrm{reset}_t = \mathrm{boundary}_{t-1}`: a plain load one step back.
- ``"at_start"``: the flag marks the first step of an episode (TorchRL's ``is_init``); the sum restarts at that
  step, :math:`\mathrm{reset}_t = \mathrm{boundary}_t`.

Carried state: the sum before step 0, :math:`S_{-1}`, is ``initial_state`` or zero. The state returned with
``output_final_state`` is :math:`S_{T-1}` with every reset this segment knows applied: for ``"after_done"`` it is
zero where the last step ends an episode (:math:`(1 - \mathrm{boundary}_{T-1}) S_{T-1}`); for ``"at_start"`` it is
:math:`S_{T-1}` itself (the next segment's first flag decides). Either way, feeding it as ``initial_state`` to the
next segment of the same rollout continues the sums exactly as if the rollout had not been cut; the decay
:math:`\gamma_0` of the next segment is applied to it there.
"""
from __future__ import annotations

import torch

from ._replay import replayable
from ._triton import tl, triton
from ._utils import InputError, check_coef, check_inputs, resolve_backend
from .scan import (
    chunk, empty_state, from_rows_time, launch, load_coef, load_tile, new_outputs, not_flag, row_prologue,
    rows_state, rows_time, scan_tile, state_out, store_state, store_tile, scan_rows,
)

__all__ = ["episodic_prefix_sum"]

RESETS = ("after_done", "at_start")


def prefix_sum_coefficients(x, not_reset, discount):
    """(a_t, b_t) of the episodic prefix sum; plain arithmetic shared by the Triton kernel and the torch path."""
    return discount * not_reset, x


_prefix_sum_coefficients = triton.jit(prefix_sum_coefficients)


@triton.jit
def _prefix_sum_fwd_kernel(
    x_ptr, f_ptr, discount_ptr, s_ptr, h0_ptr, ht_ptr, lb_ptr,
    discount, n_rows, inner, T,
    s_x_o, s_x_t, s_x_i, s_f_o, s_f_t, s_f_i, s_discount_o, s_discount_t, s_discount_i,
    ACC: tl.constexpr, DISCOUNT_TENSOR: tl.constexpr, AFTER_DONE: tl.constexpr,
    HAS_INITIAL_STATE: tl.constexpr, STORE_FINAL_STATE: tl.constexpr,
    CUT_A: tl.constexpr, LOOKBACK: tl.constexpr, WINDOW: tl.constexpr, INT64: tl.constexpr, ONE_CHUNK: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr,
):
    o_o, o_i, o_r, m_r, b_h, n_chunks, c_lo, c_hi = row_prologue(
        h0_ptr, lb_ptr, n_rows, inner, T, ACC, BLOCK_R, BLOCK_T, HAS_INITIAL_STATE, LOOKBACK, WINDOW, INT64, ONE_CHUNK)
    for i_c in tl.range(c_lo, c_hi, num_stages=NUM_STAGES):
        o_t, m, w = chunk(i_c, n_chunks, T, o_o, m_r, BLOCK_T, False, LOOKBACK, WINDOW, INT64)
        b_x = load_tile(x_ptr, o_o, o_i, o_t, s_x_o, s_x_t, s_x_i, m, ACC, w)  # [BLOCK_R, BLOCK_T]
        if AFTER_DONE:  # the flag of the previous step; none before step 0 (the carried state has it applied)
            b_f = load_tile(f_ptr, o_o, o_i, o_t - 1, s_f_o, s_f_t, s_f_i, m & (o_t > 0), ACC)
        else:
            b_f = load_tile(f_ptr, o_o, o_i, o_t, s_f_o, s_f_t, s_f_i, m, ACC, w)  # [BLOCK_R, BLOCK_T]
        b_g = load_coef(discount_ptr, discount, o_o, o_i, o_t, s_discount_o, s_discount_t, s_discount_i, m, ACC,
                        DISCOUNT_TENSOR)
        b_a, b_b = _prefix_sum_coefficients(b_x, 1.0 - b_f, b_g)
        b_s, b_h = scan_tile(b_a, b_b, b_h, m, False, CUT_A, lb_ptr, o_r, i_c, n_chunks, LOOKBACK, STORE_FINAL_STATE)
        store_tile(s_ptr, b_s, o_o, o_i, o_t, T, inner, m, w)
    if STORE_FINAL_STATE:
        if AFTER_DONE:  # the last step's flag resets the state carried out
            o_last = tl.zeros([1, 1], dtype=tl.int64) + (T - 1)
            b_f = tl.sum(load_tile(f_ptr, o_o, o_i, o_last, s_f_o, s_f_t, s_f_i, m_r[:, None], ACC), axis=1)
            b_h = tl.where(b_f > 0, 0.0, b_h)  # [BLOCK_R]
    store_state(ht_ptr, b_h, o_r, m_r, c_hi, n_chunks, STORE_FINAL_STATE)


def check_reset(reset) -> bool:
    """Validates the boundary convention; True for ``"after_done"``."""
    if not isinstance(reset, str) or reset not in RESETS:
        raise InputError(f"reset must be one of {RESETS} (the flag marks the last step of an episode, or its first "
                         f"step), got {reset!r}")
    return reset == "after_done"


@replayable
def episodic_prefix_sum(
    x: torch.Tensor,
    boundary: torch.Tensor,
    *,
    reset: str,
    discount: float | torch.Tensor = 1.0,
    time_dim: int | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    backend: str = "auto",
):
    r"""Forward cumulative sums of ``x`` within episodes, restarting at every boundary.

    Args:
        x (Tensor): ``[*B, T, *F]`` per-step quantity (rewards for the return so far, ones for the length so far).
        boundary (Tensor): ``[*B, T, *F]`` bool episode boundaries, in the convention ``reset`` names. A flag shared
            by the trailing dims can be passed expanded (``done.expand_as(x)``): stride 0, no copy.

    Keyword Args:
        reset (str): ``"after_done"``: ``boundary`` marks the last step of an episode (``done``) and the sum restarts
            at the following step; ``"at_start"``: it marks the first step (``is_init``) and the sum restarts at that
            step. Required; any other value raises ``ValueError``.
        discount (float or Tensor): decay :math:`\gamma_t` applied to the running sum on entering step t, a number
            in [0, 1] or a tensor broadcastable to ``x``. Defaults to ``1.0`` (plain sums).
        time_dim (int, optional): the time dimension. Defaults to ``-2`` (TorchRL's ``[*B, T, 1]``), except
            that 2-D inputs must name it (they raise without it): ``-1`` for ``[B, T]``, ``0`` for ``[T, B]``.
        initial_state (Tensor, optional): ``[*B, *F]`` sum :math:`S_{-1}` carried in from the preceding segment
            (its ``output_final_state``). Defaults to zero.
        output_final_state (bool): also return the state to pass as ``initial_state`` to the next segment:
            :math:`S_{T-1}`, zeroed where the last step ends an episode under ``"after_done"`` (float32, or float64
            for float64 inputs). Defaults to ``False``.
        backend (str): ``"auto"`` (Triton on CUDA, torch elsewhere), ``"triton"`` or ``"torch"``.

    Returns:
        The sums :math:`S_t` in the input shape and dtype, plus the final state if asked for.

    Examples:
        >>> ones = torch.ones(1, 5, 1)
        >>> done = torch.tensor([False, True, False, False, True]).view(1, 5, 1)
        >>> episodic_prefix_sum(ones, done, reset="after_done")[0, :, 0]
        tensor([1., 2., 1., 2., 3.])
        >>> is_init = torch.tensor([True, False, True, False, False]).view(1, 5, 1)
        >>> episodic_prefix_sum(ones, is_init, reset="at_start")[0, :, 0]
        tensor([1., 2., 1., 2., 3.])
    """
    after_done = check_reset(reset)
    layout = check_inputs(time_dim, {"x": x}, {"boundary": boundary}, {"initial_state": initial_state})
    discount = check_coef("discount", discount, layout)
    if layout.empty:
        (s,) = new_outputs(layout, 1)
        ht = empty_state(layout, initial_state)
    elif (path := resolve_backend(backend, layout.device, x, discount, initial_state)) != "triton":
        nf = not_flag(boundary, layout)  # [R, T]
        nr = torch.nn.functional.pad(nf[:, :-1], (1, 0), value=1.0) if after_done else nf  # 1 - reset_t
        b_a, b_b = prefix_sum_coefficients(rows_time(x, layout), nr, rows_time(discount, layout))
        h, ht = scan_rows(b_a, b_b, rows_state(initial_state), False, path)
        if after_done:
            ht = torch.where(nf[:, -1] == 0, 0.0, ht)
        s, ht = from_rows_time(h, layout), state_out(ht, layout)
    else:  # the outputs are allocated here, on the path that writes them
        (s,) = new_outputs(layout, 1)
        ht = launch(
            _prefix_sum_fwd_kernel, layout,
            inputs={"x": x, "f": boundary},
            coefs={"discount": discount},
            outputs={"s": s},
            initial_state=initial_state, output_final_state=output_final_state, finite_a=True,
            AFTER_DONE=after_done,
        )
    return (s, ht) if output_final_state else s
