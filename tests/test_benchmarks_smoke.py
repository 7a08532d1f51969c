"""The benchmark scripts run (a tiny CPU smoke; the real numbers come from the GPU machine)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "benchmarks"


def _run(args, tmp_path):
    # the package from this checkout, whatever is installed
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, *args], cwd=BENCH, capture_output=True, text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    return result


@pytest.fixture(scope="module")
def bench_modules():
    """benchmarks/ importable in this process (its modules import each other by name; they need Triton)."""
    pytest.importorskip("triton", reason="the kernel benchmarks time Triton kernels")
    sys.path.insert(0, str(BENCH))
    import baselines
    import bench_kernels
    import report

    yield baselines, bench_kernels, report
    sys.path.remove(str(BENCH))


def test_bench_cpu_quick(tmp_path):
    _run(["bench_cpu.py", "--quick", "--out", str(tmp_path)], tmp_path)
    rows = json.loads((tmp_path / "bench_cpu.json").read_text())["rows"]
    assert rows and all(r["ours_torch_ms"] is not None for r in rows)
    assert (tmp_path / "bench_cpu.md").exists()


@pytest.mark.triton
def test_sweep_configs_smoke(tmp_path):
    """The launch-configuration sweep: every configuration checked against float64, then timed and reported."""
    _run(["sweep_configs.py", "--smoke", "--preset", "short", "--algorithms", "gae", "--out", str(tmp_path),
          "--name", "sweep"], tmp_path)
    data = json.loads((tmp_path / "sweep.json").read_text())
    assert data["all"] and {r["status"] for r in data["all"]} == {"ok"}
    assert len(data["rows"]) == 1 and "best configuration" in (tmp_path / "sweep.md").read_text()


@pytest.mark.triton
def test_bench_kernels_tiny(tmp_path):
    """Every implementation end to end: Triton through its interpreter, both compiled scans (traced by dynamo, run
    by the eager backend to keep this fast), TorchRL; checked, timed, reported with plots."""
    result = _run(["bench_kernels.py", "--algorithms", "gae", "--B", "2", "--T", "3", "--dtypes", "float32",
                   "--truncation", "with,without", "--compile-backend", "eager", "--max-call-ms", "1e9",
                   "--out", str(tmp_path)], tmp_path)
    data = json.loads((tmp_path / "bench_kernels.json").read_text())
    rows = data["rows"]
    impls = {"ours_triton", "ours_torch", "doubling", "assoc_scan", "torchrl_vec", "torchrl_loop"}
    assert {(r["impl"], r["truncation"]) for r in rows} == {(i, t) for i in impls for t in ("with", "without")}
    assert {r["status"] for r in rows} == {"ok"}, [(r["impl"], r["status"]) for r in rows if r["status"] != "ok"]
    # one graph per compiled scan for T = 3 and the reverse direction, shared by both truncation settings
    assert sum(r.get("compiles", 0) for r in rows) == data["environment"]["timing"]["graphs"] == 2
    assert rows[0]["bytes"] == 2 * 3 * (5 * 4 + 2) and rows[-1]["bytes"] == 2 * 3 * (5 * 4 + 1)
    assert "plan: " in result.stdout
    md = (tmp_path / "bench_kernels.md").read_text()
    assert "## Targets (ours)" in md and "## gae, float32, without truncations" in md
    assert {p.name for p in tmp_path.glob("*.png")} >= {"bench_kernels_time_float32.png",
                                                         "bench_kernels_speedup_doubling_float32.png"}


def test_bench_sb3_quick(tmp_path):
    pytest.importorskip("stable_baselines3")
    _run(["bench_sb3.py", "--quick", "--out", str(tmp_path)], tmp_path)
    assert (tmp_path / "bench_sb3.json").exists()


@pytest.mark.parametrize("T", [1, 2, 5, 8, 33])
@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_baseline_scans_match_torch_path(bench_modules, T, reverse):
    """The benchmark's doubling and associative_scan baselines (eager here) solve the same recurrence as our torch
    scan, entering state included."""
    baselines, _, _ = bench_modules
    from rl_triton_torchrl.kernels.scan import torch_linear_scan

    g = torch.Generator().manual_seed(T)
    a, b, h0 = torch.rand(3, T, generator=g), torch.randn(3, T, generator=g), torch.randn(3, generator=g)
    a[0, T // 2] = 0.0  # an episode boundary
    want, want_last = torch_linear_scan(a.double(), b.double(), h0.double(), reverse)
    for scan in (baselines.doubling_scan, baselines.hop_scan("cpu")):
        A, B = scan(a, b, reverse)
        torch.testing.assert_close(torch.addcmul(B, A, h0[:, None]).double(), want, rtol=1e-5, atol=1e-5)


def test_swapped_scan_restores(bench_modules):
    """Inside ``swapped_scan`` the torch path calls the replacement; afterwards the package's own scan again."""
    baselines, _, _ = bench_modules
    from rl_triton_torchrl import kernels as K

    scan_module = sys.modules["rl_triton_torchrl.kernels.scan"]
    original = scan_module.torch_linear_scan
    replacement = baselines.make_scan("doubling", "cpu", backend="eager")
    r, v, nv = (torch.randn(2, 5, 1) for _ in range(3))
    d = torch.rand(2, 5, 1) < 0.3
    with baselines.swapped_scan(replacement):
        assert scan_module.torch_linear_scan is replacement
        adv, _ = K.gae(r, v, nv, d, gamma=0.9, lmbda=0.8, backend="torch")
    assert replacement.calls == 1 and scan_module.torch_linear_scan is original
    torch.testing.assert_close(adv, K.gae(r, v, nv, d, gamma=0.9, lmbda=0.8, backend="torch")[0])


