"""Where a fused kernel's time goes: the same kernels with one stage left out or done differently.

    python benchmarks/ablate_kernels.py                                   # default variants, shapes, algorithms
    python benchmarks/ablate_kernels.py --variants base,noscan --shapes 65536x512 --algorithms gae
    ncu --clock-control none -k regex:_fwd_kernel python benchmarks/ablate_kernels.py --worker base --once
    python benchmarks/ablate_kernels.py --variants pipe1,pipe2,pipe3 --dtype bfloat16   # pipelined chunk loops
    python benchmarks/ablate_kernels.py --variants unaligned,base --shapes 65536x2047,65536x2048,16384x257,16384x256

Each variant runs in a process of its own, with one helper of the scan core (``kernels/scan.py``) replaced before
any kernel compiles; every algorithm kernel picks the replacement up, since they share those helpers:

- ``base``: the kernels as they are.
- ``noscan``: no scan: the tile's outputs are a_t + b_t (all loads and the coefficient arithmetic stay live). The
  difference to ``base`` is the scan's share.
- ``i32``: 32-bit offsets in every kernel (where every offset fits); ``i64``: 64-bit offsets in every kernel (main
  takes 32-bit ones in the kernels of ``scan.INT32_KERNELS``).
- ``stream``: loads marked ``evict_first`` and stores ``.cs`` (streaming: the data is touched once).
- ``fwdfake``: the forward scan in place of every reverse one (wrong numbers on purpose, not checked): the work of a
  reverse scan that needs no reversal of its data, an upper bound on what removing Triton's can give.
- ``pipe1``, ``pipe2``, ``pipe3``: the chunk loops of every kernel's 128-step row tiles over 1, 2 or 3 stages
  (``scan.PIPELINE_KERNELS``, ``PIPELINE_STAGES``; main pipelines some kernels over 3).
- ``nochain``: look-back chunks that do not look back: each enters with the row's initial state (wrong numbers on
  purpose, not checked; no status word written or read). The difference to ``base`` is what the look-back costs.
- ``win64``, ``win128``: look-back windows of 64 or 128 predecessors (``scan.LOOKBACK_WINDOW``, 32 on main).
- ``rowmajor``: look-back tickets handing out a row's chunks one after another (``scan.ticket_chunk`` gives them to
  the rows in turn, so that fewer chunks of one row are in flight at once and a look-back walks fewer windows).
- ``unaligned``: no aligned windows (``scan.WINDOW_KERNELS`` empty; main names every kernel): rows whose length is no
  multiple of 4 loaded one element per instruction instead of in whole 16-byte groups from the boundary at or before
  each row (``scan.chunk``, ``scan._aligned_window``); compare ``--shapes 65536x2047,65536x2048,16384x257,...``.
- ``minchunks1``, ``minchunks2``: aligned windows also where they add a chunk to a row's walk of at least 1 or 2
  chunks (``scan.WINDOW_MIN_CHUNKS``, 4 on main); compare ``--shapes 4096x255,4096x256,64x4095,64x4096``.
- ``lookback2049``: look-back chunks for few rows from 2049 steps on (``scan.LOOKBACK_MIN_T``, 4096 on main).
- ``wide4096``: one-row tiles of up to 4096 steps (``scan.WIDE_MAX_T``, 2048 on main), so that rows of 2049-4095
  steps in at most ``scan.WIDE_MAX_ROWS`` rows (below the look-back's 4096 steps) take one tile instead of two.
- ``nowidelong``: the rule without its 4096-step tiles for few rows (``scan.WIDE_LONG_MAX_ROWS`` empty).
- ``flip``: reverse scans of one-row tiles wider than ``scan.WARP_LOCAL_T`` steps (few rows of medium length) with
  the tile's columns backward in time (descending addresses) and scanned forward, instead of Triton's reverse scan,
  which reverses its inputs and outputs across lanes and warps; ``fliplb``: look-back chunks of one row too.
- ``warpst``: one-row tiles on one warp per 128 steps (4 to 16 warps; main: 8 but for ``scan.WIDE_TILE_WARPS``,
  the A/B of af85518 that set it, 4 above ``scan.WIDE_FEW_WARPS_ROWS`` rows).
- ``vt2048``: V-trace's one-row tiles of up to 2048 steps on 4 warps too, as the other kernels'
  (``scan.WIDE_4_WARPS_MAX_T``; up to ad197e7 it capped them at 1024 steps on any number of warps).
- ``vtlong``: V-trace's one-row tiles of up to 4096 steps for up to 256 rows of 2049-4095 steps, as GAE's
  (``scan.WIDE_LONG_MAX_ROWS``; main: up to 128 rows, since 2026-12-06; before, 2048-step tiles walked in turn).
- ``vtshift``: V-trace's one-row tiles in its shifted mode as wide as with next values (``scan.WIDE_SHIFTED_MAX_T``
  empty; main: 2048 steps since af85518's A/B, 1024 before); with ``warpst`` (``warpst_vtshift``) 512 x 2048 takes
  one 2048-step tile on 16 warps, as main does now.
- ``row128``: at most 1024 rows of 9-128 steps one row per program on one warp (main: 4 rows per program).
- ``oldlong``: one-row tiles of 4096 steps only for at most 256 rows (V-trace 128) of 2049-4095 steps, as before
  2026-12-07 (main: ``scan.WIDE_LONG_MAX_ROWS``, every row count of the wide tiles for GAE, TD(λ) and the prefix-sum
  kernel, and at exactly 4096 steps where the look-back does not take the rows); the 4096-step tiles it keeps take
  main's warps.
- ``win2x``: one-row tiles that hold a row but not its aligned window (T no multiple of 4 and T + 3 past the tile:
  1022-1023, 2046-2047, 4094-4095 steps) twice as wide, on twice the warps up to 16, so that the window is taken
  (main: such rows load one element per instruction, ``scan._aligned_window``).
- ``oldwarps``: one-row tiles of ``scan.WIDE_LONG_T`` steps as at ec1a332: in up to 256 rows (V-trace 128), from
  3585 steps in up to 1024 rows (512 for the prefix-sum kernel), on 8 warps up to ``scan.WIDE_FEW_WARPS_ROWS`` rows
  and on 4 above (main, since 1d59d11 and the A/B of ``full2049`` at 0d9832c, a variant that set 1d59d11's
  ``WIDE_LONG_FULL_T`` to 2049: every row count from 2049 steps for GAE, TD(λ) and the prefix-sum kernel, on their
  warps at any number of rows, GAE's on 16 where the row holds its aligned window).
- ``long16``: one-row tiles of ``scan.WIDE_LONG_T`` steps in at most ``scan.WIDE_FEW_WARPS_ROWS`` rows on 16 warps
  (``scan.WIDE_TILE_WARPS``; main: 8).
- ``exitall``: the state leaving every tile computed, as before 2026-12-06 (main skips it in a call's last chunk
  unless the final state is stored: ``scan.scan_tile_enter``).
- ``loop``: every launch compiled with its chunk loop, as before 2026-12-06 (main compiles launches whose rows are
  one chunk without it: ``scan._one_chunk``).
- ``narrow``: V-trace reads vs_(t+1) back from its stored output in tiles of fewer than 128 steps (rows sharing a
  warp), as in its one-row tiles, instead of gathering it one column on (``vtrace.RELOAD_NARROW``, off on main;
  sm_90 SASS: no layout conversion left, 3 -> 1 barriers, in the shifted mode 17 -> 1).
- ``nogroup``: ``retrace_discrete`` reads its per-action tensors with a load per action and gathers (in a layout of
  their own, converted to the steps' through shared memory), as before 2026-12-06, instead of a group of steps'
  actions per load in the steps' layout (``retrace._action_group``).
- ``onechunkpa``: ``retrace_discrete``'s load per action compiled without its chunk loop in rows of one chunk
  (``retrace.ONE_CHUNK_PER_ACTION``), as when it read wrong values on an H200 at 16d0127; with ``nogroup`` every
  action count takes that path.
- ``rdw4``: ``retrace_discrete``'s 512-step one-row tiles on 4 warps (``scan.WIDE_TILE_WARPS``; main: 8, 2 steps
  per thread); ``rdw16``: its 1024- and 2048-step ones on 16 (main: 2048-step ones only); ``rdw16all``: its
  512-step ones too; ``rd2048w8``: its 2048-step ones on 8, as before main gave them 16.
- ``rdrow2``: ``retrace_discrete``'s 128-step row tiles of at most 1024 rows in 2 rows per program on 2 warps (main:
  4 rows on 4 warps; ``row128`` takes one row on one warp for every kernel).
- ``i32_stream``, ``noscan_i32``, ...: several at once.

Per cell: device time as in ``bench_kernels.py`` (do_bench median of a replayed one-call CUDA graph, L2 flushed),
the kernels' own duration from the GPU's activity records (``kernel_us``, L2 flushed, no launch counted), and both
as a fraction of the copy bandwidth measured in the same run. Only ``base`` and the variants that keep the
arithmetic are checked against the float64 torch path (``noscan`` computes something else on purpose).
Results: ``<out>/ablate_kernels.json`` and ``.md``, written after each variant; a SIGTERM (``timeout``) writes the
rows measured so far, the cut variant's included, and says so in the environment's ``interrupted``.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

from rl_triton_torchrl.kernels import scan as _scan

VARIANTS = ("base", "noscan", "i32", "i64", "stream", "i32_stream", "noscan_i32")
SHAPES = "65536x512,16384x2048,65536x128,4096x128,4096x32,65536x8"
ALGORITHMS = "gae,discounted_return,vtrace,td_lambda"


@triton.jit
def _scan_tile_enter_noscan(b_a, b_b, b_h0, m, REVERSE: tl.constexpr, CUT_A: tl.constexpr, lb_ptr, o_r, i_c,
                            n_chunks, LOOKBACK: tl.constexpr, STORE_FINAL_STATE: tl.constexpr):
    return b_a + b_b, b_h0, b_h0


@triton.jit
def _scan_tile_noscan(b_a, b_b, b_h0, m, REVERSE: tl.constexpr, CUT_A: tl.constexpr, lb_ptr, o_r, i_c, n_chunks,
                      LOOKBACK: tl.constexpr, STORE_FINAL_STATE: tl.constexpr):
    return b_a + b_b, b_h0


@triton.jit
def _load_tile_stream(base, o_o, o_i, o_t, s_o, s_t, s_i, m, ACC: tl.constexpr, w=None):
    # the same elements as load_tile, an aligned window's included (w unused: its pointers, not proven aligned)
    p = base + (o_o * s_o + o_i * s_i)[:, None] + o_t * s_t
    return tl.load(p, mask=m, other=0, eviction_policy="evict_first").to(ACC)


@triton.jit
def _store_tile_stream(base, b_x, o_o, o_i, o_t, T, inner, m, w=None):
    p = base + (o_o * (T * inner) + o_i)[:, None] + o_t * inner
    tl.store(p, b_x.to(base.dtype.element_ty), mask=m, cache_modifier=".cs")


@triton.jit
def _chain_state_none(lb_ptr, row, i_c, n_chunks, b_A, b_B, b_h0, LOOKBACK_WINDOW: tl.constexpr,
                      SPARSE: tl.constexpr):
    return b_h0


@triton.jit
def _ticket_chunk_rowmajor(ticket, n_rows, n_chunks):
    return ticket // n_chunks, ticket % n_chunks


# the core's own scan_tile_enter, kept before any variant replaces it in the scan module
_SCAN_TILE_ENTER = _scan.scan_tile_enter


@triton.jit
def _scan_tile_enter_fwdfake(b_a, b_b, b_h0, m, REVERSE: tl.constexpr, CUT_A: tl.constexpr, lb_ptr, o_r, i_c,
                             n_chunks, LOOKBACK: tl.constexpr, STORE_FINAL_STATE: tl.constexpr):
    # the forward scan in place of the reverse one: wrong numbers, the work a reverse scan without Triton's data
    # reversal would do (an upper bound on what removing it can give)
    return _SCAN_TILE_ENTER(b_a, b_b, b_h0, m, False, CUT_A, lb_ptr, o_r, i_c, n_chunks, LOOKBACK, STORE_FINAL_STATE)


@triton.jit
def _scan_tile_enter_exitall(b_a, b_b, b_h0, m, REVERSE: tl.constexpr, CUT_A: tl.constexpr, lb_ptr, o_r, i_c,
                             n_chunks, LOOKBACK: tl.constexpr, STORE_FINAL_STATE: tl.constexpr):
    # the state leaving every tile computed, read or not (up to this variant's commit)
    return _SCAN_TILE_ENTER(b_a, b_b, b_h0, m, REVERSE, CUT_A, lb_ptr, o_r, i_c, n_chunks, LOOKBACK, True)


# the core's own chunk and launch rule, kept before any variant replaces them
_CHUNK = _scan.chunk
_chunk_start = _scan._chunk_start
_NEXT_COLUMN = _scan.next_column
WARP_LOCAL_T = _scan.WARP_LOCAL_T
_LAUNCH_CONFIG = _scan.launch_config


@triton.jit
def _chunk_flipped(i_c, n_chunks, T, o_o, m_r, BLOCK_T: tl.constexpr, REVERSE: tl.constexpr, LOOKBACK: tl.constexpr,
                   WINDOW: tl.constexpr, INT64: tl.constexpr, IN_LOOKBACK: tl.constexpr):
    if REVERSE and m_r.shape[0] == 1 and BLOCK_T > WARP_LOCAL_T and (IN_LOOKBACK or not LOOKBACK):
        # column j is step BLOCK_T - 1 - j of the chunk: the tile's columns run backward in time, so that the
        # reverse scan is a forward one over the columns (no reversal of the data across lanes)
        o_t = _chunk_start(i_c, n_chunks, BLOCK_T, REVERSE, INT64) + (BLOCK_T - 1 - tl.arange(0, BLOCK_T))
        o_t = o_t[None, :]
        m = m_r[:, None] & (o_t < T)
        return o_t, m, (m,)
    else:
        return _CHUNK(i_c, n_chunks, T, o_o, m_r, BLOCK_T, REVERSE, LOOKBACK, WINDOW, INT64)


@triton.jit
def _chunk_flip(i_c, n_chunks, T, o_o, m_r, BLOCK_T: tl.constexpr, REVERSE: tl.constexpr, LOOKBACK: tl.constexpr,
                WINDOW: tl.constexpr, INT64: tl.constexpr):
    return _chunk_flipped(i_c, n_chunks, T, o_o, m_r, BLOCK_T, REVERSE, LOOKBACK, WINDOW, INT64, False)


@triton.jit
def _chunk_fliplb(i_c, n_chunks, T, o_o, m_r, BLOCK_T: tl.constexpr, REVERSE: tl.constexpr, LOOKBACK: tl.constexpr,
                  WINDOW: tl.constexpr, INT64: tl.constexpr):
    return _chunk_flipped(i_c, n_chunks, T, o_o, m_r, BLOCK_T, REVERSE, LOOKBACK, WINDOW, INT64, True)


@triton.jit
def _scan_tile_enter_flip(b_a, b_b, b_h0, m, REVERSE: tl.constexpr, CUT_A: tl.constexpr, lb_ptr, o_r, i_c,
                          n_chunks, LOOKBACK: tl.constexpr, STORE_FINAL_STATE: tl.constexpr):
    if REVERSE and b_a.shape[0] == 1 and b_a.shape[1] > WARP_LOCAL_T and not LOOKBACK:
        return _SCAN_TILE_ENTER(b_a, b_b, b_h0, m, False, CUT_A, lb_ptr, o_r, i_c, n_chunks, LOOKBACK, STORE_FINAL_STATE)
    else:
        return _SCAN_TILE_ENTER(b_a, b_b, b_h0, m, REVERSE, CUT_A, lb_ptr, o_r, i_c, n_chunks, LOOKBACK, STORE_FINAL_STATE)


@triton.jit
def _scan_tile_enter_fliplb(b_a, b_b, b_h0, m, REVERSE: tl.constexpr, CUT_A: tl.constexpr, lb_ptr, o_r, i_c,
                            n_chunks, LOOKBACK: tl.constexpr, STORE_FINAL_STATE: tl.constexpr):
    if REVERSE and b_a.shape[0] == 1 and b_a.shape[1] > WARP_LOCAL_T:
        return _SCAN_TILE_ENTER(b_a, b_b, b_h0, m, False, CUT_A, lb_ptr, o_r, i_c, n_chunks, LOOKBACK, STORE_FINAL_STATE)
    else:
        return _SCAN_TILE_ENTER(b_a, b_b, b_h0, m, REVERSE, CUT_A, lb_ptr, o_r, i_c, n_chunks, LOOKBACK, STORE_FINAL_STATE)


@triton.jit
def _next_column_flip(b_x, b_last):
    # in a one-row tile wider than 128 steps (flipped by the variants above: only reverse scans use next_column
    # there) the next step is the column before, and column 0 is the last in time
    if b_x.shape[0] == 1 and b_x.shape[1] > WARP_LOCAL_T:
        n: tl.constexpr = b_x.shape[1]
        o_c = tl.arange(0, n)
        b_next = tl.gather(b_x, tl.broadcast_to(tl.maximum(o_c - 1, 0)[None, :], b_x.shape), 1)
        return tl.where((o_c == 0)[None, :], b_last[:, None], b_next)
    else:
        return _NEXT_COLUMN(b_x, b_last)


def _launch_config_warpst(layout, kernel_name=None, shifted=False):
    # one-row tiles (not look-back chunks) on one warp per 128 steps, 4 to 16 (main: scan.WIDE_TILE_WARPS, else 8; 4 above 512 rows)
    cfg = _LAUNCH_CONFIG(layout, kernel_name, shifted)
    if cfg["BLOCK_R"] == 1 and not cfg["LOOKBACK"] and cfg["BLOCK_T"] > _scan.MAX_BLOCK_T:
        cfg["num_warps"] = max(4, min(16, cfg["BLOCK_T"] // 128))
    return cfg


def _launch_config_oldlong(layout, kernel_name=None, shifted=False):
    # 4096-step one-row tiles only up to _OLD_LONG_ROWS rows of fewer than 4096 steps, as before 2026-12-07 (main:
    # scan.WIDE_LONG_MAX_ROWS, and at exactly 4096)
    cfg = _LAUNCH_CONFIG(layout, kernel_name, shifted)
    if (cfg["BLOCK_R"] == 1 and not cfg["LOOKBACK"] and cfg["BLOCK_T"] == _scan.WIDE_LONG_T
            and (layout.rows > _OLD_LONG_ROWS.get(kernel_name, 0) or layout.T >= _scan.LOOKBACK_MIN_T)):
        few_warps = layout.rows <= _scan.WIDE_FEW_WARPS_ROWS
        block_t = _scan.WIDE_MAX_T if few_warps else _scan.WIDE_4_WARPS_MAX_T.get(kernel_name, _scan.WIDE_MAX_T)
        if shifted:
            block_t = min(block_t, _scan.WIDE_SHIFTED_MAX_T.get(kernel_name, block_t))
        warps = _scan.WIDE_TILE_WARPS.get(kernel_name, {}).get(block_t, _scan.WIDE_WARPS) if few_warps else 4
        cfg.update(BLOCK_T=block_t, num_warps=warps)
    return cfg


# the rows up to which the kernels took 4096-step tiles before 2026-12-07 (scan.WIDE_LONG_MAX_ROWS then), and from
# 3585 steps on, at ec1a332
_OLD_LONG_ROWS = {"_gae_fwd_kernel": 256, "_td_lambda_fwd_kernel": 256, "_prefix_sum_fwd_kernel": 256,
                  "_vtrace_fwd_kernel": 128}
_OLD_FULL_ROWS = {"_gae_fwd_kernel": 1024, "_td_lambda_fwd_kernel": 1024, "_prefix_sum_fwd_kernel": 512}


def _launch_config_oldwarps(layout, kernel_name=None, shifted=False):
    # 4096-step one-row tiles as at ec1a332: from 3585 steps in up to _OLD_FULL_ROWS[kernel] rows, on WIDE_WARPS
    # warps up to WIDE_FEW_WARPS_ROWS rows and 4 above (main: from 3584 steps in up to WIDE_MAX_ROWS rows, on their
    # warps at any number of rows, GAE's on 16 where the row holds its aligned window)
    cfg = _LAUNCH_CONFIG(layout, kernel_name, shifted)
    if cfg["BLOCK_R"] != 1 or cfg["LOOKBACK"] or cfg["BLOCK_T"] != _scan.WIDE_LONG_T:
        return cfg
    few_warps = layout.rows <= _scan.WIDE_FEW_WARPS_ROWS
    long_rows = max(_OLD_LONG_ROWS.get(kernel_name, 0),
                    _OLD_FULL_ROWS.get(kernel_name, 0) if layout.T >= 3585 else 0)
    block_t = _scan.WIDE_LONG_T if layout.rows <= long_rows else _scan.WIDE_MAX_T
    if not few_warps:
        warps = 4
    elif block_t == _scan.WIDE_LONG_T:  # WIDE_TILE_WARPS named no 4096-step tiles then
        warps = _scan.WIDE_WARPS
    else:
        warps = _scan.WIDE_TILE_WARPS.get(kernel_name, {}).get(block_t, _scan.WIDE_WARPS)
    cfg.update(BLOCK_T=block_t, num_warps=warps)
    return cfg


def _launch_config_win2x(layout, kernel_name=None, shifted=False):
    # one-row tiles that hold a row but not its aligned window (T no multiple of 4, T + 3 past the tile: 1022-1023,
    # 2046-2047, 4094-4095 steps) twice as wide, on twice the warps (at most 16), so that the window is taken
    # (scan._aligned_window; main: one element per load there)
    cfg = _LAUNCH_CONFIG(layout, kernel_name, shifted)
    if (cfg["BLOCK_R"] == 1 and not cfg["LOOKBACK"] and cfg["BLOCK_T"] > _scan.MAX_BLOCK_T and layout.T % 4
            and layout.T <= cfg["BLOCK_T"] < layout.T + 3):
        cfg.update(BLOCK_T=2 * cfg["BLOCK_T"], num_warps=min(16, 2 * cfg["num_warps"]))
    return cfg


def _launch_config_row128(layout, kernel_name=None, shifted=False):
    # at most 1024 rows of 9-128 steps: one row per program on one warp (main: 4 rows per program on 4 warps)
    cfg = _LAUNCH_CONFIG(layout, kernel_name, shifted)
    if (cfg["BLOCK_T"] == _scan.MAX_BLOCK_T and layout.T <= _scan.MAX_BLOCK_T and layout.rows <= 1024
            and not cfg["LOOKBACK"] and cfg["BLOCK_R"] > 1):
        cfg.update(grid=(layout.rows,), BLOCK_R=1, num_warps=1)
        cfg.pop("maxnreg", None)
    return cfg


def _launch_config_rdrow2(layout, kernel_name=None, shifted=False):
    # retrace_discrete's 128-step row tiles of at most 1024 rows: 2 rows per program on 2 warps (main: 4 on 4)
    cfg = _LAUNCH_CONFIG(layout, kernel_name, shifted)
    if (kernel_name == "_retrace_discrete_fwd_kernel" and cfg["BLOCK_T"] == _scan.MAX_BLOCK_T
            and layout.T <= _scan.MAX_BLOCK_T and layout.rows <= 1024 and not cfg["LOOKBACK"] and cfg["BLOCK_R"] > 2):
        cfg.update(grid=(-(-layout.rows // 2),), BLOCK_R=2, num_warps=2)
        cfg.pop("maxnreg", None)
    return cfg


PATCHES = {
    "fwdfake": {"scan_tile_enter": _scan_tile_enter_fwdfake},
    "noscan": {"scan_tile": _scan_tile_noscan, "scan_tile_enter": _scan_tile_enter_noscan},
    "exitall": {"scan_tile_enter": _scan_tile_enter_exitall},
    # every launch compiled with its chunk loop, rows of one chunk included (scan._one_chunk)
    "loop": {"_one_chunk": lambda layout, cfg: False},
    # the offsets' type of every kernel (scan.INT32_KERNELS; int32 only where every offset fits, as on main)
    "i32": {"INT32_KERNELS": _scan.KERNELS},
    "i64": {"INT32_KERNELS": frozenset()},
    "stream": {"load_tile": _load_tile_stream, "store_tile": _store_tile_stream},
    "nochain": {"chain_state": _chain_state_none},
    "win64": {"LOOKBACK_WINDOW": 64},
    "win128": {"LOOKBACK_WINDOW": 128},
    "rowmajor": {"ticket_chunk": _ticket_chunk_rowmajor},
    "pipe1": {"PIPELINE_KERNELS": frozenset()},
    "pipe2": {"PIPELINE_KERNELS": _scan.KERNELS, "PIPELINE_STAGES": 2},
    "pipe3": {"PIPELINE_KERNELS": _scan.KERNELS, "PIPELINE_STAGES": 3},
    "unaligned": {"WINDOW_KERNELS": frozenset()},
    # aligned windows also where the window's up to 3 more steps add a chunk to a walk of 1 or 2 chunks or more
    # (scan.WINDOW_MIN_CHUNKS, 4 on main: such rows load one element per instruction)
    "minchunks1": {"WINDOW_MIN_CHUNKS": 1},
    "minchunks2": {"WINDOW_MIN_CHUNKS": 2},
    # look-back chunks for few rows from 2049 steps on, where a row has two of them (scan.LOOKBACK_MIN_T, 4096 on
    # main: one program per row before)
    "lookback2049": {"LOOKBACK_MIN_T": 2049},
    # one-row tiles of up to 4096 steps (scan.WIDE_MAX_T, 2048 on main: rows of 2049-4095 steps walk two tiles)
    "wide4096": {"WIDE_MAX_T": 4096},
    # no 4096-step tiles for few rows of 2049-4095 steps (scan.WIDE_LONG_MAX_ROWS 0: the rule before it)
    "nowidelong": {"WIDE_LONG_MAX_ROWS": {}},
    # reverse scans of one-row tiles wider than 128 steps with the tile's columns backward in time (addresses
    # descending along the columns) and scanned forward, instead of Triton's reverse scan; not in look-back chunks
    # (flip) or there too (fliplb)
    "flip": {"chunk": _chunk_flip, "scan_tile_enter": _scan_tile_enter_flip, "next_column": _next_column_flip},
    "fliplb": {"chunk": _chunk_fliplb, "scan_tile_enter": _scan_tile_enter_fliplb, "next_column": _next_column_flip},
    "warpst": {"launch_config": _launch_config_warpst},
    # V-trace's one-row tiles as wide as the others' on 4 warps too (scan.WIDE_4_WARPS_MAX_T: 1024 steps on main)
    "vt2048": {"WIDE_4_WARPS_MAX_T": {}},
    # V-trace's one-row tiles of up to 4096 steps for up to 256 rows of 2049-4095 steps (scan.WIDE_LONG_MAX_ROWS)
    "vtlong": {"WIDE_LONG_MAX_ROWS": {**_scan.WIDE_LONG_MAX_ROWS, "_vtrace_fwd_kernel": 256}},
    # V-trace's shifted one-row tiles as wide as with next values (scan.WIDE_SHIFTED_MAX_T; main: 2048 steps)
    "vtshift": {"WIDE_SHIFTED_MAX_T": {}},
    "row128": {"launch_config": _launch_config_row128},
    "oldlong": {"launch_config": _launch_config_oldlong},
    "win2x": {"launch_config": _launch_config_win2x},
    "oldwarps": {"launch_config": _launch_config_oldwarps},
    # reverse scans' one-row tiles in time order and Triton's reverse scan, as before DESCENDING tiles (GAE's,
    # TD(lambda)'s and V-trace's, scan.DESCENDING_KERNELS; the kernels still take the flag, now always False)
    "ascending": {"_descending": lambda *args: False},
    # the TD(lambda) kernel's 512-step one-row tiles on 8 warps (2 steps per thread: in time order), as before
    # scan.WIDE_TILE_WARPS gave them 4 (DESCENDING)
    "td512w8": {"WIDE_TILE_WARPS": {k: v for k, v in _scan.WIDE_TILE_WARPS.items() if k != "_td_lambda_fwd_kernel"}},
    # V-trace's 512-step one-row tiles on 8 warps (2 steps per thread: in time order), as before scan.WIDE_TILE_WARPS
    # gave them 4 (DESCENDING)
    "vt512w8": {"WIDE_TILE_WARPS": {**_scan.WIDE_TILE_WARPS,
                                    "_vtrace_fwd_kernel": {**_scan.WIDE_TILE_WARPS["_vtrace_fwd_kernel"], 512: 8}}},
    # one-row tiles of WIDE_LONG_T steps on 16 warps where they take few rows' warps (scan.WIDE_TILE_WARPS; main
    # at 100700f: 8)
    "long16": {"WIDE_TILE_WARPS": {k: {**_scan.WIDE_TILE_WARPS.get(k, {}), _scan.WIDE_LONG_T: 16}
                                   for k in _scan.WIDE_LONG_MAX_ROWS}},
    # V-trace's vs_(t+1) read back from the stored output in tiles of fewer than 128 steps too (vtrace.RELOAD_NARROW;
    # main gathers it one column on there, through shared memory)
    "narrow": {"RELOAD_NARROW": tl.constexpr(True)},
    # retrace_discrete's per-action tensors read with a load per action and gathers, as before 2026-12-06, not in
    # groups of a step's actions (retrace._action_group)
    "nogroup": {"_action_group": lambda *args: 0},
    # retrace_discrete's load per action without its chunk loop in rows of one chunk, as at f6ebe50-16d0127
    # (retrace.ONE_CHUNK_PER_ACTION; main keeps the loop there)
    "onechunkpa": {"ONE_CHUNK_PER_ACTION": tl.constexpr(True)},
    # retrace_discrete's one-row tiles on fewer or more warps than WIDE_WARPS (8, its tiles of every width on main)
    "rdw4": {"WIDE_TILE_WARPS": {**_scan.WIDE_TILE_WARPS, "_retrace_discrete_fwd_kernel": {512: 4}}},
    "rdw16": {"WIDE_TILE_WARPS": {**_scan.WIDE_TILE_WARPS, "_retrace_discrete_fwd_kernel": {1024: 16, 2048: 16}}},
    "rdw16all": {"WIDE_TILE_WARPS": {**_scan.WIDE_TILE_WARPS,
                                     "_retrace_discrete_fwd_kernel": {512: 16, 1024: 16, 2048: 16}}},
    "rdrow2": {"launch_config": _launch_config_rdrow2},
    # retrace_discrete's 2048-step one-row tiles on 8 warps, as before scan.WIDE_TILE_WARPS gave them 16
    "rd2048w8": {"WIDE_TILE_WARPS": {k: v for k, v in _scan.WIDE_TILE_WARPS.items()
                                     if k != "_retrace_discrete_fwd_kernel"}},
}


def apply_variant(variant: str) -> None:
    """Replaces the scan core's helpers named by ``variant`` in every kernel module that uses them."""
    import rl_triton_torchrl.kernels  # noqa: F401 - every kernel module

    parts = [] if variant == "base" else variant.split("_")
    modules = [sys.modules[f"rl_triton_torchrl.kernels.{n}"] for n in (
        "scan", "gae", "td_lambda", "vtrace", "retrace", "prefix_sum", "eligibility_traces")]
    for part in parts:
        for name, fn in PATCHES[part].items():
            for module in modules:
                if name in vars(module):
                    setattr(module, name, fn)


