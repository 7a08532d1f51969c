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

pytestmark = [pytest.mark.triton,
              pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="needs a CUDA device or Triton's interpreter")]


KERNELS = scan.KERNELS  # every kernel (the generic scan's and each algorithm's)


@pytest.fixture(params=[(32, False), (-2, False), (32, True), (-2, True)],
                ids=["window32", "sparse-window2", "window32-segments4", "sparse-window2-segments4"])
def tiny_chunks(monkeypatch, request):
    """Every sequence in look-back mode, in chunks of 16 steps: one tile row in every kernel, or four segments of 4
    steps in every kernel."""
    window, segmented = request.param
    monkeypatch.setattr(scan, "LOOKBACK_MIN_T", 0)
    monkeypatch.setattr(scan, "LOOKBACK_MAX_ROWS", 10**9)
    monkeypatch.setattr(scan, "LOOKBACK_BLOCK_T", 16)
    monkeypatch.setattr(scan, "LOOKBACK_SEGMENTS", 4)
    monkeypatch.setattr(scan, "LOOKBACK_SEGMENT_T", 4)
    monkeypatch.setattr(scan, "LOOKBACK_SEGMENTED", KERNELS if segmented else frozenset())
    monkeypatch.setattr(scan, "LOOKBACK_WINDOW", window)
    yield window


def _compare(algo, shape, pattern, seed, with_state, dtype=torch.float32, storage=None):
    """The Triton path against the reference on one rollout whose floating tensors (and carried state) are ``dtype``,
    its tensors given to the call as ``storage`` makes them (of the dict of them)."""
    call, ref, coefs = TABLE[algo]
    x = {k: (v.to(DEVICE, dtype if v.is_floating_point() else v.dtype) if isinstance(v, torch.Tensor) else v)
         for k, v in make_rollout(shape, -2, pattern, seed=seed).items()}
    kw = dict(coefs)
    if with_state:
        kw["initial_state"] = torch.randn(state_shape(x, -2)).to(DEVICE, dtype)
    out = as_tuple(call(x if storage is None else storage(x), backend="triton", output_final_state=with_state, **kw))
    expected, h_expected = ref(x, **kw)
    expected = as_tuple(expected) + ((h_expected,) if with_state else ())
    assert len(out) == len(expected), algo
    for i, (o, e) in enumerate(zip(out, expected)):
        assert_close(f"{algo}[{i}]", o, e, dtype)


@pytest.mark.parametrize("with_state", [False, True], ids=["no-state", "state"])
@pytest.mark.parametrize("T", [3, 70])
@pytest.mark.parametrize("algo", list(TABLE))
def test_lookback_matches_reference(algo, T, with_state, tiny_chunks):
    assert scan.launch_config(_layout((2, T, 1)))["LOOKBACK"] == tiny_chunks
    _compare(algo, (2, T, 1), "random", seed=T, with_state=with_state)


@pytest.mark.parametrize("rows, chunks", [(1, 7), (3, 5), (16, 32)])
def test_lookback_tickets_reach_every_chunk_after_its_predecessors(rows, chunks):
    """``scan.ticket_chunk`` (its arithmetic run on tensors) hands out every (row, chunk) once, and every chunk's
    predecessors in its row hold smaller tickets: what keeps a look-back from waiting on a program not yet started."""
    tickets = torch.arange(rows * chunks)
    row, chunk = scan.ticket_chunk.fn(tickets, rows, chunks)
    pairs = list(zip(row.tolist(), chunk.tolist()))
    assert sorted(pairs) == [(r, c) for r in range(rows) for c in range(chunks)]
    ticket_of = {pair: t for t, pair in enumerate(pairs)}
    assert all(ticket_of[r, c - 1] < ticket_of[r, c] for r in range(rows) for c in range(1, chunks))
    if rows > 1:  # the rows in turn: the first tickets start every row
        assert [r for r, _ in pairs[:rows]] == list(range(rows))


@pytest.mark.parametrize("pattern", ["none", "all"])
def test_lookback_flag_patterns(pattern, tiny_chunks):
    for algo in ("gae", "vtrace", "retrace", "sum_after_done"):
        _compare(algo, (3, 50, 1), pattern, seed=1, with_state=True)


