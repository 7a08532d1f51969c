"""Parity of ``rl_triton_torchrl.functional`` with TorchRL's own loop functionals, name by name.

TorchRL's loop functionals are the specification; its ``vec_*`` ones cut the discount series at 1e-7, so they are
compared with a looser tolerance.
"""
from __future__ import annotations

import inspect

import pytest
import torch
import torchrl.objectives.value.functional as trl

from _helpers import BACKENDS, DEVICE, assert_close, flags, randn
import rl_triton_torchrl.functional as ours

GAMMA, LMBDA = 0.98, 0.93


def rollout(shape, seed=0, time_dim=-2, inconsistent=False):
    g = torch.Generator().manual_seed(seed)
    done, term = flags(shape, "random", g, time_dim)
    if inconsistent:  # terminated where done is not set: TorchRL's functionals still define a result
        term = term | (torch.rand(shape, generator=g) < 0.05).to(DEVICE)
    return dict(reward=randn(shape, g), state_value=randn(shape, g), next_state_value=randn(shape, g), done=done,
                terminated=term)


# (our name, TorchRL reference name, argument order, takes lmbda, has time_dim)
CASES = [
    ("generalized_advantage_estimate", "generalized_advantage_estimate", "v nv r d t", True),
    ("vec_generalized_advantage_estimate", "generalized_advantage_estimate", "v nv r d t", True),
    ("td0_advantage_estimate", "td0_advantage_estimate", "v nv r d t", False),
    ("td0_return_estimate", "td0_return_estimate", "nv r t", False),
    ("td1_return_estimate", "td1_return_estimate", "nv r d t", False),
    ("vec_td1_return_estimate", "td1_return_estimate", "nv r d t", False),
    ("td1_advantage_estimate", "td1_advantage_estimate", "v nv r d t", False),
    ("vec_td1_advantage_estimate", "td1_advantage_estimate", "v nv r d t", False),
    ("td_lambda_return_estimate", "td_lambda_return_estimate", "nv r d t", True),
    ("vec_td_lambda_return_estimate", "td_lambda_return_estimate", "nv r d t", True),
    ("td_lambda_advantage_estimate", "td_lambda_advantage_estimate", "v nv r d t", True),
    ("vec_td_lambda_advantage_estimate", "td_lambda_advantage_estimate", "v nv r d t", True),
]
KEYS = {"v": "state_value", "nv": "next_state_value", "r": "reward", "d": "done", "t": "terminated"}


def _args(x, order, gamma, lmbda, takes_lmbda):
    return [gamma] + ([lmbda] if takes_lmbda else []) + [x[KEYS[k]] for k in order.split()]


def _check(name, mine, theirs):
    mine = mine if isinstance(mine, tuple) else (mine,)
    theirs = theirs if isinstance(theirs, tuple) else (theirs,)
    assert len(mine) == len(theirs)
    for i, (a, b) in enumerate(zip(mine, theirs)):
        assert a.shape == b.shape and a.dtype == b.dtype, f"{name}[{i}]: {a.shape} {a.dtype} vs {b.shape} {b.dtype}"
        assert_close(f"{name}[{i}]", a, b)


def test_every_torchrl_functional_is_here():
    for name in trl.__all__:
        assert hasattr(ours, name), name
        theirs = inspect.signature(getattr(trl, name)).parameters
        mine = inspect.signature(getattr(ours, name)).parameters
        for p in theirs:
            assert p in mine, f"{name} lacks argument {p}"
            assert mine[p].default == theirs[p].default, f"{name}({p}) default differs"
        assert list(mine)[: len(theirs)] == list(theirs), f"{name}: argument order differs"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,ref,order,takes_lmbda", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("shape", [(4, 50, 1), (2, 3, 33, 2)], ids=["B4-T50-F1", "B2x3-T33-F2"])
def test_matches_torchrl_loop(name, ref, order, takes_lmbda, shape, backend):
    x = rollout(shape)
    mine = getattr(ours, name)(*_args(x, order, GAMMA, LMBDA, takes_lmbda), backend=backend)
    theirs = getattr(trl, ref)(*_args(x, order, GAMMA, LMBDA, takes_lmbda))
    _check(name, mine, theirs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,ref,order,takes_lmbda", CASES, ids=[c[0] for c in CASES])
def test_matches_torchrl_inconsistent_flags(name, ref, order, takes_lmbda, backend):
    """Terminated steps that are not done: defined by TorchRL's loops (TD(1) treats them as done, GAE and TD(lambda)
    do not); ours follow each."""
    x = rollout((3, 40, 1), seed=3, inconsistent=True)
    mine = getattr(ours, name)(*_args(x, order, GAMMA, LMBDA, takes_lmbda), backend=backend)
    theirs = getattr(trl, ref)(*_args(x, order, GAMMA, LMBDA, takes_lmbda))
    _check(name, mine, theirs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,ref,order,takes_lmbda", [c for c in CASES if c[0] != "td0_advantage_estimate"
                                                         and c[0] != "td0_return_estimate"],
                         ids=[c[0] for c in CASES if not c[0].startswith("td0")])
