"""Gradients flow through our estimators exactly as through TorchRL's loop functionals.

The Triton kernels have no backward yet: with an input that requires grad, backend="triton" warns and runs the
differentiable torch path. These tests pin both facts.
"""
from __future__ import annotations

import pytest
import torch
import torchrl.objectives.value.functional as trl

from _helpers import BACKENDS, DEVICE, assert_close, flags, randn
import rl_triton_torchrl.functional as ours

CASES = {
    "gae": (lambda m, x, g, lm: m.generalized_advantage_estimate(g, lm, x["v"], x["nv"], x["r"], x["d"], x["t"])),
    "td_lambda": (lambda m, x, g, lm: m.td_lambda_advantage_estimate(g, lm, x["v"], x["nv"], x["r"], x["d"],
                                                                      x["t"])),
    "td1": (lambda m, x, g, lm: m.td1_return_estimate(g, x["nv"], x["r"], x["d"], x["t"])),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(CASES))
def test_gradients_match_torchrl(algo, backend):
    gen = torch.Generator().manual_seed(0)
    shape = (3, 37, 2)
    done, term = flags(shape, "random", gen)
    base = {k: randn(shape, gen, torch.float64) for k in ("r", "v", "nv")}
    gamma = (0.9 + 0.1 * torch.rand(shape, generator=gen, dtype=torch.float64)).to(DEVICE)
    weights = randn(shape, gen, torch.float64)
    grads = {}
    for name, module in (("ours", _Backend(ours, backend)), ("torchrl", trl)):
        x = {k: v.clone().requires_grad_() for k, v in base.items()} | {"d": done, "t": term}
        g = gamma.clone().requires_grad_()
        if name == "ours" and backend == "triton":
            with pytest.warns(UserWarning, match="no backward yet"):
                out = CASES[algo](module, x, g, 0.9)
        else:
            out = CASES[algo](module, x, g, 0.9)
        out = out if isinstance(out, tuple) else (out,)
        sum((o * weights).sum() for o in out).backward()
        grads[name] = {k: x[k].grad for k in ("r", "v", "nv")} | {"gamma": g.grad}
    for k, expected in grads["torchrl"].items():
        if expected is None:
            assert grads["ours"][k] is None or not grads["ours"][k].any(), k
        else:
            assert_close(f"d/d{k}", grads["ours"][k], expected)


class _Backend:
    """The functional module with ``backend=`` bound."""

    def __init__(self, module, backend):
        self.module, self.backend = module, backend

    def __getattr__(self, name):
        fn = getattr(self.module, name)
        return lambda *args, **kwargs: fn(*args, backend=self.backend, **kwargs)


def test_no_grad_keeps_triton():
    """Under no_grad nothing needs a gradient: the requested path runs, without a warning."""
    import warnings

    x = torch.randn(2, 5, 1, device=DEVICE, requires_grad=True)
    d = torch.zeros(2, 5, 1, dtype=torch.bool, device=DEVICE)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        ours.generalized_advantage_estimate(0.9, 0.9, x, x, x, d, backend="triton")
