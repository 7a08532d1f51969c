"""Stable-Baselines3 PPO on CartPole-v1, with SB3's rollout buffer or ours (GAE on rl_triton_torchrl's kernels).

    python examples/sb3_ppo.py --buffer triton [--total-timesteps 30000] [--n-envs 8] [--seed 0] [--device cpu]

Only the buffer class changes between ``--buffer sb3`` and ``--buffer triton``: from the same seed both train the
same policy (up to float32 rounding). SB3's logger prints its table while training and writes progress.csv under
``--log-dir``; at the end the script plots the training episode return and prints the mean evaluation return.
"""
import argparse


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--buffer", choices=["sb3", "triton"], default="triton",
                        help="sb3: SB3's RolloutBuffer; triton: rl_triton_torchrl.sb3.RolloutBuffer (Triton on "
                             "CUDA, the torch path on CPU)")
    parser.add_argument("--total-timesteps", type=int, default=30_000, help="environment steps to train for")
    parser.add_argument("--n-envs", type=int, default=8, help="parallel environments")
    parser.add_argument("--n-steps", type=int, default=256, help="steps per environment per rollout")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cpu", help="torch device of the policy and the buffer")
    parser.add_argument("--log-dir", default="runs/sb3_ppo", help="where progress.csv and the plot go")
    parser.add_argument("--eval-episodes", type=int, default=20)
    return parser.parse_args(argv)


# ---- arguments first (CleanRL style): --help and a wrong flag answer before torch and SB3 are imported ----
if __name__ == "__main__":
    ARGS = parse_args()

# ---- the heavy imports (below the arguments on purpose) ----
from pathlib import Path

from stable_baselines3 import PPO
from stable_baselines3.common.buffers import RolloutBuffer as SB3RolloutBuffer
from stable_baselines3.common.env_util import make_vec_env
from stable_baselines3.common.evaluation import evaluate_policy
from stable_baselines3.common.logger import configure

import rl_triton_torchrl.sb3


def main(args):
    # environment: n_envs CartPoles, seeded
    env = make_vec_env("CartPole-v1", n_envs=args.n_envs, seed=args.seed)

    # model: SB3's PPO; the one argument that swaps the rollout buffer
    buffer_class = rl_triton_torchrl.sb3.RolloutBuffer if args.buffer == "triton" else SB3RolloutBuffer
    model = PPO("MlpPolicy", env, n_steps=args.n_steps, batch_size=256, n_epochs=10, gamma=0.99, gae_lambda=0.95,
                seed=args.seed, device=args.device, rollout_buffer_class=buffer_class, verbose=0)

    # loop and logging: SB3's training loop, its logger to stdout and CSV
    log_dir = Path(args.log_dir) / args.buffer
    model.set_logger(configure(str(log_dir), ["stdout", "csv"]))
    model.learn(total_timesteps=args.total_timesteps)

    plot(log_dir / "progress.csv", log_dir / "episode_return.png", args.buffer)
    mean, std = evaluate_policy(model, make_vec_env("CartPole-v1", n_envs=1, seed=args.seed + 1000),
                                n_eval_episodes=args.eval_episodes, deterministic=True)
    print(f"buffer={args.buffer} ({buffer_class.__module__}.{buffer_class.__name__}): "
          f"mean return {mean:.1f} +- {std:.1f} over {args.eval_episodes} evaluation episodes")


def plot(csv_path: Path, png_path: Path, label: str):
    """Training episode return (SB3's rollout/ep_rew_mean) against environment steps."""
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(csv_path) as f:
        rows = [r for r in csv.DictReader(f) if r.get("rollout/ep_rew_mean")]
    plt.figure(figsize=(5, 3))
    plt.plot([int(r["time/total_timesteps"]) for r in rows], [float(r["rollout/ep_rew_mean"]) for r in rows],
             label=label)
    plt.xlabel("environment steps")
    plt.ylabel("mean episode return")
    plt.legend()
    plt.tight_layout()
    plt.savefig(png_path)
    print(f"wrote {csv_path} and {png_path}")


if __name__ == "__main__":
    main(ARGS)
