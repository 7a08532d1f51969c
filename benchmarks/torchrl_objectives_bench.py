"""TorchRL's own objective benchmarks (pytorch/rl ``benchmarks/test_objectives_benchmarks.py``), plain and with
``patch_torchrl()`` on, every row compared.

    python benchmarks/torchrl_objectives_bench.py /tmp/rlbench/benchmarks                # plain, patched; 39 rows
    python benchmarks/torchrl_objectives_bench.py DIR -k "test_values or test_gae_speed"  # the value rows only
    python benchmarks/torchrl_objectives_bench.py DIR --rounds 3 --fresh-triton-cache --torchrl-commit ae9719f
    python benchmarks/torchrl_objectives_bench.py DIR --aot-dir .aot      # a third side: precompiled kernels
    python benchmarks/torchrl_objectives_bench.py DIR --paired --rounds 3  # both sides in each process, row by row

DIR holds ``test_objectives_benchmarks.py`` and TorchRL's ``benchmarks/conftest.py``, neither part of this
repository: extract them from a pytorch/rl checkout matching the installed TorchRL (``git archive HEAD
benchmarks/test_objectives_benchmarks.py benchmarks/conftest.py | tar -x -C /tmp/rlbench``). They need
``pytest-benchmark``.

Two uses of this file:

1. A pytest plugin. ``-p torchrl_objectives_bench`` (this folder on ``PYTHONPATH``) calls
   ``rl_triton_torchrl.patch_torchrl()`` in ``pytest_configure``, before the benchmark file is collected (it imports
   TorchRL's functionals at module level, so the names it binds are already ours), says so in the report header and
   writes into pytest-benchmark's JSON which package ran and whether the benchmark module's functionals are ours.
   Nothing wraps or counts calls: the patched timings carry no overhead of this plugin.
2. The driver (below). Each run is its own pytest process in DIR::

       python -m pytest test_objectives_benchmarks.py -q -p no:cacheprovider -rfE --benchmark-json=J \\
           [-p torchrl_objectives_bench] -k EXPR [extra pytest arguments]

   with this folder and the repository root on ``PYTHONPATH`` ahead of the existing one (``COLUMNS=400`` so that the
   failure summary keeps its messages whole). Sides: ``plain`` (TorchRL as installed), ``patched`` (the plugin),
   ``patched_aot`` (the plugin, ``RL_TRITON_TORCHRL_AOT_DIR=--aot-dir``: first calls load our precompiled kernels),
   ``imported`` (the plugin with ``RL_TRITON_TORCHRL_BENCH_PATCH=0``: this package imported, TorchRL not patched,
   which separates what the import costs a process from what the patch changes).
   ``--rounds N`` alternates the sides N times (plain, patched, plain, patched, ...). ``--paired`` runs plain and
   patched in one process per round instead (the plugin with ``RL_TRITON_TORCHRL_BENCH_PATCH=paired``): every row
   three times, its id ending ``-PLAIN``, ``-PATCHED`` or ``-PLAIN2``, the ``-PATCHED`` run with TorchRL patched and
   the module's functionals ours for that row only, ``-PLAIN2`` plain again (an A/A control: plain/plain2 is the
   row's own spread between two runs in one process); the three run side by side in an order rotating from row to
   row and round to round. The speed of the process, which differs between processes on a shared host by more than
   most rows differ, then cancels out, and a patched row whose ratio its A/A ratio also reaches is marked as within
   noise.
   ``--fresh-triton-cache`` gives
   every run its own empty ``TRITON_CACHE_DIR`` under ``--out``, so a patched run pays the compilation a fresh
   machine pays (pytest-benchmark's calibration and warm-up rounds absorb most of it; its ``min`` never does).

The default ``-k`` is every row that is not ``torch.compile``'d::

    test_values or test_gae_speed or speed[False

``test_values`` (7 rows) and ``test_gae_speed`` (5) have no compile parameter; every other test's first
parametrize id is its ``compile`` argument (``False``, ``True`` or ``reduce-overhead``), so ``speed[False`` selects the
eager rows: ``test_value_transform_speed`` (2), ``test_dreamer_v3_value_speed`` (1) and the 12 losses (DQN, DDPG,
SAC, TQC, REDQ, REDQ deprecated, TD3, CQL, A2C, PPO, Reinforce, IQL) without and with ``backward``: 39 of the file's
90 rows at pytorch/rl ae9719f. Rows that never reach our code (the value transforms, most loss rows' network work)
are the noise floor of the comparison.

Results: ``<out>/<name>.json`` (environment, every run with its rows' pytest-benchmark stats in seconds: mean,
median, min, max, stddev, rounds, iterations; failed rows with their error) and ``<out>/<name>.md`` generated from it
(``markdown``): one line per row, the sides' means (over rounds, each round's mean), plain/patched by mean and by
median, and whether patched is faster or slower than plain by mean. A run that fails prints its output tail; its
other rows are kept, and a row that failed on one side is listed as such (a row that failed in some rounds of a
side and not others is timed by the others, its failures noted). Logs: ``<out>/logs/<side>-r<k>.log``, each run's
pytest-benchmark JSON ``<out>/runs/<side>-r<k>.json``. The exit status is 1 when a run did not end cleanly (a failed
row, a timeout, no results), else 0.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
TEST_FILE = "test_objectives_benchmarks.py"
SIDES = ("plain", "imported", "patched", "patched_aot")
DEFAULT_K = "test_values or test_gae_speed or speed[False"
CONTROL_TESTS = ("test_value_transform_speed", "test_dreamer_v3_value_speed")
STATS = ("mean", "median", "min", "max", "stddev", "rounds", "iterations")
TAIL_LINES = 40


# -- the pytest plugin ------------------------------------------------------------------------------------------------

def _patch_info() -> dict:
    import rl_triton_torchrl
    from rl_triton_torchrl import patch

    return {"patched": patch.is_patched(), "package": rl_triton_torchrl.__file__,
            "backend": os.environ.get("RL_TRITON_TORCHRL_BACKEND") or "auto (Triton on CUDA tensors, torch elsewhere)",
            "aot_dir": os.environ.get("RL_TRITON_TORCHRL_AOT_DIR")}


def _mode() -> str:
    """``patch`` (the default), ``import`` (``RL_TRITON_TORCHRL_BENCH_PATCH=0``) or ``paired``."""
    value = os.environ.get("RL_TRITON_TORCHRL_BENCH_PATCH", "1")
    return {"0": "import", "paired": "paired"}.get(value, "patch")


def pytest_configure(config):
    """Patches TorchRL before collection (only imports this package on the ``imported`` side and when paired)."""
    import rl_triton_torchrl

    if _mode() == "patch":
        rl_triton_torchrl.patch_torchrl()


@pytest.hookimpl(trylast=True)
def pytest_generate_tests(metafunc):
    """Paired: every row three times, ``-PLAIN``, ``-PATCHED`` and ``-PLAIN2`` appended to its id (after the test's
    own ids, so that ``-k "speed[False"`` still selects it)."""
    if _mode() == "paired" and metafunc.module.__name__ == TEST_FILE[:-3]:
        metafunc.fixturenames.append(PAIRED_PARAM)
        metafunc.parametrize(PAIRED_PARAM, list(PAIRED_IDS), ids=list(PAIRED_IDS.values()))


def _paired_side(item) -> str | None:
    callspec = getattr(item, "callspec", None)
    return callspec.params.get(PAIRED_PARAM) if callspec is not None else None


@pytest.hookimpl(trylast=True)  # after -k's deselection: the alternation is over the rows that run
def pytest_collection_modifyitems(session, config, items):
    """Paired: the runs of a row side by side, their order rotating from row to row (the first row starting with
    ``RL_TRITON_TORCHRL_BENCH_FIRST``, plain by default: plain, patched, plain2; then patched, plain2, plain; ...), so
    that every side runs first, second and third equally often."""
    if _mode() != "paired":
        return
    groups = {}
    for item in items:
        groups.setdefault(split_paired(row_name(item.nodeid))[0], []).append(item)
    sides = list(PAIRED_IDS)
    start = sides.index(os.environ.get("RL_TRITON_TORCHRL_BENCH_FIRST", "plain"))
    ordered = []
    for i, group in enumerate(groups.values()):
        order = sides[(start + i) % len(sides):] + sides[:(start + i) % len(sides)]
        ordered += sorted(group, key=lambda item: order.index(_paired_side(item)))
    items[:] = ordered


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """Paired: a ``-PATCHED`` row's body runs with TorchRL patched, the benchmark module's functionals (bound at its
    import) and the test's arguments that are TorchRL functionals (``test_values``' ``val_fn``) replaced by ours;
    everything is restored after the row."""
    if _paired_side(item) != "patched":
        return (yield)
    from torchrl.objectives.value import functional as theirs

    from rl_triton_torchrl import functional, patch

    swap = {id(getattr(theirs, n)): getattr(functional, n) for n in functional.__all__ if hasattr(theirs, n)}
    module = item.module
    saved_globals = {n: getattr(module, n) for n in functional.__all__ if id(getattr(module, n, None)) in swap}
    saved_args = {k: v for k, v in item.funcargs.items() if id(v) in swap}
    patch.patch_torchrl()
    for n, fn in saved_globals.items():
        setattr(module, n, swap[id(fn)])
    for k, fn in saved_args.items():
        item.funcargs[k] = swap[id(fn)]
    _PAIRED_PATCHED.append({"row": row_name(item.nodeid), "patched": patch.is_patched(),
                            "module_functionals_ours": sorted(saved_globals), "arguments_ours": sorted(saved_args)})
    try:
        return (yield)
    finally:
        item.funcargs.update(saved_args)
        for n, fn in saved_globals.items():
            setattr(module, n, fn)
        patch.unpatch_torchrl()


def pytest_report_header(config):
    info = _patch_info()
    if _mode() == "paired":
        return (f"torchrl_objectives_bench: every row three times, plain, patch_torchrl() on and plain again "
                f"({info['package']}; backend {info['backend']})")
    if _mode() == "import":
        return f"torchrl_objectives_bench: rl_triton_torchrl imported, TorchRL not patched ({info['package']})"
    return (f"torchrl_objectives_bench: patch_torchrl() applied before collection ({info['package']}; backend "
            f"{info['backend']}; RL_TRITON_TORCHRL_AOT_DIR={info['aot_dir'] or 'unset'})")


@pytest.hookimpl(optionalhook=True)
def pytest_benchmark_update_json(config, benchmarks, output_json):
    """Which package ran, and for each TorchRL functional the benchmark module bound at its import, whether it is
    ours (proof that the patch came before collection)."""
    from rl_triton_torchrl import functional

    module = sys.modules.get(TEST_FILE[:-3])
    bound = {name: getattr(module, name) is getattr(functional, name)
             for name in functional.__all__ if module is not None and hasattr(module, name)}
    output_json["rl_triton_torchrl"] = {**_patch_info(), "module_functionals_ours": bound, "mode": _mode(),
                                        "paired_patched_rows": _PAIRED_PATCHED}


_PAIRED_PATCHED = []  # paired mode: per row run patched, whether the patch was on and the functionals made ours


# paired mode's side -> the id appended to each row's; plain2: plain again, the A/A control of the row
PAIRED_IDS = {"plain": "PLAIN", "patched": "PATCHED", "plain2": "PLAIN2"}
PAIRED_PARAM = "rl_triton_torchrl_side"


def split_paired(row: str) -> tuple[str, str | None]:
    """``("test_values[gae-True-True]", "patched")`` for ``test_values[gae-True-True-PATCHED]``; ``(row, None)``
    for a row of another mode."""
    for side, tag in PAIRED_IDS.items():
        for suffix, bare in ((f"-{tag}]", "]"), (f"[{tag}]", "")):
            if row.endswith(suffix):
                return row[: -len(suffix)] + bare, side
    return row, None


# -- pure functions: pytest-benchmark's JSON and pytest's output in, the report out ----------------------------------

def row_name(nodeid_or_fullname: str) -> str:
    """``test_values[td0_return_estimate-False-False]`` for ``test_objectives_benchmarks.py::test_values[...]``."""
    return nodeid_or_fullname.split("::", 1)[1] if "::" in nodeid_or_fullname else nodeid_or_fullname


def parse_benchmark_json(data: dict) -> dict[str, dict]:
    """``{row: {mean, median, min, max, stddev, rounds, iterations}}`` (seconds, as pytest-benchmark reports them)
    from a ``--benchmark-json`` file's content."""
    rows = {}
    for bench in data.get("benchmarks", []):
        stats = bench["stats"]
        rows[row_name(bench.get("fullname") or bench["name"])] = {k: stats.get(k) for k in STATS}
    return rows


