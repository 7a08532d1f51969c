"""Launch-configuration sweep of our fused kernels: which tile shape, warp count, loop pipelining and mode (tiles of
rows, or one program per chunk with look-back) is fastest per shape. Feeds ``scan.launch_config``.

    python benchmarks/sweep_configs.py [--preset large,short,long,tiles] [--algorithms gae,vtrace] [--budget-s 240]
    python benchmarks/sweep_configs.py --preset peer_small --metric graph --algorithms gae_shifted,vtrace

Every configuration is checked against the float64 torch path before it is timed (``--metric do_bench``, the
default: do_bench median of a replayed one-call CUDA graph, L2 flushed; ``--metric graph``: one call captured 50
times in a CUDA graph, per call, L2 warm, the median of 5 replays: ``bench_peers.py``'s "graph" timing, by which
target (b) of issue 17 is judged); a wrong one is reported as wrong. Writes ``results/<out>/<name>.json`` and a
markdown table with each cell's best configuration and the current default's time.
"""
from __future__ import annotations

import argparse
import itertools
import sys
import time

import torch
import triton

from _common import copy_bandwidth, device_time_us, environment, graph_time_us, wall_time_us, write_results
from bench_kernels import ALGOS, GAMMA, LMBDA, Algorithm, _tuple, as_float64, check, rollout
from rl_triton_torchrl import kernels as K
from rl_triton_torchrl.kernels import scan

# Algorithms the sweep takes besides bench_kernels' ALGOS: GAE and V-trace in their shifted input mode (V(s_(t+1))
# read from the values one step on, the last from ``last_state_value``: how bench_peers.py runs them without
# truncations; no terminated flag, as that mode wants). The last value is a strided view, which the kernels read as
# it is: before 35a9fc4 it was ``.contiguous()``, a copy kernel inside every timed call (results/h200/
# sweep_peer_small.md's and results/h100/sweep_vtrace_shifted_7bee9fb.md's shifted rows include it).
EXTRA_ALGOS = {
    "gae_shifted": Algorithm(
        lambda x, be: K.gae(x["r"], x["v"], None, x["d"], gamma=GAMMA, lmbda=LMBDA,
                            last_state_value=x["nv"][:, -1], backend=be),
        floats=2, outputs=2, has_terminated=False),
    # V-trace without a terminated flag, with its next values (how bench_peers.py ran V-trace without truncations
    # until it had a shifted mode) and in that mode: the same numbers where every done step terminates
    "vtrace_no_term": Algorithm(
        lambda x, be: K.vtrace(x["lpi"], x["lmu"], x["v"], x["nv"], x["r"], x["d"], gamma=GAMMA, backend=be),
        floats=5, outputs=2, has_terminated=False),
    "vtrace_shifted": Algorithm(
        lambda x, be: K.vtrace(x["lpi"], x["lmu"], x["v"], None, x["r"], x["d"], gamma=GAMMA,
                               last_state_value=x["nv"][:, -1], backend=be),
        floats=4, outputs=2, has_terminated=False),
}
SWEPT_ALGOS = {**ALGOS, **EXTRA_ALGOS}


def rows_cfg(block_t, block_r, warps, stages=1):
    return {"mode": "tiles", "BLOCK_T": block_t, "BLOCK_R": block_r, "num_warps": warps, "NUM_STAGES": stages}


def lookback_cfg(block_t, warps, window=32, segments=1):
    """Look-back chunks of ``block_t`` steps, scanned as a tile of ``segments`` rows of ``block_t // segments``."""
    return {"mode": "look-back", "BLOCK_T": block_t // segments, "BLOCK_R": segments, "num_warps": warps,
            "NUM_STAGES": 1, "LOOKBACK": window}


