"""Estimator-module benchmark: full calls on rollout TensorDicts, ours against TorchRL's classes.

    python benchmarks/bench_estimators.py [--B 4096] [--T 128] [--modes eager,compile,cudagraph] [--out h200]

Per mode (eager; torch.compile; tensordict's CudaGraphModule), class (GAE, TDLambdaEstimator, VTrace) and setting
(values precomputed in the rollout, or a small value network evaluated by the module): host wall time per call
(calls back to back, device drained at the end), device time on CUDA, and the outputs' largest difference to
TorchRL's eager output. Each is checked against TorchRL's eager output before it is timed.
"""
from __future__ import annotations

import argparse

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


def wrap(module, mode):
    """The module as called in ``mode``: eager, torch.compile'd (default inductor mode, as TorchRL's PPO scripts
    compile their advantage module) or inside tensordict's ``CudaGraphModule``."""
    if mode == "eager":
        return module
    if mode == "compile":
        return torch.compile(module)
    from tensordict.nn import CudaGraphModule

    return CudaGraphModule(module, warmup=3)


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--B", type=int, default=4096)
    parser.add_argument("--T", type=int, default=128)
    parser.add_argument("--modes", default="eager,compile,cudagraph" if DEVICE == "cuda" else "eager",
                        help="comma-separated: eager, compile, cudagraph (CUDA only)")
    parser.add_argument("--out", default="h200" if DEVICE == "cuda" else "cpu")
    parser.add_argument("--name", default="bench_estimators", help="results file name (without extension)")
    args = parser.parse_args()
    actor, critic = networks()
    rows = []
    for mode in args.modes.split(","):
        for name in ("GAE", "TDLambdaEstimator", "VTrace"):
            for with_net in (False, True):
                if name == "VTrace" and not with_net:
                    continue
                rows.append(measure(mode, name, with_net, args, actor, critic))
                print(rows[-1], flush=True)
    columns = [("mode", "mode"), ("estimator", "estimator"), ("value_network", "value network"), ("B", "B"),
               ("T", "T"), ("status", "check"), ("torchrl_wall_us", "TorchRL µs/call"),
               ("ours_wall_us", "ours µs/call"), ("speedup", "speed-up"), ("torchrl_device_us", "TorchRL device µs"),
               ("ours_device_us", "ours device µs"), ("max_abs_diff", "max |ours - TorchRL eager|")]
    out = write_results(args.name, environment(), rows, args.out, columns,
                        f"Estimator modules on rollout TensorDicts ({DEVICE})",
                        notes=f"Command: `python benchmarks/bench_estimators.py --B {args.B} --T {args.T} "
                              f"--modes {args.modes} --name {args.name}`\n\nWall time: host time per call, calls back to back, the "
                              "device drained once at the end. Device time: median of do_bench with L2 flushed, the "
                              "call captured in a CUDA graph of its own when it can be (else timed as called, "
                              "host gaps included). Every mode's output is checked against TorchRL's eager output "
                              "before it is timed.")
    print(f"wrote {out}")


def measure(mode, name, with_net, args, actor, critic):
    torch._dynamo.reset()  # a fresh compile cache per row (the classes share code objects)
    td = rollout(args.B, args.T)
    row = {"mode": mode, "estimator": name, "value_network": with_net, "B": args.B, "T": args.T}
    key = "advantage" if name != "TDLambdaEstimator" else "value_target"
    eager = {k: build(m, name, with_net, actor, critic) for k, m in (("torchrl", trl_value), ("ours", ours))}
    if mode == "cudagraph" and with_net:  # TorchRL's value-network call checks next observations for NaN (a sync)
        row["status"] = "not capturable (the value-network call synchronises, in TorchRL's code)"
        return row
    with torch.no_grad():
        reference = eager["torchrl"](td.clone())[key]
        scale = 1 + reference.abs().max().item()
        for k, module in eager.items():
            data = td.clone()
            try:
                fn = wrap(module, mode)
                out = fn(data)[key]
                out = fn(data)[key]  # the second call (compiled, captured)
            except Exception as e:  # noqa: BLE001 - reported in the table, not hidden
                row[f"{k}_status"] = f"failed: {type(e).__name__}"
                continue
            diff = (out - reference).abs().max().item()
            if k == "ours":
                row["max_abs_diff"] = diff
            if diff > 1e-3 * scale:
                row[f"{k}_status"] = "wrong"
                continue
            row[f"{k}_status"] = "ok"
            row[f"{k}_wall_us"] = wall_time_us(lambda: fn(data))
            if DEVICE == "cuda":
                row[f"{k}_device_us"], row[f"{k}_device_how"] = device_time_us(lambda: fn(data))
    row["status"] = ", ".join(f"{k}: {row.get(f'{k}_status')}" for k in ("ours", "torchrl"))
    if row.get("ours_wall_us") and row.get("torchrl_wall_us"):
        row["speedup"] = row["torchrl_wall_us"] / row["ours_wall_us"]
    return row


if __name__ == "__main__":
    main()
