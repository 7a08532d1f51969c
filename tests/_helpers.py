"""Shared test utilities: random rollouts, tolerances, and comparisons that name the first mismatch."""
from __future__ import annotations

import contextlib

import torch

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
BACKENDS = ("torch", "triton")
# (rtol, atol) of a fast path against the float64 reference, by input dtype. Half-precision outputs are rounded
# to their dtype, so they carry its epsilon; accumulation is always float32 or better.
TOL = {
    torch.float64: (1e-10, 1e-10),
    torch.float32: (1e-5, 1e-4),
    torch.bfloat16: (1.6e-2, 1.6e-2),
    torch.float16: (2e-3, 2e-3),
}
PATTERNS = ("none", "all", "random", "trunc_last")


def assert_close(name: str, actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None):
    """Asserts |actual - expected| <= atol + rtol |expected| elementwise; NaN never passes unless expected."""
    dtype = dtype or actual.dtype
    rtol, atol = TOL[dtype]
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    bad = ~((a - e).abs() <= atol + rtol * e.abs())
    bad &= ~(a.isnan() & e.isnan())
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise AssertionError(
            f"{name}: {int(bad.sum())} of {bad.numel()} elements differ; first at {idx}: got {a[idx].item()!r}, "
            f"expected {e[idx].item()!r} (rtol={rtol}, atol={atol})"
        )


def flags(shape, pattern: str, generator: torch.Generator, time_dim: int = -2):
    """(done, terminated) bool tensors: every done is terminated or truncated.

    none: no flags; all: every step done (half terminated); random: ~10% terminated, ~10% truncated;
    trunc_last: random, plus a truncation at the last step of every row.
    """
    if pattern == "none":
        term = torch.zeros(shape, dtype=torch.bool)
        trunc = torch.zeros(shape, dtype=torch.bool)
    elif pattern == "all":
        term = torch.rand(shape, generator=generator) < 0.5
        trunc = ~term
    else:
        term = torch.rand(shape, generator=generator) < 0.1
        trunc = (torch.rand(shape, generator=generator) < 0.1) & ~term
        if pattern == "trunc_last":
            last = [slice(None)] * len(shape)
            last[time_dim] = -1
            term[tuple(last)] = False
            trunc[tuple(last)] = True
    return (term | trunc).to(DEVICE), term.to(DEVICE)


def randn(shape, generator, dtype=torch.float32):
    return torch.randn(shape, generator=generator, dtype=torch.float64).to(dtype).to(DEVICE)


def case_id(shape, time_dim, pattern="", extra=""):
    s = "x".join(map(str, shape)) if shape else "scalar"
    parts = [f"S{s}", f"tdim{time_dim}"] + [p for p in (pattern, extra) if p]
    return "-".join(parts)


def windows(t: torch.Tensor, W: int) -> torch.Tensor:
    """A ``[B, T, *rest]`` tensor (time in dim 1, T a multiple of W) as ``[B * T // W, W, *rest]``: each run of W
    consecutive steps of a row becomes a row of its own."""
    return t.reshape(t.shape[0] * (t.shape[1] // W), W, *t.shape[2:])


def window_states(state: torch.Tensor, h0: torch.Tensor, W: int, reverse: bool) -> torch.Tensor:
    """The state entering each row of ``windows(., W)``, for a reference run on the windows.

    ``state`` ``[B, T, *rest]`` holds per step t the state step t passes on (reverse scans: to step t - 1; forward
    ones: to t + 1), taken from the outputs under test; the window at the end of a sequence (reverse) or at its start
    (forward) enters with the sequence's own ``h0`` ``[B, *rest]``. A reference run on windows that enter with these
    states checks every window of the outputs against the recurrence, each from the outputs' value at its edge: an
    oracle for sequences too long for a float64 loop over all their steps (the windows run as rows, at once).
    """
    if reverse:  # window k enters with the state of step (k + 1) W, the first of the window after it
        s = torch.cat([state[:, W::W], h0[:, None]], 1)
    else:  # window k enters with the state leaving step k W - 1, the last of the window before it
        s = torch.cat([h0[:, None], state[:, W - 1:-1:W]], 1)
    return s.reshape(-1, *s.shape[2:])


@contextlib.contextmanager
def kernel_global(module, name: str, value, kernel):
    """``module.name`` (a ``tl.constexpr`` switch that ``kernel`` reads, such as ``vtrace.RELOAD_NARROW``) set to
    ``value`` inside the block, with ``kernel`` compiled afresh as it is set and again as it is restored.

    Triton hashes a kernel's constexpr globals once, at its first compile, and refuses a later launch after one has
    changed ("Global variable ... has changed since we compiled this kernel"), while the interpreter reads them at
    each call. So every compiled copy is forgotten at both changes: Triton's (the hash and the per-device caches of
    the ``JITFunction``), our launcher's, and the launch plans (a new epoch of ``scan``'s launch constants)."""
    from rl_triton_torchrl.kernels import _launcher, scan

    def forget():
        if hasattr(kernel, "device_caches"):  # compiled (not the interpreter)
            kernel.hash = None
            kernel.device_caches.clear()
            _launcher.launcher(kernel).compiled.clear()
        scan.MAX_BLOCK_T = scan.MAX_BLOCK_T  # a new epoch: no plan replays a copy compiled before

    old = getattr(module, name)
    setattr(module, name, value)
    forget()
    try:
        yield
    finally:
        setattr(module, name, old)
        forget()
