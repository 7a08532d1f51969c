"""Kernel-level benchmark: every algorithm, ours (Triton) against compiled scans, our torch path, TorchRL's
functionals and the copy-bandwidth limit.

    python benchmarks/bench_kernels.py                   # the full grid (about 6 minutes on an H200; --plan says)
    python benchmarks/bench_kernels.py --quick           # a first check (about 2 minutes)
    python benchmarks/bench_kernels.py --plan --calibrate benchmarks/results/h200/bench_kernels_quick.json
    python benchmarks/bench_kernels.py --plan            # cells, compiles and the estimated run time; runs nothing
    python benchmarks/bench_kernels.py --algorithms gae --B 4096 --T 32,128 --dtypes float32 --truncation with

Implementations (``--impls``; each checked against a float64 reference before it is timed, a wrong one is reported
and not timed):

- ``ours_triton``: our fused kernels.
- ``ours_torch``: our plain-torch path (``backend="torch"``), ``O(sqrt T)`` vectorised steps.
- ``doubling``: our torch path with its scan replaced by a ``torch.compile``'d doubling (Hillis-Steele) scan
  (``baselines.py``).
- ``assoc_scan``: our torch path with its scan replaced by ``torch._higher_order_ops.associative_scan`` under
  ``torch.compile`` (``baselines.py``).
- ``torchrl_vec``, ``torchrl_loop``: TorchRL's vectorised and loop functionals, where TorchRL has the algorithm.

The compiled scans (``--compile-backend``, default inductor) mark the rows dimension dynamic (``--dynamic batch``):
one graph per T, scan direction and batch-of-one-or-more, shared by every algorithm and both dtypes (their
coefficients are float32), compiled and tuned at the largest B of that T (shapes run largest B first). Their first
call in a cell (compile included) is recorded as ``first_call_s`` and the graphs it compiled as ``compiles``.

Grid (``--grid``): ``core`` is B in {1024, 4096, 16384, 65536} x T in {8, 32, 128, 512, 2048}; ``long`` is B in
{1, 16} x T in {2^16, 2^20}; ``full`` (the default) is both. ``--B``/``--T`` replace the grid by their product.
Each shape runs in ``--dtypes`` (float32, bfloat16) and ``--truncation`` (``with``: 1% of the steps terminate and 1%
are truncated; ``without``: the same episode ends, all terminations, ``terminated`` not passed). Algorithms that take
no ``terminated`` flag (discounted return, eligibility traces, prefix sums) run once per shape and dtype, recorded
as truncation ``n/a``.

Per cell: device time (``triton.testing.do_bench`` median of a replayed one-call CUDA graph, L2 flushed; code that
synchronises with the host is timed as called), ours also as the kernels' own duration (``kernel_us``: the GPU's
activity records through ``torch.profiler``, L2 flushed, no launch counted) and per call back to back in a CUDA graph,
host wall time per call, the bytes the algorithm must move (each input read once, each output written once), and
the fraction of the device-to-device copy bandwidth measured in the same run, as is an empty kernel's device time.
In cells of at least 2^26 elements the first implementation timed is timed twice and the first timing set aside
(``settle_us``; ``SETTLE_ELEMENTS``).

Time budgets, all recorded in the rows, never silent: an implementation whose one call takes longer than
``--max-call-ms`` is checked but not timed ("skipped (too slow: ...)"); TorchRL's loop functionals are not run above
T = 128 (one Python step per time step; ``--all-loops`` runs them); cells not started within ``--budget-s`` are
recorded as not run. Results: ``<out>/<name>.json``, then ``report.py`` writes the markdown tables and PNG plots
from it. Without a GPU the kernels run through Triton's interpreter and every time is host wall time (a smoke run).
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

_STARTED = time.perf_counter()  # the run's startup time counts the imports below

import torch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":  # before triton is imported (torchrl imports it): the kernels run through the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from torchrl.objectives.value import functional as trl  # noqa: E402

import baselines  # noqa: E402
from _common import (  # noqa: E402
    RESULTS, copy_bandwidth, device_time_us, environment, graph_time_us, kernel_time_us, wall_time_us,
)
from rl_triton_torchrl import kernels as K  # noqa: E402
from rl_triton_torchrl.kernels import scan  # noqa: E402

GAMMA, LMBDA = 0.99, 0.95

GRIDS = {
    "core": ((1024, 4096, 16384, 65536), (8, 32, 128, 512, 2048)),
    "long": ((1, 16), (1 << 16, 1 << 20)),
}
# --quick: the cells of every target (large rollouts, short T, small GAE, long sequences); GAE, V-trace (the longest
# torch path) and a forward scan
QUICK = {"shapes": [(65536, 2048), (65536, 8), (4096, 32), (4096, 128), (16, 1 << 16)],
         "algorithms": "gae,vtrace,episodic_prefix_sum", "dtypes": "float32", "truncation": "with"}
IMPLS = ("ours_triton", "ours_torch", "doubling", "assoc_scan", "torchrl_vec", "torchrl_loop")
CAPTURABLE = {"ours_triton", "ours_torch", "doubling", "assoc_scan"}  # TorchRL's functionals synchronise (.item())
COMPILED = {"ours_triton", "doubling", "assoc_scan"}  # their first call in a cell may compile
LOOP_MAX_T = 128
# In cells of at least this many elements the first implementation timed (right after the float64 check) is timed
# twice and the first timing set aside: on the H200 a first timing at 65536 x 2048 ran 7-9% slower than the same
# code timed again, for every algorithm (results/h200/sweep_repeat.md); at 65536 x 512 they agreed within 0.3%.
SETTLE_ELEMENTS = 1 << 26
REVERSE = {"eligibility_traces": False, "episodic_prefix_sum": False}  # scan direction; the others are reverse


def as_float64(x: dict) -> dict:
    """The rollout ``x`` with its float tensors in float64: the inputs of the references (the float64 torch path)."""
    return {k: (v.double() if v is not None and v.is_floating_point() else v) for k, v in x.items()}


def rollout(B, T, dtype, truncation, seed=0):
    """A ``[B, T, 1]`` rollout; ``truncation="without"`` has the same episode ends, all of them terminations, and
    passes no ``terminated`` flag (``x["t"] is None``)."""
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    shape = (B, T, 1)
    term = torch.rand(shape, generator=g, device=DEVICE) < 0.01
    trunc = torch.rand(shape, generator=g, device=DEVICE) < 0.01
    x = {k: torch.randn(shape, generator=g, device=DEVICE).to(dtype) for k in ("r", "v", "nv", "eq")}
    x["lpi"] = (-torch.rand(shape, generator=g, device=DEVICE)).to(dtype)
    x["lmu"] = (-torch.rand(shape, generator=g, device=DEVICE)).to(dtype)
    x["ratio"] = torch.rand(shape, generator=g, device=DEVICE).to(dtype) * 2
    return {**x, "d": term | trunc, "t": None if truncation == "without" else term}


@dataclass
class Algorithm:
    """``call(x, backend)`` runs our implementation; bytes per element = ``floats`` inputs and ``outputs`` of the
    float size, plus one byte per bool flag (two with truncations where ``terminated`` exists)."""

    call: object
    floats: int
    outputs: int
    has_terminated: bool
    torchrl: dict = field(default_factory=dict)

    def bytes_per_element(self, float_bytes: int, truncation: str) -> int:
        flags = 2 if self.has_terminated and truncation == "with" else 1
        return (self.floats + self.outputs) * float_bytes + flags


ALGOS = {
    "gae": Algorithm(
        lambda x, be: K.gae(x["r"], x["v"], x["nv"], x["d"], x["t"], gamma=GAMMA, lmbda=LMBDA, backend=be),
        floats=3, outputs=2, has_terminated=True, torchrl={
            "torchrl_vec": lambda x: trl.vec_generalized_advantage_estimate(GAMMA, LMBDA, x["v"], x["nv"], x["r"],
                                                                            x["d"], x["t"]),
            "torchrl_loop": lambda x: trl.generalized_advantage_estimate(GAMMA, LMBDA, x["v"], x["nv"], x["r"],
                                                                         x["d"], x["t"]),
        }),
    "td_lambda": Algorithm(
        lambda x, be: K.td_lambda_return(x["r"], x["nv"], x["d"], x["t"], gamma=GAMMA, lmbda=LMBDA, backend=be),
        floats=2, outputs=1, has_terminated=True, torchrl={
            "torchrl_vec": lambda x: trl.vec_td_lambda_return_estimate(GAMMA, LMBDA, x["nv"], x["r"], x["d"],
                                                                       x["t"]),
            "torchrl_loop": lambda x: trl.td_lambda_return_estimate(GAMMA, LMBDA, x["nv"], x["r"], x["d"], x["t"]),
        }),
    "vtrace": Algorithm(
        lambda x, be: K.vtrace(x["lpi"], x["lmu"], x["v"], x["nv"], x["r"], x["d"], x["t"], gamma=GAMMA, backend=be),
        floats=5, outputs=2, has_terminated=True, torchrl={
            "torchrl_loop": lambda x: trl.vtrace_advantage_estimate(GAMMA, x["lpi"], x["lmu"], x["v"], x["nv"],
                                                                    x["r"], x["d"], x["t"]),
        }),
    "retrace": Algorithm(
        lambda x, be: K.retrace(x["v"], x["eq"], x["r"], x["d"], x["t"], ratio=x["ratio"], gamma=GAMMA,
                                lmbda=LMBDA, backend=be),
        floats=4, outputs=2, has_terminated=True),
    "discounted_return": Algorithm(
        lambda x, be: K.discounted_return(x["r"], x["d"], gamma=GAMMA, backend=be),
        floats=1, outputs=1, has_terminated=False, torchrl={
            "torchrl_vec": lambda x: trl.reward2go(x["r"], x["d"], GAMMA),
        }),
    "eligibility_traces": Algorithm(
        lambda x, be: K.eligibility_traces(x["r"], x["d"], gamma=GAMMA, lmbda=LMBDA, backend=be),
        floats=1, outputs=1, has_terminated=False),
    "episodic_prefix_sum": Algorithm(
        lambda x, be: K.episodic_prefix_sum(x["r"], x["d"], reset="after_done", backend=be),
        floats=1, outputs=1, has_terminated=False),
}


def _tuple(out):
    return out if isinstance(out, tuple) else (out,)


def check(outs, refs, dtype) -> float:
    """Largest error over the outputs an implementation returns (compared in order with ours); negative if any is
    beyond the dtype's tolerance, relative to the reference's magnitude."""
    tol = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 3e-3, torch.float64: 1e-9}[dtype]
    worst, ok = 0.0, True
    for out, ref in zip(_tuple(outs), refs):
        err = (out.double() - ref).abs().max().item()
        if math.isnan(err):
            err = math.inf
        worst = max(worst, err)
        # TorchRL's vectorised functionals cut the discount series below 1e-7; the tolerance allows that much more
        ok &= err <= tol * (1 + ref.abs().max().item())
    return worst if ok else -worst


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


@triton.jit
def _empty_kernel(x_ptr, N: tl.constexpr):
    pass


def empty_kernel_times(args) -> dict:
    """Device time of an empty kernel launch, measured like the cells (the floor of any one-kernel call)."""
    buf = torch.empty(1, device=DEVICE)

    def fn():
        _empty_kernel[(1,)](buf, 1)

    fn()
    if DEVICE != "cuda":
        return {"empty_kernel_us": wall_time_us(fn, 20), "empty_kernel_graph_us": None}
    us, _ = device_time_us(fn, True, args.warmup_ms, args.rep_ms)
    return {"empty_kernel_us": us, "empty_kernel_graph_us": graph_time_us(fn, 20, 5),
            "empty_kernel_kernel_us": kernel_time_us(fn)}


class Impls:
    """Builds each implementation's ``fn(x)`` for an algorithm, or says why it does not exist or cannot run."""

    def __init__(self, args):
        baselines.configure_dynamo()
        self.scans, self.notes = {}, {}
        for kind in baselines.IMPLS:
            ok, note = baselines.available(kind, DEVICE)
            self.notes[kind] = f"torch.compile(backend={args.compile_backend!r}), {note}"
            if ok:
                self.scans[kind] = baselines.make_scan(kind, DEVICE, backend=args.compile_backend,
                                                       dynamic_rows=args.dynamic == "batch")
            else:
                self.notes[kind] = f"unavailable: {note}"

    def get(self, impl, algo):
        """(fn, None) or (None, status) or None if the implementation has no such algorithm."""
        spec = ALGOS[algo]
        if impl == "ours_triton":
            return (lambda x: spec.call(x, "triton")), None
        if impl == "ours_torch":
            return (lambda x: spec.call(x, "torch")), None
        if impl in baselines.IMPLS:
            if impl not in self.scans:
                return None, self.notes[impl]
            swap = self.scans[impl]

            def fn(x):
                with baselines.swapped_scan(swap):
                    return spec.call(x, "torch")

            return fn, None
        if impl in spec.torchrl:
            return spec.torchrl[impl], None
        return None