_SUMMARY = re.compile(r"^(FAILED|ERROR) (\S+?)(?: - (.*))?$")


def parse_failures(output: str) -> tuple[dict[str, str], list[str]]:
    """From pytest's short test summary (``-rfE``): ``({row: "FAILED|ERROR: message"}, [errors outside a row])``,
    the latter for collection errors (``ERROR test_objectives_benchmarks.py - ImportError: ...``)."""
    rows, other = {}, []
    for line in output.splitlines():
        m = _SUMMARY.match(line.rstrip())
        if not m:
            continue
        kind, nodeid, message = m.group(1), m.group(2), (m.group(3) or "").strip()
        text = f"{kind}: {message}" if message else kind
        if "::" in nodeid:
            rows.setdefault(row_name(nodeid), text)
        else:
            other.append(f"{nodeid}: {text}")
    return rows, other


def fmt_time(seconds) -> str:
    """3 significant figures in ms (at least 1 ms) or µs: ``12.3 ms``, ``1230 ms``, ``456 µs``, ``0.512 µs``."""
    if seconds is None or (isinstance(seconds, float) and math.isnan(seconds)):
        return "-"
    us = _sig3(seconds * 1e6)
    return f"{_sig3(seconds * 1e3)} ms" if float(us) >= 1000 else f"{us} µs"  # 999.6 µs reads 1.00 ms


