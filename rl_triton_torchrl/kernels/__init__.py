"""Triton kernels for RL credit assignment, with a plain-torch path for CPU tensors.

Needs only torch, and triton for the kernels (without it every call takes the torch path). Every function takes
``[*B, T, *F]`` tensors with any ``time_dim`` (default -2, as TorchRL's ``[B, T, 1]``; 2-D inputs must name it:
``-1`` for ``[B, T]``, ``0`` for ``[T, B]``) and a keyword-only ``backend``: ``"auto"`` runs Triton on CUDA tensors and torch elsewhere (``$RL_TRITON_TORCHRL_BACKEND`` overrides
it), ``"triton"`` forces the kernels (on CPU tensors only under ``TRITON_INTERPRET=1``), ``"torch"`` forces torch.
"""
from ._launcher import prewarm
from ._utils import InputError
from .eligibility_traces import eligibility_traces
from .gae import gae
from .normalize import normalize_
from .prefix_sum import episodic_prefix_sum
from .retrace import retrace, retrace_discrete
from .scan import linear_scan
from .td_lambda import discounted_return, td_lambda_advantage, td_lambda_return
from .vtrace import vtrace

__all__ = [
    "InputError",
    "linear_scan",
    "gae",
    "td_lambda_return",
    "td_lambda_advantage",
    "discounted_return",
    "eligibility_traces",
    "episodic_prefix_sum",
    "vtrace",
    "retrace",
    "retrace_discrete",
    "normalize_",
]


def _kernels() -> list:
    """The ``@triton.jit`` kernels of the algorithm files, GAE's first (the scan core's hash is shared)."""
    from importlib import import_module

    names = ("gae", "td_lambda", "vtrace", "prefix_sum", "eligibility_traces", "retrace", "scan", "normalize")
    modules = [import_module(f".{n}", __name__) for n in names]
    return [v for m in modules for k, v in vars(m).items() if k.endswith("_kernel") and hasattr(type(v), "cache_key")]


# Triton's one-time hash of its installation and the kernels' hashes, in the background where kernels will be compiled
prewarm(kernels=_kernels())

