"""Determinism: repeated calls on the same inputs give identical bits, every algorithm, both paths, every device.

On the CPU the Triton path runs through the interpreter with tiny tiles (many programs, many chunks); on CUDA the
real kernels run with the default tiles on a rollout long enough to cross several chunks. A call on a fresh copy of
the inputs (other addresses) must give the same bits too.
"""
from __future__ import annotations

import os

import pytest
import torch

from _algos import TABLE, as_tuple, make_rollout, state_shape

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")),
]
INT_OF_SIZE = {2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().view(INT_OF_SIZE[t.element_size()]).cpu()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("algo", list(TABLE))
def test_identical_bits(algo, backend, device, request):
    if device == "cpu" and backend == "triton":
        if os.environ.get("TRITON_INTERPRET") != "1":
            pytest.skip("Triton on CPU tensors needs TRITON_INTERPRET=1 (set by conftest only without a GPU)")
        request.getfixturevalue("small_tiles")
    shape = (3, 40, 1) if device == "cpu" else (64, 3000, 2)
    call, _, coefs = TABLE[algo]
    x = {k: v.to(device) for k, v in make_rollout(shape, -2, "random", seed=7).items()}
    kw = {**coefs, "initial_state": torch.randn(state_shape(x, -2)).to(device), "output_final_state": True}
    first = [_bits(o) for o in as_tuple(call(x, backend=backend, **kw))]
    for inputs in (x, {k: v.clone() for k, v in x.items()}):
        again = [_bits(o) for o in as_tuple(call(inputs, backend=backend, **kw))]
        for i, (a, b) in enumerate(zip(first, again)):
            assert torch.equal(a, b), f"{algo}[{i}]: {int((a != b).sum())} elements changed bits between calls"
