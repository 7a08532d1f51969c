"""Peer benchmark: our kernels against rl-triton and PufferLib 3.0's CUDA advantage kernel (project issue 17).

    python benchmarks/bench_peers.py --plan          # each part's cells and estimated time; runs nothing
    RL_TRITON_SRC=$PWD/.peers/rl_triton_src PUFFERLIB_EXT=$PWD/.peers/pufferlib \\
        python benchmarks/bench_peers.py --budget-s 420   # the GPU run (about 4 minutes on an H200)
    python benchmarks/bench_peers.py --quick         # fewer cells in every part (about 2.5 minutes)
    python benchmarks/bench_peers.py --smoke         # CPU: tiny sizes, ours through Triton's interpreter
    RL_TRITON_SRC=/tmp/rl-triton/src python benchmarks/bench_peers.py --check-mapping   # CPU: see below
    python benchmarks/bench_peers.py --extract-peers .peers --rl-triton-mirror DIR      # put the peers in place
    python benchmarks/bench_peers.py --parts release --variant warpst --name bench_peers_warpst   # an A/B of ours

Peers, both optional and loaded from local folders (neither project's code is part of this repository):

- rl-triton (simonsays1980/rl-triton, pure Python + Triton): ``$RL_TRITON_SRC`` is a folder holding its
  ``rl_triton/`` package (the snapshot's ``src/``). Its commit is read from ``$RL_TRITON_COMMIT``, else from the
  ``SOURCE.json`` that ``--extract-peers`` writes beside the package.
- PufferLib 3.0.0's advantage kernel, a C++ torch op with one CUDA thread per row: ``$PUFFERLIB_EXT`` is a folder
  holding the sdist's ``pufferlib.cpp`` and ``pufferlib.cu``. They are JIT-built with
  ``torch.utils.cpp_extension.load`` (build directory under /tmp, ``CUDA_HOME`` and ``TORCH_CUDA_ARCH_LIST`` set
  for the GPU found, a retry with ``-allow-unsupported-compiler``) in a background process while part 1 runs.

A missing peer's rows say "not available: <why>" and the rest runs.

Parts (``--parts``, run in this order; the times are the plan's estimates on an H200 from the previous session's
numbers: our kernels 2-20 us per call, rl-triton 38-140 us per full call, 0.2-1.4 s to compile one of our kernels
with an empty cache; about 3.5 minutes in all with 15 s of start-up; ``--plan`` prints them for the arguments
given):

1. ``release`` (about 100 s, most of it compiling about 24 of our kernels and 60 of rl-triton's): rl-triton's
   release grid, B x T in 64x512, 128x1024, 256x1024, 512x2048, 512x4096, 512x128, 512x512, 4096x128, 4096x512,
   4096x2048, 16384x128, 16384x512; all seven algorithms (GAE, TD(lambda), V-trace, discounted return, eligibility
   traces, episodic prefix sum, Retrace in its discrete-action form: ours ``retrace_discrete``, 4 actions), with
   truncations and without (the same episode ends, all terminations); float32; ours and rl-triton.
2. ``pufferlib`` (about 15 s, after its build of about 60 s, which overlaps part 1): B in 4096, 16384, 65536 x T in
   8, 16, 24, 32, 64, 128: our GAE, rl-triton's GAE and PufferLib's kernel on the same B x T float32 rollout.
3. ``host`` (about 20 s): at 4096 x 128, a bare call of each function of our kernels API and of each TorchRL-signature
   functional (back to back, host wall time per call, the best of 5), and our estimator modules GAE,
   TDLambdaEstimator (values precomputed in the rollout TensorDict) and VTrace (which evaluates its actor and critic
   on every call, as TorchRL's does; timed again with its value functional stubbed, the floor the networks and the
   module layer set), through ``bench_estimators.measure``.
4. ``first_call`` (about 25 s): in a fresh subprocess with an empty Triton cache (``TRITON_CACHE_DIR`` a new temp
   folder), then in another one with that cache filled: the time to import torch and the package, and the wall time
   of the first (and second) call of each algorithm at 4096 x 128.
5. ``cliffs`` (about 100 s, 792 cells): ours, GAE, device time only, B in 1, 16, 64, 100, 512, 1000, 4096, 16384,
   65536 x T in 1-64 and every 2^k - 1, 2^k, 2^k + 1, 3 * 2^(k-1) up to 4096 (``--T-all``: every T up to 4096,
   36864 cells, about 75 minutes: more than one GPU command's limit).

Timings per implementation and cell (``_common.py``):

- ``full_call_us``: rl-triton's headline method: sync, event, one call, event, sync; median of 30 calls, best of 5.
- ``wall_us``: calls back to back, host wall time per call, the device drained once at the end (best of 3).
- ``graph_us``: one call captured 50 times in a CUDA graph, the graph replayed, per call (L2 warm).
- ``device_us``: ``triton.testing.do_bench`` of a one-call CUDA graph, L2 flushed (``device_time_us``).

Correctness before timing, every cell: ours against the float64 references of ``rl_triton_torchrl.kernels.reference``
on sampled rows (the first 16, the last 16 and 16 at random: a Python loop over T in float64 costs too much on every
row), rl-triton against the same references on the same rows and against ours on every element. A wrong
implementation is reported and not timed, and no ratio is given against it. PufferLib computes a different advantage
(its rewards and dones shifted by one step, V-trace clipping of its importance ratio): it is timed at equal sizes
(the same B x T float32 rollout) and checked only against its own CPU op from the same sources.

Mapping our inputs onto rl-triton's API (``[num_envs, T]`` tensors, float flags, the next state's value read from
``values[t + 1]`` except where ``bootstrap_values`` / ``last_value`` give it): the rollout is consistent (``V`` of
T + 1 observations; ``next_state_value[t] = V[t + 1]`` inside an episode and the true final observation's value at a
done step), terminations and truncations are exclusive, and rl-triton gets ``terminateds``, ``truncateds`` and
``bootstrap_values`` = the next value at truncated steps and at the window's last step (``last_value`` without
truncations). Per algorithm: GAE and V-trace without truncations run ours in its shifted input mode
(``last_state_value`` = ``next_state_value[:, -1]``; V(s_(t+1)) read from ``v`` one step on, the same bytes as
rl-triton reads; a done step reads no next value there); V-trace's two outputs come in the other order; Retrace
compares the targets only (the advantages are defined differently) and rl-triton takes E_pi Q(s'_t) with
pi(.|s_t), so each row's ``pi`` is the same at every step (the two definitions agree) and ours gets a copy of it as
``next_pi``; its Q values are consistent as the values are (``next_q[t] = q[t + 1]`` inside an episode), and without
truncations ours runs in its shifted input mode (``last_pi``, ``last_q_values`` = ``next_pi[:, -1]``,
``next_q[:, -1]``; the next step's probabilities and Q values read from ``pi`` and ``q`` one step on: two per-action
tensors, as rl-triton reads ``pi`` and ``next_q``); the discounted return with truncations is ours with
``next_state_value`` and ``terminated`` (TD(1), bootstrapping at truncations and the window end, as rl-triton's
truncation path does); eligibility traces and prefix sums take no terminated flag (one row per shape, truncation
``n/a``). ``--check-mapping`` checks the mapping
on the CPU against rl-triton's own pure-torch references in its ``tests/`` (``$RL_TRITON_TESTS``, else
``rl_triton_tests`` beside ``$RL_TRITON_SRC``, else ``$RL_TRITON_SRC/../tests``), imported at run time.

Budget: ``--budget-s`` (default 420 on a GPU) is the whole run's; a part starts no cell once its share is spent (each
later part keeps a reserve), and what was not run is recorded as such. Results: ``<out>/<name>.json`` (default
``benchmarks/results/h200/bench_peers.json``) and the markdown ``report_peers.py`` generates from it: a summary per
target on top, then every part's table. Without a GPU the kernels run through Triton's interpreter and every time is
host wall time (a smoke run of the plumbing).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
PUFFER_NAME = "pufferlib_advantage_op"  # the JIT-built library's name (its op is torch.ops.pufferlib.*)
PUFFER_FILES = ("pufferlib.cpp", "pufferlib.cu")
# sha256 of the two files in the pufferlib==3.0.0 sdist (pufferlib/extensions/pufferlib.cpp, .../cuda/pufferlib.cu)
PUFFER_SHA256 = {
    "pufferlib.cpp": "3efbfd62a5b2875451cc77bbb5cdb70a48001400e43cb3a4bbb724a926ee9a53",
    "pufferlib.cu": "8154ba37ea6a722a13aa115734680d90c350699c7e6a7b7d8b811611f7f0fdc3",
}
RL_TRITON_COMMIT = "ee985e6"  # the snapshot the issue measured, when neither $RL_TRITON_COMMIT nor SOURCE.json says


# ---------------------------------------------------------------------------------------------------------------
# Child processes (dispatched before the heavy imports below, so that they time their own imports)
# ---------------------------------------------------------------------------------------------------------------


def _first_call_child(argv) -> None:
    """One fresh process: the import times, then the first and second call of each algorithm; prints one JSON."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--B", type=int)
    parser.add_argument("--T", type=int)
    parser.add_argument("--algorithms")
    parser.add_argument("--no-triton-init", action="store_true", help="no trivial Triton launch before ours")
    a = parser.parse_args(argv)
    out = {"triton_cache_dir": os.environ.get("TRITON_CACHE_DIR")}
    start = time.perf_counter()
    import torch

    out["import_torch_s"] = time.perf_counter() - start
    cuda = torch.cuda.is_available()
    if not cuda:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    start = time.perf_counter()
    if cuda:
        torch.zeros(1, device="cuda").sum().item()
    out["cuda_init_s"] = time.perf_counter() - start
    start = time.perf_counter()
    import rl_triton_torchrl  # noqa: F401  (imports triton and our kernels; the TorchRL parts are lazy)

    out["import_package_s"] = time.perf_counter() - start
    sys.path.insert(0, str(HERE))
    import bench_peers as bp  # this file as a module: its rollout and calls (not timed)

    sync = torch.cuda.synchronize if cuda else (lambda: None)
    if not a.no_triton_init:
        start = time.perf_counter()
        bp.touch_triton()
        sync()
        out["triton_init_s"] = time.perf_counter() - start  # Triton's own first launch of a trivial kernel
    x = bp.rollout(a.B, a.T, fields=bp.ALL_FIELDS)
    sync()
    calls = []
    for algo in a.algorithms.split(","):
        fn, _ = bp.make_ours(algo, bp.for_truncation(x, "with" if algo in bp.TRUNCATION_ALGOS else "n/a"))
        start = time.perf_counter()
        fn()
        sync()
        first = time.perf_counter() - start
        start = time.perf_counter()
        fn()
        sync()
        calls.append({"algorithm": algo, "first_call_s": first, "second_call_s": time.perf_counter() - start})
    out["calls"] = calls
    from rl_triton_torchrl.kernels import _aot

    from triton.runtime.driver import driver

    out["aot"] = dict(_aot.STATS, dirs=[str(d) for d in _aot.DIRS], triton_driver_made=driver._active is not None)
    print("FIRST_CALL_JSON " + json.dumps(out), flush=True)