def worker(args) -> None:
    apply_variant(args.worker)
    from _common import copy_bandwidth, device_time_us, kernel_time_us
    from bench_kernels import ALGOS, _tuple, as_float64, check, rollout
    from sweep_configs import EXTRA_ALGOS  # GAE's and V-trace's shifted input modes (gae_shifted, vtrace_shifted)

    ALGOS = {**ALGOS, **EXTRA_ALGOS}

    dtype = getattr(torch, args.dtype)
    if args.once:  # one call per algorithm and shape, nothing timed: a target for a profiler (ncu)
        for shape in args.shapes.split(","):
            B, T = (int(v) for v in shape.split("x"))
            x = rollout(B, T, dtype, "with")
            for algo in args.algorithms.split(","):
                ALGOS[algo].call(x, "triton")
        torch.cuda.synchronize()
        return
    bw = copy_bandwidth()
    rows = []
    for shape in args.shapes.split(","):
        B, T = (int(v) for v in shape.split("x"))
        x = rollout(B, T, dtype, "with")
        for algo in args.algorithms.split(","):
            spec = ALGOS[algo]
            fn = lambda: spec.call(x, "triton")  # noqa: E731
            err = None
            if not any(v in args.worker for v in ("noscan", "fake", "nochain")) and B * T <= 1 << 22:
                refs = _tuple(spec.call(as_float64(x), "torch"))  # the float64 torch path
                err = check(fn(), refs, dtype)
            us, how = device_time_us(fn, True, 3, 20)
            k_us = kernel_time_us(fn)
            nbytes = B * T * spec.bytes_per_element(dtype.itemsize, "with")
            src = torch.empty(nbytes // 2, dtype=torch.uint8, device="cuda")
            dst = torch.empty_like(src)
            copy_us, _ = device_time_us(lambda: dst.copy_(src), True, 3, 20)  # moves the cell's bytes: the floor
            del src, dst
            rows.append({"variant": args.worker, "algorithm": algo, "B": B, "T": T, "dtype": args.dtype,
                         "device_us": us, "kernel_us": k_us, "bytes": nbytes, "bw_frac": nbytes / (us * 1e-6) / bw,
                         "kernel_bw_frac": nbytes / (k_us * 1e-6) / bw, "err": err, "timing": how,
                         "copy_GBps": bw / 1e9, "same_bytes_copy_us": copy_us})
            print(json.dumps(rows[-1]), flush=True)
            torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--shapes", default=SHAPES, help="comma-separated BxT")
    parser.add_argument("--algorithms", "--algos", default=ALGORITHMS)
    parser.add_argument("--out", default="h200", help="a folder, or a name of one under benchmarks/results/")
    parser.add_argument("--name", default="ablate_kernels")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--once", action="store_true", help="with --worker VARIANT: one call per cell, untimed "
                        "(a profiler's target)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"),
                        help="the inputs' dtype")
    args = parser.parse_args()
    if args.worker:
        return worker(args)
    out = Path(args.out)
    out = out if os.sep in args.out or args.out.startswith(".") else Path(__file__).parent / "results" / out
    rows, proc = [], None
    # a timeout's SIGTERM ends the run with what was measured: the results are written after every variant and
    # once more with the rows of the variant cut short (each worker prints its rows as it measures them)
    signal.signal(signal.SIGTERM, _on_sigterm)
    try:
        for variant in args.variants.split(","):
            proc = subprocess.Popen([sys.executable, __file__, "--worker", variant, "--shapes", args.shapes,
                                     "--algorithms", args.algorithms, "--dtype", args.dtype], stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True, cwd=Path(__file__).parent)
            got, other = [], []  # the rows, and the rest of its output (an error's traceback)
            for line in proc.stdout:
                if line.startswith("{"):
                    got.append(json.loads(line))
                    rows.append(got[-1])
                else:
                    other = (other + [line])[-40:]
            proc.wait()
            print(f"{variant}: {len(got)} rows" + ("" if proc.returncode == 0 else f", exit {proc.returncode}: "
                                                    + "".join(other)[-2000:]), flush=True)
            write(rows, out, args.name)
    except _Stop as e:
        if proc is not None and proc.poll() is None:
            proc.terminate()
        print(f"interrupted ({e}): writing the {len(rows)} rows measured", flush=True)
        write(rows, out, args.name, interrupted=str(e))


