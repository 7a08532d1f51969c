"""PPO entirely on the GPU with TorchRL: thousands of environments stepped in torch, the rollout, the estimator, the
loss and the optimiser on one device; ``--estimator`` swaps TorchRL's GAE for ours.

The two runs differ in one line, the class that computes the advantages (``examples/ppo_gymnasium.py``'s
``GAE_CLASSES``)::

    from torchrl.objectives.value import GAE   # --estimator torchrl
    from rl_triton_torchrl import GAE          # --estimator triton

    python examples/ppo_gpu.py                                      # CartPole, 4096 envs, our GAE
    python examples/ppo_gpu.py --estimator torchrl                  # the same run with TorchRL's GAE
    python examples/ppo_gpu.py --num-envs 65536 --update cudagraphs # the update replayed as a CUDA graph
    python examples/ppo_gpu.py --env Pendulum --recompute-advantage # advantages from the current critic each epoch

The environment is ``examples/gpu_envs`` (Gymnasium's CartPole-v1 or Pendulum-v1 dynamics over N environments in
pure torch) as a TorchRL ``EnvBase``; TorchRL's ``Collector`` resets finished environments, so truncated steps
bootstrap from their true final observation. The models, loss and optimiser are ``examples/ppo_gymnasium.py``'s.

``--update`` runs the PPO update (loss, backward, gradient clipping and the Adam step of one minibatch) as written
(``eager``), under ``torch.compile`` (``compile``), replayed as a CUDA graph by tensordict's ``CudaGraphModule``
(``cudagraphs``; Adam with ``capturable=True`` and its learning rate a tensor), or both (``compile+cudagraphs``),
as pytorch-labs' LeanRL does for CleanRL. ``auto`` (the default): ``eager`` on the CPU, ``cudagraphs`` on CUDA.
Minibatches are whole (the batch's remainder is left out of each epoch), so that every step has one shape.

``--recompute-advantage`` computes the advantages again with the current critic before every epoch after the first
(the estimator's time includes it).

Outputs, in ``--out`` (default ``runs/ppo_gpu_<env>_<estimator>_<seed>``): ``progress.csv`` (one row per iteration:
frames, frames per second, mean return of the episodes finished in it, the losses, and the time of collection, of
the estimator calls, of the update and of the whole iteration, each with the device synchronised) and
``curves.png`` (return against frames and wall time, and the estimator's time per iteration).
"""
from __future__ import annotations

import argparse
import csv
import math
import os
import sys
import time

ENV_DEFAULTS = {
    "CartPole": dict(num_envs=4096, rollout_len=32, total_frames=8_388_608, lr=2.5e-3, gamma=0.98, lmbda=0.8,
                     epochs=4, minibatch_size=16384, entropy_coeff=0.0),
    "Pendulum": dict(num_envs=4096, rollout_len=64, total_frames=10_485_760, lr=1e-3, gamma=0.9, lmbda=0.95,
                     epochs=10, minibatch_size=8192, entropy_coeff=0.0),
}
UPDATE_MODES = ("auto", "eager", "compile", "cudagraphs", "compile+cudagraphs")


