"""Compiles every fused kernel for an H100/H200 (sm_90) on a machine without a GPU, to catch what the interpreter
cannot: code the Triton compiler rejects (the interpreter runs the Python of a kernel, not its compilation).

    python tools/compile_sm90.py [--quick]

Every algorithm of ``tests/_algos.py`` is called with ``backend="triton"`` on small CPU tensors; each kernel launch
is intercepted and its exact arguments (pointer dtypes, None, constexprs, num_warps) are compiled to a cubin with
Triton's own compiler and assembler, in both launch modes (tiles of rows; one program per chunk with look-back),
with int32 offsets and with int64 ones.
Prints one line per distinct compilation; exits 1 if any fails. Must run without TRITON_INTERPRET.
"""
from __future__ import annotations

import argparse
import itertools
import os
import sys
import time
import traceback

if os.environ.get("TRITON_INTERPRET") == "1":
    sys.exit("run tools/compile_sm90.py without TRITON_INTERPRET=1 (the kernels must be JIT functions)")

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402
from triton.compiler import compile as triton_compile  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from rl_triton_torchrl.kernels import normalize_, scan  # noqa: E402

TARGET = GPUTarget("cuda", 90, 32)
TYPES = {torch.float32: "*fp32", torch.float64: "*fp64", torch.float16: "*fp16", torch.bfloat16: "*bf16",
         torch.bool: "*i1", torch.int64: "*i64", torch.int32: "*i32", torch.uint8: "*u8"}


def _signature(kernel: JITFunction, kwargs: dict):
    sig, constexprs = {}, {}
    for i, name in enumerate(kernel.arg_names):
        value = kwargs[name]
        # (a tl.constexpr value passed to a runtime parameter is a constant too: scan._constant_length)
        if i in kernel.constexprs or value is None or isinstance(value, triton.language.constexpr):
            sig[name] = "constexpr"
            constexprs[(i,)] = value
        elif isinstance(value, torch.Tensor):
            sig[name] = TYPES[value.dtype]
        elif isinstance(value, bool):
            sig[name] = "i1"
        elif isinstance(value, int):
            sig[name] = "i64" if not -2**31 <= value < 2**31 else "i32"
        else:
            sig[name] = "fp32"
    return sig, constexprs


class _Compiler:
    """Stands in for ``JITFunction.__getitem__``: compiles instead of launching."""

    def __init__(self):
        self.seen, self.failed = set(), []

    def __call__(self, kernel, grid):
        def compile_it(*args, num_warps=4, maxnreg=None, **kwargs):
            sig, constexprs = _signature(kernel, kwargs)
            key = (kernel.__name__, tuple(sorted(sig.items())), tuple(sorted(constexprs.items(), key=str)), num_warps,
                   maxnreg)
            if key in self.seen:
                return
            self.seen.add(key)
            shown = {kernel.arg_names[i[0]]: v for i, v in constexprs.items() if v is not None}
            t0 = time.perf_counter()
            try:
                options = {"num_warps": num_warps} if maxnreg is None else {"num_warps": num_warps, "maxnreg": maxnreg}
                out = triton_compile(ASTSource(kernel, sig, constexprs), target=TARGET, options=options)
                print(f"ok   {kernel.__name__} {shown} warps={num_warps} maxnreg={maxnreg}: "
                      f"{time.perf_counter() - t0:.1f} s, "
                      f"{out.metadata.shared} B shared", flush=True)
            except Exception:  # report every failure, then go on
                self.failed.append(key)
                print(f"FAIL {kernel.__name__} {shown} warps={num_warps} maxnreg={maxnreg}\n{traceback.format_exc()}",
                      flush=True)
        return compile_it


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the row-tile mode only, no initial states")
    args = parser.parse_args()
    os.environ["TRITON_INTERPRET"] = "1"  # after the kernels were built: only lets backend="triton" take CPU tensors
    from _algos import TABLE, make_rollout

    compiler = _Compiler()
    JITFunction.__getitem__ = lambda self, grid: compiler(self, grid)
    # row tiles (the few-rows rule off, so that two rows take them), one wide tile per row (the default for two rows
    # of 300 steps), look-back chunks
    # (name, scan settings, whether carried states too)
    modes = [("tiles", {"WIDE_MAX_ROWS": 0}, not args.quick), ("wide", {}, not args.quick)]
    if not args.quick:
        lookback = {"LOOKBACK_MIN_T": 0, "LOOKBACK_MAX_ROWS": 10**9, "LOOKBACK_BLOCK_T": 2048}
        modes.append(("look-back", lookback, True))
        # the other offset type of each kernel (scan.INT32_KERNELS): int64 everywhere (inputs past 2**31 elements),
        # in row tiles and look-back chunks, and int32 everywhere; without carried states (the same code either way)
        modes.append(("int64 tiles", {"INT32_MAX_OFFSET": 0, "WIDE_MAX_ROWS": 0}, False))
        modes.append(("int64 look-back", {"INT32_MAX_OFFSET": 0, **lookback}, False))
        modes.append(("int32 tiles", {"INT32_KERNELS": scan.KERNELS, "WIDE_MAX_ROWS": 0}, False))
    for mode, settings, with_states in modes:
        old = {k: getattr(scan, k) for k in settings}
        for k, v in settings.items():
            setattr(scan, k, v)
        try:
            # 40 steps: one tile of 64; 300 steps: chunks of MAX_BLOCK_T (the reverse scans' own reversal), or one
            # 512-step tile
            for (name, (call, _, coefs)), steps in itertools.product(TABLE.items(), (40, 300)):
                for state in ((False, True) if with_states else (False,)):
                    x = make_rollout((2, steps, 1), 1, "random", torch.float32)
                    kw = dict(coefs)
                    if state:
                        kw["initial_state"] = torch.zeros(2, 1, device=x["reward"].device)
                        kw["output_final_state"] = True
                    try:
                        call(x, backend="triton", time_dim=1, **kw)
                    except TypeError:  # an algorithm without carried states
                        if not state:
                            raise
        finally:
            for k, v in old.items():
                setattr(scan, k, v)
    for dtype in (torch.float32, torch.float64, torch.bfloat16):  # the batch standardisation (rsl_rl's)
        for n in (1, 3000):  # one element: n arrives as a constexpr
            normalize_(torch.randn(n).to(dtype), backend="triton")
    print(f"{len(compiler.seen)} compilations, {len(compiler.failed)} failed")
    sys.exit(1 if compiler.failed else 0)


if __name__ == "__main__":
    main()
