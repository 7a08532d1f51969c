"""Property-based parity (hypothesis): every algorithm, both paths, against the float64 references.

Random shapes (1 to 4 dims), time_dims, memory layouts (contiguous, sliced, permuted/transposed, stride-0 broadcast),
done/terminated/truncated patterns, dtypes, coefficients (numbers or per-step tensors), carried states. CI runs a
bounded number of examples per test; ``HYPOTHESIS_EXAMPLES`` raises it for longer runs (on a GPU the Triton path is
the real kernel):

    HYPOTHESIS_EXAMPLES=500 python -m pytest tests/test_properties.py -q
"""
from __future__ import annotations

import os

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _algos import TABLE, as_tuple, make_rollout, relayout, state_shape
from _helpers import BACKENDS, DEVICE, assert_close
from rl_triton_torchrl import kernels as K
from rl_triton_torchrl.kernels import reference as R

EXAMPLES = int(os.environ.get("HYPOTHESIS_EXAMPLES", "10"))
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck),
                    derandomize=EXAMPLES <= 10)  # CI: the same examples every run (a failure reproduces)
DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
LAYOUTS = ["contig", "sliced", "permuted", "broadcast"]
THRESHOLDS = ("rho_thresh", "c_thresh", "c_bar")  # clipping thresholds: [0, inf); the others lie in [0, 1]


def _shape(draw, max_t):
    ndim = draw(st.integers(1, 4))
    shape = draw(st.lists(st.integers(1, 4), min_size=ndim, max_size=ndim))
    time_dim = draw(st.integers(-ndim, ndim - 1))
    shape[time_dim] = draw(st.integers(1, max_t))
    return tuple(shape), time_dim


@st.composite
def cases(draw, algo):
    """(rollout, keyword arguments) for ``algo``: shape, time_dim, layout, flags, dtype, coefficients, state."""
    shape, time_dim = _shape(draw, 70)
    dtype = draw(st.sampled_from(DTYPES))
    pattern = draw(st.sampled_from(["none", "all", "random", "trunc_last"]))
    x = make_rollout(shape, time_dim, pattern, dtype=dtype, seed=draw(st.integers(0, 2**16)))
    x = relayout(x, draw(st.sampled_from(LAYOUTS)), time_dim)
    _, _, defaults = TABLE[algo]
    kw = {"time_dim": time_dim}
    g = torch.Generator().manual_seed(draw(st.integers(0, 2**16)))
    for name in defaults:
        high = 3.0 if name in THRESHOLDS else 1.0
        if draw(st.booleans()):  # a number, edges included
            kw[name] = draw(st.one_of(st.sampled_from([0.0, high]), st.floats(0.0, high)))
        else:  # a per-step tensor, broadcast over the other dims where it has size 1
            coef_shape = [n if draw(st.booleans()) else 1 for n in shape]
            kw[name] = (high * torch.rand(coef_shape, generator=g, dtype=torch.float64)).to(dtype).to(DEVICE)
    if draw(st.booleans()):
        kw["initial_state"] = torch.randn(state_shape(x, time_dim), generator=g).to(DEVICE)
    return x, kw


def _check(algo, backend, x, kw):
    call, ref, _ = TABLE[algo]
    dtype = x["reward"].dtype
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    out = as_tuple(call(x, backend=backend, output_final_state=True, **kw))
    expected, h_expected = ref(x, **kw)
    expected = as_tuple(expected)
    assert len(out) == len(expected) + 1
    for i, (o, e) in enumerate(zip(out, expected)):
        assert o.dtype == dtype and o.shape == e.shape and o.device == x["reward"].device, f"{algo}[{i}]"
        assert_close(f"{algo}[{i}]", o, e, dtype)
    assert out[-1].dtype == acc
    assert_close(f"{algo} final state", out[-1], h_expected, acc)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(TABLE))
@SETTINGS
@given(data=st.data())
def test_algorithm_property(algo, backend, data):
    x, kw = data.draw(cases(algo))
    _check(algo, backend, x, kw)


@pytest.mark.parametrize("backend", BACKENDS)
@SETTINGS
@given(data=st.data(), reverse=st.booleans())
def test_linear_scan_property(data, reverse, backend):
    shape, time_dim = _shape(data.draw, 70)
    dtype = data.draw(st.sampled_from(DTYPES))
    x = make_rollout(shape, time_dim, data.draw(st.sampled_from(["none", "random"])), dtype=dtype)
    x = relayout(x, data.draw(st.sampled_from(LAYOUTS)), time_dim)
    a = (data.draw(st.floats(0.0, 1.0)) * ~x["done"]).to(dtype)
    h = K.linear_scan(a, x["reward"], reverse=reverse, time_dim=time_dim, backend=backend)
    ref, _ = R.linear_scan_ref(a, x["reward"], reverse=reverse, time_dim=time_dim)
    assert_close("h", h, ref, dtype)
