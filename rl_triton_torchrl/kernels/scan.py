r"""The one scan core: first-order linear recurrences along time.

Every estimator in this package is

.. math::

    h_t = a_t \, h_{t+1} + b_t \quad \text{(reverse in time)} \qquad\text{or}\qquad
    h_t = a_t \, h_{t-1} + b_t \quad \text{(forward)},

with the state just outside the sequence (:math:`h_T`, resp. :math:`h_{-1}`) given as ``initial_state`` or zero.
Each step is the affine map :math:`f_t(h) = a_t h + b_t`; composing two maps is again affine,

.. math:: (a_2, b_2) \circ (a_1, b_1) = (a_2 a_1,\; a_2 b_1 + b_2),

and associative, so the whole sequence is one associative scan (``_affine_combine``) of depth O(log T).

Kernels tile a ``[BLOCK_R, BLOCK_T]`` block of (row, time) and scan it in registers; sequences longer than
``BLOCK_T`` are walked chunk by chunk in scan order, the last state of one chunk entering the next. Long sequences
in few rows instead give every chunk its own program, which finds the state entering its chunk by a decoupled
look-back over its predecessors (``chain_state``; ``launch_config`` picks the mode). Any
``[*B, T, *F]`` input with any ``time_dim`` is addressed by strides as ``(outer, T, inner)``: row ``r`` is
``(r // inner, r % inner)``. Offsets are int64, or int32 (``INT64`` off) in the kernels of ``INT32_KERNELS`` where
every offset of the launch fits.

Every kernel (the generic one here and each algorithm's) is the same skeleton built from the helpers below:
``row_prologue`` (rows, entering state, the chunks to walk), a loop over ``chunk``\ s in scan order that loads with
``load_tile``/``load_coef``, forms a_t, b_t, calls ``scan_tile`` and writes with ``store_tile``, then
``store_state``; ``launch`` starts any of them. ``torch_linear_scan`` is the plain-torch scan of the CPU path.
"""
from __future__ import annotations

import functools
import math
import operator
import os
import struct
import sys
import types
import warnings
from typing import Callable, NamedTuple

import torch

from . import _replay
from ._replay import replayable
from ._launcher import NO_CONTEXT, current_stream, launcher, replay
from ._triton import tl, triton
from ._utils import Layout, check_inputs, is_cached, resolve_backend, rows_strides

__all__ = ["linear_scan", "torch_linear_scan", "launch_config"]

# Every kernel built on this module's skeleton, by name (the generic scan's and each algorithm's): what the per-kernel
# tables below choose from, and what tools and tests set them to when they want all of them.
KERNELS = frozenset({"_linear_scan_fwd_kernel", "_gae_fwd_kernel", "_td_lambda_fwd_kernel", "_vtrace_fwd_kernel",
                     "_retrace_fwd_kernel", "_retrace_discrete_fwd_kernel", "_prefix_sum_fwd_kernel"})
# Largest time tile. Longer sequences loop over chunks of this size. Tests lower it to exercise the chunk loop.
# 128 steps (4 rows per program): one warp per row, so that reverse scans stay in the warp (WARP_LOCAL_T).
MAX_BLOCK_T = 128
# Elements per program tile (rows * time). 512 was the fastest or within 3% of it at every GAE and discounted-return
# cell of the H200 sweep (benchmarks/results/h200/sweep_tiles.md): 4-18% faster than 2048.
TILE_ELEMENTS = 512
# Decoupled look-back (one program per chunk) for float32 sequences of at least LOOKBACK_MIN_T steps in at most
# LOOKBACK_MAX_ROWS rows; LOOKBACK_WINDOW predecessors are read at once (0 turns the mode off). A negative window
# is a testing aid: only every third chunk publishes its leaving state, so that even the interpreter, which runs the
# programs one after another, walks the look-back over aggregates and across windows.
# The sizes are the H200 sweep's (benchmarks/results/h200/sweep_configs.md): 2048-step chunks on 4 warps were the
# fastest or within 7% at every long shape; the per-row kernels stay faster from about 1024 rows of 8192 steps.
# From LOOKBACK_MANY_ROWS rows on the mode waits for LOOKBACK_MANY_ROWS_MIN_T steps: H200, 64-512 rows of 4096 and
# 8192 steps by the 50-call graph (sweep_lookback_wide.md), one wide tile per row (2048 steps, 1024 for V-trace, on
# 8 warps) walked in turn against the look-back chunks: GAE's shifted mode 1.0-1.4x, the discounted return
# 1.0-1.4x, traces 1.3-1.6x faster (512 x 4096: 23.3 -> 18.0 µs, 11.8 -> 10.6, 10.9 -> 6.7), V-trace level or faster
# (256 x 4096 18.9 -> 15.4); at 512 x 16384 the discounted return was 7% slower per row: the mode stays there.
# The kernels in LOOKBACK_MANY_ROWS_SEGMENTS keep the mode there at any length, a kernel of LOOKBACK_SEGMENTED in
# chunks of that many LOOKBACK_SEGMENT_T-step segments: V-trace (an exp and two clips per step, the most work per
# element) in 4 x 128 chunks was the fastest of the sweep's configurations at every one of those shapes, 1.3-1.9x its
# 32 x 128 chunks and faster than its per-row tiles (512 x 4096 40.2 -> 27.8 µs, 64 x 4096 12.0 -> 6.2, 512 x 16384
# 143 -> 101; bench_peers_vtrace_lookback_45ba32f.md: 40.1 -> 28.0 in the release grid); retrace_discrete (its sums
# over actions per step) in its 2048-step chunks, 512 x 4096 92.8-93.4 µs in per-row tiles against 86.9-87.4
# (bench_peers_vtrace_lookback_base.md, the same session).
LOOKBACK_MIN_T = 4096
LOOKBACK_MAX_ROWS = 512
LOOKBACK_MANY_ROWS, LOOKBACK_MANY_ROWS_MIN_T = 64, 16384
LOOKBACK_MANY_ROWS_SEGMENTS = {"_vtrace_fwd_kernel": 4, "_retrace_discrete_fwd_kernel": 1}
LOOKBACK_BLOCK_T = 2048
LOOKBACK_WARPS = 4
# The kernels named in LOOKBACK_SEGMENTED scan a look-back chunk as a tile of LOOKBACK_SEGMENTS segments (rows) of
# LOOKBACK_SEGMENT_T steps instead of one LOOKBACK_BLOCK_T-step row: at WARP_LOCAL_T steps the reverse scans stay in
# the warp, as in the per-row tiles, and the segments' maps are composed across the tile's rows. H200, 16 x 2^20
# (benchmarks/results/h200/sweep_segments.md): 32 x 128 on 4 warps against one 2048-step row, V-trace 337 -> 292 µs,
# the TD(lambda) kernel (discounted return) 136 -> 107 µs; GAE 172 -> 199 µs (it keeps the row). Replace the
# frozenset to change it (a launch plan's key holds its identity).
LOOKBACK_SEGMENT_T = 128
LOOKBACK_SEGMENTS = 32
LOOKBACK_SEGMENTED = frozenset({"_vtrace_fwd_kernel", "_td_lambda_fwd_kernel"})
LOOKBACK_WINDOW = 32
# Row tiles of WARP_LOCAL_T steps that walk several chunks per row (T > WARP_LOCAL_T), for the kernels in
# PIPELINE_KERNELS, software-pipeline their chunk loop over PIPELINE_STAGES stages (Triton's ``num_stages``: the next
# chunks' loads are in flight while one chunk is scanned), with float32 accumulation. The kernels stalled on their
# loads (ncu at 65536 x 512, one stage: 70-84% of the cycles on a long scoreboard, issue slots 30-51% busy;
# benchmarks/results/h200/ncu_float32.txt). H200 (sweep_stages.md), 3 stages against 1: V-trace 79 -> 99% of the copy
# bandwidth at 65536 x 512 and 75 -> 100% at 65536 x 2048, GAE 85 -> 96%, TD(lambda) 88 -> 99%, the discounted
# return 81 -> 94% there, with or without a cap of 64 registers within 2% (so these tiles take no cap). Over the whole
# grid, both dtypes (compare_stages.md): those three kernels up to 1.57x faster (bfloat16 V-trace 58 -> 92%) and none
# slower by more than 5%; the prefix-sum kernel (traces, prefix sums: bfloat16 12-17% slower at 16384-65536 rows) and
# Retrace (float32 4096 x 512 11-13% slower, nothing faster) keep one stage.
PIPELINE_STAGES = 3
PIPELINE_KERNELS = frozenset({"_gae_fwd_kernel", "_vtrace_fwd_kernel", "_td_lambda_fwd_kernel"})
# Registers per thread, capped per kernel for the WARP_LOCAL_T-step row tiles of one chunk per row with float32
# accumulation (Triton's ``maxnreg``): more programs per SM. Measured (sweep_regs.md, sweep_regs_ab.md) before the
# pipelined tiles above, on rows of several chunks, against the uncapped kernel: GAE at 40 (48 uncapped) 2-7% faster at
# 16384 x 2048, 65536 x 512 and 65536 x 2048; V-trace at 64 (76) 10-17% faster. The TD(lambda) kernel uses 32 and was
# slower capped at 40-64. Replace the dict to change it (as LOOKBACK_SEGMENTED).
REGISTER_CAPS = {"_gae_fwd_kernel": 40, "_vtrace_fwd_kernel": 64}
# Batch-major rows of at least TILE256_MIN_T steps in at least TILE256_MIN_ROWS rows, for the kernels of
# TILE256_STAGES[element size]: row tiles of TILE256_BLOCK_R rows x TILE256_T (2 x WARP_LOCAL_T) steps on
# TILE256_BLOCK_R warps (one warp per row, 8 steps per lane: one 16-byte load of 16-bit values, two of float32;
# reversed in the warp as the 128-step tiles are), the chunk loop over the kernel's stages. H200 (sweep_wide16.md,
# sweep_wide32.md: every configuration checked against the float64 torch path), against 4 x 128 tiles on 4 warps at
# 65536 x 512 / 16384 x 2048 / 65536 x 2048, % of the copy bandwidth. bfloat16: GAE 89 / 87 / 86 -> 93 / 89 / 96,
# V-trace 83 / 85 / 85 -> 87 / 90 / 97, TD(lambda) 73 / 75 / 81 -> 86 / 85 / 98, Retrace 75 / 72 / 74 -> 83 / 85 / 95,
# the discounted return 61 / 62 / 70 -> 76 / 79 / 91, traces (one stage; three measured 61 / 64 / 75) 61 / 59 / 64 ->
# 76 / 74 / 87. float32, against the pipelined 128-step tiles: the TD(lambda) kernel's discounted return 88 / 83 / 93
# -> 91 / 87 / 96, TD(lambda) 95 / 91 / 98 -> 96 / 94 / 101; V-trace lost at 65536 x 512 (99 -> 80), Retrace
# everywhere (96 -> 63) and the traces were level, so they keep the 128-step tiles in float32 (GAE, 3 points faster,
# too: its shifted mode takes V' from 128-step tiles in place). At 4096 x 512 bfloat16 Retrace measured 41 -> 37%
# (the others 0-5 points faster), hence the rows' floor.
TILE256_T, TILE256_MIN_T, TILE256_MIN_ROWS, TILE256_BLOCK_R = 256, 256, 8192, 2
TILE256_STAGES = {
    2: {"_gae_fwd_kernel": 3, "_vtrace_fwd_kernel": 3, "_td_lambda_fwd_kernel": 3, "_retrace_fwd_kernel": 3,
        "_prefix_sum_fwd_kernel": 1},
    4: {"_td_lambda_fwd_kernel": 3},
}
# Sequences of 5-8 steps: whole 8-step tiles in 16 rows on 4 warps (many small programs). H200
# (sweep_few_rows_odd_t.md), 65536 x 8: GAE 12.9 -> 9.7 µs, V-trace 13.4 -> 11.3 µs against 4-step tiles in 256 rows on
# 8 warps (the former rule); 4096 x 8: GAE 10.7 -> 5.9 µs.
SHORT_MIN_T, SHORT_T, SHORT_BLOCK_R, SHORT_WARPS = 5, 8, 16, 4
# Few rows of more than WARP_LOCAL_T steps (at most WIDE_MAX_ROWS rows, 256 programs of 4 rows: under two per SM):
# one row per program in one tile of up to WIDE_MAX_T steps, on WIDE_WARPS warps (4 above WIDE_FEW_WARPS_ROWS rows),
# instead of 128-step chunks walked one after another by one warp per row. H200 (sweep_few_rows_odd_t.md), every
# algorithm swept: 128 x 1024 GAE 18.8 -> 7.4 µs, V-trace 26.9 -> 9.0 µs; 512 x 2048 GAE 34.6 -> 14.0 µs; 1000 x 1024
# GAE 21.6 -> 13.8 µs (4 warps). On 4 warps the kernels of WIDE_4_WARPS_MAX_T keep tiles of at most that many
# steps: V-trace 1024 (its registers; H100, ablate_vt2048_ad197e7.md: 1000 x 2048 36.1 µs against 45.0 in 2048-step
# tiles). On WIDE_WARPS warps its tiles are as wide as the others' since it reads vs_(t+1) back from its output
# (``vtrace``'s ``VS_RELOAD``; 80 -> 57 registers at 512 x 512): 512 x 2048 26.2 -> 22.3 µs, 100 x 1500 12.5 ->
# 8.4, the rest level (16 x 2049 11.5 -> 11.7, 64 x 512 - 256 x 1024 within 0.1 µs). In their shifted input mode
# (``SHIFTED``: the next values read one step on) the kernels of WIDE_SHIFTED_MAX_T keep tiles of at most that many
# steps on any number of warps: V-trace's 2048-step tiles on 8 warps take 144 registers in it (107 with next values)
# and were slower, 512 x 2048 without truncations 12.7 -> 15.4 µs by the 50-call graph (bench_peers_vtrace_ad197e7.md,
# bench_peers_vtrace_9af10db.md), while the same cell with next values went 14.3 -> 11.7; on 16 warps (below) they
# take 54 registers (sm_90, benchmarks/results/sm90_sass/wide_warps.md) and were faster than 1024-step tiles, so
# the cap is 2048 steps: its 4096-step tiles (WIDE_LONG_MAX_ROWS) are not taken in that mode, unmeasured there.
# Up to WIDE_FEW_WARPS_ROWS rows the kernels of WIDE_TILE_WARPS take, for the tile widths it names, that many warps
# instead of WIDE_WARPS: H200 (benchmarks/results/h200/bench_peers_ab*_af85518.md, one warp per 128 steps against 8
# warps, two runs each, 50-call graph µs): the prefix-sum kernel's 512-step tiles on 4 warps, 512 x 512 traces 2.05 ->
# 1.85, prefix sums 2.04 -> 1.83 (rl-triton 1.96-1.98), but 2048-step ones on 16 slower (512 x 2048 3.29 -> 3.96); GAE's
# 512-step ones on 4, 512 x 512 2.97 -> 2.85 and 2.84 -> 2.78 in its shifted mode, 64 x 512 1.70 -> 1.61 (its 2048-step
# ones level on 16; 512 x 4096, rows of two 2048-step tiles, 13.9 -> 19.6: not taken); V-trace's 2048-step ones on 16,
# 512 x 2048 9.66 -> 8.56, in its shifted mode 11.84 -> 9.02 with those tiles instead of 1024-step ones (its 512-step
# ones on 4 slower in its shifted mode then: 64 x 512 2.05 -> 2.62). With DESCENDING tiles (4 steps per thread)
# V-trace's 512-step ones are faster on 4 (H100, benchmarks/results/h100/ablate_vtrace_descending_a9a083e.md, kernel
# µs: 512 x 512 5.4 -> 5.0, in its shifted mode 5.0 -> 4.6; 64 x 512 2.5 -> 2.4 and 2.5 -> 2.3). retrace_discrete's
# 2048-step ones on 16 (H100, benchmarks/results/h100/ablate_rd_warps_872cbe7/, 50-call graph µs: 512 x 2048 48.8 ->
# 39.4 with truncations, 38.5 -> 30.0 in its shifted mode; sm_90 142 -> 60 registers, 5 -> 1 barriers); on 16 its
# 1024-step ones were mixed (128 x 1024 4.86 -> 4.60, 256 x 1024 in its shifted mode 5.74 -> 6.55), its 512-step ones
# slower (512 x 512 6.56 -> 10.1), and on 4 its 512-step ones faster in its shifted mode only (6.20 -> 5.49; 6.56 ->
# 6.78 with next values): those keep WIDE_WARPS.
# Tried and not taken (bench_peers_rule_2e98857.md): from 512 rows on, 4 warps and tiles half as wide. By the 50-call
# graph (sweep_lookback_wide.md) V-trace 1.1-1.3x faster at 512-1024 rows of 1024-2048 steps (512 x 2048 16.1 ->
# 12.9 µs) and GAE up to 1.2x, but rows just past a tile (T = 1025, 2047: misaligned, one more chunk walked in turn)
# 2.1-3.0x slower at 512-1000 rows (1000 x 1025 15.2 -> 46.3 µs).
WIDE_MAX_ROWS, WIDE_MAX_T, WIDE_WARPS, WIDE_FEW_WARPS_ROWS = 1024, 2048, 8, 512
WIDE_4_WARPS_MAX_T = {"_vtrace_fwd_kernel": 1024}
WIDE_SHIFTED_MAX_T = {"_vtrace_fwd_kernel": 2048}
WIDE_TILE_WARPS = {"_prefix_sum_fwd_kernel": {512: 4}, "_gae_fwd_kernel": {512: 4, 4096: 16},
                   "_td_lambda_fwd_kernel": {512: 4}, "_vtrace_fwd_kernel": {512: 4, 2048: 16},
                   "_retrace_discrete_fwd_kernel": {2048: 16}}