def _sig3(value: float) -> str:
    if value == 0:
        return "0"
    digits = math.floor(math.log10(abs(value)))
    rounded = round(value, 2 - digits)
    digits = math.floor(math.log10(abs(rounded)))  # 999.6 rounds to 1000
    return f"{rounded:.{max(0, 2 - digits)}f}"


def summarize(results: dict) -> list[dict]:
    """One dict per row, in the order the rows first appear: per side the mean over rounds of each round's mean and
    median (``None`` where it has no measurement), the rounds measured and failed, and per side other than plain the
    ratios plain/side and the verdict."""
    sides = results["sides"]
    order, per = {}, {}
    for run in results["runs"]:
        for row in [*run.get("rows", {}), *run.get("failed_rows", {})]:
            order.setdefault(row, len(order))
        for row, stats in run.get("rows", {}).items():
            if row not in run.get("failed_rows", {}):
                per.setdefault((row, run["side"]), []).append(stats)
    out = []
    for row in sorted(order, key=order.get):
        entry = {"row": row, "sides": {}}
        for side in sides:
            measured = per.get((row, side), [])
            runs = [r for r in results["runs"] if r["side"] == side]
            failed = [r["failed_rows"][row] for r in runs if row in r.get("failed_rows", {})]
            entry["sides"][side] = {
                "mean": sum(s["mean"] for s in measured) / len(measured) if measured else None,
                "median": sum(s["median"] for s in measured) / len(measured) if measured else None,
                "rounds_measured": len(measured), "rounds_run": len(runs), "failed": failed}
        plain = entry["sides"].get("plain")
        for side in sides:
            if side == "plain" or plain is None:
                continue
            s = entry["sides"][side]
            if plain["mean"] is not None and s["mean"] is not None:
                s["ratio_mean"] = plain["mean"] / s["mean"]
                s["ratio_median"] = plain["median"] / s["median"]
                s["verdict"] = "faster" if s["ratio_mean"] > 1 else "slower"
            else:
                s["ratio_mean"] = s["ratio_median"] = None
                missing = [n for n, x in (("plain", plain), (side, s)) if x["mean"] is None]
                s["verdict"] = " and ".join(_why(entry["sides"][n], n, results) for n in missing)
        out.append(entry)
    for side in (s for s in sides if s != "plain"):  # a ratio the control rows or the row's A/A run also reach
        band = noise_band(out, side) if side != AA_SIDE else None
        for e in out:
            s = e["sides"][side]
            if s.get("ratio_mean") is None:
                continue
            if side == AA_SIDE:
                s["verdict"] = "A/A"
            elif is_control(e["row"]):
                pass
            elif band and band[0] <= s["ratio_mean"] <= band[1]:
                s["verdict"] += ", within noise"
            elif within_aa(e, s["ratio_mean"]):
                s["verdict"] += ", within its A/A spread"
    return out


