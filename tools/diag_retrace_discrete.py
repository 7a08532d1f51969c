"""Where ``retrace_discrete`` differs from its float64 reference on few rows of about 1000 steps (a GPU diagnostic).

    python tools/diag_retrace_discrete.py base       # main's kernels
    python tools/diag_retrace_discrete.py nogroup    # under one of benchmarks/ablate_kernels.py's variants

On an H200 at af85518 ``tests/test_vtrace_retrace.py::test_t_sweep`` failed for ``retrace_discrete`` at 3 x 1000
(both input modes), and passed at 3 x 200 and in the interpreter. Per input mode, number of actions (4: grouped
reads; 3: a load per action) and shape (T around 1000, multiples of 16 and not, one and several chunks), this prints
how many elements of the return differ, whether two calls give the same bits, the largest error and, per row, the
first and last step that differs (without episode ends the error spreads back from where it starts, so the last
step is its source). The variant goes in before the first call (kernel globals); run one process per variant.
"""
from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "benchmarks"), str(ROOT)]
from ablate_kernels import apply_variant  # noqa: E402

SHAPES = [(3, 1000), (3, 1008), (3, 1020), (3, 996), (3, 1024), (64, 1000), (3, 600), (3, 2000), (3, 520),
          (3, 4000)]


def main() -> None:
    variant = sys.argv[1] if len(sys.argv) > 1 else "base"
    apply_variant(variant)
    import test_vtrace_retrace as tv  # the tests' rollouts, calls and references (after the variant)

    for algo in ("retrace_discrete", "retrace_discrete_shifted"):
        for n_actions in (4, 3):
            for B, T in SHAPES:
                if n_actions == 3 and T not in (1000, 1024):
                    continue
                x = tv.make_rollout((B, T, 1), -2, "none", n_actions=n_actions, seed=T)
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
                print(f"{variant} {algo} A{n_actions} {B}x{T}: {int(bad.sum())} of {bad.numel()} differ, same bits "
                      f"twice: {same}, max |err| {err:.3g}, (row, first, last step differing): {rows}", flush=True)


if __name__ == "__main__":
    main()
