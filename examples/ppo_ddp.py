"""Data-parallel PPO: one collector per process, actor and critic under ``DistributedDataParallel``, GAE per process
and the advantage normalised over the global batch; ``--estimator`` swaps TorchRL's GAE for ours.

Each of the N processes (ranks) steps its own ``--num-envs`` Gymnasium environments (seeded differently per rank),
computes the advantages of its own batch with the estimator class (see ``GAE_CLASSES`` in ppo_gymnasium.py),
normalises them with the mean and standard deviation of all ranks' batches together
(``rl_triton_torchrl.distributed.normalize_tensordict_advantage``: one all-reduce of three sums; the per-rank
standardisation of ppo_gymnasium.py, ``GAE(average_gae=True)``, and ``ClipPPOLoss``'s per-minibatch one are off),
and runs the PPO epochs with DDP averaging the gradients. Rank 0 writes the logs and the checkpoints. On CUDA each
rank uses ``cuda:LOCAL_RANK`` and NCCL; on the CPU, gloo.

The environment, the networks, the estimator call and the PPO update are those of ``examples/ppo_gymnasium.py``,
imported from it (``examples/`` is a folder of scripts, not a package: this file puts its own folder on
``sys.path``), with the same flags and per-environment defaults; added here: ``--checkpoint``,
``--checkpoint-every``, ``--resume``, ``--no-normalize-advantage``. ``--total-frames`` counts the frames of all
ranks; an iteration collects ``N * num_envs * rollout_len`` of them. ``--cross-check`` compares the two estimator
classes on rank 0's batch (its time counts in the iteration time, not in the estimator's or the update's).

Launch with torchrun (``python -m torch.distributed.run``), from the repository root:

(a) two processes on the CPU (gloo), CartPole with the defaults of ppo_gymnasium.py (8 envs x 32 steps per rank)::

    python -m torch.distributed.run --standalone --nproc_per_node=2 examples/ppo_ddp.py --out runs/ddp_cpu2

(b) two H200s, 4096 environments per GPU (NCCL; ``NCCL_NVLS_ENABLE=0`` keeps NVLink multicast off)::

    NCCL_NVLS_ENABLE=0 python -m torch.distributed.run --standalone --nproc_per_node=2 examples/ppo_ddp.py \\
        --device cuda --num-envs 4096 --rollout-len 32 --epochs 4 --minibatch-size 16384 --lr 2.5e-3 \\
        --total-frames 16000000 --return-window 200 --checkpoint $OUT/ddp_2gpu/checkpoint.pt --no-progress \\
        --out $OUT/ddp_2gpu

(c) the same per-rank configuration on one GPU (half the frames: the same number of iterations), for the scaling
efficiency ``fps(2 GPUs) / (2 * fps(1 GPU))`` from the two ``summary.json`` files (``fps_after_first_iteration``
leaves out the first iteration's compilation and warm-up)::

    NCCL_NVLS_ENABLE=0 python -m torch.distributed.run --standalone --nproc_per_node=1 examples/ppo_ddp.py \\
        --device cuda --num-envs 4096 --rollout-len 32 --epochs 4 --minibatch-size 16384 --lr 2.5e-3 \\
        --total-frames 8000000 --return-window 200 --no-progress --out $OUT/ddp_1gpu

Resume: ``--resume PATH`` restores the networks, the optimiser, the iteration and frame counters, the elapsed wall
time and the recent returns from a checkpoint, and continues to ``--total-frames`` (appending to ``progress.csv``
when resuming into the same ``--out``). Environments restart from fresh episodes, seeded by rank and iteration.

Outputs, in ``--out`` (default ``runs/ppo_ddp_<env>_<estimator>_<seed>``), from rank 0: ``progress.csv`` (per
iteration: global frames, wall time, episodes and mean return over all ranks, losses averaged over ranks, rank 0's
collection / estimator / update / iteration times, global frames per second), ``curves.png``, and ``summary.json``
(world size, frames, wall time, frames per second, final mean return, time shares, versions, device).
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # ppo_args.py and the single-process example
import ppo_args


def make_parser():
    """The single-process example's flags (``ppo_args.py``) and this one's."""
    parser = ppo_args.make_parser(__doc__, prefix="ppo_ddp")
    parser.add_argument("--checkpoint",
                        help="rank 0 saves networks, optimiser and counters to this file every --checkpoint-every "
                             "iterations and at the end")
    parser.add_argument("--checkpoint-every", type=int, default=10, help="iterations between checkpoints")
    parser.add_argument("--resume", help="a checkpoint written by --checkpoint to continue from")
    parser.add_argument("--no-normalize-advantage", dest="normalize_advantage", action="store_false",
                        help="use the raw GAE advantages instead of normalising them over the global batch")
    return parser


# ---- arguments first (CleanRL style): --help and a wrong flag answer before torch and TorchRL are imported ----
if __name__ == "__main__":
    ARGS = ppo_args.parse_args(make_parser(), prefix="ppo_ddp")

# ---- the heavy imports (below the arguments on purpose) ----
import csv
import json
import math
import platform
import time
from collections import deque

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from torchrl.collectors import Collector
from torchrl.objectives import ClipPPOLoss
from tqdm import tqdm

import ppo_gymnasium as single  # the single-process example: environment, models, update, logging

from rl_triton_torchrl.distributed import normalize_tensordict_advantage

FIELDS = ["iteration", "frames", "wall_time_s", "episodes", "return_mean", *single.LOSS_KEYS, "collection_time_s",
          "estimator_time_s", "update_time_s", "iteration_time_s", "fps", "lr"]


def parse_args(argv=None):
    return single.parse_args(argv, make_parser(), prefix="ppo_ddp")


def save_checkpoint(path, **state):
    """Writes ``state`` to ``path`` through a temporary file, so that a crash never leaves half a checkpoint."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    torch.save(state, path + ".tmp")
    os.replace(path + ".tmp", path)


