"""Odd inputs through every functional, both paths: a clear exception or the reference's answer, nothing else.

No input may reach Triton as a compile error, crash, or give a silently wrong answer. Each kind of odd input below
is pushed through every algorithm of the table (``_algos.TABLE``) and through the TorchRL-compatible functionals;
the valid kinds are compared with the float64 references, the invalid ones must raise the documented exception
(docs/errors.md).
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from _algos import DISCRETE, PER_ACTION, TABLE, as_tuple, make_rollout, relayout
from _helpers import BACKENDS, DEVICE, assert_close
from rl_triton_torchrl import functional as F
from rl_triton_torchrl import kernels as K
from rl_triton_torchrl.kernels import InputError

FLOATS = ("reward", "value", "next_value", "log_pi", "log_mu", "log_ratio", "behavior_prob", *PER_ACTION)
SINGLE_FLOAT = {"discounted", "traces", "sum_after_done", "sum_at_start", "disc_after_done", "disc_at_start"}


def _map(x, fn, keys=None):
    return {k: (fn(k, v) if (keys is None or k in keys) and isinstance(v, torch.Tensor) else v) for k, v in x.items()}


def _expanded_outer(x):
    """Stride 0 along the batch dim: one row seen four times."""
    return _map(x, lambda k, v: v[:1].expand(4, *v.shape[1:]))


# kind -> (shape, time_dim, transform of the rollout, transform of the coefficients)
VALID = {
    "T1": ((3, 1, 2), -2, None),
    "one_element": ((1,), 0, None),
    "empty_T": ((3, 0, 2), -2, None),
    "empty_B": ((0, 5, 2), -2, None),
    "expanded_outer": ((1, 7, 2), -2, _expanded_outer),
    "transposed": ((3, 9, 2), -2, lambda x: relayout(x, "permuted", -2)),  # stored time-major (dims reversed)
    # one tensor passed as both done and terminated (the kernels read it once); 150 steps: two time tiles
    "same_flags": ((3, 150, 2), -2, lambda x: {**x, "terminated": x["done"]}),
    "float16": ((3, 9, 2), -2, lambda x: _map(x, lambda k, v: v.half(), FLOATS)),
    "bfloat16": ((3, 9, 2), -2, lambda x: _map(x, lambda k, v: v.bfloat16(), FLOATS)),
    "requires_grad": ((3, 9, 2), -2, lambda x: _map(x, lambda k, v: v.clone().requires_grad_(), FLOATS)),
    "numpy_coefs": ((3, 9, 2), -2, "numpy"),
    "mixed_dtype_single_float": ((3, 9, 2), -2, lambda x: _map(x, lambda k, v: v.double(), set(FLOATS) - {"reward"})),
}
# kind -> (transform of the rollout, exception, message pattern)
INVALID = {
    "zero_dim": (lambda x: _map(x, lambda k, v: v.reshape(-1)[0] if k not in PER_ACTION else v.reshape(-1)[:3]),
                 InputError, "time"),
    "mixed_dtype": (lambda x: _map(x, lambda k, v: v.double(), set(FLOATS) - {"reward"}), TypeError, "dtype"),
    "int_flags": (lambda x: _map(x, lambda k, v: v.long(), ("done", "terminated")), TypeError, "must be a bool tensor"),
    "float_flags": (lambda x: _map(x, lambda k, v: v.float(), ("done", "terminated")), TypeError, "bool"),
    "list": (lambda x: {**x, "reward": x["reward"].tolist()}, TypeError, "must be a torch.Tensor, got list"),
    "numpy": (lambda x: {**x, "reward": x["reward"].cpu().numpy()}, TypeError, "must be a torch.Tensor, got ndarray"),
    "none": (lambda x: {**x, "reward": None}, TypeError, "must be a floating-point torch.Tensor, got None"),
    "other_device": (lambda x: {**x, "reward": x["reward"].to("meta")}, InputError, "is on meta"),
    "sparse": (lambda x: {**x, "reward": x["reward"].to_sparse()}, TypeError, "dense"),
}


def _check(algo, x, backend, kw, dtype):
    call, ref, _ = TABLE[algo]
    out = as_tuple(call(x, backend=backend, **kw))
    if x["reward"].numel() == 0:  # nothing to compare (and TD(lambda)'s reference has no final state at T = 0)
        assert all(o.shape == x["reward"].shape and o.dtype == dtype for o in out), algo
        return out
    expected, _ = ref(x, **kw)
    for i, (o, e) in enumerate(zip(out, as_tuple(expected))):
        assert o.shape == e.shape and o.dtype == dtype and o.device == x["reward"].device, f"{algo}[{i}]"
        assert_close(f"{algo}[{i}]", o, e, dtype)
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", list(VALID))
@pytest.mark.parametrize("algo", list(TABLE))
def test_valid_odd_input(algo, kind, backend):
    shape, time_dim, transform = VALID[kind]
    _, _, coefs = TABLE[algo]
    x = make_rollout(shape, time_dim, "random", seed=3)
    kw = {"time_dim": time_dim, **coefs}
    if transform == "numpy":  # numpy scalars as coefficients, a numpy integer as time_dim
        kw = {k: (np.float32(v) if isinstance(v, float) else v) for k, v in kw.items()} | {"time_dim": np.int64(-2)}
    elif transform is not None:
        x = transform(x)
    if kind == "mixed_dtype_single_float" and algo not in SINGLE_FLOAT:
        pytest.skip("reads several float inputs: a mixed dtype raises (test_invalid_odd_input)")
    out = _check(algo, x, backend, kw, x["reward"].dtype)
    if kind == "requires_grad":
        assert all(o.requires_grad for o in out), f"{algo}: an output lost the graph of its inputs"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", list(INVALID))
@pytest.mark.parametrize("algo", list(TABLE))
def test_invalid_odd_input(algo, kind, backend):
    transform, exc, match = INVALID[kind]
    if kind == "mixed_dtype" and algo in SINGLE_FLOAT:
        pytest.skip("reads one float input: nothing to mix (test_valid_odd_input)")
    call, _, coefs = TABLE[algo]
    if algo in DISCRETE:  # the table's call reads reward.dim() itself: call the kernel with the inputs as they are
        call = _retrace_discrete(log_form=algo.endswith("_log"), shifted=algo.endswith("_shifted"))
    x = make_rollout((3, 9, 2), -2, "random", seed=3)
    if algo == "vtrace_shifted":  # its last value, from the rollout before the transform spoils it
        x["last_value"] = x["next_value"][:, -1]
    if algo == "retrace_discrete_shifted":  # as its last probabilities and Q values (time_dim: the default, -2)
        x["last_pi"], x["last_q_values"] = x["next_pi"].select(-2, -1), x["next_q_values"].select(-2, -1)
    x = transform(x)
    with pytest.raises(exc, match=match):
        call(x, backend=backend, **coefs)


def _retrace_discrete(log_form, shifted):
    def call(x, **kw):
        mu = {"behavior_log_prob": x["behavior_prob"].log()} if log_form else {"behavior_prob": x["behavior_prob"]}
        if shifted:
            nxt, kw = (None, None), {**kw, "last_pi": x["last_pi"], "last_q_values": x["last_q_values"]}
        else:
            nxt = (x["next_pi"], x["next_q_values"])
        return K.retrace_discrete(x["pi"], x["action"], x["q_values"], *nxt, x["reward"], x["done"], x["terminated"],
                                  **mu, **kw)

    return call


# The TorchRL-compatible functionals: each with the table entry whose reference it must equal.
GAMMA, LMBDA = TABLE["gae"][2]["gamma"], TABLE["gae"][2]["lmbda"]
WRAPPERS = {
    "generalized_advantage_estimate": ("gae", lambda x, **kw: F.generalized_advantage_estimate(
        GAMMA, LMBDA, x["value"], x["next_value"], x["reward"], x["done"], x["terminated"], **kw)),
    "vec_generalized_advantage_estimate": ("gae", lambda x, **kw: F.vec_generalized_advantage_estimate(
        GAMMA, LMBDA, x["value"], x["next_value"], x["reward"], x["done"], x["terminated"], **kw)),
    "td0_return_estimate": ("td0", lambda x, **kw: F.td0_return_estimate(
        GAMMA, x["next_value"], x["reward"], x["terminated"], **kw)),
    "td1_return_estimate": ("td1", lambda x, **kw: F.td1_return_estimate(
        GAMMA, x["next_value"], x["reward"], x["done"], x["terminated"], **kw)),
    "td_lambda_return_estimate": ("td_lambda", lambda x, **kw: F.td_lambda_return_estimate(
        GAMMA, LMBDA, x["next_value"], x["reward"], x["done"], x["terminated"], **kw)),
    "td_lambda_advantage_estimate": ("td_lambda_adv", lambda x, **kw: F.td_lambda_advantage_estimate(
        GAMMA, LMBDA, x["value"], x["next_value"], x["reward"], x["done"], x["terminated"], **kw)),
    "vtrace_advantage_estimate": ("vtrace", lambda x, **kw: F.vtrace_advantage_estimate(
        GAMMA, x["log_pi"], x["log_mu"], x["value"], x["next_value"], x["reward"], x["done"], x["terminated"],
        rho_thresh=1.0, c_thresh=0.8, **kw)),
    "reward2go": ("discounted", lambda x, **kw: F.reward2go(x["reward"], x["done"], GAMMA, **kw)),
}
WRAPPER_KINDS = ["T1", "empty_T", "expanded_outer", "transposed", "bfloat16", "zero_dim", "int_flags", "list"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("kind", WRAPPER_KINDS)
@pytest.mark.parametrize("name", list(WRAPPERS))
def test_torchrl_functionals_odd_input(name, kind, backend):
    algo, call = WRAPPERS[name]
    _, ref, coefs = TABLE[algo]
    if kind == "zero_dim" and name == "td0_return_estimate":
        pytest.skip("TD(0) is elementwise: 0-d inputs have TorchRL's value (test_td0_without_time_dim)")
    if kind in INVALID:
        transform, exc, match = INVALID[kind]
        x = transform(make_rollout((3, 9, 1), -2, "random", seed=4))
        with pytest.raises(exc, match=match):
            call(x, backend=backend)
        return
    shape, time_dim, transform = VALID[kind]
    x = make_rollout(shape[:-1] + (1,), time_dim, "random", seed=4)
    x = transform(x) if transform is not None else x
    out = as_tuple(call(x, backend=backend))
    if x["reward"].numel() == 0:
        assert all(o.shape == x["reward"].shape for o in out), name
        return
    expected, _ = ref(x, **coefs)
    for i, (o, e) in enumerate(zip(out, as_tuple(expected))):
        assert_close(f"{name}[{i}]", o, e, x["reward"].dtype)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("advantage", [False, True], ids=["return", "advantage"])
@pytest.mark.parametrize("shape", [(), (1,), (7,), (2, 3)], ids=["0d", "1", "7", "2x3"])
def test_td0_without_time_dim(shape, advantage, backend):
    """TD(0) is elementwise in TorchRL: inputs without a time dimension (0-d, 1-D, as DQN's and CQL's
    ``td0_return_estimate`` calls on ``(1,)`` tensors) give TorchRL's value, here bit for bit (float32, a float and
    a 0-d tensor gamma), and the float64 oracle's."""
    import torchrl.objectives.value.functional as trl

    g = torch.Generator().manual_seed(7)
    value, next_value, reward = (torch.randn(shape, generator=g).to(DEVICE) for _ in range(3))
    done = (torch.rand(shape, generator=g) < 0.5).to(DEVICE)
    terminated = done & (torch.rand(shape, generator=g) < 0.5).to(DEVICE)
    for gamma in (0.9, torch.tensor(0.9)):
        if advantage:
            ours = F.td0_advantage_estimate(gamma, value, next_value, reward, done, terminated, backend=backend)
            theirs = trl.td0_advantage_estimate(gamma, value, next_value, reward, done, terminated)
        else:
            ours = F.td0_return_estimate(gamma, next_value, reward, terminated, backend=backend)
            theirs = trl.td0_return_estimate(gamma, next_value, reward, terminated)
        assert ours.shape == theirs.shape == torch.Size(shape) and ours.dtype == theirs.dtype
        assert torch.equal(ours, theirs), f"td0 {shape}: {ours} != TorchRL's {theirs}"
        oracle = reward.double() + 0.9 * (~terminated).double() * next_value.double() - (
            value.double() if advantage else 0.0)
        assert_close("td0", ours, oracle.float())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.float64])
