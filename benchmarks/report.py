"""Markdown tables and PNG plots of a kernel benchmark, generated from its JSON (``bench_kernels.py`` calls it).

    python benchmarks/report.py benchmarks/results/h200/bench_kernels.json [--out DIR]

Writes ``<name>.md`` beside the JSON (or into ``--out``): the environment, the targets and which cells meet them,
and per algorithm, dtype and truncation a table of our device time, its ratio to the bandwidth limit and to each
baseline; and the plots ``<name>_time_<dtype>.png`` (device time against B*T per algorithm, with the bandwidth-limit
line and the empty-kernel floor), ``<name>_speedup_<baseline>_<dtype>.png`` (heatmaps of our speedup over each
baseline) and ``<name>_bandwidth_<dtype>.png`` (our fraction of the copy bandwidth). Reads the JSON of earlier
versions of the benchmark too (no truncation field: those rollouts had truncations; no empty-kernel time: that
target is not evaluated). A speedup is only reported against an implementation whose check passed.
"""
from __future__ import annotations

import argparse
import json
import math
from collections import defaultdict
from pathlib import Path

OURS = "ours_triton"
BASELINES = ("ours_torch", "doubling", "assoc_scan", "torchrl_vec", "torchrl_loop")
BASELINE_NAMES = {
    "ours_torch": "our torch path",
    "doubling": "compiled doubling scan",
    "assoc_scan": "compiled associative_scan",
    "torchrl_vec": "TorchRL vectorised",
    "torchrl_loop": "TorchRL loop",
}


# ---------------------------------------------------------------------------------------------------------------
# Targets: one place defines them; each returns None where it does not apply to a row, else (met, text)
# ---------------------------------------------------------------------------------------------------------------


def _bw(row, fraction, label):
    bw = row.get("bw_fraction")
    if bw is None:
        return False, f"{label}: not timed"
    return bw >= fraction, f"{label}: {100 * bw:.0f}%"


def target_large(row, env):
    if row["B"] * row["T"] >= 1 << 25:
        return _bw(row, 0.9, "≥90% bw")
    return None


def target_gae_small(row, env):
    """Judged on the kernel's own device time (activity records) where measured: the one-call-graph time adds the
    graph launch, an empty kernel's 3.9 µs in that timing (env ``empty_kernel_us``), to any kernel."""
    if row["algorithm"] == "gae" and (row["B"], row["T"]) in ((4096, 128), (4096, 32)):
        us, kernel = row.get("device_us"), row.get("kernel_us")
        if kernel is None:
            return (us is not None and us <= 5.0), f"≤5 µs: {_num(us)} µs"
        return kernel <= 5.0, f"≤5 µs: kernel {_num(kernel)} µs (one-call graph {_num(us)} µs)"
    return None


def target_short(row, env):
    if row["T"] <= 16 and row["B"] >= 16384:
        empty, us = env.get("empty_kernel_us"), row.get("device_us")
        if empty is None:
            return None
        if row.get("limit_us") is None:
            return False, "≤2x(limit+launch): not timed"
        bound = 2 * (row["limit_us"] + empty)
        return (us is not None and us <= bound), f"≤2x(limit+launch) {_num(bound)}: {_num(us)} µs"
    return None


def target_long(row, env):
    if row["B"] <= 16 and row["T"] >= 1 << 16:
        return _bw(row, 0.7, "≥70% bw")
    return None


TARGETS = [
    ("large", "large rollouts (B·T ≥ 2^25): ≥ 90% of the copy bandwidth", target_large),
    ("gae_small", "GAE at 4096 x 128 and 4096 x 32: ≤ 5 µs device time", target_gae_small),
    ("short", "T ≤ 16 with B ≥ 16384: within 2x of (bandwidth-limit time + one empty-kernel launch)", target_short),
    ("long", "long sequences (B ≤ 16, T ≥ 2^16): ≥ 70% of the copy bandwidth", target_long),
]


