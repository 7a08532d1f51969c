"""Prototype: long sequences in few rows with a two-pass look-back whose second pass reads its inputs from L2.

    python benchmarks/proto_lookback.py                                  # the default shapes, on the GPU
    python benchmarks/proto_lookback.py --shapes 16x1048576 --out benchmarks/results/h200
    python benchmarks/proto_lookback.py --smoke                          # tiny shapes, nothing timed (a CPU runs
                                                                         # them in Triton's interpreter)

The package's look-back mode gives every chunk of a row a program that holds the whole chunk (2048-4096 steps) in
registers while it waits for the state entering it (``scan.chain_state``): 84-142 registers per thread, 18-29%
achieved occupancy and DRAM 17-35% busy at 16 x 2^20 (``results/h200/ncu_tile256_summary.md``). Here a program
instead owns a group of ``K`` tiles of ``SEGS`` x ``SEG_T`` steps (consecutive segments of one row) and walks it
twice: the first pass only composes the tiles' maps into the group's map (nothing kept but two numbers), which the
same look-back (``scan.chain_state``) turns into the state entering the group; the second pass loads the tiles
again, while they are still in L2, scans them from that state and stores. Registers stay those of a row tile, both
passes can pipeline their loads (``NUM_STAGES``), and DRAM sees each input once as long as the groups in flight fit
in L2. Tickets go to the rows in turn (a row's groups are never all in flight at once), so a look-back rarely walks
more than one window.

The linear scan ``h_t = a_t h_(t-1) + b_t`` (reversed: ``h_(t+1)``) of float32 ``a``, ``b`` with one float32
output, 12 bytes per step, against the package's ``linear_scan`` (its look-back mode at these shapes) on the same
inputs, and a device-to-device copy of the same bytes (the floor of any one kernel at that size: its launch and one
DRAM round trip included). Each is checked against the float64 torch path before it is timed (do_bench of a
replayed one-call CUDA graph, L2 flushed). Results: ``<out>/proto_lookback.json`` and ``.md``. Nothing here is used
by the package.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":  # before triton is imported: the kernels run through the interpreter (--smoke)
    os.environ.setdefault("TRITON_INTERPRET", "1")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from rl_triton_torchrl import kernels as K  # noqa: E402
from rl_triton_torchrl.kernels.scan import (  # noqa: E402 - helpers by name: Triton resolves a kernel's globals
    _affine_combine, _pick, _reverse_columns, apply_map, chain_state, edge_column, segment_states)

SHAPES = "1x65536,16x65536,1x1048576,16x1048576"
# (K tiles per group, segments per tile, steps per segment, warps, stages)
CONFIGS = ((4, 4, 128, 4, 2), (8, 4, 128, 4, 2), (16, 4, 128, 4, 2), (4, 4, 128, 4, 3), (8, 8, 128, 8, 2),
           (4, 8, 128, 8, 1), (2, 4, 128, 4, 1), (8, 2, 128, 2, 2))

# (segments per chunk, steps per segment, warps, programs per SM, prefetch)
PERSISTENT = ((4, 128, 4, 8, True), (4, 128, 4, 16, True), (8, 128, 4, 8, True), (16, 128, 4, 4, True),
              (16, 128, 4, 4, False), (32, 128, 4, 3, True), (16, 128, 8, 4, True), (8, 128, 4, 16, True))


@triton.jit
def _combine_rev(a_l, b_l, a_r, b_r):
    """``_affine_combine`` with its operands swapped: a scan along time ascending that composes in descending
    order (a reverse scan's)."""
    return _affine_combine(a_r, b_r, a_l, b_l)


@triton.jit
def _tile_offsets(row, g, k, T, K: tl.constexpr, SEGS: tl.constexpr, SEG_T: tl.constexpr, REVERSE: tl.constexpr):
    """Offsets and mask [SEGS, SEG_T] of the k-th tile in scan order of group ``g`` (in scan order) of ``row``: a
    group beyond the row is all masked."""
    TILE_T: tl.constexpr = SEGS * SEG_T
    if REVERSE:  # groups and their tiles in scan order: from the end of the row
        t0 = T - (g * K + k + 1) * TILE_T
    else:
        t0 = (g * K + k) * TILE_T
    o_t = t0 + (tl.arange(0, SEGS) * SEG_T)[:, None] + tl.arange(0, SEG_T)[None, :]
    return row * T + o_t, (o_t >= 0) & (o_t < T)


@triton.jit
def _tile(a_ptr, b_ptr, row, g, k, T, K: tl.constexpr, SEGS: tl.constexpr, SEG_T: tl.constexpr,
          REVERSE: tl.constexpr):
    """The tile of ``_tile_offsets``: a, b [SEGS, SEG_T] (masked steps the identity), the offsets and the mask."""
    o, m = _tile_offsets(row, g, k, T, K, SEGS, SEG_T, REVERSE)
    return tl.load(a_ptr + o, mask=m, other=1.0), tl.load(b_ptr + o, mask=m, other=0.0), o, m


@triton.jit
def _chunk_ab(a_ptr, b_ptr, ticket, n_rows, T, SEGS: tl.constexpr, SEG_T: tl.constexpr, REVERSE: tl.constexpr):
    """a, b of the chunk of a persistent program's ticket (tickets go to the rows in turn)."""
    b_a, b_b, o, m = _tile(a_ptr, b_ptr, ticket % n_rows, ticket // n_rows, 0, T, 1, SEGS, SEG_T, REVERSE)
    return b_a, b_b


@triton.jit
def _segments_map(b_a, b_b, REVERSE: tl.constexpr):
    """A tile of consecutive segments of one row: each segment's inclusive scan in scan order (reversed in its warp
    for a reverse scan, as scan_tile_enter does) and the maps of the segments up to each one, in scan order."""
    if REVERSE:
        b_a = _reverse_columns(b_a)
        b_b = _reverse_columns(b_b)
    b_A, b_B = tl.associative_scan((b_a, b_b), 1, _affine_combine)
    s_A, s_B = tl.associative_scan((edge_column(b_A, False), edge_column(b_B, False)), 0, _affine_combine,
                                   reverse=REVERSE)
    return b_A, b_B, s_A, s_B


@triton.jit
def _segments_out(b_A, b_B, s_A, s_B, b_h, REVERSE: tl.constexpr):
    """The states of the tile of ``_segments_map`` entered with ``b_h`` (scalar), and the state leaving it."""
    b_out = apply_map(b_A, b_B, segment_states(s_A, s_B, b_h, REVERSE)[:, None])
    if REVERSE:
        b_out = _reverse_columns(b_out)
    return b_out, _pick(apply_map(s_A, s_B, b_h), 0 if REVERSE else s_A.shape[0] - 1)


@triton.jit
def _two_pass_kernel(a_ptr, b_ptr, h_ptr, lb_ptr, n_rows, T, n_groups, WINDOW: tl.constexpr, REVERSE: tl.constexpr,
                     K: tl.constexpr, SEGS: tl.constexpr, SEG_T: tl.constexpr, NUM_STAGES: tl.constexpr):
    ticket = tl.atomic_add(lb_ptr, 1).to(tl.int64)
    row = ticket % n_rows  # the rows in turn: a group's predecessors in its row hold smaller tickets
    g = ticket // n_rows  # in scan order
    # pass 1: the group's map, composed in scan order
    acc_a = tl.zeros([], tl.float32) + 1.0
    acc_b = tl.zeros([], tl.float32)
    for k in tl.range(0, K, num_stages=NUM_STAGES):
        b_a, b_b, o, m = _tile(a_ptr, b_ptr, row, g, k, T, K, SEGS, SEG_T, REVERSE)  # [SEGS, SEG_T]
        # the tile's map: the last of an inclusive scan in index order (a scan keeps the operands' order, which a
        # reduction's butterfly need not), composed in descending time order for a reverse scan
        if REVERSE:
            s_a, s_b = tl.associative_scan((b_a, b_b), 1, _combine_rev)
            s_a, s_b = tl.associative_scan((edge_column(s_a, False), edge_column(s_b, False)), 0,
                                           _combine_rev)
        else:
            s_a, s_b = tl.associative_scan((b_a, b_b), 1, _affine_combine)
            s_a, s_b = tl.associative_scan((edge_column(s_a, False), edge_column(s_b, False)), 0,
                                           _affine_combine)
        acc_a, acc_b = _affine_combine(acc_a, acc_b, _pick(s_a, SEGS - 1), _pick(s_b, SEGS - 1))
    b_h = chain_state(lb_ptr, row, g, n_groups, acc_a, acc_b, tl.zeros([], tl.float32), WINDOW, False)
    # pass 2: the same tiles again (from L2), scanned from the state entering the group
    for k in tl.range(0, K, num_stages=NUM_STAGES):
        b_a, b_b, o, m = _tile(a_ptr, b_ptr, row, g, k, T, K, SEGS, SEG_T, REVERSE)  # [SEGS, SEG_T]
        b_A, b_B, s_A, s_B = _segments_map(b_a, b_b, REVERSE)  # [SEGS, SEG_T] x 2, [SEGS] x 2
        b_out, b_h = _segments_out(b_A, b_B, s_A, s_B, b_h, REVERSE)
        tl.store(h_ptr + o, b_out, mask=m)


@triton.jit
def _persistent_kernel(a_ptr, b_ptr, h_ptr, lb_ptr, n_rows, T, n_chunks, WINDOW: tl.constexpr,
                       REVERSE: tl.constexpr, SEGS: tl.constexpr, SEG_T: tl.constexpr, PREFETCH: tl.constexpr):
    n_total = n_rows * n_chunks
    ticket = tl.atomic_add(lb_ptr, 1).to(tl.int64)
    b_a, b_b = _chunk_ab(a_ptr, b_ptr, ticket, n_rows, T, SEGS, SEG_T, REVERSE)  # [SEGS, SEG_T]
    while ticket < n_total:
        row = ticket % n_rows
        c = ticket // n_rows
        if PREFETCH:  # the next chunk's loads in flight during this one's scan, look-back and stores
            t_next = tl.atomic_add(lb_ptr, 1).to(tl.int64)
            n_a, n_b = _chunk_ab(a_ptr, b_ptr, t_next, n_rows, T, SEGS, SEG_T, REVERSE)  # [SEGS, SEG_T]
        b_A, b_B, s_A, s_B = _segments_map(b_a, b_b, REVERSE)  # [SEGS, SEG_T] x 2, [SEGS] x 2
        I_ALL: tl.constexpr = 0 if REVERSE else SEGS - 1  # the map of the whole chunk
        b_h = chain_state(lb_ptr, row, c, n_chunks, _pick(s_A, I_ALL), _pick(s_B, I_ALL), tl.zeros([], tl.float32),
                          WINDOW, False)
        b_out, _ = _segments_out(b_A, b_B, s_A, s_B, b_h, REVERSE)
        o, m = _tile_offsets(row, c, 0, T, 1, SEGS, SEG_T, REVERSE)
        tl.store(h_ptr + o, b_out, mask=m)
        if PREFETCH:
            ticket, b_a, b_b = t_next, n_a, n_b
        else:
            ticket = tl.atomic_add(lb_ptr, 1).to(tl.int64)
            b_a, b_b = _chunk_ab(a_ptr, b_ptr, ticket, n_rows, T, SEGS, SEG_T, REVERSE)


def two_pass_scan(a, b, reverse, k, segs, seg_t, warps, stages, window=32):
    """The linear scan of contiguous float32 ``[rows, T]`` a, b by ``_two_pass_kernel``."""
    rows, T = a.shape
    n_groups = -(-T // (k * segs * seg_t))
    grid = rows * n_groups
    lb = torch.zeros(1 + 3 * grid, dtype=torch.int64, device=a.device)
    h = torch.empty_like(a)
    _two_pass_kernel[(grid,)](a, b, h, lb, rows, T, n_groups, WINDOW=window, REVERSE=reverse, K=k, SEGS=segs,
                              SEG_T=seg_t, NUM_STAGES=stages, num_warps=warps)
    return h


def persistent_scan(a, b, reverse, segs, seg_t, warps, per_sm, prefetch, window=32):
    """The linear scan of contiguous float32 ``[rows, T]`` a, b by ``_persistent_kernel`` on ``per_sm`` programs
    per SM (or one per chunk, if fewer)."""
    rows, T = a.shape
    n_chunks = -(-T // (segs * seg_t))
    sms = torch.cuda.get_device_properties(a.device).multi_processor_count if a.is_cuda else 2
    lb = torch.zeros(1 + 3 * rows * n_chunks, dtype=torch.int64, device=a.device)
    h = torch.empty_like(a)
    _persistent_kernel[(min(rows * n_chunks, sms * per_sm),)](
        a, b, h, lb, rows, T, n_chunks, WINDOW=window, REVERSE=reverse, SEGS=segs, SEG_T=seg_t, PREFETCH=prefetch,
        num_warps=warps)
    return h


def reference(a, b, reverse):
    return K.linear_scan(a.double(), b.double(), reverse=reverse, time_dim=-1, backend="torch")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "h200"))
    parser.add_argument("--name", default="proto_lookback")
    parser.add_argument("--smoke", action="store_true", help="tiny shapes, nothing timed: tests the script")
    parser.add_argument("--once", action="store_true", help="one call of each, nothing timed or written (for ncu)")
    parser.add_argument("--impls", default="two-pass,persistent", help="the prototypes to run beside ours and the copy")
    args = parser.parse_args(argv)
    from _common import copy_bandwidth, device_time_us, environment, kernel_time_us

    device = DEVICE
    backend = "triton" if device == "cpu" else "auto"  # the CPU path of linear_scan is plain torch
    impls = args.impls.split(",")
    configs = [] if "two-pass" not in impls else [(2, 2, 4, 1, 1), (1, 2, 4, 1, 1)] if args.smoke else CONFIGS
    persistent = [] if "persistent" not in impls else [(2, 4, 1, 2, True), (2, 4, 1, 1, False)] if args.smoke \
        else PERSISTENT
    shapes = [(3, 37), (2, 64)] if args.smoke else [tuple(int(v) for v in s.split("x")) for s in args.shapes.split(",")]
    env = environment()
    env["command"] = "python benchmarks/proto_lookback.py " + " ".join(sys.argv[1:])
    bw = 1e9 if args.smoke else copy_bandwidth()
    env["copy_bandwidth_GBps"] = round(bw / 1e9, 1)
    rows = []
    gen = torch.Generator().manual_seed(0)
    for B, T in shapes:
        a = (0.9 + 0.1 * torch.rand(B, T, generator=gen)).to(device)
        a[torch.rand(B, T, generator=gen) < 0.01] = 0.0  # episode ends
        b = torch.randn(B, T, generator=gen).to(device)
        nbytes = 12 * B * T
        src = torch.empty(nbytes // 2, dtype=torch.uint8, device=device)
        dst = torch.empty_like(src)
        cands = [("copy (same bytes)", lambda: dst.copy_(src), None)]
        for reverse in (True, False):
            ref = reference(a, b, reverse)
            cands.append((f"ours linear_scan{' reverse' if reverse else ''}",
                          lambda r=reverse: K.linear_scan(a, b, reverse=r, time_dim=-1, backend=backend), ref))
            rev = " reverse" if reverse else ""
            for cfg in configs:
                cands.append((f"two-pass K{cfg[0]} {cfg[1]}x{cfg[2]} w{cfg[3]} s{cfg[4]}{rev}",
                              lambda r=reverse, c=cfg: two_pass_scan(a, b, r, *c), ref))
            for cfg in persistent:
                cands.append((f"persistent {cfg[0]}x{cfg[1]} w{cfg[2]} {cfg[3]}/SM{' prefetch' * cfg[4]}{rev}",
                              lambda r=reverse, c=cfg: persistent_scan(a, b, r, *c), ref))
        if args.once:
            for _, fn, _ in cands:
                fn()
            if device == "cuda":
                torch.cuda.synchronize()
            continue
        for name, fn, ref in cands:
            row = {"B": B, "T": T, "impl": name, "bytes": nbytes}
            try:
                if ref is not None:
                    err = (fn().double() - ref).abs().max().item() / max(1.0, ref.abs().max().item())
                    row["err"] = err
                    if not err < 1e-4:
                        row["status"] = "wrong"
                        rows.append(row)
                        print(json.dumps(row), flush=True)
                        continue
                if args.smoke:
                    row["device_us"] = row["kernel_us"] = 1.0
                else:
                    row["device_us"], _ = device_time_us(fn, True, 5, 25)
                    row["kernel_us"] = kernel_time_us(fn)
                row["bw_frac"] = nbytes / (row["device_us"] * 1e-6) / bw
                row["kernel_bw_frac"] = nbytes / (row["kernel_us"] * 1e-6) / bw
                row["status"] = "ok"
            except Exception as e:  # noqa: BLE001 - a configuration the compiler rejects
                row["status"] = f"error: {type(e).__name__}: {str(e)[:160]}"
            rows.append(row)
            print(json.dumps(row), flush=True)
        del src, dst
    if not args.once:
        write(rows, env, Path(args.out), args.name)


def write(rows, env, out: Path, name: str) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    lines = ["# Prototypes: look-back kernels for long sequences (linear scan, float32, 12 bytes per step)", "",
             "Generated by `benchmarks/proto_lookback.py`; do not edit by hand.", ""]
    lines += [f"- {k}: {v}" for k, v in env.items()]
    lines += ["", "Device µs (do_bench of a one-call graph, L2 flushed) / the kernels' own µs (activity records), "
              "and the device time's fraction of the copy bandwidth.", "",
              "| B | T | implementation | device µs | kernel µs | % copy bw | status |",
              "|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["status"] == "ok":
            lines.append(f"| {r['B']} | {r['T']} | {r['impl']} | {r['device_us']:.2f} | {r['kernel_us']:.2f} | "
                         f"{100 * r['bw_frac']:.0f}% | ok |")
        else:
            lines.append(f"| {r['B']} | {r['T']} | {r['impl']} | - | - | - | {r['status']} |")
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-len(rows) - 2:]))


if __name__ == "__main__":
    main()
