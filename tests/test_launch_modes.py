"""The launch modes beyond whole-sequence tiles, against the float64 references.

The single-pass mode for long sequences in few rows: one program per chunk, the state entering a chunk found by a
decoupled look-back over its predecessors (``scan.chain_state``). On the CPU (Triton's interpreter) the programs run
one after another, so tiny chunks and windows are forced and the testing window (negative: only every third chunk
publishes its leaving state) makes the look-back compose aggregates across several windows. On a GPU the chunks of
a row run concurrently, at the default sizes. And the narrow tiles of short sequences in many rows.
"""
from __future__ import annotations

import os

import pytest
import torch

from _algos import TABLE, as_tuple, make_rollout, state_shape
from _helpers import DEVICE, assert_close
from rl_triton_torchrl.kernels import scan

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                                reason="needs a CUDA device or Triton's interpreter")


@pytest.fixture(params=[32, -2], ids=["window32", "sparse-window2"])
def tiny_chunks(monkeypatch, request):
    """Every sequence in look-back mode, in chunks of 16 steps."""
    monkeypatch.setattr(scan, "LOOKBACK_MIN_T", 0)
    monkeypatch.setattr(scan, "LOOKBACK_MAX_ROWS", 10**9)
    monkeypatch.setattr(scan, "LOOKBACK_BLOCK_T", 16)
    monkeypatch.setattr(scan, "LOOKBACK_WINDOW", request.param)
    yield request.param


def _compare(algo, shape, pattern, seed, with_state):
    call, ref, coefs = TABLE[algo]
    x = {k: (v.to(DEVICE) if isinstance(v, torch.Tensor) else v)
         for k, v in make_rollout(shape, -2, pattern, seed=seed).items()}
    kw = dict(coefs)
    if with_state:
        kw["initial_state"] = torch.randn(state_shape(x, -2)).to(DEVICE)
    out = as_tuple(call(x, backend="triton", output_final_state=with_state, **kw))
    expected, h_expected = ref(x, **kw)
    expected = as_tuple(expected) + ((h_expected,) if with_state else ())
    assert len(out) == len(expected), algo
    for i, (o, e) in enumerate(zip(out, expected)):
        assert_close(f"{algo}[{i}]", o, e, torch.float32)


@pytest.mark.parametrize("with_state", [False, True], ids=["no-state", "state"])
@pytest.mark.parametrize("T", [3, 70])
@pytest.mark.parametrize("algo", list(TABLE))
def test_lookback_matches_reference(algo, T, with_state, tiny_chunks):
    assert scan.launch_config(_layout((2, T, 1)))["LOOKBACK"] == tiny_chunks
    _compare(algo, (2, T, 1), "random", seed=T, with_state=with_state)


@pytest.mark.parametrize("pattern", ["none", "all"])
def test_lookback_flag_patterns(pattern, tiny_chunks):
    for algo in ("gae", "vtrace", "retrace", "sum_after_done"):
        _compare(algo, (3, 50, 1), pattern, seed=1, with_state=True)


def test_deterministic_algorithms_turn_lookback_off(tiny_chunks):
    """The entering state of a chunk is composed from whichever predecessors have published (the rounding may differ
    in the last bits between calls); ``torch.use_deterministic_algorithms(True)`` selects the per-row kernels."""
    layout = _layout((2, 100, 1))
    prev = torch.are_deterministic_algorithms_enabled()
    try:
        torch.use_deterministic_algorithms(True)
        assert scan.launch_config(layout)["LOOKBACK"] == 0
    finally:
        torch.use_deterministic_algorithms(prev)
    assert scan.launch_config(layout)["LOOKBACK"] == tiny_chunks


def test_default_config_picks_lookback_for_long_sequences_only():
    assert scan.launch_config(_layout((4, 2**16, 1)))["LOOKBACK"] > 0
    assert scan.launch_config(_layout((4096, 2**16, 1)))["LOOKBACK"] == 0
    assert scan.launch_config(_layout((4, 128, 1)))["LOOKBACK"] == 0
    assert scan.launch_config(_layout((4, 2**16, 1), torch.float64))["LOOKBACK"] == 0  # float32 status words


def _layout(shape, dtype=torch.float32):
    from rl_triton_torchrl.kernels._utils import check_inputs
    return check_inputs(-2, {"x": torch.empty(shape, dtype=dtype, device="meta")}, {})


@pytest.mark.skipif(not torch.cuda.is_available(), reason="concurrent chunks need a GPU")
@pytest.mark.parametrize("block_t", [256, 2048])
@pytest.mark.parametrize("algo", list(TABLE))
def test_lookback_concurrent_chunks(algo, block_t, monkeypatch):
    """Hundreds of chunks per row in flight at once, at the default window."""
    monkeypatch.setattr(scan, "LOOKBACK_BLOCK_T", block_t)
    assert scan.launch_config(_layout((3, 70_000, 1)))["LOOKBACK"] > 0
    _compare(algo, (3, 70_000, 1), "random", seed=5, with_state=True)


@pytest.mark.parametrize("shape", [(300, 7, 1), (256, 8, 1)], ids=["B300-T7", "B256-T8"])
@pytest.mark.parametrize("algo", list(TABLE))
def test_short_sequence_tiles(algo, shape):
    """Sequences of 5-8 steps in many rows run in tiles of 4 steps (two per sequence): the carry between them."""
    cfg = scan.launch_config(_layout(shape))
    assert (cfg["BLOCK_T"], cfg["BLOCK_R"], cfg["LOOKBACK"]) == (scan.SHORT_BLOCK_T, scan.SHORT_BLOCK_R, 0)
    _compare(algo, shape, "random", seed=3, with_state=True)