def _find_cuda_home() -> str | None:
    """The CUDA toolkit's root: $CUDA_HOME / $CUDA_PATH, else /usr/local/cuda, else /usr/local/cuda-* (newest), else
    the folder above the real nvcc. (torch's own guess takes the folder above the first ``nvcc`` on the PATH, which
    is wrong where that is a wrapper script in /usr/local/bin.)"""
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            return os.environ[var]
    candidates = [Path("/usr/local/cuda")] + sorted(Path("/usr/local").glob("cuda-*"), reverse=True)
    for c in candidates:
        if (c / "bin" / "nvcc").exists() and (c / "include" / "cuda.h").exists():
            return str(c)
    nvcc = shutil.which("nvcc")
    if nvcc:
        home = Path(os.path.realpath(nvcc)).parent.parent
        if (home / "include" / "cuda.h").exists():
            return str(home)
    return None


def _build_pufferlib_child(argv) -> None:
    """Builds PufferLib's extension into a build folder; prints one JSON line (the library's path or the error)."""
    ext_dir, build_dir, with_cuda = Path(argv[0]), Path(argv[1]), argv[2] == "cuda"
    out = {"build_dir": str(build_dir), "with_cuda": with_cuda}
    build_dir.mkdir(parents=True, exist_ok=True)
    if with_cuda:
        home = _find_cuda_home()
        if home:
            os.environ["CUDA_HOME"] = home  # before cpp_extension is imported: it reads CUDA_HOME at import
        out["cuda_home"] = home
        out["torch_cuda_arch_list"] = os.environ.get("TORCH_CUDA_ARCH_LIST")
    start = time.perf_counter()
    from torch.utils.cpp_extension import load

    sources = [str(ext_dir / "pufferlib.cpp")] + ([str(ext_dir / "pufferlib.cu")] if with_cuda else [])
    attempts = [[], ["-allow-unsupported-compiler"]] if with_cuda else [[]]
    errors = []
    for extra in attempts:
        try:
            path = load(name=PUFFER_NAME, sources=sources, extra_cflags=["-O3"],
                        extra_cuda_cflags=["-O3", *extra], build_directory=str(build_dir),
                        is_python_module=False, verbose=True)
            out.update(ok=True, library=path, extra_cuda_cflags=["-O3", *extra],
                       build_s=time.perf_counter() - start, errors=errors)
            break
        except Exception as e:  # noqa: BLE001 - reported, then the next attempt
            errors.append(f"{type(e).__name__}: {str(e).strip()[-1500:]}")
    else:
        out.update(ok=False, errors=errors, build_s=time.perf_counter() - start)
    print("PUFFERLIB_BUILD_JSON " + json.dumps(out), flush=True)


if __name__ == "__main__" and sys.argv[1:2] == ["--first-call-child"]:
    _first_call_child(sys.argv[2:])
    sys.exit(0)
if __name__ == "__main__" and sys.argv[1:2] == ["--build-pufferlib"]:
    _build_pufferlib_child(sys.argv[2:])
    sys.exit(0)

_STARTED = time.perf_counter()

import torch  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
if DEVICE == "cpu":  # before triton is imported: the kernels run through the interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

sys.path.insert(0, str(HERE))
from _common import (  # noqa: E402
    RESULTS, copy_bandwidth, device_time_us, environment, full_call_us, graph_time_us, wall_time_us, warm,
)
from rl_triton_torchrl import kernels as K  # noqa: E402
from rl_triton_torchrl.kernels import reference as ref  # noqa: E402

BACKEND = "auto" if DEVICE == "cuda" else "triton"  # the default call on CUDA; the interpreter on the CPU
GAMMA, LMBDA, ACTIONS = 0.99, 0.95, 4
TERMINATE_P = TRUNCATE_P = 0.05  # rl-triton's release benchmark: 5% terminations, 5% truncations (exclusive)

ALGORITHMS = ("gae", "td_lambda", "vtrace", "discounted_return", "eligibility_traces", "episodic_prefix_sum",
              "retrace_discrete")
TRUNCATION_ALGOS = {"gae", "td_lambda", "vtrace", "discounted_return", "retrace_discrete"}  # take a terminated flag
PARTS = ("release", "pufferlib", "host", "first_call", "cliffs")

RELEASE_SHAPES = [(64, 512), (128, 1024), (256, 1024), (512, 2048), (512, 4096), (512, 128), (512, 512),
                  (4096, 128), (4096, 512), (4096, 2048), (16384, 128), (16384, 512)]
PUFFER_B, PUFFER_T = (4096, 16384, 65536), (8, 16, 24, 32, 64, 128)
CLIFF_B = (1, 16, 64, 100, 512, 1000, 4096, 16384, 65536)
HOST_SHAPE = (4096, 128)
QUICK = {"release": [(64, 512), (512, 4096), (4096, 128), (4096, 2048), (16384, 512)],
         "pufferlib": [(4096, 8), (4096, 128), (65536, 32), (65536, 128)],
         "cliff_B": (1, 1000, 65536)}
SMOKE = {"release": [(4, 5), (5, 17)], "pufferlib": [(4, 8), (5, 3)], "cliff_B": (1, 3), "cliff_T": (1, 2, 3, 4, 5),
         "host": (4, 8)}
# Reserve (s) each later part keeps from the run's budget: a part starts no cell once the budget less the reserves
# of the parts after it is spent
RESERVE_S = {"release": 0, "pufferlib": 10, "host": 20, "first_call": 25, "cliffs": 15}
CLIFF_WARMUP_MS, CLIFF_REP_MS = 3.0, 10.0  # do_bench budgets of a cliff cell
REF_ROWS = 16  # rows checked against the float64 references: the first, the last, and at random, this many each


def cliff_Ts(all_T: bool = False, max_T: int = 4096) -> list[int]:
    """Every T up to 64, and every 2^k - 1, 2^k, 2^k + 1 and 3 * 2^(k-1) up to max_T (``all_T``: every T)."""
    if all_T:
        return list(range(1, max_T + 1))
    Ts = set(range(1, 65))
    k = 1
    while (1 << k) - 1 <= max_T:
        Ts |= {t for t in ((1 << k) - 1, 1 << k, (1 << k) + 1, 3 << (k - 1)) if t <= max_T}
        k += 1
    return sorted(Ts)


# ---------------------------------------------------------------------------------------------------------------
# The rollout and each implementation's call on it
# ---------------------------------------------------------------------------------------------------------------

BASE_FIELDS = {"r", "v", "nv", "flags"}
VTRACE_FIELDS = {"lpi", "lmu"}
RETRACE_FIELDS = {"pi", "q", "next_q", "action", "mu"}
ALL_FIELDS = BASE_FIELDS | VTRACE_FIELDS | RETRACE_FIELDS


def fields_for(algorithms) -> set:
    f = set(BASE_FIELDS)
    if "vtrace" in algorithms:
        f |= VTRACE_FIELDS
    if "retrace_discrete" in algorithms:
        f |= RETRACE_FIELDS
    return f


def rollout(B, T, seed=0, fields=ALL_FIELDS, device=None, A=ACTIONS) -> dict:
    """A consistent ``[B, T]`` rollout (float32; bool flags) with truncations.

    ``V`` holds the values of T + 1 observations; ``v = V[:, :T]`` and ``nv[t] = V[t + 1]`` inside an episode, the
    value of the true final observation (drawn apart) at a done step. Terminations and truncations are exclusive
    (5% each); rows 0-2 carry the edge cases (a truncation at the last step, a termination at the last step, a
    truncation followed by a termination). ``for_truncation`` gives the view without truncations.
    """
    device = device or DEVICE
    g = torch.Generator(device=device).manual_seed(seed)
    x = {"B": B, "T": T}
    term = torch.rand(B, T, generator=g, device=device) < TERMINATE_P
    trunc = (torch.rand(B, T, generator=g, device=device) < TRUNCATE_P) & ~term
    if B >= 3 and T >= 3:
        term[0:3, -1] = False
        trunc[0:3, -1] = False
        trunc[0, -1] = True
        term[1, -1] = True
        trunc[2, 1], term[2, 1], term[2, 2], trunc[2, 2] = True, False, True, False
    done = term | trunc
    x.update(term=term, trunc=trunc, done=done)
    if fields & {"r", "v", "nv"}:
        V = torch.randn(B, T + 1, generator=g, device=device)
        final = torch.randn(B, T, generator=g, device=device)
        x["r"] = torch.randn(B, T, generator=g, device=device)
        x["v"] = V[:, :T].contiguous()
        x["nv"] = torch.where(done, final, V[:, 1:])
    if fields & VTRACE_FIELDS:
        x["lpi"] = -torch.rand(B, T, generator=g, device=device)
        x["lmu"] = -torch.rand(B, T, generator=g, device=device)
    if fields & RETRACE_FIELDS:  # pi the same at every step of a row: rl-triton takes E_pi Q(s'_t, .) with pi(.|s_t)
        x["pi"] = torch.softmax(torch.randn(B, 1, A, generator=g, device=device), dim=-1).expand(B, T, A).contiguous()
        x["next_pi"] = x["pi"].clone()
        Q = torch.randn(B, T + 1, A, generator=g, device=device)  # the Q values of T + 1 observations
        x["q"] = Q[:, :T].contiguous()
        x["next_q"] = torch.where(done[..., None], torch.randn(B, T, A, generator=g, device=device), Q[:, 1:])
        x["action"] = torch.randint(0, A, (B, T), generator=g, device=device)
        x["mu"] = torch.rand(B, T, generator=g, device=device) * 0.8 + 0.1
    return x


def for_truncation(x: dict, truncation: str) -> dict:
    """The rollout as a cell sees it: ``with`` truncations as drawn; ``without``: the same episode ends, all of them
    terminations, no terminated flag passed to ours; ``n/a`` (no terminated flag exists): as ``without``."""
    if truncation == "with":
        return {**x, "truncation": "with"}
    return {**x, "term": x["done"], "trunc": torch.zeros_like(x["done"]), "truncation": truncation}


def rows_of(x: dict, rows) -> dict:
    """The rollout restricted to some rows (tensors indexed, on the CPU)."""
    idx = torch.as_tensor(rows, dtype=torch.long)
    return {k: (v[idx.to(v.device)].cpu() if isinstance(v, torch.Tensor) else v) for k, v in x.items()}


