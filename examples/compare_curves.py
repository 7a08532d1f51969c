"""Run an example with both estimators over several seeds and compare: learning curves (mean +- std over seeds),
final returns, frames per second, the estimator's share of the iteration time, and how far apart the two
estimators' outputs are on the same batches.

    python examples/compare_curves.py                           # PPO on CartPole-v1, seeds 0 1 2 (~6 min, 2 cores)
    python examples/compare_curves.py --example impala          # IMPALA / V-trace on CartPole-v1
    python examples/compare_curves.py --seeds 5 --total-frames 200000   # unknown flags go to the example
    python examples/compare_curves.py --example ppo_gpu --recompute-advantage   # environments on the GPU
    python examples/compare_curves.py --example rsl_rl          # rsl_rl's OnPolicyRunner, its PPO vs ours
    python examples/compare_curves.py --fresh-triton-cache [--aot-dir aot]   # as on a fresh machine

Each (seed, estimator) pair is one run of ``examples/<example>`` in a fresh process, one after the other (the seeds
interleaved, so that a change in machine load touches both estimators alike, and which estimator runs first
alternating from seed to seed). Where the example has
``--cross-check``, every batch is also given to the other estimator class, and the largest
absolute differences of advantage and value target are logged. For ``rsl_rl`` the two "estimators" are the two PPO
classes (``--algorithm rsl_rl|triton``) and the estimator's time is that of ``compute_returns``. Outputs, in
``--out`` (default ``runs/compare_<example>``):

- ``curves.csv``: per estimator and iteration, frames, wall time and mean episode return (mean and std over seeds);
- ``runs.csv``: one row per run (final return, wall time, estimator time, largest differences, ...);
- ``curves.png``: return against frames and against wall time, mean +- std over seeds;
- ``summary.md``: the table printed at the end;
- ``<estimator>_seed<k>/``: each run's own ``progress.csv`` and ``curves.png``.
"""
from __future__ import annotations

import argparse
import csv
import os
import shutil
import statistics
import subprocess
import sys
import time
from typing import NamedTuple



class Example(NamedTuple):
    """How to run one example with either estimator, and what its ``progress.csv`` calls things."""

    script: str
    flag: str = "--estimator"  # the example's flag that picks the estimator
    estimators: tuple = ("torchrl", "triton")  # the baseline first, ours second
    time_key: str = "estimator_time_s"  # seconds in the estimator per iteration
    losses: tuple = ("loss_objective", "loss_critic", "entropy")  # logged losses compared between same-seed runs
    cross_check: bool = True  # has --cross-check (adv_max_abs_diff, target_max_abs_diff)


EXAMPLES = {
    "ppo": Example("ppo_gymnasium.py"),
    "impala": Example("impala_vtrace.py"),
    "ppo_gpu": Example("ppo_gpu.py"),
    "rsl_rl": Example("rsl_rl_ppo.py", flag="--algorithm", estimators=("rsl_rl", "triton"),
                      time_key="compute_returns_time_s", losses=("loss_value", "loss_surrogate", "loss_entropy")),
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The module docstring as written, and each flag's default where it has a value of its own."""

    def _get_help_string(self, action):
        if action.default is None or isinstance(action.default, bool) or action.default is argparse.SUPPRESS:
            return action.help
        return f"{action.help} (default: %(default)s)"


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=HelpFormatter,
                                     allow_abbrev=False)
    parser.add_argument("--example", choices=sorted(EXAMPLES), default="ppo", help="which example to run")
    parser.add_argument("--seeds", type=int, default=3, help="number of seeds (0, 1, ..., seeds - 1)")
    parser.add_argument("--target-return", type=float, default=475.0,
                        help="report the first frame at which a run's mean return reaches this (CartPole-v1: 475)")
    parser.add_argument("--out", help="output directory (default runs/compare_<example>)")
    parser.add_argument("--reuse", action="store_true",
                        help="skip the runs whose progress.csv is already complete in --out (re-plot only)")
    parser.add_argument("--no-cross-check", dest="cross_check", action="store_false",
                        help="do not give every batch to the other estimator class too (a baseline run then never "
                             "calls ours: for timings of first calls and compiles)")
    parser.add_argument("--fresh-triton-cache", action="store_true",
                        help="give every run an empty Triton cache of its own (<run>/triton_cache), as on a fresh "
                             "machine, and count the kernels Triton compiled in it")
    parser.add_argument("--aot-dir",
                        help="a bundle of precompiled kernels (python -m rl_triton_torchrl.kernels.precompile), "
                             "passed to every run as RL_TRITON_TORCHRL_AOT_DIR")
    args, example_args = parser.parse_known_args(argv)
    if args.out is None:
        args.out = os.path.join("runs", f"compare_{args.example}")
    return args, example_args