@pytest.mark.parametrize("time_dim", [0, 1, -1])
def test_time_dim(name, ref, order, takes_lmbda, time_dim, backend):
    shape = [5, 6, 7]
    x = rollout(tuple(shape), seed=1, time_dim=time_dim)
    mine = getattr(ours, name)(*_args(x, order, GAMMA, LMBDA, takes_lmbda), time_dim=time_dim, backend=backend)
    theirs = getattr(trl, ref)(*_args(x, order, GAMMA, LMBDA, takes_lmbda), time_dim=time_dim)
    _check(name, mine, theirs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,ref,order,takes_lmbda", [c for c in CASES if not c[0].startswith("td0")],
                         ids=[c[0] for c in CASES if not c[0].startswith("td0")])
def test_per_step_gamma_tensor(name, ref, order, takes_lmbda, backend):
    """gamma as a tensor of the input shape (e.g. gamma ** steps_to_next_obs), lmbda as a 0-d tensor."""
    shape = (3, 30, 1)
    x = rollout(shape, seed=2)
    g = torch.Generator().manual_seed(5)
    gamma = (0.9 + 0.1 * torch.rand(shape, generator=g)).to(DEVICE)
    lmbda = torch.tensor(LMBDA, device=DEVICE)
    mine = getattr(ours, name)(*_args(x, order, gamma, lmbda, takes_lmbda), backend=backend)
    theirs = getattr(trl, ref)(*_args(x, order, gamma, lmbda, takes_lmbda))
    _check(name, mine, theirs)


def _rolling_gamma_false_oracle(gamma, lmbda, next_state_value, reward, done, terminated):
    """float64 returns of ``rolling_gamma=False``, written from its definition: the return from step ``k`` uses
    ``gamma[k]`` (and ``lmbda[k]``) for every step of the remaining trajectory, not the gammas of those steps.
    Time is dim -2. A terminated step bootstraps nothing; a done step restarts the return at its next value.
    ``lmbda=None`` is TD(1) as TorchRL defines it there: no bootstrap at the window end (the return starts at 0),
    a done-but-not-terminated step bootstraps its next value. With ``lmbda``, TD(lambda): the window end
    bootstraps its (non-terminated) next value."""
    g, nv, r = (x.double() for x in (gamma, next_state_value, reward))
    d, term = done, terminated
    T = r.shape[-2]
    out = torch.empty_like(r)
    for k in range(T):
        gk = g[..., k, :]
        if lmbda is None:
            ret = torch.zeros_like(r[..., 0, :])
            for i in reversed(range(k, T)):
                follow = torch.where(d[..., i, :] & ~term[..., i, :], nv[..., i, :], ret)
                ret = r[..., i, :] + torch.where(term[..., i, :], 0.0, gk * follow)
        else:
            lk = torch.as_tensor(lmbda, dtype=torch.float64)
            lk = lk[..., k, :] if lk.dim() else lk
            boot = torch.where(term, 0.0, nv)
            ret = boot[..., T - 1, :]
            for i in reversed(range(k, T)):
                ret = torch.where(d[..., i, :], boot[..., i, :], ret)
                ret = r[..., i, :] + gk * ((1 - lk) * boot[..., i, :] + lk * ret)
        out[..., k, :] = ret
    return out


@pytest.mark.parametrize("name", ["td1_return_estimate", "td_lambda_return_estimate"])
def test_rolling_gamma_false(name):
    """``rolling_gamma=False`` (ours delegates to TorchRL's loop, by design) against the float64 oracle of the
    definition, with a per-step gamma and flags of every kind (terminations, truncations, a done last step)."""
    shape = (3, 12, 2)
    x = rollout(shape, seed=4)
    x["done"][:, -1] = True
    x["terminated"][0, -1] = True
    g = torch.Generator().manual_seed(6)
    gamma = (0.5 + 0.5 * torch.rand(shape, generator=g)).to(DEVICE)
    lm = [LMBDA] if "lambda" in name else []
    args = [gamma, *lm, x["next_state_value"], x["reward"], x["done"], x["terminated"]]
    mine = getattr(ours, name)(*args, rolling_gamma=False)
    expected = _rolling_gamma_false_oracle(gamma, LMBDA if lm else None, x["next_state_value"], x["reward"],
                                           x["done"], x["terminated"])
    assert mine.shape == expected.shape
    assert_close(f"{name}(rolling_gamma=False)", mine, expected.to(mine.dtype))
    # the definition differs from rolling_gamma=True here (the test would see a mix-up)
    rolling = getattr(ours, name)(*args)
    assert not torch.allclose(rolling, mine)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("time_dim", [-2, -1])
def test_reward2go(backend, time_dim):
    g = torch.Generator().manual_seed(0)
    shape = (3, 40, 1) if time_dim == -2 else (3, 40)
    reward = randn(shape, g)
    done = (torch.rand(shape, generator=g) < 0.1).to(DEVICE)
    mine = ours.reward2go(reward, done, 0.9, time_dim=time_dim, backend=backend)
    theirs = trl.reward2go(reward, done, 0.9, time_dim=time_dim)
    assert mine.shape == theirs.shape
    assert_close("reward2go", mine, theirs)  # TorchRL's cut-off at 1e-7 is below this tolerance here


def test_td0_done_alias_warns():
    x = rollout((2, 5, 1))
    with pytest.warns(UserWarning, match="deprecated"):
        mine = ours.td0_return_estimate(GAMMA, x["next_state_value"], x["reward"], done=x["done"])
    _check("td0", mine, trl.td0_return_estimate(GAMMA, x["next_state_value"], x["reward"], x["done"]))
