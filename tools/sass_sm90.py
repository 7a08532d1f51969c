"""Instruction counts of the fused kernels as compiled for an H100/H200 (sm_90), on a machine without a GPU.

    python tools/sass_sm90.py                                  # every algorithm at 4096 x 512 and 4096 x 8
    python tools/sass_sm90.py --shapes 65536x128 --algorithms gae,vtrace --dump /tmp/sass
    python tools/sass_sm90.py --algorithms retrace,retrace_discrete            # also the discrete-action form
    python tools/sass_sm90.py --algorithms gae --shapes 65536x24 --time-major --tiles 16x32,512x1  # rsl_rl's storage
    python tools/sass_sm90.py --algorithms gae,gae_shifted --shapes 65536x24   # GAE's two input modes
    python tools/sass_sm90.py --algorithms vtrace,vtrace_shifted --shapes 512x512   # V-trace's
    python tools/sass_sm90.py --algorithms retrace_discrete,retrace_discrete_shifted   # retrace_discrete's
    python tools/sass_sm90.py --algorithms discounted_return --shapes 65536x2047 --no-windows  # no aligned windows
    python tools/sass_sm90.py --shapes 64x512 --variant loop     # an ablate_kernels variant's kernels (an A/B)

Each algorithm is called on CPU tensors of the given ``[B, T, 1]`` shapes; each kernel launch is compiled instead
of run, with the specialization Triton would give those arguments on a GPU (alignment, divisibility, constants:
``JITFunction.warmup`` behind a stand-in driver that names sm_90), by Triton's own compiler and ``ptxas``, and the
cubin is disassembled with the ``cuobjdump`` Triton ships. Per kernel: grid, tile, registers per thread and the
static SASS instructions of the whole kernel by opcode (shuffles, barriers, shared-memory and global accesses,
spills: ``LDL``/``STL``), and ``CVT``, the layout conversions in Triton's GPU IR (each a round trip through shared
memory with its barriers, where values of two layouts meet; see
``benchmarks/results/sm90_sass/retrace_discrete_layouts.md``).

Static counts, not a profile: the chunk loop's body runs once per chunk, and nothing here says how long any of it
waits. A cheap first look before spending GPU time (it showed Triton's reverse scans costing five butterfly
shuffles per element and value, see ``scan_tile_enter``). Must run without TRITON_INTERPRET.
"""
from __future__ import annotations

import argparse
import collections
import itertools
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("run tools/sass_sm90.py without TRITON_INTERPRET=1 (the kernels must be JIT functions)")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.runtime import driver  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
from rl_triton_torchrl.kernels import _aot, scan  # noqa: E402

BIN = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
COUNTED = ("SHFL", "BAR", "LDS", "STS", "LDG", "STG", "LDL", "STL", "FFMA", "FMUL", "FSEL", "ISETP", "IMAD")


def sass_of(compiled) -> tuple[str, str]:
    """(SASS listing, resource usage) of a ``CompiledKernel``."""
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(compiled.asm["cubin"])
        f.flush()
        sass = subprocess.run([str(BIN / "cuobjdump"), "-sass", f.name], capture_output=True, text=True).stdout
        res = subprocess.run([str(BIN / "cuobjdump"), "-res-usage", f.name], capture_output=True, text=True).stdout
    return sass, res


