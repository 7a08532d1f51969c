"""Gradients: the scan's backward (the same scan run the other way) chained through every algorithm's coefficients.

With an input that requires grad, backend="triton" builds the coefficients with torch ops and runs the scan, forward
and backward, on the Triton scan kernel (a custom op); backend="torch" differentiates the torch path. Both are checked
with ``torch.autograd.gradcheck`` in float64 for every algorithm and every input that can need a gradient, and
against TorchRL's loop functionals.
"""
from __future__ import annotations

import warnings

import pytest
import torch
import torchrl.objectives.value.functional as trl

from _helpers import BACKENDS, DEVICE, assert_close, flags, randn
import rl_triton_torchrl.functional as ours
from rl_triton_torchrl import kernels as K
from rl_triton_torchrl.kernels import reference as R
from rl_triton_torchrl.kernels import scan

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
        with warnings.catch_warnings():
            if name == "ours":
                # no fallback warning of ours: the requested path runs (Triton's own warnings, such as 3.9's about
                # its FP-fusion default on the first compilation, are not ours)
                warnings.filterwarnings("error", category=UserWarning, module="rl_triton_torchrl")
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


@pytest.mark.triton
def test_no_grad_keeps_the_fused_kernel(monkeypatch):
    """Under no_grad nothing needs a gradient: the fused kernel runs, not the scan op."""
    def fail(*args, **kwargs):
        raise AssertionError("the scan op ran")

    monkeypatch.setattr(scan, "_scan_op", fail)
    x = torch.randn(2, 5, 1, device=DEVICE, requires_grad=True)
    d = torch.zeros(2, 5, 1, dtype=torch.bool, device=DEVICE)
    with torch.no_grad():
        ours.generalized_advantage_estimate(0.9, 0.9, x, x, x, d, backend="triton")
    with pytest.raises(AssertionError, match="the scan op ran"):
        ours.generalized_advantage_estimate(0.9, 0.9, x, x, x, d, backend="triton")


# ---------------------------------------------------------------------------------------------------------------
# gradcheck: float64, every algorithm, every differentiable input (values, rewards, log-probabilities, Q values,
# tensor gamma/lambda/thresholds, carried states), with done/terminated flags inside and at the edges of tiles; the
# rows cross chunks (``grad_tiles``). Float64 never takes the look-back mode (its status words hold
# float32): there the float32 gradients are compared with autograd through the float64 references instead.
# ---------------------------------------------------------------------------------------------------------------

SHAPE = (2, 10, 1)


@pytest.fixture
def grad_tiles(monkeypatch):
    """Tiles of 4 steps: 10 steps are two full tiles and a partial one (the torch path's own chunks are 2 steps at
    T = 10). Small, as gradcheck calls the function twice per element (the interpreter runs every chunk of every
    program one after another: both rows share one program)."""
    monkeypatch.setattr(scan, "MAX_BLOCK_T", 4)
    monkeypatch.setattr(scan, "TILE_ELEMENTS", 8)
    monkeypatch.setattr(scan, "WIDE_MAX_ROWS", 0)  # row tiles, not one wide tile per row
    yield


def _rollout(seed=0, shape=SHAPE, dtype=torch.float64):
    gen = torch.Generator().manual_seed(seed)
    done, term = flags(shape, "random", gen)
    done[0, 3], term[0, 3] = True, False  # a truncation and a termination in every case
    done[1, 2], term[1, 2] = True, True
    if shape[1] > 8:  # a truncation at the last step of a tile (of 4 and of 8), a termination at the first
        done[0, 7], term[0, 7] = True, False
        done[1, 4], term[1, 4] = True, True
    f = {k: randn(shape, gen, dtype) for k in ("r", "v", "nv", "lpi", "lmu", "x")}
    f["gamma"] = (0.8 + 0.15 * torch.rand(shape, generator=gen, dtype=torch.float64)).to(dtype).to(DEVICE)
    f["lmbda"] = (0.5 + 0.4 * torch.rand(shape, generator=gen, dtype=torch.float64)).to(dtype).to(DEVICE)
    f["h0"] = randn(shape[:1] + shape[2:], gen, dtype)
    return f, done, term