def make_ours(algo: str, x: dict, backend: str = BACKEND):
    """(fn, input tensors) of our call for ``algo`` on the rollout ``x`` (``for_truncation`` applied)."""
    r, v, nv, d = x.get("r"), x.get("v"), x.get("nv"), x["done"]
    t = x["term"] if x["truncation"] == "with" else None
    kw = {"time_dim": -1, "backend": backend}
    flags = [d] + ([t] if t is not None else [])
    if algo == "gae":
        if t is None:  # no truncations: V(s_(t+1)) read from v one step on, as rl-triton reads it (the same bytes)
            lv = nv[:, -1].contiguous()
            return ((lambda: K.gae(r, v, None, d, gamma=GAMMA, lmbda=LMBDA, last_state_value=lv, **kw)),
                    [r, v, lv, d])
        return (lambda: K.gae(r, v, nv, d, t, gamma=GAMMA, lmbda=LMBDA, **kw)), [r, v, nv, *flags]
    if algo == "td_lambda":
        return (lambda: K.td_lambda_return(r, nv, d, t, gamma=GAMMA, lmbda=LMBDA, **kw)), [r, nv, *flags]
    if algo == "vtrace":
        lpi, lmu = x["lpi"], x["lmu"]
        if t is None:  # no truncations: V(s_(t+1)) read from v one step on, as rl-triton reads it (as GAE above)
            lv = nv[:, -1].contiguous()
            return ((lambda: K.vtrace(lpi, lmu, v, None, r, d, gamma=GAMMA, last_state_value=lv, **kw)),
                    [lpi, lmu, v, lv, r, d])
        return (lambda: K.vtrace(lpi, lmu, v, nv, r, d, t, gamma=GAMMA, **kw)), [lpi, lmu, v, nv, r, *flags]
    if algo == "discounted_return":
        if t is None:
            return (lambda: K.discounted_return(r, d, gamma=GAMMA, **kw)), [r, d]
        return ((lambda: K.discounted_return(r, d, gamma=GAMMA, next_state_value=nv, terminated=t, **kw)),
                [r, nv, d, t])
    if algo == "eligibility_traces":
        return (lambda: K.eligibility_traces(r, d, gamma=GAMMA, lmbda=LMBDA, **kw)), [r, d]
    if algo == "episodic_prefix_sum":
        return (lambda: K.episodic_prefix_sum(r, d, reset="after_done", **kw)), [r, d]
    if algo == "retrace_discrete":
        pi, npi, q, nq, a, mu = (x[k] for k in ("pi", "next_pi", "q", "next_q", "action", "mu"))
        kw = dict(behavior_prob=mu, gamma=GAMMA, lmbda=LMBDA, time_dim=-2, backend=backend)  # [B, T, A] inputs
        if t is None:  # no truncations: the next step's pi and Q read from pi and q one step on (as GAE above)
            lpi, lq = npi[:, -1].contiguous(), nq[:, -1].contiguous()
            return ((lambda: K.retrace_discrete(pi, a, q, None, None, r, d, last_pi=lpi, last_q_values=lq, **kw)),
                    [pi, a, q, lpi, lq, r, mu, d])
        return (lambda: K.retrace_discrete(pi, a, q, npi, nq, r, d, t, **kw)), [pi, a, q, npi, nq, r, mu, *flags]
    raise KeyError(algo)


def reference(algo: str, x: dict, rows) -> list[torch.Tensor]:
    """The float64 references of ours on some rows of the rollout (``rl_triton_torchrl.kernels.reference``)."""
    s = rows_of(x, rows)
    r, v, nv, d = s.get("r"), s.get("v"), s.get("nv"), s["done"]
    t = s["term"] if x["truncation"] == "with" else None
    if algo == "gae":
        return list(ref.gae_ref(r, v, nv, d, t, gamma=GAMMA, lmbda=LMBDA, time_dim=-1)[:2])
    if algo == "td_lambda":
        return [ref.td_lambda_return_ref(r, nv, d, t, gamma=GAMMA, lmbda=LMBDA, time_dim=-1)[0]]
    if algo == "vtrace":
        return list(ref.vtrace_ref(s["lpi"], s["lmu"], v, nv, r, d, t, gamma=GAMMA, time_dim=-1)[:2])
    if algo == "discounted_return":
        if t is None:
            return [ref.discounted_return_ref(r, d, gamma=GAMMA, time_dim=-1)]
        return [ref.td_lambda_return_ref(r, nv, d, t, gamma=GAMMA, lmbda=1.0, time_dim=-1, done_or_terminated=True)[0]]
    if algo == "eligibility_traces":
        return [ref.eligibility_traces_ref(r, d, gamma=GAMMA, lmbda=LMBDA, time_dim=-1)[0]]
    if algo == "episodic_prefix_sum":
        return [ref.episodic_prefix_sum_ref(r, d, reset="after_done", time_dim=-1)[0]]
    if algo == "retrace_discrete":
        return list(ref.retrace_discrete_ref(s["pi"], s["action"], s["q"], s["next_pi"], s["next_q"], r, d, t,
                                             behavior_prob=s["mu"], gamma=GAMMA, lmbda=LMBDA, time_dim=-2)[:2])
    raise KeyError(algo)


# rl-triton: (our output index, its output index) pairs that compute the same numbers, and what differs
PEER_PAIRS = {"gae": [(0, 0)], "td_lambda": [(0, 0)], "vtrace": [(0, 1), (1, 0)], "discounted_return": [(0, 0)],
              "eligibility_traces": [(0, 0)], "episodic_prefix_sum": [(0, 0)], "retrace_discrete": [(0, 0)]}
PEER_NOTES = {
    "gae": "compute_gae; advantages compared",
    "td_lambda": "compute_lambda_returns",
    "vtrace": "compute_vtrace; targets and advantages compared",
    "discounted_return": "compute_discounted_returns",
    "eligibility_traces": "compute_eligibility_traces",
    "episodic_prefix_sum": "compute_episodic_prefix_sum(boundary='ends_at')",
    "retrace_discrete": "compute_retrace; targets compared (its advantages are rho (r + gamma Q_ret' - Q), ours "
                        "Q_ret - Q); its E_pi Q(s'_t) uses pi(.|s_t): each row's pi is the same at every step, and "
                        "ours gets a copy of it as next_pi",
}
OURS_NOTES = {
    ("retrace_discrete", "without"): "retrace_discrete(next_pi=None, next_q_values=None, last_pi=, last_q_values=): "
                                     "the shifted input mode, pi and q read one step on",
    ("discounted_return", "with"): "discounted_return(next_state_value=, terminated=): TD(1), bootstrapping at "
                                   "truncations and the window end (rl-triton's truncation path)",
}


def peer_inputs(algo: str, x: dict, zero_window_bootstrap: bool = False) -> dict:
    """rl-triton's keyword arguments for ``algo`` on the rollout ``x`` (``for_truncation`` applied): float flags, the
    next value at truncated steps and at the window's last step in ``bootstrap_values`` (``last_value`` where its
    API has it and there are no truncations). Built once per cell, outside any timing.

    ``zero_window_bootstrap`` leaves the window's last step without its bootstrap: a wrong mapping on purpose, for
    the test that the mapping check can fail."""
    r, v, nv, done = x.get("r"), x.get("v"), x.get("nv"), x["done"]
    with_trunc = x["truncation"] == "with"
    term, trunc = x["term"].float(), x["trunc"].float()
    if nv is not None:
        boot = torch.where(x["trunc"], nv, torch.zeros_like(nv))
        last = nv[:, -1].contiguous() * (0.0 if zero_window_bootstrap else 1.0)
        boot[:, -1] = last
        boot_last = torch.zeros_like(nv)
        boot_last[:, -1] = last
    g = {"gamma": GAMMA}
    gl = {"gamma": GAMMA, "lambda_": LMBDA}
    if algo == "gae":
        if with_trunc:
            return dict(rewards=r, values=v, terminateds=term, truncateds=trunc, bootstrap_values=boot, **gl)
        return dict(rewards=r, values=v, terminateds=term, last_value=last, **gl)
    if algo == "td_lambda":
        if with_trunc:
            return dict(rewards=r, next_values=nv, terminateds=term, truncateds=trunc, bootstrap_values=boot, **gl)
        return dict(rewards=r, next_values=nv, terminateds=term, bootstrap_values=boot_last, **gl)
    if algo == "vtrace":
        common = dict(log_pi_target=x["lpi"], log_pi_behavior=x["lmu"], values=v, rewards=r, terminateds=term, **g)
        if with_trunc:
            return dict(common, truncateds=trunc, bootstrap_values=boot)
        return dict(common, last_value=last)
    if algo == "discounted_return":
        if with_trunc:
            return dict(rewards=r, terminateds=term, truncateds=trunc, bootstrap_values=boot, **g)
        return dict(rewards=r, terminateds=term, **g)
    if algo == "eligibility_traces":
        return dict(gradients=r, dones=done.float(), **gl)
    if algo == "episodic_prefix_sum":
        return dict(inputs=r, dones=done.float(), boundary="ends_at")
    if algo == "retrace_discrete":
        q_taken = x["q"].gather(-1, x["action"].unsqueeze(-1)).squeeze(-1).contiguous()
        return dict(action_probs_target=x["pi"], action_probs_behavior=x["mu"], q_values=q_taken,
                    next_q_values_all=x["next_q"], actions=x["action"], rewards=r, terminateds=term, truncateds=trunc,
                    **gl)
    raise KeyError(algo)


RLT_FUNCTIONS = {"gae": "compute_gae", "td_lambda": "compute_lambda_returns", "vtrace": "compute_vtrace",
                 "discounted_return": "compute_discounted_returns", "eligibility_traces": "compute_eligibility_traces",
                 "episodic_prefix_sum": "compute_episodic_prefix_sum", "retrace_discrete": "compute_retrace"}


def make_peer(algo: str, x: dict, rlt):
    """(fn, input tensors) of rl-triton's call for ``algo`` on the rollout ``x``."""
    kw = peer_inputs(algo, x)
    f = getattr(rlt, RLT_FUNCTIONS[algo])
    return (lambda: f(**kw)), [t for t in kw.values() if isinstance(t, torch.Tensor)]


def _tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


# ---------------------------------------------------------------------------------------------------------------
# Checks
# ---------------------------------------------------------------------------------------------------------------

TOL = 1e-4  # float32: relative to 1 + the reference's largest magnitude


def compare(got, want, what: str) -> tuple[float, str | None]:
    """Largest absolute difference over paired tensors, and a message naming the first pair and index beyond the
    tolerance (None if all agree)."""
    worst, message = 0.0, None
    for i, (a, b) in enumerate(zip(got, want)):
        a, b = a.double(), b.double().to(a.device)
        diff = (a - b).abs()
        diff = torch.where(torch.isnan(diff), torch.full_like(diff, math.inf), diff)
        err = diff.max().item() if diff.numel() else 0.0
        worst = max(worst, err)
        bound = TOL * (1 + (b.abs().max().item() if b.numel() else 0.0))
        if err > bound and message is None:
            idx = tuple(int(j) for j in (diff > bound).nonzero()[0].tolist())
            message = (f"{what} output {i}: |diff| {err:.3g} > {bound:.3g}, first at {idx}: "
                       f"{a[idx].item():.6g} vs {b[idx].item():.6g}")
    return worst, message


def sample_rows(B: int, seed: int = 0) -> list[int]:
    rng = random.Random(seed)
    rows = set(range(min(B, REF_ROWS))) | set(range(max(0, B - REF_ROWS), B))
    rows |= set(rng.sample(range(B), min(B, REF_ROWS)))
    return sorted(rows)


def _sync():
    if DEVICE == "cuda":
        torch.cuda.synchronize()


