"""Advantage normalisation over the global batch of a data-parallel run.

In data-parallel PPO each of the ``W`` ranks holds a slice ``x_r`` of the batch. Normalising each slice with its own
mean and standard deviation is not normalising the batch: the ranks' statistics differ. ``normalize_advantage``
all-reduces three sums in one call (one small float64 tensor: element count, ``Σx``, ``Σx²``) and normalises every
slice with the statistics of the concatenated batch ``x = cat(x_1, ..., x_W)`` of ``n`` elements:

    mean = Σx / n
    std  = sqrt((Σx² - n · mean²) / (n - 1))            (unbiased, as ``torch.std``)
    x̂    = (x - mean) / max(std, eps),   eps = 1e-6      (``torch.finfo(torch.float).resolution``)

which is the formula of TorchRL 0.14's ``ClipPPOLoss(normalize_advantage=True)`` (``torchrl._utils._standardize``).
With a ``mask``, the sums run over the masked elements only and the variance is the biased one, with ``eps = 1e-4``,
as in TorchRL's masked branch (``ClipPPOLoss._standardize_advantage`` with a ``"shifted_valid"`` entry):

    n = Σm,   mean = Σ(m·x) / n,   std = sqrt(Σ(m·x²) / n - mean²),   x̂ = (x - mean) / max(std, eps)

and, as there, every element (masked out or not) is shifted and scaled. When the batch holds at most one element in
all, the advantage is returned unchanged, as TorchRL leaves it.

Exactness: the sums are accumulated in float64 and the result is cast back to the advantage's dtype; it equals
normalising the concatenated batch up to the rounding of that dtype. The one-pass variance loses about
``mean² / var · 1e-16`` of relative precision, far below float32 rounding for any advantage whose mean is not 10⁴
standard deviations from 0. The statistics are constants for autograd: gradients flow through ``x - mean`` and the
division, not through ``mean`` and ``std`` (advantages normally carry no gradient).

Which path runs: the all-reduce whenever ``torch.distributed`` is initialised (over ``group``, or the default group),
local statistics otherwise. The two give the same numbers for a world of one process; asking for a ``group``
without an initialised process group is an error, not a silent fallback.
"""
from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["normalize_advantage", "normalize_tensordict_advantage"]

# TorchRL 0.14's floors of the standard deviation: torchrl._utils._standardize (no mask) and
# ClipPPOLoss._standardize_advantage (with a mask)
EPS = torch.finfo(torch.float).resolution
MASKED_EPS = 1e-4


