"""Run TorchRL's own loss tests (``test/objectives``) with ``patch_torchrl()`` on, and compare with a plain run.

Two uses:

1. A pytest plugin. ``-p torchrl_objectives_suite`` calls ``rl_triton_torchrl.patch_torchrl()`` in
   ``pytest_configure``, before any test module is collected (so ``from torchrl.objectives.value import GAE`` in a
   test module already gets ours), and says so in the report header::

       cd <pytorch/rl checkout>   # test/objectives with its conftest.py and _objectives_common.py
       PYTHONPATH=<this repo>:<this repo>/tools python -m pytest test/objectives -p torchrl_objectives_suite -q

2. A driver. ``python tools/torchrl_objectives_suite.py <dir of test/objectives> [files...]`` runs the folder (or
   the named files) twice, plain and patched, each in its own pytest process with a JUnit XML report, then prints
   per-file passed/failed/skipped counts of both runs and every test that passes plain but not patched::

       python tools/torchrl_objectives_suite.py /tmp/rl/test/objectives --timeout 300 --out /tmp/objsuite
       python tools/torchrl_objectives_suite.py /tmp/rl/test/objectives test_dqn.py -k notensordict
       python tools/torchrl_objectives_suite.py /tmp/rl/test/objectives --only patched   # reuse the plain XML

   ``--only plain|patched`` runs one side and compares with the other side's XML left in ``--out`` by an earlier
   run. The exit status is 1 when a test passes plain and not patched, else 0.

The test files are not part of this repository: extract them from a pytorch/rl checkout matching the installed
TorchRL (``git archive HEAD test/objectives test/conftest.py pytest.ini | tar -x -C /tmp/rl``). They need
``pytest-timeout`` for ``--timeout``; ``RL_TRITON_TORCHRL_BACKEND`` selects our backend as everywhere.
"""
from __future__ import annotations

import argparse
import collections
import functools
import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

_HERE = Path(__file__).resolve().parent
_REPO = _HERE.parent


# -- the pytest plugin ------------------------------------------------------------------------------------------------

_CALLS = collections.Counter()


def _count(owner, name, fn):
    @functools.wraps(fn)
    def counted(*args, **kwargs):
        _CALLS[f"{owner}.{name}"] += 1
        return fn(*args, **kwargs)

    return counted


def pytest_configure(config):
    """Patches TorchRL before collection and counts the calls our estimator classes get (constructions, ``forward``,
    ``value_estimate``), reported at the end of the run as proof that ours ran."""
    import rl_triton_torchrl
    from rl_triton_torchrl import estimators

    for name in estimators.EXPECTED_FUNCTIONALS:
        cls = getattr(estimators, name)
        for method in ("__init__", "value_estimate"):
            setattr(cls, method, _count(name, method, cls.__dict__.get(method, getattr(cls, method))))
    estimators._OurMath.forward = _count("ours", "forward", estimators._OurMath.forward)
    rl_triton_torchrl.patch_torchrl()
    config._rl_triton_torchrl_file = rl_triton_torchrl.__file__


def pytest_report_header(config):
    return f"torchrl_objectives_suite: patch_torchrl() applied ({getattr(config, '_rl_triton_torchrl_file', '?')})"


def pytest_terminal_summary(terminalreporter):
    import torchrl.objectives.value as value

    import rl_triton_torchrl

    terminalreporter.write_line(
        f"torchrl_objectives_suite: patched with {rl_triton_torchrl.__file__}; torchrl.objectives.value.GAE is ours: "
        f"{value.GAE is rl_triton_torchrl.GAE}; calls: " + ", ".join(f"{k} {v}" for k, v in sorted(_CALLS.items())))


# -- the driver --------------------------------------------------------------------------------------------------------

def _outcomes(xml_path: Path) -> dict[str, str]:
    """``{test id: "passed" | "failed" | "skipped"}`` from a JUnit XML report (errors count as failed)."""
    result = {}
    for case in ET.parse(xml_path).getroot().iter("testcase"):
        test_id = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            result[test_id] = "failed"
        elif "skipped" in kinds:
            result.setdefault(test_id, "skipped")
        else:
            result.setdefault(test_id, "passed")
    return result