@triton.jit
def _touch_kernel(x_ptr, N: tl.constexpr):
    tl.store(x_ptr + tl.arange(0, N), tl.zeros((N,), tl.float32))


def touch_triton():
    """One trivial Triton launch: Triton's runtime start (driver, launcher, cache) without any of our kernels."""
    buf = torch.empty(16, device=DEVICE)
    _touch_kernel[(1,)](buf, 16)


# ---------------------------------------------------------------------------------------------------------------
# Peers
# ---------------------------------------------------------------------------------------------------------------


def _source_json(folder: Path) -> dict:
    try:
        return json.loads((folder / "SOURCE.json").read_text())
    except (OSError, ValueError):
        return {}


def load_rl_triton():
    """(namespace of rl-triton's functions or None, info)."""
    src = os.environ.get("RL_TRITON_SRC")
    if not src:
        return None, {"status": "not available: $RL_TRITON_SRC is not set"}
    path = Path(src).resolve()
    if not (path / "rl_triton" / "__init__.py").exists():
        return None, {"status": f"not available: no rl_triton/ package in $RL_TRITON_SRC={src}"}
    source = _source_json(path)
    info = {"path": str(path), "repo": source.get("repo", "simonsays1980/rl-triton"),
            "commit": os.environ.get("RL_TRITON_COMMIT") or source.get("commit") or f"{RL_TRITON_COMMIT} (assumed)"}
    sys.path.insert(0, str(path))
    try:
        import rl_triton
    except Exception as e:  # noqa: BLE001 - a peer that fails to import is reported, the rest runs
        return None, {**info, "status": f"not available: import failed: {type(e).__name__}: {e}"}
    info["version"] = getattr(rl_triton, "__version__", "?")
    info["file"] = rl_triton.__file__
    ns = types.SimpleNamespace(**{name: getattr(rl_triton, name) for name in RLT_FUNCTIONS.values()})
    info["correctness_warnings"] = os.environ.get("RL_TRITON_CORRECTNESS_WARNINGS", "0 (unset)")
    info["status"] = "ok" if DEVICE == "cuda" else "not available: its kernels need CUDA"
    return ns, info


class PufferLib:
    """PufferLib's advantage op, built from ``$PUFFERLIB_EXT`` in a background process (``start``) and loaded
    (``wait``) where part 2 needs it."""

    def __init__(self):
        self.info, self.proc, self.op = {}, None, None
        ext = os.environ.get("PUFFERLIB_EXT")
        if not ext:
            self.info["status"] = "not available: $PUFFERLIB_EXT is not set"
            return
        self.dir = Path(ext).resolve()
        missing = [f for f in PUFFER_FILES if not (self.dir / f).exists()]
        if missing:
            self.info["status"] = f"not available: {missing} not in $PUFFERLIB_EXT={ext}"
            return
        source = _source_json(self.dir)
        sums = {f: hashlib.sha256((self.dir / f).read_bytes()).hexdigest() for f in PUFFER_FILES}
        self.info.update(path=str(self.dir), package=source.get("package", "pufferlib==3.0.0"), sha256=sums,
                         sha256_matches_3_0_0=sums == PUFFER_SHA256, status="not built")

    def start(self, with_cuda: bool):
        if self.info.get("status") != "not built":
            return
        key = hashlib.sha256((json.dumps(self.info["sha256"]) + torch.__version__ + str(with_cuda)).encode())
        self.build_dir = Path(tempfile.gettempdir()) / f"pufferlib_ext_{key.hexdigest()[:12]}"
        self.build_dir.mkdir(parents=True, exist_ok=True)
        (self.build_dir / "lock").unlink(missing_ok=True)  # a killed earlier build's lock would stall this one
        env = dict(os.environ)
        if with_cuda and not env.get("TORCH_CUDA_ARCH_LIST"):
            major, minor = torch.cuda.get_device_capability()
            env["TORCH_CUDA_ARCH_LIST"] = f"{major}.{minor}"
        env.setdefault("MAX_JOBS", "4")
        self.log = self.build_dir / "build.log"
        self.started = time.perf_counter()
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--build-pufferlib", str(self.dir), str(self.build_dir),
             "cuda" if with_cuda else "cpu"],
            stdout=open(self.log, "w"), stderr=subprocess.STDOUT, env=env, cwd=str(self.build_dir))
        self.info["status"] = "building"

    def wait(self, timeout_s: float) -> bool:
        """Waits for the build, loads the library; True if the op is there."""
        if self.op is not None:
            return True
        if self.proc is None:
            return False
        try:
            self.proc.wait(timeout=max(1.0, timeout_s))
        except subprocess.TimeoutExpired:
            self.info["status"] = (f"not available: the build still ran after {time.perf_counter() - self.started:.0f}"
                                   " s (left running; see its log)")
            self.info["log"] = str(self.log)
            return False
        self.info["build_wall_s"] = time.perf_counter() - self.started
        text = self.log.read_text(errors="replace")
        result = next((json.loads(line.split(" ", 1)[1]) for line in text.splitlines()
                       if line.startswith("PUFFERLIB_BUILD_JSON ")), None)
        if result is None or not result.get("ok"):
            errors = (result or {}).get("errors") or [text[-1500:]]
            self.info.update(status=f"not available: build failed: {errors[-1][-300:]}", build=result,
                             log_tail=text[-3000:])
            return False
        self.info["build"] = {k: result[k] for k in ("build_s", "extra_cuda_cflags", "cuda_home",
                                                     "torch_cuda_arch_list", "with_cuda") if k in result}
        try:
            torch.ops.load_library(result["library"])
            self.op = torch.ops.pufferlib.compute_puff_advantage
        except Exception as e:  # noqa: BLE001
            self.info["status"] = f"not available: loading the library failed: {type(e).__name__}: {e}"
            return False
        self.info["status"] = "ok"
        return True

    def call(self, values, rewards, dones, importance):
        """(fn, input tensors): PufferLib's op writing into a preallocated output, as its trainer calls it (the
        output allocation is not timed)."""
        adv = torch.zeros_like(values)
        op = self.op
        return (lambda: (op(values, rewards, dones, importance, adv, GAMMA, LMBDA, 1.0, 1.0), adv)[1]), \
            [values, rewards, dones, importance]

    def self_check(self, x) -> str:
        """Its CUDA op against its own CPU op (both from the same two files) on a few rows: the build, not the
        semantics."""
        rows = list(range(min(64, x["B"])))
        args = [x["v"][rows], x["r"][rows], x["done"][rows].float(), torch.exp(x["lpi"] - x["lmu"])[rows]]
        fn, _ = self.call(*[a.contiguous() for a in args])
        got = fn().cpu()
        cpu = [a.cpu().contiguous() for a in args]
        want = torch.zeros_like(cpu[0])
        self.op(*cpu, want, GAMMA, LMBDA, 1.0, 1.0)
        err = (got - want).abs().max().item()
        ok = err <= TOL * (1 + want.abs().max().item())
        return f"{'ok' if ok else 'WRONG'}: its {DEVICE} op vs its CPU op, |diff| {err:.2g} on {len(rows)} rows"


# ---------------------------------------------------------------------------------------------------------------
# Measurement
# ---------------------------------------------------------------------------------------------------------------


def timings(fn, args) -> dict:
    """The four timings of one implementation (``_common.py``); on the CPU the host wall times only."""
    out = {"full_call_us": full_call_us(fn, args.full_calls, args.full_repeats),
           "wall_us": min(wall_time_us(fn, args.wall_calls, args.wall_budget_s) for _ in range(args.wall_repeats))}
    if DEVICE == "cuda":
        out["graph_us"] = graph_time_us(fn, args.graph_calls, args.graph_reps)
        out["device_us"], out["device_timing"] = device_time_us(fn, True, args.warmup_ms, args.rep_ms)
    return out


def check_impl(row: dict, fn, inputs, checks):
    """First call (compile included) and the checks (``checks``: ``(key, check)`` pairs, ``check(outputs) ->
    (max_err, message or None)``); fills ``row``. Returns the outputs, or None if the call failed or a check did
    (then ``row["status"]`` says which)."""
    try:
        start = time.perf_counter()
        out = _tuple(fn())
        _sync()
        row["first_call_s"] = time.perf_counter() - start
        row["bytes"] = nbytes(inputs) + nbytes(out)
        failures = []
        for key, check in checks:
            err, message = check(out)
            row[key] = err
            if message:
                failures.append(message)
        if failures:
            row["status"] = "wrong: " + "; ".join(failures)
            return None
        row["status"] = "ok"
        return out
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        row["status"] = "out of memory"
    except Exception as e:  # noqa: BLE001 - a failing implementation is a result, not a crash of the run
        row["status"] = _error(e)
    return None


def time_impl(row: dict, fn, timer) -> None:
    """``row.update(timer(fn))`` for a checked implementation; an error while timing is the row's status."""
    if row.get("status") != "ok":
        return
    try:
        row.update(timer(fn))
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        row["status"] = "out of memory (while timing)"
    except Exception as e:  # noqa: BLE001
        row["status"] = _error(e) + " (while timing)"


def _error(e: Exception) -> str:
    text = str(e).strip().splitlines()
    return f"error: {type(e).__name__}: {text[0][:300] if text else ''}"


class Run:
    """The run's state: budget, rows, saving."""

    def __init__(self, args, argv):
        self.args, self.argv, self.rows = args, argv, []
        self.env = environment()
        self.env["device"] = DEVICE
        self.path = Path(args.out) if os.sep in args.out or args.out.startswith(".") else RESULTS / args.out
        self.path.mkdir(parents=True, exist_ok=True)
        self.path = self.path / f"{args.name}.json"
        self.part_times = {}

    def left_s(self, part: str) -> float:
        """Seconds this part may still start cells: the run's budget less the reserves of the parts after it."""
        later = PARTS[PARTS.index(part) + 1:]
        reserve = sum(RESERVE_S[p] for p in later if p in self.args.parts)
        return self.args.budget_s - reserve - (time.perf_counter() - _STARTED)

    def save(self):
        self.env["part_times_s"] = self.part_times
        self.env["total_s"] = time.perf_counter() - _STARTED
        tmp = self.path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps({"environment": self.env, "command": command_line(self.argv), "rows": self.rows},
                                  indent=1))
        tmp.replace(self.path)


def command_line(argv) -> str:
    prefix = " ".join(f"{k}={os.environ[k]}" for k in ("RL_TRITON_SRC", "PUFFERLIB_EXT") if os.environ.get(k))
    return (prefix + " " if prefix else "") + "python benchmarks/bench_peers.py " + " ".join(argv)


def _peer_row_status(info: dict) -> str:
    status = info.get("status", "not available")
    return status if status.startswith("not available") else f"not available: {status}"


