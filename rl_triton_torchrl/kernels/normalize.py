r"""Standardisation of a whole tensor in place, the way PPO implementations normalise a rollout's advantages:

.. math::

    x \leftarrow \frac{x - \bar x}{s + \epsilon}, \qquad
    \bar x = \frac{1}{n} \sum_i x_i, \qquad s = \sqrt{\frac{1}{n - 1} \sum_i (x_i - \bar x)^2}

(rsl_rl's ``(A - A.mean()) / (A.std() + 1e-8)``). Two launches and no host sync: the first reduces each chunk of the
flattened tensor to its mean (relative to the first element of the tensor) and its sum of squared deviations
(shifted by the chunk's first element, so that neither cancels when the mean is far from zero), the second combines
every chunk's moments (Chan, Golub and LeVeque's pairwise update) and rewrites its chunk. On CUDA, torch's
``std_mean`` plus three elementwise kernels is a single-block reduction at rollout sizes such as 4096 x 24.
"""
from __future__ import annotations

import torch

from ._launcher import launcher
from ._triton import tl, triton
from ._utils import InputError, resolve_backend
from .scan import triton_dtype

__all__ = ["normalize_"]

# elements per program and loop step; chunks are whole blocks
BLOCK = 1024
# at most this many chunks: the second kernel's programs each combine all of them in one block
MAX_CHUNKS = 1024
# chunks aimed at: four per SM of an H200
TARGET_CHUNKS = 528
NUM_WARPS = 4


@triton.jit
def _moments_fwd_kernel(x_ptr, part_ptr, n, chunk_len, ACC: tl.constexpr, BLOCK: tl.constexpr):
    # part[i_c] = (mean - x[0], sum of squared deviations) of x[i_c * chunk_len : (i_c + 1) * chunk_len]; program 0
    # also keeps x[0] in part[n_chunks] (the second kernel rewrites x). Means are taken relative to x[0], so that a
    # mean far from zero is not rounded before the small deviations are subtracted from it.
    i_c = tl.program_id(0)
    o_lo = i_c.to(tl.int64) * chunk_len
    o_x = tl.arange(0, BLOCK)
    b_ref = tl.load(x_ptr).to(ACC)
    b_shift = tl.load(x_ptr + o_lo).to(ACC)
    b_s1 = tl.zeros([BLOCK], dtype=ACC)
    b_s2 = tl.zeros([BLOCK], dtype=ACC)
    for i in tl.range(0, chunk_len, BLOCK):
        o = o_lo + i + o_x
        m = o < n
        b_d = tl.where(m, tl.load(x_ptr + o, mask=m).to(ACC) - b_shift, 0.0)  # [BLOCK]
        b_s1 += b_d
        b_s2 += b_d * b_d
    b_n = tl.minimum(n - o_lo, chunk_len).to(ACC)
    b_sum = tl.sum(b_s1, axis=0)
    tl.store(part_ptr + 2 * i_c, (b_shift - b_ref) + b_sum / b_n)
    tl.store(part_ptr + 2 * i_c + 1, tl.maximum(tl.sum(b_s2, axis=0) - b_sum * b_sum / b_n, 0.0))
    if i_c == 0:
        tl.store(part_ptr + 2 * tl.num_programs(0), b_ref)


