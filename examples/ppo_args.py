"""The command-line flags of ``ppo_gymnasium.py`` and ``ppo_ddp.py``.

Kept apart from the training code, with nothing heavy imported, so that both scripts parse their arguments before
they import torch, TorchRL and Gymnasium: ``--help`` and a mistyped flag answer at once.
"""
from __future__ import annotations

import argparse
import os

# --estimator: which class computes the advantages (``GAE_CLASSES`` in ppo_gymnasium.py)
ESTIMATORS = ("torchrl", "triton")

# Per-environment defaults; any flag given on the command line wins. Other environments get "default".
ENV_DEFAULTS = {
    "default": dict(num_envs=8, rollout_len=64, total_frames=500_000, lr=3e-4, gamma=0.99, lmbda=0.95, epochs=10,
                    minibatch_size=256, entropy_coeff=0.0, target_return=None),
    "CartPole-v1": dict(num_envs=8, rollout_len=32, total_frames=100_000, lr=1e-3, gamma=0.98, lmbda=0.8, epochs=20,
                        minibatch_size=256, entropy_coeff=0.0, target_return=475.0),
    "Pendulum-v1": dict(num_envs=4, rollout_len=512, total_frames=200_000, lr=1e-3, gamma=0.9, lmbda=0.95, epochs=10,
                        minibatch_size=64, entropy_coeff=0.0, target_return=-200.0),
}


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """The module docstring as written, and each flag's default where it has a value of its own."""

    def _get_help_string(self, action):
        if action.default is None or isinstance(action.default, bool) or action.default is argparse.SUPPRESS:
            return action.help
        return f"{action.help} (default: %(default)s)"


def make_parser(description, prefix="ppo"):
    """The command-line flags (``examples/ppo_ddp.py`` adds its own to these)."""
    parser = argparse.ArgumentParser(description=description, formatter_class=HelpFormatter)
    parser.add_argument("--estimator", choices=ESTIMATORS, default="triton",
                        help="which GAE class computes the advantages: TorchRL's or rl_triton_torchrl's")
    parser.add_argument("--env-id", default="CartPole-v1",
                        help="a Gymnasium environment id; CartPole-v1 and Pendulum-v1 have tuned defaults (below), "
                             "other ids get 8 envs x 64 steps, 500000 frames, lr 3e-4, gamma 0.99, lambda 0.95, "
                             "10 epochs of minibatches of 256")
    parser.add_argument("--seed", type=int, default=0, help="seed for torch and the environments")
    parser.add_argument("--device", default="cpu",
                        help="device of the networks, the rollout and the estimator (e.g. cpu, cuda, cuda:1); "
                             "the Gymnasium environments themselves step on the CPU")
    parser.add_argument("--num-envs", type=int, help="parallel environments (CartPole-v1: 8, Pendulum-v1: 4)")
    parser.add_argument("--vectorization", choices=["vector_entry_point", "sync", "async"],
                        help="gymnasium vector env: 'vector_entry_point' is Gymnasium's natively vectorised numpy "
                             "implementation (CartPole-v0/v1; the default where available), 'sync' steps one "
                             "environment object after the other in this process (any id; the default otherwise), "
                             "'async' one subprocess each (worth it with many CPU cores or slow environments)")
    parser.add_argument("--rollout-len", type=int,
                        help="steps per environment per iteration: frames per batch = num_envs * rollout_len "
                             "(CartPole-v1: 32, Pendulum-v1: 512)")
    parser.add_argument("--total-frames", type=int,
                        help="environment steps in all (CartPole-v1: 100000, Pendulum-v1: 200000)")
    parser.add_argument("--lr", type=float, help="Adam learning rate (CartPole-v1 and Pendulum-v1: 1e-3)")
    parser.add_argument("--no-anneal-lr", dest="anneal_lr", action="store_false",
                        help="keep the learning rate constant instead of decaying it linearly to 0")
    parser.add_argument("--gamma", type=float, help="discount (CartPole-v1: 0.98, Pendulum-v1: 0.9)")
    parser.add_argument("--lmbda", type=float, help="GAE lambda (CartPole-v1: 0.8, Pendulum-v1: 0.95)")
    parser.add_argument("--epochs", type=int, help="passes over each batch (CartPole-v1: 20, Pendulum-v1: 10)")
    parser.add_argument("--minibatch-size", type=int, help="samples per gradient step (CartPole-v1: 256, "
                                                           "Pendulum-v1: 64)")
    parser.add_argument("--clip-epsilon", type=float, default=0.2, help="PPO clipping range")
    parser.add_argument("--entropy-coeff", type=float, help="entropy bonus coefficient (all: 0)")
    parser.add_argument("--critic-coeff", type=float, default=0.5, help="value loss coefficient")
    parser.add_argument("--max-grad-norm", type=float, default=0.5, help="gradient clipping norm")
    parser.add_argument("--hidden", type=int, default=64, help="width of the two hidden layers of actor and critic")
    parser.add_argument("--return-window", type=int, default=20,
                        help="the logged mean episode return averages the last this-many finished episodes")
    parser.add_argument("--target-return", type=float,
                        help="report the first frame at which the mean return reaches this "
                             "(CartPole-v1: 475, Pendulum-v1: -200)")
    parser.add_argument("--threads", type=int, default=1,
                        help="torch CPU threads (small networks run fastest on one)")
    parser.add_argument("--cross-check", action="store_true",
                        help="also run the other estimator class on every batch (kept out of the timings) and log "
                             "the largest absolute difference of the advantages and value targets")
    parser.add_argument("--out", help=f"output directory (default runs/{prefix}_<env>_<estimator>_<seed>)")
    parser.add_argument("--no-progress", dest="progress", action="store_false", help="no progress bar")
    return parser


def parse_args(parser, argv=None, prefix="ppo"):
    """Parses the flags and fills in the per-environment defaults and the output directory. ``--vectorization``
    stays None where it is not given: the training script picks it (that needs Gymnasium)."""
    args = parser.parse_args(argv)
    defaults = ENV_DEFAULTS.get(args.env_id, ENV_DEFAULTS["default"])
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    if args.out is None:
        args.out = os.path.join("runs", f"{prefix}_{args.env_id}_{args.estimator}_{args.seed}")
    return args
