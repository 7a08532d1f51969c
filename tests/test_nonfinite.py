"""Non-finite inputs: a NaN or inf stays inside its own row and episode, and otherwise spreads as the reference's.

Every algorithm (tests/_algos.py), both paths. Every float input gets NaN or inf at a few random steps of all rows but
the last; the outputs must be non-finite exactly where the float64 reference's are, and equal to it elsewhere. The
last row must stay finite (no leak across rows).
"""
from __future__ import annotations

import pytest
import torch

from _algos import TABLE, as_tuple, make_rollout
from _helpers import BACKENDS, DEVICE, assert_close

FLOAT_FIELDS = ("reward", "value", "next_value", "log_pi", "log_mu", "log_ratio", "pi", "next_pi", "q_values",
                "next_q_values", "behavior_prob")


def _poison(x, value, seed, rate=0.04):
    """A copy of rollout ``x`` with ``value`` at random steps of every float input, in every row but the last."""
    g = torch.Generator().manual_seed(seed)
    out = dict(x)
    for name in FLOAT_FIELDS:
        if name not in x:
            continue
        t = x[name].clone()
        hit = torch.rand(t.shape, generator=g) < rate
        hit[-1] = False  # the last row (dim 0) stays clean
        t[hit.to(t.device)] = value
        out[name] = t
    return out


def _compare(name, actual, expected):
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    fin_a, fin_e = a.isfinite(), e.isfinite()
    if not torch.equal(fin_a, fin_e):
        idx = tuple(int(i) for i in (fin_a != fin_e).nonzero()[0])
        raise AssertionError(f"{name}: finite where the reference is not, or the reverse; first at {idx}: got "
                             f"{a[idx].item()!r}, expected {e[idx].item()!r}")
    assert_close(name, torch.where(fin_e, a, 0.0), torch.where(fin_e, e, 0.0), actual.dtype)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(TABLE))
def test_nonfinite_stays_in_its_episode(algo, backend, value):
    call, ref, kw = TABLE[algo]
    x = _poison(make_rollout((4, 50, 1), pattern="random", seed=3), value, seed=4)
    out = as_tuple(call(x, backend=backend, **kw))
    expected = as_tuple(ref(x, **kw)[0])
    for i, (o, e) in enumerate(zip(out, expected)):
        _compare(f"{algo}[{i}]", o, e)
        assert o[-1].isfinite().all(), f"{algo}[{i}]: a non-finite input of another row reached the last row"
    # the reference itself isolates: a sanity check that the poison reached some outputs and not all of them
    assert any((~e.isfinite()).any() for e in expected), f"{algo}: the poison reached no output"
    assert all(e.isfinite().any() for e in expected)


@pytest.mark.parametrize("backend", BACKENDS)
def test_nonfinite_state_does_not_cross_a_done(backend, small_tiles):
    """A NaN carried state (or one produced in a later chunk) stops at the first done step, also across chunks."""
    from rl_triton_torchrl.kernels import gae

    shape = (3, 70, 1)
    r = torch.ones(shape, device=DEVICE)
    done = torch.zeros(shape, dtype=torch.bool, device=DEVICE)
    done[:, 20] = True
    r[:, 45] = float("nan")
    adv, _, h = gae(r, torch.zeros_like(r), torch.zeros_like(r), done, gamma=0.9, lmbda=0.9, backend=backend,
                    initial_state=torch.full(shape[:1] + shape[2:], float("nan"), device=DEVICE),
                    output_final_state=True)
    assert adv[:, :21].isfinite().all() and h.isfinite().all()
    assert adv[:, 21:].isnan().all()