def _file_of(test_id: str) -> str:
    """``test_dqn.py`` for ``test.objectives.test_dqn.TestDQN::test_x[...]``."""
    parts = test_id.split("::")[0].split(".")
    return next((p + ".py" for p in parts if p.startswith("test_")), parts[-1])


def _run(side: str, folder: Path, files: list[str], out: Path, extra: list[str]) -> Path:
    xml = out / f"{side}.xml"
    pythonpath = [str(_REPO), str(_HERE), os.environ.get("PYTHONPATH", "")]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in pythonpath if p))
    cmd = [sys.executable, "-m", "pytest", *(files or ["."]), "-q", "-p", "no:cacheprovider", f"--junitxml={xml}",
           "-o", "junit_family=xunit1", *extra]
    if side == "patched":
        cmd += ["-p", "torchrl_objectives_suite"]
    print(f"[{side}] {' '.join(cmd)}  (in {folder})", flush=True)
    with open(out / f"{side}.log", "w") as log:
        subprocess.run(cmd, cwd=folder, env=env, stdout=log, stderr=subprocess.STDOUT, check=False)
    return xml


def _report(plain: dict[str, str], patched: dict[str, str]) -> int:
    files = sorted({_file_of(t) for t in (*plain, *patched)})
    count = collections.defaultdict(collections.Counter)
    for side, outcomes in (("plain", plain), ("patched", patched)):
        for test_id, outcome in outcomes.items():
            count[(side, _file_of(test_id))][outcome] += 1
    header = f"{'file':24s} {'plain pass/fail/skip':>22s} {'patched pass/fail/skip':>24s}"
    print(header)
    print("-" * len(header))
    total = collections.defaultdict(collections.Counter)
    for name in files:
        row = []
        for side in ("plain", "patched"):
            c = count[(side, name)]
            total[side].update(c)
            row.append(f"{c['passed']}/{c['failed']}/{c['skipped']}")
        print(f"{name:24s} {row[0]:>22s} {row[1]:>24s}")
    row = [f"{total[s]['passed']}/{total[s]['failed']}/{total[s]['skipped']}" for s in ("plain", "patched")]
    print(f"{'total':24s} {row[0]:>22s} {row[1]:>24s}")
    regressions = sorted(t for t, o in plain.items() if o == "passed" and patched.get(t) != "passed")
    gained = sorted(t for t, o in patched.items() if o == "passed" and plain.get(t) != "passed")
    print(f"\n{len(regressions)} tests pass plain but not patched:")
    for t in regressions:
        print(f"  {t}  ({patched.get(t, 'not run')})")
    if gained:
        print(f"\n{len(gained)} tests pass patched but not plain:")
        for t in gained:
            print(f"  {t}  ({plain.get(t, 'not run')})")
    return 1 if regressions else 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("folder", type=Path, help="TorchRL's test/objectives folder (extracted outside this repo)")
    parser.add_argument("files", nargs="*", help="test files (or node ids) inside it; default: the whole folder")
    parser.add_argument("--out", type=Path, default=Path("/tmp/torchrl_objectives_suite"),
                        help="where the JUnit XML reports and pytest logs go (default: %(default)s)")
    parser.add_argument("--only", choices=("plain", "patched"),
                        help="run one side only and compare with the other side's report already in --out")
    parser.add_argument("--timeout", type=int, help="per-test timeout in seconds (needs pytest-timeout)")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression")
    args, extra = parser.parse_known_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    if args.timeout:
        extra += [f"--timeout={args.timeout}"]
    if args.keyword:
        extra += ["-k", args.keyword]
    xml = {}
    for side in ("plain", "patched"):
        xml[side] = (_run(side, args.folder, args.files, args.out, extra) if args.only in (None, side)
                     else args.out / f"{side}.xml")
        if not xml[side].exists():
            parser.error(f"no {side} report at {xml[side]}: run without --only first")
    return _report(_outcomes(xml["plain"]), _outcomes(xml["patched"]))


if __name__ == "__main__":
    sys.exit(main())
