"""One table row per profiled kernel of an ``ncu`` text report (the ``ncu`` step of ``benchmarks/h200_session.sh``).

    python tools/ncu_summary.py benchmarks/results/h200/ncu_tile256_float32.txt \
        --labels "discounted_return 16384x2048,eligibility_traces 16384x2048,..." > summary.md
    python tools/ncu_summary.py ncu_float32.txt --shapes 65536x512 --algorithms gae,td_lambda   # the same labels

Per kernel: grid and block, duration, DRAM throughput (% of peak), issue slots busy, registers per thread,
theoretical and achieved occupancy, warp cycles per issued instruction, and the share of those cycles stalled on an
L1TEX scoreboard (waiting for a global load), as ``ncu``'s Warp State rule states it. ``--labels`` names the kernels
in the order they were profiled (``ablate_kernels.py --once``: shapes outer, algorithms inner).
"""
from __future__ import annotations

import argparse
import re
import sys

METRICS = {  # column -> the metric's name in ncu's section tables
    "µs": "Duration",
    "DRAM %": "DRAM Throughput",
    "issue %": "Issue Slots Busy",
    "regs": "Registers Per Thread",
    "theor. occ. %": "Theoretical Occupancy",
    "achieved occ. %": "Achieved Occupancy",
    "cycles / issue": "Warp Cycles Per Issued Instruction",
}
HEADER = re.compile(r"^  (\w+) \((\d+), \d+, \d+\)x\((\d+), \d+, \d+\)")
STALL = re.compile(r"L1TEX .*?This stall type represents about ([\d.]+)%", re.S)


def parse(text: str) -> list[dict]:
    """The kernels of one report, in the order they were profiled."""
    kernels, current, body = [], None, []
    for line in text.splitlines() + ["  _end (0, 0, 0)x(0, 0, 0)"]:
        m = HEADER.match(line)
        if m:
            if current is not None:
                block = "\n".join(body)
                for col, name in METRICS.items():
                    v = re.search(rf"^\s+{re.escape(name)}\s+(?:\S+\s+)?([\d,.]+)\s*$", block, re.M)
                    current[col] = v.group(1).replace(",", "") if v else "-"
                s = STALL.search(" ".join(block.split()))
                current["L1TEX stall %"] = s.group(1) if s else "-"
                kernels.append(current)
            current, body = {"kernel": m.group(1), "grid x block": f"{m.group(2)} x {m.group(3)}"}, []
        elif current is not None:
            body.append(line)
    return kernels


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("report")
    parser.add_argument("--labels", help="comma-separated, one per profiled kernel")
    parser.add_argument("--shapes", help="with --algorithms, instead of --labels: the profiled script's BxT shapes "
                        "(outer loop) and algorithms (inner loop), as ablate_kernels.py --once takes them")
    parser.add_argument("--algorithms")
    args = parser.parse_args(argv)
    with open(args.report) as f:
        kernels = parse(f.read())
    labels = args.labels.split(",") if args.labels else []
    if args.shapes and args.algorithms:
        labels = [f"{a} {s}" for s in args.shapes.split(",") for a in args.algorithms.split(",")]
    if labels and len(labels) != len(kernels):
        sys.exit(f"{len(labels)} labels for {len(kernels)} profiled kernels")
    cols = ["kernel", "grid x block", *METRICS, "L1TEX stall %"]
    print("| " + " | ".join((["cell"] if labels else []) + cols) + " |")
    print("|" + "---|" * (len(cols) + bool(labels)))
    for i, k in enumerate(kernels):
        print("| " + " | ".join(([labels[i]] if labels else []) + [str(k[c]) for c in cols]) + " |")


if __name__ == "__main__":
    main()