def static_skip(impl, B, T, args) -> str | None:
    if impl == "torchrl_loop" and T > LOOP_MAX_T and not args.all_loops:
        return f"skipped (too slow: one Python step per time step, T > {LOOP_MAX_T})"
    return None


def bench_impl(row, fn, impl, x, refs, dtype, args, settle=False):
    """Checks, probes and times one implementation on one cell; fills ``row``."""
    n_graphs = baselines.compile_count()
    calls_before = [s.calls for s in IMPLS_OBJ.scans.values()]
    start = time.perf_counter()
    try:
        out = fn(x)
        _sync()
        row["first_call_s"] = time.perf_counter() - start
        err = check(out, refs, dtype)
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        row["status"] = "out of memory"
        return
    except Exception as e:  # noqa: BLE001 - a failing implementation is a result, not a crash of the run
        row["status"] = f"error: {type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}"
        return
    if impl in baselines.IMPLS:
        row["compiles"] = baselines.compile_count() - n_graphs
        if [s.calls for s in IMPLS_OBJ.scans.values()] == calls_before:
            row["status"] = "error: the scan was not swapped (the torch path no longer calls torch_linear_scan)"
            return
    row["max_err"] = abs(err)
    if err < 0:
        row["status"] = "wrong"
        return
    if impl in COMPILED:  # the first call compiled: time a second one
        start = time.perf_counter()
        fn(x)
        _sync()
        probe_us = (time.perf_counter() - start) * 1e6
    else:
        probe_us = row["first_call_s"] * 1e6
    row["probe_us"] = probe_us
    if probe_us > args.max_call_ms * 1e3:
        row["status"] = f"skipped (too slow: {probe_us / 1e3:.0f} ms per call > {args.max_call_ms:g} ms)"
        return
    try:
        if DEVICE == "cuda":
            if settle:  # timed once and set aside (kept as settle_us): see SETTLE_ELEMENTS
                row["settle_us"], _ = device_time_us(lambda: fn(x), impl in CAPTURABLE, args.warmup_ms, args.rep_ms)
            row["device_us"], row["device_timing"] = device_time_us(lambda: fn(x), impl in CAPTURABLE,
                                                                    args.warmup_ms, args.rep_ms)
            row["graph_us"] = graph_time_us(lambda: fn(x), 10, 5) if impl == "ours_triton" else None
            if impl == "ours_triton":  # the kernels alone (no launch of any kind), from the GPU's activity records
                row["kernel_us"] = kernel_time_us(lambda: fn(x))
            row["wall_us"] = wall_time_us(lambda: fn(x), None, args.wall_budget_s)
        else:  # a smoke run: Triton through its interpreter, only host wall time exists
            row["device_us"], row["device_timing"] = wall_time_us(lambda: fn(x), 3), "host wall (no GPU)"
            row["graph_us"] = None
            row["wall_us"] = wall_time_us(lambda: fn(x), 3)
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        row["status"] = "out of memory (while timing)"
        return
    except Exception as e:  # noqa: BLE001
        row["status"] = f"error while timing: {type(e).__name__}: {str(e).strip()[:200]}"
        return
    row["status"] = "ok"
    row["bw_fraction"] = row["limit_us"] / row["device_us"]
    row["ratio_to_limit"] = row["device_us"] / row["limit_us"]