# name -> (function of the differentiable tensors (in order), their names)
GRAD_CASES = {
    "linear_scan": (lambda f, d, t, **kw: K.linear_scan(f["lmbda"], f["x"], reverse=True, initial_state=f["h0"],
                                                         output_final_state=True, **kw),
                    ("lmbda", "x", "h0")),
    "linear_scan_fwd": (lambda f, d, t, **kw: K.linear_scan(f["lmbda"], f["x"], initial_state=f["h0"],
                                                             output_final_state=True, **kw),
                        ("lmbda", "x", "h0")),
    "gae": (lambda f, d, t, **kw: K.gae(f["r"], f["v"], f["nv"], d, t, gamma=f["gamma"], lmbda=f["lmbda"],
                                        initial_state=f["h0"], output_final_state=True, **kw),
            ("r", "v", "nv", "gamma", "lmbda", "h0")),
    "td_lambda": (lambda f, d, t, **kw: K.td_lambda_advantage(f["r"], f["v"], f["nv"], d, t, gamma=f["gamma"],
                                                              lmbda=f["lmbda"], **kw),
                  ("r", "v", "nv", "gamma", "lmbda")),
    "td_lambda_state": (lambda f, d, t, **kw: K.td_lambda_return(f["r"], f["nv"], d, t, gamma=f["gamma"], lmbda=0.9,
                                                                 initial_state=f["h0"], output_final_state=True,
                                                                 **kw),
                        ("r", "nv", "gamma", "h0")),
    "discounted": (lambda f, d, t, **kw: K.discounted_return(f["r"], d, gamma=f["gamma"], **kw), ("r", "gamma")),
    "vtrace": (lambda f, d, t, **kw: K.vtrace(f["lpi"], f["lmu"], f["v"], f["nv"], f["r"], d, t, gamma=f["gamma"],
                                              rho_thresh=1.0, c_thresh=1.0, initial_state=f["h0"],
                                              output_final_state=True, **kw),
               ("lpi", "lmu", "v", "nv", "r", "gamma", "h0")),
    "retrace": (lambda f, d, t, **kw: K.retrace(f["v"], f["nv"], f["r"], d, t, log_ratio=f["lpi"], gamma=f["gamma"],
                                                lmbda=f["lmbda"], c_bar=1.0, initial_state=f["h0"],
                                                output_final_state=True, **kw),
                ("v", "nv", "r", "lpi", "gamma", "lmbda", "h0")),
    "prefix_sum": (lambda f, d, t, **kw: K.episodic_prefix_sum(f["x"], d, reset="after_done", discount=f["gamma"],
                                                               initial_state=f["h0"], output_final_state=True,
                                                               **kw),
                   ("x", "gamma", "h0")),
    "traces": (lambda f, d, t, **kw: K.eligibility_traces(f["x"], d, gamma=f["gamma"], lmbda=f["lmbda"], **kw),
               ("x", "gamma", "lmbda")),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(GRAD_CASES))
def test_gradcheck(algo, backend, grad_tiles):
    """Analytical gradients (the backward scan) against finite differences; the tiles make the rows cross chunks,
    so the backward's carries between chunks are exercised too."""
    cfg = scan.launch_config(scan._rows_layout(torch.empty(SHAPE[:2])))
    assert (cfg["grid"], cfg["BLOCK_T"], cfg["LOOKBACK"]) == ((1,), 4, 0), cfg
    fn, names = GRAD_CASES[algo]
    f, done, term = _rollout()
    leaves = [f[k].clone().requires_grad_() for k in names]

    def call(*xs):
        g = dict(f, **dict(zip(names, xs)))
        out = fn(g, done, term, backend=backend)
        return out if isinstance(out, tuple) else (out,)

    assert torch.autograd.gradcheck(call, leaves, eps=1e-6, atol=1e-7, rtol=1e-5)


# name -> the float64 reference of GRAD_CASES[name]: the same outputs, from the same tensors
GRAD_REFS = {
    "linear_scan": lambda f, d, t: R.linear_scan_ref(f["lmbda"], f["x"], reverse=True, initial_state=f["h0"]),
    "linear_scan_fwd": lambda f, d, t: R.linear_scan_ref(f["lmbda"], f["x"], initial_state=f["h0"]),
    "gae": lambda f, d, t: R.gae_ref(f["r"], f["v"], f["nv"], d, t, gamma=f["gamma"], lmbda=f["lmbda"],
                                     initial_state=f["h0"]),
    "td_lambda": lambda f, d, t: (R.td_lambda_return_ref(f["r"], f["nv"], d, t, gamma=f["gamma"],
                                                         lmbda=f["lmbda"])[0] - f["v"].double(),),
    "td_lambda_state": lambda f, d, t: R.td_lambda_return_ref(f["r"], f["nv"], d, t, gamma=f["gamma"], lmbda=0.9,
                                                              initial_state=f["h0"]),
    "discounted": lambda f, d, t: (R.discounted_return_ref(f["r"], d, gamma=f["gamma"]),),
    "vtrace": lambda f, d, t: R.vtrace_ref(f["lpi"], f["lmu"], f["v"], f["nv"], f["r"], d, t, gamma=f["gamma"],
                                           rho_thresh=1.0, c_thresh=1.0, initial_state=f["h0"]),
    "retrace": lambda f, d, t: R.retrace_ref(f["v"], f["nv"], f["r"], d, t, log_ratio=f["lpi"], gamma=f["gamma"],
                                             lmbda=f["lmbda"], c_bar=1.0, initial_state=f["h0"]),
    "prefix_sum": lambda f, d, t: R.episodic_prefix_sum_ref(f["x"], d, reset="after_done", discount=f["gamma"],
                                                            initial_state=f["h0"]),
    "traces": lambda f, d, t: R.eligibility_traces_ref(f["x"], d, gamma=f["gamma"], lmbda=f["lmbda"])[:1],
}