# At most WIDE_LONG_MAX_ROWS[kernel] rows of WIDE_MAX_T + 1 to WIDE_LONG_T steps (2049-4096; from LOOKBACK_MIN_T
# steps only where the look-back does not take the rows) with float32 accumulation: one tile of WIDE_LONG_T steps
# instead of two walked in turn. On their kernel's warps at any number of rows (not 4 above WIDE_FEW_WARPS_ROWS), GAE's
# on 16 (WIDE_TILE_WARPS) but in rows that do not hold their aligned window (T no multiple of 4 and T + 3 past the
# tile: one element per load, ``_aligned_window``), which take WIDE_WARPS. H100, do_bench µs:
# - every row count for GAE, TD(lambda) and the prefix-sum kernel (ablate_full2049_0d9832c.md, against the rule
#   before, which took the tile from 3584 steps above 256 rows): GAE 1000 x 2049 41.0 -> 30.7, 1000 x 3072 39.2 ->
#   32.0, 1024 x 3500 56.0 -> 42.6, 512 x 2560 20.9 -> 18.0 (its shifted mode 23.1 -> 17.3), TD(lambda) 1024 x 3500
#   45.3 -> 30.7, the traces 1000 x 2049 21.6 -> 16.6; every cell faster but the discounted return at 512 x 2049
#   (15.1 -> 15.4). On 4 warps above 512 rows it was slower (ablate_wide4096_38feaf5.md: GAE 1000 x 3072 37.8 ->
#   44.5; ablate_oldlong_d21f78b.md: the traces 1024 x 3600 22.3 -> 25.2).
# - the warps (ablate_oldwarps_1d59d11.md, against 4 warps above 512 rows and GAE's on 8): GAE 1024 x 3584 43.8 ->
#   35.6, 1000 x 4000 in its shifted mode 40.5 -> 34.0, 1024 x 4096 41.3 -> 34.4, 512 x 3584 25.2 -> 20.1; TD(lambda)
#   1024 x 3584 36.2 -> 27.9; the traces 1024 x 4095 35.3 -> 31.1; level at 4095 steps in up to 512 rows, the
#   discounted return 1024 x 4095 32.4 -> 34.2. The 50-call graph (sweep_wide_long_100700f.md, every configuration
#   checked against float64): GAE's shifted mode on 16 warps against 8, 512 x 4096 17.0 -> 14.9, 1024 x 4096 34.2 ->
#   30.2, 16 x 2049 5.5 -> 4.8, but at 4095 steps slower (512 x 4095 20.2 -> 28.3).
# - V-trace (ablate_vtlong_db104d6.md): faster at 16-100 rows (16 x 4095 15.6 -> 12.2, 100 x 4095 18.5 -> 14.8),
#   slower at 256 (256 x 3072 19.8 -> 23.9; its tiles take 156-184 registers), so up to 128 rows.
#   retrace_discrete's 2048-step tiles take 196 registers already.
# Against rl-triton by the 50-call graph (bench_peers_long_{base,oldwarps}_1d59d11.md): GAE 512 x 4096 without
# truncations 17.1 -> 14.9 µs (rl-triton's 13.0), 1024 x 4096 35.7 -> 30.0 (31.3).
WIDE_LONG_T = 4096
WIDE_LONG_MAX_ROWS = {"_gae_fwd_kernel": WIDE_MAX_ROWS, "_td_lambda_fwd_kernel": WIDE_MAX_ROWS,
                      "_prefix_sum_fwd_kernel": WIDE_MAX_ROWS, "_vtrace_fwd_kernel": 128}
# Time-major storage (``[T, N, *F]`` with ``time_dim=0``, rsl_rl's): the rows of a step lie side by side, so tiles a
# few steps wide over many rows read whole lines. Sequences of at most TIME_MAJOR_MAX_T steps whose time dimension
# strides over at least TIME_MAJOR_MIN_ROWS rows (``layout.inner``), for the kernels in TIME_MAJOR_KERNELS: tiles of
# TIME_MAJOR_BLOCK_R rows x TIME_MAJOR_BLOCK_T steps on one warp. H200 (sweep_time_major.md, every configuration
# checked against the float64 torch path), against the tiles below: 65536 x 24 GAE 29.3 -> 17.7 µs, V-trace
# 48.1 -> 23.5 µs; 65536 x 8 GAE 15.1 -> 9.9 µs, V-trace 17.7 -> 12.2 µs. 16384 x 24 (11.5 against 11.9 µs) and
# 4096 x 24 or x 128 are faster with the tiles below; T = 32 and the other kernels were not swept.
TIME_MAJOR_MIN_ROWS, TIME_MAJOR_MAX_T, TIME_MAJOR_BLOCK_R, TIME_MAJOR_BLOCK_T = 65536, 32, 32, 4
TIME_MAJOR_KERNELS = frozenset({"_gae_fwd_kernel", "_vtrace_fwd_kernel"})
# Reverse scans whose one-row tiles hold at least 4 steps per thread hold them in scan order (``chunk``'s
# ``DESCENDING``, where ``launch``'s ``_descending`` finds the rows aligned): each 4-step group one 16-byte access,
# reversed in its thread, and a forward scan, instead of Triton's reverse scan (sm_90 SASS of the kernels, 512 x 2048:
# GAE 560 -> 496 instructions, 172 -> 24 shuffles, 5 -> 1 barriers; the discounted return 464 -> 392;
# benchmarks/results/sm90_sass/descending.md). V-trace reads vs_(t+1) of each group's first step back from its
# stored output (``stored_next_step``; 512 x 2048: 536 -> 448 instructions, 92 -> 12 shuffles).
DESCENDING_KERNELS = frozenset({"_gae_fwd_kernel", "_td_lambda_fwd_kernel", "_vtrace_fwd_kernel"})
# Over aligned windows only in tiles of at most this many steps, per kernel: GAE's windowed 4096-step tiles (16 warps)
# were slower DESCENDING (H100, kernel µs: 512 x 2049 15.6 -> 18.2, 1000 x 2049 27.2 -> 32.9), its 2048-step ones
# faster (1000 x 1025 16.2 -> 13.5), TD(lambda)'s faster in both (512 x 2049 14.0 -> 11.6;
# benchmarks/results/h100/ablate_ascending_windows_5148608.md).
DESCENDING_WINDOW_MAX_T = {"_gae_fwd_kernel": 2048}
# Contiguous rows of at most CONSTANT_MAX_T steps whose length is no multiple of 16 are compiled for their length
# (``_constant_length``): vector loads and stores where Triton would otherwise emit 4-byte ones (sm_90 SASS of GAE:
# 65536 x 24 624 -> 272 instructions, 4096 x 1000 448 -> 272). One compiled kernel per such length; longer
# sequences run in look-back chunks, whose starts are aligned anyway.
CONSTANT_MAX_T = 4096
# Row tiles as aligned windows (``_aligned_window``) for the kernels in WINDOW_KERNELS: contiguous rows of a length T
# that is no multiple of 4 (from SHORT_T + 1 steps, compiled for their length) start off the 16-byte grid, so their
# row tiles load and store one element per instruction through shared-memory layout conversions (sm_90 SASS of GAE
# at 65536 x 2047: 528 instructions, 10 barriers, against 360 and 4 at 2048). A window starts at the 16-byte boundary
# at or before its row and is up to 3 steps longer (``chunk``): taken where that adds no chunk to a row's walk, or
# at most one to a walk of at least WINDOW_MIN_CHUNKS. H200 (benchmarks/results/h200/ablate_windows.md, the kernel
# tests on CUDA passing with windows on), device µs without -> with windows: GAE 65536 x 2047 1525 -> 1003 (2048:
# 724), V-trace 2509 -> 1074 (948), 16384 x 257 V-trace 169 -> 46 (39), 4096 x 4095 GAE 248 -> 142, 16 x 2049 GAE
# 25.4 -> 10.3, 65536 x 23 GAE 19.1 -> 16.7; lengths that are multiples of 4 unchanged. The one loss: the TD(lambda)
# kernel without values (the discounted return) where the window adds a chunk, 8-13% (65536 x 2047 409 -> 464,
# 4096 x 4095 77 -> 84; at 4096 x 1023 26 -> 19 and 16384 x 257 32 -> 23 faster), while TD(lambda) with values
# gains in the same cells (4096 x 4095 144 -> 98). The cliff sweep (bench_peers_cliffs_windows_{off,on}.md, the 234
# judged cells of T <= 51 both runs reached): GAE 10 -> 2 cells over 1.25x their powers of two, the discounted
# return 15 -> 9. A window that adds a chunk to a walk of 2 or 3 chunks is still faster than the row's unaligned
# loads (H100, benchmarks/results/h100/ablate_cliffs_f6d36f4.md, WINDOW_MIN_CHUNKS 4 -> 2, device µs): GAE 16 x 4095
# 36.2 -> 13.7, 512 x 4095 75.5 -> 36.2, 4096 x 255 20.0 -> 15.9, 65536 x 255 200 -> 138; V-trace 65536 x 383
# 700 -> 271, 16384 x 255 126 -> 55; the discounted return 1000 x 4095 71 -> 41; every cell it changes faster, the
# others within 5%. Walks of one chunk (T just under a tile) were not measured, and keep their loads.
WINDOW_KERNELS = KERNELS
WINDOW_MIN_CHUNKS = 2
# Reverse scans of tiles exactly WARP_LOCAL_T steps wide (32 lanes x 4 steps: one warp per row) reverse the tile
# themselves and scan forward (see scan_tile_enter). For narrower tiles Triton's gather first moves the tile into a
# layout of its own through shared memory (16-64 steps: more SASS instructions than its reverse scan), and at 4
# steps per row (one thread) the H200 measured it slower (V-trace 65536 x 8: 9.7 -> 19.4 µs).
WARP_LOCAL_T = tl.constexpr(128)
# The largest element offset a launch computes in int32 (``_int64_offsets``); tests lower it to run the int64 path.
INT32_MAX_OFFSET = 2**31 - 1
# The kernels whose offsets are int32 where they fit: those measured faster with them on the H200
# (``benchmarks/results/h200/ablate_offsets.md``, 2c80245, float32 with truncations at 2^25-2^27 elements: TD(lambda)
# with values 80-86 -> 91-96% of the copy bandwidth, the discounted return (the same kernel without values) level;
# V-trace and GAE level both ways). Retrace, the traces and the prefix sums measured level within noise and stay
# int64 (sm_90 SASS of every kernel both ways: ``benchmarks/results/sm90_sass/int32_offsets.md``).
INT32_KERNELS = frozenset({"_gae_fwd_kernel", "_vtrace_fwd_kernel", "_td_lambda_fwd_kernel"})
# Debugging aid (the tests turn it on): fill every output with NaN before a kernel writes it, so that an element
# the kernel forgets to write cannot pass as a plausible number.
POISON_OUTPUTS = False


@triton.jit
def _affine_combine(a_l, b_l, a_r, b_r):
    # `l` comes first in scan order, `r` after it: apply l, then r. A zero a_r (an episode boundary) makes the map
    # constant, so nothing of `l` may pass it, not even a NaN or inf through 0 * NaN.
    return tl.where(a_r == 0, 0.0, a_r * a_l), tl.where(a_r == 0, b_r, a_r * b_l + b_r)


@triton.jit
def _affine_combine_finite_a(a_l, b_l, a_r, b_r):
    # `_affine_combine` where every a is finite (built from flags and numbers): a zero a_r already gives a_r * a_l = 0,
    # only b needs the cut
    return a_r * a_l, tl.where(a_r == 0, b_r, a_r * b_l + b_r)


@triton.jit
def apply_map(b_a, b_b, b_h):
    """``a * h + b``, where a zero ``a`` cuts off ``h`` entirely (a non-finite ``h`` does not leak through 0 * h)."""
    return tl.where(b_a == 0, b_b, b_a * b_h + b_b)


@triton.jit
def _index(x, INT64: tl.constexpr):
    """``x`` in the offsets' integer type: int64 with ``INT64``, else int32 (every offset of the launch fits)."""
    if INT64:
        return x.to(tl.int64)
    else:
        return x.to(tl.int32)


@triton.jit
def _row_block(n_rows, inner, BLOCK_R: tl.constexpr, INT64: tl.constexpr):
    """Rows of this program: (outer index, inner index, row ids, row mask), all [BLOCK_R], of the offsets' type."""
    o_r = _index(tl.program_id(0), INT64) * BLOCK_R + tl.arange(0, BLOCK_R)
    return o_r // inner, o_r % inner, o_r, o_r < n_rows


@triton.jit
def _chunk_start(i_c, n_chunks, CHUNK_T: tl.constexpr, REVERSE: tl.constexpr, INT64: tl.constexpr):
    """The first time step (of the offsets' type) of the i_c-th chunk of CHUNK_T steps visited in scan order."""
    if REVERSE:
        t0 = (n_chunks - 1 - i_c) * CHUNK_T
    else:
        t0 = i_c * CHUNK_T
    return _index(t0, INT64)


@triton.jit
def _chunk_time(i_c, n_chunks, T, BLOCK_T: tl.constexpr, REVERSE: tl.constexpr, INT64: tl.constexpr):
    """Time indices [BLOCK_T] (of the offsets' type) and their mask of the i_c-th chunk visited in scan order."""
    o_t = _chunk_start(i_c, n_chunks, BLOCK_T, REVERSE, INT64) + tl.arange(0, BLOCK_T)
    return o_t, o_t < T


