"""Estimator-module benchmark: full calls on rollout TensorDicts, ours against TorchRL's classes.

    python benchmarks/bench_estimators.py [--B 4096] [--T 128] [--modes eager,compile,cudagraph] [--out h200]
    python benchmarks/bench_estimators.py --math stub --no-value-network --estimators GAE,TD0Estimator --calls 3000

Per mode (eager; torch.compile; tensordict's CudaGraphModule), math (``real``; ``stub``: every value functional,
ours and TorchRL's, returns precomputed outputs, so only the module, TensorDict and Python layer is timed), class
and setting (values precomputed in the rollout, or a small value network evaluated by the module): host wall time
per call (calls back to back, device drained at the end), device time on CUDA, and the outputs' largest difference
to TorchRL's eager output. Three implementations: TorchRL's class, ours, and ours with its direct path switched off
(``ours_inherited``: every call through TorchRL's re-bound ``forward``). With real math each is checked against
TorchRL's eager output before it is timed; stubbed rows are timings only. The second command above times the module
layer alone (quick on a CPU too; ``--estimators`` takes GAE, TDLambdaEstimator, TD0Estimator, TD1Estimator, VTrace).
"""
from __future__ import annotations

import argparse
import contextlib
import sys

import torch
import torchrl.objectives.value as trl_value
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.modules import OneHotCategorical, ProbabilisticActor

import rl_triton_torchrl as ours
from _common import device_time_us, environment, wall_time_us, write_results

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
OBS, ACTIONS = 8, 4


def rollout(B, T, seed=0):
    g = torch.Generator(device=DEVICE).manual_seed(seed)
    shape = (B, T, 1)
    term = torch.rand(shape, generator=g, device=DEVICE) < 0.01
    done = term | (torch.rand(shape, generator=g, device=DEVICE) < 0.01)
    td = TensorDict({
        "observation": torch.randn(B, T, OBS, generator=g, device=DEVICE),
        "action": torch.nn.functional.one_hot(torch.randint(0, ACTIONS, (B, T), generator=g, device=DEVICE),
                                              ACTIONS).float(),
        "action_log_prob": -torch.rand(B, T, generator=g, device=DEVICE),
        "state_value": torch.randn(shape, generator=g, device=DEVICE),
        "next": {"observation": torch.randn(B, T, OBS, generator=g, device=DEVICE),
                 "reward": torch.randn(shape, generator=g, device=DEVICE), "done": done, "terminated": term,
                 "state_value": torch.randn(shape, generator=g, device=DEVICE)},
    }, batch_size=[B, T], device=DEVICE)
    return td


def networks():
    torch.manual_seed(0)
    critic = TensorDictModule(nn.Sequential(nn.Linear(OBS, 64), nn.Tanh(), nn.Linear(64, 1)), ["observation"],
                              ["state_value"]).to(DEVICE)
    actor = ProbabilisticActor(TensorDictModule(nn.Linear(OBS, ACTIONS), ["observation"], ["logits"]),
                               in_keys=["logits"], distribution_class=OneHotCategorical,
                               return_log_prob=True).to(DEVICE)
    return actor, critic


def build(module, name, with_net, actor, critic):
    kw = {"gamma": 0.99}
    if name in ("GAE", "TDLambdaEstimator"):
        kw["lmbda"] = 0.95
    if name == "VTrace":
        kw.update(actor_network=actor, value_network=critic)  # VTrace always evaluates the actor and critic
    else:
        kw["value_network"] = critic if with_net else None
    return getattr(module, name)(**kw)


WARMUP = 3  # CudaGraphModule's eager calls before it captures


def wrap(module, mode):
    """The module as called in ``mode``: eager, torch.compile'd (default inductor mode, as TorchRL's PPO scripts
    compile their advantage module) or inside tensordict's ``CudaGraphModule``."""
    if mode == "eager":
        return module
    if mode == "compile":
        return torch.compile(module)
    from tensordict.nn import CudaGraphModule

    return CudaGraphModule(module, warmup=WARMUP)


