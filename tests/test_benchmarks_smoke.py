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


# --- the peer benchmark (bench_peers.py, report_peers.py) ---------------------------------------------------------

PEER_VARS = ("RL_TRITON_SRC", "RL_TRITON_TESTS", "PUFFERLIB_EXT")


@pytest.fixture(scope="module")
def peers():
    """bench_peers and report_peers importable in this process (they time Triton kernels)."""
    pytest.importorskip("triton", reason="the peer benchmark times Triton kernels")
    sys.path.insert(0, str(BENCH))
    import bench_peers
    import report_peers

    yield bench_peers, report_peers
    sys.path.remove(str(BENCH))


def run_bench_peers(*args):
    """``bench_peers.py --smoke *args`` in a subprocess, the peers' folders unset; asserts it succeeded."""
    env = {k: v for k, v in os.environ.items() if k not in PEER_VARS}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    result = subprocess.run([sys.executable, "bench_peers.py", "--smoke", *args], cwd=BENCH, capture_output=True,
                            text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.triton
def test_bench_peers_smoke(tmp_path):
    """The peer benchmark end to end on the CPU, peers absent: every algorithm of the release grid (with and without
    truncations) checked against float64 and timed, the cliff sweep, our kernels API's host rows, both first-call
    processes (an empty Triton cache, then the filled one), and the report with its summary per target."""
    run_bench_peers("--parts", "release,cliffs,host,first_call", "--release-shapes", "4x5", "--host-parts", "kernels",
                    "--out", str(tmp_path))
    rows = json.loads((tmp_path / "bench_peers.json").read_text())["rows"]
    ours = {(r["algorithm"], r["truncation"]): r for r in rows if r["part"] == "release" and r["impl"] == "ours"}
    with_flag = ("gae", "td_lambda", "vtrace", "discounted_return", "retrace_discrete")
    assert set(ours) == ({(a, t) for a in with_flag for t in ("with", "without")}
                         | {("eligibility_traces", "n/a"), ("episodic_prefix_sum", "n/a")})
    assert {r["status"] for r in ours.values()} == {"ok"}, [(k, r["status"]) for k, r in ours.items()]
    assert all(r["max_err"] < 1e-4 and r["full_call_us"] > 0 and r["wall_us"] > 0 for r in ours.values())
    peer_rows = [r for r in rows if r["part"] == "release" and r["impl"] == "rl_triton"]
    assert len(peer_rows) == 12 and all(r["status"].startswith("not available") for r in peer_rows)
    cliffs = [r for r in rows if r["part"] == "cliffs"]
    assert {(r["B"], r["T"]) for r in cliffs} == {(B, T) for B in (1, 3) for T in range(1, 6)}
    assert {r["status"] for r in cliffs} == {"ok"}
    host = {r["name"]: r for r in rows if r["part"] == "host"}
    assert {"gae", "retrace_discrete", "retrace_discrete_shifted", "td_lambda_advantage", "retrace",
            "linear_scan"} <= set(host)
    assert host["retrace_discrete_shifted"]["max_err"] < 1e-4  # its shifted mode, checked like the others
    assert {r["status"] for r in host.values()} == {"ok"}
    first = [r for r in rows if r["part"] == "first_call"]
    for cache in ("fresh", "warm"):
        calls = {r["name"]: r for r in first if r["cache"] == cache}
        assert set(calls) == {"process", *ours_algorithms()}, calls
        assert calls["process"]["import_package_s"] > 0 and all(r["status"] == "ok" for r in calls.values())
    md = (tmp_path / "bench_peers.md").read_text()
    assert "## Summary per target" in md and "| ? | (a) full call ≤ rl-triton, its release grid | 0 |" in md
    assert "## Cliffs (device time per element)" in md and "## First call" in md


@pytest.mark.triton
def test_bench_peers_variant(tmp_path):
    """``--variant`` runs our kernels under one of ablate_kernels.py's variants (here retrace_discrete's load per
    action and one warp per 128 steps), checked against float64 like main's, and says so in the JSON and report."""
    run_bench_peers("--parts", "release", "--release-shapes", "3x9", "--algorithms", "retrace_discrete,vtrace",
                    "--variant", "nogroup_warpst", "--out", str(tmp_path), "--name", "ab")
    data = json.loads((tmp_path / "ab.json").read_text())
    assert data["environment"]["variant"] == "nogroup_warpst"
    ours = [r for r in data["rows"] if r["impl"] == "ours"]
    assert len(ours) == 4 and {r["status"] for r in ours} == {"ok"} and all(r["max_err"] < 1e-4 for r in ours)
    assert "Variant: **nogroup_warpst**" in (tmp_path / "ab.md").read_text()


def ours_algorithms():
    return ("gae", "td_lambda", "vtrace", "discounted_return", "eligibility_traces", "episodic_prefix_sum",
            "retrace_discrete")


def test_bench_peers_host_functionals_and_modules(peers, tmp_path, monkeypatch):
    """The host part's TorchRL-signature functionals (each checked against TorchRL's function of the same name) and
    estimator modules (through bench_estimators.measure, checked against TorchRL's class), in this process."""
    bench_peers, _ = peers
    for k in PEER_VARS:
        monkeypatch.delenv(k, raising=False)
    bench_peers.main(["--smoke", "--parts", "host", "--host-parts", "functionals,modules", "--out", str(tmp_path),
                      "--no-report"])
    rows = json.loads((tmp_path / "bench_peers.json").read_text())["rows"]
    functionals = {r["name"]: r for r in rows if r.get("kind") == "functional"}
    assert set(functionals) == set(bench_peers.FUNCTIONALS)
    assert {r["status"] for r in functionals.values()} == {"ok"}, {k: r["status"] for k, r in functionals.items()}
    assert all(r["max_err"] < 1e-4 for r in functionals.values())
    modules = {r["name"]: r for r in rows if r.get("kind") == "estimator"}
    assert set(modules) == {"GAE", "TDLambdaEstimator", "VTrace"}
    assert {r["status"] for r in modules.values()} == {"ok"}, modules
    assert all(r["wall_us"] > 0 and r["torchrl_wall_us"] > 0 for r in modules.values())
    assert modules["VTrace"]["stubbed_wall_us"] > 0  # its floor, ours alone with the value functional stubbed


def test_peer_rollout_is_consistent(peers):
    """The rollout every peer reads: next values are the next step's values inside an episode, terminations and
    truncations exclusive, the edge cases drawn; without truncations every episode end is a termination."""
    bench_peers, _ = peers
    x = bench_peers.rollout(6, 9, seed=1, device="cpu")
    inside = ~x["done"][:, :-1]
    torch.testing.assert_close(x["nv"][:, :-1][inside], x["v"][:, 1:][inside])
    assert not (x["term"] & x["trunc"]).any() and torch.equal(x["done"], x["term"] | x["trunc"])
    assert x["trunc"][0, -1] and x["term"][1, -1] and x["trunc"][2, 1] and x["term"][2, 2]
    y = bench_peers.for_truncation(x, "without")
    assert torch.equal(y["term"], x["done"]) and not y["trunc"].any()


def test_peers_plan_counts_the_grids(peers):
    """--plan: rl-triton's 12 shapes x (5 algorithms with and without truncations + 2 without a flag), PufferLib's 3
    x 6, the cliff sweep's 9 B x 88 T; --quick fewer, and estimated shorter."""
    bench_peers, _ = peers
    Ts = bench_peers.cliff_Ts()
    assert Ts[:64] == list(range(1, 65)) and max(Ts) == 4096 and len(Ts) == 88
    assert {95, 96, 97} - set(Ts) == {95, 97} and {127, 129, 192, 3072, 4095} <= set(Ts) and 4097 not in Ts
    p = bench_peers.plan(bench_peers.parse_args(["--plan", "--budget-s", "420"]))["parts"]
    assert p["release"]["cells"] == 12 * (5 * 2 + 2) and p["pufferlib"]["cells"] == 18
    assert p["cliffs"]["cells"] == 9 * 88
    quick = bench_peers.plan(bench_peers.parse_args(["--plan", "--quick", "--budget-s", "420"]))
    full = bench_peers.plan(bench_peers.parse_args(["--plan", "--budget-s", "420"]))
    assert quick["total_s"] < full["total_s"] <= 420


def _rl_triton_snapshot():
    """rl-triton's extracted snapshot (src and tests), where this checkout has one: $RL_TRITON_SRC, else .peers/."""
    src = Path(os.environ["RL_TRITON_SRC"]) if os.environ.get("RL_TRITON_SRC") else ROOT / ".peers" / "rl_triton_src"
    for tests in (Path(os.environ.get("RL_TRITON_TESTS", "/nonexistent")), src.parent / "rl_triton_tests",
                  src.parent / "tests"):
        if (src / "rl_triton").is_dir() and (tests / "test_gae.py").exists():
            return src, tests
    return None


@pytest.mark.skipif(_rl_triton_snapshot() is None,
                    reason="rl-triton's snapshot is not here ($RL_TRITON_SRC or .peers/, with its tests/; CI has none)")
def test_peer_mapping_matches_rl_triton_references(peers):
    """Our inputs mapped onto rl-triton's API give, through rl-triton's own pure-torch references (imported from its
    snapshot), the numbers of our float64 references: every algorithm, with and without truncations. A mapping
    without the window's bootstrap fails the same check for every algorithm that bootstraps there."""
    bench_peers, _ = peers
    src, tests = _rl_triton_snapshot()
    saved_path, saved_modules = list(sys.path), set(sys.modules)
    try:
        rows = bench_peers.check_mapping(tests, src)
        assert len(rows) == 12 and all(r["ok"] for r in rows), [r["message"] for r in rows if not r["ok"]]
        wrong = {(r["algorithm"], r["truncation"]): r["ok"]
                 for r in bench_peers.check_mapping(tests, src, zero_window_bootstrap=True)}
        must_fail = [(a, t) for a in ("gae", "td_lambda", "vtrace") for t in ("with", "without")]
        assert not any(wrong[k] for k in must_fail + [("discounted_return", "with")]), wrong
    finally:
        sys.path[:] = saved_path
        for name in set(sys.modules) - saved_modules:
            del sys.modules[name]


def _peer_row(part, algo, impl, B, T, truncation="with", **timings):
    return {"part": part, "algorithm": algo, "impl": impl, "B": B, "T": T, "truncation": truncation,
            "dtype": "float32", "status": timings.pop("status", "ok"), **timings}


def test_report_peers_judges_each_target(peers, tmp_path):
    """The summary: a cell meets (a) and misses (b); a cell where rl-triton's check failed is not judged and has no
    ratio; a cell where ours failed misses; host bounds per function; the floor exemption of the cliff rule; the
    first-call bounds."""
    _, report_peers = peers
    rows = [
        _peer_row("release", "gae", "ours", 4096, 128, full_call_us=10.0, graph_us=4.0, device_us=6.0),
        _peer_row("release", "gae", "rl_triton", 4096, 128, full_call_us=40.0, graph_us=3.0, device_us=7.0),
        _peer_row("release", "vtrace", "ours", 4096, 128, full_call_us=10.0, graph_us=4.0, device_us=6.0),
        _peer_row("release", "vtrace", "rl_triton", 4096, 128, status="wrong: rl-triton vs float64 output 0"),
        _peer_row("release", "td_lambda", "ours", 4096, 128, status="wrong: ours vs float64 output 0"),
        _peer_row("release", "td_lambda", "rl_triton", 4096, 128, full_call_us=40.0, graph_us=3.0, device_us=7.0),
        {"part": "host", "kind": "kernels", "name": "retrace_discrete", "B": 4096, "T": 128, "status": "ok",
         "wall_us": 14.0},
        {"part": "host", "kind": "kernels", "name": "gae", "B": 4096, "T": 128, "status": "ok", "wall_us": 11.0},
        {"part": "first_call", "cache": "fresh", "name": "gae", "B": 4096, "T": 128, "status": "ok",
         "first_call_s": 0.25},
        {"part": "first_call", "cache": "warm", "name": "gae", "B": 4096, "T": 128, "status": "ok",
         "first_call_s": 0.03},
    ]
    # cliffs at B = 4096: T = 129 padded to the next power's time (a cliff); at B = 1 every cell at the floor, so
    # T = 3 and 5 exceed the per-element rule alone
    for T, us in ((128, 10.0), (129, 20.0), (256, 20.0)):
        rows.append(_peer_row("cliffs", "gae", "ours", 4096, T, device_us=us))
    for T in (2, 3, 4, 5, 8):
        rows.append(_peer_row("cliffs", "gae", "ours", 1, T, device_us=5.0))
    path = tmp_path / "synthetic.json"
    path.write_text(json.dumps({"environment": {"device": "cuda", "gpu": "NVIDIA H200", "peers": {}}, "rows": rows}))
    text = report_peers.write_report(path).read_text()
    assert ("| ✗ | (a) full call ≤ rl-triton, its release grid | 2 | 1 | 1 | 1 rl-triton wrong | "
            "td_lambda 4096x128 with: ours wrong: ours vs float64 output 0 |") in text
    assert "| ✗ | (b) device (50-call graph) ≤ rl-triton, release grid | 2 | 0 | 2 | 1 rl-triton wrong |" in text
    assert "| with | 4096 | 128 | 10.00 | 40.00 | 0.25 | 4.00 | 3.00 | 1.33 |" in text
    assert "| with | 4096 | 128 | 10.00 | - | - | 4.00 | - | - |" in text  # vtrace: no ratio against a wrong peer
    assert "| ✗ | (c) kernels API bare call ≤ 10 µs (retrace_discrete ≤ 15 µs), 4096x128 | 2 | 1 | 1 | 0 | gae: 11.00" \
        in text
    assert "| ✗ | (d) no cliffs (per-element device time, ≤ 1.25x the powers of two around T) | 3 | 2 | 1 | 0 | " \
           "gae ours B=4096 T=129: 1.98x | 3 of 3 by the per-element condition alone |" in text
    assert "| ✓ | (e) first call ≤ 300 ms, fresh Triton cache, 4096x128 | 1 | 1 | 0 |" in text
    assert "| ✗ | (e) first call ≤ 20 ms, warm Triton cache, 4096x128 | 1 | 0 | 1 |" in text


@pytest.mark.triton
def test_first_call_host_smoke(tmp_path):
    """benchmarks/first_call_host.py with one process per configuration: both rows, the profiled Triton hash."""
    _run(["first_call_host.py", "--setup-s", "0", "--repeats", "1", "--out", str(tmp_path)], tmp_path)
    data = json.loads((tmp_path / "first_call_host.json").read_text())
    assert [r["prewarm"] for r in data["rows"]] == [False, True]
    assert all(r["first_call_ms"] > 0 for r in data["rows"])
    assert data["environment"]["triton_key_ms (profiled, no prewarm)"] > 0


@pytest.mark.parametrize("differs", [False, True], ids=["clean", "changed"])
def test_environment_marks_a_tree_that_differs_from_its_commit(differs, monkeypatch):
    """``environment()["commit"]``: git's HEAD, with ``-dirty`` where tracked files differ from it (a GPU machine's copy
    of the tree under stale git metadata named code that did not run); ``BENCH_COMMIT`` overrides both."""
    sys.path.insert(0, str(BENCH))
    try:
        import _common
    finally:
        sys.path.remove(str(BENCH))

    def run(cmd, **kwargs):
        out = "abc1234\n" if cmd[1] == "rev-parse" else ""
        return subprocess.CompletedProcess(cmd, int(differs and cmd[1] == "diff"), stdout=out, stderr="")

    monkeypatch.setattr(_common.subprocess, "run", run)
    monkeypatch.delenv("BENCH_COMMIT", raising=False)
    assert _common.environment()["commit"] == ("abc1234-dirty" if differs else "abc1234")
    monkeypatch.setenv("BENCH_COMMIT", "fedcba9")
    assert _common.environment()["commit"] == "fedcba9"


def test_ncu_summary_reads_a_committed_report():
    """``tools/ncu_summary.py`` on a committed ncu report: one row per profiled kernel, labelled shapes x algorithms
    in the order the profiled script ran them, every metric read."""
    report = BENCH / "results" / "h200" / "ncu_float32.txt"
    result = subprocess.run([sys.executable, str(ROOT / "tools" / "ncu_summary.py"), str(report), "--shapes",
                             "65536x512", "--algorithms", "gae,td_lambda,vtrace,retrace,discounted_return,"
                             "eligibility_traces,episodic_prefix_sum"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    rows = [ln.split(" | ") for ln in result.stdout.splitlines()[2:]]
    assert [r[0].lstrip("| ") for r in rows][:2] == ["gae 65536x512", "td_lambda 65536x512"] and len(rows) == 7
    assert rows[0][1] == "_gae_fwd_kernel" and "-" not in rows[0][3:9], rows[0]


@pytest.mark.triton
def test_proto_lookback_smoke(tmp_path):
    """benchmarks/proto_lookback.py: the two-pass and the persistent look-back prototypes, forward and reverse,
    several groups or chunks per row, checked against the float64 torch path (the script marks a wrong result),
    then reported."""
    _run(["proto_lookback.py", "--smoke", "--out", str(tmp_path)], tmp_path)
    rows = json.loads((tmp_path / "proto_lookback.json").read_text())["rows"]
    protos = [r for r in rows if r["impl"].startswith(("two-pass", "persistent"))]
    assert len(protos) == 16 and {r["status"] for r in rows} == {"ok"}
    assert max(r["err"] for r in protos) < 1e-5


@pytest.mark.triton
def test_proto_reverse_smoke(tmp_path):
    """benchmarks/proto_reverse.py: the discounted return and GAE's shifted mode in each of the four reverse-scan
    schemes and the package's functions, one-row tiles and rows of 128 steps four to a program, each right against
    the float64 torch path."""
    _run(["proto_reverse.py", "--smoke", "--out", str(tmp_path)], tmp_path)
    rows = json.loads((tmp_path / "proto_reverse.json").read_text())["rows"]
    assert len(rows) == 4 * 2 * 5 and all(r["ok"] for r in rows), [r for r in rows if not r["ok"]]
    assert {r["impl"] for r in rows} == {"rev", "addr", "flip4", "gather", "package"}


def test_failure_log_keeps_each_failure_as_it_happens(tmp_path, monkeypatch):
    """``$PYTEST_FAILURE_LOG`` (``h200_session.sh``'s whole-suite step sets it): conftest appends each failure's
    traceback at once, in the reporting process only, and nothing for a pass or without the variable."""
    import types

    import conftest

    log = tmp_path / "failures.log"
    failed = types.SimpleNamespace(failed=True, nodeid="tests/test_x.py::test_y[GAE]", when="call",
                                   longreprtext="Traceback ...\nAssertionError: advantage differs")
    passed = types.SimpleNamespace(failed=False, nodeid="tests/test_x.py::test_z", when="call", longreprtext="")
    monkeypatch.delenv("PYTEST_XDIST_WORKER", raising=False)
    monkeypatch.delenv("PYTEST_FAILURE_LOG", raising=False)
    conftest.pytest_runtest_logreport(failed)
    assert not log.exists()
    monkeypatch.setenv("PYTEST_FAILURE_LOG", str(log))
    conftest.pytest_runtest_logreport(passed)
    conftest.pytest_runtest_logreport(failed)
    monkeypatch.setenv("PYTEST_XDIST_WORKER", "gw3")  # a worker: its controller writes the same report
    conftest.pytest_runtest_logreport(failed)
    text = log.read_text()
    assert text.count("==== ") == 1 and "test_y[GAE] (call)" in text and "advantage differs" in text


@pytest.mark.skipif(not torch.cuda.is_available(), reason="times replayed launches through the CUDA driver")
def test_host_floor_smoke(tmp_path):
    """benchmarks/host_floor.py: every piece of a replayed call timed (the C++ extension's among them), every
    algorithm replayed in C++, in Python and not at all."""
    _run(["host_floor.py", "--calls", "50", "--out", str(tmp_path)], tmp_path)
    rows = json.loads((tmp_path / "host_floor.json").read_text())["rows"]
    assert {r["part"] for r in rows} == {"piece", "algorithm"}
    assert all(r["us"] > 0 for r in rows if r["part"] == "piece")
    assert any(r["what"] == "gae, replayed in C++ (the whole call)" for r in rows), "no call made in C++"
    assert all(r["c_us"] > 0 and r["replay_us"] > 0 and r["plain_us"] > 0 for r in rows if r["part"] == "algorithm")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="profiles a first launch on the GPU")
def test_profile_first_call_smoke(tmp_path):
    """benchmarks/profile_first_call.py: a cold then a warm process (the same Triton cache), the profile shown."""
    cache = tmp_path / "triton_cache"
    env = {**os.environ, "TRITON_CACHE_DIR": str(cache),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    for args in ([], ["--show", "--B", "64", "--T", "16"]):
        out = subprocess.run([sys.executable, "profile_first_call.py", "--B", "64", "--T", "16", *args], cwd=BENCH,
                             capture_output=True, text=True, timeout=600, env=env)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "first gae call (profiled)" in out.stdout
    assert "cumulative" in out.stdout


def _bench_json(rows):
    """A pytest-benchmark ``--benchmark-json`` file's content: ``rows`` maps a test name to (mean, median) in s."""
    return {"version": "5.3.1", "benchmarks": [
        {"name": name, "fullname": f"test_objectives_benchmarks.py::{name}",
         "stats": {"mean": mean, "median": median, "min": median / 2, "max": mean * 2, "stddev": 0.0, "rounds": 50,
                   "iterations": 1}} for name, (mean, median) in rows.items()]}


def test_torchrl_objectives_bench_report():
    """benchmarks/torchrl_objectives_bench.py's pure functions on fake pytest-benchmark output, two sides and two
    rounds: the mean over rounds of each round's mean and median, ratios plain/patched, verdicts by mean, a row that
    failed patched, the counts line (neither pytest-benchmark nor TorchRL's benchmark file needed)."""
    sys.path.insert(0, str(BENCH))
    try:
        import torchrl_objectives_bench as tob
    finally:
        sys.path.remove(str(BENCH))
    output = ("....F\nFAILED test_objectives_benchmarks.py::test_c[x] - RuntimeError: shape mismatch\n"
              "ERROR test_objectives_benchmarks.py - ImportError: no module\n")
    failed, errors = tob.parse_failures(output)
    assert failed == {"test_c[x]": "FAILED: RuntimeError: shape mismatch"} and errors == [
        "test_objectives_benchmarks.py: ERROR: ImportError: no module"]
    plain = {"test_a[x]": (2e-3, 2e-3), "test_b[x]": (1e-3, 1e-3), "test_c[x]": (5e-3, 5e-3), "test_d[x]": (1e-4, 1e-4)}
    patched = [{"test_a[x]": (1e-3, 1e-3), "test_b[x]": (2e-3, 5e-4), "test_c[x]": (1e-3, 1e-3),
                "test_d[x]": (2.5e-4, 2.5e-4)},
               {"test_a[x]": (6e-4, 1e-3), "test_b[x]": (2e-3, 5e-4), "test_d[x]": (2.5e-4, 2.5e-4)}]
    runs = []
    for r in (1, 2):
        runs.append({"side": "plain", "round": r, "status": "ok", "wall_s": 1.0,
                     "rows": tob.parse_benchmark_json(_bench_json(plain)), "failed_rows": {}, "errors": []})
        runs.append({"side": "patched", "round": r, "status": "ok" if r == 1 else "exit 1", "wall_s": 1.0,
                     "rows": tob.parse_benchmark_json(_bench_json(patched[r - 1])),
                     "failed_rows": {} if r == 1 else failed, "errors": []})
    assert runs[0]["rows"]["test_a[x]"] == {"mean": 2e-3, "median": 2e-3, "min": 1e-3, "max": 4e-3, "stddev": 0.0,
                                            "rounds": 50, "iterations": 1}
    results = {"environment": {"torch": "x"}, "keyword": tob.DEFAULT_K, "sides": ["plain", "patched"], "rounds": 2,
               "runs": runs}
    md = tob.markdown(results)
    # test_c failed in one of the two patched rounds: measured by the other, listed as failed
    assert "**patched faster than plain: 2 of 4 rows by mean, 3 of 4 by median** (4 rows; 1 failed on patched, 0 " \
           "on plain); rows other than the control rows slower beyond noise (outside the control rows' band and " \
           "the row's own A/A spread): " in md
    assert "| `test_a[x]` | 2.00 ms | 800 µs | 2.50x | 2.00x | faster |" in md  # round means 1 ms and 0.6 ms
    assert "| `test_b[x]` | 1.00 ms | 2.00 ms | 0.500x | 2.00x | slower |" in md  # slower by mean, faster by median
    assert "| `test_c[x]` | 5.00 ms | 1.00 ms (1 of 2 rounds failed) | 5.00x | 5.00x | faster |" in md
    assert "| `test_d[x]` | 100 µs | 250 µs | 0.400x | 0.400x | slower |" in md
    assert "| `test_c[x]` | patched | 2 | FAILED: RuntimeError: shape mismatch |" in md
    # a row that failed in every round of a side: no time, no ratio
    results["runs"] = [runs[0], {**runs[3], "rows": {k: v for k, v in runs[3]["rows"].items() if k != "test_c[x]"}}]
    md = tob.markdown(results)
    assert "| `test_c[x]` | 5.00 ms | failed | - | - | failed on patched |" in md
    assert "**patched faster than plain: 1 of 3 rows by mean, 2 of 3 by median**" in md
    assert [tob.fmt_time(s) for s in (1.2345, 0.0123, 9.996e-4, 5.12e-7, None)] == [
        "1230 ms", "12.3 ms", "1.00 ms", "0.512 µs", "-"]


def test_torchrl_objectives_bench_noise_band():
    """The control rows (never reaching an estimator) set the band of ratios the spread between processes reaches;
    another row inside it is marked "within noise", one outside it is not, and the report says so."""
    sys.path.insert(0, str(BENCH))
    try:
        import torchrl_objectives_bench as tob
    finally:
        sys.path.remove(str(BENCH))
    plain = {"test_value_transform_speed[x]": (1e-3, 1e-3), "test_dreamer_v3_value_speed[x]": (1e-3, 1e-3),
             "test_dqn_speed[x]": (1e-3, 1e-3), "test_values[x]": (1e-3, 1e-3)}
    patched = {"test_value_transform_speed[x]": (1.25e-3, 1.25e-3), "test_dreamer_v3_value_speed[x]": (0.9e-3, 0.9e-3),
               "test_dqn_speed[x]": (1.1e-3, 1.1e-3), "test_values[x]": (0.5e-3, 0.5e-3)}
    runs = [{"side": side, "round": 1, "status": "ok", "wall_s": 1.0, "rows": tob.parse_benchmark_json(_bench_json(rows)),
             "failed_rows": {}, "errors": []} for side, rows in (("plain", plain), ("patched", patched))]
    results = {"environment": {}, "keyword": tob.DEFAULT_K, "sides": ["plain", "patched"], "rounds": 1, "runs": runs}
    verdicts = {e["row"]: e["sides"]["patched"]["verdict"] for e in tob.summarize(results)}
    assert verdicts == {"test_value_transform_speed[x]": "slower", "test_dreamer_v3_value_speed[x]": "faster",
                        "test_dqn_speed[x]": "slower, within noise", "test_values[x]": "faster"}
    assert tob.noise_band(tob.summarize(results), "patched") == pytest.approx((0.8, 1 / 0.9))
    assert "plain/patched 0.800-1.11x by mean (1.0 included), the spread between processes; 1 other rows lie " \
           "within it" in tob.markdown(results)


_PAIRED_STAND_IN = """
import json, os
import pytest
from torchrl.objectives.value.functional import td0_return_estimate
import rl_triton_torchrl.patch as patch

OUT = os.environ["PAIRED_OUT"]

def _record(name, fn):
    with open(OUT, "a") as f:
        f.write(json.dumps([name, patch.is_patched(), fn.__module__, td0_return_estimate.__module__]) + "\\n")

@pytest.mark.parametrize("val_fn", [td0_return_estimate])
@pytest.mark.parametrize("flag", [False, True])
def test_values(val_fn, flag, request):
    _record(request.node.name, val_fn)

def test_loss_speed(request):
    _record(request.node.name, td0_return_estimate)
"""


def test_torchrl_objectives_bench_paired(tmp_path):
    """``--paired``'s plugin on a stand-in of TorchRL's benchmark file: every row twice, ``-PLAIN`` / ``-PATCHED``
    last in its id, the two side by side with the first side alternating; a PATCHED row runs with TorchRL patched,
    the module's functionals and a parametrized TorchRL functional ours, a PLAIN row with none of it (restored after
    each row); ``split_run`` makes the two sides' records."""
    pytest.importorskip("torchrl")
    sys.path.insert(0, str(BENCH))
    try:
        import torchrl_objectives_bench as tob
    finally:
        sys.path.remove(str(BENCH))
    (tmp_path / tob.TEST_FILE).write_text(_PAIRED_STAND_IN)
    out = tmp_path / "rows.jsonl"
    env = {**os.environ, "PAIRED_OUT": str(out), "RL_TRITON_TORCHRL_BENCH_PATCH": "paired",
           "PYTHONPATH": os.pathsep.join(filter(None, [str(BENCH), str(ROOT), os.environ.get("PYTHONPATH")]))}
    result = subprocess.run([sys.executable, "-m", "pytest", tob.TEST_FILE, "-q", "-p", "no:cacheprovider",
                             "-p", "torchrl_objectives_bench", "-p", "no:randomly", "-k", "values[True or speed"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stdout + result.stderr
    rows = [json.loads(line) for line in out.read_text().splitlines()]
    ours, theirs = "rl_triton_torchrl.functional", "torchrl.objectives.value.functional"
    assert rows == [["test_values[True-td0_return_estimate-PLAIN]", False, theirs, theirs],
                    ["test_values[True-td0_return_estimate-PATCHED]", True, ours, ours],
                    ["test_values[True-td0_return_estimate-PLAIN2]", False, theirs, theirs],
                    ["test_loss_speed[PATCHED]", True, ours, ours],
                    ["test_loss_speed[PLAIN2]", False, theirs, theirs],
                    ["test_loss_speed[PLAIN]", False, theirs, theirs]]
    assert tob.split_paired("test_values[True-td0_return_estimate-PATCHED]") == ("test_values[True-td0_return_estimate]", "patched")
    assert tob.split_paired("test_loss_speed[PLAIN]") == ("test_loss_speed", "plain")
    assert tob.split_paired("test_values[x]") == ("test_values[x]", None)
    assert tob.split_paired("test_loss_speed[PLAIN2]") == ("test_loss_speed", "plain2")
    record = {"side": "paired", "round": 1, "status": "ok", "rows": {"test_a[x-PLAIN]": 1, "test_a[x-PATCHED]": 2,
                                                                     "test_a[x-PLAIN2]": 3},
              "failed_rows": {"test_b[PATCHED]": "FAILED"}, "errors": []}
    plain, patched, plain2 = tob.split_run(record)
    assert (plain["side"], plain["rows"], plain["failed_rows"]) == ("plain", {"test_a[x]": 1}, {})
    assert (patched["side"], patched["rows"], patched["failed_rows"]) == ("patched", {"test_a[x]": 2},
                                                                          {"test_b": "FAILED"})
    assert (plain2["side"], plain2["rows"], plain2["failed_rows"]) == ("plain2", {"test_a[x]": 3}, {})


def test_torchrl_objectives_bench_aa_spread():
    """Paired mode's A/A run (plain2): a patched row whose ratio lies within its own plain/plain2 spread (either
    way) is marked so and not counted as slower beyond noise; one outside it is."""
    sys.path.insert(0, str(BENCH))
    try:
        import torchrl_objectives_bench as tob
    finally:
        sys.path.remove(str(BENCH))
    sides = {"plain": {"test_dqn_speed[x]": 1.0, "test_ppo_speed[x]": 1.0, "test_values[x]": 1.0},
             "patched": {"test_dqn_speed[x]": 1.1, "test_ppo_speed[x]": 1.3, "test_values[x]": 0.5},
             "plain2": {"test_dqn_speed[x]": 0.85, "test_ppo_speed[x]": 1.05, "test_values[x]": 1.0}}
    runs = [{"side": side, "round": 1, "status": "ok", "wall_s": 1.0, "failed_rows": {}, "errors": [],
             "rows": tob.parse_benchmark_json(_bench_json({k: (v * 1e-3, v * 1e-3) for k, v in rows.items()}))}
            for side, rows in sides.items()]
    results = {"environment": {}, "keyword": tob.DEFAULT_K, "sides": list(sides), "rounds": 1, "runs": runs,
               "paired": True}
    summary = tob.summarize(results)
    verdicts = {e["row"]: e["sides"]["patched"]["verdict"] for e in summary}
    assert verdicts == {"test_dqn_speed[x]": "slower, within its A/A spread", "test_ppo_speed[x]": "slower",
                        "test_values[x]": "faster"}
    assert {e["sides"]["plain2"]["verdict"] for e in summary} == {"A/A"}
    assert tob.counts(summary, "patched")["slower_beyond_noise"] == 1
    report = tob.markdown(results)
    assert "slower beyond noise (outside the control rows' band and the row's own A/A spread): 1." in report
    assert tob.counts(tob.summarize({**results, "runs": [
        {**run, "rows": {f"test_dreamer_v3_value_speed{k[len('test_ppo_speed'):]}" if k.startswith("test_ppo") else k: v
                         for k, v in run["rows"].items()}} for run in runs]}), "patched")["slower_beyond_noise"] == 0
    assert "plain/plain2 (mean)" in report and "**plain2 faster" not in report


def test_torchrl_objectives_bench_help(tmp_path):
    result = _run(["torchrl_objectives_bench.py", "--help"], tmp_path)
    assert "test_values or test_gae_speed or speed[False" in result.stdout and "--fresh-triton-cache" in result.stdout