@triton.jit
def row_prologue(h0_ptr, lb_ptr, n_rows, inner, T, ACC: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr,
                 HAS_INITIAL_STATE: tl.constexpr, LOOKBACK: tl.constexpr, WINDOW: tl.constexpr, INT64: tl.constexpr,
                 ONE_CHUNK: tl.constexpr):
    """Start of every scan kernel: this program's rows, the state entering them, and its chunks.

    Returns (outer index, inner index, row ids, row mask) [BLOCK_R] (int64 with ``INT64``, else int32), the state
    [BLOCK_R], n_chunks (per row) and the range ``[c_lo, c_hi)`` of chunks (in scan order) this program walks: all
    of them, or with ``LOOKBACK`` the one chunk of its ticket (see ``chain_state``), whose ``BLOCK_R`` tile rows are
    all the same row. ``ONE_CHUNK`` (``launch``'s ``_one_chunk``: rows of one chunk, no look-back): the range is the
    constant [0, 1), so that the compiler drops the chunk loop.
    """
    if LOOKBACK:
        # a chunk is BLOCK_R consecutive segments of BLOCK_T steps of one row (the tile's rows: see ``chunk``)
        n_chunks = (T + BLOCK_R * BLOCK_T - 1) // (BLOCK_R * BLOCK_T)
        # tickets in the order programs start: a chunk's predecessors in its row hold smaller tickets, so they are
        # already running when it waits for them (program ids give no such order)
        row, c_lo = ticket_chunk(_index(tl.atomic_add(lb_ptr, 1), INT64), n_rows, n_chunks)
        o_r = row + tl.zeros([BLOCK_R], dtype=row.dtype)
        c_hi = c_lo + 1
        o_o, o_i, m_r = o_r // inner, o_r % inner, o_r < n_rows
    else:
        o_o, o_i, o_r, m_r = _row_block(n_rows, inner, BLOCK_R, INT64)
        c_lo = 0
        if ONE_CHUNK:
            n_chunks = 1
        else:
            n_chunks = (T + 3 * WINDOW + BLOCK_T - 1) // BLOCK_T
        c_hi = n_chunks
    b_h = load_state(h0_ptr, o_r, m_r, ACC, BLOCK_R, HAS_INITIAL_STATE)
    return o_o, o_i, o_r, m_r, b_h, n_chunks, c_lo, c_hi


@triton.jit
def ticket_chunk(ticket, n_rows, n_chunks):
    """The (row, chunk in scan order) of a look-back ticket: tickets go to the rows in turn, so that the chunks in
    flight at once spread over the rows and a chunk's look-back finds a predecessor that knows its leaving state
    within fewer windows (``chain_state``). A chunk's predecessors in its row hold smaller tickets, as they must.
    H200 (benchmarks/results/h200/ablate_lookback.md), 16 x 2^20, against a row's chunks one after another: every
    kernel 23-49% -> 37-60% of the copy bandwidth (GAE 173 -> 144 µs, traces 149 -> 94 µs)."""
    return ticket % n_rows, ticket // n_rows


