"""Estimator-module benchmark: full calls on rollout TensorDicts, ours against TorchRL's classes.

    python benchmarks/bench_estimators.py [--B 4096] [--T 128] [--out h200]

Per class (GAE, TDLambdaEstimator, VTrace) and setting (values precomputed in the rollout, or a small value
network evaluated by the module): host wall time per call (calls back to back, device drained at the end) and the
outputs' largest difference to TorchRL's. Ours is checked against TorchRL's before it is timed.
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
from _common import environment, wall_time_us, write_results

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


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--B", type=int, default=4096)
    parser.add_argument("--T", type=int, default=128)
    parser.add_argument("--out", default="h200" if DEVICE == "cuda" else "cpu")
    args = parser.parse_args()
    actor, critic = networks()
    rows = []
    for name in ("GAE", "TDLambdaEstimator", "VTrace"):
        for with_net in (False, True):
            if name == "VTrace" and not with_net:
                continue
            td = rollout(args.B, args.T)
            row = {"estimator": name, "value_network": with_net, "B": args.B, "T": args.T}
            mods = {k: build(m, name, with_net, actor, critic) for k, m in (("torchrl", trl_value), ("ours", ours))}
            key = "advantage" if name != "TDLambdaEstimator" else "value_target"
            with torch.no_grad():
                outs = {k: m(td.clone())[key] for k, m in mods.items()}
                row["max_abs_diff"] = (outs["ours"] - outs["torchrl"]).abs().max().item()
                ok = row["max_abs_diff"] <= 1e-3 * (1 + outs["torchrl"].abs().max().item())
                row["status"] = "ok" if ok else "wrong"
                for k, m in mods.items():
                    if k == "ours" and not ok:
                        continue
                    data = td.clone()
                    row[f"{k}_wall_us"] = wall_time_us(lambda: m(data))
            if row.get("ours_wall_us"):
                row["speedup"] = row["torchrl_wall_us"] / row["ours_wall_us"]
            rows.append(row)
            print(row, flush=True)
    columns = [("estimator", "estimator"), ("value_network", "value network"), ("B", "B"), ("T", "T"),
               ("status", "check"), ("torchrl_wall_us", "TorchRL µs/call"), ("ours_wall_us", "ours µs/call"),
               ("speedup", "speed-up"), ("max_abs_diff", "max |ours - TorchRL|")]
    out = write_results("bench_estimators", environment(), rows, args.out, columns,
                        f"Estimator modules on rollout TensorDicts ({DEVICE})",
                        notes=f"Command: `python benchmarks/bench_estimators.py --B {args.B} --T {args.T}`")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
