"""CPU path against TorchRL's loop and vectorized functionals (float32, wall time, median of repeats).

    python benchmarks/bench_cpu.py [--out cpu] [--quick]

Writes results/<out>/bench_cpu.{json,md}. Each implementation is checked against TorchRL's loop functional before
it is timed; a mismatch is reported as wrong, not timed.
"""
from __future__ import annotations

import argparse
import statistics
import time

import torch
from torchrl.objectives.value import functional as trl

import rl_triton_torchrl.functional as ours
from _common import environment, write_results

SIZES = [(8, 128), (64, 256), (256, 1024), (1024, 128)]
GAMMA, LMBDA = 0.99, 0.95

# algorithm -> (TorchRL loop, TorchRL vectorized, ours), each f(x) on a rollout dict
ALGOS = {
    "gae": (
        lambda x: trl.generalized_advantage_estimate(GAMMA, LMBDA, x["v"], x["nv"], x["r"], x["d"], x["t"])[0],
        lambda x: trl.vec_generalized_advantage_estimate(GAMMA, LMBDA, x["v"], x["nv"], x["r"], x["d"], x["t"])[0],
        lambda x: ours.generalized_advantage_estimate(GAMMA, LMBDA, x["v"], x["nv"], x["r"], x["d"], x["t"])[0],
    ),
    "td_lambda": (
        lambda x: trl.td_lambda_return_estimate(GAMMA, LMBDA, x["nv"], x["r"], x["d"], x["t"]),
        lambda x: trl.vec_td_lambda_return_estimate(GAMMA, LMBDA, x["nv"], x["r"], x["d"], x["t"]),
        lambda x: ours.td_lambda_return_estimate(GAMMA, LMBDA, x["nv"], x["r"], x["d"], x["t"]),
    ),
    "td1": (
        lambda x: trl.td1_return_estimate(GAMMA, x["nv"], x["r"], x["d"], x["t"]),
        lambda x: trl.vec_td1_return_estimate(GAMMA, x["nv"], x["r"], x["d"], x["t"]),
        lambda x: ours.td1_return_estimate(GAMMA, x["nv"], x["r"], x["d"], x["t"]),
    ),
}


def rollout(B, T, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = (B, T, 1)
    term = torch.rand(shape, generator=g) < 0.01
    trunc = torch.rand(shape, generator=g) < 0.01
    return {"r": torch.randn(shape, generator=g), "v": torch.randn(shape, generator=g),
            "nv": torch.randn(shape, generator=g), "d": term | trunc, "t": term}


def median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="cpu", help="subdirectory of benchmarks/results")
    parser.add_argument("--quick", action="store_true", help="one small size, few repeats (CI smoke)")
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    sizes = [(8, 16)] if args.quick else SIZES
    repeats = 3 if args.quick else args.repeats
    rows = []
    for algo, (loop, vec, mine) in ALGOS.items():
        for B, T in sizes:
            x = rollout(B, T)
            expected = loop(x)
            row = {"algorithm": algo, "B": B, "T": T}
            for impl, fn in (("torchrl_loop", loop), ("torchrl_vec", vec), ("ours_torch", mine)):
                out = fn(x)
                err = (out.double() - expected.double()).abs().max().item()
                ok = err <= 1e-4 * (1 + expected.abs().max().item())
                row[f"{impl}_max_err"] = err
                row[f"{impl}_ms"] = median_ms(lambda: fn(x), repeats) if ok else None
                if not ok:
                    row[f"{impl}_status"] = "wrong"
            best = min(v for v in (row["torchrl_loop_ms"], row["torchrl_vec_ms"]) if v is not None)
            row["speedup_vs_best_torchrl"] = best / row["ours_torch_ms"] if row["ours_torch_ms"] else None
            rows.append(row)
            print(f"{algo:10s} B={B:5d} T={T:5d}  loop {row['torchrl_loop_ms']:.3f} ms  "
                  f"vec {row['torchrl_vec_ms'] or float('nan'):.3f} ms  ours {row['ours_torch_ms']:.3f} ms  "
                  f"x{row['speedup_vs_best_torchrl']:.2f}", flush=True)
    columns = [("algorithm", "algorithm"), ("B", "B"), ("T", "T"), ("torchrl_loop_ms", "TorchRL loop (ms)"),
               ("torchrl_vec_ms", "TorchRL vec (ms)"), ("ours_torch_ms", "ours, torch path (ms)"),
               ("speedup_vs_best_torchrl", "speed-up vs faster TorchRL"), ("ours_torch_max_err", "max |ours - loop|")]
    out = write_results("bench_cpu", environment(), rows, args.out, columns,
                        "CPU path vs TorchRL functionals (float32, wall time per call, median)",
                        notes="Command: `python benchmarks/bench_cpu.py`")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
