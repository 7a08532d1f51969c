r"""Accumulating eligibility traces (Sutton & Barto, ch. 12), forward in time.

.. math::

    e_t = \gamma_t \lambda_t \, (1 - \mathrm{done}_{t-1})\, e_{t-1} + x_t,

a forward scan with :math:`a_t = \gamma_t \lambda_t (1 - \mathrm{done}_{t-1})` and :math:`b_t = x_t`, elementwise
over any trailing dims (per-feature traces: ``x`` is e.g. the gradient of the value at step t, ``[*B, T, F]``).
``done_t`` marks the last step of an episode, so the trace restarts at the step after it; the flag of the previous
step is a plain load one step back. :math:`\gamma_t, \lambda_t` are the decay applied on entering step t (for
numbers this is the textbook :math:`e_t = \gamma\lambda e_{t-1} + x_t`; a per-step tensor is indexed by the step it
decays into, one step later than the ``gamma`` of ``gae``, which multiplies what follows step t).

Carried state: the trace before step 0, :math:`e_{-1}`, is ``initial_state`` or zero; the decay
:math:`\gamma_0 \lambda_0` applies to it. The state returned with ``output_final_state`` is the last trace with the
last step's reset applied, :math:`(1 - \mathrm{done}_{T-1})\, e_{T-1}`: zero where the segment ends an episode, so a
done at the last step of one batch resets the first step of the next. Feeding it as ``initial_state`` to the next
segment of the same rollout continues the traces exactly as if the rollout had not been cut.

This is the episodic prefix sum with ``reset="after_done"`` and ``discount`` = :math:`\gamma\lambda`, and it is
computed by it (``prefix_sum.py``): no kernel of its own.

Only accumulating traces are computed. Replacing traces (binary features: :math:`e_t = 1` where :math:`x_t = 1`,
else :math:`\gamma\lambda e_{t-1}`) are the same scan with :math:`a_t` multiplied by :math:`(1 - x_t)`; they are not
supported here (``linear_scan`` computes them from explicit coefficients). Dutch traces,
:math:`e_t = \gamma\lambda e_{t-1} + (1 - \alpha\gamma\lambda\, e_{t-1}^\top x_t)\, x_t`, couple all features through
the inner product (a matrix, not an elementwise, recurrence) and are not supported.
"""
from __future__ import annotations

import torch

from ._replay import replayable
from ._utils import check_coef, check_inputs
from .prefix_sum import episodic_prefix_sum

__all__ = ["eligibility_traces"]


@replayable
def eligibility_traces(
    x: torch.Tensor,
    done: torch.Tensor,
    *,
    gamma: float | torch.Tensor,
    lmbda: float | torch.Tensor,
    time_dim: int | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    backend: str = "auto",
):
    r"""Accumulating eligibility traces :math:`e_t = \gamma\lambda (1 - \mathrm{done}_{t-1}) e_{t-1} + x_t`.

    Args:
        x (Tensor): ``[*B, T, *F]`` per-step increments, e.g. the value gradient of every feature at step t.
        done (Tensor): ``[*B, T, *F]`` bool, step t is the last of its episode (the trace restarts at t + 1).
            Flags shared by the features can be passed expanded, ``done[..., :1].expand_as(x)``: stride 0, no copy.

    Keyword Args:
        gamma (float or Tensor): discount, a number or a tensor broadcastable to ``x`` (per step: the decay into
            step t).
        lmbda (float or Tensor): trace-decay lambda, likewise.
        time_dim (int, optional): the time dimension. Defaults to ``-2`` (TorchRL's ``[*B, T, 1]``), except
            that 2-D inputs must name it (they raise without it): ``-1`` for ``[B, T]``, ``0`` for ``[T, B]``.
        initial_state (Tensor, optional): ``[*B, *F]`` trace :math:`e_{-1}` carried in from the preceding segment
            (its ``output_final_state``), decayed by :math:`\gamma_0\lambda_0` at step 0. Defaults to zero.
        output_final_state (bool): also return :math:`(1 - \mathrm{done}_{T-1})\, e_{T-1}` (float32, or float64 for
            float64 inputs), the state to pass as ``initial_state`` to the next segment. Defaults to ``False``.
        backend (str): ``"auto"`` (Triton on CUDA, torch elsewhere), ``"triton"`` or ``"torch"``.

    Returns:
        The traces :math:`e_t` in the input shape and dtype, plus the final state if asked for.

    Examples:
        >>> x = torch.ones(1, 4, 1)
        >>> done = torch.tensor([False, True, False, False]).view(1, 4, 1)
        >>> eligibility_traces(x, done, gamma=0.5, lmbda=1.0)[0, :, 0]
        tensor([1.0000, 1.5000, 1.0000, 1.5000])
    """
    layout = check_inputs(time_dim, {"x": x}, {"done": done}, {"initial_state": initial_state})
    gamma, lmbda = (c.to(layout.device, layout.acc_dtype) if isinstance(c, torch.Tensor) else c
                    for c in (check_coef("gamma", gamma, layout), check_coef("lmbda", lmbda, layout)))
    decay = gamma * lmbda  # in the accumulation dtype: a product of half-precision tensors would be rounded
    return episodic_prefix_sum(x, done, reset="after_done", discount=decay, time_dim=layout.time_dim,
                               initial_state=initial_state, output_final_state=output_final_state, backend=backend)