IMPLS_OBJ: Impls  # set in main


def bench_cell(algo, B, T, dtype, truncation, x, x64, bandwidth, args, out_rows):
    """Every implementation on one cell; the rows are appended to ``out_rows`` as they are measured."""
    spec = ALGOS[algo]
    refs = _tuple(spec.call(x64, "torch"))
    nbytes = spec.bytes_per_element(torch.finfo(dtype).bits // 8, truncation) * B * T
    rows = []
    for impl in args.impls:
        got = IMPLS_OBJ.get(impl, algo)
        if got is None:
            continue
        row = {"algorithm": algo, "impl": impl, "B": B, "T": T, "dtype": str(dtype).replace("torch.", ""),
               "truncation": truncation if spec.has_terminated else "n/a", "bytes": nbytes,
               "limit_us": nbytes / bandwidth * 1e6}
        fn, status = got
        status = status or static_skip(impl, B, T, args)
        if status:
            row["status"] = status
        else:
            settle = B * T >= SETTLE_ELEMENTS and not any(r.get("device_us") for r in rows)
            bench_impl(row, fn, impl, x, refs, dtype, args, settle)
        rows.append(row)
        out_rows.append(row)
        if _STOP:
            raise _Stop(f"signal {_STOP[0]}")
        if row["status"] == "ok":
            print(f"{algo:19s} {impl:12s} B={B:6d} T={T:7d} {row['dtype']:8s} {row['truncation']:7s} "
                  f"device {row['device_us']:9.1f} us  wall {row['wall_us']:9.1f} us  "
                  f"{100 * row['bw_fraction']:5.1f}% of copy bw", flush=True)
        else:
            print(f"{algo:19s} {impl:12s} B={B:6d} T={T:7d} {row['dtype']:8s} {row['truncation']:7s} {row['status']}",
                  flush=True)
    ours = next((r for r in rows if r["impl"] == "ours_triton" and r.get("device_us")), None)
    if ours:
        for r in rows:
            if r.get("device_us") and r is not ours:
                r["ours_speedup"] = r["device_us"] / ours["device_us"]
    return rows


# ---------------------------------------------------------------------------------------------------------------
# The plan: cells, compiles and a time estimate, before anything runs
# ---------------------------------------------------------------------------------------------------------------

# Assumptions of the estimate on an H200 host; ``--calibrate RUN.json`` replaces the compile and measurement ones by
# what that run (e.g. --quick) measured.
PLAN = {
    "bandwidth": 4.27e12,  # copy bandwidth measured in the previous H200 run, bytes/s
    "startup_s": 20.0,  # imports, CUDA context, copy bandwidth, empty kernel
    "report_s": 15.0,  # the markdown and the plots at the end
    "triton_jit_s": 0.7,  # one compile of one of our kernels (0.3-1.4 s for sm_90 on a slow 2-core CPU)
    "graph_s": 3.0,  # one torch.compile graph (inductor; its Triton kernels compile in parallel workers)
    "first_graph_s": 15.0,  # inductor's first graph in a process, on top of graph_s
    "launch_s": 5e-6,  # one eager kernel launch
    "overhead_s": 0.012,  # check, probe, graph capture, events, Python: per timed implementation
}


def calibrate(path) -> dict:
    """PLAN with the compile and measurement constants measured by an earlier run (its JSON ``timing`` record)."""
    data = json.loads(Path(path).read_text())
    timing, rows = data["environment"]["timing"], data["rows"]
    first = timing["first_calls_s"]
    plan_ = dict(PLAN)
    compiled = first.get("doubling", 0.0) + first.get("assoc_scan", 0.0)
    if timing.get("graphs"):
        plan_["graph_s"] = compiled / timing["graphs"]
        plan_["first_graph_s"] = 0.0
    jits = {(r["algorithm"], r["dtype"], min(1 << max(0, (r["T"] - 1).bit_length()), scan.MAX_BLOCK_T), r["B"] == 1,
             r["T"] % 16 == 0) for r in rows if r["impl"] == "ours_triton" and "first_call_s" in r}
    if jits:
        plan_["triton_jit_s"] = first.get("ours_triton", 0.0) / len(jits)
    plan_["startup_s"] = timing.get("startup_s", plan_["startup_s"])
    timed = sum(r.get("status") == "ok" for r in rows)
    measured = timing["total_s"] - plan_["startup_s"] - sum(first.values())
    cfg = data["environment"].get("measurement", {})
    fixed = (cfg.get("warmup_ms", 3) + cfg.get("rep_ms", 10)) * 1e-3 + cfg.get("wall_budget_s", 0.01)
    if timed:
        plan_["overhead_s"] = max(0.0, measured / timed - fixed)
    if data["environment"].get("copy_bandwidth_GBps"):
        plan_["bandwidth"] = data["environment"]["copy_bandwidth_GBps"] * 1e9
    plan_["calibrated_from"] = str(path)
    return plan_


def shapes_of(args):
    """The (B, T) shapes, largest B first: a compiled baseline's graph for a T is compiled, and inductor tunes its
    kernels, at the first shape with that T, and the large batches are where the bandwidth matters."""
    if args.quick and not (args.B or args.T):
        return list(QUICK["shapes"])
    if args.B or args.T:
        Bs = [int(b) for b in (args.B or "4096,16384,65536").split(",")]
        Ts = [int(t) for t in (args.T or "32,128,2048").split(",")]
    else:
        grids = ("core", "long") if args.grid == "full" else (args.grid,)
        return [(B, T) for g in grids for B, T in itertools.product(sorted(GRIDS[g][0], reverse=True), GRIDS[g][1])]
    return list(itertools.product(sorted(Bs, reverse=True), Ts))


def cells_of(args):
    """The cells in the order they run: float32 before bfloat16, with truncations before without."""
    cells = []
    for dtype in args.dtypes:
        for i, truncation in enumerate(args.truncation):
            for B, T in shapes_of(args):
                algos = [a for a in args.algorithms if ALGOS[a].has_terminated or i == 0]
                if algos:
                    cells.append((dtype, truncation, B, T, algos))
    return cells


def _call_s(impl, algo, B, T, dtype, truncation, P):
    """Rough device time of one call (the plan's model): ours at the bandwidth limit, the others in passes over
    [B, T] float32 arrays and kernel launches."""
    spec = ALGOS[algo]
    f = torch.finfo(dtype).bits // 8
    n = B * T
    limit = spec.bytes_per_element(f, truncation) * n / P["bandwidth"]
    steps = max(1, math.ceil(math.log2(max(T, 2))))
    coef_passes = 3 * (spec.floats + spec.outputs) + 4  # eager coefficient and post-processing ops of the torch path
    if impl == "ours_triton":
        return max(limit / 0.9, 5e-6)
    if impl == "doubling":
        return n * 4 * (coef_passes + 3 * steps) / P["bandwidth"] + (coef_passes + steps) * P["launch_s"]
    if impl == "assoc_scan":
        return n * 4 * (coef_passes + 6) / P["bandwidth"] + (coef_passes + 2) * P["launch_s"]
    if impl == "ours_torch":
        C = max(1, math.isqrt(T // 2))
        return n * 4 * (coef_passes + 12) / P["bandwidth"] + (coef_passes + 4 * C + 2 * T / C) * P["launch_s"]
    if impl == "torchrl_vec":  # 323 ms at 65536 x 2048 on the H200, about 0.7 ms at small sizes
        return 0.7e-3 + 2.4e-9 * n
    if impl == "torchrl_loop":  # 32-120 us per time step
        return 80e-6 * T + 2e-9 * n
    raise KeyError(impl)


def plan(args, P=None) -> dict:
    """Counts the cells, implementations, compiles and estimates the run time (see the PLAN assumptions)."""
    P = P or PLAN
    timed = skipped = 0
    measure_s = reference_s = 0.0
    graphs, jits = set(), set()
    for dtype_name, truncation, B, T, algos in cells_of(args):
        dtype = getattr(torch, dtype_name)
        C = max(1, math.isqrt(T // 2))
        reference_s += len(algos) * (B * T * 8 * 40 / P["bandwidth"] + (8 * C + 2 * T / C) * P["launch_s"])
        for algo in algos:
            for impl in args.impls:
                if impl.startswith("torchrl") and impl not in ALGOS[algo].torchrl:
                    continue
                if static_skip(impl, B, T, args):
                    skipped += 1
                    continue
                if impl in baselines.IMPLS:
                    graphs.add((impl, T, B == 1, REVERSE.get(algo, True)))
                if impl == "ours_triton":  # a new block shape, dtype or flag set compiles the kernel again
                    block_t = min(1 << max(0, (T - 1).bit_length()), scan.MAX_BLOCK_T)
                    jits.add((algo, dtype_name, block_t, B == 1, T % 16 == 0))
                c = _call_s(impl, algo, B, T, dtype, truncation, P)
                if c > args.max_call_ms * 1e-3:  # checked and probed, not timed
                    skipped += 1
                    measure_s += 2 * c + P["overhead_s"]
                    continue
                timed += 1
                measure_s += (P["overhead_s"] + max((args.warmup_ms + args.rep_ms) * 1e-3, 8 * c)
                              + max(args.wall_budget_s, 3 * c) + 8 * c + (60 * c if impl == "ours_triton" else 0))
    n_graphs = len(graphs) if args.dynamic == "batch" else None
    if n_graphs is None:  # one graph per shape
        n_graphs = len({(impl, B, T, REVERSE.get(a, True)) for d, tr, B, T, algos in cells_of(args)
                        for a in algos for impl in args.impls if impl in baselines.IMPLS})
    compile_s = (n_graphs * P["graph_s"] + (P["first_graph_s"] if n_graphs else 0)
                 if args.compile_backend == "inductor" else n_graphs * 1.0)
    total = (P["startup_s"] + measure_s + reference_s + compile_s + len(jits) * P["triton_jit_s"]
             + (0 if args.no_report else P["report_s"]))
    return {"cells": len(cells_of(args)), "algorithm_cells": sum(len(c[4]) for c in cells_of(args)),
            "timed_impls": timed, "skipped_impls": skipped, "torch_compile_graphs": n_graphs,
            "triton_kernel_compiles": len(jits), "measure_s": round(measure_s), "reference_s": round(reference_s),
            "compile_s": round(compile_s + len(jits) * P["triton_jit_s"]), "total_s": round(total),
            "assumptions": {k: (float(f"{v:.3g}") if isinstance(v, float) else v) for k, v in P.items()}}


# ---------------------------------------------------------------------------------------------------------------


class _Stop(BaseException):  # not an Exception, so that no `except Exception` swallows it
    pass


_STOP = []  # the signal that asked the run to stop, in case the code it interrupted swallowed _Stop


def _on_sigterm(signum, frame):
    _STOP.append(signum)
    raise _Stop(f"signal {signum}")


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--grid", default="full", choices=("full", "core", "long"),
                        help="core: B 1024-65536 x T 8-2048; long: B 1, 16 x T 2^16, 2^20; full: both")
    parser.add_argument("--B", help="comma-separated batch sizes (with --T: replaces the grid by their product)")
    parser.add_argument("--T", help="comma-separated sequence lengths")
    parser.add_argument("--algorithms", "--algos", default=",".join(ALGOS), help="comma-separated algorithms")
    parser.add_argument("--impls", default=",".join(IMPLS), help="comma-separated implementations")
    parser.add_argument("--dtypes", "--dtype", default="float32,bfloat16")
    parser.add_argument("--truncation", default="with,without", help="comma-separated: with, without")
    parser.add_argument("--quick", action="store_true",
                        help="a first check: 5 shapes (the targets' cells), gae, vtrace, episodic_prefix_sum, float32, "
                             "with truncations")
    parser.add_argument("--plan", action="store_true", help="print the cells, compiles and estimated time; run nothing")
    parser.add_argument("--calibrate", metavar="RUN.json",
                        help="estimate with the compile and measurement times of an earlier run (e.g. --quick)")
    parser.add_argument("--max-call-ms", type=float, default=None,
                        help="check but do not time an implementation whose one call takes longer; default 25 on a "
                             "GPU, none on the CPU")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="start no cell after this many seconds (the rest is recorded as not run); default "
                             "330 on a GPU, none on the CPU")
    parser.add_argument("--warmup-ms", type=float, default=3.0, help="do_bench warm-up per timing")
    parser.add_argument("--rep-ms", type=float, default=10.0,
                        help="do_bench repetitions per timing (a 5 us call with its L2 flush: about 100 samples)")
    parser.add_argument("--wall-budget-s", type=float, default=0.01, help="host wall time per timing")
    parser.add_argument("--compile-backend", default="inductor",
                        help="torch.compile backend of the compiled baselines (eager: a fast smoke of the plumbing)")
    parser.add_argument("--dynamic", default="batch", choices=("batch", "none"),
                        help="batch: one compiled graph per T for every B; none: one per shape")
    parser.add_argument("--out", default="h200", help="subdirectory of benchmarks/results, or a path")
    parser.add_argument("--name", default="bench_kernels")
    parser.add_argument("--no-report", action="store_true", help="write the JSON only")
    parser.add_argument("--all-loops", action="store_true", help="time TorchRL's loop functionals at every T")
    args = parser.parse_args(argv)
    if args.quick:
        defaults = {a.dest: a.default for a in parser._actions}
        for key in ("algorithms", "dtypes", "truncation"):
            if getattr(args, key) == defaults[key]:
                setattr(args, key, QUICK[key])
    args.algorithms = args.algorithms.split(",")
    args.impls = args.impls.split(",")
    args.dtypes = args.dtypes.split(",")
    args.truncation = args.truncation.split(",")
    for name, given, known in (("algorithm", args.algorithms, ALGOS), ("impl", args.impls, IMPLS),
                               ("truncation", args.truncation, ("with", "without"))):
        unknown = [g for g in given if g not in known]
        if unknown:
            parser.error(f"unknown {name} {unknown}; choose from {list(known)}")
    if args.max_call_ms is None:  # --plan estimates a GPU run
        args.max_call_ms = 25.0 if DEVICE == "cuda" or args.plan else math.inf
    if args.budget_s is None:
        args.budget_s = 330.0 if DEVICE == "cuda" else math.inf
    return args


def command_line(argv) -> str:
    return "python benchmarks/bench_kernels.py " + " ".join(argv)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    estimate = plan(args, calibrate(args.calibrate) if args.calibrate else None)
    print(f"plan: {json.dumps(estimate)}", flush=True)
    if args.plan:
        return
    started = _STARTED
    signal.signal(signal.SIGTERM, _on_sigterm)
    global IMPLS_OBJ
    IMPLS_OBJ = Impls(args)
    env = environment()
    env["device"] = DEVICE
    bandwidth = copy_bandwidth(device=DEVICE) if DEVICE == "cuda" else copy_bandwidth(64 << 20, device=DEVICE)
    env["copy_bandwidth_GBps"] = round(bandwidth / 1e9, 1)
    env.update(empty_kernel_times(args))
    env["impl_notes"] = {k: v for k, v in IMPLS_OBJ.notes.items() if k in args.impls}
    env["compile"] = {"backend": args.compile_backend, "dynamic": args.dynamic, "scope": "scan"}
    env["measurement"] = {"warmup_ms": args.warmup_ms, "rep_ms": args.rep_ms, "wall_budget_s": args.wall_budget_s,
                          "max_call_ms": args.max_call_ms, "budget_s": args.budget_s}
    env["plan"] = estimate
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s, empty kernel {env['empty_kernel_us']:.2f} us on "
          f"{env.get('gpu', DEVICE)}", flush=True)
    out_dir = RESULTS / args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{args.name}.json"
    rows = []
    timing = {"first_calls_s": {}, "graphs": 0}
    graphs0 = baselines.compile_count()

    def save(final=False):
        timing["total_s"] = time.perf_counter() - started
        timing["graphs"] = baselines.compile_count() - graphs0
        env["timing"] = timing
        if final and DEVICE == "cuda" and "interrupted" not in env:
            env["copy_bandwidth_end_GBps"] = round(copy_bandwidth() / 1e9, 1)
        tmp = path.with_suffix(".json.tmp")  # a run stopped mid-write keeps the previous complete file
        tmp.write_text(json.dumps({"environment": env, "command": command_line(argv), "rows": rows}, indent=1))
        tmp.replace(path)

    cells = cells_of(args)
    timing["startup_s"] = time.perf_counter() - started
    def not_run(reason):
        """A row for every planned implementation and cell that has none, saying why."""
        done = {(r["dtype"], r["truncation"], r["B"], r["T"], r["algorithm"], r["impl"]) for r in rows}
        for dtype_name, truncation, B, T, algos in cells:
            for algo in algos:
                tr = truncation if ALGOS[algo].has_terminated else "n/a"
                for impl in args.impls:
                    if (dtype_name, tr, B, T, algo, impl) not in done and IMPLS_OBJ.get(impl, algo) is not None:
                        rows.append({"algorithm": algo, "impl": impl, "B": B, "T": T, "dtype": dtype_name,
                                     "truncation": tr, "status": f"not run ({reason})"})

    try:
        for dtype_name, truncation, B, T, algos in cells:
            if time.perf_counter() - started > args.budget_s:
                not_run(f"run budget of {args.budget_s:g} s spent")
                break
            dtype = getattr(torch, dtype_name)
            x = rollout(B, T, dtype, truncation)
            x64 = as_float64(x)
            for algo in algos:
                for r in bench_cell(algo, B, T, dtype, truncation, x, x64, bandwidth, args, rows):
                    if "first_call_s" in r:
                        key = r["impl"]
                        timing["first_calls_s"][key] = timing["first_calls_s"].get(key, 0.0) + r["first_call_s"]
            del x, x64
            if DEVICE == "cuda":
                torch.cuda.empty_cache()
            save()
    except (KeyboardInterrupt, _Stop) as e:
        env["interrupted"] = str(e) or type(e).__name__
        print(f"interrupted ({env['interrupted']}): writing what was measured", flush=True)
        not_run(f"interrupted: {env['interrupted']}")
    save(final=True)
    print(f"wrote {path} ({len(rows)} rows, {time.perf_counter() - started:.0f} s, "
          f"{timing['graphs']} compiled graphs; plan said {estimate['total_s']} s)", flush=True)
    if not args.no_report:
        import report

        report.write_report(path)
        print(f"wrote {path.with_suffix('.md')} and plots", flush=True)


if __name__ == "__main__":
    main()
