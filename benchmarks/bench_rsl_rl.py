"""rsl_rl's ``PPO.compute_returns`` against ours (``rl_triton_torchrl.rsl_rl.PPO``), the whole call.

    python benchmarks/bench_rsl_rl.py --device cuda --out results/h200      # 4096 x 24 and 65536 x 24
    python benchmarks/bench_rsl_rl.py --sizes 8x3 --repeats 3 --out /tmp/x  # a CPU smoke

Both algorithms hold the same rollout in rsl_rl's ``RolloutStorage`` (``[T, N, 1]``, random rewards and values,
~2% dones) and the same critic (an MLP of ``--hidden`` ELU layers on ``--obs-dim`` observations, Isaac Lab's
locomotion size by default). A call is everything ``compute_returns`` does: the critic's value of the last
observation (its hidden state saved and restored), the returns and advantages, their normalisation over the batch
(``--per-minibatch`` leaves it to the update, as rsl_rl's option does). Timed under ``torch.inference_mode`` as
``OnPolicyRunner`` calls it:

- ``wall_us``: host wall time per call, the device synchronised before and after each call (median);
- ``device_us`` (CUDA): the call's kernels' own durations summed (CUPTI activity records through
  ``torch.profiler``, L2 flushed before each call; median);
- ``critic_wall_us``: the critic's forward alone, which both implementations run (the part neither can shorten);
- ``*_back_to_back_us``: host wall time per call, calls issued back to back and the device drained once at the end
  (what a training loop that does not wait pays);
- ours also with ``cuda_graph=True`` on CUDA (the kernel and the normalisation replayed as one CUDA graph);
- without the critic's forward: ``rsl_rl_targets_*`` (rsl_rl's loop and normalisation, its critic replaced by a stub
  that returns the last value), ``ours_targets_*`` and ``ours_graph_targets_*`` (our returns and normalisation,
  plain and replayed as a graph), and our two parts alone, ``ours_gae_*`` and ``ours_normalisation_*``.

Ours is checked against rsl_rl's returns and advantages first; a mismatch is reported as wrong and not timed.
Writes ``bench_rsl_rl.json`` and ``bench_rsl_rl.md`` into ``--out`` (a path, or a folder of benchmarks/results).
"""
from __future__ import annotations

import argparse
import copy
import sys
import time

import torch
from rsl_rl.algorithms import PPO as RslRlPPO
from rsl_rl.models import MLPModel
from rsl_rl.storage import RolloutStorage
from tensordict import TensorDict

from _common import environment, kernel_time_us, synced_median_s, wall_time_us, write_results
from rl_triton_torchrl.kernels._utils import resolve_backend
from rl_triton_torchrl.kernels import normalize_
from rl_triton_torchrl.rsl_rl import _EPS, RSL_RL_VERSION, PPO, _ReturnsGraph, _targets

GAMMA, LAM = 0.99, 0.95
OBS_GROUPS = {"actor": ["policy"], "critic": ["policy"]}


def std_mean_normalize_(x: torch.Tensor) -> torch.Tensor:
    """rsl_rl's batch normalisation in torch ops, in place: ``std_mean`` and three elementwise kernels."""
    std, mean = torch.std_mean(x)
    return x.sub_(mean).div_(std.add_(_EPS))


class FixedValue(torch.nn.Module):
    """A stand-in critic that returns a given value: rsl_rl's ``compute_returns`` without the critic's forward."""

    def __init__(self, value: torch.Tensor):
        super().__init__()
        self.value = value

    def forward(self, obs):
        return self.value

    def get_hidden_state(self):
        return None

    def reset(self, dones=None, hidden_state=None):
        pass


def parse_size(text: str) -> tuple[int, int]:
    num_envs, steps = text.lower().split("x")
    return int(num_envs), int(steps)


def build(num_envs, steps, args, device, seed=0, **kwargs):
    """Our PPO on a filled storage, and the observation after the last step."""
    torch.manual_seed(seed)
    obs = TensorDict({"policy": torch.randn(num_envs, args.obs_dim, device=device)}, batch_size=[num_envs],
                     device=device)
    actor = MLPModel(obs, OBS_GROUPS, "actor", 12, hidden_dims=args.hidden, activation="elu",
                     distribution_cfg={"class_name": "GaussianDistribution"})
    critic = MLPModel(obs, OBS_GROUPS, "critic", 1, hidden_dims=args.hidden, activation="elu")
    storage = RolloutStorage("rl", num_envs, steps, obs, [12], device=str(device))
    g = torch.Generator(device=device).manual_seed(seed)
    storage.rewards.copy_(torch.randn(steps, num_envs, 1, generator=g, device=device))
    storage.values.copy_(torch.randn(steps, num_envs, 1, generator=g, device=device))
    storage.dones.copy_(torch.rand(steps, num_envs, 1, generator=g, device=device) < 0.02)
    storage.step = steps
    alg = PPO(actor, critic, storage, gamma=GAMMA, lam=LAM, device=str(device),
              normalize_advantage_per_mini_batch=args.per_minibatch, **kwargs)
    return alg, obs


