"""Where ``retrace_discrete`` differs from its float64 reference on few rows of about 1000 steps (a GPU diagnostic).

    python tools/diag_retrace_discrete.py base       # main's kernels
    python tools/diag_retrace_discrete.py nogroup    # under one of benchmarks/ablate_kernels.py's variants
    python tools/diag_retrace_discrete.py base --layouts contig,time_sliced,time_sliced4 --package /path/to/tree

On an H200 at af85518 ``tests/test_vtrace_retrace.py::test_t_sweep`` failed for ``retrace_discrete`` at 3 x 1000
(both input modes), and passed at 3 x 200 and in the interpreter. Per input mode, number of actions (4: grouped
reads; 3: a load per action) and shape (T around 1000, multiples of 16 and not, one and several chunks), this prints
how many elements of the return differ, whether two calls give the same bits, the largest error and, per row, the
first and last step that differs (without episode ends the error spreads back from where it starts, so the last
step is its source). The variant goes in before the first call (kernel globals); run one process per variant.

``--layouts`` gives the per-action tensors other layouts as well: ``time_sliced`` takes each row's T steps out of
rows of T + 1 (4 actions: an outer stride of 4 (T + 1), no multiple of 16), ``time_sliced4`` out of rows of T + 4
(a multiple of 16 where T is). ``--package`` runs the kernels of another tree (its ``rl_triton_torchrl`` first on the
path; the tests' rollouts and references stay this tree's), such as a commit's ``git archive`` (base variant only).
Results of both: benchmarks/results/h100/rd_diag_56b3228_a10070b.md, rd_sliced_a10070b_374af2f.md.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks"), str(ROOT)]

SHAPES = [(3, 1000), (3, 1008), (3, 1020), (3, 996), (3, 1024), (64, 1000), (3, 600), (3, 2000), (3, 520),
          (3, 4000)]
PER_ACTION = ("pi", "q_values", "next_pi", "next_q_values")
EXTRA_STEPS = {"contig": 0, "time_sliced": 1, "time_sliced4": 4}  # steps of storage past each row's T


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("variant", nargs="?", default="base")
    parser.add_argument("--layouts", default="contig", help=f"comma-separated, of {', '.join(EXTRA_STEPS)}")
    parser.add_argument("--package", default=None, help="the root of a tree whose kernels to run")
    args = parser.parse_args()
    if args.package:
        if args.variant != "base":
            parser.error("--package runs another tree's kernels as they are: variant base only")
        sys.path.insert(0, str(Path(args.package).resolve()))
    else:
        from ablate_kernels import apply_variant

        apply_variant(args.variant)
    import rl_triton_torchrl
    import test_vtrace_retrace as tv  # the tests' rollouts, calls and references (after the variant)
    import torch

    print(f"kernels of {Path(rl_triton_torchrl.__file__).parent}", flush=True)
    for algo in ("retrace_discrete", "retrace_discrete_shifted"):
        for n_actions in (4, 3):
            for B, T in SHAPES:
                if n_actions == 3 and T not in (1000, 1024):
                    continue
                for layout in args.layouts.split(","):
                    x = tv.make_rollout((B, T, 1), -2, "none", n_actions=n_actions, seed=T)
                    if EXTRA_STEPS[layout]:  # the same values, each row stored in a longer one
                        for k in PER_ACTION:
                            x[k] = torch.cat([x[k], x[k][:, :EXTRA_STEPS[layout]]], 1)[:, :T]
                    call, ref, _ = tv.ALGOS[algo]
                    kw = {"gamma": tv.GAMMA, **tv._coefs("retrace"), "time_dim": -2}
                    out, again = call(x, backend="triton", **kw), call(x, backend="triton", **kw)
                    expected, _ = ref(x, **kw)
                    o, e = out[0].double().cpu()[..., 0], expected[0].double().cpu()[..., 0]
                    bad = ~((o - e).abs() <= 1e-4 + 1e-5 * e.abs())
                    same = all(a.equal(b) for a, b in zip(out, again))
                    rows = [(r, int(bad[r].nonzero().min()), int(bad[r].nonzero().max()))
                            for r in range(min(B, 3)) if bad[r].any()]
                    err = float((o - e).abs().nan_to_num(1e9).max())
                    name = "" if layout == "contig" else f" {layout}"
                    print(f"{args.variant} {algo} A{n_actions} {B}x{T}{name}: {int(bad.sum())} of {bad.numel()} "
                          f"differ, same bits twice: {same}, max |err| {err:.3g}, (row, first, last step differing): "
                          f"{rows}", flush=True)


if __name__ == "__main__":
    main()
