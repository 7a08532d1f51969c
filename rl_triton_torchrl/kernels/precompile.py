"""Compiles the kernel variants that common calls launch into a bundle, ahead of time, on a machine without a GPU.

    python -m rl_triton_torchrl.kernels.precompile --out aot --shapes 4096x128,4096x24
    RL_TRITON_TORCHRL_AOT_DIR=aot python train.py        # first calls load these instead of compiling

Every algorithm of ``--algorithms`` is called in each of its forms (``FORMS``: with and without a terminated flag,
GAE and V-trace also with ``last_state_value``, ``retrace_discrete`` with ``last_pi``, ...) on fresh CPU tensors of
each shape ``B x T`` and dtype, laid out as ``[B, T]`` with ``time_dim=-1`` (``--layouts batch``), ``[T, B]`` with
``time_dim=0`` (``time``) and/or TorchRL's ``[B, T, 1]`` with ``time_dim=-2`` (``torchrl``), bool flags, with gamma
and lmbda as Python numbers and as 0-d tensors (``--coefficients float,tensor``: TorchRL's estimator modules hold them
as tensors, a variant of its own).
Each launch is compiled for ``--arch`` (90: H100/H200) by Triton's own compiler instead of run (``_aot.build``),
and written once. A call on the GPU finds its variant where it has the same structure: the same shape, dtypes and
layout, tensors of its own (16-byte aligned, as fresh allocations are), the same form. Any other call compiles as
without a bundle. A bundle is valid for this package's kernels and this Triton only (a variant's key holds both).
"""
from __future__ import annotations

import argparse
import time

import torch

from . import _aot
from .. import kernels as K

GAMMA, LMBDA = 0.99, 0.95
ACTIONS = 4  # retrace_discrete's action count (it is part of the variant: the kernel's loops over actions)
LAST_PER_ACTION = ("last_pi", "last_q")  # retrace_discrete's shifted mode: [B, A]


def _rollout(B: int, T: int, dtype: torch.dtype, actions: int) -> dict:
    g = torch.Generator().manual_seed(0)
    term = torch.rand(B, T, generator=g) < 0.05
    done = term | (torch.rand(B, T, generator=g) < 0.05)
    x = {"done": done, "term": term}
    for name in ("r", "v", "nv", "lpi", "lmu", "mu"):
        x[name] = torch.rand(B, T, generator=g, dtype=dtype)
    x["lv"] = torch.rand(B, generator=g, dtype=dtype)
    for name in ("pi", "next_pi", "q", "next_q"):
        x[name] = torch.rand(B, T, actions, generator=g, dtype=dtype)
    for name in LAST_PER_ACTION:  # [B, A] in every layout
        x[name] = torch.rand(B, actions, generator=g, dtype=dtype)
    x["action"] = torch.randint(0, actions, (B, T), generator=g)
    return x


def _laid_out(x: dict, layout: str) -> dict:
    """The rollout in ``layout`` (``LAYOUTS``), as fresh contiguous tensors."""
    if layout == "time":
        return {k: v if v.dim() < 2 or k in LAST_PER_ACTION else v.transpose(0, 1).contiguous() for k, v in x.items()}
    if layout == "torchrl":
        return {k: v.unsqueeze(-1).contiguous() if v.dim() <= 2 and k not in ("action", *LAST_PER_ACTION) else v
                for k, v in x.items()}
    return x