def test_plan_counts_the_default_grid(bench_modules):
    """--plan: 24 shapes x (4 algorithms with and without truncations + 3 without a terminated flag) x 2 dtypes; one
    compiled graph per T, direction, batch-of-one and compiled scan."""
    _, bench_kernels, _ = bench_modules
    p = bench_kernels.plan(bench_kernels.parse_args(["--plan"]))
    assert p["cells"] == 24 * 2 * 2 and p["algorithm_cells"] == 24 * (4 * 2 + 3) * 2
    assert p["torch_compile_graphs"] == (7 + 2) * 2 * 2
    quick = bench_kernels.plan(bench_kernels.parse_args(["--plan", "--quick"]))
    assert quick["algorithm_cells"] == 5 * 3 and quick["total_s"] < p["total_s"]


def test_report_reads_the_previous_format(bench_modules, tmp_path):
    """Rows of the earlier bench_kernels.py (no truncation field, no empty-kernel time) still report."""
    _, _, report = bench_modules
    env = {"gpu": "NVIDIA H200", "copy_bandwidth_GBps": 4273.0, "sweeps": []}
    rows = [{"algorithm": "gae", "impl": "ours_triton", "B": 4096, "T": 32, "dtype": "float32", "bytes": 2883584,
             "limit_us": 0.675, "status": "ok", "device_us": 6.88, "device_timing": "graph", "graph_us": 2.6,
             "wall_us": 166.0, "bw_fraction": 0.098},
            {"algorithm": "gae", "impl": "torchrl_vec", "B": 4096, "T": 32, "dtype": "float32", "bytes": 2883584,
             "limit_us": 0.675, "status": "ok", "device_us": 692.0, "device_timing": "direct", "wall_us": 708.0,
             "bw_fraction": 0.001, "ours_speedup": 100.6}]
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"environment": env, "rows": rows}))
    text = report.write_report(path, with_plots=False).read_text()
    assert ("| GAE at 4096 x 128 and 4096 x 32: ≤ 5 µs device time | 1 | 0 | gae 4096x32 float32 with (6.88 µs) |"
            in text)
    assert "not evaluated: this run has no empty-kernel measurement" in text
    assert "| 4096 | 32 | 6.88 | - | 0.68 | 10.2 | 10% | 166 | 692 (101x) | ✗ ≤5 µs: 6.88 µs |" in text


def test_report_judges_small_gae_on_kernel_time(bench_modules, tmp_path):
    """With the kernel's own duration measured, the ≤ 5 µs target reads it, and says both times."""
    _, _, report = bench_modules
    env = {"gpu": "NVIDIA H200", "copy_bandwidth_GBps": 4273.0, "empty_kernel_us": 3.9}
    rows = [{"algorithm": "gae", "impl": "ours_triton", "B": 4096, "T": 32, "dtype": "float32", "truncation": "with",
             "bytes": 2883584, "limit_us": 0.675, "status": "ok", "device_us": 7.0, "kernel_us": 3.5,
             "device_timing": "graph", "graph_us": 2.6, "wall_us": 60.0, "bw_fraction": 0.096}]
    path = tmp_path / "new.json"
    path.write_text(json.dumps({"environment": env, "rows": rows}))
    text = report.write_report(path, with_plots=False).read_text()
    assert "| 4096 | 32 | 7.00 | 3.50 | 0.68 |" in text
    assert "✓ ≤5 µs: kernel 3.50 µs (one-call graph 7.00 µs)" in text