AA_SIDE = "plain2"  # paired mode's second plain run of each row


def within_aa(entry: dict, ratio: float) -> bool:
    """Whether ``ratio`` (plain/side by mean) lies within the row's A/A spread: between r and 1/r, r being the row's
    plain/plain2 by mean (False where the row has no A/A run)."""
    aa = entry["sides"].get(AA_SIDE, {}).get("ratio_mean")
    if aa is None:
        return False
    k = max(aa, 1 / aa)
    return 1 / k <= ratio <= k


def is_control(row: str) -> bool:
    """Whether ``row`` never reaches an estimator or a value functional (the value transforms, DreamerV3's value
    loss): patched or not, it runs the same code, so its ratio plain/side is the spread between processes."""
    return row.startswith(CONTROL_TESTS)


def noise_band(summary: list[dict], side: str) -> tuple[float, float] | None:
    """The lowest and highest ratio plain/``side`` by mean over the control rows measured on both (1.0 always
    inside), or None without one."""
    ratios = [e["sides"][side].get("ratio_mean") for e in summary if is_control(e["row"]) and side != "plain"]
    ratios = [r for r in ratios if r is not None]
    return (min(1.0, *ratios), max(1.0, *ratios)) if ratios else None


def _why(s: dict, side: str, results: dict) -> str:
    if s["failed"]:
        return f"failed on {side}"
    broken = any(r["side"] == side and r["status"] != "ok" and not r.get("rows") for r in results["runs"])
    return f"not measured on {side}" + (" (run failed)" if broken else "")


