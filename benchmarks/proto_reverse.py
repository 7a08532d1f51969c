"""Prototype: reverse scans without Triton's reverse scan, four ways.

    python benchmarks/proto_reverse.py                                       # the default shapes, on the GPU
    python benchmarks/proto_reverse.py --shapes 512x512,128x1024 --out benchmarks/results/h100
    python benchmarks/proto_reverse.py --sass                                # sm_90 SASS counts, no GPU needed
    python benchmarks/proto_reverse.py --smoke --out /tmp/proto       # tiny shapes on the CPU (tests the script)

The scan kernels walk a reverse scan (GAE, TD(lambda), V-trace, the discounted return) over a tile loaded in time
order and hand it to ``tl.associative_scan(..., reverse=True)``. Triton reverses the scan's two inputs and two
outputs across the lanes for that, five butterfly shuffles per element and value, and in tiles whose row spans
several warps (one row per program, 256-4096 steps: rl-triton's release cells 64 x 512 to 512 x 4096) the package
keeps that reverse scan (``scan.scan_tile_enter`` flips only tiles of one warp per row). rl-triton instead addresses
its loads and stores in reverse time order and scans forward: no shuffles to reverse, but one element per load
instruction (descending addresses are not vectorized).

A discounted return (``h_t = r_t + gamma (1 - d_t) h_(t+1)``: float32 rewards, bool done flags, one output) and GAE
in its shifted input mode (``V(s_(t+1))`` read from the values one step on, the last one from a ``[B]`` tensor: two
outputs) in one-row tiles of ``pow2(T)`` steps (rows of at most 128 steps: four to a program, one warp per row),
four ways:

- ``rev``: the tile in time order, 16-byte loads, Triton's reverse scan (the package's scheme). GAE's values one step
  on: a second load one element on (one element per instruction), as ``scan.load_next_step`` in such tiles.
- ``addr``: loads and stores at descending addresses, forward scan (rl-triton's scheme); the values one step on, a
  second load at descending addresses.
- ``gather``: the tile in time order, reversed with a gather before and after a forward scan (the package's scheme
  for tiles of one warp per row, ``scan._reverse_columns``).
- ``flip4``: the tile as 4-step groups in descending time order, each group one 16-byte load in ascending order,
  reversed within the thread (register renaming: ``tl.split`` and ``tl.join``), forward scan, and stored the same
  way. GAE's values one step on: for three steps of each group from the group itself, for its last step (in time)
  from the first value of the group after it, one 4-byte load per group.

Each is checked against the float64 torch path before it is timed (50 calls in a CUDA graph, L2 warm, the median of 5
replays: ``_common.graph_time_us``; and do_bench, L2 flushed). Results: ``<out>/proto_reverse.json`` and ``.md``;
``--sass`` prints sm_90 instruction counts instead.
T must be a multiple of 4 (rows that start on a 16-byte boundary). Nothing here is used by the package.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu" and "--sass" not in sys.argv:  # before triton is imported: the interpreter runs --smoke
    os.environ.setdefault("TRITON_INTERPRET", "1")
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from rl_triton_torchrl import kernels as K  # noqa: E402
from rl_triton_torchrl.kernels.scan import (  # noqa: E402 - helpers by name: Triton resolves a kernel's globals
    _affine_combine_finite_a, _columns4, _join4, _pow2, _reverse4, _reverse_columns)

GAMMA, LMBDA = 0.99, 0.95
SHAPES = "64x512,128x1024,256x1024,512x512,512x2048,512x4096,1024x1024,4096x128,16384x128,65536x128"
MODES = {"rev": 0, "addr": 1, "flip4": 2, "gather": 3}
WARPS = {256: 4, 512: 8, 1024: 8, 2048: 8, 4096: 16}  # the package's warps for such tiles (launch_config)


def _warps(mode: str, block_t: int) -> int:
    """``WARPS``, but ``flip4`` at most one warp per 128 steps: 4 steps per thread, or its groups are replicated
    across threads and Triton converts their layout through shared memory."""
    return min(WARPS[block_t], block_t // 128) if mode == "flip4" else WARPS[block_t]


@triton.jit
def _offsets(T, n_rows, MODE: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr):
    """Element offsets and mask of the tile's rows in scan order: ``addr`` [BLOCK_R, BLOCK_T] descending in time,
    ``rev`` and ``gather`` ascending; ``flip4`` [BLOCK_R * BLOCK_T // 4, 4]: row by row, the row's groups descending
    in time, group g's 4 steps ascending (one dimension for rows and groups: with two, Triton's axis analysis finds
    neither contiguous and may spread a warp's lanes over several rows). Also the rows' offsets and their mask:
    [BLOCK_R], or for ``flip4`` [BLOCK_R * BLOCK_T // 4], each group's row."""
    if MODE == 2:
        k = tl.arange(0, BLOCK_R * BLOCK_T // 4)
        g = k % (BLOCK_T // 4)
        rows = tl.program_id(0) * BLOCK_R + k // (BLOCK_T // 4)
    else:
        rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    m_r = rows < n_rows
    o_r = rows * T
    if MODE == 2:
        t = (T - 4 - 4 * g)[:, None] + tl.arange(0, 4)[None, :]
        offs = o_r[:, None] + t
        m = m_r[:, None] & (t >= 0)
    elif MODE == 1:
        t = (T - 1 - tl.arange(0, BLOCK_T))[None, :]
        offs = o_r[:, None] + t
        m = m_r[:, None] & (t >= 0)
    else:
        t = tl.arange(0, BLOCK_T)[None, :]
        offs = o_r[:, None] + t
        m = m_r[:, None] & (t < T)
    return offs, m, o_r, m_r


@triton.jit
def _flat(x, BLOCK_R: tl.constexpr, MODE: tl.constexpr):
    """A ``flip4`` tile [K, 4] as [BLOCK_R, BLOCK_T] in scan order; others as they are."""
    if MODE == 2:
        x = tl.reshape(x, [BLOCK_R, x.shape[0] * 4 // BLOCK_R])
    return x


@triton.jit
def _load(ptr, offs, m, MODE: tl.constexpr, BLOCK_R: tl.constexpr):
    """A tile as float32 in scan order, [BLOCK_R, BLOCK_T] (``flip4``: reversed within each group, flattened)."""
    x = tl.load(ptr + offs, mask=m, other=0).to(tl.float32)
    if MODE == 2:
        x = _flat(_reverse4(x), BLOCK_R, MODE)
    return x


@triton.jit
def _store(ptr, x, offs, m, MODE: tl.constexpr):
    """Stores a tile in scan order at the offsets of ``_offsets``."""
    if MODE == 2:
        x = _reverse4(tl.reshape(x, [x.shape[0] * x.shape[1] // 4, 4]))
    tl.store(ptr + offs, x, mask=m)


@triton.jit
def _scan(a, b, MODE: tl.constexpr):
    """The states of a tile in scan order, entering with 0 (reverse in time for every mode but ``gather``, whose
    tiles are reversed with a gather before and after a forward scan)."""
    if MODE == 3:
        a = _reverse_columns(a)
        b = _reverse_columns(b)
    _, h = tl.associative_scan((a, b), 1, _affine_combine_finite_a, reverse=MODE == 0)
    if MODE == 3:
        h = _reverse_columns(h)
    return h


@triton.jit
def _discounted_kernel(r_ptr, d_ptr, out_ptr, gamma, T, n_rows, MODE: tl.constexpr, BLOCK_R: tl.constexpr,
                       BLOCK_T: tl.constexpr):
    offs, m, _, _ = _offsets(T, n_rows, MODE, BLOCK_R, BLOCK_T)
    r = _load(r_ptr, offs, m, MODE, BLOCK_R)
    d = _load(d_ptr, offs, m, MODE, BLOCK_R)
    mm = _flat(m, BLOCK_R, MODE)  # whole groups: every element of a group has the same mask
    a = tl.where(mm, gamma * (1.0 - d), 1.0)
    b = tl.where(mm, r, 0.0)
    _store(out_ptr, _scan(a, b, MODE), offs, m, MODE)


@triton.jit
def _gae_kernel(r_ptr, v_ptr, last_ptr, d_ptr, adv_ptr, vt_ptr, gamma, lmbda, T, n_rows, MODE: tl.constexpr,
                BLOCK_R: tl.constexpr, BLOCK_T: tl.constexpr):
    offs, m, o_r, m_r = _offsets(T, n_rows, MODE, BLOCK_R, BLOCK_T)
    r = _load(r_ptr, offs, m, MODE, BLOCK_R)
    v = _load(v_ptr, offs, m, MODE, BLOCK_R)
    d = _load(d_ptr, offs, m, MODE, BLOCK_R)
    last = tl.load(last_ptr + o_r // T, mask=m_r, other=0).to(tl.float32)  # per row (flip4: per group)
    if MODE == 2:  # values one step on: steps 1-3 of each group from it, step 3's from the group after it
        g = tl.arange(0, BLOCK_R * BLOCK_T // 4) % (BLOCK_T // 4)
        v_on = tl.load(v_ptr + o_r + T - 4 * g, mask=m_r & (g > 0) & (T - 4 * g > 0), other=0).to(tl.float32)
        v_on = tl.where(g == 0, last, v_on)  # [K]
        c0, c1, c2, c3 = _columns4(tl.reshape(v, [BLOCK_R * BLOCK_T // 4, 4]))  # scan order: c0 the group's last step
        nv = _flat(_join4(v_on, c0, c1, c2), BLOCK_R, MODE)
    else:
        t = offs - o_r[:, None]
        nv = tl.load(v_ptr + offs + 1, mask=m & (t + 1 < T), other=0).to(tl.float32)
        nv = tl.where(t + 1 == T, last[:, None], nv)
    mm = _flat(m, BLOCK_R, MODE)
    delta = r + gamma * (1.0 - d) * nv - v
    a = tl.where(mm, gamma * lmbda * (1.0 - d), 1.0)
    b = tl.where(mm, delta, 0.0)
    adv = _scan(a, b, MODE)
    _store(adv_ptr, adv, offs, m, MODE)
    _store(vt_ptr, adv + v, offs, m, MODE)


def _config(mode: str, T: int) -> dict:
    """The tile and warps: rows of at most 128 steps four to a program on 4 warps (one warp per row, as the package
    takes them), longer rows one to a program on ``_warps``."""
    if T <= 128:
        return {"BLOCK_R": 4, "BLOCK_T": 128, "num_warps": 4}
    bt = max(_pow2(T), 256)
    return {"BLOCK_R": 1, "BLOCK_T": bt, "num_warps": _warps(mode, bt)}


def _launch_discounted(mode, r, d, out):
    B, T = r.shape
    cfg = _config(mode, T)
    _discounted_kernel[(triton.cdiv(B, cfg["BLOCK_R"]),)](r, d, out, GAMMA, T, B, MODE=MODES[mode], **cfg)


def _launch_gae(mode, r, v, last, d, adv, vt):
    B, T = r.shape
    cfg = _config(mode, T)
    _gae_kernel[(triton.cdiv(B, cfg["BLOCK_R"]),)](r, v, last, d, adv, vt, GAMMA, LMBDA, T, B, MODE=MODES[mode],
                                                     **cfg)


def _inputs(B, T, device):
    g = torch.Generator(device="cpu").manual_seed(B * 100003 + T)
    r = torch.randn(B, T, generator=g)
    v = torch.randn(B, T, generator=g)
    last = torch.randn(B, generator=g)
    d = torch.rand(B, T, generator=g) < 0.05
    return [x.to(device) for x in (r, v, last, d)]


def _calls(B, T, device):
    """{(algorithm, impl): (call, outputs, reference outputs)}."""
    r, v, last, d = _inputs(B, T, device)
    ref_ret = K.discounted_return(r.double(), d, gamma=GAMMA, time_dim=-1, backend="torch")
    ref_adv, ref_vt = K.gae(r.double(), v.double(), None, d, gamma=GAMMA, lmbda=LMBDA, time_dim=-1,
                            last_state_value=last.double(), backend="torch")
    calls = {}
    for mode in MODES:
        out = torch.full_like(r, float("nan"))
        calls["discounted_return", mode] = (lambda mode=mode, out=out: _launch_discounted(mode, r, d, out)), [out], \
            [ref_ret]
        adv, vt = torch.full_like(r, float("nan")), torch.full_like(r, float("nan"))
        calls["gae_shifted", mode] = (lambda mode=mode, adv=adv, vt=vt: _launch_gae(mode, r, v, last, d, adv, vt)), \
            [adv, vt], [ref_adv, ref_vt]
    out = [None]
    calls["discounted_return", "package"] = (
        (lambda: out.__setitem__(0, K.discounted_return(r, d, gamma=GAMMA, time_dim=-1))), out, [ref_ret])
    out2 = [None, None]
    calls["gae_shifted", "package"] = (
        (lambda: out2.__setitem__(slice(None), K.gae(r, v, None, d, gamma=GAMMA, lmbda=LMBDA, time_dim=-1,
                                                      last_state_value=last))), out2, [ref_adv, ref_vt])
    return calls


def run(shapes, out_dir, smoke=False):
    """Checks every kernel of every shape against float64, then times it (``smoke``: on the CPU through Triton's
    interpreter, nothing timed)."""
    rows = []
    for shape in shapes:
        B, T = (int(v) for v in shape.split("x"))
        assert T % 4 == 0, "rows must start on a 16-byte boundary (T a multiple of 4)"
        for (algo, impl), (fn, outs, refs) in _calls(B, T, DEVICE).items():
            fn()
            if DEVICE == "cuda":
                torch.cuda.synchronize()
            err = max((o.double() - ref).abs().max().item() for o, ref in zip(outs, refs))
            ok = err < 1e-3
            row = {"algorithm": algo, "impl": impl, "B": B, "T": T, "max_err": err, "ok": ok}
            if ok and not smoke:
                from _common import graph_time_us

                row["graph_us"] = graph_time_us(fn, calls=50, reps=5)
                row["do_bench_us"] = triton.testing.do_bench(fn, warmup=3, rep=10) * 1e3
            rows.append(row)
            print(json.dumps(row), flush=True)
    env = {"gpu": torch.cuda.get_device_name() if DEVICE == "cuda" else "none (--smoke)", "torch": torch.__version__,
           "triton": triton.__version__, "commit": os.environ.get("BENCH_COMMIT", "?")}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "proto_reverse.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    lines = [f"# Prototype: reverse scans of one-row tiles ({env['gpu']})", "",
             "Generated by `benchmarks/proto_reverse.py` (see its docstring); µs per call, float32, one row per "
             f"program (rows of at most 128 steps: four). {json.dumps(env)}", "",
             "| algorithm | B | T | impl | graph (50 calls) | do_bench (L2 flushed) | max err |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        graph, bench = r.get("graph_us", float("nan")), r.get("do_bench_us", float("nan"))
        lines.append(f"| {r['algorithm']} | {r['B']} | {r['T']} | {r['impl']} | {graph:.2f} | {bench:.2f} | "
                     f"{r['max_err']:.1e} |")
    (out_dir / "proto_reverse.md").write_text("\n".join(lines) + "\n")


def sass(shapes):
    """sm_90 SASS counts of each prototype kernel (no GPU: Triton's compiler behind a stand-in driver)."""
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tools"))
    from triton.runtime import driver

    import sass_sm90
    from rl_triton_torchrl.kernels import _aot

    driver.set_active(_aot._TargetDriver(90))
    for shape in shapes:
        B, T = (int(v) for v in shape.split("x"))
        r, v, last, d = _inputs(B, T, "cpu")
        for mode, code in MODES.items():
            cfg = _config(mode, T)
            for name, kern, args in (("discounted_return", _discounted_kernel, (r, d, r, GAMMA, T, B)),
                                     ("gae_shifted", _gae_kernel, (r, v, last, d, r, r, GAMMA, LMBDA, T, B))):
                k = kern.warmup(*args, MODE=code, **cfg, grid=(triton.cdiv(B, cfg["BLOCK_R"]),))
                ops = sass_sm90.opcodes(sass_sm90.sass_of(k)[0])
                print(f"{name:18s} {shape:10s} {mode:6s} total {sum(ops.values()):5d} "
                      + " ".join(f"{op} {ops[op]}" for op in sass_sm90.COUNTED)
                      + f" CVT {k.asm['ttgir'].count('ttg.convert_layout')}")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--shapes", default=SHAPES)
    p.add_argument("--out", default="benchmarks/results/proto_reverse")
    p.add_argument("--sass", action="store_true", help="print sm_90 SASS instruction counts instead (no GPU)")
    p.add_argument("--smoke", action="store_true", help="tiny shapes on the CPU, checked, nothing timed: tests the "
                                                        "script")
    args = p.parse_args(argv)
    shapes = "3x256,2x260,5x128,3x100".split(",") if args.smoke else args.shapes.split(",")
    if args.sass:
        sass(shapes)
    else:
        run(shapes, Path(args.out), args.smoke)


if __name__ == "__main__":
    main()