def bench_cell(run: Run, part: str, algo: str, x: dict, impls: dict, order_flip: bool) -> None:
    """Every implementation of one cell: first checked, ours first (against the float64 references on sampled rows),
    then each peer (against the same, and against ours on every element); then the checked ones timed, in the
    order given or (``order_flip``) in reverse, so that no implementation is always timed first."""
    B, T, truncation = x["B"], x["T"], x["truncation"]
    rows = sample_rows(B)
    want = reference(algo, x, rows)
    base = {"part": part, "algorithm": algo, "truncation": truncation, "B": B, "T": T, "dtype": "float32"}
    built, ours_out = {}, None
    for name, spec in impls.items():
        row = {**base, "impl": name}
        run.rows.append(row)
        if isinstance(spec, str):  # not available
            row["status"] = spec
            continue
        fn, inputs = spec
        if name == "ours":
            checks = [("max_err", lambda out: compare([o[rows] for o in out[:len(want)]], want, "ours vs float64"))]
            note = OURS_NOTES.get((algo, truncation))
        elif name == "rl_triton":
            pairs = PEER_PAIRS[algo]
            checks = [("max_err", lambda out: compare([out[j][rows] for _, j in pairs], [want[i] for i, _ in pairs],
                                                       "rl-triton vs float64"))]
            if ours_out is not None:
                checks.append(("agree_err", lambda out: compare([out[j] for _, j in pairs],
                                                                 [ours_out[i] for i, _ in pairs], "rl-triton vs ours")))
            note = PEER_NOTES[algo]
        else:  # pufferlib: not the same advantage
            checks, note = [], "not the same advantage (not compared); timed on the same B x T float32 rollout"
        if note:
            row["note"] = note
        out = check_impl(row, fn, inputs, checks)
        if name == "ours":
            ours_out = out
        del out
        built[name] = (row, fn)
    ours_out = None
    names = list(built)[::-1] if order_flip else list(built)
    for order, name in enumerate(names):
        row, fn = built[name]
        row["timing_order"] = order
        time_impl(row, fn, lambda f: timings(f, run.args))


def not_run_rows(run: Run, part: str, cells, reason: str):
    done = {(r.get("algorithm"), r.get("truncation"), r.get("B"), r.get("T"), r.get("impl")) for r in run.rows
            if r.get("part") == part}
    for algo, truncation, B, T, impls in cells:
        for impl in impls:
            if (algo, truncation, B, T, impl) not in done:
                run.rows.append({"part": part, "algorithm": algo, "truncation": truncation, "B": B, "T": T,
                                 "dtype": "float32", "impl": impl, "status": f"not run ({reason})"})


def part_release(run: Run, rlt, rlt_info):
    args = run.args
    cells = []
    for B, T in args.release_shapes:
        for truncation in args.truncation:
            for algo in args.algorithms:
                tr = truncation if algo in TRUNCATION_ALGOS else "n/a"
                if tr == "n/a" and truncation != args.truncation[0]:
                    continue
                cells.append((algo, tr, B, T, ("ours", "rl_triton")))
    flip = False
    for B, T in args.release_shapes:
        if run.left_s("release") <= 0:
            not_run_rows(run, "release", cells, "budget spent")
            return
        base = rollout(B, T, seed=B * 7919 + T, fields=fields_for(args.algorithms))
        for algo, tr, b, t, _ in cells:
            if (b, t) != (B, T):
                continue
            x = for_truncation(base, tr)
            impls = {"ours": make_ours(algo, x)}
            impls["rl_triton"] = make_peer(algo, x, rlt) if rlt is not None and DEVICE == "cuda" else \
                _peer_row_status(rlt_info)
            bench_cell(run, "release", algo, x, impls, flip)
            flip = not flip
        del base
        _empty_cache()
        run.save()
        print(f"release {B}x{T} done at {time.perf_counter() - _STARTED:.0f} s", flush=True)


def _empty_cache():
    if DEVICE == "cuda":
        torch.cuda.empty_cache()


def part_pufferlib(run: Run, rlt, rlt_info, puffer: PufferLib):
    args = run.args
    ok = puffer.wait(max(1.0, run.left_s("pufferlib") - 5)) if puffer.proc is not None else False
    run.env["peers"]["pufferlib"] = puffer.info
    cells = [("gae", "without", B, T, ("ours", "rl_triton", "pufferlib")) for B, T in args.pufferlib_shapes]
    flip = False
    checked = False
    for B, T in args.pufferlib_shapes:
        if run.left_s("pufferlib") <= 0:
            not_run_rows(run, "pufferlib", cells, "budget spent")
            return
        x = for_truncation(rollout(B, T, seed=B * 104729 + T, fields=BASE_FIELDS | VTRACE_FIELDS), "without")
        impls = {"ours": make_ours("gae", x)}
        impls["rl_triton"] = make_peer("gae", x, rlt) if rlt is not None and DEVICE == "cuda" else \
            _peer_row_status(rlt_info)
        if ok:
            if not checked:
                puffer.info["self_check"] = puffer.self_check(x)
                checked = True
            impls["pufferlib"] = puffer.call(x["v"], x["r"], x["done"].float(), torch.exp(x["lpi"] - x["lmu"]))
        else:
            impls["pufferlib"] = _peer_row_status(puffer.info)
        bench_cell(run, "pufferlib", "gae", x, impls, flip)
        flip = not flip
        del x, impls
        _empty_cache()
        run.save()
    print(f"pufferlib done at {time.perf_counter() - _STARTED:.0f} s", flush=True)


# --- host path ---------------------------------------------------------------------------------------------------


def host_kernel_calls(x: dict, backend: str = BACKEND) -> dict:
    """name -> (fn, algorithm it stands for) for every function of our kernels API, on [B, T] inputs."""
    xw = for_truncation(x, "with")
    calls = {algo: make_ours(algo, xw if algo in TRUNCATION_ALGOS else for_truncation(x, "n/a"), backend)[0]
             for algo in ALGORITHMS}
    r, v, nv, d, t = xw["r"], xw["v"], xw["nv"], xw["done"], xw["term"]
    ratio = torch.exp(x["lpi"] - x["lmu"])
    kw = {"time_dim": -1, "backend": backend}
    calls["td_lambda_advantage"] = lambda: K.td_lambda_advantage(r, v, nv, d, t, gamma=GAMMA, lmbda=LMBDA, **kw)
    calls["retrace"] = lambda: K.retrace(v, nv, r, d, t, ratio=ratio, gamma=GAMMA, lmbda=LMBDA, **kw)
    a = (GAMMA * LMBDA * (~d).float()).contiguous()
    calls["linear_scan"] = lambda: K.linear_scan(a, r, reverse=True, **kw)
    # retrace_discrete in its shifted input mode too (the next step's pi and Q read one step on: two per-action
    # tensors, as rl-triton reads, where the call above reads four)
    calls[SHIFTED_RETRACE] = make_ours("retrace_discrete", for_truncation(x, "without"), backend)[0]
    names = {"td_lambda": "td_lambda_return"}
    return {names.get(k, k): fn for k, fn in calls.items()}


SHIFTED_RETRACE = "retrace_discrete_shifted"  # the host part's name of retrace_discrete's shifted-mode call


FUNCTIONALS = ("generalized_advantage_estimate", "vec_generalized_advantage_estimate", "td0_return_estimate",
               "td0_advantage_estimate", "td1_return_estimate", "vec_td1_return_estimate", "td1_advantage_estimate",
               "vec_td1_advantage_estimate", "td_lambda_return_estimate", "vec_td_lambda_return_estimate",
               "td_lambda_advantage_estimate", "vec_td_lambda_advantage_estimate", "vtrace_advantage_estimate",
               "reward2go")


def functional_args(name: str, x: dict):
    """TorchRL's positional arguments of a value functional, on [B, T, 1] tensors."""
    r, v, nv, d, t = (x[k].unsqueeze(-1) for k in ("r", "v", "nv", "done", "term"))
    lpi, lmu = x["lpi"].unsqueeze(-1), x["lmu"].unsqueeze(-1)
    if name.endswith("generalized_advantage_estimate"):
        return (GAMMA, LMBDA, v, nv, r, d, t)
    if name == "td0_return_estimate":
        return (GAMMA, nv, r, t)
    if name == "td0_advantage_estimate" or "td1_advantage" in name:
        return (GAMMA, v, nv, r, d, t)
    if "td1_return" in name:
        return (GAMMA, nv, r, d, t)
    if "td_lambda_return" in name:
        return (GAMMA, LMBDA, nv, r, d, t)
    if "td_lambda_advantage" in name:
        return (GAMMA, LMBDA, v, nv, r, d, t)
    if name == "vtrace_advantage_estimate":
        return (GAMMA, lpi, lmu, v, nv, r, d, t)
    if name == "reward2go":
        return (r, d, GAMMA)
    raise KeyError(name)


def host_wall_us(fn, args) -> float:
    """Back to back, host wall time per call, the best of ``host_repeats`` measurements of ``host_calls`` calls,
    after 50 ms of them (``warm``), with Python's garbage collector paused."""
    warm(fn, 0.05)
    return min(wall_time_us(fn, args.host_calls) for _ in range(args.host_repeats))


def host_timings(fn, args) -> dict:
    out = {"wall_us": host_wall_us(fn, args)}
    if DEVICE == "cuda":  # whether the wall time is the host's or the device's
        out["device_us"], out["device_timing"] = device_time_us(fn, True, args.warmup_ms, args.rep_ms)
    return out