@triton.jit
def _normalize_fwd_kernel(x_ptr, part_ptr, n, chunk_len, n_chunks, eps, ACC: tl.constexpr, BLOCK: tl.constexpr,
                          MAX_CHUNKS: tl.constexpr):
    # every program combines all chunks' moments, then standardises its own chunk in place
    i_c = tl.program_id(0)
    o_p = tl.arange(0, MAX_CHUNKS)
    m_p = o_p < n_chunks
    b_mean = tl.load(part_ptr + 2 * o_p, mask=m_p, other=0.0)  # [MAX_CHUNKS], relative to x[0]
    b_m2 = tl.load(part_ptr + 2 * o_p + 1, mask=m_p, other=0.0)  # [MAX_CHUNKS]
    b_ref = tl.load(part_ptr + 2 * n_chunks)  # x[0]
    b_n = tl.where(m_p, tl.minimum(n - o_p.to(tl.int64) * chunk_len, chunk_len), 0).to(ACC)  # [MAX_CHUNKS]
    n_all = tl.cast(n, ACC)  # (n == 1 arrives as a constexpr)
    mean = tl.sum(b_n * b_mean, axis=0) / n_all
    b_dev = b_mean - mean
    m2 = tl.sum(b_m2 + b_n * b_dev * b_dev, axis=0)
    # std rounded to ACC and eps added there, as torch's ``std.add_(eps)``; the quotient rounded once: a float64
    # division (exact sqrt and division in every dtype; Triton's float32 ones are approximate)
    denom = (tl.sqrt(m2.to(tl.float64) / (n_all - 1.0)).to(ACC) + eps).to(tl.float64)
    o_lo = i_c.to(tl.int64) * chunk_len
    o_x = tl.arange(0, BLOCK)
    for i in tl.range(0, chunk_len, BLOCK):
        o = o_lo + i + o_x
        m = o < n
        b_x = tl.load(x_ptr + o, mask=m).to(ACC) - b_ref  # [BLOCK]
        tl.store(x_ptr + o, ((b_x - mean).to(tl.float64) / denom).to(ACC).to(x_ptr.dtype.element_ty), mask=m)


def chunking(n: int) -> tuple[int, int]:
    """(chunk length, number of chunks) for ``n`` elements: whole blocks, at most ``MAX_CHUNKS`` chunks."""
    blocks = -(-n // BLOCK)
    chunk_len = BLOCK * max(-(-blocks // TARGET_CHUNKS), -(-blocks // MAX_CHUNKS))
    return chunk_len, -(-n // chunk_len)


def normalize_(x: torch.Tensor, eps: float = 1e-8, *, backend: str = "auto") -> torch.Tensor:
    r"""Standardises ``x`` over all its elements, in place: ``(x - x.mean()) / (x.std() + eps)``.

    The standard deviation has Bessel's correction (torch's ``std``), so one element gives NaN, as in torch. Moments
    accumulate in float32 in the kernel (float64 for float64 inputs), in float64 on the torch path.

    Args:
        x (Tensor): any shape, floating point; non-contiguous tensors take the torch path.
        eps (float): added to the standard deviation. Defaults to ``1e-8`` (rsl_rl's).

    Keyword Args:
        backend (str): ``"auto"`` (Triton on CUDA, torch elsewhere), ``"triton"`` or ``"torch"``.

    Returns:
        ``x``, standardised.

    Examples:
        >>> x = torch.tensor([1.0, 2.0, 3.0])
        >>> normalize_(x)
        tensor([-1.,  0.,  1.])
    """
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        raise TypeError(f"x must be a floating-point torch.Tensor, got {type(x).__name__}"
                        + (f" of dtype {x.dtype}" if isinstance(x, torch.Tensor) else ""))
    if x.numel() == 0:
        return x
    path = resolve_backend(backend, x.device, x)
    if path != "triton" or not x.is_contiguous():
        if backend == "triton" and not x.is_contiguous():
            raise InputError("normalize_ with backend='triton' needs a contiguous x; use backend='auto'")
        wide = x.double()  # torch's float32 std_mean on CUDA loses digits a spread far below the mean needs
        std, mean = torch.std_mean(wide)
        return x.copy_((wide - mean) / (std + eps))
    n = x.numel()
    chunk_len, n_chunks = chunking(n)
    ACC = triton_dtype(x.dtype)  # float64 for float64 inputs, float32 otherwise
    acc = torch.float64 if ACC == tl.float64 else torch.float32
    parts = torch.empty(2 * n_chunks + 1, dtype=acc, device=x.device)  # n_chunks (mean, M2) pairs, then x[0]
    launcher(_moments_fwd_kernel)((n_chunks,), NUM_WARPS, x_ptr=x, part_ptr=parts, n=n, chunk_len=chunk_len,
                                  ACC=ACC, BLOCK=BLOCK)
    launcher(_normalize_fwd_kernel)((n_chunks,), NUM_WARPS, x_ptr=x, part_ptr=parts, n=n, chunk_len=chunk_len,
                                    n_chunks=n_chunks, eps=float(eps), ACC=ACC, BLOCK=BLOCK,
                                    MAX_CHUNKS=MAX_CHUNKS)
    return x
