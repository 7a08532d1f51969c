"""The benchmark scripts run (a tiny CPU smoke; the real numbers come from the GPU machine)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"


def _run(args, tmp_path):
    result = subprocess.run([sys.executable, *args], cwd=BENCH, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


def test_bench_cpu_quick(tmp_path):
    _run(["bench_cpu.py", "--quick", "--out", str(tmp_path)], tmp_path)
    rows = json.loads((tmp_path / "bench_cpu.json").read_text())["rows"]
    assert rows and all(r["ours_torch_ms"] is not None for r in rows)
    assert (tmp_path / "bench_cpu.md").exists()


def test_bench_kernels_tiny(tmp_path):
    """Without a GPU the kernels run through Triton's interpreter (the env of the subprocess inherits it)."""
    _run(["bench_kernels.py", "--algos", "gae,vtrace", "--B", "2", "--T", "3", "--impls", "ours_triton,torchrl_loop",
          "--out", str(tmp_path)], tmp_path)
    rows = json.loads((tmp_path / "bench_kernels.json").read_text())["rows"]
    assert {r["status"] for r in rows} == {"ok"}


def test_bench_sb3_quick(tmp_path):
    pytest.importorskip("stable_baselines3")
    _run(["bench_sb3.py", "--quick", "--out", str(tmp_path)], tmp_path)
    assert (tmp_path / "bench_sb3.json").exists()