def part_host(run: Run):
    args = run.args
    B, T = args.host_shape
    x = rollout(B, T, seed=1, fields=ALL_FIELDS)
    xs = for_truncation(x, "with")
    rows = sample_rows(B)
    base = {"part": "host", "B": B, "T": T, "dtype": "float32"}
    for name, fn in host_kernel_calls(x).items():
        if run.left_s("host") <= 0:
            run.rows.append({**base, "kind": "kernels", "name": name, "status": "not run (budget spent)"})
            continue
        shifted = name == SHIFTED_RETRACE
        algo = {"td_lambda_return": "td_lambda", SHIFTED_RETRACE: "retrace_discrete"}.get(name, name)
        row = {**base, "kind": "kernels", "name": name, "algorithm": algo,
               "call": f"rl_triton_torchrl.kernels.{algo if shifted else name}"}
        checks = []
        if algo in ALGORITHMS:
            xa = (for_truncation(x, "without") if shifted else xs if algo in TRUNCATION_ALGOS
                  else for_truncation(x, "n/a"))
            want = reference(algo, xa, rows)
            checks = [("max_err", lambda out, w=want: compare([o[rows] for o in out[:len(w)]], w, "ours vs float64"))]
        check_impl(row, fn, [], checks)
        time_impl(row, fn, lambda f: host_timings(f, args))
        run.rows.append(row)
    if "functionals" in args.host_parts:
        import rl_triton_torchrl.functional as F
        from torchrl.objectives.value import functional as TF

        for name in FUNCTIONALS:
            if run.left_s("host") <= 0:
                run.rows.append({**base, "kind": "functional", "name": name, "status": "not run (budget spent)"})
                continue
            fargs = functional_args(name, x)
            ours_fn = getattr(F, name)
            fn = (lambda f=ours_fn, a=fargs: f(*a)) if DEVICE == "cuda" else \
                (lambda f=ours_fn, a=fargs: f(*a, backend=BACKEND))
            row = {**base, "kind": "functional", "name": name, "call": f"rl_triton_torchrl.functional.{name}"}
            theirs = getattr(TF, name)  # TorchRL's function of the same name, the same arguments
            try:
                want = _tuple(theirs(*fargs))
                checks = [("max_err", lambda out, w=want: compare(list(out), list(w), f"{name} vs TorchRL's"))]
            except Exception as e:  # noqa: BLE001
                checks, theirs = [], None
                row["note"] = f"TorchRL's {name} failed: {type(e).__name__}; not checked"
            check_impl(row, fn, [], checks)
            time_impl(row, fn, lambda f: host_timings(f, args))
            if theirs is not None and row.get("wall_us") is not None:  # the peer a patched TorchRL user replaces
                # (as many calls as fit in half a second, at most 200: TorchRL's loops take milliseconds a call at
                # 4096 x 128, where --host-calls of them took minutes)
                row["torchrl_wall_us"] = min(wall_time_us(lambda f=theirs, a=fargs: f(*a))
                                             for _ in range(args.host_repeats))
            run.rows.append(row)
    if "modules" in args.host_parts:
        import bench_estimators

        actor, critic = bench_estimators.networks()
        margs = argparse.Namespace(B=B, T=T, calls=args.module_calls)
        for name, with_net in (("GAE", False), ("TDLambdaEstimator", False), ("VTrace", True)):
            if run.left_s("host") <= 0:
                run.rows.append({**base, "kind": "estimator", "name": name, "status": "not run (budget spent)"})
                continue
            row = {**base, "kind": "estimator", "name": name, "value_network": with_net}
            try:
                m = bench_estimators.measure("eager", name, with_net, margs, actor, critic)
                row.update(status="ok" if m.get("ours_status") == "ok" else f"wrong: {m.get('status')}",
                           wall_us=m.get("ours_wall_us"), torchrl_wall_us=m.get("torchrl_wall_us"),
                           max_err=m.get("max_abs_diff"), checked_against="TorchRL's class, eager",
                           measure_status=m.get("status"))
                if with_net:  # the floor: the same call with the value functionals stubbed
                    stub = bench_estimators.measure("eager", name, with_net, margs, actor, critic, "stub", ("ours",))
                    row["stubbed_wall_us"] = stub.get("ours_wall_us")
                    floor = row["stubbed_wall_us"] or float("nan")
                    row["note"] = ("evaluates its actor and critic on every call (as TorchRL's VTrace does); "
                                   f"{floor:.0f} µs with its value functional stubbed (the networks and the module "
                                   "layer: the floor)")
                else:
                    row["note"] = "values precomputed in the rollout TensorDict"
            except Exception as e:  # noqa: BLE001
                row["status"] = f"error: {type(e).__name__}: {e}"
            run.rows.append(row)
    del x, xs
    _empty_cache()
    run.save()
    print(f"host done at {time.perf_counter() - _STARTED:.0f} s", flush=True)


# --- first call --------------------------------------------------------------------------------------------------


def part_first_call(run: Run):
    args = run.args
    B, T = args.host_shape
    cache = Path(tempfile.mkdtemp(prefix="bench_peers_triton_cache_"))
    env = dict(os.environ, TRITON_CACHE_DIR=str(cache),
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), str(HERE), os.environ.get("PYTHONPATH")])))
    cmd = [sys.executable, str(Path(__file__).resolve()), "--first-call-child", "--B", str(B), "--T", str(T),
           "--algorithms", ",".join(args.algorithms)]
    # fresh: an empty Triton cache; warm: the cache the fresh process filled; aot: another empty Triton cache and the
    # bundle of precompiled kernels ``--aot-dir`` (``python -m rl_triton_torchrl.kernels.precompile``), with no
    # launch of Triton's own before ours (a bundle needs none)
    states = ("fresh", "warm") + (("aot",) if args.aot_dir else ())
    aot_cache = Path(tempfile.mkdtemp(prefix="bench_peers_triton_cache_aot_"))
    env.pop("RL_TRITON_TORCHRL_AOT_DIR", None)
    for state in states:
        base = {"part": "first_call", "cache": state, "B": B, "T": T}
        if run.left_s("first_call") <= 0:
            run.rows.append({**base, "name": "process", "status": "not run (budget spent)"})
            continue
        start = time.perf_counter()
        child_env, child_cmd = env, cmd
        if state == "aot":
            child_env = dict(env, TRITON_CACHE_DIR=str(aot_cache), RL_TRITON_TORCHRL_AOT_DIR=str(args.aot_dir))
            child_cmd = cmd + ["--no-triton-init"]
        try:
            res = subprocess.run(child_cmd, env=child_env, capture_output=True, text=True,
                                 timeout=args.child_timeout_s)
            line = next((ln for ln in res.stdout.splitlines() if ln.startswith("FIRST_CALL_JSON ")), None)
            if line is None:
                raise RuntimeError(f"exit {res.returncode}: {(res.stderr or res.stdout).strip()[-500:]}")
            data = json.loads(line.split(" ", 1)[1])
        except Exception as e:  # noqa: BLE001
            run.rows.append({**base, "name": "process", "status": f"error: {type(e).__name__}: {e}"})
            continue
        process_s = time.perf_counter() - start
        run.rows.append({**base, "name": "process", "status": "ok", "process_s": process_s,
                         **{k: data.get(k) for k in ("import_torch_s", "cuda_init_s", "import_package_s",
                                                     "triton_init_s")},
                         **{f"aot_{k}": v for k, v in data.get("aot", {}).items() if k != "dirs"}})
        for c in data["calls"]:
            run.rows.append({**base, "name": c["algorithm"], "algorithm": c["algorithm"], "status": "ok",
                             "first_call_s": c["first_call_s"], "second_call_s": c["second_call_s"]})
        run.save()
    run.env["first_call_cache_files"] = sum(1 for _ in cache.rglob("*") if _.is_file())
    if args.aot_dir:  # what the process with the bundle compiled itself (0: every kernel of ours was loaded)
        run.env["first_call_aot_cache_files"] = sum(1 for _ in aot_cache.rglob("*.cubin"))
    shutil.rmtree(cache, ignore_errors=True)
    shutil.rmtree(aot_cache, ignore_errors=True)
    print(f"first_call done at {time.perf_counter() - _STARTED:.0f} s", flush=True)


# --- cliffs ------------------------------------------------------------------------------------------------------


def cliff_timing(fn) -> dict:
    if DEVICE == "cuda":
        us, how = device_time_us(fn, True, CLIFF_WARMUP_MS, CLIFF_REP_MS)
        return {"device_us": us, "device_timing": how}
    return {"device_us": wall_time_us(fn, 1), "device_timing": "host wall (CPU smoke)"}


def part_cliffs(run: Run, rlt, rlt_info):
    """Ours (rl-triton optional), device time only; each T's rollout is drawn once at the largest B and every B
    takes its first rows, so that the float64 reference runs once per T on the rows every B checks."""
    args = run.args
    Bs = sorted(args.cliff_B)
    impl_names = ["ours"] + (["rl_triton"] if args.cliff_peers else [])
    cells = [(a, "with" if a in TRUNCATION_ALGOS else "n/a", B, T, impl_names)
             for T in args.cliff_T for B in Bs for a in args.cliff_algorithms]
    for T in args.cliff_T:
        if run.left_s("cliffs") <= 0:
            not_run_rows(run, "cliffs", cells, "budget spent")
            return
        full = rollout(Bs[-1], T, seed=T, fields=fields_for(args.cliff_algorithms))
        for algo in args.cliff_algorithms:
            tr = "with" if algo in TRUNCATION_ALGOS else "n/a"
            xf = for_truncation(full, tr)
            need = sorted({r for B in Bs for r in sample_rows(B)[:REF_ROWS]} | {r for B in Bs for r in
                                                                               range(max(0, B - 4), B)})
            want_all = reference(algo, xf, need)
            position = {r: i for i, r in enumerate(need)}
            for B in Bs:
                x = {k: (v[:B] if isinstance(v, torch.Tensor) else v) for k, v in xf.items()}
                x["B"] = B
                rows = sorted(set(sample_rows(B)[:REF_ROWS]) | set(range(max(0, B - 4), B)))
                want = [w[[position[r] for r in rows]] for w in want_all]
                for name in impl_names:
                    row = {"part": "cliffs", "algorithm": algo, "truncation": tr, "B": B, "T": T, "dtype": "float32",
                           "impl": name}
                    if name == "ours":
                        fn, inputs = make_ours(algo, x)
                        checks = [("max_err", lambda out, w=want, rs=rows: compare([o[rs] for o in out[:len(w)]], w,
                                                                                   "ours vs float64"))]
                    elif rlt is None or DEVICE != "cuda":
                        row["status"] = _peer_row_status(rlt_info)
                        run.rows.append(row)
                        continue
                    else:
                        fn, inputs = make_peer(algo, x, rlt)
                        pairs = PEER_PAIRS[algo]
                        checks = [("max_err", lambda out, w=want, rs=rows, p=pairs: compare(
                            [out[j][rs] for _, j in p], [w[i] for i, _ in p], "rl-triton vs float64"))]
                    check_impl(row, fn, inputs, checks)
                    time_impl(row, fn, cliff_timing)
                    run.rows.append(row)
        del full
        _empty_cache()
        run.save()
    print(f"cliffs done at {time.perf_counter() - _STARTED:.0f} s", flush=True)


# ---------------------------------------------------------------------------------------------------------------
# The plan: cells and estimated time of each part
# ---------------------------------------------------------------------------------------------------------------

# Assumptions of the estimate on an H200 (the previous session's numbers; see the module docstring)
PLAN = {"startup_s": 15.0,  # python, torch, triton; copy bandwidth; rl-triton import
        "measure_s": 0.09,  # one implementation's four timings in one cell, beyond its calls
        "ours_call_s": 10e-6, "peer_call_s": 90e-6,
        "ours_compile_s": 0.8, "peer_compile_s": 0.7,  # one kernel compiled with an empty Triton cache
        "ref_step_s": 70e-6,  # one time step of a float64 reference on the sampled rows (Python loop)
        # do_bench of one cell with its check and capture: 96 s for GAE's 792 cells at 0e2d941, 0.09-0.12 s a cell
        # with two algorithms at 22158c3 (the plan said 0.035 then, and the sweeps ran past their limits)
        "cliff_cell_s": 0.12,
        "host_fn_s": 0.35, "module_s": 2.5, "child_s": 9.0, "child_compile_s": 0.8,
        "puffer_build_s": 60.0, "report_s": 1.0}


def _ours_jits(cells) -> int:
    """Kernel compiles of ours (a new time tile, divisibility of T by 16, long-sequence mode or flags compile
    again; roughly)."""
    keys = set()
    for algo, tr, B, T in cells:
        block = min(max(1 << max(0, (T - 1).bit_length()), 2), 128)
        keys.add((algo, tr, block, T % 16 == 0, T >= 4096 and B <= 512))
    return len(keys)


def _peer_jits(cells) -> int:
    return len({(algo, tr, 1 << max(0, (T - 1).bit_length())) for algo, tr, B, T in cells})


