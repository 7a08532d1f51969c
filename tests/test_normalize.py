"""kernels.normalize_ (rsl_rl's batch standardisation of advantages) against its float64 reference."""
from __future__ import annotations

import contextlib

import pytest
import torch

from _helpers import BACKENDS, DEVICE, assert_close
from rl_triton_torchrl.kernels import InputError, normalize_
from rl_triton_torchrl.kernels.normalize import BLOCK, MAX_CHUNKS, chunking
from rl_triton_torchrl.kernels.reference import normalize_ref

# sizes around the block and chunk boundaries, rsl_rl's 24 x 4096 rollout, and one with more than one block per chunk
SIZES = [(2,), (3,), (1023,), (1024,), (1025,), (24, 4096, 1), (7, 63, 5), (BLOCK * 600 + 17,)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape", SIZES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16], ids=str)
def test_matches_reference(backend, shape, dtype):
    g = torch.Generator().manual_seed(hash((shape, str(dtype))) % 2**31)
    # a mean far from zero and a small spread: the moments must not cancel
    x = (3.0 + 0.01 * torch.randn(shape, generator=g, dtype=torch.float64)).to(dtype).to(DEVICE)
    expected = normalize_ref(x)
    y = x.clone()
    out = normalize_(y, backend=backend)
    assert out is y
    # the quotient is ~(x - mean) / std: its error is the input's rounding divided by the spread
    assert_close("normalize_", y, expected.to(y.dtype).to(y.device), dtype)


@pytest.mark.parametrize("backend", BACKENDS)
def test_constant_and_single_element(backend):
    x = torch.full((5000,), 2.5, device=DEVICE)
    assert torch.equal(normalize_(x, backend=backend), torch.zeros_like(x))  # std 0: (x - mean) / eps = 0
    one = torch.ones(1, device=DEVICE)
    with pytest.warns(UserWarning) if backend == "torch" else contextlib.nullcontext():
        normalize_(one, backend=backend)
    assert one.isnan().all()  # Bessel's correction over one element, as torch's std


@pytest.mark.parametrize("backend", BACKENDS)
def test_eps(backend):
    x = torch.tensor([0.0, 1.0], device=DEVICE)
    expected = normalize_ref(x, eps=0.5)
    assert_close("normalize_ eps", normalize_(x.clone(), 0.5, backend=backend), expected.float().to(DEVICE))


def test_non_contiguous_takes_torch_path():
    x = torch.randn(8, 300, device=DEVICE).t()
    expected = normalize_ref(x)
    assert_close("normalize_ non-contiguous", normalize_(x), expected.float().to(DEVICE))


@pytest.mark.triton
def test_non_contiguous_refused_by_the_kernel():
    with pytest.raises(InputError, match="contiguous"):
        normalize_(torch.randn(8, 300, device=DEVICE).t(), backend="triton")


def test_empty_and_errors():
    empty = torch.empty(0, 3, device=DEVICE)
    assert normalize_(empty) is empty
    with pytest.raises(TypeError, match="floating-point"):
        normalize_(torch.arange(4, device=DEVICE))
    with pytest.raises(TypeError, match="floating-point"):
        normalize_([1.0, 2.0])


@pytest.mark.parametrize("n", [1, 1024, 1025, 98304, 2**20 + 5, 2**31 + 7, 2**40])
def test_chunking(n):
    chunk_len, n_chunks = chunking(n)
    assert chunk_len % BLOCK == 0 and 1 <= n_chunks <= MAX_CHUNKS
    assert (n_chunks - 1) * chunk_len < n <= n_chunks * chunk_len  # every chunk holds an element