@pytest.fixture
def lookback_chunks(monkeypatch):
    """Every scan in look-back mode, in chunks of 16 steps (three per 40-step row), only every third chunk
    publishing its leaving state (the look-back composes aggregates across windows of two: see test_launch_modes)."""
    monkeypatch.setattr(scan, "LOOKBACK_MIN_T", 0)
    monkeypatch.setattr(scan, "LOOKBACK_MAX_ROWS", 10**9)
    monkeypatch.setattr(scan, "LOOKBACK_BLOCK_T", 16)
    monkeypatch.setattr(scan, "LOOKBACK_SEGMENTED", frozenset())
    monkeypatch.setattr(scan, "LOOKBACK_WINDOW", -2)
    yield


@pytest.mark.triton
@pytest.mark.parametrize("algo", list(GRAD_CASES))
def test_gradients_in_lookback_mode(algo, lookback_chunks):
    """The scan op in look-back mode, forward and backward (the backward of a reverse scan is a forward one):
    float32 gradients of every differentiable input against autograd through the float64 reference."""
    fn, names = GRAD_CASES[algo]
    shape = (2, 40, 1)
    assert scan.launch_config(scan._rows_layout(torch.empty(shape[:2])))["LOOKBACK"] == -2
    f, done, term = _rollout(2, shape, torch.float32)
    gen = torch.Generator().manual_seed(5)
    grads = {}
    for name, dtype in (("ours", torch.float32), ("reference", torch.float64)):
        leaves = {k: f[k].to(dtype).clone().requires_grad_() for k in names}
        g = dict(f, **leaves)
        out = fn(g, done, term, backend="triton") if name == "ours" else GRAD_REFS[algo](g, done, term)
        out = out if isinstance(out, tuple) else (out,)
        if name == "ours":
            weights = [torch.randn(o.shape, generator=gen, dtype=torch.float64).to(DEVICE) for o in out]
        sum((o.double() * w).sum() for o, w in zip(out, weights)).backward()
        grads[name] = {k: leaves[k].grad for k in names}
    for k in names:
        assert_close(f"{algo} d/d{k}", grads["ours"][k], grads["reference"][k], torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
def test_second_order(backend):
    """The backward is built from the same differentiable op, so gradients of gradients exist and are right."""
    f, done, term = _rollout(1, (2, 7, 1))
    leaves = [f[k].clone().requires_grad_() for k in ("r", "v", "lmbda")]

    def call(r, v, lmbda):
        return K.gae(r, v, f["nv"], done, term, gamma=0.9, lmbda=lmbda, backend=backend)[0]

    assert torch.autograd.gradgradcheck(call, leaves, eps=1e-6, atol=1e-6, rtol=1e-4)


@pytest.mark.parametrize("backend", BACKENDS)
def test_dreamer_style_lambda_return_loss(backend):
    """An actor loss that backpropagates through lambda-returns of predicted values and rewards (DreamerV3): the
    same gradients as through TorchRL's loop ``td_lambda_return_estimate``."""
    gen = torch.Generator().manual_seed(3)
    shape = (4, 15, 1)
    reward, value = randn(shape, gen, torch.float64), randn(shape, gen, torch.float64)
    done = torch.zeros(shape, dtype=torch.bool, device=DEVICE)
    done[:, -1] = True
    grads = {}
    for name, fn in (("ours", lambda *a: ours.td_lambda_return_estimate(*a, backend=backend)),
                     ("torchrl", trl.td_lambda_return_estimate)):
        r, v = reward.clone().requires_grad_(), value.clone().requires_grad_()
        ret = fn(0.99, 0.95, v, r, done, done)
        (-(ret * torch.linspace(0.1, 1, 15, dtype=torch.float64, device=DEVICE)[:, None])).sum().backward()
        grads[name] = (r.grad, v.grad)
    for i, (a, b) in enumerate(zip(*grads.values())):
        assert_close(f"grad {i}", a, b)
