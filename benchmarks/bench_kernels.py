"""Kernel-level benchmark on the GPU: ours (Triton) against TorchRL's functionals and the copy-bandwidth limit.

    python benchmarks/bench_kernels.py [--algos gae,td_lambda] [--B 4096,16384,65536] [--T 32,128,2048]
                                       [--dtype float32] [--out h200] [--sweep]

Per cell: device time (triton.testing.do_bench median, L2 flushed), device time per call back to back in a CUDA
graph (L2 warm), host wall time per call, the bytes the algorithm must move (each input read once, each output
written once) and the fraction of the device-to-device copy bandwidth measured in the same run. Every
implementation is checked against a float64 reference before it is timed; a wrong one is reported, not timed.
``--sweep`` also times our kernel over tile sizes and warp counts and records the best per cell.
"""
from __future__ import annotations

import argparse
import itertools

import torch
from torchrl.objectives.value import functional as trl

from _common import copy_bandwidth, device_time_us, environment, graph_time_us, wall_time_us, write_results
from rl_triton_torchrl import kernels as K
from rl_triton_torchrl.kernels import scan

GAMMA, LMBDA = 0.99, 0.95


DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rollout(B, T, dtype, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    shape = (B, T, 1)
    term = torch.rand(shape, generator=g, device=DEVICE) < 0.01
    trunc = torch.rand(shape, generator=g, device=DEVICE) < 0.01
    x = {k: torch.randn(shape, generator=g, device=DEVICE).to(dtype) for k in ("r", "v", "nv", "eq")}
    x["lpi"] = (-torch.rand(shape, generator=g, device=DEVICE)).to(dtype)
    x["lmu"] = (-torch.rand(shape, generator=g, device=DEVICE)).to(dtype)
    x["ratio"] = torch.rand(shape, generator=g, device=DEVICE).to(dtype) * 2
    return {**x, "d": term | trunc, "t": term}


# algorithm -> bytes per element (float size f), reference, implementations {name: fn(x)}; first output compared
ALGOS = {
    "gae": {
        "bytes": lambda f: 3 * f + 2 + 2 * f,
        "ref": lambda x: K.gae(x["r"], x["v"], x["nv"], x["d"], x["t"], gamma=GAMMA, lmbda=LMBDA, backend="torch")[0],
        "impls": {
            "ours_triton": lambda x: K.gae(x["r"], x["v"], x["nv"], x["d"], x["t"], gamma=GAMMA, lmbda=LMBDA,
                                           backend="triton")[0],
            "torchrl_vec": lambda x: trl.vec_generalized_advantage_estimate(GAMMA, LMBDA, x["v"], x["nv"], x["r"],
                                                                            x["d"], x["t"])[0],
            "torchrl_loop": lambda x: trl.generalized_advantage_estimate(GAMMA, LMBDA, x["v"], x["nv"], x["r"],
                                                                         x["d"], x["t"])[0],
        },
    },
    "td_lambda": {
        "bytes": lambda f: 2 * f + 2 + f,
        "ref": lambda x: K.td_lambda_return(x["r"], x["nv"], x["d"], x["t"], gamma=GAMMA, lmbda=LMBDA,
                                            backend="torch"),
        "impls": {
            "ours_triton": lambda x: K.td_lambda_return(x["r"], x["nv"], x["d"], x["t"], gamma=GAMMA, lmbda=LMBDA,
                                                        backend="triton"),
            "torchrl_vec": lambda x: trl.vec_td_lambda_return_estimate(GAMMA, LMBDA, x["nv"], x["r"], x["d"],
                                                                       x["t"]),
            "torchrl_loop": lambda x: trl.td_lambda_return_estimate(GAMMA, LMBDA, x["nv"], x["r"], x["d"], x["t"]),
        },
    },
    "vtrace": {
        "bytes": lambda f: 5 * f + 2 + 2 * f,
        "ref": lambda x: K.vtrace(x["lpi"], x["lmu"], x["v"], x["nv"], x["r"], x["d"], x["t"], gamma=GAMMA,
                                  backend="torch")[0],
        "impls": {
            "ours_triton": lambda x: K.vtrace(x["lpi"], x["lmu"], x["v"], x["nv"], x["r"], x["d"], x["t"],
                                              gamma=GAMMA, backend="triton")[0],
            "torchrl_loop": lambda x: trl.vtrace_advantage_estimate(GAMMA, x["lpi"], x["lmu"], x["v"], x["nv"],
                                                                    x["r"], x["d"], x["t"])[0],
        },
    },
    "retrace": {
        "bytes": lambda f: 4 * f + 2 + 2 * f,
        "ref": lambda x: K.retrace(x["v"], x["eq"], x["r"], x["d"], x["t"], ratio=x["ratio"], gamma=GAMMA,
                                   lmbda=LMBDA, backend="torch")[0],
        "impls": {
            "ours_triton": lambda x: K.retrace(x["v"], x["eq"], x["r"], x["d"], x["t"], ratio=x["ratio"],
                                               gamma=GAMMA, lmbda=LMBDA, backend="triton")[0],
        },
    },
    "discounted_return": {
        "bytes": lambda f: 2 * f + 1,
        "ref": lambda x: K.discounted_return(x["r"], x["d"], gamma=GAMMA, backend="torch"),
        "impls": {
            "ours_triton": lambda x: K.discounted_return(x["r"], x["d"], gamma=GAMMA, backend="triton"),
            "torchrl_vec": lambda x: trl.reward2go(x["r"], x["d"], GAMMA),
        },
    },
    "eligibility_traces": {
        "bytes": lambda f: 2 * f + 1,
        "ref": lambda x: K.eligibility_traces(x["r"], x["d"], gamma=GAMMA, lmbda=LMBDA, backend="torch"),
        "impls": {
            "ours_triton": lambda x: K.eligibility_traces(x["r"], x["d"], gamma=GAMMA, lmbda=LMBDA,
                                                          backend="triton"),
        },
    },
    "episodic_prefix_sum": {
        "bytes": lambda f: 2 * f + 1,
        "ref": lambda x: K.episodic_prefix_sum(x["r"], x["d"], reset="after_done", backend="torch"),
        "impls": {
            "ours_triton": lambda x: K.episodic_prefix_sum(x["r"], x["d"], reset="after_done", backend="triton"),
        },
    },
}


def check(out, ref, dtype) -> float:
    err = (out.double() - ref).abs().max().item()
    tol = {torch.float32: 1e-4, torch.bfloat16: 3e-2, torch.float16: 3e-3, torch.float64: 1e-9}[dtype]
    # TorchRL's vectorised functionals cut the discount series below 1e-7; allow that much more
    return err if err <= tol * (1 + ref.abs().max().item()) else -err


def bench_cell(algo, B, T, dtype, bandwidth, impls, skip_slow_loop):
    spec = ALGOS[algo]
    x = rollout(B, T, dtype)
    ref = spec["ref"]({k: (v.double() if v.is_floating_point() else v) for k, v in x.items()})
    nbytes = spec["bytes"](torch.finfo(dtype).bits // 8) * B * T
    rows = []
    for impl in impls:
        if impl not in spec["impls"]:
            continue
        row = {"algorithm": algo, "impl": impl, "B": B, "T": T, "dtype": str(dtype).replace("torch.", ""),
               "bytes": nbytes, "limit_us": nbytes / bandwidth * 1e6}
        if impl == "torchrl_loop" and skip_slow_loop and T > 128:
            row["status"] = "skipped (T > 128: one launch per step)"
            rows.append(row)
            continue
        fn = spec["impls"][impl]
        try:
            err = check(fn(x), ref, dtype)
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            row["status"] = "out of memory"
            rows.append(row)
            continue
        row["max_err"] = abs(err)
        if err < 0:
            row["status"] = "wrong"
            rows.append(row)
            continue
        row["status"] = "ok"
        # without a GPU (a smoke run: Triton through its interpreter) only host wall time exists
        if DEVICE == "cuda":
            # TorchRL's functionals synchronise with the host (.item()), which a CUDA graph cannot capture
            capturable = impl.startswith("ours")
            row["device_us"], row["device_timing"] = device_time_us(lambda: fn(x), capturable)
            row["graph_us"] = graph_time_us(lambda: fn(x)) if capturable else None
        else:
            row["device_us"], row["device_timing"] = wall_time_us(lambda: fn(x), 3), "host wall (no GPU)"
            row["graph_us"] = None
        row["wall_us"] = wall_time_us(lambda: fn(x), None if DEVICE == "cuda" else 3)
        row["bw_fraction"] = row["limit_us"] / row["device_us"]
        rows.append(row)
        print(f"{algo:10s} {impl:13s} B={B:6d} T={T:5d} {row['dtype']:8s} device {row['device_us']:9.1f} us  "
              f"graph {row['graph_us'] or float('nan'):9.1f} us  wall {row['wall_us']:9.1f} us  "
              f"{100 * row['bw_fraction']:5.1f}% of copy bw", flush=True)
    ours = next((r for r in rows if r["impl"] == "ours_triton" and r.get("device_us")), None)
    if ours:
        for r in rows:
            if r.get("device_us") and r is not ours:
                r["ours_speedup"] = r["device_us"] / ours["device_us"]
    return rows


def sweep_cell(algo, B, T, dtype):
    """Our kernel over tile sizes, warp counts and the longest time tile: every configuration checked against the
    reference, then timed; returns the best and all."""
    spec = ALGOS[algo]
    x = rollout(B, T, dtype)
    ref = spec["ref"]({k: (v.double() if v.is_floating_point() else v) for k, v in x.items()})
    fn = spec["impls"]["ours_triton"]
    best = None
    old = (scan.TILE_ELEMENTS, scan.MAX_BLOCK_T, scan.launch_config)
    results = []
    max_ts = (512, 1024, 2048) if T > 512 else (old[1],)
    try:
        for tile, warps, max_t in itertools.product((512, 1024, 2048, 4096, 8192), (2, 4, 8), max_ts):
            scan.TILE_ELEMENTS, scan.MAX_BLOCK_T = tile, max_t

            def cfg(layout, _warps=warps, _orig=old[2]):
                c = _orig(layout)
                c["num_warps"] = _warps
                return c

            scan.launch_config = cfg
            entry = {"tile": tile, "warps": warps, "max_block_t": max_t}
            if check(fn(x), ref, dtype) < 0:
                entry["status"] = "wrong"
            else:
                entry["device_us"], _ = device_time_us(lambda: fn(x))
                if best is None or entry["device_us"] < best["device_us"]:
                    best = entry
            results.append(entry)
    finally:
        scan.TILE_ELEMENTS, scan.MAX_BLOCK_T, scan.launch_config = old
    default = next((r for r in results if r["tile"] == old[0] and r["warps"] == 4 and r["max_block_t"] == old[1]),
                   None)
    return {"algorithm": algo, "B": B, "T": T, "dtype": str(dtype).replace("torch.", ""), "best": best,
            "default": default, "all": results}


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algos", default="gae,td_lambda")
    parser.add_argument("--impls", default="ours_triton,torchrl_vec,torchrl_loop")
    parser.add_argument("--B", default="4096,16384,65536")
    parser.add_argument("--T", default="32,128,2048")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--out", default="h200", help="subdirectory of benchmarks/results")
    parser.add_argument("--name", default="bench_kernels")
    parser.add_argument("--sweep", action="store_true", help="also sweep our tile size and warps per cell")
    parser.add_argument("--sweep-only", action="store_true", help="only the sweep (no baselines)")
    parser.add_argument("--all-loops", action="store_true", help="time TorchRL's loop functionals at every T")
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    env = environment()
    bandwidth = copy_bandwidth() if DEVICE == "cuda" else float("inf")
    env["copy_bandwidth_GBps"] = round(bandwidth / 1e9, 1)
    print(f"copy bandwidth {bandwidth / 1e9:.0f} GB/s on {env.get('gpu')}", flush=True)
    rows, sweeps = [], []
    for algo in args.algos.split(","):
        for B in map(int, args.B.split(",")):
            for T in map(int, args.T.split(",")):
                if not args.sweep_only:
                    rows += bench_cell(algo, B, T, dtype, bandwidth, args.impls.split(","), not args.all_loops)
                if args.sweep or args.sweep_only:
                    sweeps.append(sweep_cell(algo, B, T, dtype))
                    print(f"   sweep {algo} B={B} T={T}: best {sweeps[-1]['best']}, default {sweeps[-1]['default']}",
                          flush=True)
                torch.cuda.empty_cache()
    env["sweeps"] = sweeps
    columns = [("algorithm", "algorithm"), ("impl", "implementation"), ("B", "B"), ("T", "T"), ("dtype", "dtype"),
               ("status", "status"), ("device_us", "device µs (L2 flushed)"), ("device_timing", "timed as"),
               ("graph_us", "µs/call in CUDA graph"),
               ("wall_us", "host wall µs/call"), ("limit_us", "bandwidth limit µs"),
               ("bw_fraction", "fraction of copy bw"), ("ours_speedup", "ours is x faster")]
    out = write_results(args.name, env, rows, args.out, columns, f"Kernel benchmark ({env.get('gpu')})",
                        notes="Command: `python benchmarks/bench_kernels.py " + " ".join(
                            f"--{k.replace('_', '-')} {v}" if not isinstance(v, bool) else (f"--{k}" if v else "")
                            for k, v in vars(args).items()).strip() + "`")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