def counts(summary: list[dict], side: str) -> dict:
    """Rows ``side`` is faster than plain in, by mean and by median, out of the rows measured on both; the rows
    failed on either."""
    measured = [e for e in summary if e["sides"][side].get("ratio_mean") is not None]
    both = [e["sides"][side] for e in measured]
    # the control rows set the band; they are not judged by it
    tested = [e["sides"][side] for e in measured if not is_control(e["row"])]
    return {"by_mean": sum(s["ratio_mean"] > 1 for s in both), "by_median": sum(s["ratio_median"] > 1 for s in both),
            "slower_beyond_noise": sum(s["ratio_mean"] < 1 and "within" not in s["verdict"] for s in tested),
            "measured": len(both), "rows": len(summary),
            "failed_plain": sum(bool(e["sides"]["plain"]["failed"]) for e in summary),
            "failed_side": sum(bool(e["sides"][side]["failed"]) for e in summary)}


def _cell(s: dict) -> str:
    if s["mean"] is None:
        return "failed" if s["failed"] else "-"
    text = fmt_time(s["mean"])
    if s["failed"]:
        text += f" ({len(s['failed'])} of {s['rounds_run']} rounds failed)"
    return text


def _ratio(r) -> str:
    return "-" if r is None else f"{_sig3(r)}x"