def evaluate_targets(row, env) -> dict:
    """{target key: (met, text)} of the targets that apply to one of our rows."""
    out = {}
    for key, _, fn in TARGETS:
        got = fn(row, env)
        if got is not None:
            out[key] = got
    return out


# ---------------------------------------------------------------------------------------------------------------


def load(path) -> dict:
    data = json.loads(Path(path).read_text())
    for row in data["rows"]:
        row.setdefault("truncation", "with")  # earlier rollouts: 1% terminated and 1% truncated steps
        row.setdefault("dtype", "float32")
    return data


def _num(v) -> str:
    if v is None:
        return "-"
    if v == 0:
        return "0"
    if abs(v) >= 100:
        return f"{v:.0f}"
    if abs(v) >= 10:
        return f"{v:.1f}"
    if abs(v) >= 0.1:
        return f"{v:.2f}"
    return f"{v:.2g}"


def _pow2(n) -> str:
    return f"2^{int(math.log2(n))}" if n >= 1 << 16 and n & (n - 1) == 0 else str(n)


def _short_status(row) -> str:
    s = row.get("status", "")
    if s == "wrong":
        return f"wrong (err {row.get('max_err', float('nan')):.1e})"
    if s.startswith("skipped (too slow: one Python step"):
        return "skipped (loop)"
    if s.startswith("skipped (too slow"):
        return "skipped (" + s[len("skipped (too slow: "):].split(" per call")[0] + "/call)"
    if s.startswith("not run"):
        return "not run (budget)"
    if s.startswith("unavailable"):
        return "unavailable"
    if s.startswith("error"):
        return "error"
    return s or "-"


def _cell(row, ours_us) -> str:
    """A baseline's cell: its device time and how many times slower than ours it is, or why there is none."""
    if row is None:
        return "-"
    if row.get("status") != "ok" or row.get("device_us") is None:
        return _short_status(row)
    if ours_us:
        return f"{_num(row['device_us'])} ({_num(row['device_us'] / ours_us)}x)"
    return _num(row["device_us"])