def _leave(dist) -> None:
    """Every rank reaches the end before the process group goes: a rank that tears its connections down while
    another still talks to it can abort that one (seen once on a loaded 2-core CI machine with gloo: "terminate
    called without an active exception")."""
    dist.barrier()
    dist.destroy_process_group()


def main(argv=None):
    """Trains on this rank; ``argv``: the flags as a list of strings (None: the command line), or as parsed by
    ``ppo_args``."""
    args = single.complete_args(argv) if isinstance(argv, argparse.Namespace) else parse_args(argv)
    if "RANK" not in os.environ:
        raise SystemExit("launch with torchrun: python -m torch.distributed.run --nproc_per_node=N "
                         "examples/ppo_ddp.py ...")
    rank, world_size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", rank))

    # ---- processes: one per GPU (NCCL) or CPU process (gloo) ----
    device = torch.device(args.device)
    if device.type == "cuda":
        device = torch.device("cuda", local_rank)
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        dist.init_process_group("gloo")
    if rank == 0:
        os.makedirs(args.out, exist_ok=True)

    # ---- resume: counters, then (below, once the networks exist) their weights ----
    ckpt = torch.load(args.resume, map_location=device) if args.resume else None
    start_iteration, frames, episodes = (ckpt["iteration"], ckpt["frames"], ckpt["episodes"]) if ckpt else (0, 0, 0)
    wall_offset = ckpt["wall_time_s"] if ckpt else 0.0
    recent_returns = deque(ckpt["recent_returns"] if ckpt else [], maxlen=args.return_window)

    # ---- seeding: the same initial weights everywhere, different environments and samples per rank ----
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)
    rank_seed = args.seed + rank + world_size * start_iteration  # distinct for every (rank, start iteration)

    # ---- environment: this rank's vector env, stepped by Gymnasium on the CPU ----
    env = single.make_env(args.env_id, args.num_envs, args.vectorization, torch.device("cpu"))
    env.set_seed(rank_seed)

    # ---- model: the MLPs of ppo_gymnasium.py, each under DDP (which broadcasts rank 0's initial weights) ----
    actor, critic = single.make_models(
        env, args.hidden, device,
        wrap=lambda module: DistributedDataParallel(module, device_ids=[device] if device.type == "cuda" else None))
    torch.manual_seed(rank_seed)

    # ---- estimator, loss, optimiser ----
    GAE = single.GAE_CLASSES[args.estimator]
    # average_gae=False: the advantage is standardised over all ranks' batches below, not per rank
    gae_kwargs = dict(gamma=args.gamma, lmbda=args.lmbda, value_network=critic, average_gae=False, device=device)
    advantage_module = GAE(**gae_kwargs)
    if args.cross_check:
        other_module = single.GAE_CLASSES["torchrl" if args.estimator == "triton" else "triton"](**gae_kwargs)
    # functional=False: the loss calls the modules themselves, so the gradients go through DDP's hooks
    loss_module = ClipPPOLoss(actor, critic, clip_epsilon=args.clip_epsilon, entropy_coeff=args.entropy_coeff,
                              critic_coeff=args.critic_coeff, loss_critic_type="l2", normalize_advantage=False,
                              functional=False)
    optimizer = torch.optim.Adam(loss_module.parameters(), lr=args.lr, eps=1e-5)
    if ckpt:
        actor.load_state_dict(ckpt["actor"])
        critic.load_state_dict(ckpt["critic"])
        optimizer.load_state_dict(ckpt["optimizer"])

    frames_per_batch = args.num_envs * args.rollout_len  # per rank
    global_batch = world_size * frames_per_batch
    iterations = math.ceil(max(args.total_frames - frames, 0) / global_batch)  # in this run
    num_iterations = start_iteration + iterations  # in all, for the learning-rate schedule
    if iterations == 0:
        if rank == 0:
            print(f"nothing to do: {frames} frames done, --total-frames {args.total_frames}")
        _leave(dist)
        return None
    collector = Collector(env, actor, frames_per_batch=frames_per_batch, total_frames=iterations * frames_per_batch,
                          device=device, env_device="cpu", auto_register_policy_transforms=False)

    # ---- training loop ----
    csv_path = os.path.join(args.out, "progress.csv")
    append = bool(ckpt) and os.path.exists(csv_path)
    csv_file = open(csv_path, "a" if append else "w", newline="") if rank == 0 else None
    fields = FIELDS + (["adv_max_abs_diff", "target_max_abs_diff"] if args.cross_check else [])
    writer = csv.DictWriter(csv_file, fieldnames=fields) if rank == 0 else None
    if rank == 0 and not append:
        writer.writeheader()
    bar = tqdm(total=iterations * global_batch, unit="frame", disable=rank != 0 or not args.progress,
               desc=f"ppo_ddp/{args.estimator} x{world_size}")
    rows, first_hit, diffs = [], None, {}
    start = iteration_start = time.perf_counter()
    for i, data in enumerate(collector):  # data: this rank's [num_envs, rollout_len]
        iteration = start_iteration + i
        collection_time = time.perf_counter() - iteration_start
        frames += global_batch
        if args.anneal_lr:
            for group in optimizer.param_groups:
                group["lr"] = args.lr * (1.0 - iteration / num_iterations)

        # the estimator call on this rank's batch (timed), then the advantage normalised over all ranks' batches
        estimator_time = single.timed_estimator_call(advantage_module, data, device)
        if args.cross_check and rank == 0:  # the other class on a copy of rank 0's batch (inside the wall time)
            with torch.no_grad():
                check = other_module(data.exclude("advantage", "value_target").clone())
            diffs = {f"{k}_max_abs_diff": f"{(check[key] - data[key]).abs().max():.3g}"
                     for k, key in (("adv", "advantage"), ("target", "value_target"))}
        t2 = time.perf_counter()
        if args.normalize_advantage:
            normalize_tensordict_advantage(data)
        losses = single.ppo_update(loss_module, optimizer, data, args, device)  # DDP averages the gradients
        update_time = time.perf_counter() - t2
        collector.update_policy_weights_()

        # ---- logging: every rank's finished episodes and losses to rank 0 ----
        done = data["next", "done"].squeeze(-1)
        finished = data["next", "episode_reward"][done].squeeze(-1).tolist()
        gathered = [None] * world_size if rank == 0 else None
        dist.gather_object((finished, losses), gathered, dst=0)
        now = time.perf_counter()
        if rank == 0:
            for rank_finished, _ in gathered:
                episodes += len(rank_finished)
                recent_returns.extend(rank_finished)
            mean_return = sum(recent_returns) / len(recent_returns) if recent_returns else None
            wall = wall_offset + now - start
            if first_hit is None and args.target_return is not None and mean_return is not None \
                    and len(recent_returns) == recent_returns.maxlen and mean_return >= args.target_return:
                first_hit = (frames, wall)
            row = {"iteration": iteration, "frames": frames, "wall_time_s": f"{wall:.3f}", "episodes": episodes,
                   "return_mean": "" if mean_return is None else f"{mean_return:.2f}",
                   **{k: f"{sum(g[1][k] for g in gathered) / world_size:.5g}" for k in single.LOSS_KEYS},
                   "collection_time_s": f"{collection_time:.6f}", "estimator_time_s": f"{estimator_time:.6f}",
                   "update_time_s": f"{update_time:.6f}", "iteration_time_s": f"{now - iteration_start:.4f}",
                   "fps": f"{global_batch / (now - iteration_start):.0f}",
                   "lr": f"{optimizer.param_groups[0]['lr']:.3g}", **diffs}
            writer.writerow(row)
            csv_file.flush()
            rows.append(row)
            bar.update(global_batch)
            bar.set_postfix(ret=row["return_mean"] or "-", fps=row["fps"])
            last = i == iterations - 1
            if args.checkpoint and ((iteration + 1) % args.checkpoint_every == 0 or last):
                save_checkpoint(args.checkpoint, actor=actor.state_dict(), critic=critic.state_dict(),
                                optimizer=optimizer.state_dict(), iteration=iteration + 1, frames=frames,
                                episodes=episodes, wall_time_s=wall, recent_returns=list(recent_returns),
                                world_size=world_size, args=vars(args))
        iteration_start = time.perf_counter()
    bar.close()
    collector.shutdown()
    env.close()

    # ---- summary (rank 0): curves over the whole CSV, JSON for the scaling comparison ----
    if rank == 0:
        csv_file.close()
        with open(csv_path, newline="") as f:
            all_rows = list(csv.DictReader(f))
        single.plot_curves(all_rows, os.path.join(args.out, "curves.png"),
                           f"PPO {args.env_id}, DDP x{world_size}, estimator={args.estimator}, seed={args.seed}",
                           args.return_window)
        wall = sum(float(r["iteration_time_s"]) for r in rows)
        steady = rows[1:]
        summary = {
            "world_size": world_size, "backend": dist.get_backend(), "device": str(device),
            "device_name": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.machine(),
            "estimator": args.estimator, "env_id": args.env_id, "vectorization": args.vectorization,
            "num_envs_per_rank": args.num_envs, "rollout_len": args.rollout_len,
            "frames_per_iteration": global_batch, "start_iteration": start_iteration, "iterations": len(rows),
            "frames_this_run": len(rows) * global_batch, "total_frames": frames, "wall_time_s": round(wall, 3),
            "total_wall_time_s": float(rows[-1]["wall_time_s"]),
            "fps": round(len(rows) * global_batch / wall, 1),
            "fps_after_first_iteration": round(len(steady) * global_batch
                                               / sum(float(r["iteration_time_s"]) for r in steady), 1)
            if steady else None,
            "final_return": float(rows[-1]["return_mean"]) if rows[-1]["return_mean"] else None,
            "return_window": args.return_window,
            "target_return": args.target_return,
            "target_reached_at": {"frames": first_hit[0], "wall_time_s": round(first_hit[1], 3)} if first_hit else None,
            **{f"{name}_share": round(sum(float(r[f"{name}_time_s"]) for r in rows) / wall, 5)
               for name in ("collection", "estimator", "update")},
            "torch": torch.__version__, "argv": list(argv) if isinstance(argv, list) else sys.argv[1:],
        }
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=2)
        print(f"{args.env_id} DDP x{world_size} estimator={args.estimator}: {len(rows) * global_batch} frames in "
              f"{wall:.1f} s ({summary['fps']:.0f} frames/s, after the first iteration "
              f"{summary['fps_after_first_iteration'] or '-'}), final mean return {rows[-1]['return_mean'] or '-'}")
        print("  " + single.time_shares(rows))
        print(f"  wrote {csv_path}, curves.png and summary.json in {args.out}"
              + (f"; checkpoint {args.checkpoint}" if args.checkpoint else ""))
    _leave(dist)
    return rows


if __name__ == "__main__":
    main(ARGS)