def wall_us(fn, repeats: int, sync) -> float:
    """Median host wall time of one call, synchronised before and after it."""
    return synced_median_s(fn, repeats, sync, warmup=3) * 1e6


def max_abs_diff(a, b) -> float:
    return float((a.double() - b.double()).abs().max())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--sizes", default="4096x24,65536x24", help="comma-separated NUM_ENVSxSTEPS")
    parser.add_argument("--obs-dim", type=int, default=48, help="observation size of the critic's input")
    parser.add_argument("--hidden", default="512,256,128", help="the critic's hidden layers")
    parser.add_argument("--per-minibatch", action="store_true",
                        help="normalize_advantage_per_mini_batch=True: no normalisation in compute_returns")
    parser.add_argument("--repeats", type=int, default=50, help="timed calls per implementation")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    parser.add_argument("--out", default=None, help="output folder (default: benchmarks/results/<device type>)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    args.hidden = [int(h) for h in args.hidden.split(",")]
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    rows = []
    for num_envs, steps in map(parse_size, args.sizes.split(",")):
        ours, obs = build(num_envs, steps, args, device)
        theirs = copy.deepcopy(ours)
        graphed = build(num_envs, steps, args, device, cuda_graph=True)[0] if cuda else None
        calls = {"rsl_rl": lambda: RslRlPPO.compute_returns(theirs, obs), "ours": lambda: ours.compute_returns(obs)}
        if graphed is not None:
            calls["ours_graph"] = lambda: graphed.compute_returns(obs)
        last_value = ours.critic(obs).detach()
        normalize = not args.per_minibatch
        # the same calls without the critic's forward, which both run: rsl_rl's loop given the last value by a stub
        # critic, our targets plain and replayed as a graph, and our two parts, the kernel and the normalisation
        theirs_targets = copy.deepcopy(theirs)
        theirs_targets.critic = FixedValue(last_value)
        targets_graph = _ReturnsGraph() if cuda else None
        scratch = torch.empty_like(ours.storage.values)
        parts = {"critic": lambda: ours.critic(obs),
                 "rsl_rl_targets": lambda: RslRlPPO.compute_returns(theirs_targets, obs),
                 "ours_targets": lambda: _targets(ours.storage, last_value, GAMMA, LAM, normalize),
                 "ours_gae": lambda: _targets(ours.storage, last_value, GAMMA, LAM, False),
                 "ours_normalisation": lambda: normalize_(scratch.copy_(ours.storage.values), _EPS),
                 # what _targets normalised with before kernels.normalize_: torch's std_mean and three kernels
                 "torch_normalisation": lambda: std_mean_normalize_(scratch.copy_(ours.storage.values))}
        if targets_graph is not None:
            parts["ours_graph_targets"] = lambda: targets_graph(ours.storage, last_value, GAMMA, LAM, normalize)
        row = {"num_envs": num_envs, "steps": steps, "device": str(device), "ours_path": resolve_backend("auto",
               device), "normalisation": "per minibatch" if args.per_minibatch else "global"}
        with torch.inference_mode():
            for call in calls.values():
                call()
            st, ref = ours.storage, theirs.storage
            row["max_abs_diff_returns"] = max_abs_diff(st.returns, ref.returns)
            row["max_abs_diff_advantages"] = max_abs_diff(st.advantages, ref.advantages)
            if graphed is not None:
                row["max_abs_diff_returns"] = max(row["max_abs_diff_returns"],
                                                  max_abs_diff(graphed.storage.returns, ref.returns))
                row["max_abs_diff_advantages"] = max(row["max_abs_diff_advantages"],
                                                     max_abs_diff(graphed.storage.advantages, ref.advantages))
            scale = 1 + float(ref.returns.abs().max())
            ok = row["max_abs_diff_returns"] <= 1e-4 * scale and row["max_abs_diff_advantages"] <= 1e-4
            row["status"] = "ok" if ok else "wrong"
            for name, fn in {**calls, **parts}.items():
                if name.startswith("ours") and not ok:
                    continue
                row[f"{name}_wall_us"] = wall_us(fn, args.repeats, sync)
                row[f"{name}_back_to_back_us"] = wall_time_us(fn)
                if cuda:
                    row[f"{name}_device_us"] = kernel_time_us(fn)
        for name in calls:
            if name != "rsl_rl" and f"{name}_wall_us" in row:
                row[f"speedup_{name}"] = row["rsl_rl_wall_us"] / row[f"{name}_wall_us"]
        for name in ("ours_targets", "ours_graph_targets"):
            if f"{name}_wall_us" in row:
                row[f"speedup_{name}"] = row["rsl_rl_targets_wall_us"] / row[f"{name}_wall_us"]
                row[f"speedup_{name}_back_to_back"] = (row["rsl_rl_targets_back_to_back_us"]
                                                       / row[f"{name}_back_to_back_us"])
        rows.append(row)
        print(f"{num_envs} x {steps}: rsl_rl {row['rsl_rl_wall_us']:.1f} us, ours "
              f"{row.get('ours_wall_us', float('nan')):.1f} us, ours graphed "
              f"{row.get('ours_graph_wall_us', float('nan')):.1f} us, critic alone {row['critic_wall_us']:.1f} us; "
              f"max abs diff {row['max_abs_diff_returns']:.2e} / {row['max_abs_diff_advantages']:.2e} "
              f"{row['status']}", flush=True)
        del ours, theirs, graphed, calls, parts
        if cuda:
            torch.cuda.empty_cache()
    env = {**environment(), "rsl_rl": RSL_RL_VERSION, "critic": f"MLP {args.obs_dim} -> {args.hidden} -> 1, ELU"}
    columns = [("num_envs", "N"), ("steps", "T"), ("rsl_rl_wall_us", "rsl_rl wall (µs)"),
               ("ours_wall_us", "ours wall (µs)"), ("speedup_ours", "speed-up")]
    if cuda:
        columns += [("ours_graph_wall_us", "ours, CUDA graph, wall (µs)"), ("speedup_ours_graph", "speed-up"),
                    ("rsl_rl_device_us", "rsl_rl device (µs)"), ("ours_device_us", "ours device (µs)"),
                    ("ours_graph_device_us", "ours, CUDA graph, device (µs)")]
    columns += [("critic_wall_us", "critic alone, wall (µs)"), ("rsl_rl_targets_wall_us", "rsl_rl without the "
                                                                                            "critic, wall (µs)"),
                ("ours_targets_wall_us", "ours without the critic, wall (µs)"), ("speedup_ours_targets", "speed-up")]
    if cuda:
        columns += [("ours_graph_targets_wall_us", "ours without the critic, CUDA graph, wall (µs)"),
                    ("speedup_ours_graph_targets", "speed-up"),
                    ("rsl_rl_targets_back_to_back_us", "rsl_rl without the critic, back to back (µs)"),
                    ("ours_targets_back_to_back_us", "ours without the critic, back to back (µs)"),
                    ("ours_graph_targets_back_to_back_us", "ours without the critic, CUDA graph, back to back (µs)"),
                    ("speedup_ours_graph_targets_back_to_back", "speed-up"),
                    ("ours_targets_device_us", "ours without the critic, device (µs)"),
                    ("ours_gae_device_us", "our kernel alone, device (µs)"),
                    ("ours_normalisation_device_us", "our normalisation (copy + normalize_), device (µs)"),
                    ("torch_normalisation_device_us", "torch std_mean normalisation (copy + 4 kernels), device (µs)"),
                    ("ours_normalisation_back_to_back_us", "our normalisation, back to back (µs)"),
                    ("torch_normalisation_back_to_back_us", "torch std_mean normalisation, back to back (µs)")]
    columns += [("ours_path", "our path"), ("max_abs_diff_returns", "max abs. diff. returns"),
                ("max_abs_diff_advantages", "max abs. diff. advantages"), ("status", "check")]
    command = "python benchmarks/bench_rsl_rl.py " + " ".join(sys.argv[1:] if argv is None else argv)
    out = write_results("bench_rsl_rl", env, rows, args.out or device.type, columns,
                        f"rsl_rl PPO.compute_returns, rsl_rl vs ours ({device}, float32, the whole call, "
                        f"{rows[0]['normalisation']} normalisation)",
                        notes=f"Command: `{command}`. Wall: synchronised before and after each call, median of "
                              f"{args.repeats}. Device: the call's kernels' durations summed.")
    print(f"wrote {out}")
    return rows


if __name__ == "__main__":
    main()