def markdown(data, name) -> str:
    env, rows = data["environment"], data["rows"]
    on_gpu = "gpu" in env
    lines = [f"# Kernel benchmark ({env.get('gpu', 'CPU smoke run, no GPU')})", "",
             f"Generated from `{name}.json` by `benchmarks/report.py`; do not edit by hand.", ""]
    skip = {"sweeps", "plan", "timing", "impl_notes", "compile"}
    lines += [f"- {k}: {v}" for k, v in env.items() if k not in skip]
    for k in ("compile", "impl_notes", "plan", "timing"):
        if k in env:
            lines.append(f"- {k}: `{json.dumps(env[k], default=str)}`")
    if data.get("command"):
        lines += ["", f"Command: `{data['command']}`"]
    lines += ["", "Device time: `triton.testing.do_bench` median, L2 flushed before each call, of a replayed one-call "
              "CUDA graph (`graph`) or of the call itself where it synchronises with the host (`direct`, TorchRL); the "
              "graph launch adds an empty kernel's `empty_kernel_us` to every call. Kernel µs (ours): the kernels' "
              "own durations from the GPU's activity records (CUPTI, through torch.profiler), L2 flushed, no launch. "
              "Bandwidth limit: the bytes the algorithm must move (inputs read once, outputs written once) at the "
              "device-to-device copy bandwidth measured in the same run. Baseline cells: device µs (how many times "
              "slower than ours). A speedup is only given against an implementation whose check against the float64 "
              "reference passed."]
    if not on_gpu:
        lines += ["", "**No GPU: every time is host wall time, the Triton kernels ran through Triton's interpreter. "
                  "The numbers say nothing about performance; this run only checks that the suite works.**"]

    # targets
    ours_rows = [r for r in rows if r["impl"] == OURS]
    lines += ["", "## Targets (ours)", "", "| target | cells | met | missed |", "|---|---|---|---|"]
    for key, text, _ in TARGETS:
        hits = [(r, evaluate_targets(r, env)[key]) for r in ours_rows if key in evaluate_targets(r, env)]
        missed = [f"{r['algorithm']} {r['B']}x{_pow2(r['T'])} {r['dtype']} {r['truncation']} ({t.split(': ')[-1]})"
                  for r, (met, t) in hits if not met]
        note = "; ".join(missed[:12]) + (f"; ... {len(missed) - 12} more" if len(missed) > 12 else "")
        if key == "short" and env.get("empty_kernel_us") is None:
            note = "not evaluated: this run has no empty-kernel measurement"
        lines.append(f"| {text} | {len(hits)} | {sum(m for _, (m, _) in hits)} | {note or '-'} |")

    # implementations
    lines += ["", "## Implementations", "", "| implementation | ok | wrong | skipped / not run | error / unavailable | "
              "graphs compiled | first calls s | note |", "|---|---|---|---|---|---|---|---|"]
    notes = env.get("impl_notes", {})
    by_impl = defaultdict(list)
    for r in rows:
        by_impl[r["impl"]].append(r)
    for impl, rs in by_impl.items():
        st = [r.get("status", "") for r in rs]
        lines.append(f"| {impl} | {st.count('ok')} | {st.count('wrong')} | "
                     f"{sum(s.startswith(('skipped', 'not run')) for s in st)} | "
                     f"{sum(s.startswith(('error', 'unavailable', 'out of memory')) for s in st)} | "
                     f"{sum(r.get('compiles', 0) for r in rs) if impl in ('doubling', 'assoc_scan') else '-'} | "
                     f"{_num(sum(r.get('first_call_s', 0.0) for r in rs))} | {notes.get(impl, '')} |")
    errors = sorted({r["status"] for r in rows if r.get("status", "").startswith(("error", "unavailable", "out of"))})
    if errors:
        lines += ["", "Errors:", ""] + [f"- {e}" for e in errors[:20]]

    # per algorithm, dtype, truncation
    groups = defaultdict(list)
    for r in rows:
        groups[(r["algorithm"], r["dtype"], r["truncation"])].append(r)
    present = [b for b in BASELINES if b in by_impl]
    order = {a: i for i, a in enumerate(dict.fromkeys(r["algorithm"] for r in rows))}
    for (algo, dtype, trunc) in sorted(groups, key=lambda k: (order[k[0]], k[1] != "float32", k[2] != "with")):
        cell = defaultdict(dict)
        for r in groups[(algo, dtype, trunc)]:
            cell[(r["B"], r["T"])][r["impl"]] = r
        tr = {"with": "with truncations", "without": "without truncations", "n/a": "no terminated flag"}[trunc]
        lines += ["", f"## {algo}, {dtype}, {tr}", "",
                  "| B | T | ours µs | kernel µs | limit µs | × limit | % copy bw | wall µs | "
                  + " | ".join(BASELINE_NAMES[b] for b in present) + " | targets |",
                  "|---|---|---|---|---|---|---|---|" + "---|" * len(present) + "---|"]
        for (B, T) in sorted(cell, key=lambda s: (s[0] <= 16, s[0], s[1])):  # long sequences last
            impls = cell[(B, T)]
            ours = impls.get(OURS)
            ok = ours is not None and ours.get("status") == "ok" and ours.get("device_us")
            ours_us = ours["device_us"] if ok else None
            limit = next((r.get("limit_us") for r in impls.values() if r.get("limit_us")), None)
            tg = evaluate_targets(ours, env) if ours else {}
            tg_text = "; ".join(("✓ " if met else "✗ ") + text for met, text in tg.values()) or "-"
            bw = f"{100 * ours['bw_fraction']:.0f}%" if ok and ours.get("bw_fraction") else "-"
            lines.append(
                f"| {B} | {_pow2(T)} | {_num(ours_us) if ok else (_short_status(ours) if ours else '-')} | "
                f"{_num(ours.get('kernel_us')) if ok else '-'} | {_num(limit)} | {_num(ours_us / limit) if ok and limit else '-'} | "
                f"{bw} | "
                f"{_num(ours.get('wall_us')) if ok else '-'} | "
                + " | ".join(_cell(impls.get(b), ours_us) for b in present) + f" | {tg_text} |")
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------------------------