def markdown(results: dict) -> str:
    """The report of ``results`` (the driver's JSON): environment, per-side counts, one table line per row, the
    runs, the rows that failed."""
    sides = results["sides"]
    others = [s for s in sides if s != "plain"]
    summary = summarize(results)
    env = results["environment"]
    lines = ["# TorchRL's objective benchmarks, plain and patched", "",
             "Generated from the JSON beside this file; do not edit by hand.", ""]
    lines += [f"- {k}: {v}" for k, v in env.items()]
    lines += [f"- -k: `{results['keyword']}`", f"- sides: {', '.join(sides)}; rounds: {results['rounds']}; fresh "
              f"Triton cache per run: {results.get('fresh_triton_cache', False)}"]
    paired = results.get("paired", False)
    if paired:
        lines.append("- paired: one pytest process per round runs every row plain, patched and plain again (plain2, "
                     "the row's A/A control) in turn, in an order rotating from row to row and from round to round")
    lines.append("")
    if "plain" in sides:
        for side in (s for s in others if s != AA_SIDE):
            c = counts(summary, side)
            failed = f"; {c['failed_side']} failed on {side}, {c['failed_plain']} on plain" if (
                c["failed_side"] or c["failed_plain"]) else ""
            lines.append(f"**{side} faster than plain: {c['by_mean']} of {c['measured']} rows by mean, "
                         f"{c['by_median']} of {c['measured']} by median** ({c['rows']} rows{failed}); rows other "
                         f"than the control rows slower beyond noise (outside the control rows' band and the row's "
                         f"own A/A spread): "
                         f"{c['slower_beyond_noise']}.")
            band = noise_band(summary, side)
            if band:
                within = sum(e["sides"][side]["verdict"].endswith("within noise") for e in summary)
                lines.append(f"Control rows of {side} (they never reach an estimator: {', '.join(CONTROL_TESTS)}): "
                             f"plain/{side} {_sig3(band[0])}-{_sig3(band[1])}x by mean (1.0 included), the spread "
                             f"{'between the two runs of a row' if paired else 'between processes'}; {within} other "
                             f"rows lie within it (\"within noise\").")
        lines += ["", "Times: pytest-benchmark's mean per call (the mean over rounds of each round's mean); "
                  "ratio > 1: faster than plain.", ""]
    header = ["test"] + [f"{s} mean" for s in sides]
    for side in others if "plain" in sides else []:
        header += [f"plain/{side} (mean)", f"plain/{side} (median)", f"{side} vs plain"]
    lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for e in summary:
        cells = [f"`{e['row']}`"] + [_cell(e["sides"][s]) for s in sides]
        for side in others if "plain" in sides else []:
            s = e["sides"][side]
            cells += [_ratio(s["ratio_mean"]), _ratio(s["ratio_median"]), s["verdict"]]
        lines.append("| " + " | ".join(cells) + " |")
    lines += ["", "## Runs", "", "| side | round | status | wall s | rows measured | rows failed |",
              "|---|---|---|---|---|---|"]
    for run in results["runs"]:
        lines.append(f"| {run['side']} | {run['round']} | {run['status']} | {run.get('wall_s', 0):.1f} | "
                     f"{len(run.get('rows', {}))} | {len(run.get('failed_rows', {}))} |")
    failures = [(run, row, msg) for run in results["runs"] for row, msg in run.get("failed_rows", {}).items()]
    problems = [(run, msg) for run in results["runs"] for msg in run.get("errors", [])]
    if failures or problems:
        lines += ["", "## Failures", "", "| test | side | round | error |", "|---|---|---|---|"]
        for run, row, msg in failures:
            lines.append(f"| `{row}` | {run['side']} | {run['round']} | {_md_escape(msg)} |")
        for run, msg in problems:
            lines.append(f"| (run) | {run['side']} | {run['round']} | {_md_escape(msg)} |")
    return "\n".join(lines) + "\n"