def normalize_advantage(advantage, *, mask=None, group=None, eps=None):
    """Normalises ``advantage`` with the mean and standard deviation of the batch across all ranks.

    Args:
        advantage (torch.Tensor): this rank's advantages, any shape, e.g. ``[*B, T, 1]``; floating point. Ranks may
            hold different numbers of elements.

    Keyword Args:
        mask (torch.Tensor, optional): a bool tensor of valid elements, broadcastable to ``advantage`` after
            trailing singleton dimensions are appended (TorchRL's rule: ``[*B, T]`` masks ``[*B, T, 1]``). The
            statistics count the valid elements only (biased variance, TorchRL's masked formula); every element
            is normalised. Defaults to ``None`` (all valid; unbiased variance).
        group (torch.distributed.ProcessGroup, optional): the ranks to reduce over. Defaults to ``None``: the default
            group when ``torch.distributed`` is initialised, this process alone otherwise. A group given without an
            initialised process group raises ``RuntimeError``.
        eps (float, optional): floor of the standard deviation. Defaults to ``None``: TorchRL's, ``1e-6`` without a
            mask and ``1e-4`` with one.

    Returns:
        torch.Tensor: ``(advantage - mean) / max(std, eps)``, a new tensor of the shape, dtype and device of
        ``advantage``; ``advantage`` itself when the global batch has at most one element.

    Every rank of the group must call this (it is a collective). The sums travel as one float64 tensor of 4
    elements on ``advantage``'s device (CUDA tensors need a backend that reduces them, e.g. NCCL).

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from rl_triton_torchrl.distributed import normalize_advantage
        >>> batch = TensorDict({"advantage": torch.randn(8, 64, 1) * 3 + 1}, batch_size=[8, 64])
        >>> adv = normalize_advantage(batch["advantage"])  # all ranks' batch when torch.distributed is initialised
        >>> bool(abs(adv.mean()) < 1e-5), bool(abs(adv.std() - 1) < 1e-5)
        (True, True)
    """
    if not isinstance(advantage, torch.Tensor) or not advantage.is_floating_point():
        got = advantage.dtype if isinstance(advantage, torch.Tensor) else type(advantage)
        raise TypeError(f"advantage must be a floating-point tensor, got {got}")
    distributed = dist.is_available() and dist.is_initialized()
    if group is not None and not distributed:
        raise RuntimeError("normalize_advantage: a group was given but torch.distributed is not initialised")
    with torch.no_grad():
        x = advantage.detach().to(torch.float64)
        if mask is None:
            count = torch.tensor(float(x.numel()), dtype=torch.float64, device=x.device)
            stats = torch.stack([count, count, x.sum(), x.square().sum()])
        else:
            if mask.dtype != torch.bool:
                raise TypeError(f"mask must be a bool tensor, got {mask.dtype}")
            while mask.ndim < x.ndim:
                mask = mask.unsqueeze(-1)
            try:
                m = mask.to(x.device).expand_as(x).to(torch.float64)
            except RuntimeError as error:
                raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to the advantage's "
                                 f"{tuple(x.shape)}") from error
            numel = torch.tensor(float(x.numel()), dtype=torch.float64, device=x.device)
            stats = torch.stack([numel, m.sum(), (m * x).sum(), (m * x.square()).sum()])
        if distributed:
            dist.all_reduce(stats, op=dist.ReduceOp.SUM, group=group)
        numel, n, total, total_sq = stats.unbind()
        if numel.item() <= 1:
            return advantage
        mean = total / n.clamp_min(1)
        if mask is None:
            var = (total_sq - n * mean.square()) / (n - 1)
        else:
            var = total_sq / n.clamp_min(1) - mean.square()
        std = var.clamp_min(0).sqrt().clamp_min((MASKED_EPS if mask is not None else EPS) if eps is None else eps)
    return (advantage - mean.to(advantage.dtype)) / std.to(advantage.dtype)


def normalize_tensordict_advantage(tensordict, *, key="advantage", mask_key=None, group=None, eps=None):
    """Replaces ``tensordict[key]`` by its normalisation over the global batch (see ``normalize_advantage``).

    Args:
        tensordict (TensorDictBase): this rank's batch, holding the advantage (e.g. written by a ``GAE`` module).

    Keyword Args:
        key (NestedKey, optional): the advantage entry, read and overwritten. Defaults to ``"advantage"``.
        mask_key (NestedKey, optional): an entry holding a bool mask of valid elements (e.g. ``"shifted_valid"``).
            Defaults to ``None`` (all valid).
        group (torch.distributed.ProcessGroup, optional): as in ``normalize_advantage``.
        eps (float, optional): as in ``normalize_advantage``.

    Returns:
        TensorDictBase: ``tensordict``, with ``key`` set to the normalised advantage.

    Examples:
        >>> import torch
        >>> from tensordict import TensorDict
        >>> from rl_triton_torchrl import GAE
        >>> from rl_triton_torchrl.distributed import normalize_tensordict_advantage
        >>> B, T = 4, 32
        >>> rollout = TensorDict({
        ...     "state_value": torch.randn(B, T, 1),
        ...     "next": {"state_value": torch.randn(B, T, 1), "reward": torch.randn(B, T, 1),
        ...              "done": torch.zeros(B, T, 1, dtype=torch.bool),
        ...              "terminated": torch.zeros(B, T, 1, dtype=torch.bool)},
        ... }, batch_size=[B, T])
        >>> rollout = normalize_tensordict_advantage(GAE(gamma=0.99, lmbda=0.95, value_network=None)(rollout))
        >>> bool(abs(rollout["advantage"].mean()) < 1e-5)
        True
    """
    mask = None if mask_key is None else tensordict.get(mask_key)
    tensordict.set(key, normalize_advantage(tensordict.get(key), mask=mask, group=group, eps=eps))
    return tensordict