def make_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--estimator", choices=["torchrl", "triton"], default="triton",
                        help="which GAE class computes the advantages: TorchRL's or rl_triton_torchrl's")
    parser.add_argument("--env", choices=sorted(ENV_DEFAULTS), default="CartPole", help="the batched environment")
    parser.add_argument("--device", default=None, help="where everything runs (default: cuda if available)")
    parser.add_argument("--seed", type=int, default=0, help="seed of torch and of the environments")
    parser.add_argument("--num-envs", type=int, help="parallel environments (4096)")
    parser.add_argument("--rollout-len", type=int, help="steps per environment per batch (CartPole 32, Pendulum 64)")
    parser.add_argument("--total-frames", type=int, help="environment steps in all, rounded up to whole batches")
    parser.add_argument("--max-episode-steps", type=int, help="time limit (Gymnasium's: CartPole 500, Pendulum 200)")
    parser.add_argument("--lr", type=float, help="Adam learning rate (CartPole 2.5e-3, Pendulum 1e-3)")
    parser.add_argument("--no-anneal-lr", dest="anneal_lr", action="store_false",
                        help="keep the learning rate constant instead of decaying it linearly to 0")
    parser.add_argument("--gamma", type=float, help="discount (CartPole 0.98, Pendulum 0.9)")
    parser.add_argument("--lmbda", type=float, help="GAE lambda (CartPole 0.8, Pendulum 0.95)")
    parser.add_argument("--epochs", type=int, help="passes over each batch (CartPole 4, Pendulum 10)")
    parser.add_argument("--minibatch-size", type=int, help="samples per gradient step (CartPole 16384, Pendulum "
                                                            "8192)")
    parser.add_argument("--clip-epsilon", type=float, default=0.2, help="PPO clipping range (0.2)")
    parser.add_argument("--entropy-coeff", type=float, help="entropy bonus coefficient (0)")
    parser.add_argument("--critic-coeff", type=float, default=0.5, help="value loss coefficient (0.5)")
    parser.add_argument("--max-grad-norm", type=float, default=0.5, help="gradient clipping norm (0.5)")
    parser.add_argument("--hidden", type=int, default=64, help="width of the two hidden layers (64)")
    parser.add_argument("--update", choices=UPDATE_MODES, default="auto",
                        help="how the minibatch update runs: eager, torch.compile, CUDA graphs, or both "
                             "(auto: eager on the CPU, cudagraphs on CUDA)")
    parser.add_argument("--compile-backend", default="inductor", help="torch.compile backend of --update compile")
    parser.add_argument("--recompute-advantage", action="store_true",
                        help="recompute the advantages with the current critic before every epoch")
    parser.add_argument("--cross-check", action="store_true",
                        help="also run the other estimator class on every batch (kept out of the timings) and log "
                             "the largest absolute difference of the advantages and value targets")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (1)")
    parser.add_argument("--out", help="output directory (default runs/ppo_gpu_<env>_<estimator>_<seed>)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    return parser


def parse_args(argv=None):
    args = make_parser().parse_args(argv)
    for name, value in ENV_DEFAULTS[args.env].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.out is None:
        args.out = os.path.join("runs", f"ppo_gpu_{args.env}_{args.estimator}_{args.seed}")
    return args


def plot_curves(rows, path, title, time_key="estimator_time_s", time_label="estimator calls (ms)"):
    """Return against frames and wall time, and the time of ``time_key`` per iteration (also rsl_rl_ppo.py's)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(14, 3.8))
    curve = [r for r in rows if r["return_mean"] != ""]
    for ax, x, label in ((axes[0], "frames", "environment frames"), (axes[1], "wall_time_s", "wall time (s)")):
        ax.plot([float(r[x]) for r in curve], [float(r["return_mean"]) for r in curve])
        ax.set_xlabel(label)
        ax.set_ylabel("mean return of the episodes finished")
        ax.grid(alpha=0.3)
    axes[0].ticklabel_format(axis="x", style="sci", scilimits=(0, 0))
    axes[2].plot([int(r["iteration"]) for r in rows], [1e3 * float(r[time_key]) for r in rows])
    axes[2].set_xlabel("iteration")
    axes[2].set_ylabel(time_label)
    axes[2].set_yscale("log")
    axes[2].grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None):
    args = parse_args(argv)  # before importing torch: --help and bad flags answer at once

    import torch
    from tensordict.nn import CudaGraphModule
    from torch import nn
    from torchrl.collectors import Collector
    from torchrl.envs import RewardSum, TransformedEnv
    from torchrl.objectives import ClipPPOLoss
    from tqdm import tqdm

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # examples/ is a folder of scripts
    import ppo_gymnasium as single  # its models and the two GAE classes
    from gpu_envs import ENVS
    from gpu_envs.torchrl_env import TorchRLEnv

    os.makedirs(args.out, exist_ok=True)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    update_mode = args.update if args.update != "auto" else ("cudagraphs" if device.type == "cuda" else "eager")
    if "cudagraphs" in update_mode and device.type != "cuda":
        raise SystemExit(f"--update {update_mode} needs a CUDA device, got --device {device}")

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    # ---- seeding ----
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)

    # ---- environment: N environments stepped together on the device ----
    env = TransformedEnv(TorchRLEnv(ENVS[args.env](args.num_envs, device=device, seed=args.seed,
                                                   max_episode_steps=args.max_episode_steps)), RewardSum())

    # ---- model: separate actor and critic MLPs (ppo_gymnasium's) ----
    actor, critic = single.make_models(env, args.hidden, device)

    # ---- estimator, loss, optimiser ----
    gae_kwargs = dict(gamma=args.gamma, lmbda=args.lmbda, value_network=critic, average_gae=True, device=device)
    advantage_module = single.GAE_CLASSES[args.estimator](**gae_kwargs)
    if args.cross_check:
        other_module = single.GAE_CLASSES["torchrl" if args.estimator == "triton" else "triton"](**gae_kwargs)
    graphed = "cudagraphs" in update_mode
    graphed_eager = graphed and "compile" not in update_mode  # captured as the eager code runs
    # TorchRL's loss checks its analytic entropy for non-finite values on the host (a synchronisation, which a CUDA
    # graph cannot capture) unless torch.compile traces it: a graph without the compiler gets the same bonus here
    loss_module = ClipPPOLoss(actor, critic, clip_epsilon=args.clip_epsilon, entropy_coeff=args.entropy_coeff,
                              critic_coeff=args.critic_coeff, loss_critic_type="l2", normalize_advantage=False,
                              entropy_bonus=not graphed_eager)
    params = list(loss_module.parameters())
    # a captured Adam step reads its learning rate from a tensor (so that annealing can change it in place)
    optimizer = torch.optim.Adam(params, lr=torch.tensor(args.lr, device=device) if graphed else args.lr, eps=1e-5,
                                 capturable=graphed_eager)

    def set_lr(lr):
        for group in optimizer.param_groups:
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(lr)
            else:
                group["lr"] = lr

    def gradient_step(batch):
        """One minibatch: the clipped PPO loss, its gradients clipped, one Adam step; the losses, detached."""
        optimizer.zero_grad()
        losses = loss_module(batch)
        if graphed_eager:  # TorchRL's bonus, -entropy_coeff * mean entropy, from the same distribution
            entropy = actor.get_dist(batch).entropy().mean()
            losses["entropy"], losses["loss_entropy"] = entropy.detach(), -args.entropy_coeff * entropy
        loss = losses["loss_objective"] + losses["loss_critic"] + losses["loss_entropy"]
        loss.backward()
        nn.utils.clip_grad_norm_(params, args.max_grad_norm)
        optimizer.step()
        return losses.select(*single.LOSS_KEYS).detach()

    update_step = gradient_step
    if "compile" in update_mode:
        update_step = torch.compile(update_step, backend=args.compile_backend)
    if graphed:
        update_step = CudaGraphModule(update_step, in_keys=[], out_keys=[], warmup=3 if "compile" in update_mode else 2)

    frames_per_batch = args.num_envs * args.rollout_len
    num_iterations = math.ceil(args.total_frames / frames_per_batch)
    steps_per_epoch = frames_per_batch // args.minibatch_size
    if steps_per_epoch == 0:
        raise SystemExit(f"--minibatch-size {args.minibatch_size} is larger than a batch ({frames_per_batch} frames)")
    collector = Collector(env, actor, frames_per_batch=frames_per_batch, total_frames=num_iterations * frames_per_batch,
                          device=device, auto_register_policy_transforms=False)

    def estimate(data):
        """The estimator call (values of the batch and of "next", then GAE), timed with the device synchronised."""
        synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            advantage_module(data)
        synchronize()
        return time.perf_counter() - start

    # ---- training loop ----
    csv_path = os.path.join(args.out, "progress.csv")
    fields = ["iteration", "frames", "wall_time_s", "fps", "episodes", "return_mean", *single.LOSS_KEYS,
              "collection_time_s", "estimator_time_s", "update_time_s", "iteration_time_s", "lr"]
    if args.cross_check:
        fields += ["adv_max_abs_diff", "target_max_abs_diff"]
    rows, frames = [], 0
    bar = tqdm(total=num_iterations * frames_per_batch, unit="frame", disable=not args.progress,
               desc=f"ppo_gpu/{args.estimator}/{update_mode}")
    excluded = 0.0  # seconds spent in --cross-check, kept out of the wall time

    def clock():
        return time.perf_counter() - excluded

    synchronize()
    start = iteration_start = clock()
    with open(csv_path, "w", newline="") as csv_file:
        writer = csv.DictWriter(csv_file, fieldnames=fields)
        writer.writeheader()
        for iteration, data in enumerate(collector):  # data: [num_envs, rollout_len]
            synchronize()
            collection_time = clock() - iteration_start
            frames += data.numel()
            lr = args.lr * (1.0 - iteration / num_iterations) if args.anneal_lr else args.lr
            set_lr(lr)

            estimator_time = estimate(data)
            if args.cross_check:  # the other class on a copy of the same batch
                t1 = time.perf_counter()
                with torch.no_grad():
                    check = other_module(data.exclude("advantage", "value_target").clone())
                diffs = {f"{k}_max_abs_diff": f"{(check[key] - data[key]).abs().max():.3g}"
                         for k, key in (("adv", "advantage"), ("target", "value_target"))}
                excluded += time.perf_counter() - t1

            # ---- PPO epochs over shuffled whole minibatches ----
            t2 = clock()
            recompute_time, sums = 0.0, None
            for epoch in range(args.epochs):
                if args.recompute_advantage and epoch > 0:
                    recompute_time += estimate(data)
                flat = data.reshape(-1)
                order = torch.randperm(flat.numel(), device=device)[: steps_per_epoch * args.minibatch_size]
                for idx in order.view(steps_per_epoch, args.minibatch_size):
                    losses = update_step(flat[idx])
                    sums = losses if sums is None else sums + losses
            synchronize()
            update_time = clock() - t2 - recompute_time
            estimator_time += recompute_time
            collector.update_policy_weights_()
            losses = {k: float(v) / (args.epochs * steps_per_epoch) for k, v in sums.items()}  # synchronises

            # ---- logging: the episodes finished in this batch (one synchronisation) ----
            done = data["next", "done"].squeeze(-1)
            count, total = torch.stack([done.sum().to(torch.float64), data["next", "episode_reward"].squeeze(-1)[
                done].sum().to(torch.float64)]).tolist()
            now = clock()
            row = {"iteration": iteration, "frames": frames, "wall_time_s": f"{now - start:.3f}",
                   "fps": f"{data.numel() / (now - iteration_start):.0f}", "episodes": int(count),
                   "return_mean": f"{total / count:.2f}" if count else "",
                   **{k: f"{v:.5g}" for k, v in losses.items()}, "collection_time_s": f"{collection_time:.6f}",
                   "estimator_time_s": f"{estimator_time:.6f}", "update_time_s": f"{update_time:.6f}",
                   "iteration_time_s": f"{now - iteration_start:.4f}", "lr": f"{lr:.3g}",
                   **(diffs if args.cross_check else {})}
            iteration_start = now
            writer.writerow(row)
            csv_file.flush()
            rows.append(row)
            bar.update(data.numel())
            bar.set_postfix(ret=row["return_mean"] or "-", fps=row["fps"])
    bar.close()
    collector.shutdown()
    env.close()

    plot_curves(rows, os.path.join(args.out, "curves.png"),
                f"PPO on {args.env} ({args.num_envs} envs on {device}), estimator={args.estimator}, "
                f"update={update_mode}")
    wall = float(rows[-1]["wall_time_s"])
    last = next((r["return_mean"] for r in reversed(rows) if r["return_mean"] != ""), "-")
    print(f"{args.env} estimator={args.estimator} update={update_mode} seed={args.seed} on {device}: {frames} frames "
          f"in {wall:.1f} s ({frames / wall:.0f} frames/s), final mean return {last}")
    print("  " + single.time_shares(rows))
    print(f"  wrote {csv_path} and {os.path.join(args.out, 'curves.png')}")
    return rows


if __name__ == "__main__":
    main()
