"""The scan core on its own: h_t = a_t h_(t-/+1) + b_t for given coefficients, both directions, both paths."""
from __future__ import annotations

import pytest
import torch

from _helpers import BACKENDS, DEVICE, assert_close, case_id
from rl_triton_torchrl.kernels import linear_scan
from rl_triton_torchrl.kernels.reference import linear_scan_ref
from rl_triton_torchrl.kernels.scan import torch_linear_scan
from test_algorithms import _relayout

CASES = [
    ((3, 1, 1), -2, "contig"),
    ((3, 63, 2), -2, "contig"),
    ((1000,), 0, "contig"),
    ((40, 5, 1), 0, "contig"),
    ((2, 3, 45), -1, "permuted"),
    ((3, 40, 2), 1, "sliced"),
    ((2, 29, 3, 4), 1, "broadcast"),
]


def _coefs(shape, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    # a in [0, 1) with exact zeros (episode resets) sprinkled in
    a = torch.rand(shape, generator=g, dtype=torch.float64)
    a = torch.where(torch.rand(shape, generator=g) < 0.1, 0.0, a)
    b = torch.randn(shape, generator=g, dtype=torch.float64)
    return a.to(dtype).to(DEVICE), b.to(dtype).to(DEVICE)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
@pytest.mark.parametrize("shape,time_dim,layout", CASES, ids=[case_id(s, t, extra=lay) for s, t, lay in CASES])
def test_linear_scan(shape, time_dim, layout, reverse, backend):
    a, b = (_relayout(x, layout, time_dim) for x in _coefs(shape))
    state_shape = list(shape)
    del state_shape[time_dim]
    h0 = torch.randn(state_shape, device=DEVICE)
    h, ht = linear_scan(a, b, reverse=reverse, time_dim=time_dim, initial_state=h0, output_final_state=True,
                        backend=backend)
    h_ref, ht_ref = linear_scan_ref(a, b, reverse=reverse, time_dim=time_dim, initial_state=h0)
    assert_close("h", h, h_ref)
    assert_close("final state", ht, ht_ref)
    h_zero = linear_scan(a, b, reverse=reverse, time_dim=time_dim, backend=backend)
    assert_close("h (zero state)", h_zero, linear_scan_ref(a, b, reverse=reverse, time_dim=time_dim)[0])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_linear_scan_dtypes(dtype, backend):
    a, b = _coefs((4, 100, 1), dtype)
    h = linear_scan(a, b, reverse=True, backend=backend)
    assert h.dtype == dtype
    assert_close("h", h, linear_scan_ref(a, b, reverse=True)[0], dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_linear_scan_chunks(reverse, backend, small_tiles):
    a, b = _coefs((5, 130, 1))
    h, ht = linear_scan(a, b, reverse=reverse, output_final_state=True, backend=backend)
    h_ref, ht_ref = linear_scan_ref(a, b, reverse=reverse)
    assert_close("h", h, h_ref)
    assert_close("final state", ht, ht_ref)


@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 15, 16, 17, 99, 100, 101])
def test_torch_scan_every_chunking(T):
    """The two-level torch scan for lengths around its sqrt(T) chunk boundaries."""
    a, b = _coefs((3, T), torch.float64)
    for reverse in (False, True):
        h0 = torch.randn(3, dtype=torch.float64)
        h, ht = torch_linear_scan(a.cpu(), b.cpu(), h0, reverse)
        h_ref, ht_ref = linear_scan_ref(a.cpu(), b.cpu(), reverse=reverse, time_dim=-1, initial_state=h0)
        assert_close("h", h, h_ref)
        assert_close("final", ht, ht_ref)


def test_torch_scan_leaves_inputs_alone():
    a, b = _coefs((2, 1, 9), torch.float64)
    a0, b0 = a.clone(), b.clone()
    linear_scan(a, b, time_dim=-1, backend="torch")
    linear_scan(a[:, :, :1], b[:, :, :1], time_dim=-1, backend="torch")
    assert torch.equal(a, a0) and torch.equal(b, b0)
