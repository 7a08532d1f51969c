"""Stable-Baselines3's ``compute_returns_and_advantage`` against ours (``rl_triton_torchrl.sb3``).

    python benchmarks/bench_sb3.py [--device cpu|cuda] [--out DIR] [--quick] [--repeats 21]

Both buffers hold the same random float32 rollout ([buffer_size, n_envs], ~1% episode starts, random ``dones``) at
the sizes PPO and A2C typically use. Host wall time per call (median of repeats) of the whole method, as the
training loop sees it: SB3's numpy loop, and ours with its path (torch on a CPU device, Triton on CUDA, where the
time includes copying rewards, values and episode starts to the GPU and the results back). On CUDA the device time
of the GAE kernel alone (inputs already on the GPU) is recorded too. Ours is checked against SB3's advantages and
returns before it is timed; a mismatch is reported as wrong, not timed.

Writes results/<out>/bench_sb3.{json,md} (``--out`` defaults to ``cpu`` or ``cuda``).
"""
from __future__ import annotations

import argparse
import time

import numpy as np
import torch
from gymnasium import spaces
from stable_baselines3 import __version__ as sb3_version
from stable_baselines3.common.buffers import RolloutBuffer as SB3RolloutBuffer

import rl_triton_torchrl.sb3 as ours
from _common import device_time_us, environment, synced_median_s, write_results
from rl_triton_torchrl.kernels import gae
from rl_triton_torchrl.kernels._utils import resolve_backend

SIZES = [(2048, 1), (2048, 8), (512, 64), (128, 1024)]  # (buffer_size, n_envs)
GAMMA, LMBDA = 0.99, 0.95


def filled(cls, buffer_size, n_envs, device, seed=0):
    """A buffer of class ``cls`` holding a random rollout (the arrays SB3's ``add`` fills, written directly)."""
    rng = np.random.default_rng(seed)
    buf = cls(buffer_size, spaces.Box(-1, 1, (1,)), spaces.Discrete(2), device=device, gae_lambda=LMBDA,
              gamma=GAMMA, n_envs=n_envs)
    buf.rewards[:] = rng.standard_normal((buffer_size, n_envs))
    buf.values[:] = rng.standard_normal((buffer_size, n_envs))
    buf.episode_starts[:] = rng.random((buffer_size, n_envs)) < 0.01
    buf.pos, buf.full = buffer_size, True
    last_values = torch.from_numpy(rng.standard_normal((n_envs, 1)).astype(np.float32)).to(device)
    dones = rng.random(n_envs) < 0.01
    return buf, last_values, dones


def median_ms(fn, repeats: int, sync) -> float:
    return synced_median_s(fn, repeats, sync) * 1e3


def kernel_device_us(buf, last_values, dones, device) -> float:
    """Device time of the GAE call alone, on inputs already on the GPU (what the method adds around it: copies)."""
    x = {k: torch.from_numpy(getattr(buf, k)).to(device) for k in ("rewards", "values", "episode_starts")}
    next_value = torch.cat([x["values"][1:], last_values.reshape(1, -1)])
    done = torch.cat([x["episode_starts"][1:] != 0, torch.from_numpy(dones).reshape(1, -1).to(device)])
    return device_time_us(lambda: gae(x["rewards"], x["values"], next_value, done, gamma=GAMMA, lmbda=LMBDA,
                                      time_dim=0))[0]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu", help="the buffers' device (SB3 passes the policy's)")
    parser.add_argument("--out", default=None, help="subdirectory of benchmarks/results (default: cpu or cuda)")
    parser.add_argument("--quick", action="store_true", help="one small size, few repeats (CI smoke)")
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sizes = [(64, 4)] if args.quick else SIZES
    repeats = 3 if args.quick else args.repeats
    path = resolve_backend("auto", device)
    rows = []
    for buffer_size, n_envs in sizes:
        theirs, last_values, dones = filled(SB3RolloutBuffer, buffer_size, n_envs, device)
        mine, _, _ = filled(ours.RolloutBuffer, buffer_size, n_envs, device)
        theirs.compute_returns_and_advantage(last_values, dones)
        mine.compute_returns_and_advantage(last_values, dones)
        scale = 1 + np.abs(theirs.returns).max()
        err = max(np.abs(mine.advantages.astype(np.float64) - theirs.advantages).max(),
                  np.abs(mine.returns.astype(np.float64) - theirs.returns).max())
        ok = bool(err <= 1e-4 * scale)
        row = {"buffer_size": buffer_size, "n_envs": n_envs, "dtype": "float32", "device": str(device),
               "ours_path": path, "max_abs_err": float(err), "status": "ok" if ok else "wrong"}
        row["sb3_ms"] = median_ms(lambda: theirs.compute_returns_and_advantage(last_values, dones), repeats, sync)
        row["ours_ms"] = median_ms(lambda: mine.compute_returns_and_advantage(last_values, dones), repeats,
                                   sync) if ok else None
        row["speedup"] = row["sb3_ms"] / row["ours_ms"] if ok else None
        row["kernel_device_us"] = kernel_device_us(mine, last_values, dones, device) if cuda and ok else None
        rows.append(row)
        print(f"{buffer_size:5d} x {n_envs:5d}  SB3 {row['sb3_ms']:8.3f} ms  ours ({path}) "
              f"{row['ours_ms'] or float('nan'):8.3f} ms  x{row['speedup'] or float('nan'):.1f}  "
              f"max err {err:.1e} {row['status']}", flush=True)
    env = {**environment(), "stable_baselines3": sb3_version, "numpy": np.__version__}
    columns = [("buffer_size", "buffer_size"), ("n_envs", "n_envs"), ("sb3_ms", "SB3 (ms)"),
               ("ours_ms", "ours (ms)"), ("ours_path", "our path"), ("speedup", "speed-up"),
               ("max_abs_err", "max abs. difference to SB3"), ("status", "check")]
    if any(r["kernel_device_us"] is not None for r in rows):
        columns.append(("kernel_device_us", "GAE kernel alone, device (µs)"))
    out = write_results("bench_sb3", env, rows, args.out or ("cuda" if cuda else "cpu"), columns,
                        f"SB3 RolloutBuffer.compute_returns_and_advantage, SB3 vs ours ({device}, float32, "
                        "wall time per call, median)",
                        notes=f"Command: `python benchmarks/bench_sb3.py --device {args.device}`")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
