"""Where the time of an estimator-module call goes: host ops and device kernels per call (torch.profiler).

    python benchmarks/profile_estimator.py --estimator GAE --mode cudagraph --impl ours
    python benchmarks/profile_estimator.py --estimator GAE --mode eager --impl torchrl --sort cpu

The module is built and wrapped as ``bench_estimators.py`` builds it (values precomputed, no value network), warmed
up (compiled, or captured by tensordict's ``CudaGraphModule``), then ``--calls`` calls are timed back to back without
the profiler (wall µs per call, the device drained once at the end) and profiled again with it. Prints the wall
time and the profiler's per-call table of host ops and device kernels, sorted by device or host time.
"""
from __future__ import annotations

import argparse
import time

import torch
from torchrl.objectives import value as trl_value

import rl_triton_torchrl as ours
from bench_estimators import WARMUP, build, networks, rollout, wrap

IMPLS = ("ours", "torchrl", "ours_inherited")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--B", type=int, default=4096)
    parser.add_argument("--T", type=int, default=128)
    parser.add_argument("--estimator", default="GAE", help="GAE, TDLambdaEstimator, TD0Estimator, TD1Estimator")
    parser.add_argument("--mode", default="cudagraph", choices=("eager", "compile", "cudagraph"))
    parser.add_argument("--impl", default="ours", choices=IMPLS,
                        help="ours_inherited: our class with its direct path switched off")
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--sort", default="device", choices=("device", "cpu"))
    parser.add_argument("--rows", type=int, default=25, help="rows of the profiler table")
    args = parser.parse_args(argv)
    actor, critic = networks()
    module = build(trl_value if args.impl == "torchrl" else ours, args.estimator, False, actor, critic)
    if args.impl == "ours_inherited":
        module.direct_path = False
    fn = wrap(module, args.mode)
    data = rollout(args.B, args.T)
    with torch.no_grad():
        for _ in range(WARMUP + 2):
            fn(data)
        _sync()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            fn(data)
        _sync()
        wall_us = (time.perf_counter() - t0) / args.calls * 1e6
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        with torch.profiler.profile(activities=activities) as prof:
            for _ in range(args.calls):
                fn(data)
            _sync()
    print(f"{args.impl} {args.estimator} {args.mode} B={args.B} T={args.T}: {wall_us:.1f} µs/call wall "
          f"({args.calls} calls, no profiler); profiler totals below are over {args.calls} calls")
    sort = "self_cpu_time_total" if args.sort == "cpu" or not torch.cuda.is_available() else "self_device_time_total"
    print(prof.key_averages().table(sort_by=sort, row_limit=args.rows, max_name_column_width=70))


def _sync():
    if torch.cuda.is_available():
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