@pytest.mark.parametrize("algo", list(TABLE))
def test_lookback_warp_local_segments(algo, monkeypatch):
    """Chunks of two 128-step segments: the reverse scans' own reversal (``WARP_LOCAL_T``) inside look-back chunks,
    three chunks per row, the last one partly past T."""
    monkeypatch.setattr(scan, "LOOKBACK_MIN_T", 0)
    monkeypatch.setattr(scan, "LOOKBACK_MAX_ROWS", 10**9)
    monkeypatch.setattr(scan, "LOOKBACK_SEGMENTS", 2)
    monkeypatch.setattr(scan, "LOOKBACK_SEGMENTED", KERNELS)
    monkeypatch.setattr(scan, "LOOKBACK_WINDOW", -2)
    cfg = scan.launch_config(_layout((2, 600, 1)), "_gae_fwd_kernel")
    assert (cfg["BLOCK_R"], cfg["BLOCK_T"], cfg["grid"]) == (2, 128, (6,))
    _compare(algo, (2, 600, 1), "random", seed=7, with_state=True)


@pytest.mark.parametrize("block_t,block_r", [(1, 64), (2, 32)])
@pytest.mark.parametrize("shape", [(1, 9, 70), (70, 9, 1)], ids=["time-major", "batch-major"])
@pytest.mark.parametrize("algo", list(TABLE))
def test_narrow_time_tiles(algo, shape, block_t, block_r, monkeypatch):
    """Tiles one or two steps wide in many rows, each thread recurring over time (``sweep_configs``' time_major
    candidates), on time-major storage (the environments adjacent: ``[1, T, N]`` at time_dim -2 is the layout of
    ``[T, N, 1]`` at time_dim 0) and batch-major rows, with carried states."""
    default = scan.launch_config

    def narrow(layout, kernel_name=None, shifted=False):
        return {**default(layout, kernel_name, shifted), "grid": (scan._cdiv(layout.rows, block_r),),
                "BLOCK_R": block_r, "BLOCK_T": block_t, "LOOKBACK": 0, "maxnreg": None}

    monkeypatch.setattr(scan, "launch_config", narrow)
    _compare(algo, shape, "random", seed=5, with_state=True)


@pytest.mark.parametrize("algo", list(TABLE))
def test_warp_row_tiles_of_256_steps(algo, monkeypatch):
    """Row tiles of 2 x ``WARP_LOCAL_T`` steps in several rows (reversed in the warp like the 128-step ones: 8 steps per
    lane, a 16-byte load of 16-bit values), rows of several chunks and a partial last one, with carried states."""
    default = scan.launch_config

    def wide(layout, kernel_name=None, shifted=False):
        return {**default(layout, kernel_name, shifted), "grid": (scan._cdiv(layout.rows, 2),), "BLOCK_R": 2,
                "BLOCK_T": 2 * scan.WARP_LOCAL_T, "LOOKBACK": 0, "maxnreg": None}

    monkeypatch.setattr(scan, "launch_config", wide)
    _compare(algo, (5, 600, 1), "random", seed=13, with_state=True)