def plan(args) -> dict:
    P = PLAN
    parts = {}
    rel = [(a, tr, B, T) for B, T in args.release_shapes for tr in args.truncation for a in args.algorithms
           if (a in TRUNCATION_ALGOS or tr == args.truncation[0])]
    rel = [(a, (tr if a in TRUNCATION_ALGOS else "n/a"), B, T) for a, tr, B, T in rel]
    if "release" in args.parts:
        s = sum(2 * P["measure_s"] + 150 * (P["ours_call_s"] + P["peer_call_s"]) + T * P["ref_step_s"]
                for _, _, B, T in rel)
        s += _ours_jits(rel) * P["ours_compile_s"] + _peer_jits(rel) * P["peer_compile_s"]
        parts["release"] = {"cells": len(rel), "ours_compiles": _ours_jits(rel), "rl_triton_compiles": _peer_jits(rel),
                            "s": round(s)}
    if "pufferlib" in args.parts:
        pc = [("gae", "without", B, T) for B, T in args.pufferlib_shapes]
        s = sum(3 * P["measure_s"] + T * P["ref_step_s"] for *_, T in pc)
        s += _ours_jits(pc) * P["ours_compile_s"] + _peer_jits(pc) * P["peer_compile_s"]
        parts["pufferlib"] = {"cells": len(pc), "s": round(s), "build_s_overlapping_release": P["puffer_build_s"]}
    if "host" in args.parts:
        n_fn = len(ALGORITHMS) + 3 + (len(FUNCTIONALS) if "functionals" in args.host_parts else 0)
        # three modules of three implementations each, and VTrace's floor: ours alone, stubbed
        s = n_fn * P["host_fn_s"] + 8 * P["ours_compile_s"] + ((3 + 1 / 3) * P["module_s"]
                                                                 if "modules" in args.host_parts else 0)
        parts["host"] = {"functions": n_fn, "s": round(s)}
    if "first_call" in args.parts:
        s = 2 * P["child_s"] + len(args.algorithms) * P["child_compile_s"]
        parts["first_call"] = {"processes": 2, "s": round(s)}
    if "cliffs" in args.parts:
        cc = [(a, "with", B, T) for T in args.cliff_T for B in args.cliff_B for a in args.cliff_algorithms]
        s = len(cc) * P["cliff_cell_s"] * (2 if args.cliff_peers else 1) + _ours_jits(cc) * P["ours_compile_s"]
        s += sum(args.cliff_T) * P["ref_step_s"] * len(args.cliff_algorithms)
        parts["cliffs"] = {"cells": len(cc), "ours_compiles": _ours_jits(cc), "s": round(s)}
    total = P["startup_s"] + sum(p["s"] for p in parts.values()) + P["report_s"]
    if "pufferlib" in parts and parts.get("release", {}).get("s", 0) < P["puffer_build_s"]:
        total += P["puffer_build_s"] - parts.get("release", {}).get("s", 0)  # waiting for the build
    return {"parts": parts, "startup_s": P["startup_s"], "total_s": round(total), "budget_s": args.budget_s,
            "assumptions": P}


# ---------------------------------------------------------------------------------------------------------------
# --check-mapping: our input mapping against rl-triton's own pure-torch references (CPU)
# ---------------------------------------------------------------------------------------------------------------


def _rl_triton_tests_dir() -> Path | None:
    if os.environ.get("RL_TRITON_TESTS"):
        return Path(os.environ["RL_TRITON_TESTS"])
    src = os.environ.get("RL_TRITON_SRC")
    if not src:
        return None
    for cand in (Path(src).parent / "rl_triton_tests", Path(src).parent / "tests"):
        if (cand / "test_gae.py").exists():
            return cand
    return None


def peer_reference(algo: str, kw: dict, tests) -> tuple:
    """rl-triton's own reference for ``algo`` on its mapped arguments ``kw`` (from ``peer_inputs``)."""
    g, lam = kw.get("gamma"), kw.get("lambda_")
    with_trunc = "truncateds" in kw and algo != "retrace_discrete"
    if algo == "gae":
        if with_trunc:
            return (tests.test_gae._ref_gae_sequential(kw["rewards"], kw["values"], kw["terminateds"], kw["truncateds"],
                                                       kw["bootstrap_values"], g, lam),)
        return (tests.test_gae.reference_gae(kw["rewards"], kw["values"], kw["terminateds"], g, lam,
                                             bootstrap_values=kw["last_value"]),)
    if algo == "td_lambda":
        if with_trunc:
            return (tests.test_returns._ref_lambda_sequential(kw["rewards"], kw["next_values"], kw["terminateds"],
                                                              kw["truncateds"], kw["bootstrap_values"], g, lam),)
        return (tests.test_returns.reference_lambda_returns(kw["rewards"], kw["next_values"], kw["terminateds"], g,
                                                            lam, bootstrap_values=kw["bootstrap_values"]),)
    if algo == "discounted_return":
        if with_trunc:
            return (tests.test_returns._ref_discounted_sequential(kw["rewards"], kw["terminateds"], kw["truncateds"],
                                                                  kw["bootstrap_values"], g),)
        return (tests.test_returns.reference_discounted_returns(kw["rewards"], kw["terminateds"], g),)
    if algo == "eligibility_traces":
        return (tests.test_returns.reference_eligibility_traces(kw["gradients"], kw["dones"], g, lam),)
    if algo == "episodic_prefix_sum":
        return (tests.test_prefix_sum.reference_episodic_prefix_sum(kw["inputs"], kw["dones"], boundary="ends_at"),)
    if algo == "vtrace":
        a = (kw["log_pi_target"], kw["log_pi_behavior"], kw["values"], kw["rewards"], kw["terminateds"])
        if with_trunc:
            return tuple(tests.test_vtrace._ref_vtrace_sequential(*a, kw["truncateds"], kw["bootstrap_values"], g))
        return tuple(tests.test_vtrace.reference_vtrace(*a, g, bootstrap_values=kw["last_value"]))
    if algo == "retrace_discrete":
        return tuple(tests.test_retrace.reference_retrace(
            kw["action_probs_target"], kw["action_probs_behavior"], kw["q_values"], kw["next_q_values_all"],
            kw["actions"], kw["rewards"], kw["terminateds"], kw["truncateds"], g, lam))
    raise KeyError(algo)


def import_rl_triton_tests(tests_dir: Path, src: Path | None = None):
    """rl-triton's test modules, imported from its snapshot (they import ``bench_utils`` and ``rl_triton`` by
    name): ``src`` (default ``$RL_TRITON_SRC``) and ``tests_dir`` go on the path."""
    import importlib

    src = src or (Path(os.environ["RL_TRITON_SRC"]) if os.environ.get("RL_TRITON_SRC") else None)
    if src is not None and str(Path(src).resolve()) not in sys.path:
        sys.path.insert(0, str(Path(src).resolve()))
    sys.path.insert(0, str(tests_dir))
    return types.SimpleNamespace(**{m: importlib.import_module(m) for m in
                                    ("test_gae", "test_returns", "test_vtrace", "test_retrace", "test_prefix_sum")})


def check_mapping(tests_dir: Path, src: Path | None = None, B: int = 6, T: int = 33, seed: int = 3,
                  zero_window_bootstrap=False, algorithms=ALGORITHMS) -> list[dict]:
    """For each algorithm and truncation setting: rl-triton's reference on the mapped inputs against our float64
    reference (and our torch path) on ours, on a CPU rollout with the edge cases. Rows with ``ok``.

    ``zero_window_bootstrap``: the mapping made wrong on purpose (see ``peer_inputs``), for the test that this
    check can fail."""
    tests = import_rl_triton_tests(tests_dir, src)
    base = rollout(B, T, seed=seed, device="cpu")
    assert bool(base["trunc"][:, :-1].any()) and bool(base["term"][:, :-1].any()), "no interior episode ends drawn"
    out = []
    for algo in algorithms:
        for truncation in (("with", "without") if algo in TRUNCATION_ALGOS else ("n/a",)):
            x = for_truncation(base, truncation)
            want = reference(algo, x, list(range(B)))
            theirs = peer_reference(algo, peer_inputs(algo, x, zero_window_bootstrap), tests)
            ours_torch = _tuple(make_ours(algo, x, backend="torch")[0]())
            pairs = PEER_PAIRS[algo]
            err, message = compare([theirs[j] for _, j in pairs], [want[i] for i, _ in pairs],
                                   f"{algo} ({truncation}): rl-triton's reference vs our float64 reference")
            err_t, message_t = compare(list(ours_torch[:len(want)]), want, f"{algo} ({truncation}): our torch path")
            out.append({"algorithm": algo, "truncation": truncation, "B": B, "T": T, "max_err": err,
                        "ours_torch_err": err_t, "ok": message is None and message_t is None,
                        "message": message or message_t})
    return out


# ---------------------------------------------------------------------------------------------------------------
# --extract-peers: the peers' code into ignored folders, for the GPU machine
# ---------------------------------------------------------------------------------------------------------------


def extract_peers(dest: Path, mirror: Path | None, commit: str, sdist: Path | None) -> dict:
    """rl-triton's ``src/rl_triton`` (and ``tests/``) at ``commit`` from a bare git mirror, and PufferLib 3.0.0's two
    extension files from its sdist (``pip download``; its metadata step may fail offline, the unpacked sources are
    kept with ``--no-clean``), each with a SOURCE.json. Nothing is written outside ``dest``."""
    dest.mkdir(parents=True, exist_ok=True)
    report = {}
    if mirror is not None:
        full = subprocess.run(["git", "--git-dir", str(mirror), "rev-parse", f"{commit}^{{commit}}"],
                              capture_output=True, text=True, check=True).stdout.strip()
        for tree, target in ((f"{full}:src", dest / "rl_triton_src"), (f"{full}:tests", dest / "rl_triton_tests")):
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir(parents=True)
            archive = subprocess.run(["git", "--git-dir", str(mirror), "archive", "--format=tar", tree],
                                     capture_output=True, check=True).stdout
            subprocess.run(["tar", "-x", "-C", str(target)], input=archive, check=True)
        source = {"repo": "simonsays1980/rl-triton", "commit": full, "from": str(mirror)}
        for target in (dest / "rl_triton_src", dest / "rl_triton_tests"):
            (target / "SOURCE.json").write_text(json.dumps(source, indent=1))
        report["rl_triton"] = source
    puffer = dest / "pufferlib"
    with tempfile.TemporaryDirectory(prefix="pufferlib_sdist_") as tmp:
        tmp = Path(tmp)
        if sdist is None:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:",
                            "--no-build-isolation", "--no-clean", "pufferlib==3.0.0", "-d", str(tmp / "dl")],
                           env=dict(os.environ, TMPDIR=str(tmp)), capture_output=True, text=True)
            sdists = list((tmp / "dl").glob("pufferlib-3.0.0.tar.gz")) if (tmp / "dl").exists() else []
            sdist = sdists[0] if sdists else None
        found = {}
        if sdist is not None:
            import tarfile

            with tarfile.open(sdist) as tar:
                for member in tar.getmembers():
                    if member.name.endswith(("extensions/pufferlib.cpp", "extensions/cuda/pufferlib.cu")):
                        found[Path(member.name).name] = tar.extractfile(member).read()
        else:  # the unpacked sdist pip kept
            for name, pattern in (("pufferlib.cpp", "**/pufferlib/extensions/pufferlib.cpp"),
                                  ("pufferlib.cu", "**/pufferlib/extensions/cuda/pufferlib.cu")):
                hits = sorted(tmp.glob(pattern))
                if hits:
                    found[name] = hits[0].read_bytes()
        if set(found) != set(PUFFER_FILES):
            raise RuntimeError(f"pufferlib==3.0.0's extension files not found (got {sorted(found)})")
        puffer.mkdir(parents=True, exist_ok=True)
        sums = {}
        for name, data in found.items():
            (puffer / name).write_bytes(data)
            sums[name] = hashlib.sha256(data).hexdigest()
        source = {"package": "pufferlib==3.0.0", "files": ["pufferlib/extensions/pufferlib.cpp",
                                                           "pufferlib/extensions/cuda/pufferlib.cu"],
                  "sha256": sums, "sha256_matches_expected": sums == PUFFER_SHA256}
        (puffer / "SOURCE.json").write_text(json.dumps(source, indent=1))
        report["pufferlib"] = source
    return report