@contextlib.contextmanager
def stubbed_math(B, T):
    """Every value functional the estimator classes call, ours and TorchRL's, returns precomputed outputs of the
    rollout's shape: what is left to time is the module, TensorDict and Python layer around the math.

    Ours resolve in one namespace (the module our classes' re-bound methods and their direct path read), TorchRL's
    in ``torchrl.objectives.value.advantages``; the direct path of TD(lambda) and TD(1) calls the kernels' function
    that returns both outputs (``estimators._td_lambda_pair``)."""
    out = torch.zeros(B, T, 1, device=DEVICE)
    pair = (out, out)
    namespaces = [ours.GAE._torchrl_forward.__globals__, vars(sys.modules["torchrl.objectives.value.advantages"])]
    saved = []
    for namespace in namespaces:
        for name in ours.estimators.TORCHRL_FUNCTIONALS:
            saved.append((namespace, name, namespace[name]))
            two = "advantage" in name  # (advantage, value_target) pairs; the others return value targets
            namespace[name] = (lambda *a, **k: pair) if two else (lambda *a, **k: out)
    saved.append((vars(ours.estimators), "_td_lambda_pair", ours.estimators._td_lambda_pair))
    vars(ours.estimators)["_td_lambda_pair"] = lambda *a, **k: pair
    try:
        yield
    finally:
        for namespace, name, fn in saved:
            namespace[name] = fn


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--B", type=int, default=4096)
    parser.add_argument("--T", type=int, default=128)
    parser.add_argument("--modes", default="eager,compile,cudagraph" if DEVICE == "cuda" else "eager",
                        help="comma-separated: eager, compile, cudagraph (CUDA only)")
    parser.add_argument("--math", default="real", help="comma-separated: real, stub (functionals return "
                        "precomputed outputs: the module overhead alone)")
    parser.add_argument("--estimators", default="GAE,TDLambdaEstimator,VTrace",
                        help="comma-separated: GAE, TDLambdaEstimator, TD0Estimator, TD1Estimator, VTrace")
    parser.add_argument("--no-value-network", action="store_true",
                        help="only the rows with values precomputed (VTrace, which always evaluates its networks, "
                             "is then left out)")
    parser.add_argument("--calls", type=int, default=None, help="calls per wall-time measurement (default: as many "
                        "as fit in 0.5 s, at most 200)")
    parser.add_argument("--out", default="h200" if DEVICE == "cuda" else "cpu")
    parser.add_argument("--name", default="bench_estimators", help="results file name (without extension)")
    args = parser.parse_args()
    actor, critic = networks()
    rows = []
    for math in args.math.split(","):
        for mode in args.modes.split(","):
            for name in args.estimators.split(","):
                for with_net in (False,) if args.no_value_network else (False, True):
                    if name == "VTrace" and not with_net:
                        continue
                    rows.append(measure(mode, name, with_net, args, actor, critic, math))
                    print(rows[-1], flush=True)
    columns = [("math", "math"), ("mode", "mode"), ("estimator", "estimator"), ("value_network", "value network"),
               ("B", "B"), ("T", "T"), ("status", "check"), ("torchrl_wall_us", "TorchRL µs/call"),
               ("ours_wall_us", "ours µs/call"), ("ours_inherited_wall_us", "ours, TorchRL's forward µs/call"),
               ("speedup", "speed-up"), ("torchrl_device_us", "TorchRL device µs"),
               ("ours_device_us", "ours device µs"), ("max_abs_diff", "max |ours - TorchRL eager|")]
    command = (f"python benchmarks/bench_estimators.py --B {args.B} --T {args.T} --modes {args.modes} --math "
               f"{args.math} --estimators {args.estimators}{' --no-value-network' if args.no_value_network else ''}"
               f"{f' --calls {args.calls}' if args.calls else ''} --name {args.name}")
    out = write_results(args.name, environment(), rows, args.out, columns,
                        f"Estimator modules on rollout TensorDicts ({DEVICE})",
                        notes=f"Command: `{command}`\n\nWall time: host time per call, calls back to back, the "
                              "device drained once at the end. Device time: median of do_bench with L2 flushed, the "
                              "call captured in a CUDA graph of its own when it can be (else timed as called, "
                              "host gaps included). With real math every mode's output is checked against "
                              "TorchRL's eager output before it is timed; `stub` rows time the module layer alone "
                              "(every functional returns precomputed outputs) and are not checked. `ours, TorchRL's "
                              "forward`: our class with its direct path switched off.")
    print(f"wrote {out}")


def measure(mode, name, with_net, args, actor, critic, math="real", timed=("torchrl", "ours", "ours_inherited")):
    """One row: the estimator ``name`` in ``mode``, checked against TorchRL's eager class and timed, for each
    implementation in ``timed`` (TorchRL's class, ours, ours through the inherited forward); ``math="stub"`` replaces
    the value functionals by a stub (timing only)."""
    torch._dynamo.reset()  # a fresh compile cache per row (the classes share code objects)
    td = rollout(args.B, args.T)
    row = {"math": math, "mode": mode, "estimator": name, "value_network": with_net, "B": args.B, "T": args.T}
    key = "advantage" if name != "TDLambdaEstimator" else "value_target"
    eager = {k: build(m, name, with_net, actor, critic) for k, m in (("torchrl", trl_value), ("ours", ours),
                                                                      ("ours_inherited", ours))}
    eager["ours_inherited"].direct_path = False
    if mode == "cudagraph" and with_net:  # TorchRL's value-network call checks next observations for NaN (a sync)
        row["status"] = "not capturable (the value-network call synchronises, in TorchRL's code)"
        return row
    with torch.no_grad(), (stubbed_math(args.B, args.T) if math == "stub" else contextlib.nullcontext()):
        reference = eager["torchrl"](td.clone())[key]
        scale = 1 + reference.abs().max().item()
        for k, module in eager.items():
            if k not in timed:
                continue
            data = td.clone()
            try:
                fn = wrap(module, mode)
                for _ in range(WARMUP + 2):  # compiled, or warmed up, captured and replayed
                    out = fn(data)[key]
            except Exception as e:  # noqa: BLE001 - reported in the table, not hidden
                row[f"{k}_status"] = f"failed: {type(e).__name__}"
                continue
            if math == "real":
                diff = (out - reference).abs().max().item()
                if k == "ours":
                    row["max_abs_diff"] = diff
                if diff > 1e-3 * scale:
                    row[f"{k}_status"] = "wrong"
                    continue
                row[f"{k}_status"] = "ok"
            else:
                row[f"{k}_status"] = "stubbed (timing only)"
            # the best of three loops after 50 ms of calls (a loop's first calls pay for cold caches)
            row[f"{k}_wall_us"] = min(wall_time_us(lambda: fn(data), args.calls, warmup_s=0.05 if i == 0 else 0.0)
                                      for i in range(3))
            if DEVICE == "cuda":
                row[f"{k}_device_us"], row[f"{k}_device_how"] = device_time_us(lambda: fn(data))
    row["status"] = ", ".join(f"{k}: {row.get(f'{k}_status')}" for k in ("ours", "ours_inherited", "torchrl")
                              if k in timed)
    if row.get("ours_wall_us") and row.get("torchrl_wall_us"):
        row["speedup"] = row["torchrl_wall_us"] / row["ours_wall_us"]
    return row


if __name__ == "__main__":
    main()
