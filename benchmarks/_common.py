"""Shared benchmark plumbing: environment record, timers, the copy-bandwidth ceiling, JSON and markdown output."""
from __future__ import annotations

import gc
import json
import os
import platform
import statistics
import subprocess
import time
from pathlib import Path

import torch

RESULTS = Path(__file__).resolve().parent / "results"


def environment() -> dict:
    """What the numbers were measured on ("triton": None where it is not installed: the torch path only)."""
    from rl_triton_torchrl.kernels._triton import HAS_TRITON, triton

    here = Path(__file__).parent
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=here).stdout.strip()
        # tracked files that differ from that commit (a stale checkout's metadata under another tree, or local
        # edits): the commit alone would name code that did not run
        if commit and subprocess.run(["git", "diff", "--quiet", "HEAD", "--"], cwd=here).returncode == 1:
            commit += "-dirty"
    except OSError:
        commit = ""
    env = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        # BENCH_COMMIT first: the GPU machine's copy of the tree may carry stale git metadata
        "commit": os.environ.get("BENCH_COMMIT") or commit or "unknown",
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": triton.__version__ if HAS_TRITON else None,
        "cpu": platform.processor() or platform.machine(),
        "cpu_threads": torch.get_num_threads(),
    }
    try:
        import torchrl

        env["torchrl"] = torchrl.__version__
    except ImportError:
        pass
    if torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name()
    return env