# algorithm -> form -> call of the kernels API on a rollout ``x`` (its tensors and its coefficients, ``x["gamma"]`` and
# ``x["lmbda"]``) with keyword arguments ``kw`` (time_dim, backend)
FORMS = {
    "gae": {
        "terminated": lambda x, kw: K.gae(x["r"], x["v"], x["nv"], x["done"], x["term"], gamma=x["gamma"],
                                          lmbda=x["lmbda"], **kw),
        "done": lambda x, kw: K.gae(x["r"], x["v"], x["nv"], x["done"], gamma=x["gamma"], lmbda=x["lmbda"], **kw),
        "last_state_value": lambda x, kw: K.gae(x["r"], x["v"], None, x["done"], gamma=x["gamma"], lmbda=x["lmbda"],
                                                last_state_value=x["lv"], **kw),
    },
    "td_lambda": {
        "terminated": lambda x, kw: K.td_lambda_return(x["r"], x["nv"], x["done"], x["term"], gamma=x["gamma"],
                                                       lmbda=x["lmbda"], **kw),
        "done": lambda x, kw: K.td_lambda_return(x["r"], x["nv"], x["done"], gamma=x["gamma"], lmbda=x["lmbda"], **kw),
        "advantage": lambda x, kw: K.td_lambda_advantage(x["r"], x["v"], x["nv"], x["done"], x["term"],
                                                         gamma=x["gamma"], lmbda=x["lmbda"], return_value_target=True,
                                                         **kw),
        # TD1Estimator's call: lmbda 1.0 as a number beside its gamma, a done ending a return like a termination
        "td1_advantage": lambda x, kw: K.td_lambda_advantage(x["r"], x["v"], x["nv"], x["done"], x["term"],
                                                             gamma=x["gamma"], lmbda=1.0, done_or_terminated=True,
                                                             return_value_target=True, **kw),
    },
    "vtrace": {
        "terminated": lambda x, kw: K.vtrace(x["lpi"], x["lmu"], x["v"], x["nv"], x["r"], x["done"], x["term"],
                                             gamma=x["gamma"], **kw),
        "done": lambda x, kw: K.vtrace(x["lpi"], x["lmu"], x["v"], x["nv"], x["r"], x["done"], gamma=x["gamma"], **kw),
        "last_state_value": lambda x, kw: K.vtrace(x["lpi"], x["lmu"], x["v"], None, x["r"], x["done"],
                                                   gamma=x["gamma"], last_state_value=x["lv"], **kw),
    },
    "retrace": {
        "terminated": lambda x, kw: K.retrace(x["v"], x["nv"], x["r"], x["done"], x["term"], ratio=x["mu"],
                                              gamma=x["gamma"], lmbda=x["lmbda"], **kw),
    },
    "retrace_discrete": {
        "terminated": lambda x, kw: K.retrace_discrete(x["pi"], x["action"], x["q"], x["next_pi"], x["next_q"],
                                                       x["r"], x["done"], x["term"], behavior_prob=x["mu"],
                                                       gamma=x["gamma"], lmbda=x["lmbda"], **kw),
        "done": lambda x, kw: K.retrace_discrete(x["pi"], x["action"], x["q"], x["next_pi"], x["next_q"], x["r"],
                                                 x["done"], behavior_prob=x["mu"], gamma=x["gamma"],
                                                 lmbda=x["lmbda"], **kw),
        "last_pi": lambda x, kw: K.retrace_discrete(x["pi"], x["action"], x["q"], None, None, x["r"], x["done"],
                                                    behavior_prob=x["mu"], gamma=x["gamma"], lmbda=x["lmbda"],
                                                    last_pi=x["last_pi"], last_q_values=x["last_q"], **kw),
    },
    "discounted_return": {
        "done": lambda x, kw: K.discounted_return(x["r"], x["done"], gamma=x["gamma"], **kw),
        "bootstrapped": lambda x, kw: K.discounted_return(x["r"], x["done"], gamma=x["gamma"], next_state_value=x["nv"],
                                                          terminated=x["term"], **kw),
    },
    "eligibility_traces": {
        "done": lambda x, kw: K.eligibility_traces(x["r"], x["done"], gamma=x["gamma"], lmbda=x["lmbda"], **kw),
    },
    "episodic_prefix_sum": {
        "after_done": lambda x, kw: K.episodic_prefix_sum(x["r"], x["done"], reset="after_done", **kw),
    },
}
# coefficients -> gamma and lmbda as the calls give them: Python numbers (the kernels API, TorchRL's functionals) or
# 0-d float32 tensors on the inputs' device (TorchRL's estimator modules hold them as buffers); a tensor coefficient
# is a kernel variant of its own
COEFFICIENTS = {"float": lambda device: {"gamma": GAMMA, "lmbda": LMBDA},
                "tensor": lambda device: {"gamma": torch.tensor(GAMMA, device=device),
                                          "lmbda": torch.tensor(LMBDA, device=device)}}
