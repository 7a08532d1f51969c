"""Where the first ``gae`` call of a process goes, Triton's cache filled: cProfile of that one call.

    TRITON_CACHE_DIR=/tmp/tcache python benchmarks/profile_first_call.py          # fills the cache (first run)
    TRITON_CACHE_DIR=/tmp/tcache python benchmarks/profile_first_call.py --show   # then: the profile of a warm one
    RL_TRITON_TORCHRL_AOT_DIR=aot TRITON_CACHE_DIR=$(mktemp -d) python benchmarks/profile_first_call.py --show \
        --no-triton-init                                                           # a precompiled kernel's first call

Needs a GPU. The process imports the package, launches Triton's trivial kernel (Triton's own first launch, as
``bench_peers.py``'s first-call part does), draws the rollout, then profiles its first GAE call (4096 x 128, with
truncations) to a device sync and times the second and third calls; ``--show`` prints the profile, by cumulative
and by own time.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

import torch


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--B", type=int, default=4096)
    parser.add_argument("--T", type=int, default=128)
    parser.add_argument("--show", action="store_true", help="print the profile")
    parser.add_argument("--rows", type=int, default=45)
    parser.add_argument("--no-triton-init", action="store_true",
                        help="no launch of Triton's trivial kernel first (a process whose kernels come from a bundle of "
                             "precompiled ones, RL_TRITON_TORCHRL_AOT_DIR, needs none)")
    args = parser.parse_args(argv)
    torch.zeros(1, device="cuda").sum().item()
    import rl_triton_torchrl  # noqa: F401  (starts the prewarm thread, as a user's import does)

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import bench_peers as bp

    if not args.no_triton_init:
        bp.touch_triton()
    torch.cuda.synchronize()
    x = bp.rollout(args.B, args.T, fields=bp.ALL_FIELDS)
    torch.cuda.synchronize()
    fn, _ = bp.make_ours("gae", bp.for_truncation(x, "with"))
    profile = cProfile.Profile()
    start = time.perf_counter()
    profile.enable()
    fn()
    torch.cuda.synchronize()
    profile.disable()
    print(f"first gae call (profiled) {(time.perf_counter() - start) * 1e3:.2f} ms")
    for which in ("second", "third"):
        start = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        print(f"{which} {(time.perf_counter() - start) * 1e3:.3f} ms")
    if args.show:
        stats = pstats.Stats(profile)
        stats.sort_stats("cumtime").print_stats(args.rows)
        stats.sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
