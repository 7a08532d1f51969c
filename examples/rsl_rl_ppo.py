"""rsl_rl's OnPolicyRunner (Isaac Lab's PPO) on a batched GPU environment; ``--algorithm`` swaps rsl_rl's PPO class
for ours, whose ``compute_returns`` is one fused GAE kernel instead of a Python loop over time.

The two runs differ in one line of the training config (see ``ALGORITHMS`` below)::

    train_cfg["algorithm"]["class_name"] = "PPO"                           # --algorithm rsl_rl
    train_cfg["algorithm"]["class_name"] = "rl_triton_torchrl.rsl_rl:PPO"  # --algorithm triton

Everything else (environment, runner, models, optimiser, seeds) is rsl_rl's code and the same in both.

    python examples/rsl_rl_ppo.py                                  # CartPole, 4096 envs x 24 steps, our PPO
    python examples/rsl_rl_ppo.py --algorithm rsl_rl               # the same run with rsl_rl's own PPO
    python examples/rsl_rl_ppo.py --env Pendulum --exact-timeouts  # time-outs bootstrapped from V(s_(t+1))

The environment is ``examples/gpu_envs`` (Gymnasium's CartPole-v1 or Pendulum-v1 dynamics over N environments in
pure torch, stepped on ``--device``) behind rsl_rl's ``VecEnv`` interface; rsl_rl's Gaussian actions push the cart
right where positive (CartPole) or are the torque (Pendulum). Nothing leaves the GPU but the logged numbers.
Episodes start at random points of their time limit (``learn(init_at_random_ep_len=True)``, as Isaac Lab's training
scripts do), so that time-outs spread over the iterations instead of all falling in the same one.

Outputs, in ``--out`` (default ``runs/rsl_rl_<env>_<algorithm>_<seed>``): ``progress.csv`` (one row per iteration:
frames, frames per second, mean return and length of the episodes finished in it, rsl_rl's losses, and the time of
collection, of ``compute_returns`` (the device synchronised before and after it) and of the whole update) and
``curves.png`` (return against frames and wall time, and the ``compute_returns`` time per iteration).
"""
from __future__ import annotations

import argparse
import copy
import csv
import os
import sys
import time

# ---- the one difference between the two runs: which PPO class rsl_rl builds ----
ALGORITHMS = {"rsl_rl": "PPO", "triton": "rl_triton_torchrl.rsl_rl:PPO"}

ENV_DEFAULTS = {
    "CartPole": dict(iterations=60, gamma=0.99, lam=0.95, learning_rate=1e-3, entropy_coef=0.005),
    "Pendulum": dict(iterations=150, gamma=0.95, lam=0.95, learning_rate=1e-3, entropy_coef=0.0),
}


