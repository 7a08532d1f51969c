"""Runs the Triton kernels through Triton's interpreter when there is no GPU.

TRITON_INTERPRET must be set before triton is imported (torchrl imports it), hence here, first.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from rl_triton_torchrl.kernels import scan  # noqa: E402


@pytest.fixture(autouse=True)
def _poison_outputs(monkeypatch):
    """Every output starts as NaN, so an element a kernel fails to write fails the comparison."""
    monkeypatch.setattr(scan, "POISON_OUTPUTS", True)
    yield


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiny tiles, so that short sequences already walk the multi-chunk and multi-program paths."""
    monkeypatch.setattr(scan, "MAX_BLOCK_T", 16)
    monkeypatch.setattr(scan, "WIDE_MAX_ROWS", 0)  # row tiles of several rows, not one wide tile per row
    monkeypatch.setattr(scan, "TILE_ELEMENTS", 32)
    yield
