"""Prototype: rows whose length T is no multiple of 4 (misaligned rows) with vector loads, three ways.

    python benchmarks/proto_misaligned.py                      # the default shapes, on the GPU
    python benchmarks/proto_misaligned.py --shapes 65536x2047,65536x2048 --out benchmarks/results/h200

Batch-major contiguous ``[B, T]`` rows start at element ``r * T``: for odd T (and T = 2 mod 4) no row but every
fourth starts on a 16-byte boundary, so the row tiles of the scan kernels load and store one element per instruction
(and Triton moves such tiles through shared memory to another layout: sm_90 SASS of GAE at 65536 x 2047 has 504
instructions, 20 loads and 10 barriers, against 272, 5 and 0 at 65536 x 2048; ``tools/sass_sm90.py``). The cliff
sweep of ``bench_peers.py`` measures those T at 2.3-3.2x the time per element of the powers of two around them.

A discounted return (``h_t = r_t + gamma (1 - d_t) h_(t+1)``: float32 rewards, bool done flags, one output) in three
prototype kernels, each with the same reverse ``tl.associative_scan``, against the package's own kernel on the same
inputs:

- ``rows``: tiles of rows x steps, row pointers ``r * T + t`` and one exact mask (the package's scheme).
- ``window``: the same tiles, each row's window starting at the 16-byte boundary at or before its first element,
  loaded in whole 4-element groups (a mask per group, which Triton can vectorize; the elements of the neighbouring
  rows that a group holds are read and then masked out of the scan) and stored with the exact mask (one element per
  store: those elements belong to the other rows' programs).
- ``flat``: the rows of a program (``R`` with ``R * T`` a multiple of 16) as one contiguous span, scanned in 1-D
  tiles with the recurrence cut at each row end (``t = f % T`` of the flat index, T a compile-time constant):
  aligned loads and stores throughout.

Each is checked against the float64 torch path before it is timed (do_bench, L2 flushed). Results:
``<out>/proto_misaligned.json`` and ``.md``. Nothing here is used by the package.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
import triton
import triton.language as tl

from rl_triton_torchrl import kernels as K
from rl_triton_torchrl.kernels.scan import _affine_combine_finite_a, _pow2

GAMMA = 0.99
SHAPES = "65536x2047,65536x2048,16384x257,16384x256,16384x513,16384x512,65536x23,65536x24,65536x25,16x2049,16x2048"


@triton.jit
def _rows_kernel(r_ptr, d_ptr, out_ptr, n_rows, gamma, T: tl.constexpr, BLOCK_R: tl.constexpr,
                 BLOCK_T: tl.constexpr, WINDOW: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    m_r = rows < n_rows
    row_off = rows * T
    if WINDOW:
        aligned = row_off // 4 * 4  # the 16-byte boundary at or before the row's first element
        shift = row_off - aligned
        bound = (T + shift + 3) // 4 * 4  # the window's columns whose 4-group holds an element of the row
        n_chunks = (T + 3 + BLOCK_T - 1) // BLOCK_T
    else:
        aligned = row_off
        shift = row_off * 0
        bound = shift + T
        n_chunks = (T + BLOCK_T - 1) // BLOCK_T
    h = tl.zeros([BLOCK_R], tl.float32)
    for i in range(n_chunks):
        c = n_chunks - 1 - i
        col = c * BLOCK_T + tl.arange(0, BLOCK_T)
        t = col[None, :] - shift[:, None]
        m = m_r[:, None] & (t >= 0) & (t < T)
        off = aligned[:, None] + col[None, :]
        if WINDOW:
            off = tl.max_contiguous(tl.multiple_of(off, [1, 4]), [1, 4])
            m_ld = m_r[:, None] & (col[None, :] < bound[:, None])
        else:
            m_ld = m
        r = tl.load(r_ptr + off, mask=m_ld, other=0.0)
        d = tl.load(d_ptr + off, mask=m_ld, other=0).to(tl.float32)
        a = tl.where(m, gamma * (1.0 - d), 1.0)
        b = tl.where(m, r, 0.0)
        A, B = tl.associative_scan((a, b), 1, _affine_combine_finite_a, reverse=True)
        hh = tl.where(A == 0, B, A * h[:, None] + B)
        tl.store(out_ptr + off, hh, mask=m)
        h = tl.sum(tl.where((tl.arange(0, BLOCK_T) == 0)[None, :], hh, 0.0), 1)


@triton.jit
def _flat_kernel(r_ptr, d_ptr, out_ptr, gamma, T: tl.constexpr, R: tl.constexpr, BLOCK: tl.constexpr):
    L: tl.constexpr = R * T
    N_CHUNKS: tl.constexpr = (L + BLOCK - 1) // BLOCK
    base = tl.program_id(0) * L
    h = tl.zeros([], tl.float32)
    for i in range(N_CHUNKS):
        c = N_CHUNKS - 1 - i
        f = c * BLOCK + tl.arange(0, BLOCK)
        m = f < L
        r = tl.load(r_ptr + base + f, mask=m, other=0.0)
        d = tl.load(d_ptr + base + f, mask=m, other=0).to(tl.float32)
        # the recurrence cut at each row end (and past the span: its last element is a row end)
        a = tl.where(m & (f % T != T - 1), gamma * (1.0 - d), 0.0)
        b = tl.where(m, r, 0.0)
        A, B = tl.associative_scan((a, b), 0, _affine_combine_finite_a, reverse=True)
        hh = tl.where(A == 0, B, A * h + B)
        tl.store(out_ptr + base + f, hh, mask=m)
        h = tl.sum(tl.where(tl.arange(0, BLOCK) == 0, hh, 0.0), 0)


def proto(kind: str, r: torch.Tensor, d: torch.Tensor) -> torch.Tensor | None:
    """The prototype ``kind`` on [B, T] rewards and flags; None where it does not apply."""
    B, T = r.shape
    out = torch.full_like(r, float("nan"))
    if kind == "flat":
        R = 16 // (T & -T) if T % 16 else 1  # R * T a multiple of 16
        if B % R:
            return None
        _flat_kernel[(B // R,)](r, d, out, GAMMA, T=T, R=R, BLOCK=512, num_warps=4)
        return out
    block_t = min(_pow2(T + 3 if kind == "window" else T), 128 if B >= 1024 else 2048)
    block_r = max(1, min(_pow2(B), 512 // block_t))
    _rows_kernel[(triton.cdiv(B, block_r),)](r, d, out, B, GAMMA, T=T, BLOCK_R=block_r, BLOCK_T=block_t,
                                             WINDOW=kind == "window", num_warps=4 if block_t <= 512 else 8)
    return out


def ours(r, d):
    return K.discounted_return(r, d, gamma=GAMMA, time_dim=-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default=SHAPES)
    parser.add_argument("--out", default=str(Path(__file__).parent / "results" / "h200"))
    args = parser.parse_args()
    from _common import copy_bandwidth, environment

    bw = copy_bandwidth()
    rows = []
    for shape in args.shapes.split(","):
        B, T = (int(v) for v in shape.split("x"))
        g = torch.Generator(device="cuda").manual_seed(B * 7919 + T)
        r = torch.randn(B, T, device="cuda", generator=g)
        d = torch.rand(B, T, device="cuda", generator=g) < 0.05
        ref = K.discounted_return(r.double(), d, gamma=GAMMA, time_dim=-1, backend="torch").float()
        row = {"B": B, "T": T}
        for kind in ("ours", "rows", "window", "flat"):
            fn = (lambda: ours(r, d)) if kind == "ours" else (lambda k=kind: proto(k, r, d))
            got = fn()
            if got is None:
                row[kind] = None
                continue
            err = (got - ref).abs().max().item()
            ok = err <= 1e-4 * max(1.0, ref.abs().max().item())
            us = triton.testing.do_bench(fn, warmup=25, rep=100) * 1e3 if ok else None
            row[kind] = {"us": us, "err": err, "ok": ok,
                         "bw_frac": None if us is None else B * T * 9 / (us * 1e-6) / bw}
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    env = environment()
    env["command"] = "python benchmarks/proto_misaligned.py --shapes " + args.shapes
    (out / "proto_misaligned.json").write_text(json.dumps({"environment": env, "copy_GBps": bw / 1e9,
                                                           "rows": rows}, indent=1))
    lines = ["# Misaligned rows: three prototype kernels against ours (discounted return, float32)", "",
             "Generated by `benchmarks/proto_misaligned.py`; do not edit by hand. µs (do_bench, L2 flushed) and the "
             "fraction of the copy bandwidth (9 bytes per element); each checked against the float64 torch path "
             "first (a failed check is not timed).", ""]
    lines += [f"- {k}: {v}" for k, v in env.items()]
    lines += ["", "| B | T | ours | rows | window | flat |", "|---|---|---|---|---|---|"]
    for row in rows:
        cols = []
        for kind in ("ours", "rows", "window", "flat"):
            c = row[kind]
            if c is None or not c["ok"]:
                cols.append("-" if c is None else "wrong")
            else:
                cols.append(f"{c['us']:.1f} ({100 * c['bw_frac']:.0f}%)")
        lines.append(f"| {row['B']} | {row['T']} | " + " | ".join(cols) + " |")
    (out / "proto_misaligned.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[-len(rows) - 2:]))


if __name__ == "__main__":
    main()