# ---------------------------------------------------------------------------------------------------------------


class _Stop(BaseException):
    pass


def _on_sigterm(signum, frame):
    raise _Stop(f"signal {signum}")


def _shapes(text):
    return [tuple(int(v) for v in s.lower().split("x")) for s in text.split(",")] if text else None


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated, from {PARTS}")
    parser.add_argument("--quick", action="store_true", help="fewer cells: release 5 shapes, PufferLib 4, cliffs "
                        "B in 1, 1000, 65536")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (a CPU check of the plumbing)")
    parser.add_argument("--plan", action="store_true", help="print the cells and estimated time per part; run nothing")
    parser.add_argument("--budget-s", type=float, default=None, help="the run's budget; default 420 on a GPU, none "
                        "on the CPU")
    parser.add_argument("--algorithms", default=",".join(ALGORITHMS))
    parser.add_argument("--truncation", default="with,without")
    parser.add_argument("--release-shapes", help="BxT,... replacing rl-triton's release grid")
    parser.add_argument("--pufferlib-shapes", help="BxT,... replacing PufferLib's grid")
    parser.add_argument("--cliff-B", help="comma-separated batch sizes of the cliff sweep")
    parser.add_argument("--cliff-T", help="comma-separated T of the cliff sweep (default: T <= 64 and around powers "
                        "of two)")
    parser.add_argument("--T-all", action="store_true", help="cliffs: every T from 1 to 4096")
    parser.add_argument("--cliff-algorithms", default="gae")
    parser.add_argument("--cliff-peers", action="store_true", help="cliffs: rl-triton too")
    parser.add_argument("--host-parts", default="kernels,functionals,modules",
                        help="host part: kernels (our kernels API), functionals (TorchRL's signatures), modules")
    parser.add_argument("--host-shape", default="4096x128")
    parser.add_argument("--full-calls", type=int, default=30)
    parser.add_argument("--full-repeats", type=int, default=5)
    parser.add_argument("--wall-budget-s", type=float, default=0.01)
    parser.add_argument("--wall-repeats", type=int, default=3)
    parser.add_argument("--wall-calls", type=int, default=None, help="calls per wall time (default: as many as fit "
                        "in --wall-budget-s, 3 to 200)")
    parser.add_argument("--graph-calls", type=int, default=50)
    parser.add_argument("--graph-reps", type=int, default=5)
    parser.add_argument("--warmup-ms", type=float, default=3.0)
    parser.add_argument("--rep-ms", type=float, default=10.0)
    parser.add_argument("--host-calls", type=int, default=2000)
    parser.add_argument("--host-repeats", type=int, default=5)
    parser.add_argument("--module-calls", type=int, default=None, help="calls per estimator-module wall time "
                        "(default: bench_estimators', as many as fit in 0.5 s, at most 200)")
    parser.add_argument("--child-timeout-s", type=float, default=120)
    parser.add_argument("--aot-dir", help="first_call: a third process, with an empty Triton cache and this bundle "
                        "of precompiled kernels (python -m rl_triton_torchrl.kernels.precompile)")
    parser.add_argument("--variant", default="base", help="one of ablate_kernels.py's variants (an A/B of the kernels "
                        "or of their launch rule), applied in this process before anything runs (first_call's fresh "
                        "processes run main's)")
    parser.add_argument("--out", default="h200" if DEVICE == "cuda" else "cpu",
                        help="subdirectory of benchmarks/results, or a path")
    parser.add_argument("--name", default="bench_peers")
    parser.add_argument("--no-report", action="store_true")
    parser.add_argument("--check-mapping", action="store_true",
                        help="CPU: check the input mapping onto rl-triton's API against its own references")
    parser.add_argument("--extract-peers", metavar="DEST", help="write the peers' code into DEST (ignored by git)")
    parser.add_argument("--rl-triton-mirror", help="bare git mirror of rl-triton (with --extract-peers)")
    parser.add_argument("--rl-triton-commit", default=RL_TRITON_COMMIT)
    parser.add_argument("--pufferlib-sdist", help="pufferlib-3.0.0.tar.gz already downloaded (with --extract-peers)")
    args = parser.parse_args(argv)
    args.parts = [p for p in args.parts.split(",") if p]
    unknown = [p for p in args.parts if p not in PARTS]
    if unknown:
        parser.error(f"unknown part {unknown}; choose from {PARTS}")
    args.algorithms = args.algorithms.split(",")
    args.cliff_algorithms = args.cliff_algorithms.split(",")
    for a in args.algorithms + args.cliff_algorithms:
        if a not in ALGORITHMS:
            parser.error(f"unknown algorithm {a!r}; choose from {ALGORITHMS}")
    args.truncation = args.truncation.split(",")
    args.host_parts = args.host_parts.split(",")
    mode = "smoke" if args.smoke else "quick" if args.quick else None
    args.release_shapes = _shapes(args.release_shapes) or (SMOKE["release"] if args.smoke else
                                                           QUICK["release"] if args.quick else RELEASE_SHAPES)
    args.pufferlib_shapes = _shapes(args.pufferlib_shapes) or (
        SMOKE["pufferlib"] if args.smoke else QUICK["pufferlib"] if args.quick else
        [(B, T) for B in PUFFER_B for T in PUFFER_T])
    args.cliff_B = [int(b) for b in args.cliff_B.split(",")] if args.cliff_B else list(
        SMOKE["cliff_B"] if args.smoke else QUICK["cliff_B"] if args.quick else CLIFF_B)
    args.cliff_T = [int(t) for t in args.cliff_T.split(",")] if args.cliff_T else (
        list(SMOKE["cliff_T"]) if args.smoke else cliff_Ts(args.T_all))
    args.host_shape = SMOKE["host"] if args.smoke and args.host_shape == "4096x128" else _shapes(args.host_shape)[0]
    if args.smoke:  # a few calls per timing
        args.full_calls, args.full_repeats, args.wall_repeats, args.wall_calls = 1, 1, 1, 1
        args.host_calls, args.host_repeats, args.module_calls = 2, 1, 2
    if args.budget_s is None:
        args.budget_s = 420.0 if DEVICE == "cuda" else math.inf
    args.mode = mode
    return args


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if args.extract_peers:
        print(json.dumps(extract_peers(Path(args.extract_peers), Path(args.rl_triton_mirror) if args.rl_triton_mirror
                                       else None, args.rl_triton_commit,
                                       Path(args.pufferlib_sdist) if args.pufferlib_sdist else None), indent=1))
        return
    if args.check_mapping:
        tests_dir = _rl_triton_tests_dir()
        if tests_dir is None:
            sys.exit("--check-mapping needs rl-triton's tests/: set $RL_TRITON_TESTS or $RL_TRITON_SRC (see --help)")
        rows = check_mapping(tests_dir, algorithms=args.algorithms)
        for r in rows:
            print(json.dumps(r))
        bad = [r for r in rows if not r["ok"]]
        print(f"check-mapping: {len(rows) - len(bad)} of {len(rows)} agree")
        sys.exit(1 if bad else 0)
    estimate = plan(args)
    print(f"plan: {json.dumps(estimate)}", flush=True)
    if args.plan:
        return
    signal.signal(signal.SIGTERM, _on_sigterm)
    if args.variant != "base":
        from ablate_kernels import apply_variant

        apply_variant(args.variant)
    run = Run(args, argv)
    run.env["variant"] = args.variant
    rlt, rlt_info = load_rl_triton()
    puffer = PufferLib()
    if "pufferlib" in args.parts:
        puffer.start(with_cuda=DEVICE == "cuda")
    env = run.env
    env["peers"] = {"rl_triton": rlt_info, "pufferlib": puffer.info}
    env["plan"] = estimate
    env["mode"] = args.mode
    env["measurement"] = {k: getattr(args, k) for k in ("full_calls", "full_repeats", "wall_budget_s", "wall_repeats",
                                                        "graph_calls", "graph_reps", "warmup_ms", "rep_ms",
                                                        "host_calls", "host_repeats", "budget_s")}
    env["constants"] = {"gamma": GAMMA, "lmbda": LMBDA, "actions": ACTIONS, "terminate_p": TERMINATE_P,
                        "truncate_p": TRUNCATE_P, "ref_rows": REF_ROWS, "tolerance": TOL}
    bandwidth = copy_bandwidth(device=DEVICE) if DEVICE == "cuda" else copy_bandwidth(64 << 20, device=DEVICE)
    env["copy_bandwidth_GBps"] = round(bandwidth / 1e9, 1)
    env["startup_s"] = time.perf_counter() - _STARTED
    print(f"{env.get('gpu', DEVICE)}: copy bandwidth {bandwidth / 1e9:.0f} GB/s; rl-triton: {rlt_info['status']}; "
          f"pufferlib: {puffer.info.get('status')}", flush=True)
    steps = {"release": lambda: part_release(run, rlt, rlt_info),
             "pufferlib": lambda: part_pufferlib(run, rlt, rlt_info, puffer),
             "host": lambda: part_host(run), "first_call": lambda: part_first_call(run),
             "cliffs": lambda: part_cliffs(run, rlt, rlt_info)}
    try:
        for part in PARTS:
            if part in args.parts:
                start = time.perf_counter()
                steps[part]()
                run.part_times[part] = round(time.perf_counter() - start, 1)
    except (KeyboardInterrupt, _Stop) as e:
        env["interrupted"] = str(e) or type(e).__name__
        print(f"interrupted ({env['interrupted']}): writing what was measured", flush=True)
    finally:
        if puffer.proc is not None and puffer.proc.poll() is None:
            puffer.proc.terminate()  # our own build process, if it still runs
        run.save()
    print(f"wrote {run.path} ({len(run.rows)} rows, {time.perf_counter() - _STARTED:.0f} s; plan said "
          f"{estimate['total_s']} s)", flush=True)
    if not args.no_report:
        import report_peers

        print(f"wrote {report_peers.write_report(run.path)}", flush=True)


if __name__ == "__main__":
    main()