def opcodes(sass: str) -> collections.Counter:
    ops = collections.Counter()
    for line in sass.splitlines():
        m = re.match(r"\s*/\*[0-9a-f]+\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", line)
        if m:
            ops[m.group(2).split(".")[0]] += 1
    return ops


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shapes", default="4096x512,4096x8", help="comma-separated BxT")
    parser.add_argument("--algorithms", "--algos", default="gae,td_lambda,vtrace,retrace,discounted_return,"
                        "eligibility_traces,episodic_prefix_sum")
    parser.add_argument("--time-major", action="store_true",
                        help="lay each rollout tensor out time-major ([T, B, 1] storage, the B rows adjacent; not for "
                             "retrace_discrete)")
    parser.add_argument("--tiles", help="comma-separated ROWSxSTEPS tiles to compile instead of launch_config's "
                                        "(e.g. 512x1,16x32; tiles of rows on 4 warps, no look-back)")
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"), help="the rollouts' dtype")
    parser.add_argument("--dump", help="a folder for each kernel's SASS listing and Triton GPU IR (layouts)")
    parser.add_argument("--no-windows", action="store_true",
                        help="no aligned windows (scan.WINDOW_KERNELS empty; by default the launch rule takes them)")
    parser.add_argument("--variant", default="base",
                        help="compile the kernels of one of benchmarks/ablate_kernels.py's variants (e.g. loop, "
                             "exitall; base: as they are), for a static A/B before the GPU run")
    args = parser.parse_args(argv)
    if args.variant != "base":
        import ablate_kernels  # the benchmark's variants of the scan core's helpers

        ablate_kernels.apply_variant(args.variant)
    if args.no_windows:
        scan.WINDOW_KERNELS = frozenset()
    driver.set_active(_aot._TargetDriver(90))  # enough of a driver for warmup to compile for sm_90
    os.environ["TRITON_INTERPRET"] = "1"  # after the kernels were built: only lets backend="triton" take CPU tensors
    import bench_kernels  # the benchmark's algorithm table and rollouts
    import sweep_configs  # its time-major layout and forced tiles

    compiled = []

    class CompileInstead:
        """Stands in for ``scan.launcher(kernel)``: compiles each launch instead (no launch plan either)."""

        def __init__(self, kernel):
            self.kernel = kernel
            self.name = kernel.__name__

        def settings(self):
            return None

        def __call__(self, grid, num_warps, maxnreg=None, **kwargs):
            options = {} if maxnreg is None else {"maxnreg": maxnreg}
            kernel = self.kernel.warmup(grid=grid, num_warps=num_warps, **kwargs, **options)
            compiled.append((self.kernel.__name__, grid, kwargs, kernel))

    scan.launcher = CompileInstead
    bench_kernels.DEVICE = "cpu"
    default = scan.launch_config
    tiles = [tuple(int(v) for v in t.split("x")) for t in args.tiles.split(",")] if args.tiles else [None]
    for shape in args.shapes.split(","):
        B, T = (int(v) for v in shape.split("x"))
        x = bench_kernels.rollout(B, T, getattr(torch, args.dtype), "with")
        if args.time_major:
            x = {k: sweep_configs.time_major(v) for k, v in x.items()}
        for forced, algo in itertools.product(tiles, args.algorithms.split(",")):
            scan.launch_config = default if forced is None else sweep_configs._patched(
                sweep_configs.rows_cfg(forced[1], forced[0], 4))
            n = len(compiled)
            if algo.startswith("retrace_discrete"):  # not in bench_kernels' grid
                _retrace_discrete(x, shifted=algo == "retrace_discrete_shifted")
            elif algo == "gae_shifted":  # GAE's last_state_value mode (rsl_rl's storage reads it)
                _gae_shifted(x)
            elif algo == "vtrace_shifted":  # V-trace's (bench_peers' V-trace without truncations)
                _vtrace_shifted(x)
            else:
                bench_kernels.ALGOS[algo].call(x, "triton")
            for name, grid, kw, kernel in compiled[n:]:
                sass, res = sass_of(kernel)
                ops = opcodes(sass)
                regs = re.findall(r"REG:(\d+)", res)
                tile = f"{kw.get('BLOCK_R')}x{kw.get('BLOCK_T')}"
                print(f"{algo:20s} {B}x{T:<8d} {name:32s} grid {grid[0]:<7d} tile {tile:9s} warps "
                      f"{kernel.metadata.num_warps} regs {regs[0] if regs else '?':>3s} total {sum(ops.values()):5d} "
                      + " ".join(f"{op} {ops[op]}" for op in COUNTED)
                      + f" CVT {kernel.asm['ttgir'].count('ttg.convert_layout')} WINDOW {int(bool(kw.get('WINDOW')))}")
                if args.dump:
                    Path(args.dump).mkdir(parents=True, exist_ok=True)
                    (Path(args.dump) / f"{algo}_{B}x{T}_{name}.sass").write_text(sass)
                    (Path(args.dump) / f"{algo}_{B}x{T}_{name}.ttgir").write_text(kernel.asm["ttgir"])
    scan.launch_config = default
    return 0


def _gae_shifted(x):
    """GAE on the rollout ``x`` in its shifted input mode: V(s_(t+1)) read from the values one step on."""
    from rl_triton_torchrl.kernels import gae

    gae(x["r"], x["v"], None, x["d"], x["t"], gamma=0.99, lmbda=0.95, last_state_value=x["nv"][:, -1],
        backend="triton")


def _vtrace_shifted(x):
    """V-trace on the rollout ``x`` in its shifted input mode, without a terminated flag (as that mode wants)."""
    from rl_triton_torchrl.kernels import vtrace

    vtrace(x["lpi"], x["lmu"], x["v"], None, x["r"], x["d"], gamma=0.99, last_state_value=x["nv"][:, -1],
           backend="triton")


def _retrace_discrete(x, n_actions: int = 4, shifted: bool = False):
    """``retrace_discrete`` on the rollout ``x`` with ``n_actions`` actions (bench_peers' setting); ``shifted``: in its
    shifted input mode, without a terminated flag."""
    from rl_triton_torchrl.kernels import retrace_discrete

    r, d, t = x["r"][..., 0], x["d"][..., 0], None if x["t"] is None else x["t"][..., 0]
    per_action = (*r.shape, n_actions)
    pi, npi = (torch.softmax(torch.randn(per_action), -1) for _ in range(2))
    q, nq = torch.randn(per_action), torch.randn(per_action)
    action = torch.randint(n_actions, r.shape)
    kw = dict(behavior_prob=torch.rand(r.shape) + 0.1, gamma=0.99, lmbda=0.95, time_dim=1, backend="triton")
    if shifted:
        retrace_discrete(pi, action, q, None, None, r, d, last_pi=npi[:, -1], last_q_values=nq[:, -1], **kw)
    else:
        retrace_discrete(pi, action, q, npi, nq, r, d, t, **kw)


if __name__ == "__main__":
    sys.exit(main())
