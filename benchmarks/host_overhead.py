"""Where the host time of one GAE call goes: our Python, Triton's launcher, and the kernel itself.

    python benchmarks/host_overhead.py [--B 4096] [--T 128]

Prints, per call (host wall time, calls back to back, device drained once at the end): the public ``gae`` call;
the same with the kernel launch replaced by a no-op (our validation, views and argument building); a bare
``kernel[grid](**kwargs)`` with the arguments prepared once (Triton's launch path); and the kernel's device time.
"""
import argparse
import json
import sys

import torch

from _common import device_time_us, wall_time_us
from rl_triton_torchrl.kernels import gae
from rl_triton_torchrl.kernels import scan

gae_module = sys.modules["rl_triton_torchrl.kernels.gae"]


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--B", type=int, default=4096)
    parser.add_argument("--T", type=int, default=128)
    args = parser.parse_args()
    device = "cuda"
    shape = (args.B, args.T, 1)
    r, v, nv = (torch.randn(shape, device=device) for _ in range(3))
    d = torch.rand(shape, device=device) < 0.02

    def call():
        return gae(r, v, nv, d, gamma=0.99, lmbda=0.95)

    out = {"B": args.B, "T": args.T, "gae_call_us": wall_time_us(call, 2000)}
    captured = {}
    real_kernel = gae_module._gae_fwd_kernel

    class _Capture:
        def __getitem__(self, grid):
            def launch(**kwargs):
                captured["grid"], captured["kwargs"] = grid, kwargs
            return launch

    gae_module._gae_fwd_kernel = _Capture()
    try:
        out["ours_python_us"] = wall_time_us(call, 2000)
    finally:
        gae_module._gae_fwd_kernel = real_kernel
    grid, kwargs = captured["grid"], captured["kwargs"]
    out["triton_launch_us"] = wall_time_us(lambda: real_kernel[grid](**kwargs), 2000)
    out["device_us"], _ = device_time_us(lambda: real_kernel[grid](**kwargs))
    out["kernel_args"] = len(kwargs)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
