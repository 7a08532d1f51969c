"""Where a bare kernels-API call's host time goes, function by function (a GPU host).

    python benchmarks/host_profile.py [--B 4096] [--T 128] [--algorithms gae,vtrace] [--out host_profile.txt]

Per algorithm of the tests' table (``tests/_algos.py``, its default coefficients, on a ``[B, T, 1]`` rollout): the
host wall time per call, calls back to back and the device drained once at the end (the best of 5 runs of
``--calls``), then ``cProfile`` of ``--calls`` more calls, its functions by their own time. The profiler adds its
own cost to every Python call (a profiled call takes about 2.5x as long), so read its shares, not its times.
"""
from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from _algos import TABLE, make_rollout  # noqa: E402
from _common import wall_time_us  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--B", type=int, default=4096)
    parser.add_argument("--T", type=int, default=128)
    parser.add_argument("--calls", type=int, default=3000)
    parser.add_argument("--algorithms", default="gae,vtrace,td_lambda,discounted,td0,retrace_discrete")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "h200",
                                                      "host_profile.txt"))
    args = parser.parse_args()
    x = make_rollout((args.B, args.T, 1), seed=0)
    with open(args.out, "w") as out:
        for algo in args.algorithms.split(","):
            call, _, coefs = TABLE[algo]
            fn = lambda: call(x, backend="triton", **coefs)  # noqa: E731
            for _ in range(20):
                fn()
            us = min(wall_time_us(fn, args.calls) for _ in range(5))
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(args.calls):
                fn()
            torch.cuda.synchronize()
            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("tottime").print_stats(28)
            line = f"== {algo} {args.B}x{args.T}: {us:.2f} us per call (wall, back to back)"
            print(line, flush=True)
            out.write(line + "\n" + text.getvalue() + "\n")


if __name__ == "__main__":
    main()