def _md_escape(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


# -- the driver -------------------------------------------------------------------------------------------------------

def environment(argv: list[str], torchrl_commit: str | None) -> dict:
    """``_common.environment()`` plus tensordict, pytest and pytest-benchmark versions, the GPU ("cpu" without one),
    the TorchRL commit given and the command line."""
    from importlib import metadata

    import torch

    sys.path.insert(0, str(HERE))
    try:
        import _common
    finally:
        sys.path.remove(str(HERE))
    env = _common.environment()
    for package in ("tensordict", "pytest", "pytest-benchmark"):
        try:
            env[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            env[package] = None
    env["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu"
    env["torchrl_commit"] = torchrl_commit
    env["command"] = shlex.join([sys.executable, str(Path(__file__).resolve()), *argv])
    return env


def child_command(side: str, json_path: Path, keyword: str, extra: list[str]) -> list[str]:
    cmd = [sys.executable, "-m", "pytest", TEST_FILE, "-q", "-p", "no:cacheprovider", "-rfE",
           f"--benchmark-json={json_path}"]
    if side != "plain":
        cmd += ["-p", "torchrl_objectives_bench"]
    return cmd + ["-k", keyword, *extra]


def side_env(side: str, aot_dir: Path | None, triton_cache: Path | None, first: str = "plain") -> dict:
    env = dict(os.environ, COLUMNS="400",
               PYTHONPATH=os.pathsep.join(filter(None, [str(HERE), str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("RL_TRITON_TORCHRL_AOT_DIR", None)
    env["RL_TRITON_TORCHRL_BENCH_PATCH"] = {"imported": "0", "paired": "paired"}.get(side, "1")
    env["RL_TRITON_TORCHRL_BENCH_FIRST"] = first
    if side == "patched_aot":
        env["RL_TRITON_TORCHRL_AOT_DIR"] = str(aot_dir)
    if triton_cache is not None:
        env["TRITON_CACHE_DIR"] = str(triton_cache)
    return env


def run_side(side: str, round_: int, args, extra: list[str]) -> dict:
    """One pytest process; its record for the JSON (status, wall time, rows, failed rows). Side ``paired``: one
    process running every row plain and patched (``split_run`` makes the two sides' records of it)."""
    tag = f"{side}-r{round_}"
    json_path = args.out / "runs" / f"{tag}.json"
    log_path = args.out / "logs" / f"{tag}.log"
    json_path.unlink(missing_ok=True)
    cache = None
    if args.fresh_triton_cache:
        cache = args.out / "triton_cache" / tag
        shutil.rmtree(cache, ignore_errors=True)
        cache.mkdir(parents=True)
    cmd = child_command(side, json_path, args.keyword, extra)
    record = {"side": side, "round": round_, "command": shlex.join(cmd), "log": str(log_path),
              "triton_cache": str(cache) if cache else None}
    start = time.perf_counter()
    with open(log_path, "w") as log:
        # which side of the first row runs first, alternating (paired: rotating over its three sides)
        first = list(PAIRED_IDS)[(round_ - 1) % len(PAIRED_IDS)] if side == "paired" else (
            "plain" if round_ % 2 else "patched")
        proc = subprocess.Popen(cmd, cwd=args.folder, env=side_env(side, args.aot_dir, cache, first), stdout=log,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            record["returncode"] = proc.wait(timeout=args.timeout_s)
            timed_out = False
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the pytest process this call started, and its children
            record["returncode"] = proc.wait()
            timed_out = True
    record["wall_s"] = time.perf_counter() - start
    output = log_path.read_text(errors="replace")
    record["failed_rows"], record["errors"] = parse_failures(output)
    data = json.loads(json_path.read_text()) if json_path.exists() else {}
    record["rows"] = parse_benchmark_json(data)
    record["plugin"] = data.get("rl_triton_torchrl")
    if side == "paired" and data:  # the plugin patches per row: every row measured as patched ran so
        ran = {r["row"] for r in (record["plugin"] or {}).get("paired_patched_rows", []) if r["patched"]}
        missing = [r for r in record["rows"] if split_paired(r)[1] == "patched" and r not in ran]
        if missing:
            record["errors"].append(f"rows measured as patched without the patch on: {missing}")
    if side not in ("plain", "paired"):  # paired: the plugin binds our functionals per row, not at import
        info = record["plugin"] or {}
        if data and not (info.get("patched") and info.get("module_functionals_ours")
                         and all(info["module_functionals_ours"].values())):
            record["errors"].append(f"the benchmark module's functionals were not all ours: {info}")
    if timed_out:
        record["status"] = f"timed out after {args.timeout_s:g} s"
        record["errors"].append(record["status"])
    elif not data:
        record["status"] = f"no results (exit {record['returncode']})"
        record["errors"].append(record["status"])
    elif record["returncode"] != 0 or record["errors"]:
        record["status"] = f"exit {record['returncode']}"
    else:
        record["status"] = "ok"
    if record["status"] != "ok":
        tail = "\n".join(output.splitlines()[-TAIL_LINES:])
        print(f"--- {tag}: {record['status']}; the last {TAIL_LINES} lines of {log_path}:\n{tail}\n---", flush=True)
    return record


def split_run(record: dict) -> list[dict]:
    """A paired run's record as three, sides ``plain``, ``patched`` and ``plain2``, each with its rows (ids without
    the paired suffix) and failed rows; status, wall time, log and errors shared."""
    out = []
    for side in PAIRED_IDS:
        part = {**record, "side": side, "paired": True}
        for key in ("rows", "failed_rows"):
            part[key] = {base: v for row, v in record.get(key, {}).items()
                         for base, s in [split_paired(row)] if s == side}
        out.append(part)
    return out


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help=f"folder holding {TEST_FILE} and TorchRL's benchmarks/conftest.py")
    parser.add_argument("-k", dest="keyword", default=DEFAULT_K, help="pytest -k expression (default: every row "
                        "not torch.compile'd: %(default)r)")
    parser.add_argument("--sides", help=f"comma-separated, from {', '.join(SIDES)} (default: plain,patched, and "
                        "patched_aot with --aot-dir)")
    parser.add_argument("--aot-dir", type=Path, help="precompiled kernels for the patched_aot side "
                        "(RL_TRITON_TORCHRL_AOT_DIR; python -m rl_triton_torchrl.kernels.precompile)")
    parser.add_argument("--rounds", type=int, default=1, help="the sides alternate this many times, one pytest "
                        "process per side and round (default: %(default)s)")
    parser.add_argument("--fresh-triton-cache", action="store_true", help="every run its own empty "
                        "TRITON_CACHE_DIR under --out")
    parser.add_argument("--out", type=Path, default=ROOT / "runs" / "torchrl_objectives_bench",
                        help="where the results, logs and runs' JSON go (default: runs/torchrl_objectives_bench)")
    parser.add_argument("--name", default="torchrl_objectives_bench", help="the result files' name (<out>/<name>"
                        ".json and .md)")
    parser.add_argument("--paired", action="store_true", help="plain and patched in one pytest process per round, "
                        "every row run on both sides in turn (the process's own speed cancels out); sides "
                        "plain,patched only")
    parser.add_argument("--timeout-s", type=float, default=None, help="wall-clock limit per pytest process")
    parser.add_argument("--torchrl-commit", help="recorded in the results: the pytorch/rl commit the test file "
                        "came from")
    args, extra = parser.parse_known_args(argv)
    if args.sides is None:
        args.sides = ["plain", "patched"] + (["patched_aot"] if args.aot_dir else [])
    else:
        args.sides = [s for s in args.sides.split(",") if s]
        unknown = [s for s in args.sides if s not in SIDES]
        if unknown or not args.sides:
            parser.error(f"unknown side(s) {unknown}; choose from {SIDES}")
    if args.paired and args.sides != ["plain", "patched"]:
        parser.error("--paired compares the sides plain and patched only")
    if "patched_aot" in args.sides and args.aot_dir is None:
        parser.error("the patched_aot side needs --aot-dir")
    if args.rounds < 1:
        parser.error("--rounds must be at least 1")
    args.folder = args.folder.resolve()
    if not (args.folder / TEST_FILE).exists():
        parser.error(f"no {TEST_FILE} in {args.folder} (see --help for where to get it)")
    if args.aot_dir is not None:
        args.aot_dir = args.aot_dir.resolve()
    args.out = args.out.resolve()
    return args, extra


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args, extra = parse_args(argv)
    import importlib.util

    if importlib.util.find_spec("pytest_benchmark") is None:
        sys.exit("pytest-benchmark is not installed (pip install pytest-benchmark): the benchmark file needs it")
    for sub in ("runs", "logs"):
        (args.out / sub).mkdir(parents=True, exist_ok=True)
    sides = list(PAIRED_IDS) if args.paired else args.sides
    results = {"environment": environment(argv, args.torchrl_commit), "folder": str(args.folder),
               "keyword": args.keyword, "extra_pytest_args": extra, "sides": sides, "rounds": args.rounds,
               "fresh_triton_cache": args.fresh_triton_cache, "aot_dir": str(args.aot_dir) if args.aot_dir else None,
               "paired": args.paired, "runs": []}
    path = args.out / f"{args.name}.json"
    plan = [(r, side) for r in range(1, args.rounds + 1) for side in (["paired"] if args.paired else args.sides)]
    started = time.perf_counter()
    for i, (round_, side) in enumerate(plan, 1):
        record = run_side(side, round_, args, extra)
        results["runs"] += split_run(record) if side == "paired" else [record]
        path.write_text(json.dumps(results, indent=1))  # what was measured so far
        print(f"[{i}/{len(plan)}] {side}, round {round_}: {record['status']}, {len(record['rows'])} rows measured, "
              f"{len(record['failed_rows'])} failed, {record['wall_s']:.0f} s", flush=True)
    results["wall_s"] = time.perf_counter() - started
    path.write_text(json.dumps(results, indent=1))
    md = args.out / f"{args.name}.md"
    md.write_text(markdown(results))
    if "plain" in args.sides:
        summary = summarize(results)
        for side in (s for s in sides if s not in ("plain", AA_SIDE)):
            c = counts(summary, side)
            print(f"{side} faster than plain: {c['by_mean']} of {c['measured']} rows by mean, {c['by_median']} by "
                  f"median ({c['failed_side']} failed on {side}, {c['failed_plain']} on plain)")
    print(f"wrote {path} and {md} ({results['wall_s']:.0f} s)")
    return 0 if all(r["status"] == "ok" for r in results["runs"]) else 1


if __name__ == "__main__":
    sys.exit(main())
