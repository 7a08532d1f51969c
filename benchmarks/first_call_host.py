"""The host side of a kernel's first launch in a fresh process, Triton's cache filled, with and without ``prewarm``.

    python benchmarks/first_call_host.py                 # CPU or GPU machine: writes results/<cpu|cuda>/first_call_host.*
    python benchmarks/first_call_host.py --setup-s 0,1 --repeats 3

Each measurement is one fresh process: it imports the package, starts ``kernels._launcher.prewarm`` (or not: the
process runs with ``RL_TRITON_TORCHRL_PREWARM=0``, as a CUDA build of torch starts it at the import), sleeps
``--setup-s`` seconds (a training script building its environments and models), then times its first ``gae`` call
at 4096 x 128. On a CUDA machine that is the whole first call, to a device sync (module load and Triton's launcher
included). Without a GPU the call is compiled instead of run, for sm_90 (the bundle build's stand-in driver,
``kernels._aot._TargetDriver``, and ``JITFunction.warmup``): everything a first launch does on the host up to the
module load. A first round fills Triton's cache; the time spent in ``triton.runtime.cache.triton_key`` (Triton
hashing its own installation, once per process) is profiled in one more process.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent


def child(prewarm: bool, setup_s: float, profile: bool) -> dict:
    """One fresh process's measurement (run with ``--child``)."""
    import torch

    cuda = torch.cuda.is_available()
    from rl_triton_torchrl.kernels import _aot, _launcher, gae, scan

    if not cuda:  # compile for sm_90 instead of launching
        from triton.runtime import driver

        driver.set_active(_aot._TargetDriver(90))

    # (a CUDA build of torch started the thread at the import already, unless the parent set
    # RL_TRITON_TORCHRL_PREWARM=0 for a process without it)
    started = (_launcher._PREWARM_THREAD or _launcher.prewarm(force=True)) is not None if prewarm else False
    assert started == (_launcher._PREWARM_THREAD is not None), "RL_TRITON_TORCHRL_PREWARM and --child disagree"
    time.sleep(setup_s)
    if not cuda:
        os.environ["TRITON_INTERPRET"] = "1"  # only lets backend="triton" take CPU tensors; the kernel is compiled

        class CompileInstead:
            def __init__(self, kernel):
                self.kernel, self.name = kernel, kernel.__name__

            def settings(self):
                return None

            def __call__(self, grid, num_warps, maxnreg=None, **kwargs):
                _launcher._join_prewarm()
                self.kernel.warmup(grid=grid, num_warps=num_warps, **kwargs)

        scan.launcher = CompileInstead
    device = "cuda" if cuda else "cpu"
    x = [torch.randn(4096, 128, 1, device=device) for _ in range(3)]
    done = torch.rand(4096, 128, 1, device=device) < 0.01
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    profiler = None
    if profile:
        import cProfile

        profiler = cProfile.Profile()
        profiler.enable()
    start = time.perf_counter()
    gae(*x, done, gamma=0.99, lmbda=0.95, backend="triton")
    sync()
    first = time.perf_counter() - start
    out = {"prewarm": started, "setup_s": setup_s, "first_call_ms": 1e3 * first, "device": device}
    if profiler is not None:
        import pstats

        profiler.disable()
        stats = pstats.Stats(profiler).stats
        out["triton_key_ms"] = 1e3 * sum(v[3] for k, v in stats.items() if k[2] == "triton_key")
    return out


def run_child(*args: str) -> dict:
    """One fresh process: ``args`` are (prewarm, set-up seconds, profile) as ``child`` takes them."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["RL_TRITON_TORCHRL_PREWARM"] = args[0]  # else a CUDA build of torch starts it at the import either way
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, __file__, "--child", *args], env=env, capture_output=True, text=True,
                         timeout=600)
    if out.returncode:
        sys.exit(out.stdout[-2000:] + out.stderr[-4000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--setup-s", default="0,1", help="comma-separated seconds between the import and the call")
    parser.add_argument("--repeats", type=int, default=3, help="fresh processes per configuration (median)")
    parser.add_argument("--out", default=None, help="output folder (default: benchmarks/results/<cpu|cuda>)")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        prewarm, setup_s, profile = args.child
        print(json.dumps(child(prewarm == "1", float(setup_s), profile == "1")))
        return None
    sys.path.insert(0, str(HERE))
    from _common import environment, write_results

    run_child("0", "0", "0")  # fills Triton's cache
    profiled = run_child("0", "0", "1")
    rows = []
    for setup_s in args.setup_s.split(","):
        for prewarm in ("0", "1"):
            runs = [run_child(prewarm, setup_s, "0") for _ in range(args.repeats)]
            rows.append({"prewarm": prewarm == "1", "setup_s": float(setup_s), "device": runs[0]["device"],
                         "first_call_ms": statistics.median(r["first_call_ms"] for r in runs),
                         "runs_ms": [round(r["first_call_ms"], 1) for r in runs]})
            print(rows[-1], flush=True)
    device = rows[0]["device"]
    env = {**environment(), "triton_key_ms (profiled, no prewarm)": round(profiled["triton_key_ms"], 1),
           "first_call_ms (profiled)": round(profiled["first_call_ms"], 1)}
    what = ("compiled for sm_90 from the cache, no GPU: the host side up to the module load" if device == "cpu"
            else "to a device sync")
    command = "python benchmarks/first_call_host.py " + " ".join(sys.argv[1:] if argv is None else argv)
    out = write_results("first_call_host", env, rows, args.out or ("cuda" if device == "cuda" else "cpu"),
                        [("prewarm", "prewarm"), ("setup_s", "set-up before the call (s)"),
                         ("first_call_ms", "first gae call, median (ms)"), ("runs_ms", "each process (ms)")],
                        f"First gae call of a fresh process at 4096 x 128, Triton's cache filled ({what})",
                        notes=f"Command: `{command}`. Each row: the median of {args.repeats} fresh processes.")
    print(f"wrote {out}")
    return rows


if __name__ == "__main__":
    main()