def test_tile256_rule():
    """``TILE256_*``: many batch-major rows of at least ``TILE256_MIN_T`` steps take 2 x 256 tiles on 2 warps, with the
    kernel's stages and no register cap, for the kernels ``TILE256_STAGES`` names for the element size only (16-bit:
    five kernels, float32: the TD(lambda) kernel, float64: none); shorter or fewer rows and time-major storage keep
    the other rules."""
    taken = ((16384, 512, 1), (8192, 256, 1), (65536, 3000, 1))
    assert len(scan.TILE256_STAGES[2]) == 5 and list(scan.TILE256_STAGES[4]) == ["_td_lambda_fwd_kernel"]
    for kernel in sorted(scan.KERNELS):
        for dtype in (torch.bfloat16, torch.float16, torch.float32, torch.float64):
            for shape in taken + ((8192, 255, 1), (8191, 512, 1), (1, 512, 16384), (4, 2**16, 1)):
                cfg = scan.launch_config(_layout(shape, dtype), kernel)
                wide = (cfg["BLOCK_R"], cfg["BLOCK_T"], cfg["num_warps"]) == (2, 256, 2)
                stages = scan.TILE256_STAGES.get(dtype.itemsize, {})
                assert wide == (kernel in stages and shape in taken), (kernel, dtype, shape, cfg)
                if wide:
                    assert cfg["NUM_STAGES"] == stages[kernel] and "maxnreg" not in cfg
                    assert cfg["grid"] == (shape[0] // 2,) and cfg["LOOKBACK"] == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("algo", list(TABLE))
def test_tile256_rule_matches_reference(algo, dtype, monkeypatch):
    """The rule's tiles (its row floor lowered so that 5 rows take them, the few-rows rule off; in float32 the
    TD(lambda) kernel's algorithms): rows of several chunks and a partial last one, with carried states, against the
    references."""
    monkeypatch.setattr(scan, "TILE256_MIN_ROWS", 1)
    monkeypatch.setattr(scan, "WIDE_MAX_ROWS", 0)
    assert scan.launch_config(_layout((5, 300, 1), dtype), "_td_lambda_fwd_kernel")["BLOCK_T"] == scan.TILE256_T
    _compare(algo, (5, 300, 1), "random", seed=17, with_state=True, dtype=dtype)


@pytest.mark.parametrize("T", [1, 3, 24, 32, 33])
def test_time_major_rule(T, monkeypatch):
    """``TIME_MAJOR_*``: short sequences stored time-major over enough rows take narrow tiles on one warp, for the
    swept kernels only; batch-major rows and longer sequences keep the other rules."""
    monkeypatch.setattr(scan, "TIME_MAJOR_MIN_ROWS", 64)
    for kernel in ("_gae_fwd_kernel", "_vtrace_fwd_kernel", "_td_lambda_fwd_kernel"):
        for shape, rows_adjacent in (((1, T, 70), True), ((70, T, 1), False), ((1, T, 63), False)):
            cfg = scan.launch_config(_layout(shape), kernel)
            narrow = (cfg["BLOCK_R"], cfg["BLOCK_T"], cfg["num_warps"]) == (32, min(max(2, 1 << (T - 1).bit_length()),
                                                                               4), 1)
            expected = rows_adjacent and T <= 32 and kernel in scan.TIME_MAJOR_KERNELS
            assert narrow == expected, (kernel, shape, cfg)
            if narrow:
                assert cfg["grid"] == (3,)


@pytest.mark.parametrize("T", [3, 24])
@pytest.mark.parametrize("algo", list(TABLE))
def test_time_major_tiles_match_reference(algo, T, monkeypatch):
    """The time-major rule's tiles (lowered to 32 rows here: one whole tile of rows and one partial) against the
    references, with carried states."""
    monkeypatch.setattr(scan, "TIME_MAJOR_MIN_ROWS", 32)
    _compare(algo, (1, T, 33), "random", seed=T, with_state=True)


@pytest.mark.parametrize("offsets", ["int64", "int32"])
@pytest.mark.parametrize("mode", ["tiles", "look-back"])
@pytest.mark.parametrize("algo", list(TABLE))
def test_offset_types(algo, mode, offsets, monkeypatch):
    """Every kernel with its offsets in int64 (what inputs past 2**31 elements take: ``INT32_MAX_OFFSET`` lowered so
    that these do) and in int32 (every kernel in ``INT32_KERNELS``), chunked rows and look-back chunks, against the
    references."""
    if offsets == "int64":
        monkeypatch.setattr(scan, "INT32_MAX_OFFSET", 0)
    else:
        monkeypatch.setattr(scan, "INT32_KERNELS", KERNELS)
    monkeypatch.setattr(scan, "MAX_BLOCK_T", 16)
    if mode == "look-back":
        monkeypatch.setattr(scan, "LOOKBACK_MIN_T", 0)
        monkeypatch.setattr(scan, "LOOKBACK_MAX_ROWS", 10**9)
        monkeypatch.setattr(scan, "LOOKBACK_BLOCK_T", 16)
    seen = _spy_launches(monkeypatch, "INT64")
    _compare(algo, (2, 45, 1), "random", seed=3, with_state=True)
    assert seen and all(flag == (offsets == "int64") for flag in seen), seen


def _spy_launches(monkeypatch, name: str) -> list:
    """The kernel argument ``name`` of every plain launch from now on (None where a kernel has no such argument),
    in a list (launch plans read their arguments through the spied launcher too)."""
    seen = []
    launcher = scan.launcher

    class Spy:
        def __init__(self, kernel):
            self.lean = launcher(kernel)

        def __getattr__(self, attr):
            return getattr(self.lean, attr)

        def __call__(self, grid, num_warps, maxnreg=None, **kwargs):
            seen.append(kwargs.get(name))  # None: a kernel without that parameter
            return self.lean(grid, num_warps, maxnreg, **kwargs)

    monkeypatch.setattr(scan, "launcher", Spy)
    return seen


@pytest.fixture
def windows(monkeypatch):
    """Aligned windows for every kernel, in rows of 16-step chunks (so that a window walks one chunk more where the
    rule lets it: ``WINDOW_MIN_CHUNKS`` 2)."""
    monkeypatch.setattr(scan, "WINDOW_KERNELS", KERNELS)
    monkeypatch.setattr(scan, "WINDOW_MIN_CHUNKS", 2)
    monkeypatch.setattr(scan, "MAX_BLOCK_T", 16)


def _offset_storage(x: dict) -> dict:
    """``x`` with every tensor moved to storage one element on: the same values, no longer 16-byte aligned."""
    def moved(v):
        if not isinstance(v, torch.Tensor):
            return v
        flat = torch.empty(v.numel() + 1, dtype=v.dtype, device=v.device)[1:]
        return flat.view(v.shape).copy_(v)
    return {k: moved(v) for k, v in x.items()}


@pytest.mark.parametrize("with_state", [False, True], ids=["no-state", "state"])
@pytest.mark.parametrize("pattern", ["none", "all", "random"])
@pytest.mark.parametrize("shape", [(3, 45, 1), (5, 13, 1), (2, 3, 11, 1), (1, 9, 1), (6, 35, 1)],
                         ids=["3x45", "5x13", "2x3x11", "1x9", "6x35"])
@pytest.mark.parametrize("algo", list(TABLE))
def test_aligned_windows_match_reference(algo, shape, pattern, with_state, windows, monkeypatch):
    """Rows of a length that is no multiple of 4 in aligned windows (``scan.chunk``'s ``WINDOW``: each row's tiles
    start at the 16-byte boundary at or before it), chunked or whole, against the references; every kernel but the
    discrete Retrace's (its int64 actions rule the windows out) takes them."""
    seen = _spy_launches(monkeypatch, "WINDOW")
    _compare(algo, shape, pattern, seed=sum(shape), with_state=with_state)
    assert seen and all(flag == ("discrete" not in algo) for flag in seen), seen


@pytest.mark.parametrize("algo", list(TABLE))
def test_aligned_windows_need_aligned_tensors(algo, windows, monkeypatch):
    """Inputs that do not start on a 16-byte boundary run without windows (a window's groups past a row's ends
    would not stay in the 16 bytes that hold them), with the same results."""
    seen = _spy_launches(monkeypatch, "WINDOW")
    _compare(algo, (3, 45, 1), "random", seed=4, with_state=True, storage=_offset_storage)
    assert seen and not any(seen), seen


def test_aligned_window_rule(monkeypatch):
    """``scan._aligned_window``: kernels of ``WINDOW_KERNELS`` over rows compiled for their length that is no
    multiple of 4 and longer than ``SHORT_T``, in row tiles, float32 rollouts, 16-byte aligned tensors of at most
    4-byte elements; one more chunk only in walks of at least ``WINDOW_MIN_CHUNKS`` (2)."""
    monkeypatch.setattr(scan, "WINDOW_KERNELS", frozenset({"k"}))

    def rule(shape, tensors=None, name="k", fixed_t=True, dtype=torch.float32, **cfg):
        layout = _layout(shape, dtype)
        cfg = {**scan.launch_config(layout, name), **cfg}
        tensors = [torch.empty(shape, dtype=dtype, device="meta")] if tensors is None else tensors
        return scan._aligned_window(layout, cfg, name, fixed_t, tensors)

    assert rule((8, 45, 1)) and rule((8, 13, 1)) and rule((8, 125, 1))  # one 64- / 16- / 128-step tile either way
    assert not rule((8, 44, 1)) and not rule((8, 7, 1))  # a multiple of 4; no more than SHORT_T steps
    assert not rule((8, 45, 1), name="other") and not rule((8, 45, 1), fixed_t=False)
    assert not rule((8, 45, 1), dtype=torch.float64) and not rule((8, 45, 1), dtype=torch.bfloat16)
    assert not rule((8, 45, 1), LOOKBACK=32)
    assert not rule((8, 63, 1)) and not rule((8, 127, 1)) and not rule((8, 2047, 1))  # one tile, two as windows
    # rows of 128-step chunks: 129 walks 2 either way, 255 2 -> 3, 511 4 -> 5, 2047 16 -> 17
    assert rule((4096, 129, 1)) and rule((4096, 255, 1)) and rule((4096, 511, 1)) and rule((4096, 2047, 1))
    monkeypatch.setattr(scan, "WINDOW_MIN_CHUNKS", 4)
    assert not rule((4096, 255, 1)) and not rule((4096, 383, 1)) and rule((4096, 511, 1))  # 2 -> 3, 3 -> 4: too short
    flat = torch.empty(8 * 45 + 1)
    assert not rule((8, 45, 1), tensors=[flat[1:].view(8, 45, 1)])  # not 16-byte aligned
    assert not rule((8, 45, 1), tensors=[torch.empty(8, 45, 1), torch.empty(8, 45, 1, dtype=torch.int64)])


def test_kernels_names_every_kernel():
    """``scan.KERNELS`` is every kernel of the kernel modules (launchable ``*_kernel`` objects, compiled or
    interpreted)."""
    import importlib

    found = {name for module in ("scan", "gae", "td_lambda", "vtrace", "retrace", "prefix_sum")
             for name, value in vars(importlib.import_module(f"rl_triton_torchrl.kernels.{module}")).items()
             if name.endswith("_kernel") and hasattr(type(value), "__getitem__")}
    assert found == scan.KERNELS


def test_int64_offsets_rule():
    """int32 offsets up to INT32_MAX_OFFSET, counting the outputs' elements and each input's strided extent."""
    small, big = _layout((4, 100, 1)), _layout((2**16, 2**15 + 1, 1))  # 2**31 + 2**16 elements
    assert not scan._int64_offsets(small, [small.contiguous_strides])
    assert scan._int64_offsets(big, [big.contiguous_strides])
    assert scan._int64_offsets(big, [])  # the outputs alone
    edge = _layout((2**16, 2**15, 1))  # 2**31 elements: the last one at 2**31 - 1, the largest int32
    assert not scan._int64_offsets(edge, [edge.contiguous_strides])
    assert scan._int64_offsets(small, [(2**30, 1, 0)])  # a view into a larger tensor: rows 2**30 apart
    assert not scan._int64_offsets(small, [(0, 0, 0)])  # a broadcast coefficient


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
@pytest.mark.parametrize("chunks", [(256, 0), (2048, 0), (0, 4), (0, 32)],
                         ids=["row256", "row2048", "segments4x128", "segments32x128"])
@pytest.mark.parametrize("algo", list(TABLE))
def test_lookback_concurrent_chunks(algo, chunks, monkeypatch):
    """Hundreds of chunks per row in flight at once, at the default window: chunks of one row (``block_t``
    steps) or of ``segments`` 128-step segments, in every kernel."""
    block_t, segments = chunks
    if segments:
        monkeypatch.setattr(scan, "LOOKBACK_SEGMENTS", segments)
        monkeypatch.setattr(scan, "LOOKBACK_SEGMENTED", KERNELS)
    else:
        monkeypatch.setattr(scan, "LOOKBACK_BLOCK_T", block_t)
        monkeypatch.setattr(scan, "LOOKBACK_SEGMENTED", frozenset())
    assert scan.launch_config(_layout((3, 70_000, 1)))["LOOKBACK"] > 0
    _compare(algo, (3, 70_000, 1), "random", seed=5, with_state=True)


@pytest.mark.parametrize("shape", [(300, 7, 1), (256, 8, 1)], ids=["B300-T7", "B256-T8"])
@pytest.mark.parametrize("algo", list(TABLE))
def test_short_sequence_tiles(algo, shape):
    """Sequences of 5-8 steps in many rows run in 8-step tiles of ``SHORT_BLOCK_R`` rows (partial tiles of rows and
    steps)."""
    cfg = scan.launch_config(_layout(shape))
    assert (cfg["BLOCK_T"], cfg["BLOCK_R"], cfg["LOOKBACK"]) == (8, scan.SHORT_BLOCK_R, 0)
    _compare(algo, shape, "random", seed=3, with_state=True)


def test_register_caps_on_warp_local_row_tiles_only(monkeypatch):
    """A kernel in ``REGISTER_CAPS`` gets ``maxnreg`` on 128-step row tiles with float32 accumulation, unless its
    rows of several chunks are pipelined (``PIPELINE_KERNELS``), and nowhere else."""
    monkeypatch.setattr(scan, "REGISTER_CAPS", {"k": 40})
    assert scan.launch_config(_layout((4096, 128, 1)), "k")["maxnreg"] == 40
    assert scan.launch_config(_layout((4096, 100, 1), torch.bfloat16), "k")["maxnreg"] == 40
    assert "maxnreg" not in scan.launch_config(_layout((4096, 128, 1)), "other")
    assert "maxnreg" not in scan.launch_config(_layout((4096, 128, 1)))
    assert "maxnreg" not in scan.launch_config(_layout((4096, 128, 1), torch.float64), "k")
    assert "maxnreg" not in scan.launch_config(_layout((4096, 32, 1)), "k")  # 32-step tiles
    assert scan.launch_config(_layout((4096, 512, 1)), "k")["maxnreg"] == 40  # several chunks, not pipelined
    monkeypatch.setattr(scan, "PIPELINE_KERNELS", frozenset({"k"}))
    assert "maxnreg" not in scan.launch_config(_layout((4096, 512, 1)), "k")  # several chunks: pipelined instead
    assert "maxnreg" not in scan.launch_config(_layout((4, 2**16, 1)), "k")  # look-back chunks


@pytest.mark.parametrize("T", [129, 300, 1000])
def test_pipelined_chunk_loop_on_rows_of_several_chunks(T):
    """128-step row tiles of rows longer than one chunk, float32 accumulation, a kernel in ``PIPELINE_KERNELS``:
    ``PIPELINE_STAGES`` stages, no register cap; other kernels, one chunk per row, float64, other tiles and look-back
    chunks keep one stage."""
    for kernel in sorted(scan.KERNELS - scan.PIPELINE_KERNELS):
        assert scan.launch_config(_layout((4096, T, 1)), kernel)["NUM_STAGES"] == 1, kernel
    for kernel in sorted(scan.PIPELINE_KERNELS):
        cfg = scan.launch_config(_layout((4096, T, 1)), kernel)
        assert (cfg["BLOCK_T"], cfg["NUM_STAGES"]) == (scan.WARP_LOCAL_T, scan.PIPELINE_STAGES), (kernel, cfg)
        assert "maxnreg" not in cfg
        assert scan.launch_config(_layout((4096, T, 1), torch.bfloat16), kernel)["NUM_STAGES"] == scan.PIPELINE_STAGES
        assert scan.launch_config(_layout((4096, T, 1), torch.float64), kernel)["NUM_STAGES"] == 1
    for shape in ((4096, 128, 1), (4096, 24, 1), (16, 3000, 1), (4, 2**16, 1)):
        assert scan.launch_config(_layout(shape), "_gae_fwd_kernel")["NUM_STAGES"] == 1, shape


@pytest.mark.parametrize("algo,T", [("gae", 100), ("vtrace", 100), ("gae", 300), ("vtrace", 300), ("td_lambda", 300),
                                    ("discounted", 300)])
def test_capped_and_pipelined_kernels_match_reference(algo, T, monkeypatch):
    """The capped kernels (``maxnreg`` passed through the launcher; one 128-step chunk per row) and the pipelined
    ones (several chunks) at shapes that select them (row tiles: the few-rows rule switched off)."""
    monkeypatch.setattr(scan, "WIDE_MAX_ROWS", 0)
    kernel = "_td_lambda_fwd_kernel" if algo == "discounted" else f"_{algo}_fwd_kernel"
    cfg = scan.launch_config(_layout((5, T, 1)), kernel)
    if T > scan.WARP_LOCAL_T:
        assert cfg["NUM_STAGES"] == scan.PIPELINE_STAGES and "maxnreg" not in cfg
    else:
        assert cfg.get("maxnreg") == scan.REGISTER_CAPS[kernel]
    _compare(algo, (5, T, 1), "random", seed=11, with_state=True)


def test_segmented_lookback_per_kernel(monkeypatch):
    """Kernels in ``LOOKBACK_SEGMENTED`` scan look-back chunks as ``LOOKBACK_SEGMENTS`` rows of segments."""
    layout = _layout((4, 2**16, 1))
    row = scan.launch_config(layout, "_gae_fwd_kernel")
    seg = scan.launch_config(layout, "_vtrace_fwd_kernel")
    assert (row["BLOCK_R"], row["BLOCK_T"]) == (1, scan.LOOKBACK_BLOCK_T)
    assert (seg["BLOCK_R"], seg["BLOCK_T"]) == (scan.LOOKBACK_SEGMENTS, scan.LOOKBACK_SEGMENT_T)
    assert seg["grid"] == (4 * 2**16 // (scan.LOOKBACK_SEGMENTS * scan.LOOKBACK_SEGMENT_T),)


def test_launch_switches_to_the_inputs_device(monkeypatch):
    """A launch for inputs on another CUDA device than the current one runs under ``torch.cuda.device`` of theirs,
    and a launch on the current device enters none (no GPU needed: the device calls and the kernel are stand-ins)."""
    import contextlib

    from rl_triton_torchrl.kernels._utils import Layout

    current, launched = [0], []

    @contextlib.contextmanager
    def device(d):
        before, current[0] = current[0], torch.device(d).index
        try:
            yield
        finally:
            current[0] = before

    class Kernel:  # the launcher stand-in: the plain path (no settings, no plan), recording the current device
        name = "_stand_in_kernel"

        def __init__(self, kernel):
            pass

        def settings(self):
            return None

        def __call__(self, grid, num_warps, maxnreg=None, **kwargs):
            launched.append(current[0])

    monkeypatch.setattr(torch.cuda, "device", device)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: current[0])
    monkeypatch.setattr(scan, "launcher", Kernel)
    x = torch.empty(2, 5, 1, device="meta")
    for index in (1, 0):
        layout = Layout(shape=x.shape, time_dim=1, outer=2, T=5, inner=1, dtype=torch.float32,
                        acc_dtype=torch.float32, device=torch.device("cuda", index))
        scan.launch(Kernel, layout, inputs={"a": x, "b": x}, outputs={"h": x}, REVERSE=False)
    assert launched == [1, 0] and current == [0], launched


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two CUDA devices")
@pytest.mark.parametrize("algo", ["gae", "vtrace", "retrace", "sum_after_done"])
def test_inputs_on_another_device(algo):
    """Inputs on cuda:1 while cuda:0 is current: the kernels run on cuda:1 (the first call and its launch plan)."""
    call, ref, coefs = TABLE[algo]
    x = {k: (v.to("cuda:1") if isinstance(v, torch.Tensor) else v)
         for k, v in make_rollout((3, 70, 1), -2, "random", seed=2).items()}
    kw = dict(coefs, initial_state=torch.randn(3, 1, device="cuda:1"))
    expected, h_expected = ref(x, **kw)
    with torch.cuda.device(0):
        for _ in range(2):
            out = as_tuple(call(x, backend="triton", output_final_state=True, **kw))
            for i, (o, e) in enumerate(zip(out, as_tuple(expected) + (h_expected,))):
                assert o.device == torch.device("cuda:1"), f"{algo}[{i}] on {o.device}"
                assert_close(f"{algo}[{i}]", o, e, torch.float32)