class _Stop(Exception):
    """A SIGTERM (a timeout) during the run."""


def _on_sigterm(signum, frame):
    raise _Stop(f"signal {signum}")


def write(rows, out: Path, name: str, interrupted: str | None = None) -> None:
    from _common import environment

    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    env["command"] = "python benchmarks/ablate_kernels.py " + " ".join(sys.argv[1:])
    if interrupted:
        env["interrupted"] = interrupted
    (out / f"{name}.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    cells = list(dict.fromkeys((r["algorithm"], r["B"], r["T"]) for r in rows))
    by = {(r["variant"], r["algorithm"], r["B"], r["T"]): r for r in rows}
    dtypes = ", ".join(dict.fromkeys(r.get("dtype", "float32") for r in rows))
    lines = [f"# Kernel ablation (one stage left out or changed; {dtypes})", "",
             "Generated by `benchmarks/ablate_kernels.py`; do not edit by hand.", ""]
    lines += [f"- {k}: {v}" for k, v in env.items()]
    lines += ["", "Per variant: device µs (do_bench, one-call graph, L2 flushed) / kernel µs (activity records, L2 "
              "flushed) and the kernel time's fraction of the copy bandwidth. `err` > tolerance is marked wrong.", "",
              "`copy`: a device-to-device copy of the cell's bytes (read half, write half), device µs (% of the copy "
              "bandwidth): what any one kernel of that size pays at least.", "",
              "| algorithm | B | T | copy | " + " | ".join(variants) + " |",
              "|---|---|---|---|" + "---|" * len(variants)]
    for algo, B, T in cells:
        timed = [r for r in rows if (r["algorithm"], r["B"], r["T"]) == (algo, B, T) and r.get("same_bytes_copy_us")]
        cols = ["-"]
        if timed:  # the fastest of the variants' copies
            c = min(timed, key=lambda r: r["same_bytes_copy_us"])
            c_us = c["same_bytes_copy_us"]
            cols = [f"{c_us:.1f} ({100 * c['bytes'] / (c_us * 1e-6) / (c['copy_GBps'] * 1e9):.0f}%)"]
        for v in variants:
            r = by.get((v, algo, B, T))
            if r is None:
                cols.append("-")
                continue
            bad = " wrong" if r["err"] is not None and r["err"] < 0 else ""
            cols.append(f"{r['device_us']:.1f} / {r['kernel_us']:.1f} ({100 * r['kernel_bw_frac']:.0f}%){bad}")
        lines.append(f"| {algo} | {B} | {T} | " + " | ".join(cols) + " |")
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-len(cells) - 2:]))


if __name__ == "__main__":
    main()
