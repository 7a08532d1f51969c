"""Launch configurations chosen by shape (``scan.launch_config``) and the kernels in each against float64.

The rules come from H200 sweeps (benchmarks/results/h200/sweep_few_rows_odd_t.md): few rows of medium length run one
row per program in one wide tile; sequences of 5-8 steps run in small whole-sequence tiles.
"""
from __future__ import annotations

import dis
import os

import pytest
import torch

from _algos import TABLE, make_rollout
from rl_triton_torchrl.kernels import scan
from test_launch_modes import _compare, _layout, _offset_storage, _spy_launches
from test_shifted import check as shifted_check
from test_shifted import with_last_value

pytestmark = [pytest.mark.triton,
              pytest.mark.skipif(not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1",
                                 reason="needs a CUDA device or Triton's interpreter")]


@pytest.mark.parametrize("shape,block_t,warps,vtrace_block_t", [
    ((128, 1024, 1), 1024, 8, 1024), ((512, 2048, 1), 2048, 8, 2048), ((1000, 1000, 1), 1024, 4, 1024),
    # GAE's 4096-step tiles on 16 warps (WIDE_TILE_WARPS)
    ((16, 3000, 1), 4096, 16, 4096), ((64, 129, 1), 256, 8, 256),
    # up to 128 rows V-trace's tiles take 4096 steps, GAE's in every row count (WIDE_LONG_MAX_ROWS), on their warps
    # above WIDE_FEW_WARPS_ROWS rows too
    ((200, 3000, 1), 4096, 16, 2048), ((300, 3000, 1), 4096, 16, 2048), ((300, 2049, 1), 4096, 16, 2048),
    ((1000, 3000, 1), 4096, 16, 1024), ((1000, 4000, 1), 4096, 16, 1024),
    # on 4 warps V-trace's tiles are at most 1024 steps (WIDE_4_WARPS_MAX_T)
    ((1000, 2048, 1), 2048, 4, 1024),
    # rows that do not hold their aligned window in the tile (T no multiple of 4, T + 3 past it): WIDE_WARPS
    ((512, 4095, 1), 4096, 8, 2048), ((1000, 4094, 1), 4096, 8, 1024), ((16, 4093, 1), 4096, 16, 4096),
    # from LOOKBACK_MANY_ROWS rows on, rows shorter than LOOKBACK_MANY_ROWS_MIN_T steps: no look-back; one tile of
    # WIDE_LONG_T steps, two of 2048 beyond
    ((64, 4096, 1), 4096, 16, 2048), ((512, 4096, 1), 4096, 16, 2048), ((512, 8192, 1), 2048, 8, 2048)])
def test_few_rows_get_one_wide_tile_per_row(shape, block_t, warps, vtrace_block_t):
    cfg = scan.launch_config(_layout(shape), "_gae_fwd_kernel")
    assert (cfg["BLOCK_R"], cfg["BLOCK_T"], cfg["num_warps"], cfg["LOOKBACK"]) == (1, block_t, warps, 0)
    assert cfg["grid"] == (shape[0],)
    assert "maxnreg" not in cfg  # register caps are for the 128-step row tiles
    if shape[1] < scan.LOOKBACK_MIN_T or shape[0] < scan.LOOKBACK_MANY_ROWS:
        assert scan.launch_config(_layout(shape), "_vtrace_fwd_kernel")["BLOCK_T"] == vtrace_block_t
        # V-trace's shifted input mode keeps tiles of at most 2048 steps (WIDE_SHIFTED_MAX_T), 2048-step ones on 16
        # warps up to WIDE_FEW_WARPS_ROWS rows (WIDE_TILE_WARPS), others on WIDE_WARPS there and 4 above; GAE's
        # takes its tile
        shifted = scan.launch_config(_layout(shape), "_vtrace_fwd_kernel", shifted=True)
        width = min(vtrace_block_t, 2048)
        few = shape[0] <= scan.WIDE_FEW_WARPS_ROWS
        expected_warps = (16 if width == 2048 else scan.WIDE_WARPS) if few else 4
        assert (shifted["BLOCK_T"], shifted["num_warps"]) == (width, expected_warps)
        assert scan.launch_config(_layout(shape), "_gae_fwd_kernel", shifted=True) == cfg


