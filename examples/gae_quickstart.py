"""Quickstart: GAE on a random rollout with TorchRL's functional and with ours, same numbers.

    python examples/gae_quickstart.py [--envs 256] [--steps 1024] [--device cpu]
"""
import argparse


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--envs", type=int, default=256, help="number of parallel environments (batch)")
    parser.add_argument("--steps", type=int, default=1024, help="rollout length T")
    parser.add_argument("--device", default="auto", help="torch device; auto: cuda if available, else cpu")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


# ---- arguments first (CleanRL style): --help and a wrong flag answer before torch and TorchRL are imported ----
if __name__ == "__main__":
    ARGS = parse_args()

# ---- the heavy imports (below the arguments on purpose) ----
import time

import torch
from torchrl.objectives.value import functional as torchrl_functional

from rl_triton_torchrl import functional as ours


def main(args):
    if args.device == "auto":
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(args.seed)
    shape = (args.envs, args.steps, 1)  # TorchRL's [*B, T, F] layout
    reward = torch.randn(shape, device=args.device)
    value = torch.randn(shape, device=args.device)
    next_value = torch.randn(shape, device=args.device)
    terminated = torch.rand(shape, device=args.device) < 0.01
    truncated = torch.rand(shape, device=args.device) < 0.01
    done = terminated | truncated

    def timed(fn):
        fn()  # warm-up (compiles the kernel on first use)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(10):
            out = fn()
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        return out, (time.perf_counter() - start) / 10 * 1e3

    (adv_ref, _), t_loop = timed(lambda: torchrl_functional.generalized_advantage_estimate(
        0.99, 0.95, value, next_value, reward, done, terminated))
    (_, _), t_vec = timed(lambda: torchrl_functional.vec_generalized_advantage_estimate(
        0.99, 0.95, value, next_value, reward, done, terminated))
    (adv, _), t_ours = timed(lambda: ours.generalized_advantage_estimate(
        0.99, 0.95, value, next_value, reward, done, terminated))

    print(f"GAE on {args.envs} envs x {args.steps} steps ({args.device})")
    print(f"  TorchRL loop functional      : {t_loop:8.3f} ms")
    print(f"  TorchRL vectorized functional: {t_vec:8.3f} ms")
    print(f"  rl_triton_torchrl            : {t_ours:8.3f} ms")
    print(f"  largest difference to TorchRL's loop: {(adv - adv_ref).abs().max().item():.2e}")


if __name__ == "__main__":
    main(ARGS)