PER_ACTION = {"retrace_discrete"}  # its per-action tensors put time at -2 ([B, T, A]) or 0 ([T, B, A])
# layout -> (time_dim of the per-step tensors, of the per-action ones; None: not in this layout)
LAYOUTS = {"batch": (-1, -2), "time": (0, 0), "torchrl": (-2, None)}


def _shape(text: str) -> tuple[int, int]:
    try:
        B, T = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"a shape is BxT, e.g. 4096x128 (got {text!r})") from None
    if B < 1 or T < 1:
        raise argparse.ArgumentTypeError(f"a shape's B and T are at least 1 (got {text!r})")
    return B, T


def _choices(text: str, allowed, what: str) -> list[str]:
    items = [t for t in text.split(",") if t]
    unknown = [t for t in items if t not in allowed]
    if unknown or not items:
        raise argparse.ArgumentTypeError(f"unknown {what} {unknown or text!r}; choose from {', '.join(allowed)}")
    return items


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m rl_triton_torchrl.kernels.precompile", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="the bundle's folder (created; entries already there are kept)")
    parser.add_argument("--shapes", default="4096x128", type=lambda s: [_shape(t) for t in s.split(",") if t],
                        help="comma-separated BxT (default 4096x128)")
    parser.add_argument("--algorithms", default=",".join(FORMS), type=lambda s: _choices(s, FORMS, "algorithm"),
                        help="comma-separated, of " + ", ".join(FORMS))
    parser.add_argument("--dtypes", default="float32",
                        type=lambda s: _choices(s, ("float32", "bfloat16", "float16"), "dtype"))
    parser.add_argument("--layouts", default="batch", type=lambda s: _choices(s, LAYOUTS, "layout"),
                        help="batch: [B, T] tensors, time_dim=-1; time: [T, B], time_dim=0; torchrl: TorchRL's "
                             "[B, T, 1], time_dim=-2 (all but retrace_discrete); default batch")
    parser.add_argument("--coefficients", default="float,tensor",
                        type=lambda s: _choices(s, COEFFICIENTS, "coefficient kind"),
                        help="float: gamma and lmbda as Python numbers; tensor: as 0-d tensors, as TorchRL's "
                             "estimator modules pass them; default both")
    parser.add_argument("--arch", type=int, default=90, help="the GPU's compute capability as one number (90)")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    jobs = [(shape, dtype, layout, coefs, algo, form) for shape in args.shapes for dtype in args.dtypes
            for layout in args.layouts for coefs in args.coefficients for algo in args.algorithms
            for form in FORMS[algo] if LAYOUTS[layout][algo in PER_ACTION] is not None]
    try:
        from tqdm import tqdm
    except ImportError:  # tqdm is an extra of the examples: a line per call instead
        tqdm = None
    bar = tqdm(jobs, desc="precompiling", unit="call") if tqdm else jobs
    start, rollouts = time.perf_counter(), {}
    with _aot.build(args.out, arch=args.arch) as written:
        for i, ((B, T), dtype, layout, coefs, algo, form) in enumerate(bar):
            key = (B, T, dtype, layout, coefs)
            if key not in rollouts:
                x = _rollout(B, T, getattr(torch, dtype), ACTIONS)
                rollouts = {key: {**_laid_out(x, layout), **COEFFICIENTS[coefs]("cpu")}}
            time_dim = LAYOUTS[layout][algo in PER_ACTION]
            n = len(written)
            FORMS[algo][form](rollouts[key], {"time_dim": time_dim, "backend": "triton"})
            if tqdm is None:
                print(f"[{i + 1}/{len(jobs)}] {algo} {form} {B}x{T} {dtype} {layout} {coefs} coefficients: "
                      f"{len(written) - n} new", flush=True)
    print(f"{len(written)} kernel variants written to {args.out} for sm_{args.arch} in "
          f"{time.perf_counter() - start:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