@pytest.mark.parametrize("gamma_kind", ["float", "0d", "per_step"])
def test_td0_exact(dtype, gamma_kind, backend):
    """TD(0) in TorchRL's order of operations, bit for bit: ``gamma * next_state_value`` rounded once, times an
    exact 0 or 1, plus ``reward`` (minus ``state_value``), all in float32 for 16-bit inputs and rounded once; inf
    and NaN next values give TorchRL's values (``0 * inf`` is NaN at a terminated step). Inputs are not written."""
    import torchrl.objectives.value.functional as trl

    g = torch.Generator().manual_seed(11)
    shape = (5, 37, 2)
    value, next_value, reward = ((torch.randn(shape, generator=g) * 50).to(DEVICE, dtype) for _ in range(3))
    next_value.view(-1)[:4] = torch.tensor([float("inf"), float("nan"), -float("inf"), float("nan")])
    terminated = (torch.rand(shape, generator=g) < 0.3).to(DEVICE)
    terminated.view(-1)[:4] = torch.tensor([True, True, False, False])
    done = terminated | (torch.rand(shape, generator=g) < 0.2).to(DEVICE)
    gamma = {"float": 0.97, "0d": torch.tensor(0.97), "per_step": (0.5 + torch.rand(shape, generator=g) / 2).to(
        DEVICE)}[gamma_kind]
    copies = [x.clone() for x in (value, next_value, reward, terminated, done)]
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    coef = gamma.to(acc) if isinstance(gamma, torch.Tensor) else gamma
    expected = (reward.to(acc) + (coef * (~terminated).to(acc)) * next_value.to(acc)).to(dtype)
    ours = F.td0_return_estimate(gamma, next_value, reward, terminated, backend=backend)
    adv = F.td0_advantage_estimate(gamma, value, next_value, reward, done, terminated, backend=backend)
    adv_expected = (reward.to(acc) + (coef * (~terminated).to(acc)) * next_value.to(acc) - value.to(acc)).to(dtype)
    def same(a, b):  # bit for bit, NaN where the other has NaN
        return a.dtype == b.dtype and torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(0), b.nan_to_num(0))

    for name, out, want in (("return", ours, expected), ("advantage", adv, adv_expected)):
        assert out.shape == shape and same(out, want), name
    if dtype == torch.float32:  # TorchRL's own result (it returns float32 for 16-bit inputs, float64's gamma differs)
        assert same(ours, trl.td0_return_estimate(gamma, next_value, reward, terminated))
    assert all(same(a, b) for a, b in zip((value, next_value, reward, terminated, done), copies)), "an input changed"
