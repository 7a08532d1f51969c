"""Every algorithm in one table, for the tests that sweep all of them (properties, odd inputs, determinism).

The entries are those of the three per-family tables (``test_algorithms``, ``test_vtrace_retrace``,
``test_traces_prefix``), each with its default coefficients; ``make_rollout`` gives every input any of them reads.
"""
from __future__ import annotations

import torch

import test_algorithms as TA
import test_traces_prefix as TP
import test_vtrace_retrace as TV

make_rollout = TV.make_rollout  # reward, value, next_value, done, terminated, log-probs, per-action tensors


def _table() -> dict:
    """name -> (call(x, **kw), reference(x, **kw) -> (outputs, final state), default coefficients)."""
    table = {}
    for name, (call, ref, takes_lmbda) in TA.ALGOS.items():
        table[name] = (call, ref, {"gamma": TA.GAMMA, **({"lmbda": TA.LMBDA} if takes_lmbda else {})})
    for name, (call, ref, _) in TV.ALGOS.items():
        table[name] = (call, ref, {"gamma": TV.GAMMA, **TV._coefs(name)})
    for name, (call, ref, coefs) in TP.ALGOS.items():
        table[name] = (call, ref, dict(coefs))
    return table


TABLE = _table()
# inputs read per step ([*B, T, *F]) and per action ([*B, T, A]); the rest of a rollout is per step too
PER_ACTION = ("pi", "next_pi", "q_values", "next_q_values")
DISCRETE = ("retrace_discrete", "retrace_discrete_log", "retrace_discrete_shifted")


def as_tuple(out) -> tuple:
    return out if isinstance(out, tuple) else (out,)


def state_shape(x: dict, time_dim: int) -> tuple:
    """Shape of a carried state: the per-step shape without its time dimension."""
    shape = list(x["reward"].shape)
    del shape[time_dim]
    return tuple(shape)


def relayout(x: dict, layout: str, time_dim: int) -> dict:
    """The same rollout in another memory layout (``test_algorithms._relayout``), every tensor of it."""
    td = time_dim % x["reward"].dim()  # non-negative: the same dim of per-step and per-action tensors
    return {k: TA._relayout(v, layout, td) if isinstance(v, torch.Tensor) else v for k, v in x.items()}
