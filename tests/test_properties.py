"""Property-based parity (hypothesis): random shapes, time_dims, layouts, flag patterns, dtypes and coefficients,
every path against the float64 references. CI runs a bounded number of examples per test."""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _helpers import BACKENDS, DEVICE, assert_close
from rl_triton_torchrl import kernels as K
from rl_triton_torchrl.kernels import reference as R

# HYPOTHESIS_EXAMPLES raises the number of examples per test for longer runs (CI: 15)
SETTINGS = settings(max_examples=int(os.environ.get("HYPOTHESIS_EXAMPLES", "15")), deadline=None, suppress_health_check=[HealthCheck.too_slow])
DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]


@st.composite
def rollouts(draw):
    """A random rollout: shape, time_dim, layout (contiguous or permuted storage), flags and coefficients."""
    ndim = draw(st.integers(1, 4))
    shape = tuple(draw(st.lists(st.integers(1, 5), min_size=ndim, max_size=ndim)))
    time_dim = draw(st.integers(-ndim, ndim - 1))
    shape = list(shape)
    shape[time_dim] = draw(st.integers(1, 70))
    shape = tuple(shape)
    dtype = draw(st.sampled_from(DTYPES))
    seed = draw(st.integers(0, 2**31 - 1))
    p_term = draw(st.sampled_from([0.0, 0.1, 0.5, 1.0]))
    p_trunc = draw(st.sampled_from([0.0, 0.1, 0.5]))
    permuted = draw(st.booleans())
    gamma = draw(st.floats(0.0, 1.0))
    lmbda = draw(st.floats(0.0, 1.0))
    g = torch.Generator().manual_seed(seed)
    term = torch.rand(shape, generator=g) < p_term
    done = term | (torch.rand(shape, generator=g) < p_trunc)

    def lay(t):
        t = t.to(DEVICE)
        if permuted and t.dim() > 1:
            dims = tuple(reversed(range(t.dim())))
            t = t.permute(dims).contiguous().permute(dims)
        return t

    floats = {k: lay(torch.randn(shape, generator=g, dtype=torch.float64).to(dtype))
              for k in ("reward", "value", "next_value", "log_pi", "log_mu")}
    return dict(floats, done=lay(done), terminated=lay(term), time_dim=time_dim, gamma=gamma, lmbda=lmbda,
                dtype=dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@SETTINGS
@given(x=rollouts())
def test_gae_property(x, backend):
    kw = dict(gamma=x["gamma"], lmbda=x["lmbda"], time_dim=x["time_dim"])
    adv, vt = K.gae(x["reward"], x["value"], x["next_value"], x["done"], x["terminated"], backend=backend, **kw)
    adv_ref, vt_ref, _ = R.gae_ref(x["reward"], x["value"], x["next_value"], x["done"], x["terminated"], **kw)
    assert_close("advantage", adv, adv_ref, x["dtype"])
    assert_close("value_target", vt, vt_ref, x["dtype"])


@pytest.mark.parametrize("backend", BACKENDS)
@SETTINGS
@given(x=rollouts())
def test_td_lambda_property(x, backend):
    kw = dict(gamma=x["gamma"], lmbda=x["lmbda"], time_dim=x["time_dim"])
    out = K.td_lambda_return(x["reward"], x["next_value"], x["done"], x["terminated"], backend=backend, **kw)
    ref, _ = R.td_lambda_return_ref(x["reward"], x["next_value"], x["done"], x["terminated"], **kw)
    assert_close("returns", out, ref, x["dtype"])


@pytest.mark.parametrize("backend", BACKENDS)
@SETTINGS
@given(x=rollouts())
def test_vtrace_property(x, backend):
    kw = dict(gamma=x["gamma"], time_dim=x["time_dim"])
    args = (x["log_pi"], x["log_mu"], x["value"], x["next_value"], x["reward"], x["done"], x["terminated"])
    adv, vs = K.vtrace(*args, backend=backend, **kw)
    adv_ref, vs_ref, _ = R.vtrace_ref(*args, **kw)
    assert_close("advantage", adv, adv_ref, x["dtype"])
    assert_close("vs", vs, vs_ref, x["dtype"])


@pytest.mark.parametrize("backend", BACKENDS)
@SETTINGS
@given(x=rollouts(), reset=st.sampled_from(["after_done", "at_start"]))
def test_prefix_sum_property(x, reset, backend):
    kw = dict(reset=reset, discount=x["gamma"], time_dim=x["time_dim"])
    out = K.episodic_prefix_sum(x["reward"], x["done"], backend=backend, **kw)
    ref, _ = R.episodic_prefix_sum_ref(x["reward"], x["done"], **kw)
    # sums of up to 70 terms: tolerance scaled by the episode length for half precision
    assert_close("sums", out, ref, x["dtype"]) if x["dtype"] in (torch.float64, torch.float32) else \
        torch.testing.assert_close(out.double().cpu(), ref.double().cpu(), rtol=3e-2, atol=0.3)


@pytest.mark.parametrize("backend", BACKENDS)
@SETTINGS
@given(x=rollouts(), reverse=st.booleans())
def test_linear_scan_property(x, reverse, backend):
    a = (x["gamma"] * (~x["done"])).to(x["dtype"])
    h = K.linear_scan(a, x["reward"], reverse=reverse, time_dim=x["time_dim"], backend=backend)
    ref, _ = R.linear_scan_ref(a, x["reward"], reverse=reverse, time_dim=x["time_dim"])
    assert_close("h", h, ref, x["dtype"])