def make_parser():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--algorithm", choices=sorted(ALGORITHMS), default="triton",
                        help="rsl_rl's own PPO, or ours (compute_returns on the Triton GAE kernel)")
    parser.add_argument("--env", choices=sorted(ENV_DEFAULTS), default="CartPole", help="the batched environment")
    parser.add_argument("--device", default=None, help="where everything runs (default: cuda if available)")
    parser.add_argument("--seed", type=int, default=0, help="seed of torch and of the environments")
    parser.add_argument("--num-envs", type=int, default=4096, help="parallel environments (default: 4096)")
    parser.add_argument("--steps", type=int, default=24,
                        help="num_steps_per_env: frames per iteration = num_envs * steps (default: 24)")
    parser.add_argument("--iterations", type=int, help="learning iterations (CartPole: 60, Pendulum: 150)")
    parser.add_argument("--max-episode-steps", type=int,
                        help="time limit of an episode (Gymnasium's: CartPole 500, Pendulum 200)")
    parser.add_argument("--gamma", type=float, help="discount (CartPole: 0.99, Pendulum: 0.95)")
    parser.add_argument("--lam", type=float, help="GAE lambda (0.95)")
    parser.add_argument("--learning-rate", type=float, help="initial learning rate, adapted to the KL (1e-3)")
    parser.add_argument("--entropy-coef", type=float, help="entropy bonus (CartPole: 0.005, Pendulum: 0)")
    parser.add_argument("--epochs", type=int, default=5, help="num_learning_epochs (default: 5)")
    parser.add_argument("--minibatches", type=int, default=4, help="num_mini_batches (default: 4)")
    parser.add_argument("--hidden", default="64,64", help="hidden layers of actor and critic (default: 64,64)")
    parser.add_argument("--recurrent", action="store_true", help="LSTM actor and critic (rsl_rl's RNNModel)")
    parser.add_argument("--per-minibatch-normalization", action="store_true",
                        help="normalize_advantage_per_mini_batch=True (normalised in the update, not in "
                             "compute_returns)")
    parser.add_argument("--exact-timeouts", action="store_true",
                        help="(triton only) exact_timeout_bootstrap=True: bootstrap time-outs from the value of "
                             "the final observation instead of rsl_rl's value before the step")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="(triton only, CUDA) cuda_graph=True: compute_returns replays one CUDA graph")
    parser.add_argument("--cross-check", action="store_true",
                        help="every iteration, also run the other PPO class's compute_returns on a copy of the "
                             "same storage and log the largest differences (adv_max_abs_diff, "
                             "target_max_abs_diff); its time is left out of the logged times")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (default: 1)")
    parser.add_argument("--out", help="output directory (default: runs/rsl_rl_<env>_<algorithm>_<seed>)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    return parser


def parse_args(argv=None):
    args = make_parser().parse_args(argv)
    for name, value in ENV_DEFAULTS[args.env].items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.algorithm == "rsl_rl" and (args.exact_timeouts or args.cuda_graph):
        raise SystemExit("--exact-timeouts and --cuda-graph are options of our PPO: use --algorithm triton")
    if args.out is None:
        args.out = os.path.join("runs", f"rsl_rl_{args.env}_{args.algorithm}_{args.seed}")
    return args


def train_config(args):
    """rsl_rl 5.x's training config (the dict Isaac Lab's ``RslRlOnPolicyRunnerCfg`` becomes)."""
    hidden = [int(h) for h in args.hidden.split(",")]
    model = {"class_name": "RNNModel", "rnn_type": "lstm", "rnn_hidden_dim": hidden[0]} if args.recurrent else \
        {"class_name": "MLPModel"}
    algorithm = {
        "class_name": ALGORITHMS[args.algorithm],
        "num_learning_epochs": args.epochs, "num_mini_batches": args.minibatches,
        "learning_rate": args.learning_rate, "schedule": "adaptive", "desired_kl": 0.01,
        "gamma": args.gamma, "lam": args.lam, "entropy_coef": args.entropy_coef, "value_loss_coef": 1.0,
        "clip_param": 0.2, "max_grad_norm": 1.0, "use_clipped_value_loss": True,
        "normalize_advantage_per_mini_batch": args.per_minibatch_normalization,
    }
    if args.algorithm == "triton":
        algorithm.update(exact_timeout_bootstrap=args.exact_timeouts, cuda_graph=args.cuda_graph)
    return {
        "num_steps_per_env": args.steps,
        "save_interval": 10**9,
        "check_for_nan": False,  # rsl_rl's check synchronises every step
        "obs_groups": {"actor": ["policy"], "critic": ["policy"]},
        "algorithm": algorithm,
        "actor": {**model, "hidden_dims": hidden, "activation": "elu",
                  "distribution_cfg": {"class_name": "GaussianDistribution", "init_std": 1.0}},
        "critic": {**model, "hidden_dims": hidden, "activation": "elu"},
    }


def other_ppo_class(algorithm: str):
    """The PPO class of the other ``--algorithm`` (what ``--cross-check`` compares against)."""
    from rsl_rl.utils import resolve_callable

    return resolve_callable(ALGORITHMS["rsl_rl" if algorithm == "triton" else "triton"])


def twin_targets(alg, cls, obs):
    """``cls.compute_returns(obs)`` on a twin of ``alg`` (the same critic, gamma, lambda and normalisation) whose
    storage is a copy: its (advantages, returns), ``alg`` and its storage untouched. A recurrent critic's hidden
    state is restored by either class's call."""
    twin = object.__new__(cls)
    twin.__dict__.update(alg.__dict__)
    twin.__dict__.setdefault("_graph", None)  # our PPO's options, for a twin made from rsl_rl's
    twin.__dict__.setdefault("exact_timeout_bootstrap", False)
    twin.storage = copy.copy(alg.storage)
    twin.storage.returns = alg.storage.returns.clone()  # rsl_rl's loop writes into it
    twin.storage.advantages = alg.storage.advantages.clone()
    cls.compute_returns(twin, obs)
    return twin.storage.advantages, twin.storage.returns


def main(argv=None):
    args = parse_args(argv)  # before importing torch: --help and bad flags answer at once

    import torch
    from rsl_rl.runners import OnPolicyRunner
    from tqdm import tqdm

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # examples/ is a folder of scripts
    from gpu_envs import ENVS
    from gpu_envs.rsl_rl_env import RslRlVecEnv
    from ppo_gpu import plot_curves  # the same figure as the TorchRL GPU example's

    os.makedirs(args.out, exist_ok=True)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))

    def synchronize():
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    # ---- seeding ----
    torch.manual_seed(args.seed)
    torch.set_num_threads(args.threads)

    # ---- environment: N environments stepped together on the device ----
    env = RslRlVecEnv(ENVS[args.env](args.num_envs, device=device, seed=args.seed,
                                     max_episode_steps=args.max_episode_steps))

    # ---- rsl_rl's runner: builds the PPO class named in the config, its models and storage ----
    runner = OnPolicyRunner(env, train_config(args), log_dir=None, device=str(device))

    # ---- timing compute_returns (synchronised) and logging each iteration, through the runner's own calls ----
    returns_times, cross_checks = [], []
    other = other_ppo_class(args.algorithm)

    def timed_compute_returns(obs, compute_returns=runner.alg.compute_returns):
        synchronize()
        start = time.perf_counter()
        compute_returns(obs)
        synchronize()
        returns_times.append(time.perf_counter() - start)
        if args.cross_check:
            start = time.perf_counter()
            st = runner.alg.storage
            advantages, returns = twin_targets(runner.alg, other, obs)
            cross_checks.append(((advantages - st.advantages).abs().max().item(),
                                 (returns - st.returns).abs().max().item()))
            cross_time.append(time.perf_counter() - start)

    runner.alg.compute_returns = timed_compute_returns

    csv_path = os.path.join(args.out, "progress.csv")
    fields = ["iteration", "frames", "wall_time_s", "fps", "episodes", "return_mean", "episode_length_mean",
              "loss_value", "loss_surrogate", "loss_entropy", "learning_rate", "collection_time_s",
              "compute_returns_time_s", "learn_time_s", "iteration_time_s"]
    if args.cross_check:
        fields += ["adv_max_abs_diff", "target_max_abs_diff"]
    cross_time = []
    frames_per_iteration = args.num_envs * args.steps
    rows = []
    bar = tqdm(total=args.iterations * frames_per_iteration, unit="frame", disable=not args.progress,
               desc=f"rsl_rl/{args.algorithm}")
    csv_file = open(csv_path, "w", newline="")
    writer = csv.DictWriter(csv_file, fieldnames=fields)
    writer.writeheader()
    start = time.perf_counter()

    def log(*, it, collect_time, learn_time, loss_dict, learning_rate, **_):
        collect_time -= sum(cross_time)  # the cross-check ran inside rsl_rl's collection
        cross_time.clear()
        episodes, mean_return, mean_length = env.episode_stats()
        iteration_time = collect_time + learn_time
        row = {"iteration": len(rows), "frames": (len(rows) + 1) * frames_per_iteration,
               "wall_time_s": f"{time.perf_counter() - start:.3f}", "fps": f"{frames_per_iteration / iteration_time:.0f}",
               "episodes": episodes, "return_mean": "" if mean_return is None else f"{mean_return:.2f}",
               "episode_length_mean": "" if mean_length is None else f"{mean_length:.1f}",
               **{f"loss_{k}": f"{loss_dict[k]:.5g}" for k in ("value", "surrogate", "entropy")},
               "learning_rate": f"{learning_rate:.3g}", "collection_time_s": f"{collect_time:.6f}",
               "compute_returns_time_s": f"{returns_times[-1]:.6f}", "learn_time_s": f"{learn_time:.6f}",
               "iteration_time_s": f"{iteration_time:.6f}"}
        if args.cross_check:
            row["adv_max_abs_diff"], row["target_max_abs_diff"] = (f"{d:.3g}" for d in cross_checks[-1])
        writer.writerow(row)
        csv_file.flush()
        rows.append(row)
        bar.update(frames_per_iteration)
        bar.set_postfix(ret=row["return_mean"] or "-", fps=row["fps"],
                        returns_ms=f"{1e3 * returns_times[-1]:.3f}")

    runner.logger.log = log  # rsl_rl's logger writes nothing without a log_dir; this is called once per iteration

    # ---- training ----
    runner.learn(num_learning_iterations=args.iterations, init_at_random_ep_len=True)
    bar.close()
    csv_file.close()

    plot_curves(rows, os.path.join(args.out, "curves.png"),
                f"rsl_rl PPO on {args.env} ({args.num_envs} envs x {args.steps} steps), algorithm={args.algorithm}",
                time_key="compute_returns_time_s", time_label="compute_returns (ms)")
    wall = time.perf_counter() - start
    frames = len(rows) * frames_per_iteration
    last = next((r["return_mean"] for r in reversed(rows) if r["return_mean"] != ""), "-")
    times = sorted(returns_times)
    print(f"{args.env} algorithm={args.algorithm} seed={args.seed} on {device}: {frames} frames in {wall:.1f} s "
          f"({frames / wall:.0f} frames/s), final mean return {last}")
    print(f"  compute_returns: median {1e6 * times[len(times) // 2]:.1f} us per iteration, "
          f"{100 * sum(returns_times) / wall:.2f}% of the wall time")
    print(f"  wrote {csv_path} and {os.path.join(args.out, 'curves.png')}")
    return rows


if __name__ == "__main__":
    main()