def read_csv(path):
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def mean_or_dash(values, spec):
    """The mean of the values that are not "" (CSV cells), formatted, or "-" where there are none."""
    values = [float(v) for v in values if v != ""]
    return format(statistics.fmean(values), spec) if values else "-"


def mean_std(values):
    values = list(values)
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


def cross_checked(args):
    """Whether the runs give every batch to both estimator classes (the example can, and it was not turned off)."""
    return EXAMPLES[args.example].cross_check and args.cross_check


def run_env(args, out):
    """The environment of one run: the bundle where given, an empty Triton cache of its own where asked."""
    env = dict(os.environ)
    if args.aot_dir:
        env["RL_TRITON_TORCHRL_AOT_DIR"] = os.path.abspath(args.aot_dir)
    if args.fresh_triton_cache:
        cache = os.path.join(out, "triton_cache")
        shutil.rmtree(cache, ignore_errors=True)
        os.makedirs(cache)
        env["TRITON_CACHE_DIR"] = cache
    return env


def compiled_kernels(out):
    """How many kernels Triton compiled into a run's own cache (its cubins), or "" without one."""
    cache = os.path.join(out, "triton_cache")
    if not os.path.isdir(cache):
        return ""
    return sum(name.endswith(".cubin") for _, _, names in os.walk(cache) for name in names)


def run_all(args, example_args):
    """Runs every (seed, estimator) pair; returns {(estimator, seed): rows of its progress.csv} and
    {(estimator, seed): seconds the run's process took} (for the runs made now, not those reused)."""
    example = EXAMPLES[args.example]
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), example.script)
    runs, process_s = {}, {}
    for seed in range(args.seeds):
        # the order alternates from seed to seed, so that neither estimator always runs second on a warmed host
        for estimator in example.estimators[::-1] if seed % 2 else example.estimators:
            out = os.path.join(args.out, f"{estimator}_seed{seed}")
            done_marker = os.path.join(out, "curves.png")  # written after the last CSV row
            if not (args.reuse and os.path.exists(done_marker)):
                cmd = [sys.executable, script, example.flag, estimator, "--seed", str(seed), "--out", out,
                       *(["--cross-check"] if cross_checked(args) else []), "--no-progress", *example_args]
                print("$ python", " ".join([os.path.relpath(script), *cmd[2:]]), flush=True)
                env = run_env(args, out)
                start = time.perf_counter()
                result = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
                process_s[estimator, seed] = time.perf_counter() - start
                if result.returncode != 0:
                    sys.exit(f"run failed ({result.returncode}):\n{result.stdout[-4000:]}")
                summary = [line for line in result.stdout.splitlines()
                           if " frames in " in line or line.startswith("  target")]
                print("\n".join(summary) or result.stdout.splitlines()[-1],
                      f"(process {process_s[estimator, seed]:.0f} s)", flush=True)
            runs[estimator, seed] = read_csv(os.path.join(out, "progress.csv"))
    return runs, process_s