STYLE = {"ours_triton": ("C3", "o"), "ours_torch": ("C1", "v"), "doubling": ("C0", "s"), "assoc_scan": ("C2", "D"),
         "torchrl_vec": ("C4", "^"), "torchrl_loop": ("C5", "x")}


def _main_truncation(rows):
    """The plots show one truncation setting per algorithm: with truncations where measured, else what there is."""
    keep = {}
    for r in rows:
        cur = keep.get(r["algorithm"])
        if cur is None or (r["truncation"] == "with" and cur != "with"):
            keep[r["algorithm"]] = r["truncation"]
    return [r for r in rows if r["truncation"] == keep[r["algorithm"]]]


def plots(data, out_dir: Path, name: str) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np
    from matplotlib.colors import TwoSlopeNorm

    env, written = data["environment"], []
    gbps = env.get("copy_bandwidth_GBps")
    title_dev = env.get("gpu", "CPU smoke run (host wall times)")
    for dtype in dict.fromkeys(r["dtype"] for r in data["rows"]):
        rows = _main_truncation([r for r in data["rows"] if r["dtype"] == dtype])
        algos = list(dict.fromkeys(r["algorithm"] for r in rows))
        if not algos:
            continue
        ncol = min(4, len(algos))
        nrow = math.ceil(len(algos) / ncol)

        # time against B*T, the bandwidth limit and the empty kernel
        fig, axes = plt.subplots(nrow, ncol, figsize=(4.2 * ncol, 3.6 * nrow), squeeze=False)
        for ax, algo in zip(axes.flat, algos):
            rs = [r for r in rows if r["algorithm"] == algo]
            for impl in dict.fromkeys(r["impl"] for r in rs):
                pts = sorted((r["B"] * r["T"], r["device_us"]) for r in rs
                             if r["impl"] == impl and r.get("status") == "ok" and r.get("device_us"))
                if pts:
                    color, marker = STYLE.get(impl, ("k", "."))
                    ax.plot(*zip(*pts), marker=marker, color=color, ls="", ms=4, label=impl)
            lim = sorted({(r["B"] * r["T"], r["limit_us"]) for r in rs if r.get("limit_us")})
            if lim and math.isfinite(lim[-1][1]) and lim[-1][1] > 0:
                n = np.array([p[0] for p in lim], dtype=float)
                per = max(p[1] / p[0] for p in lim)
                ax.plot(n, per * n, color="k", lw=1, label=f"bandwidth limit ({gbps} GB/s)")
            if env.get("empty_kernel_us"):
                ax.axhline(env["empty_kernel_us"], color="grey", ls=":", lw=1, label="empty kernel")
            ax.set_xscale("log", base=2)
            ax.set_yscale("log")
            ax.set_title(f"{algo} ({rs[0]['truncation']} trunc.)" if rs[0]["truncation"] != "n/a" else algo,
                         fontsize=9)
            ax.set_xlabel("B·T")
            ax.set_ylabel("device µs")
            ax.grid(alpha=0.3, which="both", lw=0.5)
        for ax in list(axes.flat)[len(algos):]:
            ax.axis("off")
        handles = {}
        for ax in axes.flat:
            for h, lab in zip(*ax.get_legend_handles_labels()):
                handles.setdefault(lab, h)
        fig.legend(handles.values(), handles.keys(), loc="lower center", ncol=min(8, len(handles)), fontsize=8)
        fig.suptitle(f"Device time per call, {dtype}, {title_dev}", fontsize=10)
        fig.tight_layout(rect=(0, 0.06, 1, 0.96))
        path = out_dir / f"{name}_time_{dtype}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)

        # heatmaps: our fraction of the copy bandwidth, and our speedup over each baseline
        shapes_B = sorted({r["B"] for r in rows})
        shapes_T = sorted({r["T"] for r in rows})
        ours = {(r["algorithm"], r["B"], r["T"]): r for r in rows
                if r["impl"] == OURS and r.get("status") == "ok" and r.get("device_us")}
        for what in ("bandwidth",) + tuple(b for b in BASELINES if any(r["impl"] == b for r in rows)):
            impl = OURS if what == "bandwidth" else what
            shown = [a for a in algos if any(r["impl"] == impl and r["algorithm"] == a for r in rows)]
            ncol = min(4, len(shown))
            nrow = math.ceil(len(shown) / ncol)
            fig, axes = plt.subplots(nrow, ncol, figsize=(3.9 * ncol + 1, 3.4 * nrow + 0.4), squeeze=False,
                                     layout="constrained")
            for ax, algo in zip(axes.flat, shown):
                grid = np.full((len(shapes_B), len(shapes_T)), np.nan)
                text = [["" for _ in shapes_T] for _ in shapes_B]
                for r in rows:
                    if r["algorithm"] != algo:
                        continue
                    i, j = shapes_B.index(r["B"]), shapes_T.index(r["T"])
                    o = ours.get((algo, r["B"], r["T"]))
                    if what == "bandwidth" and r["impl"] == OURS and o:
                        grid[i, j] = r["bw_fraction"]
                        text[i][j] = f"{100 * r['bw_fraction']:.0f}"
                    elif r["impl"] == what:
                        if r.get("status") == "ok" and r.get("device_us") and o:
                            grid[i, j] = r["device_us"] / o["device_us"]
                            text[i][j] = _num(grid[i, j])
                        else:
                            status = r.get("status", "")
                            text[i][j] = next((v for k, v in (("skipped", "skip"), ("wrong", "wrong"),
                                                              ("not run", "n/r"), ("unavailable", "n/a"))
                                               if status.startswith(k)), "err")
                if what == "bandwidth":
                    im = ax.imshow(grid, cmap="viridis", vmin=0, vmax=1, aspect="auto")
                else:  # green where ours is faster, red where it is slower
                    im = ax.imshow(np.log10(grid), cmap="RdYlGn", norm=TwoSlopeNorm(0.0, -1.0, 3.0), aspect="auto")
                for i in range(len(shapes_B)):
                    for j in range(len(shapes_T)):
                        if text[i][j]:
                            ax.text(j, i, text[i][j], ha="center", va="center", fontsize=6,
                                    color="w" if what == "bandwidth" and grid[i, j] < 0.5 else "k")
                ax.set_xticks(range(len(shapes_T)), [_pow2(t) for t in shapes_T], fontsize=7)
                ax.set_yticks(range(len(shapes_B)), shapes_B, fontsize=7)
                ax.set_xlabel("T", fontsize=8)
                ax.set_ylabel("B", fontsize=8)
                ax.set_title(algo, fontsize=9)
            for ax in list(axes.flat)[len(shown):]:
                ax.axis("off")
            label = ("our fraction of the copy bandwidth (%)" if what == "bandwidth"
                     else f"ours is x faster than {BASELINE_NAMES[what]} (colour: log10)")
            fig.suptitle(f"{label}, {dtype}, {title_dev}", fontsize=10)
            fig.colorbar(im, ax=axes.ravel().tolist(), shrink=0.6)
            path = out_dir / (f"{name}_bandwidth_{dtype}.png" if what == "bandwidth"
                              else f"{name}_speedup_{what}_{dtype}.png")
            fig.savefig(path, dpi=110)
            plt.close(fig)
            written.append(path)
    return written


def write_report(json_path, out_dir=None, with_plots: bool = True) -> Path:
    json_path = Path(json_path)
    out_dir = Path(out_dir) if out_dir else json_path.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    data = load(json_path)
    name = json_path.stem
    md = out_dir / f"{name}.md"
    md.write_text(markdown(data, name))
    if with_plots:
        plots(data, out_dir, name)
    return md


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("json", help="a bench_kernels.py JSON")
    parser.add_argument("--out", help="directory for the markdown and plots (default: beside the JSON)")
    parser.add_argument("--no-plots", action="store_true")
    args = parser.parse_args()
    print(write_report(args.json, args.out, not args.no_plots))


if __name__ == "__main__":
    main()
