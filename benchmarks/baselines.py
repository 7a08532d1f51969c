r"""Baselines of the kernel benchmark: our torch path with its scan swapped for a compiled one.

The torch path of every algorithm (``backend="torch"`` in ``rl_triton_torchrl/kernels/<algorithm>.py``) views the
inputs as ``[R, T]`` in the accumulation dtype, builds :math:`a_t, b_t` with the algorithm's plain-arithmetic
coefficient function (``gae_coefficients``, ...), solves :math:`h_t = a_t h_{t\pm1} + b_t` with
``torch_linear_scan`` and post-processes :math:`h` into the outputs. A baseline runs exactly that code with
``torch_linear_scan`` replaced (``swapped_scan``), so only the scan differs from our torch path:

- ``doubling``: the vectorised doubling (Hillis-Steele) scan in plain torch, ``doubling_scan``: ``ceil(log2 T)``
  steps, each combining every element's :math:`(a, b)` with the element :math:`2^k` before it in scan order (the
  identity :math:`(1, 0)` past the sequence edge), all elements at once; ``O(T log T)`` work.
- ``assoc_scan``: PyTorch's own ``torch._higher_order_ops.associative_scan`` with the same combine operator,
  ``hop_scan``.

Each is wrapped in ``torch.compile`` (``fullgraph=True``: a graph break raises instead of silently running eager
code); the coefficients and the post-processing stay the torch path's eager ops. Both scans compose plain products
(``0 * inf`` is NaN), where the package's scans cut a zero coefficient off exactly; the benchmark's inputs are finite,
so the numbers agree.

Compiles: the rows dimension is marked dynamic (``torch._dynamo.maybe_mark_dynamic``), so one graph serves every
batch size; the number of doubling steps depends on T, so there is one graph per T and direction (both input dtypes
and all algorithms share it: the coefficients are float32 either way), and a second one for a batch of one row,
which dynamo specialises. ``compile_count()`` reads dynamo's counter of compiled graphs.

``associative_scan``'s signature has changed between PyTorch releases; ``hop_scan_api()`` reads it at run time:
``combine_mode="pointwise"`` (inductor lowers the combine into one Triton scan kernel; CUDA only, and only under
``torch.compile``) on CUDA, ``"generic"`` (a recursive odd-even scan of torch ops) elsewhere; ``reverse=`` when the
signature has it, else the sequence is flipped around the scan.
"""
from __future__ import annotations

import contextlib
import functools
import inspect
import sys

import torch
import torch.nn.functional as F

import rl_triton_torchrl.kernels  # noqa: F401 - every algorithm module, so that swapped_scan finds them
from rl_triton_torchrl.kernels import scan as _scan_module

__all__ = ["IMPLS", "doubling_scan", "hop_scan", "hop_scan_api", "make_scan", "swapped_scan", "compile_count",
           "configure_dynamo"]

_ORIGINAL = _scan_module.torch_linear_scan


def _combine(first, then):
    """Composes two affine steps in scan order: ``first`` applied, then ``then`` (our ``_affine_combine``)."""
    a_1, b_1 = first
    a_2, b_2 = then
    return a_2 * a_1, a_2 * b_1 + b_2


def doubling_scan(a: torch.Tensor, b: torch.Tensor, reverse: bool):
    """Hillis-Steele scan along the last dim of ``[R, T]``: the composites ``(A_t, B_t)`` of every prefix.

    In scan order (``h_t = a_t h_(t-1) + b_t``, or ``h_(t+1)`` if ``reverse``) after step k every element holds the
    composite of the 2^(k+1) steps ending at it; an element fewer than 2^k steps from the sequence edge combines with
    the identity (a = 1, b = 0), which the padding supplies. ``h_t = A_t h_enter + B_t``.
    """
    T = a.shape[-1]
    shift = 1
    while shift < T:
        if reverse:  # the element `shift` later in time comes first in scan order
            a_prev = F.pad(a[..., shift:], (0, shift), value=1.0)
            b_prev = F.pad(b[..., shift:], (0, shift), value=0.0)
        else:
            a_prev = F.pad(a[..., :-shift], (shift, 0), value=1.0)
            b_prev = F.pad(b[..., :-shift], (shift, 0), value=0.0)
        a, b = _combine((a_prev, b_prev), (a, b))
        shift *= 2
    return a, b


@functools.cache
def hop_scan_api(device_type: str) -> dict:
    """How ``torch._higher_order_ops.associative_scan`` is called in this PyTorch on ``device_type``, or why it
    cannot be: ``{"available": bool, "kwargs": {...}, "flip": bool, "note": str}``."""
    try:
        from torch._higher_order_ops import associative_scan
    except ImportError as e:
        return {"available": False, "kwargs": {}, "flip": False, "note": f"not importable: {e}"}
    params = inspect.signature(associative_scan).parameters
    kwargs = {}
    if "combine_mode" in params:
        kwargs["combine_mode"] = "pointwise" if device_type == "cuda" else "generic"
    elif "generic_scan" in params:
        kwargs["generic_scan"] = device_type != "cuda"
    elif device_type != "cuda":
        return {"available": False, "kwargs": {}, "flip": False,
                "note": f"associative_scan{inspect.signature(associative_scan)} has no generic mode for {device_type}"}
    flip = "reverse" not in params
    note = ", ".join([f"{k}={v!r}" for k, v in kwargs.items()] + ["flipped" if flip else "reverse=True"])
    return {"available": True, "kwargs": kwargs, "flip": flip, "note": note}