@triton.jit
def chunk(i_c, n_chunks, T, o_o, m_r, BLOCK_T: tl.constexpr, REVERSE: tl.constexpr, LOOKBACK: tl.constexpr,
          WINDOW: tl.constexpr, INT64: tl.constexpr, DESCENDING: tl.constexpr = False):
    """The i_c-th chunk in scan order: time indices (of the offsets' type), the tile mask [BLOCK_R, BLOCK_T] and the
    tile's window ``w`` for ``load_tile`` and ``store_tile``.

    The time indices are [1, BLOCK_T], the same steps in every row of the tile; with ``LOOKBACK`` they are
    [BLOCK_R, BLOCK_T]: the chunk is ``BLOCK_R * BLOCK_T`` steps of one row, tile row k its k-th segment of
    ``BLOCK_T`` steps (time ascends along each segment and from one segment to the next).

    With ``WINDOW`` (rows of a compile-time length T that is no multiple of 4, stored contiguously: ``launch``'s
    ``_aligned_window``) each tile row is a window of its row that starts at the 16-byte boundary at or before the
    row's first element (its element offset rounded down to a multiple of 4), so the time indices are
    [BLOCK_R, BLOCK_T], the row's own steps (negative, or from T on, in the columns outside the row). The window
    ``w`` holds the rounded row offsets and the columns, from which ``_tile_ptrs`` builds pointers that Triton's
    axis analysis proves 16-byte aligned, and a mask per 4-element group (constant over each group, so that the
    loads can be vector loads). Without ``WINDOW`` it is ``(m,)``, which the loads and stores ignore. (Whether a
    chunk has a window is the tuple's length: a constexpr inside a tuple a JIT function returns reaches the caller as
    a tensor, so it could not tell them apart at compile time.)

    With ``DESCENDING`` (a reverse scan's one-row tiles: ``launch``'s ``_descending``) the tile holds the chunk in
    scan order, time descending along it: o_t [1, BLOCK_T] from the chunk's last step down, and ``w`` the time
    indices of the chunk's 4-step groups [BLOCK_T // 4, 4] (ascending within each group) with their mask, through
    which ``load_tile`` and ``store_tile`` move the tile in 16-byte accesses and reverse each group within its thread
    (``_ungroup``, ``_group``); with ``WINDOW`` too, the groups of the row's window (``w``: also the window's start,
    columns and load mask). The scan is then a forward one (``scan_tile`` with ``REVERSE`` off): no reversal
    across lanes (Triton's reverse scan: five butterfly shuffles per element and value), and no gather.
    """
    if LOOKBACK:
        BLOCK_R: tl.constexpr = m_r.shape[0]
        o_t = (_chunk_start(i_c, n_chunks, BLOCK_R * BLOCK_T, REVERSE, INT64)
               + (tl.arange(0, BLOCK_R) * BLOCK_T)[:, None] + tl.arange(0, BLOCK_T)[None, :])
        m = m_r[:, None] & (o_t < T)
        w = (m,)
    elif DESCENDING:
        c_end = _chunk_start(i_c, n_chunks, BLOCK_T, REVERSE, INT64) + BLOCK_T  # the column after the chunk
        c4 = (c_end - 4 - 4 * tl.arange(0, BLOCK_T // 4))[:, None] + tl.arange(0, 4)[None, :]  # [BLOCK_T // 4, 4]
        o_c = (c_end - 1 - tl.arange(0, BLOCK_T))[None, :]  # [1, BLOCK_T] the columns in scan order
        if WINDOW:  # the columns of the row's window (see below), its steps t = column - shift
            a_o, shift = _window_start(o_o, T)
            shift = shift[:, None]  # [1, 1]
            o_t = o_c - shift
            t4 = c4 - shift
            m = m_r[:, None] & (o_t >= 0) & (o_t < T)
            m_ld = m_r[:, None] & (c4 < (shift + T + 3) // 4 * 4)
            w = (t4, m_r[:, None] & (t4 >= 0) & (t4 < T), a_o, c4, m_ld)
        else:
            o_t = o_c
            m = m_r[:, None] & (o_t < T)
            w = (c4, m_r[:, None] & (c4 < T))
    elif WINDOW:
        o_c = _chunk_start(i_c, n_chunks, BLOCK_T, REVERSE, INT64) + tl.arange(0, BLOCK_T)  # [BLOCK_T] columns
        a_o, shift = _window_start(o_o, T)
        o_t = o_c[None, :] - shift[:, None]
        m = m_r[:, None] & (o_t >= 0) & (o_t < T)
        # the columns whose 4-group holds a step of the row (the rest of such a group: the neighbouring rows)
        m_ld = m_r[:, None] & (o_c[None, :] < ((shift + T + 3) // 4 * 4)[:, None])
        w = (a_o, o_c, m_ld)
    else:
        o_t_1d, m_t = _chunk_time(i_c, n_chunks, T, BLOCK_T, REVERSE, INT64)
        o_t = o_t_1d[None, :]
        m = m_r[:, None] & m_t[None, :]
        w = (m,)
    return o_t, m, w


@triton.jit
def _window_start(o_o, T):
    """[BLOCK_R] each row's aligned window start, the 16-byte boundary at or before the row (in this form,
    provably), and the row's first step's column in it (0-3)."""
    a_o = o_o * T // 4 * 4
    return a_o, o_o * T - a_o


@triton.jit
def store_state(ht_ptr, b_h, o_r, m_r, c_hi, n_chunks, STORE_FINAL_STATE: tl.constexpr):
    """End of every scan kernel: the final state ``b_h`` [BLOCK_R] (the state leaving the sequence, or what a kernel
    derives from it) of the rows ``m_r``, if asked for, by the program of the last chunk.

    The mask is a bool block on every Triton: a bool block ``&`` a scalar comparison is an int32 mask in Triton
    3.9's interpreter, which refuses it. (The compiled kernels are the same as with the scalar comparison, sm_90
    SASS included; a scalar ``if`` around the store instead cost up to 48 more instructions in the look-back mode.)
    """
    if STORE_FINAL_STATE:
        m_last = (tl.zeros_like(o_r) + c_hi) == n_chunks  # [BLOCK_R]
        tl.store(ht_ptr + o_r, b_h, mask=m_r & m_last)


@triton.jit
def _tile_ptrs(base, o_o, o_i, o_t, s_o, s_t, s_i, w=None):
    """Pointers [BLOCK_R, BLOCK_T] of a tensor viewed as (outer, T, inner) with strides (s_o, s_t, s_i); o_t is
    [1, BLOCK_T] or [BLOCK_R, BLOCK_T] (``chunk``). With the window ``w`` of a ``WINDOW`` chunk, a tensor stepping
    along time (in such a launch every such tensor has the layout's contiguous strides ``(T, 1, 1)``, compile-time
    constants; the rest are broadcast along time, ``s_t`` 0) is addressed as the window's aligned row start plus its
    column: the same elements, in the form Triton proves aligned."""
    if w is None:
        return base + (o_o * s_o + o_i * s_i)[:, None] + o_t * s_t
    elif len(w) == 2:  # a DESCENDING chunk's 4-step groups [BLOCK_T // 4, 4] of its one row
        return base + (o_o * s_o + o_i * s_i)[:, None] + w[0] * s_t
    elif len(w) == 5:  # the same over an aligned window
        if s_t == 1:
            return base + w[2][:, None] + w[3]
        else:
            return base + (o_o * s_o + o_i * s_i)[:, None] + w[0] * s_t
    elif len(w) == 3 and s_t == 1:
        a_o, o_c, _ = w
        return base + a_o[:, None] + o_c[None, :]
    else:
        return base + (o_o * s_o + o_i * s_i)[:, None] + o_t * s_t


@triton.jit
def load_tile(base, o_o, o_i, o_t, s_o, s_t, s_i, m, ACC: tl.constexpr, w=None):
    """Loads a [BLOCK_R, BLOCK_T] tile of any dtype (bool flags included) as ACC; masked elements read 0.

    ``w``: the chunk's window (``chunk``), given for the loads of the chunk's own steps o_t. A tensor that
    ``_tile_ptrs`` addresses through it is loaded in whole 4-element groups (vector loads), and the elements of a
    group outside the mask ``m`` (the neighbouring rows') are zeroed after the load."""
    if w is not None:
        if len(w) == 3:
            if s_t == 1:
                _, _, m_ld = w
                b_x = tl.load(_tile_ptrs(base, o_o, o_i, o_t, s_o, s_t, s_i, w), mask=m_ld, other=0).to(ACC)
                return tl.where(m, b_x, 0)
        if len(w) == 5 and s_t == 1:  # whole groups of a window (vector loads), steps outside the row zeroed after
            b_x = tl.load(_tile_ptrs(base, o_o, o_i, o_t, s_o, s_t, s_i, w), mask=w[4], other=0).to(ACC)
            return _ungroup(tl.where(w[1], b_x, 0))
        if len(w) == 2 or len(w) == 5:
            return _ungroup(tl.load(_tile_ptrs(base, o_o, o_i, o_t, s_o, s_t, s_i, w), mask=w[1], other=0).to(ACC))
    return tl.load(_tile_ptrs(base, o_o, o_i, o_t, s_o, s_t, s_i), mask=m, other=0).to(ACC)


@triton.jit
def load_row(base, o_o, o_i, s_o, s_i, m_r, ACC: tl.constexpr):
    """Loads one value per row [BLOCK_R] as ACC of a tensor viewed as (outer, inner) with strides (s_o, s_i) (a
    tensor without the time dimension); masked rows read 0."""
    return tl.load(base + o_o * s_o + o_i * s_i, mask=m_r, other=0).to(ACC)


@triton.jit
def load_index(base, o_o, o_i, o_t, s_o, s_t, s_i, m):
    """Loads a [BLOCK_R, BLOCK_T] tile of integer indices as int64; masked elements read 0."""
    return tl.load(_tile_ptrs(base, o_o, o_i, o_t, s_o, s_t, s_i), mask=m, other=0).to(tl.int64)


@triton.jit
def load_gather(base, b_idx, s_a, o_o, o_i, o_t, s_o, s_t, s_i, m, ACC: tl.constexpr):
    """Loads ``x[..., b_idx]`` as ACC, a [BLOCK_R, BLOCK_T] tile of a tensor with one more (last) dimension of
    stride ``s_a``, ``base`` pointing at its entry 0 and ``s_o, s_t, s_i`` the strides of that entry's view; masked
    elements read 0."""
    return tl.load(_tile_ptrs(base, o_o, o_i, o_t, s_o, s_t, s_i) + b_idx * s_a, mask=m, other=0).to(ACC)


@triton.jit
def load_coef(base, value, o_o, o_i, o_t, s_o, s_t, s_i, m, ACC: tl.constexpr, IS_TENSOR: tl.constexpr):
    """A coefficient such as gamma: a tile of a tensor if IS_TENSOR, else the scalar ``value``."""
    if IS_TENSOR:
        return load_tile(base, o_o, o_i, o_t, s_o, s_t, s_i, m, ACC)
    else:
        return value


@triton.jit
def store_tile(base, b_x, o_o, o_i, o_t, T, inner, m, w=None):
    """Stores a tile into a contiguous output of shape (outer, T, inner), casting to its dtype; ``w`` as for
    ``load_tile`` (the stores keep the exact mask: the rest of a group belongs to the neighbouring rows)."""
    if w is not None:
        if len(w) == 2 or len(w) == 5:
            b_x = _group(b_x)
            m = w[1]
    tl.store(_tile_ptrs(base, o_o, o_i, o_t, T * inner, inner, 1, w), b_x.to(base.dtype.element_ty), mask=m)


@triton.jit
def _columns4(x):
    """The four columns [K] of a [K, 4] tile: register renaming where a thread holds each row (as the 16-byte
    accesses of a ``DESCENDING`` chunk's groups lay them out)."""
    e, o = tl.split(tl.reshape(x, [x.shape[0], 2, 2]))  # e[:, p] = x[:, 2p], o[:, p] = x[:, 2p + 1]
    x0, x2 = tl.split(e)
    x1, x3 = tl.split(o)
    return x0, x1, x2, x3


@triton.jit
def _join4(x0, x1, x2, x3):
    """The [K, 4] tile of four columns [K]."""
    return tl.reshape(tl.join(tl.join(x0, x2), tl.join(x1, x3)), [x0.shape[0], 4])


@triton.jit
def _reverse4(x):
    """[K, 4] with each row's 4 elements in reverse order."""
    x0, x1, x2, x3 = _columns4(x)
    return _join4(x3, x2, x1, x0)


@triton.jit
def _ungroup(x):
    """A ``DESCENDING`` chunk's groups [BLOCK_T // 4, 4], as loaded (time ascending within each), as the tile
    [1, BLOCK_T] in scan order."""
    return tl.reshape(_reverse4(x), [1, x.shape[0] * 4])


@triton.jit
def _group(b_x):
    """The inverse of ``_ungroup``: a tile [1, BLOCK_T] in scan order as its groups, time ascending within each."""
    return _reverse4(tl.reshape(b_x, [b_x.shape[1] // 4, 4]))


@triton.jit
def load_not_flags(d_ptr, term_ptr, o_o, o_i, o_t, s_d_o, s_d_t, s_d_i, s_term_o, s_term_t, s_term_i, m,
                   ACC: tl.constexpr, SAME_FLAGS: tl.constexpr, w=None):
    """(1 - done, 1 - terminated) tiles as ACC; with ``SAME_FLAGS`` one tensor is both and is read once."""
    b_nd = 1.0 - load_tile(d_ptr, o_o, o_i, o_t, s_d_o, s_d_t, s_d_i, m, ACC, w)
    if SAME_FLAGS:
        b_nterm = b_nd
    else:
        b_nterm = 1.0 - load_tile(term_ptr, o_o, o_i, o_t, s_term_o, s_term_t, s_term_i, m, ACC, w)
    return b_nd, b_nterm


@triton.jit
def load_state(h0_ptr, o_r, m_r, ACC: tl.constexpr, BLOCK_R: tl.constexpr, HAS_INITIAL_STATE: tl.constexpr):
    """The state [BLOCK_R] entering the sequence: loaded, or zero."""
    if HAS_INITIAL_STATE:
        return tl.load(h0_ptr + o_r, mask=m_r, other=0.0).to(ACC)
    else:
        return tl.zeros([BLOCK_R], dtype=ACC)


@triton.jit
def zero_where(b_x, b_cut):
    """``b_x`` with zeros where ``b_cut``: values that must not be read, not even as 0 * NaN. A select after a full
    load, not a masked load, so that the load does not wait for the flag it depends on."""
    return tl.where(b_cut, 0.0, b_x)


@triton.jit
def edge_column(b_h, REVERSE: tl.constexpr):
    """The column [BLOCK_R] of a tile that is last in scan order: column 0 if REVERSE, else the last one."""
    o_c = tl.arange(0, b_h.shape[1])
    if REVERSE:
        m_last = o_c == 0
    else:
        m_last = o_c == b_h.shape[1] - 1
    return tl.sum(tl.where(m_last[None, :], b_h, 0.0), axis=1)


@triton.jit
def next_column(b_x, b_last, DESCENDING: tl.constexpr = False):
    """The tile one step on along time: column j holds column j + 1 of ``b_x``, the last column ``b_last``
    [BLOCK_R] (what follows the tile). A gather within the tile, which stays in the warp where a row does. With
    ``DESCENDING`` (a tile in scan order, time descending: ``chunk``) column j holds column j - 1, column 0
    ``b_last``."""
    n: tl.constexpr = b_x.shape[1]
    o_c = tl.arange(0, n)
    if DESCENDING:
        o_on = tl.maximum(o_c - 1, 0)
        o_edge: tl.constexpr = 0
    else:
        o_on = tl.minimum(o_c + 1, n - 1)
        o_edge: tl.constexpr = n - 1
    b_next = tl.gather(b_x, tl.broadcast_to(o_on[None, :], b_x.shape), 1)
    return tl.where((o_c == o_edge)[None, :], b_last[:, None], b_next)


@triton.jit
def load_next_step(base, b_x, b_x_after, o_o, o_i, o_t, s_o, s_t, s_i, m, T, ACC: tl.constexpr,
                   IN_TILE: tl.constexpr, LOOKBACK: tl.constexpr, OWN_LOAD: tl.constexpr = False, w=None):
    """A reverse scan's tile ``b_x`` one step on along time [BLOCK_R, BLOCK_T] (0 at t = T - 1), and the
    ``b_x_after`` [BLOCK_R] of the next chunk in scan order (the chunk before this one in time).

    With ``IN_TILE`` (the launch's batch-major rows of several chunks; taken in row tiles of ``WARP_LOCAL_T`` steps,
    one warp per row, without ``LOOKBACK``): from the tile itself one column on (a gather within the warp), its last
    column ``b_x_after``, the first column of the chunk after it in time, visited just before (zeros before the
    first chunk in scan order: the column past T). Else a second load one element on, off the first's alignment:
    rows of one chunk (whose tile is in L1 already: H200, GAE at 4096-65536 x 128, the gather 9-14% slower), the
    look-back chunks, and tiles whose rows span several warps or share one (the gather goes through shared memory:
    sm_90 SASS of GAE at 16384 x 64, 344 -> 504 instructions). In rows of several chunks, sm_90 SASS at 65536 x 2048:
    GAE's shifted mode 528 -> 424 instructions, V-trace 672 -> 512; H200, 4096 x 512: GAE 10.0 -> 7.9 µs, V-trace
    20.4 -> 19.0 (benchmarks/results/h200/bench_peers_vtrace_fbd8185.md).

    ``OWN_LOAD``: in tiles whose rows span several warps, the second load in a form of its own (the tile's pointers
    off ``base`` one step on), which the compiler does not merge with another ``load_next_step`` of the tile.
    V-trace's shifted mode reads the values one step on both before its scan and after its gather (through shared
    memory in such tiles): one load serving both drew the tile's arithmetic into the gather's layout (sm_90 at
    512 x 512, one row per program: 64 -> 163 registers, 13 -> 39 barriers, 80 and 13 with its own load; H100
    512 x 2048 17.7 -> 35 µs, benchmarks/results/h100/bench_peers_vtrace_7bee9fb.md).

    ``w``: the chunk's window. A ``DESCENDING`` chunk (``chunk``) takes three of each 4-step group's next values
    from the group itself and the fourth, the first value of the group after it, in one 4-byte load per group.
    """
    if w is not None:
        if len(w) == 2 or len(w) == 5:
            return _next_in_groups(base, b_x, o_o, o_i, s_o, s_t, s_i, T, ACC, w), b_x_after
    if IN_TILE and (not LOOKBACK) and b_x.shape[1] == WARP_LOCAL_T:
        b_next = next_column(b_x, b_x_after)
        b_x_after = edge_column(b_x, True)
    elif OWN_LOAD and b_x.shape[1] > WARP_LOCAL_T:
        b_next = load_tile(base + s_t, o_o, o_i, o_t, s_o, s_t, s_i, m & (o_t + 1 < T), ACC)
    else:
        b_next = load_tile(base, o_o, o_i, o_t + 1, s_o, s_t, s_i, m & (o_t + 1 < T), ACC)
    return b_next, b_x_after


@triton.jit
def _next_in_groups(base, b_x, o_o, o_i, s_o, s_t, s_i, T, ACC: tl.constexpr, w):
    """``load_next_step`` of a ``DESCENDING`` chunk: the tile [1, BLOCK_T] (scan order) one step on along time."""
    x0, x1, x2, _ = _columns4(tl.reshape(b_x, [b_x.shape[1] // 4, 4]))  # scan order: x0 each group's last step
    t_first, _, _, _ = _columns4(w[0])  # [BLOCK_T // 4] each group's first step (the groups ascend in time)
    _, _, _, m_last = _columns4(w[1])  # its last step is one of the row's
    t_on = t_first + 4  # the first step of the group after it
    x_on = tl.load(base + o_o * s_o + o_i * s_i + t_on * s_t, mask=m_last & (t_on < T), other=0).to(ACC)
    return tl.reshape(_join4(x_on, x0, x1, x2), [1, b_x.shape[1]])


@triton.jit
def stored_next_step(base, b_x, o_o, o_i, o_t, T, inner, m, ACC: tl.constexpr, w=None):
    """An output tile ``b_x`` that this program has just stored (``store_tile``), read back one step on along time
    [BLOCK_R, BLOCK_T] as ACC (0 at t = T - 1), after a barrier that makes every thread's stores visible to all.

    For a reverse scan's tiles whose rows span several warps, where the gather one column on (``next_column``)
    converts the tile's layout through shared memory: the chunk after this one in time was stored by this same
    program, before this one, so every step t + 1 < T is there. Not for look-back chunks (another program stores
    the chunk after). Exact where the output's dtype is ACC. A ``DESCENDING`` chunk (``w``) takes three of each
    4-step group's values from ``b_x`` and reads back only the fourth (``_next_in_groups``).
    """
    tl.debug_barrier()
    if w is not None:
        if len(w) == 2 or len(w) == 5:
            return _next_in_groups(base, b_x, o_o, o_i, T * inner, inner, 1, T, ACC, w)
    return tl.load(_tile_ptrs(base, o_o, o_i, o_t + 1, T * inner, inner, 1), mask=m & (o_t + 1 < T), other=0).to(ACC)


@triton.jit
def last_step_value(b_next, last_ptr, o_o, o_i, o_t, s_o, s_i, m_r, T, ACC: tl.constexpr):
    """The shifted input mode's :math:`V(s_{t+1})` [BLOCK_R, BLOCK_T]: ``b_next`` (the values one step on, from
    ``load_next_step``) but at t = T - 1, where it is the last value ``[*B, *F]`` at ``last_ptr`` (read once per
    row; ``next_value_input`` passes it as a tensor of the inputs' shape with time stride 0)."""
    b_last = load_row(last_ptr, o_o, o_i, s_o, s_i, m_r, ACC)  # [BLOCK_R]
    return tl.where(o_t == T - 1, b_last[:, None], b_next)


@triton.jit
def _pack(b_x, FLAG: tl.constexpr):
    """A float32 with a nonzero flag in the high half of one int64 word: written and read in one access, a word
    is either still zero or complete."""
    return (b_x.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF) | (FLAG << 32)


@triton.jit
def _unpack(w):
    return (w & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def chain_state(lb_ptr, row, i_c, n_chunks, b_A, b_B, b_h0, LOOKBACK_WINDOW: tl.constexpr,
                SPARSE: tl.constexpr):
    """The state entering chunk ``i_c`` (scan order) of ``row`` when every chunk has its own program
    (a single-pass scan with decoupled look-back).

    Each chunk publishes its aggregate map (``b_A``, ``b_B``: the composition of its steps) as soon as it has it,
    and, once it knows the state entering it, the state leaving it (``inclusive``). A chunk then looks back over
    ``LOOKBACK_WINDOW`` predecessors at once: the nearest one with its leaving state known, composed with the
    aggregates of the chunks after it, gives the entering state; if a predecessor in the window has published
    nothing yet, it reads the window again. The first chunk of a row enters with ``b_h0``.
    Status words (one int64 each, ``_pack``): ``lb_ptr[1 + 3 * slot + k]``, k = 0 (A), 1 (B), 2 (leaving state),
    slot = row * n_chunks + chunk; ``lb_ptr[0]`` is the ticket counter. ``SPARSE``: only every third chunk
    publishes its leaving state (a testing aid, see ``LOOKBACK_WINDOW``). Returns the entering state (scalar).
    """
    p_slot = lb_ptr + 1 + 3 * (row * n_chunks + i_c)
    b_enter = b_h0
    if i_c > 0:
        tl.store(p_slot, _pack(b_A, 1))
        tl.store(p_slot + 1, _pack(b_B, 1))
        o_w = tl.arange(0, LOOKBACK_WINDOW)
        acc_a = tl.zeros_like(b_A) + 1.0  # the composition of the chunks between the window and this one
        acc_b = tl.zeros_like(b_B)
        j_hi = tl.zeros([], tl.int64) + i_c  # the window is the chunks [j_hi - LOOKBACK_WINDOW, j_hi)
        resolved = tl.zeros([], tl.int32)
        while resolved == 0:
            o_j = j_hi - LOOKBACK_WINDOW + o_w  # [LOOKBACK_WINDOW] chunks, ascending in scan order
            m_j = o_j >= 0
            p_j = lb_ptr + 1 + 3 * (row * n_chunks + o_j)
            w_a = tl.load(p_j, mask=m_j, other=0, volatile=True)
            w_b = tl.load(p_j + 1, mask=m_j, other=0, volatile=True)
            w_h = tl.load(p_j + 2, mask=m_j, other=0, volatile=True)
            i_last = tl.max(tl.where(w_h != 0, o_w, -1), axis=0)  # the nearest chunk whose leaving state is known
            m_after = m_j & (o_w > i_last)
            n_missing = tl.sum((m_after & ((w_a == 0) | (w_b == 0))).to(tl.int32), axis=0)
            # ready: every aggregate after it published, and some leaving state found unless the window goes on
            if (n_missing == 0) & ((i_last >= 0) | (j_hi > LOOKBACK_WINDOW)):
                b_wa, b_wb = tl.associative_scan((tl.where(m_after, _unpack(w_a), 1.0),
                                                  tl.where(m_after, _unpack(w_b), 0.0)), 0, _affine_combine)
                m_end = o_w == LOOKBACK_WINDOW - 1
                acc_a, acc_b = _affine_combine(tl.sum(tl.where(m_end, b_wa, 0.0), axis=0),
                                               tl.sum(tl.where(m_end, b_wb, 0.0), axis=0), acc_a, acc_b)
                if i_last >= 0:
                    b_known = _unpack(tl.sum(tl.where(o_w == i_last, w_h, 0), axis=0))
                    b_enter = apply_map(acc_a, acc_b, b_known)
                    resolved += 1
                else:
                    j_hi -= LOOKBACK_WINDOW
    if (not SPARSE) or (i_c % 3 == 0):
        tl.store(p_slot + 2, _pack(apply_map(b_A, b_B, b_enter), 2))
    return b_enter


@triton.jit
def _reverse_columns(b_x):
    """The tile with its columns in reverse order (a gather along the time axis)."""
    o_c = b_x.shape[1] - 1 - tl.arange(0, b_x.shape[1])
    return tl.gather(b_x, tl.broadcast_to(o_c[None, :], b_x.shape), 1)


@triton.jit
def scan_tile_enter(b_a, b_b, b_h0, m, REVERSE: tl.constexpr, CUT_A: tl.constexpr, lb_ptr, o_r, i_c, n_chunks,
                    LOOKBACK: tl.constexpr, STORE_FINAL_STATE: tl.constexpr):
    """Scans one [BLOCK_R, BLOCK_T] tile of coefficients, entering with state b_h0 [BLOCK_R].

    Masked elements act as the identity (a = 1, b = 0), so a partial tile passes the state through. ``CUT_A``:
    some a may be non-finite (else the cheaper combine). With ``LOOKBACK`` (one program per chunk, the tile's rows
    the chunk's consecutive segments: ``chunk``) the state entering the chunk comes from the chunks before this one
    (``chain_state``; ``LOOKBACK`` is the window, negative in the testing mode) and each segment enters with the
    state leaving the one before it (``_enter_segments``); b_h0 is then the row's initial state.
    Returns the states h [BLOCK_R, BLOCK_T], the state leaving the tile (with ``LOOKBACK``: leaving the chunk, in
    every row) and the state entering each row [BLOCK_R]. The state leaving is computed only where it is read: when
    this program walks a chunk after this one, or with ``STORE_FINAL_STATE`` (else it is b_h0).
    """
    b_a = tl.where(m, b_a, 1.0)
    b_b = tl.where(m, b_b, 0.0)
    # Triton's reverse scan reverses its two inputs and two outputs across lanes, each with five butterfly shuffles
    # per element; a tile whose rows each fill one warp is reversed here instead, with a gather that stays in the
    # warp, and scanned forward: a third fewer instructions per element (H200, 65536 x 512: GAE 83% -> 91% of the
    # copy bandwidth, discounted return 50% -> 82%; benchmarks/results/h200/ablate_kernels.md)
    # (also 2 * WARP_LOCAL_T-step tiles of several rows: 8 steps per lane, a 16-byte load of 16-bit values)
    FLIP: tl.constexpr = REVERSE and (b_a.shape[1] == WARP_LOCAL_T
                                      or (b_a.shape[1] == 2 * WARP_LOCAL_T and b_a.shape[0] > 1))
    SCAN_REVERSE: tl.constexpr = REVERSE and not FLIP  # the columns' order after the flip, if any
    if FLIP:
        b_a = _reverse_columns(b_a)
        b_b = _reverse_columns(b_b)
    if CUT_A:
        b_A, b_B = tl.associative_scan((b_a, b_b), 1, _affine_combine, reverse=SCAN_REVERSE)
    else:
        b_A, b_B = tl.associative_scan((b_a, b_b), 1, _affine_combine_finite_a, reverse=SCAN_REVERSE)
    if LOOKBACK:
        b_h0 = _enter_segments(b_A, b_B, b_h0, REVERSE, SCAN_REVERSE, CUT_A, lb_ptr, o_r, i_c, n_chunks, LOOKBACK)
    b_h = apply_map(b_A, b_B, b_h0[:, None])
    # The state leaving the tile, a reduction over it (across warps, two barriers where a row spans several), which
    # a call's last chunk skips unless the final state is stored: a uniform branch, taken by every chunk but the
    # last. sm_90 SASS of the traces at 64 x 512 (8 warps): its shuffles, barriers and shared-memory round trips sat
    # between the scan and the stores. Not in flipped tiles (one warp per row), whose reduction, five shuffles in
    # the warp, overlaps the gathers that flip the tile back; the branch before them made GAE slower there (H100,
    # benchmarks/results/h100/ablate_exitall_a911ce8.md, kernel µs: 512 x 128 3.4 -> 4.3, 65536 x 128 64.6 -> 68.2),
    # while the forward scans of such tiles gained (the traces 512 x 128 2.6 -> 2.1, 65536 x 128 28.7 -> 27.5).
    b_exit = b_h0
    if STORE_FINAL_STATE or FLIP:
        b_exit = _leaving_state(b_h, REVERSE, SCAN_REVERSE, LOOKBACK)
    elif not LOOKBACK:  # a look-back chunk is its program's only one
        if i_c + 1 < n_chunks:
            b_exit = _leaving_state(b_h, REVERSE, SCAN_REVERSE, LOOKBACK)
    if FLIP:
        b_h = _reverse_columns(b_h)
    return b_h, b_exit, b_h0


@triton.jit
def _leaving_state(b_h, REVERSE: tl.constexpr, SCAN_REVERSE: tl.constexpr, LOOKBACK: tl.constexpr):
    """The state [BLOCK_R] leaving a scanned tile h (columns in ``SCAN_REVERSE`` order); with ``LOOKBACK`` the state
    leaving the chunk (its first segment in scan order), in every row."""
    b_exit = edge_column(b_h, SCAN_REVERSE)
    if LOOKBACK:
        b_exit = tl.zeros_like(b_exit) + _pick(b_exit, 0 if REVERSE else b_exit.shape[0] - 1)
    return b_exit


@triton.jit
def _pick(b_x, i):
    """Element ``i`` of a vector, as a scalar."""
    return tl.sum(tl.where(tl.arange(0, b_x.shape[0]) == i, b_x, 0), axis=0)


@triton.jit
def _enter_segments(b_A, b_B, b_h0, REVERSE: tl.constexpr, SCAN_REVERSE: tl.constexpr, CUT_A: tl.constexpr, lb_ptr,
                    o_r, i_c, n_chunks, LOOKBACK: tl.constexpr):
    """The state [BLOCK_R] entering each segment (tile row) of a look-back chunk, from the tile's scanned maps.

    The segments' maps, composed in scan order (a scan across the tile's rows), give the chunk's map, which
    ``chain_state`` publishes and combines with its predecessors' into the state entering the chunk; each segment
    enters with the state leaving the segment before it in scan order. ``b_h0``: the row's initial state.
    """
    BLOCK_R: tl.constexpr = b_A.shape[0]
    s_A = edge_column(b_A, SCAN_REVERSE)  # [BLOCK_R] the map of each segment
    s_B = edge_column(b_B, SCAN_REVERSE)
    if BLOCK_R > 1:  # [BLOCK_R] the maps of the segments up to each one, in scan order
        if CUT_A:
            s_A, s_B = tl.associative_scan((s_A, s_B), 0, _affine_combine, reverse=REVERSE)
        else:
            s_A, s_B = tl.associative_scan((s_A, s_B), 0, _affine_combine_finite_a, reverse=REVERSE)
    I_LAST: tl.constexpr = 0 if REVERSE else BLOCK_R - 1  # the segment last in scan order
    b_enter = chain_state(lb_ptr, _pick(o_r, 0), i_c, n_chunks, _pick(s_A, I_LAST), _pick(s_B, I_LAST),
                          _pick(b_h0, 0), LOOKBACK if LOOKBACK > 0 else -LOOKBACK, LOOKBACK < 0)
    return segment_states(s_A, s_B, b_enter, REVERSE)


@triton.jit
def segment_states(s_A, s_B, b_enter, REVERSE: tl.constexpr):
    """The state [BLOCK_R] entering each of consecutive segments of one row (time ascending with the index), from
    ``s_A, s_B`` [BLOCK_R], the maps of the segments up to each one in scan order, and ``b_enter`` (scalar), the
    state entering the first segment in scan order."""
    BLOCK_R: tl.constexpr = s_A.shape[0]
    if BLOCK_R == 1:
        return tl.zeros_like(s_A) + b_enter
    b_leave = apply_map(s_A, s_B, b_enter)  # [BLOCK_R] the state leaving each segment
    o_s = tl.arange(0, BLOCK_R)
    if REVERSE:
        o_prev = o_s + 1
    else:
        o_prev = o_s - 1
    b_h0 = tl.sum(tl.where(o_s[None, :] == o_prev[:, None], b_leave[None, :], 0.0), axis=1)
    return tl.where((o_prev < 0) | (o_prev >= BLOCK_R), b_enter, b_h0)


@triton.jit
def scan_tile(b_a, b_b, b_h0, m, REVERSE: tl.constexpr, CUT_A: tl.constexpr, lb_ptr, o_r, i_c, n_chunks,
              LOOKBACK: tl.constexpr, STORE_FINAL_STATE: tl.constexpr):
    """``scan_tile_enter`` without the entering state: (h [BLOCK_R, BLOCK_T], leaving state [BLOCK_R])."""
    b_h, b_exit, _ = scan_tile_enter(b_a, b_b, b_h0, m, REVERSE, CUT_A, lb_ptr, o_r, i_c, n_chunks, LOOKBACK,
                                     STORE_FINAL_STATE)
    return b_h, b_exit


@triton.jit
def _linear_scan_fwd_kernel(
    a_ptr, b_ptr, h_ptr, h0_ptr, ht_ptr, lb_ptr,
    n_rows, inner, T,
    s_a_o, s_a_t, s_a_i, s_b_o, s_b_t, s_b_i,
    ACC: tl.constexpr, REVERSE: tl.constexpr, HAS_INITIAL_STATE: tl.constexpr, STORE_FINAL_STATE: tl.constexpr,
    CUT_A: tl.constexpr, LOOKBACK: tl.constexpr, WINDOW: tl.constexpr, INT64: tl.constexpr, ONE_CHUNK: tl.constexpr,
    NUM_STAGES: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr,
):
    o_o, o_i, o_r, m_r, b_h, n_chunks, c_lo, c_hi = row_prologue(
        h0_ptr, lb_ptr, n_rows, inner, T, ACC, BLOCK_R, BLOCK_T, HAS_INITIAL_STATE, LOOKBACK, WINDOW, INT64, ONE_CHUNK)
    for i_c in tl.range(c_lo, c_hi, num_stages=NUM_STAGES):
        o_t, m, w = chunk(i_c, n_chunks, T, o_o, m_r, BLOCK_T, REVERSE, LOOKBACK, WINDOW, INT64)
        b_a = load_tile(a_ptr, o_o, o_i, o_t, s_a_o, s_a_t, s_a_i, m, ACC, w)  # [BLOCK_R, BLOCK_T]
        b_b = load_tile(b_ptr, o_o, o_i, o_t, s_b_o, s_b_t, s_b_i, m, ACC, w)  # [BLOCK_R, BLOCK_T]
        b_h_all, b_h = scan_tile(b_a, b_b, b_h, m, REVERSE, CUT_A, lb_ptr, o_r, i_c, n_chunks, LOOKBACK,
                                  STORE_FINAL_STATE)
        store_tile(h_ptr, b_h_all, o_o, o_i, o_t, T, inner, m, w)
    store_state(ht_ptr, b_h, o_r, m_r, c_hi, n_chunks, STORE_FINAL_STATE)


def _pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)  # triton.cdiv is a JIT function: several µs per call from Python


@functools.lru_cache(maxsize=None)
def _param_names(name: str) -> tuple[str, ...]:
    """The kernel parameters of an input or coefficient ``name`` (``launch``'s naming scheme)."""
    return f"{name}_ptr", f"s_{name}_o", f"s_{name}_t", f"s_{name}_i", f"{name.upper()}_TENSOR"


def launch_config(layout: Layout, kernel_name: str | None = None, shifted: bool = False) -> dict:
    """Tile sizes, grid and mode of a launch of the kernel ``kernel_name`` over ``layout`` (``shifted``: in its
    shifted input mode, the kernel's ``SHIFTED``).

    One program per ``BLOCK_R`` rows walking whole sequences in tiles of up to ``MAX_BLOCK_T`` steps:
    - short sequences stored time-major over at least ``TIME_MAJOR_MIN_ROWS`` rows in ``TIME_MAJOR_BLOCK_R`` x
      ``TIME_MAJOR_BLOCK_T`` tiles on one warp;
    - sequences of ``SHORT_MIN_T``-``SHORT_T`` steps in ``SHORT_BLOCK_R`` rows;
    - at most ``WIDE_MAX_ROWS`` rows of longer sequences one row per program, in tiles of up to ``WIDE_MAX_T`` steps
      on more warps (4 above ``WIDE_FEW_WARPS_ROWS`` rows); of up to ``WIDE_LONG_T`` steps in at most
      ``WIDE_LONG_MAX_ROWS[kernel_name]`` rows, on their warps at any number of rows.

    Or, for long float32 sequences in too few rows to fill the GPU that way (from ``LOOKBACK_MANY_ROWS`` rows on,
    only from ``LOOKBACK_MANY_ROWS_MIN_T`` steps, but for the kernels in ``LOOKBACK_MANY_ROWS_SEGMENTS``), one
    program per chunk of ``LOOKBACK_BLOCK_T`` steps (or of ``LOOKBACK_SEGMENTS`` segments of ``LOOKBACK_SEGMENT_T``
    steps, for the kernels in ``LOOKBACK_SEGMENTED``; from ``LOOKBACK_MANY_ROWS`` rows on,
    ``LOOKBACK_MANY_ROWS_SEGMENTS``' number of them) with a decoupled look-back between the chunks of a row
    (``LOOKBACK``: the look-back window). The look-back composes a chunk's entering state from whichever
    predecessors have published, so its rounding may differ in the last bits between calls: under
    ``torch.use_deterministic_algorithms(True)`` the per-row kernels run.

    ``WARP_LOCAL_T``-step row tiles with float32 accumulation pipeline the chunk loop of a kernel in
    ``PIPELINE_KERNELS`` over ``PIPELINE_STAGES`` stages where a row has several chunks, and otherwise give a kernel
    in ``REGISTER_CAPS`` its cap (``maxnreg``). Many rows of at least ``TILE256_MIN_T`` steps run in
    ``TILE256_T``-step row tiles, for the kernels ``TILE256_STAGES`` names for the inputs' element size.
    """
    many_rows = layout.rows >= LOOKBACK_MANY_ROWS
    many_rows_segments = LOOKBACK_MANY_ROWS_SEGMENTS.get(kernel_name) if many_rows else None
    if (layout.acc_dtype == torch.float32 and layout.T >= LOOKBACK_MIN_T and layout.rows <= LOOKBACK_MAX_ROWS
            and (not many_rows or layout.T >= LOOKBACK_MANY_ROWS_MIN_T or many_rows_segments)
            and LOOKBACK_WINDOW and not torch.are_deterministic_algorithms_enabled()):
        block_r, block_t = 1, LOOKBACK_BLOCK_T
        if kernel_name in LOOKBACK_SEGMENTED:
            block_r, block_t = many_rows_segments or LOOKBACK_SEGMENTS, LOOKBACK_SEGMENT_T
        return {"grid": (layout.rows * _cdiv(layout.T, block_r * block_t),), "BLOCK_R": block_r, "BLOCK_T": block_t,
                "num_warps": LOOKBACK_WARPS, "NUM_STAGES": 1, "LOOKBACK": LOOKBACK_WINDOW}
    block_t = min(max(_pow2(layout.T), 2), MAX_BLOCK_T)
    block_r = max(1, min(_pow2(layout.rows), max(1, TILE_ELEMENTS // block_t)))
    num_warps, stages = 4, 1
    if layout.inner >= TIME_MAJOR_MIN_ROWS and layout.T <= TIME_MAJOR_MAX_T and kernel_name in TIME_MAJOR_KERNELS:
        block_r, block_t, num_warps = TIME_MAJOR_BLOCK_R, min(block_t, TIME_MAJOR_BLOCK_T), 1
    elif SHORT_MIN_T <= layout.T <= SHORT_T and layout.rows >= SHORT_BLOCK_R:
        block_r, num_warps = SHORT_BLOCK_R, SHORT_WARPS
    elif layout.T > MAX_BLOCK_T and layout.rows <= WIDE_MAX_ROWS:
        few_warps = layout.rows <= WIDE_FEW_WARPS_ROWS
        max_t = WIDE_MAX_T if few_warps else WIDE_4_WARPS_MAX_T.get(kernel_name, WIDE_MAX_T)
        if (WIDE_MAX_T < layout.T <= WIDE_LONG_T and layout.rows <= WIDE_LONG_MAX_ROWS.get(kernel_name, 0)
                and layout.acc_dtype == torch.float32):
            max_t = WIDE_LONG_T
        if shifted:
            max_t = min(max_t, WIDE_SHIFTED_MAX_T.get(kernel_name, max_t))
        block_t = min(_pow2(layout.T), max_t)
        block_r = 1
        if block_t == WIDE_LONG_T and layout.T % 4 and layout.T + 3 > block_t:  # no aligned window: one-element loads
            num_warps = WIDE_WARPS
        elif few_warps or block_t == WIDE_LONG_T:
            num_warps = WIDE_TILE_WARPS.get(kernel_name, {}).get(block_t, WIDE_WARPS)
        else:
            num_warps = 4
    elif (kernel_name in TILE256_STAGES.get(layout.dtype.itemsize, ()) and layout.inner == 1
          and layout.T >= TILE256_MIN_T and layout.rows >= TILE256_MIN_ROWS):
        block_r, block_t, num_warps = TILE256_BLOCK_R, TILE256_T, TILE256_BLOCK_R
        stages = TILE256_STAGES[layout.dtype.itemsize][kernel_name]
    cfg = {
        "grid": (_cdiv(layout.rows, block_r),),
        "BLOCK_R": block_r,
        "BLOCK_T": block_t,
        "num_warps": num_warps,
        "NUM_STAGES": stages,
        "LOOKBACK": 0,
    }
    if block_t == WARP_LOCAL_T and layout.acc_dtype == torch.float32:
        if layout.T > block_t and kernel_name in PIPELINE_KERNELS:  # several chunks per row
            cfg["NUM_STAGES"] = PIPELINE_STAGES
        elif kernel_name in REGISTER_CAPS:
            cfg["maxnreg"] = REGISTER_CAPS[kernel_name]
    return cfg


def triton_dtype(dtype: torch.dtype):
    return tl.float64 if dtype == torch.float64 else tl.float32


def new_outputs(layout: Layout, n: int) -> list[torch.Tensor]:
    """``n`` contiguous output tensors of the input shape and dtype (strides ``(T * inner, inner, 1)``), each an
    allocation of its own.

    Each is ``torch.empty_like`` of a stride-0 view of one element kept per layout (``_output_like``): the same
    tensor as ``torch.empty`` of the shape, dtype and device, for about half the host time (no parsing of them).
    """
    if POISON_OUTPUTS:
        return [torch.full(layout.shape, float("nan"), dtype=layout.dtype, device=layout.device) for _ in range(n)]
    like = _output_like(layout)
    if like is None:
        return [torch.empty(layout.shape, dtype=layout.dtype, device=layout.device) for _ in range(n)]
    return [torch.empty_like(like, memory_format=torch.contiguous_format) for _ in range(n)]


# For new_outputs, by layout id: (the layout, kept alive so that its id is not reused; one element of its dtype on its
# device, viewed with stride 0 as its shape). Cleared when full.
_OUTPUT_LIKE: dict[int, tuple[Layout, torch.Tensor]] = {}
_MAX_OUTPUT_LIKE = 256


def _output_like(layout: Layout) -> torch.Tensor | None:
    """The stride-0 tensor ``new_outputs`` allocates like, or None for a layout not kept for later calls
    (``is_cached``), while torch.compile traces, or while a CUDA graph is captured (nothing is kept from a
    capture's memory pool)."""
    if torch.compiler.is_compiling():
        return None
    entry = _OUTPUT_LIKE.get(id(layout))
    if entry is not None and entry[0] is layout:
        return entry[1]
    if not is_cached(layout) or (layout.device.type == "cuda" and torch.cuda.is_current_stream_capturing()):
        return None
    like = torch.empty((), dtype=layout.dtype, device=layout.device).expand(layout.shape)
    if len(_OUTPUT_LIKE) >= _MAX_OUTPUT_LIKE:
        _OUTPUT_LIKE.clear()
    _OUTPUT_LIKE[id(layout)] = layout, like
    return like


def state_buffers(layout: Layout, initial_state, output_final_state: bool):
    """(initial state as a contiguous [rows] tensor or None, final-state output [rows] or None)."""
    h0 = None if initial_state is None else initial_state.reshape(-1).contiguous()
    return h0, (_final_state_buffer(layout) if output_final_state else None)


def _final_state_buffer(layout: Layout) -> torch.Tensor:
    """The final-state output ``[rows]`` in the accumulation dtype, uninitialised (NaN with ``POISON_OUTPUTS``):
    every kernel writes the state of each of its rows (``store_state``, by the program of the row's last chunk)."""
    if POISON_OUTPUTS:
        return torch.full((layout.rows,), float("nan"), dtype=layout.acc_dtype, device=layout.device)
    return torch.empty((layout.rows,), dtype=layout.acc_dtype, device=layout.device)


def flag_constexprs(inputs: dict, constexprs: dict) -> dict:
    """``constexprs`` plus ``SAME_FLAGS`` for a kernel with inputs ``d`` and ``term``: whether one tensor is both
    (then read once). A constexpr, so also part of a launch plan's key."""
    if "d" in inputs and "term" in inputs:
        return {**constexprs, "SAME_FLAGS": inputs["d"] is inputs["term"]}
    return constexprs


def _int64_offsets(layout: Layout, strides: list) -> bool:
    """Whether a launch computes its offsets in int64 (``INT64``): some element offset exceeds
    ``INT32_MAX_OFFSET``, that of the last output element or the largest of a strided input or tensor coefficient,
    ``(outer - 1) s_o + (T - 1) s_t + (inner - 1) s_i``. Below it every offset of an element the kernel reads or
    writes, and every partial sum of one, fits int32 (masked lanes past the ends may wrap; they are never read);
    int32 arithmetic is about a tenth fewer instructions (sm_90 SASS of GAE at 65536 x 2048: 304 -> 272), taken by
    the kernels of ``INT32_KERNELS``."""
    o, t, i = layout.outer - 1, layout.T - 1, layout.inner - 1
    largest = max([o * so + t * st + i * si for so, st, si in strides], default=0)
    return max(largest, layout.outer * layout.T * layout.inner - 1) > INT32_MAX_OFFSET


def _constant_length(layout: Layout, strides: list) -> bool:
    """Whether a launch passes T and the inputs' strides as compile-time constants (one compiled kernel per T):
    rows of at most ``CONSTANT_MAX_T`` steps whose length is not a multiple of 16, every input contiguous with the
    time steps adjacent (``inner`` = 1). Triton specializes a runtime int only on being divisible by 16, so the
    rows of such a T (24: Isaac Lab's default) start at addresses it cannot prove aligned, and the tile masks
    ``t < T`` have no constant runs: every load and store is a 4-byte access (sm_90 SASS of GAE at 65536 x 24: 20
    scalar LDG, 96 registers, 624 instructions; at 32 steps: 128-bit accesses, 40 registers, 344). With T a constant
    the compiler sees both. An input broadcast along time (time stride 0, such as GAE's last value in its shifted
    mode, read once per row) does not stand in the way: its strides are constants of the launch as well (sm_90 SASS
    of GAE's shifted mode, its in-tile V' included: 65536 x 24 544 -> 272 instructions, 512 x 1000 768 -> 344,
    4096 x 1000 640 -> 384, against the two-tensor mode's 264, 336 and 352). Nor does an input whose strides are
    the contiguous ones times a whole k (every k-th element: ``retrace_discrete``'s per-action views of ``[B, T, A]``,
    k = A). With T at run time the compiler converted such a launch's outputs to another layout before the stores
    (sm_90 SASS of ``retrace_discrete`` at 3 x 1000: 2-3 conversions through shared memory; none at 1008, none with
    T a constant), and its grouped reads were wrong in one-row tiles of one chunk (H100 and H200; with T a constant
    right: benchmarks/results/h100/rd_diag_56b3228_a10070b.md; ``retrace._action_group`` keeps the other layouts of
    such a T off the groups). (With ``inner`` 1 and T > 1 the contiguous time stride is 1, so k is the input's time
    stride.)"""
    base = layout.contiguous_strides
    return (layout.inner == 1 and layout.T % 16 != 0 and layout.T <= CONSTANT_MAX_T
            and all(st[1] == 0 or tuple(st) == tuple(st[1] * c for c in base) for st in strides))


def compiled_for_length(layout: Layout, inputs) -> bool:
    """Whether ``launch`` compiles a launch of the tensors ``inputs`` over ``layout`` for its length
    (``_constant_length`` of their ``rows_strides``)."""
    return _constant_length(layout, [rows_strides(x, layout)[1] for x in inputs])


def _one_chunk(layout: Layout, cfg: dict) -> bool:
    """Whether every row of a launch is one chunk (no look-back): its kernel is compiled without the chunk loop.

    The loop's invariants (row offsets, masks, the predicates of Triton's cross-warp scan) are computed before it,
    ahead of the first loads, and a row's state leaving the tile is carried out of it. sm_90 SASS of the traces at
    64 x 512: the loads came after about 100 instructions; rl-triton's kernel, which has no loop, issues its own
    within its first 24 (benchmarks/results/h100/ncu_fewrows_db104d6.md)."""
    return not cfg["LOOKBACK"] and layout.T + 3 * cfg["WINDOW"] <= cfg["BLOCK_T"]


def _aligned_window(layout: Layout, cfg: dict, kernel_name: str, fixed_t: bool, tensors) -> bool:
    """Whether a launch's row tiles are aligned windows (``WINDOW``, see ``chunk``): a kernel of ``WINDOW_KERNELS``
    in row tiles (not look-back chunks) over rows compiled for their length (``_constant_length``: every input
    contiguous or broadcast along time) whose length T > ``SHORT_T`` is no multiple of 4, of float32 rollouts (the
    only dtype measured with windows on a GPU: bfloat16 and float16 keep their loads); where the window's up to 3
    more steps add no chunk to a row's walk, or one to a walk of at least ``WINDOW_MIN_CHUNKS``; and every tensor
    ``tensors`` (those the windows address: the inputs that step along time, the outputs) 16-byte aligned with
    elements of at most 4 bytes, so that the 4-element groups a window loads past a row's ends never leave the 16
    bytes that hold the row's end."""
    if not (fixed_t and layout.T % 4 and layout.T > SHORT_T and kernel_name in WINDOW_KERNELS
            and not cfg["LOOKBACK"] and layout.dtype == torch.float32):
        return False
    walk, window_walk = _cdiv(layout.T, cfg["BLOCK_T"]), _cdiv(layout.T + 3, cfg["BLOCK_T"])
    if window_walk > walk and walk < WINDOW_MIN_CHUNKS:
        return False
    return all(x.element_size() <= 4 and x.data_ptr() % 16 == 0 for x in tensors)


def _descending(layout: Layout, cfg: dict, kernel_name: str, num_warps: int, fixed_t: bool, strides: list,
                tensors) -> bool:
    """Whether a launch of a kernel in ``DESCENDING_KERNELS`` holds its tiles in scan order (``chunk``): one-row
    tiles (not look-back chunks) of at least 4 steps per thread, over batch-major rows that start on 16-byte
    boundaries the compiler can prove (T a multiple of 16, or of 4 and compiled for its length) or in aligned
    windows (of at most ``DESCENDING_WINDOW_MAX_T`` steps for the kernels it names), every input contiguous along
    time or broadcast along it, and every tensor ``tensors`` 16-byte aligned. Elsewhere the groups' accesses would
    be one element each, or their 4 steps in several threads, and Triton would move every tile through shared memory
    to reverse its groups."""
    if cfg["WINDOW"]:
        aligned = cfg["BLOCK_T"] <= DESCENDING_WINDOW_MAX_T.get(kernel_name, cfg["BLOCK_T"])
    else:
        aligned = layout.T % 16 == 0 or (fixed_t and layout.T % 4 == 0)
    return (cfg["BLOCK_R"] == 1 and not cfg["LOOKBACK"] and layout.inner == 1 and aligned
            and cfg["BLOCK_T"] >= 4 * 32 * num_warps
            and all(st[1] in (0, 1) for st in strides) and all(x.data_ptr() % 16 == 0 for x in tensors))


def launch(kernel, layout: Layout, *, inputs: dict, outputs: dict, coefs: dict | None = None,
           initial_state=None, output_final_state: bool = False, finite_a: bool = False, **constexprs):
    """Launches an algorithm kernel over ``layout``; returns the final-state buffer (or None).

    Kernel parameters follow one naming scheme, so every algorithm shares this launcher:
    ``{x}_ptr, s_{x}_o, s_{x}_t, s_{x}_i`` for an input ``x`` (any strides); ``{y}_ptr`` for an output (contiguous;
    None: an output this call does not write, passed as None, as if the kernel had no such parameter);
    ``{c}, {c}_ptr, s_{c}_o, s_{c}_t, s_{c}_i`` and constexpr ``{C}_TENSOR`` for a coefficient given as a number or
    a broadcastable tensor; ``h0_ptr, ht_ptr, HAS_INITIAL_STATE, STORE_FINAL_STATE`` for the states;
    ``lb_ptr, LOOKBACK`` for the look-back status words; ``n_rows, inner, T, ACC, BLOCK_R, BLOCK_T, NUM_STAGES``;
    ``SAME_FLAGS`` (constexpr) for a kernel with inputs ``d`` and ``term``: both are the same tensor.
    ``finite_a``: the kernel's a_t are finite whenever its coefficients are numbers (built from flags and them),
    so that the scan may skip cutting a (``CUT_A``).

    A call whose structure (``_plan_key``) launched before replays that launch's plan (``_LaunchPlan``): the
    arguments computed then, with this call's data pointers and numbers, launched on the compiled kernel that
    ``_launcher`` found for them. Plans are built for layouts kept for later calls only (``is_cached``), and never
    while every launch takes the plain path (``_launcher.Launcher.settings``: ``RL_TRITON_TORCHRL_LEAN_LAUNCH=0``,
    the interpreter, launch hooks, ...).

    The kernel runs on the inputs' device: where it is not the current CUDA device, the launch runs under
    ``torch.cuda.device`` of it (Triton launches on the current device and its current stream).

    Each launch is told to the calls being recorded (``_replay.note_launch``): a public call whose signature was
    recorded replays the plan straight from its arguments and does not come here at all.
    """
    constexprs = flag_constexprs(inputs, constexprs)
    if any(y is None for y in outputs.values()):  # outputs this call does not write: None parameters
        constexprs.update({_param_names(name)[0]: None for name, y in outputs.items() if y is None})
        outputs = {name: y for name, y in outputs.items() if y is not None}
    lean = launcher(kernel)
    settings = lean.settings()  # None: every launch of the kernel takes the plain path now (no plan either)
    index = layout.device.index  # None for CPU tensors; the only indexed devices that reach here are CUDA ones
    if index is not None and index != (torch.cuda.current_device() if settings is None else settings[0]):
        with torch.cuda.device(layout.device):
            return launch(kernel, layout, inputs=inputs, outputs=outputs, coefs=coefs, initial_state=initial_state,
                          output_final_state=output_final_state, finite_a=finite_a, **constexprs)
    key = ptrs = None
    if settings is not None:
        cvals = tuple(coefs.values()) if coefs else ()
        key, ptrs = _plan_key(settings, kernel, layout, inputs, outputs, coefs, cvals, initial_state,
                              output_final_state, finite_a, constexprs)
        try:
            plan = None if key is None else _PLANS.get(key)
        except TypeError:  # an unhashable constexpr: never planned
            key = plan = None
        if plan is not None:
            try:
                done, ht = plan.launch(settings[0], layout, ptrs, cvals)
            except Exception as e:  # noqa: BLE001 - anything unexpected: the plain way below (which raises if it must)
                done = False
                _PLANS.pop(key, None)  # built again after the plain launch (a thread's first launch sets its context)
                _note_failed_replay(e)
            if done:
                if _replay.recording():
                    _replay.note_launch(plan, layout, ptrs, cvals, tuple(outputs.values()), ht)
                return ht
    kwargs, slots, numbers = {}, [], []  # slots: the parameters that change from call to call, in _plan_key order
    strides = []
    for name, x in inputs.items():
        p_x, p_o, p_t, p_i, _ = _param_names(name)
        kwargs[p_x], strides_x = rows_strides(x, layout)
        kwargs[p_o], kwargs[p_t], kwargs[p_i] = strides_x
        strides.append(strides_x)
        slots.append(p_x)
    fixed_t = _constant_length(layout, strides)
    if fixed_t:  # T and the inputs' strides as compile-time constants (see _constant_length)
        for name in inputs:
            _, p_o, p_t, p_i, _ = _param_names(name)
            kwargs[p_o], kwargs[p_t], kwargs[p_i] = map(tl.constexpr, (kwargs[p_o], kwargs[p_t], kwargs[p_i]))
    for name, y in outputs.items():
        kwargs[_param_names(name)[0]] = y
        slots.append(_param_names(name)[0])
    all_numbers, number_slots = True, []
    for i, (name, c) in enumerate((coefs or {}).items()):
        p_c, p_o, p_t, p_i, p_tensor = _param_names(name)
        if not isinstance(c, torch.Tensor) and layout.acc_dtype == torch.float64:
            # Triton passes Python floats as float32: keep float64 exact by reading the value from memory.
            numbers.append((i, True))
            number_slots.append(p_c)
            c = torch.full((), c, dtype=torch.float64, device=layout.device)
        elif isinstance(c, torch.Tensor):
            slots.append(p_c)
        if isinstance(c, torch.Tensor):
            kwargs[p_c], (kwargs[p_o], kwargs[p_t], kwargs[p_i]) = rows_strides(c.to(layout.device), layout)
            strides.append((kwargs[p_o], kwargs[p_t], kwargs[p_i]))
            kwargs[name], kwargs[p_tensor] = 0.0, True
            all_numbers = False
        else:
            # float32 has no normal number below 2**-126 (the GPU flushes subnormals to zero), and Triton's
            # interpreter would type such an argument as float64: pass it as the zero it is in float32 arithmetic
            kwargs[name] = 0.0 if abs(c) < _FLOAT32_TINY else c
            kwargs[p_c], kwargs[p_o], kwargs[p_t], kwargs[p_i], kwargs[p_tensor] = None, 0, 0, 0, False
            numbers.append((i, False))
            number_slots.append(name)
    h0, ht = state_buffers(layout, initial_state, output_final_state)
    slots += ["h0_ptr"] * (h0 is not None) + number_slots + ["ht_ptr"] * (ht is not None)
    cfg = dict(launch_config(layout, lean.name, bool(constexprs.get("SHIFTED"))))
    grid, num_warps, maxnreg = cfg.pop("grid"), cfg.pop("num_warps"), cfg.pop("maxnreg", None)
    stepping = [x for x, (_, s_t, _) in zip(inputs.values(), strides) if s_t] + list(outputs.values())
    cfg["WINDOW"] = _aligned_window(layout, cfg, lean.name, fixed_t, stepping)
    cfg["ONE_CHUNK"] = _one_chunk(layout, cfg)
    if lean.name in DESCENDING_KERNELS:
        cfg["DESCENDING"] = _descending(layout, cfg, lean.name, num_warps, fixed_t, strides, stepping)
    lb = None
    if cfg["LOOKBACK"]:  # the ticket counter and three status words per chunk, all zero
        lb = torch.zeros(1 + 3 * grid[0], dtype=torch.int64, device=layout.device)
        slots.append("lb_ptr")
    kwargs = dict(
        **kwargs, h0_ptr=h0, ht_ptr=ht, lb_ptr=lb, HAS_INITIAL_STATE=h0 is not None,
        STORE_FINAL_STATE=output_final_state, n_rows=layout.rows,
        inner=tl.constexpr(layout.inner) if cfg["WINDOW"] else layout.inner,
        T=tl.constexpr(layout.T) if fixed_t else layout.T,
        ACC=triton_dtype(layout.acc_dtype),
        INT64=lean.name not in INT32_KERNELS or _int64_offsets(layout, strides),
        CUT_A=not (finite_a and all_numbers), **cfg, **constexprs,
    )
    lean(grid, num_warps, maxnreg, **kwargs)
    plan = None
    if key is not None and key not in _PLANS and is_cached(layout) and _of_layout(layout, inputs, outputs):
        plan = _LaunchPlan.of(lean, settings, layout, grid, num_warps, maxnreg, kwargs, slots, ptrs, numbers)
        if plan is not False:  # False: no compiled kernel to replay yet (the next call tries again)
            if len(_PLANS) >= _MAX_PLANS:
                _PLANS.clear()
            _PLANS[key] = plan
    ht = None if ht is None else ht.reshape(layout.state_shape)
    if _replay.recording():  # the plan launched now (its first launch), or None: a call that is not replayed
        _replay.note_launch(plan or None, layout, ptrs, cvals if plan else (), tuple(outputs.values()), ht)
    return ht


_FAILED_REPLAYS = 0


def _note_failed_replay(error: Exception) -> None:
    """A replayed launch raised: the call launched the plain way instead. Said once, as a warning."""
    global _FAILED_REPLAYS
    if getattr(error, "code", None) == NO_CONTEXT:  # expected once per thread: the plain launch sets it up
        return
    _FAILED_REPLAYS += 1
    if _FAILED_REPLAYS == 1:
        warnings.warn(f"rl_triton_torchrl: a replayed launch failed ({error!r}); the call was launched through "
                      "Triton's launcher instead", RuntimeWarning, stacklevel=4)


def _of_layout(layout: Layout, inputs: dict, outputs: dict) -> bool:
    """Whether every input and output has the layout's shape and device, and every output its dtype and contiguous
    strides: what a plan's key takes for granted."""
    return all(x.shape == layout.shape and x.device == layout.device for x in (*inputs.values(), *outputs.values())
               ) and all(y.dtype == layout.dtype and y.is_contiguous() for y in outputs.values())


# Launch plans by _plan_key; None for a structure that is never replayed. Cleared when full (the next call of a
# forgotten structure builds its plan again).
_PLANS: dict = {}
_MAX_PLANS = 256
_FLOAT32_TINY = 2.0**-126  # the smallest normal float32
_DATA_PTR = torch.Tensor.data_ptr
_STRIDE = torch.Tensor.stride
_IS_CONTIGUOUS = torch.Tensor.is_contiguous
_DTYPE = operator.attrgetter("dtype")
_VIEW_FACTS = operator.attrgetter("shape", "dtype", "device")


# What ``launch_config`` reads besides the layout: tests and sweeps assign these (``benchmarks/sweep_configs.py``
# replaces the function itself). Assigning any of them as an attribute of this module (``scan.MAX_BLOCK_T = 16``,
# ``monkeypatch.setattr``) moves ``_CONFIG_EPOCH`` on (``_ScanModule``), which every plan key holds: a plan is never
# replayed under other constants. (The dicts and sets among them are replaced to change them, never mutated.)
_CONFIG_NAMES = frozenset({
    "launch_config", "MAX_BLOCK_T", "TILE_ELEMENTS", "LOOKBACK_MIN_T", "LOOKBACK_MAX_ROWS", "LOOKBACK_BLOCK_T",
    "LOOKBACK_MANY_ROWS", "LOOKBACK_MANY_ROWS_MIN_T", "LOOKBACK_MANY_ROWS_SEGMENTS",
    "LOOKBACK_WARPS", "LOOKBACK_SEGMENT_T", "LOOKBACK_SEGMENTS", "LOOKBACK_SEGMENTED", "REGISTER_CAPS",
    "PIPELINE_STAGES", "PIPELINE_KERNELS", "TILE256_T", "TILE256_MIN_T", "TILE256_MIN_ROWS", "TILE256_BLOCK_R",
    "TILE256_STAGES", "LOOKBACK_WINDOW", "SHORT_MIN_T", "SHORT_T", "SHORT_BLOCK_R", "SHORT_WARPS",
    "WIDE_MAX_ROWS", "WIDE_MAX_T", "WIDE_WARPS", "WIDE_FEW_WARPS_ROWS", "WIDE_4_WARPS_MAX_T", "WIDE_SHIFTED_MAX_T",
    "WIDE_TILE_WARPS", "WIDE_LONG_T", "WIDE_LONG_MAX_ROWS", "DESCENDING_KERNELS", "DESCENDING_WINDOW_MAX_T",
    "WARP_LOCAL_T",
    "CONSTANT_MAX_T", "INT32_MAX_OFFSET", "INT32_KERNELS", "TIME_MAJOR_MIN_ROWS", "TIME_MAJOR_MAX_T",
    "TIME_MAJOR_BLOCK_R", "TIME_MAJOR_BLOCK_T", "TIME_MAJOR_KERNELS", "WINDOW_KERNELS", "WINDOW_MIN_CHUNKS",
})
_CONFIG_EPOCH = 0


class _ScanModule(types.ModuleType):
    """This module's type: assigning a launch constant (``_CONFIG_NAMES``) moves ``_CONFIG_EPOCH`` on."""

    def __setattr__(self, name, value):
        super().__setattr__(name, value)
        if name in _CONFIG_NAMES:
            super().__setattr__("_CONFIG_EPOCH", self._CONFIG_EPOCH + 1)


sys.modules[__name__].__class__ = _ScanModule


def _config_key() -> tuple:
    """The launch constants' epoch (``_ScanModule``) and the deterministic mode, which ``launch_config`` reads."""
    return _CONFIG_EPOCH, torch.are_deterministic_algorithms_enabled()


def _plan_key(settings: tuple, kernel, layout: Layout, inputs: dict, outputs: dict, coefs: dict | None,
              cvals: tuple, initial_state, output_final_state, finite_a, constexprs: dict):
    """(key of the call's plan, the data pointers of its tensors), or (None, None) for a call never planned.

    The key holds everything ``launch`` computes the kernel's arguments from, except the tensors' data and the
    float coefficients' values: the launcher's settings (current device included), the kernel and the layout (by
    id: a plan keeps both alive), the names of the inputs, outputs and coefficients, each coefficient's type, which
    inputs are contiguous (and all their strides unless every one is), the dtype of each input, the shape, strides,
    dtype and device of each tensor coefficient and of ``initial_state`` (moved or copied where they differ), which
    pointers are not 16-byte aligned (their low four bits), the flags and constexprs, and ``launch_config``'s
    constants (``_config_key``). The inputs' shapes and devices are ``layout``'s, and the outputs are contiguous
    tensors of its shape, dtype and device (``new_outputs``): ``launch``'s callers check and allocate them
    (``check_inputs``), and a plan is built only where that holds (``_of_layout``). The tensors, in the order of
    the pointers: the inputs, the outputs, the tensor coefficients, ``initial_state``. A coefficient neither a float
    nor a tensor (an int, which Triton would specialize on its value; a numpy scalar) is never planned.
    """
    xs, ctypes = tuple(inputs.values()), tuple(map(type, cvals))
    others = ()  # the tensor coefficients and the initial state: rare, keyed in full
    if ctypes.count(float) != len(ctypes) or initial_state is not None:
        others = (*[c for c in cvals if type(c) is not float], *(() if initial_state is None else (initial_state,)))
    tensors = (*xs, *outputs.values(), *others)
    try:
        ptrs = tuple(map(_DATA_PTR, tensors))
        low_bits = any(map((15).__and__, ptrs)) and tuple(map((15).__and__, ptrs))
        dense = tuple(map(_IS_CONTIGUOUS, xs))
        key = (settings, id(kernel), id(layout), tuple(inputs), tuple(outputs), tuple(coefs or ()), ctypes,
               dense if all(dense) else tuple(map(_STRIDE, xs)), tuple(map(_DTYPE, (*xs, *others))),
               others and (tuple(map(_VIEW_FACTS, others)), tuple(map(_STRIDE, others))), low_bits,
               initial_state is None, output_final_state, finite_a, tuple(constexprs.items()), _config_key())
    except (TypeError, AttributeError, RuntimeError):  # not a tensor, or a tensor without data (torch.compile's)
        return None, None
    return key, ptrs


class _LaunchPlan(NamedTuple):
    """A launch prepared by ``launch`` once, replayed by every later call of its key (``_plan_key``).

    The key fixes every argument but the data pointers and the float coefficients: ``fixed`` holds them all (None
    for the tensors), ``order`` picks each parameter from ``(per-call values) + fixed``. The per-call values are
    the pointers of ``_plan_key``, then per float coefficient its value (or, on float64 inputs, the pointer of a
    float64 tensor holding it), then the pointers of the final-state and look-back buffers allocated per call.
    Pointers are passed as ints (Triton's C launcher then skips asking the driver about each): the key holds the
    tensors' devices, on which the launch that built the plan passed them as tensors, and their alignment; each
    tensor passed then was the call's tensor itself or a view of it (``of``).
    """

    layout: Layout  # kept alive: its id is in the key
    lean: object  # the kernel's Launcher, which keeps the kernel alive (its id is in the key)
    compiled: object  # what ``replay`` launches
    grid: tuple
    fixed: tuple
    order: Callable[[tuple], tuple]
    numbers: tuple  # the indices of the float coefficients among the coefficients
    numbers_as_tensors: bool  # float64 inputs: each float coefficient passed as a float64 tensor
    final_state: bool
    lookback: int | None  # size of the look-back status buffer (None: no look-back)
    native: object  # the launch through the driver itself (``_launcher.PreparedLaunch``), or None: ``replay``

    @classmethod
    def of(cls, lean, settings: tuple, layout: Layout, grid, num_warps: int, maxnreg, kwargs: dict, slots: list,
           ptrs: tuple, numbers: list):
        """The plan of the launch just made with ``kwargs``; None where one cannot be replayed (a tensor copied
        or moved to the device, a misaligned buffer), False where no compiled kernel is remembered for it (yet)."""
        if any(kwargs[slot].data_ptr() != ptr for slot, ptr in zip(slots, ptrs)):
            return None  # an input copied (strides that do not merge), a coefficient moved, an initial state copied
        buffers = [kwargs[slot] for slot in slots[len(ptrs):] if isinstance(kwargs[slot], torch.Tensor)]
        if any(b.data_ptr() & 15 for b in buffers):
            return None
        compiled = lean.compiled_for(settings, num_warps, maxnreg, kwargs)
        if compiled is None:
            return False
        names = lean.specializer.names
        index = {slot: i for i, slot in enumerate(slots)}
        order = [index.get(name, len(slots) + j) for j, name in enumerate(names)]
        fixed = tuple(None if isinstance(kwargs[name], torch.Tensor) else kwargs[name] for name in names)
        lb = kwargs["lb_ptr"]
        prepared = None
        if compiled.native is not None:
            try:
                prepared = compiled.native.prepare(grid, slots, dict(zip(names, fixed)))
            except (KeyError, TypeError, ValueError, struct.error):  # e.g. a slot Triton made a constant: replay
                prepared = None
        return cls(layout, lean, compiled, tuple(grid), fixed, operator.itemgetter(*order),
                   tuple(i for i, _ in numbers), any(as_tensor for _, as_tensor in numbers),
                   kwargs["ht_ptr"] is not None, None if lb is None else lb.numel(), prepared)

    def numbers_of(self, cvals: tuple) -> list:
        """The float coefficients a launch passes as numbers (none where they go as float64 tensors), subnormals
        flushed to zero as Triton's float32 parameters would."""
        if self.numbers_as_tensors:
            return []
        return [c if abs(c) >= _FLOAT32_TINY else 0.0 for c in map(cvals.__getitem__, self.numbers)]

    def buffers(self, layout: Layout, cvals: tuple) -> tuple[tuple, int | None]:
        """What each launch allocates, in the order of its parameters after the numbers: a function making each
        buffer (the float coefficients as float64 tensors, the final-state output, the zeroed look-back status
        words), and the index of the final state among them (None without one)."""
        device = layout.device
        makers = [functools.partial(torch.full, (), cvals[i], dtype=torch.float64, device=device)
                  for i in self.numbers] if self.numbers_as_tensors else []
        at = None
        if self.final_state:
            at = len(makers)
            makers.append(functools.partial(_final_state_buffer, layout))
        if self.lookback is not None:
            makers.append(functools.partial(torch.zeros, self.lookback, dtype=torch.int64, device=device))
        return tuple(makers), at

    def launch(self, device: int, layout: Layout, ptrs: tuple, cvals: tuple) -> tuple[bool, torch.Tensor | None]:
        """Replays the launch with these pointers and coefficients: (launched, the final state or None). Not
        launched where a buffer allocated here is misaligned (the caller then launches the plain way)."""
        numbers = self.numbers_of(cvals)
        if not (self.numbers_as_tensors or self.final_state or self.lookback):  # the common call: no buffers
            if self.native is not None:
                self.native.launch(current_stream(device), *ptrs, *numbers)
            else:
                replay(self.compiled, self.grid, device, self.order((*ptrs, *numbers, *self.fixed)))
            return True, None
        makers, at = self.buffers(layout, cvals)
        keep = [make() for make in makers]  # the buffers allocated here, alive until launched
        ht = None if at is None else keep[at]
        buffers = tuple(map(_DATA_PTR, keep))
        if any(map((15).__and__, buffers)):
            return False, None
        if self.native is not None:
            self.native.launch(current_stream(device), *ptrs, *numbers, *buffers)
        else:
            replay(self.compiled, self.grid, device, self.order((*ptrs, *numbers, *buffers, *self.fixed)))
        return True, (None if ht is None else ht.reshape(layout.state_shape))


# ---------------------------------------------------------------------------------------------------------------
# Plain-torch path (CPU): the same recurrence, exact, in O(sqrt T) vectorised steps.
# ---------------------------------------------------------------------------------------------------------------


def _torch_apply_map(a, b, h, cut: bool):
    """``a * h + b``; with ``cut``, a zero ``a`` cuts off ``h`` entirely (as ``apply_map`` in the kernels)."""
    ah_b = torch.addcmul(b, a, h) if isinstance(b, torch.Tensor) else a * h
    return torch.where(a == 0, b, ah_b) if cut else ah_b


def torch_linear_scan(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor | None = None, reverse: bool = False):
    """Scans ``h_t = a_t h_(t-1) + b_t`` (or ``h_(t+1)`` with ``reverse``) along the last dimension of ``[R, T]``.

    Two levels: the sequence is cut into K chunks of C ~ sqrt(T/2) steps; a sequential loop over the C positions
    scans every chunk at once (vectorised over rows and chunks), a second loop carries the state across the K
    chunks, and one fused update adds each chunk's entering state: about 2C + K small vectorised steps instead of
    T, all out of place so that autograd can differentiate through them.

    A zero ``a_t`` cuts the state off entirely, so a NaN or inf never crosses it (no 0 * NaN). On the CPU the plain
    products run first and the cutting variant only when some output is not finite (they agree otherwise: every
    intermediate value reaches an output); elsewhere the cutting variant runs directly (checking would synchronise).

    Args:
        a, b: ``[R, T]`` tensors of one floating dtype (broadcastable to each other).
        h0: ``[R]`` state entering the sequence, or None for zero.
        reverse: scan from ``T - 1`` down to 0.

    Returns:
        (h ``[R, T]``, final state ``[R]``).
    """
    if b.device.type != "cpu":
        return _torch_scan(a, b, h0, reverse, cut=True)
    h, ht = _torch_scan(a, b, h0, reverse, cut=False)
    # one sum instead of an elementwise isfinite: NaN or inf anywhere makes it non-finite (an overflowing sum of
    # finite values only costs the cutting variant, which gives the same numbers)
    if not bool((h.sum() + ht.sum()).isfinite()):
        h, ht = _torch_scan(a, b, h0, reverse, cut=True)
    return h, ht


def _torch_scan(a, b, h0, reverse, cut):
    a, b = torch.broadcast_tensors(a, b)
    R, T = b.shape
    # time-major storage (the rows adjacent in memory, e.g. SB3's and rsl_rl's [T, N]): the output is laid out the
    # same way, so that writing it back to the inputs' layout copies nothing
    time_major = R > 1 and T > 1 and b.stride(0) < b.stride(1)
    C = max(1, math.isqrt(T // 2))
    K = -(-T // C)
    if K * C > T:  # pad with identity steps (a = 1, b = 0): they pass the state through unchanged
        a = torch.nn.functional.pad(a, (0, K * C - T), value=1.0)
        b = torch.nn.functional.pad(b, (0, K * C - T), value=0.0)
    # [C, R, K]: position within the chunk first, so that each step of the loops reads contiguous memory
    a_cols = a.reshape(R, K, C).permute(2, 0, 1).contiguous().unbind(0)
    b_cols = b.reshape(R, K, C).permute(2, 0, 1).contiguous().unbind(0)
    order = range(C - 1, -1, -1) if reverse else range(C)
    # within-chunk inclusive scans from a zero state (h_loc) and running products of a (p_loc), in scan order
    h_loc, p_loc = [None] * C, [None] * C
    h_j, p_j = None, None
    for j in order:
        h_j = b_cols[j] if h_j is None else _torch_apply_map(a_cols[j], b_cols[j], h_j, cut)
        p_j = a_cols[j] if p_j is None else _torch_apply_map(a_cols[j], 0.0, p_j, cut)
        h_loc[j], p_loc[j] = h_j, p_j
    # states entering each chunk, carried sequentially across the K chunks in scan order
    enter = [None] * K
    h = h0.to(b.dtype) if h0 is not None else torch.zeros(R, dtype=b.dtype, device=b.device)
    h_last, p_last = h_j.t().unbind(0), p_j.t().unbind(0)  # each chunk's composite: K views [R]
    for k in (range(K - 1, -1, -1) if reverse else range(K)):
        enter[k] = h
        h = _torch_apply_map(p_last[k], h_last[k], h, cut)
    out = _torch_apply_map(torch.stack(p_loc), torch.stack(h_loc), torch.stack(enter, -1), cut)  # [C, R, K]
    if time_major:  # [K * C, R] in memory, returned as its [R, T] view
        return out.permute(2, 0, 1).reshape(K * C, R)[:T].t(), h
    return out.permute(1, 2, 0).reshape(R, K * C)[:, :T], h


def time_last(x, layout: Layout):
    """An input as ``[*R, T]`` in the accumulation dtype (a view when no cast is needed)."""
    if x is None or not isinstance(x, torch.Tensor):
        return x
    if x.device != layout.device:  # a one-element coefficient such as gamma may live elsewhere
        x = x.to(layout.device)
    if x.shape != layout.shape:
        x = x.expand(layout.shape)
    x = x.movedim(layout.time_dim, -1)
    return x.to(layout.acc_dtype) if x.is_floating_point() else x


def rows_time(x, layout: Layout):
    """An input as ``[R, T]`` (rows = every non-time index) in the accumulation dtype; floats pass through."""
    x = time_last(x, layout)
    return x.reshape(-1, layout.T) if isinstance(x, torch.Tensor) else x


def from_rows_time(y: torch.Tensor, layout: Layout) -> torch.Tensor:
    """The inverse of ``rows_time`` for an output: ``layout.shape``, contiguous, in the input dtype."""
    lead = layout.shape[: layout.time_dim] + layout.shape[layout.time_dim + 1 :]
    return y.reshape(*lead, layout.T).movedim(-1, layout.time_dim).to(layout.dtype).contiguous()


def rows_time_unless(x, flag, layout: Layout):
    """``rows_time(x)`` with zeros where ``flag`` is set: a masked load, so that a NaN or inf there is never read."""
    return torch.where(rows_time(flag, layout), 0.0, rows_time(x, layout))


def rows_state(initial_state):
    return None if initial_state is None else initial_state.reshape(-1)


def next_value_input(next_state_value, last_state_value, layout: Layout) -> torch.Tensor:
    """The next-value input ``nv`` of a kernel with a shifted input mode: ``next_state_value``, or in that mode the
    last value ``[*B, *F]`` as a tensor of the inputs' shape with time stride 0, which the kernel reads at t = T - 1
    only (``last_step_value``)."""
    if last_state_value is None:
        return next_state_value
    return last_state_value.unsqueeze(layout.time_dim).expand(layout.shape)


def next_value_rows(v: torch.Tensor, next_state_value, last_state_value, terminated, layout: Layout):
    """:math:`V(s_{t+1})` as ``[R, T]`` on the torch path, zero where ``terminated`` (never read there):
    ``next_state_value``, or in the shifted input mode ``v`` (``[R, T]``) one step on, then the last value."""
    if last_state_value is None:
        return rows_time_unless(next_state_value, terminated, layout)
    nv = torch.cat([v[:, 1:], rows_state(last_state_value).to(v.dtype)[:, None]], 1)
    return torch.where(rows_time(terminated, layout), 0.0, nv)


def not_flag(x, layout: Layout):
    """``1 - flag`` as ``[R, T]`` in the accumulation dtype (the float form the coefficient functions take)."""
    return (~rows_time(x, layout)).to(layout.acc_dtype)


def state_out(h: torch.Tensor, layout: Layout) -> torch.Tensor:
    return h.reshape(layout.state_shape).to(layout.acc_dtype)


# ---------------------------------------------------------------------------------------------------------------
# The scan as a PyTorch custom op: differentiable (its backward is the same scan run the other way) and opaque to
# torch.compile (fullgraph tracing, CUDA graphs). The paths that build coefficients with torch ops use it whenever
# autograd or the compiler is involved; the fused kernels serve every other call.
# ---------------------------------------------------------------------------------------------------------------


def _rows_layout(b: torch.Tensor) -> Layout:
    R, T = b.shape
    return Layout(shape=b.shape, time_dim=1, outer=R, T=T, inner=1, dtype=b.dtype, acc_dtype=b.dtype,
                  device=b.device)


@torch.library.custom_op("rl_triton_torchrl::linear_scan", mutates_args=())
def _scan_op(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor | None, reverse: bool,
             use_triton: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """``[R, T]`` coefficients (one float dtype, same shape) -> (h ``[R, T]`` contiguous, final state ``[R]``)."""
    layout = _rows_layout(b)
    if layout.empty:
        ht = torch.zeros(b.shape[0], dtype=b.dtype, device=b.device) if h0 is None else h0.clone()
        return b.new_empty(b.shape), ht
    if not use_triton:
        h, ht = torch_linear_scan(a, b, h0, reverse)
        return h.contiguous(), ht
    (h,) = new_outputs(layout, 1)
    ht = launch(_linear_scan_fwd_kernel, layout, inputs={"a": a, "b": b}, outputs={"h": h}, initial_state=h0,
                output_final_state=True, REVERSE=reverse)
    return h, ht


@_scan_op.register_fake
def _scan_op_fake(a, b, h0, reverse, use_triton):
    return b.new_empty(b.shape), b.new_empty(b.shape[:1])


def _scan_op_setup_context(ctx, inputs, output):
    a, _, h0, reverse, use_triton = inputs
    ctx.save_for_backward(a, output[0], h0)
    ctx.reverse, ctx.use_triton = reverse, use_triton


def _scan_op_backward(ctx, g_h, g_ht):
    r"""The adjoint of :math:`h_t = a_t h_{t\mp1} + b_t` is the same recurrence run the other way,
    :math:`g_t = \partial L / \partial h_t + a_{t\pm1} g_{t\pm1}`; then :math:`\partial L / \partial b_t = g_t`,
    :math:`\partial L / \partial a_t = g_t h_{t\mp1}` and the entering state gets :math:`a g` of the step it enters."""
    a, h, h0 = ctx.saved_tensors
    R, T = h.shape
    g_h = torch.zeros_like(h) if g_h is None else g_h
    if g_ht is not None:  # the final state is h at the last step in scan order
        last = torch.zeros_like(h)
        last[:, 0 if ctx.reverse else T - 1] = g_ht
        g_h = g_h + last
    zero = torch.zeros_like(h[:, :1])
    state = zero if h0 is None else h0[:, None].to(h.dtype)
    if ctx.reverse:  # g_t = G_t + a_(t-1) g_(t-1): a forward scan; h_(t+1) pairs with a_t
        g, _ = _scan_op(torch.cat([zero, a[:, :-1]], 1), g_h, None, False, ctx.use_triton)
        h_other, i_enter = torch.cat([h[:, 1:], state], 1), T - 1
    else:  # g_t = G_t + a_(t+1) g_(t+1): a reverse scan; h_(t-1) pairs with a_t
        g, _ = _scan_op(torch.cat([a[:, 1:], zero], 1), g_h, None, True, ctx.use_triton)
        h_other, i_enter = torch.cat([state, h[:, :-1]], 1), 0
    g_h0 = None if h0 is None else (a[:, i_enter] * g[:, i_enter]).to(h0.dtype)
    return g * h_other, g, g_h0, None, None


_scan_op.register_autograd(_scan_op_backward, setup_context=_scan_op_setup_context)


def scan_rows(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor | None, reverse: bool, path: str):
    """The scan of the paths that build coefficients with torch ops: ``[R, T]`` a, b -> (h, final state ``[R]``).

    ``path`` comes from ``resolve_backend``: ``"torch"`` runs ``torch_linear_scan`` (autograd differentiates its
    torch ops); ``"triton_scan"`` runs the Triton scan kernel as a custom op, forward and backward. Under
    torch.compile both go through the custom op, so that the compiler sees one opaque, differentiable node.
    """
    if path == "torch" and not torch.compiler.is_compiling():
        return torch_linear_scan(a, b, h0, reverse)
    a, b = torch.broadcast_tensors(a, b)
    h0 = None if h0 is None else h0.to(b.dtype)
    return _scan_op(a, b, h0, reverse, path == "triton_scan")


# ---------------------------------------------------------------------------------------------------------------
# Public generic scan
# ---------------------------------------------------------------------------------------------------------------


@replayable
def linear_scan(
    a: torch.Tensor,
    b: torch.Tensor,
    *,
    reverse: bool = False,
    time_dim: int | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    backend: str = "auto",
):
    r"""Solves :math:`h_t = a_t h_{t\mp1} + b_t` for given coefficient tensors.

    Args:
        a (Tensor): ``[*B, T, *F]`` multipliers.
        b (Tensor): ``[*B, T, *F]`` offsets, same shape and dtype as ``a``.

    Keyword Args:
        reverse (bool): scan from the last step to the first (``h_t`` depends on ``h_(t+1)``). Defaults to ``False``.
        time_dim (int, optional): the time dimension. Defaults to ``-2`` (TorchRL's ``[*B, T, 1]``), except
            that 2-D inputs must name it (they raise without it): ``-1`` for ``[B, T]``, ``0`` for ``[T, B]``.
        initial_state (Tensor, optional): ``[*B, *F]`` state entering the sequence (``h_(-1)``, or ``h_T`` when
            ``reverse``). Defaults to zero.
        output_final_state (bool): also return the state leaving the sequence (``h_(T-1)``, or ``h_0`` when
            ``reverse``), in the accumulation dtype. Defaults to ``False``.
        backend (str): ``"auto"``, ``"triton"`` or ``"torch"``.

    Returns:
        ``h`` of the input shape and dtype, and the final state if asked for.

    Examples:
        >>> a = torch.full((2, 5, 1), 0.5)
        >>> b = torch.ones(2, 5, 1)
        >>> linear_scan(a, b, reverse=True)[0, :, 0]
        tensor([1.9375, 1.8750, 1.7500, 1.5000, 1.0000])
    """
    layout = check_inputs(time_dim, {"a": a, "b": b}, {}, {"initial_state": initial_state})
    backend = resolve_backend(backend, layout.device, a, b, initial_state)
    if layout.empty:
        h = torch.empty(layout.shape, dtype=layout.dtype, device=layout.device)
        return (h, empty_state(layout, initial_state)) if output_final_state else h
    if backend != "triton":
        hs, ht = scan_rows(rows_time(a, layout), rows_time(b, layout), rows_state(initial_state), reverse, backend)
        h = from_rows_time(hs, layout)
        return (h, state_out(ht, layout)) if output_final_state else h
    (h,) = new_outputs(layout, 1)
    ht = launch(_linear_scan_fwd_kernel, layout, inputs={"a": a, "b": b}, outputs={"h": h},
                initial_state=initial_state, output_final_state=output_final_state, REVERSE=reverse)
    return (h, ht) if output_final_state else h


def empty_state(layout: Layout, initial_state):
    """The final state of an empty sequence (T = 0 or no rows): the initial state, or zeros."""
    if initial_state is not None:
        return initial_state.to(layout.acc_dtype).clone()
    return torch.zeros(layout.state_shape, dtype=layout.acc_dtype, device=layout.device)