@pytest.mark.parametrize("kernel,shape,warps", [
    ("_prefix_sum_fwd_kernel", (512, 512, 1), 4), ("_prefix_sum_fwd_kernel", (512, 2048, 1), 8),
    ("_gae_fwd_kernel", (64, 300, 1), 4), ("_gae_fwd_kernel", (512, 2048, 1), 8),
    ("_vtrace_fwd_kernel", (512, 2048, 1), 16), ("_vtrace_fwd_kernel", (64, 512, 1), 4),
    ("_vtrace_fwd_kernel", (16, 3000, 1), 8),
    # the TD(lambda) kernel's 512-step tiles on 4 warps: 4 steps per thread, DESCENDING
    ("_td_lambda_fwd_kernel", (512, 512, 1), 4),
    ("_gae_fwd_kernel", (16, 2049, 1), 16), ("_td_lambda_fwd_kernel", (16, 2049, 1), 8),
    # above WIDE_FEW_WARPS_ROWS rows every kernel's one-row tiles take 4 warps, but WIDE_LONG_T-step ones
    ("_prefix_sum_fwd_kernel", (1000, 512, 1), 4), ("_vtrace_fwd_kernel", (1000, 2048, 1), 4),
    ("_td_lambda_fwd_kernel", (1000, 4096, 1), 8), ("_prefix_sum_fwd_kernel", (1024, 3584, 1), 8),
    ("_gae_fwd_kernel", (1024, 4096, 1), 16), ("_gae_fwd_kernel", (1024, 4095, 1), 8),
    ("_td_lambda_fwd_kernel", (1024, 2048, 1), 4),
    # retrace_discrete's 2048-step tiles on 16 warps, its narrower ones on WIDE_WARPS
    ("_retrace_discrete_fwd_kernel", (512, 2048, 1), 16), ("_retrace_discrete_fwd_kernel", (16, 3000, 1), 16),
    ("_retrace_discrete_fwd_kernel", (512, 512, 1), 8), ("_retrace_discrete_fwd_kernel", (128, 1024, 1), 8),
    ("_retrace_discrete_fwd_kernel", (1000, 2048, 1), 4)])
def test_one_row_tiles_take_their_kernels_warps(kernel, shape, warps):
    """One-row tiles take WIDE_WARPS warps, or WIDE_TILE_WARPS' number for their kernel and width (the H200 A/B of
    af85518), up to WIDE_FEW_WARPS_ROWS rows, 4 above; WIDE_LONG_T-step ones at any number of rows, WIDE_WARPS in
    rows that do not hold their aligned window."""
    cfg = scan.launch_config(_layout(shape), kernel)
    assert (cfg["BLOCK_R"], cfg["num_warps"]) == (1, warps), cfg


@pytest.mark.parametrize("kernel", sorted(scan.KERNELS))
def test_few_rows_of_2049_to_4095_steps_take_one_tile(kernel):
    """At most WIDE_LONG_MAX_ROWS[kernel] rows of 2049-4095 steps (every row count of the wide tiles for GAE,
    TD(lambda) and the prefix-sum kernel; 128 for V-trace): one tile of WIDE_LONG_T steps with float32 accumulation;
    the other kernels, more rows, float64 and shorter or longer rows as the rule without it."""
    max_rows = scan.WIDE_LONG_MAX_ROWS.get(kernel, 0)
    long_tile = max_rows > 0
    for shape in [(1, 2049, 1), (max(max_rows, 1), 4095, 1), (max(max_rows, 1), 3000, 1)]:
        for dtype in (torch.float32, torch.bfloat16, torch.float64):
            wide = scan.WIDE_MAX_T
            expected = scan.WIDE_LONG_T if long_tile and dtype != torch.float64 else wide
            assert scan.launch_config(_layout(shape, dtype), kernel)["BLOCK_T"] == expected, (shape, dtype)
            shifted = scan.launch_config(_layout(shape, dtype), kernel, shifted=True)["BLOCK_T"]
            assert shifted == min(expected, scan.WIDE_SHIFTED_MAX_T.get(kernel, expected)), (shape, dtype)
    assert scan.launch_config(_layout((max_rows + 1, 3000, 1)), kernel)["BLOCK_T"] <= scan.WIDE_MAX_T
    assert scan.launch_config(_layout((16, 2048, 1)), kernel)["BLOCK_T"] <= 2048
    assert scan.launch_config(_layout((16, 4096, 1)), kernel)["LOOKBACK"] == scan.LOOKBACK_WINDOW