def hop_scan(device_type: str):
    """The same composites through ``torch._higher_order_ops.associative_scan``, called as this PyTorch on
    ``device_type`` needs (``hop_scan_api``): ``scan(a, b, reverse) -> (A, B)``, for use under torch.compile."""
    from torch._higher_order_ops import associative_scan

    api = hop_scan_api(device_type)
    kwargs, flip = dict(api["kwargs"]), api["flip"]

    def assoc_scan(a: torch.Tensor, b: torch.Tensor, reverse: bool):
        if not reverse:
            return associative_scan(_combine, (a, b), a.dim() - 1, **kwargs)
        if not flip:
            return associative_scan(_combine, (a, b), a.dim() - 1, reverse=True, **kwargs)
        A, B = associative_scan(_combine, (a.flip(-1), b.flip(-1)), a.dim() - 1, **kwargs)
        return A.flip(-1), B.flip(-1)

    return assoc_scan


def _with_state(scan):
    """``(a, b, h0, reverse) -> h``: the scan's composites applied to the entering state, fused into one graph."""

    def fn(a, b, h0, reverse: bool):
        A, B = scan(a, b, reverse)
        return torch.addcmul(B, A, h0[:, None])

    fn.__name__ = f"{scan.__name__}_with_state"
    return fn


IMPLS = ("doubling", "assoc_scan")


def _scan(kind: str, device_type: str):
    return doubling_scan if kind == "doubling" else hop_scan(device_type)


def available(kind: str, device_type: str) -> tuple[bool, str]:
    """Whether the scan ``kind`` can run on ``device_type`` here, and a note saying how (or why not)."""
    if kind == "assoc_scan":
        api = hop_scan_api(device_type)
        return api["available"], api["note"]
    return True, f"{kind} scan"


def make_scan(kind: str, device_type: str, *, backend: str = "inductor", dynamic_rows: bool = True):
    """A drop-in ``torch_linear_scan(a, b, h0=None, reverse=False) -> (h, final state)`` that runs the scan ``kind``
    ("doubling" or "assoc_scan") compiled with ``torch.compile(backend=backend)``.

    ``calls`` counts its calls, so that a caller can check that the swap took effect.
    """
    compiled = torch.compile(_with_state(_scan(kind, device_type)), fullgraph=True, backend=backend,
                             dynamic=None if dynamic_rows else False)

    def torch_linear_scan(a, b, h0=None, reverse=False):
        a, b = (x.contiguous() for x in torch.broadcast_tensors(a, b))
        h0 = torch.zeros_like(b[:, 0]) if h0 is None else h0.to(b.dtype)
        if dynamic_rows:
            for x in (a, b, h0):
                torch._dynamo.maybe_mark_dynamic(x, 0)
        h = compiled(a, b, h0, bool(reverse))
        torch_linear_scan.calls += 1
        return h, h[:, 0] if reverse else h[:, -1]

    torch_linear_scan.calls = 0
    torch_linear_scan.kind = kind
    return torch_linear_scan


@functools.cache
def _modules_with_scan() -> tuple:
    """The package's modules that call ``torch_linear_scan`` by a name of their own (found once)."""
    return tuple(m for name, m in list(sys.modules.items())
                 if name.startswith("rl_triton_torchrl.kernels") and getattr(m, "torch_linear_scan", None) is _ORIGINAL)


@contextlib.contextmanager
def swapped_scan(replacement):
    """Within the block, every algorithm module's torch path calls ``replacement`` instead of ``torch_linear_scan``."""
    modules = _modules_with_scan()
    for m in modules:
        m.torch_linear_scan = replacement
    try:
        yield
    finally:
        for m in modules:
            m.torch_linear_scan = _ORIGINAL


def configure_dynamo() -> None:
    """One graph per T and direction is expected, more than dynamo's default of 8 recompiles per function: raise the
    limit, and fail rather than fall back to eager code silently if it is ever hit."""
    cfg = torch._dynamo.config
    for name, value in (("recompile_limit", 4096), ("cache_size_limit", 4096),
                        ("accumulated_recompile_limit", 1 << 16), ("accumulated_cache_size_limit", 1 << 16),
                        ("fail_on_recompile_limit_hit", True), ("fail_on_cache_limit_hit", True)):
        if hasattr(cfg, name):
            setattr(cfg, name, value)


def compile_count() -> int:
    """Graphs dynamo has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