def _tiles_candidates(T):
    """The current default's shape, whole-T tiles of other sizes, and narrow time tiles (a few steps per thread,
    many rows per program: the scan stays inside each thread) with and without loop pipelining."""
    bt = min(1 << max(1, (T - 1).bit_length()), 1024)
    out = [rows_cfg(bt, max(1, 1024 // bt), 4), rows_cfg(bt, max(1, 2048 // bt), 8)]
    for narrow in (4, 8, 16):
        if narrow < T:
            out += [rows_cfg(narrow, 128, 4), rows_cfg(narrow, 128, 4, 2), rows_cfg(narrow, 256, 8)]
    return out


def _whole_t_candidates(T):
    """Whole-T tiles: elements per program x warps x the longest time tile (the sweep behind
    results/h200/sweep_tiles.md, which chose TILE_ELEMENTS = 512)."""
    out = []
    for tile, warps, max_t in itertools.product((512, 1024, 2048, 4096, 8192), (2, 4, 8),
                                                 (512, 1024, 2048) if T > 512 else (1024,)):
        bt = min(1 << max(1, (T - 1).bit_length()), max_t)
        out.append(rows_cfg(bt, max(1, tile // bt), warps))
    return out


def _rows128_candidates(T):
    """128-step tiles (one warp per row: the reverse scans' own reversal) in 4-16 rows on 4 or 8 warps, against
    the former whole-T tiles (512 or 1024 steps, Triton's reverse scan)."""
    out = [rows_cfg(128, r, w) for r, w in itertools.product((4, 8, 16), (4, 8)) if r * 128 >= w * 128]
    return out + [rows_cfg(min(1 << max(1, (T - 1).bit_length()), 1024), 1, 4)]


def _regs_candidates(T):
    """The default 128-step tiles with the registers per thread capped (``maxnreg``): more programs per SM, fewer
    partial waves of long programs."""
    return [dict(rows_cfg(128, 4, 4), maxnreg=n) for n in (32, 40, 48, 64)]


def _few_rows_candidates(T):
    """Few rows of medium length (the GPU mostly idle with one warp per row walking 128-step chunks): whole rows in
    one wide tile on more warps, two or four rows per program, and look-back chunks of 128-step segments."""
    bt = min(1 << max(1, (T - 1).bit_length()), 4096)
    out = [rows_cfg(128, 4, 4), rows_cfg(128, 1, 1), rows_cfg(128, 2, 2)]
    for width in sorted({min(bt, w) for w in (256, 512, 1024, 2048, 4096)}):
        for warps in (2, 4, 8, 16):
            if width // (32 * warps) >= 1:
                out.append(rows_cfg(width, 1, warps))
    out += [rows_cfg(min(bt, 512), 2, 4), rows_cfg(min(bt, 512), 4, 8)]
    for chunk, warps in ((256, 2), (512, 4), (1024, 4), (1024, 8)):
        if chunk < T:
            out.append(lookback_cfg(chunk, warps, segments=chunk // 128))
    return out


def _peer_small_candidates(T):
    """rl-triton's small release cells (a few hundred rows, 128-4096 steps: 2-5 µs of device time, where the launch
    and one round trip to memory are most of it): one row per program in a tile of up to 4096 steps on 1-16 warps,
    2 or 4 rows per program, 128-step row tiles in 1-4 rows on 1-4 warps, and look-back chunks of 128-step segments.
    """
    bt = min(1 << max(1, (T - 1).bit_length()), 4096)
    out = [rows_cfg(128, r, w) for r, w in ((1, 1), (2, 2), (4, 4), (4, 2), (8, 4))]
    for width in sorted({min(bt, w) for w in (256, 512, 1024, 2048, 4096)} - {128}):
        out += [rows_cfg(width, 1, w) for w in (1, 2, 4, 8, 16) if 2 <= width // (32 * w) <= 16]
        out += [rows_cfg(width, 2, w) for w in (4, 8) if width * 2 <= 4096]
    for chunk, warps in ((512, 4), (1024, 4), (1024, 8), (2048, 8)):
        if chunk < T:
            out.append(lookback_cfg(chunk, warps, segments=chunk // 128))
    return out


def _odd_t_candidates(T):
    """Short sequences whose length is no power of two (T = 24: rows of 24 steps in 32-step tiles) and T = 8."""
    bt = 1 << max(1, (T - 1).bit_length())
    out = [rows_cfg(bt, r, w) for r, w in ((16, 4), (32, 4), (64, 4), (64, 8), (128, 8))]
    for narrow in (4, 8):
        if narrow < T:
            out += [rows_cfg(narrow, 128, 4), rows_cfg(narrow, 256, 8)]
    return out


def _time_major_candidates(T):
    """Time-major rollouts (``[T, N, 1]``, rsl_rl's storage: the rows are the environments, adjacent in memory):
    narrow time tiles of many rows, down to one step per tile (each thread recurs over time, its loads coalesced
    across environments), against whole-T tiles."""
    bt = 1 << max(1, (T - 1).bit_length())
    out = [rows_cfg(bt, r, w) for r, w in ((16, 4), (32, 8))]
    # few rows per program on few warps too: 4096 environments in tiles of 512 rows would be 8 programs
    out += [rows_cfg(narrow, r, w) for narrow in (1, 2, 4, 8) if narrow < T
            for r, w in ((32, 1), (64, 1), (64, 2), (128, 4), (256, 4), (512, 4), (1024, 8))]
    return out


# presets whose rollouts are time-major: each [B, T, 1] tensor of the rollout laid out as [1, T, B] (time at dim -2,
# the B environments its inner dimension), the layout of a [T, B, 1] tensor scanned with time_dim=0
TIME_MAJOR = {"time_major"}

PRESETS = {
    # time-major storage with thousands of environments (issue 19: rsl_rl / Isaac Lab)
    "time_major": ([(4096, 24), (16384, 24), (65536, 24), (65536, 8), (4096, 128)], _time_major_candidates),
    # few rows of medium length (issue 17's device-time misses against rl-triton)
    "few_rows": ([(128, 1024), (512, 2048), (64, 512), (128, 512), (16, 2048), (512, 512), (100, 1000),
                  (1000, 1024)], _few_rows_candidates),
    # rl-triton's release cells of at most 512 rows, where ours took more device time than rl-triton's in most
    # algorithms at f143092 (bench_peers.md: 2-5 µs against 1.5-3.5 µs by the 50-call graph); time with --metric graph
    "peer_small": ([(64, 512), (128, 1024), (256, 1024), (512, 128), (512, 512), (512, 2048), (512, 4096)],
                   _peer_small_candidates),
    # where the look-back mode's one program per chunk stops paying, against one wide tile per row walked in turn
    # (peer_small at 512 x 4096: the per-row tiles faster in all four kernels swept)
    "lookback_rows": ([(64, 4096), (128, 4096), (256, 4096), (512, 4096), (256, 8192), (512, 8192), (512, 16384)],
                      lambda T: [rows_cfg(2048, 1, 8), rows_cfg(1024, 1, 8), rows_cfg(2048, 1, 4),
                                 lookback_cfg(2048, 4), lookback_cfg(512, 4, segments=4),
                                 lookback_cfg(4096, 4, segments=32)]),
    # one 4096-step tile per row on 8 or 16 warps against two 2048-step ones walked in turn, in few rows and in more,
    # at 2049-4096 steps (peer_small at 512 x 4096: one 4096-step tile the fastest for every kernel swept, GAE's
    # shifted mode on 16 warps), and against the many-rows rule's pipelined 128-step tiles of 4 rows; at 4094 and 4095
    # steps also one 8192-step tile, the only one-chunk tile whose aligned window holds the row (a 4096-step tile
    # walks such a row with one-element loads: 512 x 4095 1.44x 4096's time per element in ablate_oldlong_d21f78b.md)
    "wide_long": ([(16, 2049), (16, 4095), (128, 4096), (512, 3584), (512, 4095), (512, 4096), (1024, 3584),
                   (1024, 4095), (1024, 4096)],
                  lambda T: [rows_cfg(w, 1, n) for w, n in ((2048, 4), (2048, 8), (2048, 16), (4096, 8), (4096, 16))]
                  + [rows_cfg(128, 4, 4, 3)]
                  + [rows_cfg(8192, 1, n) for n in (8, 16) if T % 4 and T + 3 > 4096]),
    # one wide tile per row (the few-rows rule): tile width against warps over the rows it covers (peer_small: 4 warps
    # faster than 8 for 512-step tiles at 512 rows, 8 faster for 2048-step ones)
    "wide_warps": ([(B, T) for B in (256, 512, 768, 1024) for T in (512, 1024, 2048)],
                   lambda T: [rows_cfg(w, 1, n) for w in (512, 1024, 2048) if w <= T for n in (4, 8)]),
    # T = 24 (Isaac Lab) and T = 8 with thousands of rows (issue 17's cliffs)
    "odd_t": ([(65536, 24), (16384, 24), (4096, 24), (65536, 8), (4096, 8), (65536, 100)], _odd_t_candidates),
    # the cliffs of bench_peers' sweep at 65536 rows (bench_peers_cliffs_discounted_efd16fd.md: 17-21, 33-45 and 63
    # steps, 1.26-1.59x the per-element time of the powers of two around them): mostly masked 32- and 64-step tiles
    # of 16 rows against more rows per program and narrow time tiles; 32 and 64 steps last, for comparison
    "cliff_t": ([(65536, T) for T in (17, 33, 63, 20, 45, 32, 64)], _odd_t_candidates),
    # the default configuration timed twice in a row: what being first in a cell (after the reference) costs
    "repeat": ([(65536, 512), (65536, 2048)], lambda T: [rows_cfg(128, 4, 4)]),
    # the same: the uncapped configuration timed before and after a capped one (does the order matter?)
    "regs_ab": ([(65536, 2048)], lambda T: [rows_cfg(128, 4, 4), dict(rows_cfg(128, 4, 4), maxnreg=40),
                                             rows_cfg(128, 4, 4)]),
    # the chunk loop software-pipelined (the next chunk's loads issued before this one's scan): the large rollouts'
    # kernels stall on their loads (ncu at 65536 x 512: 70-84% of the cycles waiting on a long scoreboard)
    "stages": ([(65536, 512), (16384, 2048), (65536, 2048)],
               lambda T: [rows_cfg(128, 4, 4)] + [dict(rows_cfg(128, 4, 4, s), **cap) for s in (2, 3)
                                                  for cap in ({}, {"maxnreg": 64})]),
    # 16-bit rollouts: 256-step row tiles (8 values per lane, one 16-byte load; reversed in the warp as the 128-step
    # ones) against 128-step tiles, one and three stages (run with --dtype bfloat16)
    "wide16": ([(65536, 512), (16384, 2048), (65536, 2048), (4096, 512)],
               lambda T: [rows_cfg(128, 4, 4), rows_cfg(128, 4, 4, 3), rows_cfg(256, 4, 4), rows_cfg(256, 4, 4, 3),
                          rows_cfg(256, 2, 2), rows_cfg(256, 2, 2, 3)]),
    # register caps: occupancy against spills
    "regs": ([(16384, 2048), (65536, 2048), (65536, 512)], _regs_candidates),
    # tiles of 128 steps against whole-T tiles
    "rows128": ([(65536, 512), (16384, 2048), (65536, 128), (4096, 128), (4096, 512)], _rows128_candidates),
    # large rollouts (the >= 90% target) and the massively parallel regime
    "large": ([(65536, 2048), (16384, 2048), (65536, 128), (4096, 128), (4096, 32)], _tiles_candidates),
    # short horizons with many environments
    "short": ([(65536, 8), (16384, 8), (65536, 16)], _tiles_candidates),
    # whole-T tile sizes and warps (the shapes of results/h200/sweep_tiles.md)
    "tiles": (list(itertools.product((4096, 16384, 65536), (32, 128, 2048))), _whole_t_candidates),
    # look-back chunks as one 2048-step row (Triton's reverse scan) against tiles of 128-step segments (the warp-local
    # reversal), chunk sizes 1024-8192 on 2-8 warps
    "segments": ([(16, 1 << 20), (1, 1 << 20), (16, 1 << 16), (256, 1 << 16)],
                 lambda T: [rows_cfg(128, 4, 4), lookback_cfg(2048, 4)] + [
                     lookback_cfg(bt, w, segments=bt // 128) for bt, w in (
                         (2048, 4), (2048, 8), (512, 4), (1024, 2), (1024, 4), (4096, 4), (4096, 8), (8192, 8))]),
    # look-back chunks with their registers capped (ncu at 16 x 2^20, ncu_tile256_summary.md: 84-142 registers per
    # thread, 18-29% achieved occupancy, DRAM 17-35%): one 2048-step row and 16 or 32 segments of 128 steps, on 4 or
    # 8 warps, uncapped and at 64 / 96 registers
    "long_regs": ([(16, 1 << 20), (16, 1 << 16)],
                  lambda T: [dict(c, **cap) for c in (lookback_cfg(2048, 4), lookback_cfg(4096, 4, segments=32),
                                                      lookback_cfg(2048, 4, segments=16),
                                                      lookback_cfg(4096, 8, segments=32))
                             for cap in ({}, {"maxnreg": 64}, {"maxnreg": 96})]),
    # long sequences in few rows: look-back chunk sizes and warps against the per-row kernel
    "long": ([(16, 1 << 20), (1, 1 << 20), (16, 1 << 16), (256, 1 << 16), (1024, 8192)],
             lambda T: [rows_cfg(1024, 1, 4)] + [lookback_cfg(bt, w) for bt, w in (
                 (1024, 4), (2048, 4), (2048, 8), (4096, 8), (4096, 16), (8192, 16))]),
}


def _noting(launch_config, seen: list):
    """``launch_config`` itself, noting the configuration of every launch in ``seen``."""
    def noted(layout, kernel_name=None, shifted=False):
        cfg = launch_config(layout, kernel_name, shifted)
        seen.append(cfg)
        return cfg
    return noted


def _patched(cfg):
    def launch_config(layout, kernel_name=None, shifted=False):  # every kernel and mode alike: no register cap
        # unless cfg names one
        c = {k: v for k, v in cfg.items() if k != "mode"}
        c.setdefault("LOOKBACK", 0)
        if c["LOOKBACK"]:
            c["grid"] = (layout.rows * scan._cdiv(layout.T, c["BLOCK_R"] * c["BLOCK_T"]),)
        else:
            c["grid"] = (scan._cdiv(layout.rows, c["BLOCK_R"]),)
        return c
    return launch_config


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="long,large,short")
    parser.add_argument("--algorithms", default="gae,vtrace,discounted_return")
    parser.add_argument("--budget-s", type=float, default=240.0)
    parser.add_argument("--name", default="sweep_configs")
    parser.add_argument("--out", default="h200")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="the rollouts' dtype")
    parser.add_argument("--metric", default="do_bench", choices=("do_bench", "graph"),
                        help="do_bench: one-call graph, L2 flushed; graph: one call captured 50 times, per call")
    parser.add_argument("--smoke", action="store_true", help="CPU (Triton's interpreter), tiny shapes: tests the script")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    env = environment()
    timer = device_time_us
    if args.metric == "graph":
        timer = lambda fn, **kw: (graph_time_us(fn, calls=50, reps=5), "graph")  # noqa: E731
    if args.smoke:
        for k, (shapes, cands) in list(PRESETS.items()):
            PRESETS[k] = ([(3, 40)], lambda T, c=cands: c(T)[:3])
        timer = lambda fn, **kw: (wall_time_us(fn, 2), "wall")  # noqa: E731
        env["copy_bandwidth_GBps"] = 1.0
    else:
        env["copy_bandwidth_GBps"] = round(copy_bandwidth() / 1e9, 1)
    env["command"] = "python benchmarks/sweep_configs.py " + " ".join(sys.argv[1:])
    bw = env["copy_bandwidth_GBps"] * 1e9
    rows, default = [], scan.launch_config
    dtype = getattr(torch, args.dtype)
    env["dtype"] = args.dtype
    env["metric"] = args.metric
    for preset in args.preset.split(","):
        shapes, candidates = PRESETS[preset]
        for B, T in shapes:
            for algo in args.algorithms.split(","):
                if time.perf_counter() - start > args.budget_s:
                    rows.append({"preset": preset, "algorithm": algo, "B": B, "T": T, "status": "not run (budget)"})
                    continue
                spec = SWEPT_ALGOS[algo]
                x = rollout(B, T, dtype, "with")
                if preset in TIME_MAJOR:
                    x = {k: time_major(v) for k, v in x.items()}
                refs = _tuple(spec.call(as_float64(x), "torch"))
                limit_us = 1e6 * B * T * spec.bytes_per_element(dtype.itemsize, "with") / bw
                cell = []
                for cfg in [None] + candidates(T):
                    seen = []  # the default's configuration of each launch (the kernel's own, by its name)
                    scan.launch_config = _noting(default, seen) if cfg is None else _patched(cfg)
                    row = {"preset": preset, "algorithm": algo, "B": B, "T": T, "limit_us": limit_us,
                           "config": "default" if cfg is None else cfg}
                    try:
                        err = check(spec.call(x, "triton"), refs, dtype)
                        if cfg is None:
                            c = seen[0] if seen else default(_layout_of(x["r"]))
                            row["default_config"] = {k: v for k, v in c.items() if k != "grid"}
                        if err < 0:
                            row["status"] = f"wrong (err {-err:.1e})"
                        else:
                            row["device_us"], _ = timer(lambda: spec.call(x, "triton"), warmup_ms=5, rep_ms=20)
                            row["bw_fraction"] = limit_us / row["device_us"]
                            row["status"] = "ok"
                    except Exception as e:  # a configuration the compiler rejects (e.g. out of shared memory)
                        row["status"] = f"error: {type(e).__name__}: {str(e)[:120]}"
                    finally:
                        scan.launch_config = default
                    cell.append(row)
                    print({k: v for k, v in row.items() if k not in ("preset",)}, flush=True)
                timed = [r for r in cell if r.get("device_us")]
                if timed:
                    best = min(timed, key=lambda r: r["device_us"])
                    best["best"] = True
                rows += cell
                del x, refs
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
    summary = []
    for r in rows:
        if r.get("best"):
            d = next((q for q in rows if q["algorithm"] == r["algorithm"] and q["B"] == r["B"] and q["T"] == r["T"]
                      and q["preset"] == r["preset"] and q.get("config") == "default"), {})
            best_name = (_name(r["default_config"]) + " (default)" if r["config"] == "default" else _name(r["config"]))
            summary.append({"algorithm": r["algorithm"], "B": r["B"], "T": r["T"], "best": best_name,
                            "best_us": r["device_us"], "best_bw": f"{100 * r['bw_fraction']:.0f}%",
                            "default": _name(d.get("default_config")), "default_us": d.get("device_us"),
                            "default_bw": f"{100 * d['bw_fraction']:.0f}%" if d.get("bw_fraction") else "-"})
    env["total_s"] = round(time.perf_counter() - start, 1)
    write_results(args.name, env, summary, args.out,
                  [("algorithm", "algorithm"), ("B", "B"), ("T", "T"), ("best", "best configuration"),
                   ("best_us", "best µs"), ("best_bw", "% copy bw"), ("default", "default configuration"),
                   ("default_us", "default µs"), ("default_bw", "% copy bw")],
                  "Launch-configuration sweep", notes="Every configuration: `" + args.name + ".json` (rows).")
    # the full rows next to the summary
    import json
    from _common import RESULTS
    path = RESULTS / args.out / f"{args.name}.json"
    data = json.loads(path.read_text())
    data["all"] = rows
    path.write_text(json.dumps(data, indent=1, default=str))


def time_major(v):
    """A ``[B, T, 1]`` rollout tensor laid out time-major, as ``[1, T, B]`` (None stays None)."""
    if v is None:
        return None
    B, T = v.shape[:2]
    return v.reshape(B, T).t().contiguous().unsqueeze(0)


def _layout_of(x):
    from rl_triton_torchrl.kernels._utils import check_inputs
    return check_inputs(-2, {"x": x}, {})


def _name(cfg) -> str:
    if not isinstance(cfg, dict):
        return "-"
    mode = "look-back" if cfg.get("LOOKBACK") else "tiles"
    s = f"{mode} {cfg.get('BLOCK_R')}x{cfg.get('BLOCK_T')} w{cfg.get('num_warps')}"
    s += f" s{cfg['NUM_STAGES']}" if cfg.get("NUM_STAGES", 1) > 1 else ""
    return s + (f" r{cfg['maxnreg']}" if cfg.get("maxnreg") else "")


if __name__ == "__main__":
    main()