@pytest.mark.parametrize("algo,kernel", [("gae", "_gae_fwd_kernel"), ("td_lambda", "_td_lambda_fwd_kernel"),
                                         ("discounted", "_td_lambda_fwd_kernel"), ("traces", "_prefix_sum_fwd_kernel"),
                                         ("sum_after_done", "_prefix_sum_fwd_kernel"), ("vtrace", "_vtrace_fwd_kernel")])
def test_one_tile_of_4096_steps_matches_reference(algo, kernel):
    """One 4096-step tile over 3 rows of 2500 steps (the rows' tail masked), with carried states."""
    assert scan.launch_config(_layout((3, 2500, 1)), kernel)["BLOCK_T"] == scan.WIDE_LONG_T
    _compare(algo, (3, 2500, 1), "random", seed=5, with_state=True)


@pytest.mark.parametrize("T", [3700, 4095, 4096])
@pytest.mark.parametrize("algo,kernel", [("gae", "_gae_fwd_kernel"), ("td_lambda", "_td_lambda_fwd_kernel"),
                                         ("traces", "_prefix_sum_fwd_kernel")])
def test_nearly_full_4096_step_tiles_match_reference(algo, kernel, T, monkeypatch):
    """Rows that nearly fill a 4096-step tile (4095 steps: no aligned window) and, where the look-back does not take
    them, of exactly 4096 steps (3 rows stand in for LOOKBACK_MANY_ROWS), with carried states."""
    monkeypatch.setattr(scan, "LOOKBACK_MANY_ROWS", 2)
    cfg = scan.launch_config(_layout((3, T, 1)), kernel)
    assert (cfg["BLOCK_T"], cfg["LOOKBACK"]) == (scan.WIDE_LONG_T, 0)
    _compare(algo, (3, T, 1), "random", seed=T, with_state=True)


@pytest.mark.parametrize("shape,dtype,storage", [
    ((2, 512, 1), torch.float32, None), ((3, 1000, 1), torch.float32, None), ((2, 2048, 1), torch.float32, None),
    ((2, 3000, 1), torch.float32, None), ((3, 1025, 1), torch.float32, None), ((2, 2049, 1), torch.float32, None),
    ((2, 5008, 1), torch.float64, None), ((2, 1024, 1), torch.bfloat16, None),
    ((2, 512, 1), torch.float32, _offset_storage), ((3, 1025, 1), torch.float32, _offset_storage)],
    ids=["512", "1000", "2048", "3000", "1025", "2049", "5008-f64", "1024-bf16", "512-offset", "1025-offset"])
@pytest.mark.parametrize("algo", ["gae", "td_lambda", "td_lambda_adv_vt", "discounted", "td1"])
def test_descending_tiles_match_reference(algo, shape, dtype, storage, monkeypatch):
    """Reverse scans' one-row tiles held in scan order (``DESCENDING``: 4-step groups reversed in their threads, a
    forward scan), with carried states, in one chunk per row (3000 steps: one 4096-step tile, its tail masked) and
    in several (float64: 2048-step tiles), over aligned windows (1025 and 2049 steps: rows no multiple of 4 long;
    GAE's windowed 4096-step tiles keep time order, ``DESCENDING_WINDOW_MAX_T``); rows one element off their 16-byte
    boundaries (``_offset_storage``) keep their tiles in time order."""
    seen = _spy_launches(monkeypatch, "DESCENDING")
    _compare(algo, shape, "random", seed=shape[1], with_state=True, dtype=dtype, storage=storage)
    expected = storage is None and not (algo == "gae" and shape[1] == 2049)
    assert seen and all(d is expected for d in seen), seen