def copy_bandwidth(nbytes: int = 2 << 30, device: str = "cuda") -> float:
    """Device-to-device copy bandwidth in bytes/s, counting bytes read plus bytes written (median of do_bench).

    On the CPU (a smoke run without a GPU) the host memory copy bandwidth, median of a few copies of ``nbytes``.
    """
    src = torch.empty(nbytes // 4, dtype=torch.float32, device=device).normal_()
    dst = torch.empty_like(src)
    if device == "cuda":
        import triton.testing

        ms = triton.testing.do_bench(lambda: dst.copy_(src), warmup=50, rep=300, return_mode="median")
    else:
        dst.copy_(src)
        times = []
        for _ in range(5):
            start = time.perf_counter()
            dst.copy_(src)
            times.append(time.perf_counter() - start)
        ms = statistics.median(times) * 1e3
    del src, dst
    if device == "cuda":
        torch.cuda.empty_cache()
    return 2 * nbytes / (ms * 1e-3)


def device_time_us(fn, capturable: bool = True, warmup_ms: float = 25, rep_ms: float = 100) -> tuple[float, str]:
    """Median device time of one call in microseconds, L2 flushed before each call (triton.testing.do_bench).

    The call is captured in a CUDA graph of its own and the graph is replayed, so that the host's launch overhead
    (Python, argument binding) does not leak into the device time; code that cannot be captured (it synchronises
    with the host) is timed as called. ``warmup_ms`` and ``rep_ms`` are do_bench's budgets. Returns (microseconds,
    "graph" or "direct").
    """
    import triton.testing

    graph = _capture(fn, 1) if capturable else None
    if graph is not None:
        us = 1e3 * triton.testing.do_bench(graph.replay, warmup=warmup_ms, rep=rep_ms, return_mode="median")
        del graph
        return us, "graph"
    return 1e3 * triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"), "direct"


def _capture(fn, calls: int):
    """A CUDA graph of ``calls`` back-to-back calls of fn, or None if fn cannot be captured."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for _ in range(calls):
                fn()
        graph.replay()
        torch.cuda.synchronize()
        return graph
    except Exception:  # noqa: BLE001 - code that synchronises with the host cannot be captured
        torch.cuda.synchronize()
        return None


def graph_time_us(fn, calls: int = 20, reps: int = 10) -> float | None:
    """Device time per call back to back inside a CUDA graph (L2 warm, no launch gaps); None if not capturable.

    The median over ``reps`` replays of a graph of ``calls`` calls.
    """
    graph = _capture(fn, calls)
    if graph is None:
        return None
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / calls)
    del graph
    return statistics.median(times)


def kernel_time_us(fn, reps: int = 30, flush_bytes: int = 256 << 20) -> float:
    """Median device time of one call's kernels in microseconds, L2 flushed before each call: the durations the
    GPU's activity records (CUPTI, through ``torch.profiler``) give every kernel of the call, summed per call.

    No launch of any kind is counted (neither Python nor a graph launch), only the kernels' execution: the device
    time in its narrowest sense, beside ``device_time_us``'s event-to-event time. The flush is an in-place
    ``bitwise_not_`` of ``flush_bytes``, recognised by its kernel name.
    """
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    flush = torch.zeros(flush_bytes // 4, dtype=torch.int32, device="cuda")
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(reps):
            flush.bitwise_not_()
            fn()
        torch.cuda.synchronize()
    calls, current = [], None
    kernels = sorted((e for e in prof.events() if e.device_type == DeviceType.CUDA), key=lambda e: e.time_range.start)
    for e in kernels:
        if "bitwise_not" in e.name:
            current = [0.0]
            calls.append(current)
        elif current is not None:
            current[0] += e.time_range.elapsed_us()
    del flush
    return statistics.median(c[0] for c in calls) if calls else float("nan")


def wall_time_us(fn, calls: int | None = None, budget_s: float = 0.5, warmup_s: float = 0.0) -> float:
    """Host wall time per call, calls issued back to back and the device drained once at the end, with Python's
    garbage collector paused (as ``timeit`` does). ``warmup_s``: calls back to back for that long first (at least
    one), so that the host's caches and the GPU's clocks are those of a steady loop, not of a process that just
    compiled or slept."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
    warm(fn, warmup_s)
    sync()
    if calls is None:
        start = time.perf_counter()
        fn()
        sync()
        one = time.perf_counter() - start
        calls = max(3, min(200, int(budget_s / max(one, 1e-6))))
    collecting = gc.isenabled()
    gc.disable()
    try:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        sync()
        return (time.perf_counter() - start) / calls * 1e6
    finally:
        if collecting:
            gc.enable()


def warm(fn, seconds: float) -> None:
    """``fn`` called back to back for ``seconds`` (at least once)."""
    end = time.perf_counter() + seconds
    fn()
    while time.perf_counter() < end:
        fn()


def synced_median_s(fn, repeats: int, sync, warmup: int = 1) -> float:
    """Median host wall time in seconds of one call of ``fn``, ``sync()`` before and after each (``warmup`` calls
    first)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def full_call_us(fn, calls: int = 30, repeats: int = 5, warmup_s: float = 0.02) -> float:
    """One full call timed on its own, rl-triton's headline method: the device drained, an event, the call, an event,
    the device drained; the median of ``calls`` such calls, the best of ``repeats`` medians, in microseconds.
    ``warmup_s`` of calls back to back first (``warm``): the first cell timed after a compile otherwise took 2-3x
    the full call of the cells after it, for every implementation (bench_peers at 37b0f11 on an H100: the GPU's
    clocks or the host's caches not yet those of a steady loop).

    The time between the two events counts the host's launch work of the call where the device waits on it (a call
    that launches several kernels, or whose host work outlasts the device's) and the device's run of it, L2 warm. On
    the CPU (a smoke run) host wall time per call the same way.
    """
    medians = []
    warm(fn, warmup_s)
    if torch.cuda.is_available():
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for _ in range(repeats):
            times = []
            for _ in range(calls):
                torch.cuda.synchronize()
                start.record()
                fn()
                end.record()
                torch.cuda.synchronize()
                times.append(start.elapsed_time(end) * 1e3)
            medians.append(statistics.median(times))
    else:
        for _ in range(repeats):
            times = []
            for _ in range(calls):
                begin = time.perf_counter()
                fn()
                times.append((time.perf_counter() - begin) * 1e6)
            medians.append(statistics.median(times))
    return min(medians)


def write_results(name: str, env: dict, rows: list[dict], subdir: str, table_columns: list[tuple[str, str]],
                  title: str, notes: str = "") -> Path:
    """Writes ``results/<subdir>/<name>.json`` and a markdown table ``<name>.md`` generated from it."""
    out = RESULTS / subdir
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    (out / f"{name}.md").write_text(markdown(env, rows, table_columns, title, notes))
    return out


def markdown(env: dict, rows: list[dict], columns: list[tuple[str, str]], title: str, notes: str = "") -> str:
    lines = [f"# {title}", "", "Generated from the JSON beside this file; do not edit by hand.", ""]
    lines += [f"- {k}: {v}" for k, v in env.items()]
    if notes:
        lines += ["", notes]
    lines += ["", "| " + " | ".join(h for _, h in columns) + " |", "|" + "---|" * len(columns)]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(k)) for k, _ in columns) + " |")
    return "\n".join(lines) + "\n"


def _fmt(v) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        if v == 0:
            return "0"
        if abs(v) >= 100:
            return f"{v:.0f}"
        if abs(v) >= 1:
            return f"{v:.2f}"
        return f"{v:.3g}"
    return str(v)
