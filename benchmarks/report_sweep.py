"""Markdown table of the tile sweep of d83c453 (``bench_kernels.py --sweep-only`` then; the same sweep is now
``sweep_configs.py --preset tiles``), generated from its JSON.

    python benchmarks/report_sweep.py benchmarks/results/h200/sweep_tiles.json > benchmarks/results/h200/sweep_tiles.md
"""
import json
import sys


def main(path):
    data = json.load(open(path))
    env = {k: v for k, v in data["environment"].items() if k != "sweeps"}
    print("# Tile sweep of the scan kernels (generated from the JSON beside this file)\n")
    print("Every configuration was checked against the float64 reference before it was timed (none was wrong).")
    print("Device time: `triton.testing.do_bench` median of a replayed one-call CUDA graph, L2 flushed.\n")
    print("Command: `python benchmarks/bench_kernels.py --algos gae,discounted_return --sweep-only --name sweep_tiles`\n")
    for k, v in env.items():
        print(f"- {k}: {v}")
    print("\n| algorithm | B | T | best (tile, warps, max BLOCK_T) | best µs | 512 elements, 4 warps µs "
          "| old default (2048, 4) µs | old / best |")
    print("|---|---|---|---|---|---|---|---|")
    for s in data["environment"]["sweeps"]:
        rows = {(r["tile"], r["warps"], r["max_block_t"]): r.get("device_us") for r in s["all"]}
        b, d = s["best"], s["default"]
        new = rows.get((512, 4, d["max_block_t"]))
        print(f"| {s['algorithm']} | {s['B']} | {s['T']} | {b['tile']}, {b['warps']}, {b['max_block_t']} | "
              f"{b['device_us']:.1f} | {new:.1f} | {d['device_us']:.1f} | {d['device_us'] / b['device_us']:.2f} |")


if __name__ == "__main__":
    main(sys.argv[1])