@pytest.mark.parametrize("shape", [(6, 512, 1), (3, 1000, 3), (3, 1023, 1)], ids=["rows4", "inner3", "T1023"])
def test_descending_tiles_only_in_one_row_tiles_of_aligned_rows(shape, monkeypatch):
    """Not in tiles of several rows (6 rows stand in for more than WIDE_MAX_ROWS), nor over time-major rows or rows
    whose loads are one element each (1023 steps: no aligned window in a 1024-step tile)."""
    monkeypatch.setattr(scan, "WIDE_MAX_ROWS", 4)
    seen = _spy_launches(monkeypatch, "DESCENDING")
    for algo in ("gae", "discounted", "vtrace"):
        _compare(algo, shape, "random", seed=1, with_state=False)
    assert seen and not any(seen), seen


@pytest.mark.parametrize("storage", [None, _offset_storage], ids=["aligned", "offset"])
@pytest.mark.parametrize("T", [1000, 1025, 2048])
def test_descending_tiles_shifted_gae(T, storage, monkeypatch):
    """GAE's shifted mode in ``DESCENDING`` tiles: each group's next values from the group and one load per group
    (``scan._next_in_groups``)."""
    seen = _spy_launches(monkeypatch, "DESCENDING")
    x = with_last_value(make_rollout((3, T, 1), -2, "random", seed=T), -2)
    shifted_check("gae", x if storage is None else storage(x), "triton", output_final_state=True)
    assert seen and all(bool(d) == (storage is None) for d in seen), seen


@pytest.mark.parametrize("shifted", [False, True], ids=["next-values", "shifted"])
@pytest.mark.parametrize("shape,dtype,storage", [
    ((2, 1024, 1), torch.float32, None), ((2, 1024, 1), torch.float32, _offset_storage),
    ((3, 1025, 1), torch.float32, None), ((2, 5008, 1), torch.float64, None), ((2, 2048, 1), torch.bfloat16, None)],
    ids=["1024", "1024-offset", "1025-window", "5008-f64", "2048-bf16"])
def test_descending_tiles_vtrace(shape, dtype, storage, shifted, monkeypatch):
    """V-trace in ``DESCENDING`` tiles, both input modes, with carried states: vs_(t+1) from each 4-step group and
    one read-back per group of the stored value target (``scan.stored_next_step``), or, where the value target is
    not stored in float32 (bfloat16), h_(t+1) gathered one column back in scan order (``scan.next_column``); over
    one chunk, aligned windows (1025 steps) and several chunks (float64: 2048-step tiles). Rows one element off
    their 16-byte boundaries keep time order."""
    seen = _spy_launches(monkeypatch, "DESCENDING")
    if shifted:
        x = with_last_value(make_rollout(shape, -2, "random", seed=shape[1]), -2)
        x = {k: v.to(dtype) if isinstance(v, torch.Tensor) and v.is_floating_point() else v for k, v in x.items()}
        shifted_check("vtrace", x if storage is None else storage(x), "triton", output_final_state=True)
    else:
        _compare("vtrace", shape, "random", seed=shape[1], with_state=True, dtype=dtype, storage=storage)
    assert seen and all(bool(d) == (storage is None) for d in seen), seen