def summarize(args, runs, process_s=None):
    """Per-run numbers, per-estimator aggregates, and the same-seed comparison; returns (run rows, markdown)."""
    example = EXAMPLES[args.example]
    process_s = process_s or {}
    run_rows = []
    for (estimator, seed), rows in runs.items():
        hit = next((r for r in rows if r["return_mean"] and float(r["return_mean"]) >= args.target_return), None)
        # the first iteration holds one-off costs (Triton's JIT compile, CUDA warm-up): counted apart
        steady = rows[1:] if len(rows) > 1 else rows
        estimator_time = sum(float(r[example.time_key]) for r in steady)
        iteration_time = sum(float(r["iteration_time_s"]) for r in steady)
        frames = int(steady[-1]["frames"]) - (int(rows[0]["frames"]) if len(rows) > 1 else 0)
        run_rows.append({
            "estimator": estimator, "seed": seed, "iterations": len(rows), "frames": rows[-1]["frames"],
            "wall_time_s": rows[-1]["wall_time_s"], "final_return": rows[-1]["return_mean"],
            "frames_to_target": hit["frames"] if hit else "",
            "seconds_to_target": hit["wall_time_s"] if hit else "",
            "process_s": f"{process_s[estimator, seed]:.1f}" if (estimator, seed) in process_s else "",
            "triton_compiled": compiled_kernels(os.path.join(args.out, f"{estimator}_seed{seed}")),
            "fps": f"{frames / iteration_time:.0f}",
            "estimator_ms_per_call": f"{1e3 * estimator_time / sum(int(r.get('updates', 1)) for r in steady):.3f}",
            "estimator_share": f"{estimator_time / iteration_time:.5f}",
            "first_iteration_estimator_ms": f"{1e3 * float(rows[0][example.time_key]):.1f}",
        })
        if cross_checked(args):
            run_rows[-1].update({
                "adv_max_abs_diff": max(float(r["adv_max_abs_diff"]) for r in rows),
                "target_max_abs_diff": max(float(r["target_max_abs_diff"]) for r in rows),
                "first_row_adv_max_abs_diff": float(rows[0]["adv_max_abs_diff"]),
            })

    lines = [f"{args.example}: {args.seeds} seeds per estimator, target return {args.target_return:g}", "",
             "| estimator | final return (mean ± std) | reached target (runs) | frames to target (mean) "
             "| s to target (mean ± std) | wall time s (mean ± std) | process s (mean) | frames/s "
             "| estimator ms/call | estimator share of iteration time | estimator ms, first iteration "
             "| kernels Triton compiled (mean) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for estimator in example.estimators:
        mine = [r for r in run_rows if r["estimator"] == estimator]
        ret_m, ret_s = mean_std(float(r["final_return"]) for r in mine)
        wall_m, wall_s = mean_std(float(r["wall_time_s"]) for r in mine)
        hits = [int(r["frames_to_target"]) for r in mine if r["frames_to_target"]]
        share = statistics.fmean(float(r["estimator_share"]) for r in mine)
        fps = statistics.fmean(float(r["fps"]) for r in mine)
        call = statistics.fmean(float(r["estimator_ms_per_call"]) for r in mine)
        first = statistics.fmean(float(r["first_iteration_estimator_ms"]) for r in mine)
        reached = f"{len(hits)}/{len(mine)} | {statistics.fmean(hits):.0f}" if hits else f"0/{len(mine)} | -"
        to_target = mean_std(float(r["seconds_to_target"]) for r in mine if r["seconds_to_target"]) if hits else None
        lines.append(f"| {estimator} | {ret_m:.1f} ± {ret_s:.1f} | {reached} | "
                     f"{'-' if to_target is None else f'{to_target[0]:.1f} ± {to_target[1]:.1f}'} | "
                     f"{wall_m:.1f} ± {wall_s:.1f} | {mean_or_dash((r['process_s'] for r in mine), '.1f')} | "
                     f"{fps:.0f} | {call:.2f} | {100 * share:.2f}% | {first:.1f} | "
                     f"{mean_or_dash((r['triton_compiled'] for r in mine), '.1f')} |")
    lines += ["", "Frames per second, estimator time per call and share: iterations after the first (the first "
              "holds one-off costs, e.g. Triton's JIT compile; its estimator time is its own column). The "
              "estimator's time includes its value-network forward pass. Seconds to target and wall time count "
              "from the start of training (the first collection included, `--cross-check` excluded); the "
              "process's seconds also hold its imports and set-up."
              + (" Every run had an empty Triton cache of its own (`--fresh-triton-cache`)." if args.fresh_triton_cache
                 else "")
              + (f" Precompiled kernels: `RL_TRITON_TORCHRL_AOT_DIR={args.aot_dir}`." if args.aot_dir else "")]

    if cross_checked(args):
        adv = max(r["adv_max_abs_diff"] for r in run_rows)
        target = max(r["target_max_abs_diff"] for r in run_rows)
        first = max(r["first_row_adv_max_abs_diff"] for r in run_rows)
        lines += ["", "Both estimator classes on the same batches (every batch of every run, `--cross-check`): "
                  f"largest |advantage difference| {adv:.3g}, largest |value target difference| {target:.3g} "
                  f"(first CSV row of each run: {first:.3g})."]
    base, ours = example.estimators
    lines += ["", f"Same seed, {base} run vs {ours} run (the values as progress.csv logs them: losses to 5 "
              "significant digits, the mean return of the last episodes; two values differ where they differ by "
              f"more than {DIFFER_RTOL:g} of the larger, beyond that rounding):", "",
              "| seed | logged losses first differ at (frames) | mean return first differs at (frames) | "
              f"largest return gap | final returns ({base} / {ours}) |", "|---|---|---|---|---|"]
    for seed in range(args.seeds):
        a, b = runs[base, seed], runs[ours, seed]
        n = min(len(a), len(b))
        first_loss = next((i for i in range(n) if any(differ(a[i][k], b[i][k]) for k in example.losses)), None)
        first_ret = next((i for i in range(n) if differ(a[i]["return_mean"], b[i]["return_mean"])), None)
        gap = max((abs(float(a[i]["return_mean"]) - float(b[i]["return_mean"])) for i in range(n)
                   if a[i]["return_mean"] and b[i]["return_mean"]), default=0.0)
        lines.append(f"| {seed} | {'never' if first_loss is None else a[first_loss]['frames']} | "
                     f"{'never' if first_ret is None else a[first_ret]['frames']} | {gap:.1f} | "
                     f"{a[-1]['return_mean']} / {b[-1]['return_mean']} |")
    return run_rows, "\n".join(lines) + "\n"


DIFFER_RTOL = 1e-4  # relative: above the rounding of two values logged to 5 significant digits (5e-5 each)


def differ(x: str, y: str) -> bool:
    """Whether two logged values (CSV strings, "" where none) differ beyond their logging's rounding."""
    if x == "" or y == "":
        return x != y
    x, y = float(x), float(y)
    return abs(x - y) > DIFFER_RTOL * max(abs(x), abs(y))


def aggregate_curves(runs, seeds, estimators):
    """Mean and std over seeds at each iteration, per estimator (the runs of one estimator share their frames)."""
    curves = []
    for estimator in estimators:
        per_seed = [runs[estimator, s] for s in range(seeds)]
        for i in range(min(len(rows) for rows in per_seed)):
            returns = [float(rows[i]["return_mean"]) for rows in per_seed if rows[i]["return_mean"]]
            if len(returns) < seeds:
                continue  # no finished episode yet in some run
            wall_m, wall_s = mean_std(float(rows[i]["wall_time_s"]) for rows in per_seed)
            ret_m, ret_s = mean_std(returns)
            curves.append({"estimator": estimator, "iteration": i, "frames": per_seed[0][i]["frames"],
                           "wall_time_mean_s": f"{wall_m:.3f}", "wall_time_std_s": f"{wall_s:.3f}",
                           "return_mean": f"{ret_m:.2f}", "return_std": f"{ret_s:.2f}", "seeds": seeds})
    return curves


def plot(curves, path, title, example):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for estimator, color, style in zip(example.estimators, ("tab:blue", "tab:orange"), ("-", "--")):
        rows = [c for c in curves if c["estimator"] == estimator]
        mean = [float(c["return_mean"]) for c in rows]
        low = [m - float(c["return_std"]) for m, c in zip(mean, rows)]
        high = [m + float(c["return_std"]) for m, c in zip(mean, rows)]
        for ax, key in ((axes[0], "frames"), (axes[1], "wall_time_mean_s")):
            x = [float(c[key]) for c in rows]
            ax.plot(x, mean, color=color, linestyle=style, label=estimator)
            ax.fill_between(x, low, high, color=color, alpha=0.2, linewidth=0)
    axes[0].set_xlabel("environment frames")
    axes[0].ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
    axes[1].set_xlabel("wall time (s, mean over seeds)")
    axes[0].set_ylabel("mean episode return (mean ± std over seeds)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(title=example.flag, loc="lower right")
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def write_csv(path, rows):
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def main(argv=None):
    args, example_args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    runs, process_s = run_all(args, example_args)

    run_rows, table = summarize(args, runs, process_s)
    example = EXAMPLES[args.example]
    curves = aggregate_curves(runs, args.seeds, example.estimators)
    write_csv(os.path.join(args.out, "runs.csv"), run_rows)
    write_csv(os.path.join(args.out, "curves.csv"), curves)
    plot(curves, os.path.join(args.out, "curves.png"),
         " ".join([example.script, *example_args]) + f": {args.seeds} seeds per estimator", example)
    argv = sys.argv[1:] if argv is None else argv
    command = " ".join(["python", "examples/compare_curves.py", *(a for a in argv if a != "--reuse")])
    with open(os.path.join(args.out, "summary.md"), "w") as f:
        f.write(f"`{command}`\n\n{table}")
    print()
    print(table)
    print(f"wrote {args.out}/curves.csv, runs.csv, curves.png, summary.md")


if __name__ == "__main__":
    main()