@pytest.mark.parametrize("shape", [(64, 4096, 1), (512, 8192, 1), (512, 20000, 1)])
def test_vtrace_keeps_the_look_back_in_many_rows(shape):
    """From LOOKBACK_MANY_ROWS rows on V-trace keeps the look-back at any length, in chunks of 4 x 128 steps (its
    32 x 128 chunks in fewer rows), and so does retrace_discrete."""
    cfg = scan.launch_config(_layout(shape), "_vtrace_fwd_kernel")
    assert (cfg["LOOKBACK"], cfg["BLOCK_R"], cfg["BLOCK_T"]) == (scan.LOOKBACK_WINDOW, 4, scan.LOOKBACK_SEGMENT_T)
    assert cfg["grid"] == (shape[0] * -(-shape[1] // 512),)
    few = scan.launch_config(_layout((16, shape[1], 1)), "_vtrace_fwd_kernel")
    assert (few["LOOKBACK"], few["BLOCK_R"]) == (scan.LOOKBACK_WINDOW, scan.LOOKBACK_SEGMENTS)
    discrete = scan.launch_config(_layout(shape), "_retrace_discrete_fwd_kernel")  # its own 2048-step chunks
    assert (discrete["LOOKBACK"], discrete["BLOCK_R"], discrete["BLOCK_T"]) == (
        scan.LOOKBACK_WINDOW, 1, scan.LOOKBACK_BLOCK_T)


@pytest.mark.parametrize("shape", [(63, 4096, 1), (16, 5000, 1), (64, 16384, 1), (512, 20000, 1)])
def test_long_rows_in_few_rows_take_the_look_back(shape):
    """Fewer than LOOKBACK_MANY_ROWS rows from LOOKBACK_MIN_T steps, more from LOOKBACK_MANY_ROWS_MIN_T steps."""
    assert scan.launch_config(_layout(shape), "_gae_fwd_kernel")["LOOKBACK"] == scan.LOOKBACK_WINDOW


@pytest.mark.parametrize("shape", [(1025, 1024, 1), (4096, 512, 1), (128, 128, 1), (128, 64, 1)])
def test_many_rows_or_short_rows_keep_row_tiles(shape):
    cfg = scan.launch_config(_layout(shape), "_gae_fwd_kernel")
    assert cfg["BLOCK_T"] <= scan.MAX_BLOCK_T and cfg["BLOCK_R"] > 1


@pytest.mark.parametrize("T", [5, 7, 8])
def test_short_sequences_in_small_tiles(T):
    cfg = scan.launch_config(_layout((4096, T, 1)))
    assert (cfg["BLOCK_R"], cfg["BLOCK_T"], cfg["num_warps"]) == (scan.SHORT_BLOCK_R, 8, scan.SHORT_WARPS)
    # too few rows for a tile of them: the plain rule
    assert scan.launch_config(_layout((3, T, 1)))["BLOCK_R"] == 4


@pytest.mark.parametrize("shape", [(3, 150, 1), (2, 64, 3), (5, 97, 1)], ids=["B3-T150", "B2-T64-F3", "B5-T97"])
@pytest.mark.parametrize("algo", list(TABLE))
def test_wide_tiles_with_chunks_match_reference(algo, shape, monkeypatch):
    """Wide tiles that do not cover the row (chunks of 32 steps walked in turn, the last one partial), small enough
    for the interpreter: every algorithm against its float64 reference, with carried states."""
    monkeypatch.setattr(scan, "MAX_BLOCK_T", 16)
    monkeypatch.setattr(scan, "WIDE_MAX_T", 32)
    monkeypatch.setattr(scan, "WIDE_LONG_MAX_ROWS", {})  # (its WIDE_LONG_T-step tiles would take the rows whole)
    monkeypatch.setattr(scan, "WIDE_4_WARPS_MAX_T", {})
    for kernel in scan.KERNELS:
        cfg = scan.launch_config(_layout(shape), kernel)
        assert (cfg["BLOCK_R"], cfg["BLOCK_T"]) == (1, 32), kernel
    _compare(algo, shape, "random", seed=11, with_state=True)


@pytest.mark.parametrize("shape", [(3, 600, 1), (2, 300, 2), (3, 301, 1)], ids=["B3-T600", "B2-T300-F2", "B3-T301"])
@pytest.mark.parametrize("pattern,dtype", [("random", torch.float32), ("none", torch.float32), ("all", torch.float32),
                                           ("random", torch.float64), ("random", torch.bfloat16)], ids=str)
@pytest.mark.parametrize("algo", ["vtrace", "vtrace_shifted"])
def test_vtrace_wide_tiles_read_back_the_next_step(algo, pattern, dtype, shape, monkeypatch):
    """V-trace's one-row tiles over several warps read vs_(t+1) back from the output they stored (outputs of the
    accumulation dtype; bfloat16 keeps the gather): 256-step tiles over rows of 300, 301 and 600 steps, walked in
    turn, so that the step after a tile's last one lies in the tile stored before it, and the last tile is partial
    (301 steps: rows off the 16-byte grid, stored through aligned windows and read back one step on)."""
    monkeypatch.setattr(scan, "WIDE_MAX_T", 2 * scan.WARP_LOCAL_T.value)
    monkeypatch.setattr(scan, "WIDE_LONG_MAX_ROWS", {})
    cfg = scan.launch_config(_layout(shape), "_vtrace_fwd_kernel")
    assert (cfg["BLOCK_R"], cfg["BLOCK_T"], cfg["LOOKBACK"]) == (1, 256, 0)
    windows = _spy_launches(monkeypatch, "WINDOW")
    _compare(algo, shape, pattern, seed=7, with_state=True, dtype=dtype)
    assert windows == [shape[1] == 301 and dtype == torch.float32]


@pytest.mark.parametrize("algo,block_t", [("vtrace", 256), ("vtrace_shifted", 128)])
def test_vtrace_shifted_mode_takes_its_own_tile_width(algo, block_t, monkeypatch):
    """The launch passes V-trace's input mode to the rule: its shifted mode takes tiles of at most
    WIDE_SHIFTED_MAX_T steps (here 128 against the others' 256), and both modes still match their references."""
    monkeypatch.setattr(scan, "WIDE_MAX_T", 256)
    monkeypatch.setattr(scan, "WIDE_LONG_MAX_ROWS", {})
    monkeypatch.setattr(scan, "WIDE_SHIFTED_MAX_T", {"_vtrace_fwd_kernel": 128})
    seen = _spy_launches(monkeypatch, "BLOCK_T")
    _compare(algo, (3, 300, 1), "random", seed=9, with_state=True)
    assert seen == [block_t]


@pytest.mark.parametrize("with_state", [False, True], ids=["no-state", "state"])
@pytest.mark.parametrize("T", [16, 13, 40])
@pytest.mark.parametrize("algo", ["gae", "vtrace_shifted", "traces", "retrace_discrete"])
def test_rows_of_one_chunk_launch_without_the_chunk_loop(algo, T, with_state, monkeypatch):
    """``ONE_CHUNK`` (the kernel compiled without its chunk loop) exactly where every row is one chunk, T + 3 *
    WINDOW <= BLOCK_T without look-back: 16 steps, and 13 in a window of 16; 40 steps walk three 16-step chunks. Both
    match the reference, with the final state (the state leaving the one chunk) and without it (dropped)."""
    monkeypatch.setattr(scan, "MAX_BLOCK_T", 8)
    monkeypatch.setattr(scan, "WIDE_MAX_T", 16)
    monkeypatch.setattr(scan, "WIDE_LONG_MAX_ROWS", {})
    one_chunk = _spy_launches(monkeypatch, "ONE_CHUNK")
    block_t = _spy_launches(monkeypatch, "BLOCK_T")
    window = _spy_launches(monkeypatch, "WINDOW")
    _compare(algo, (3, T, 1), "random", seed=T, with_state=with_state)
    assert block_t == [16]
    assert one_chunk == [T + 3 * window[0] <= 16] == [T < 40]


@pytest.mark.parametrize("pattern", ["none", "all", "trunc_last"])
@pytest.mark.parametrize("algo", ["gae", "vtrace", "traces", "sum_at_start"])
def test_wide_whole_row_tiles_match_reference(algo, pattern):
    """One wide tile per row at the default constants (T = 200: a 256-step tile, partly masked)."""
    assert scan.launch_config(_layout((3, 200, 1)))["BLOCK_T"] == 256
    _compare(algo, (3, 200, 1), pattern, seed=2, with_state=True)


@pytest.mark.parametrize("shape", [(300, 7, 1), (17, 5, 2)], ids=["B300-T7", "B17-T5-F2"])
@pytest.mark.parametrize("algo", ["gae", "vtrace", "retrace", "traces", "sum_after_done"])
def test_short_tiles_match_reference(algo, shape):
    _compare(algo, shape, "random", seed=4, with_state=True)


def test_assigning_a_launch_constant_moves_the_config_epoch(monkeypatch):
    """Plan keys hold ``scan._CONFIG_EPOCH``: any assignment of a launch constant changes it, others do not."""
    before = scan._config_key()
    monkeypatch.setattr(scan, "POISON_OUTPUTS", not scan.POISON_OUTPUTS)  # not a launch constant
    assert scan._config_key() == before
    for name in sorted(scan._CONFIG_NAMES):
        epoch = scan._CONFIG_EPOCH
        monkeypatch.setattr(scan, name, getattr(scan, name))
        assert scan._CONFIG_EPOCH == epoch + 1, name
    assert scan._config_key() != before
    torch.use_deterministic_algorithms(True)
    try:
        assert scan._config_key()[1] is True
    finally:
        torch.use_deterministic_algorithms(False)
    assert all(hasattr(scan, name) for name in scan._CONFIG_NAMES)


def test_every_constant_launch_config_reads_is_a_launch_constant():
    """The module constants ``launch_config`` reads are all in ``_CONFIG_NAMES`` (else assigning one would leave
    plans recorded under its old value to be replayed)."""
    read = {i.argval for i in dis.get_instructions(scan.launch_config)
            if i.opname == "LOAD_GLOBAL" and i.argval.isupper()}
    assert read - scan._CONFIG_NAMES == set()


@pytest.mark.parametrize("shape,layout,expected", [
    ((64, 24, 1), "contig", True), ((64, 7, 1), "contig", True), ((64, 128, 1), "contig", False),
    ((64, 32, 1), "contig", False), ((64, 200, 1), "contig", True), ((2, 5000, 1), "contig", False), ((64, 24, 3), "contig", False),
    ((64, 24, 1), "sliced", False), ((64, 24, 1), "time-major", False), ((1, 24, 1), "contig", True),
    ((64, 24, 1), "per-action", True), ((64, 1000, 1), "per-action", True), ((64, 1024, 1), "per-action", False),
    ((64, 24, 1), "every-other", True), ((64, 24, 1), "offset-rows", False)])
def test_constant_length(shape, layout, expected):
    """T (and the strides) become compile-time constants only for rows whose length Triton's specialization cannot
    describe (no multiple of 16), up to ``CONSTANT_MAX_T`` steps, whose strides are the contiguous ones or those
    times a whole k: one action's entries of ``[B, T, A]`` (k = A), every other step (k = 2); not rows that start
    at other offsets."""
    from rl_triton_torchrl.kernels._utils import rows_strides

    x = torch.empty(shape)
    if layout == "sliced":
        x = torch.empty(shape[0], shape[1] + 1, shape[2])[:, 1:]
    elif layout == "time-major":
        x = torch.empty(shape[1], shape[0], shape[2]).transpose(0, 1)
    elif layout == "per-action":  # strides (3 T, 3, -)
        x = torch.empty(shape[0], shape[1], 3)[..., 1:2]
    elif layout == "every-other":  # strides (2 T, 2, -)
        x = torch.empty(shape[0], 2 * shape[1], 1)[:, ::2]
    elif layout == "offset-rows":  # strides (3 T + 1, 3, -)
        x = torch.empty(shape[0], 3 * shape[1] + 1)[:, : 3 * shape[1]:3, None]
    lay = _layout(shape)
    assert scan._constant_length(lay, [rows_strides(x, lay)[1]]) is expected


@pytest.mark.parametrize("T", [1, 3, 5, 8, 24, 63, 100])
@pytest.mark.parametrize("algo", ["gae", "vtrace", "td_lambda", "retrace", "traces", "sum_at_start"])
def test_constant_length_kernels_match_reference(algo, T):
    """Kernels compiled for their sequence length (contiguous [B, T, 1] rows) against float64."""
    _compare(algo, (5, T, 1), "random", seed=T, with_state=True)
