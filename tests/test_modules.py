"""The TensorDict modules (Retrace, EligibilityTraces, EpisodicPrefixSum) against the float64 references.

Random rollout TensorDicts in TorchRL's layout (``[*B, T]``, rewards and flags ``[*B, T, 1]``) with random
done/terminated/truncated patterns, batch shapes [B, T], [B1, B2, T] and time-major [T, B] (``time_dim=0``), both
paths (the torch path and the Triton kernels, forced with RL_TRITON_TORCHRL_BACKEND), key renames, carried states
(two consecutive pieces equal one uncut call), state_dicts and the errors.
"""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

from _helpers import DEVICE, PATTERNS, assert_close, flags
from rl_triton_torchrl.kernels.reference import (
    eligibility_traces_ref, episodic_prefix_sum_ref, retrace_discrete_ref, retrace_ref,
)
from rl_triton_torchrl.modules import EligibilityTraces, EpisodicPrefixSum, Retrace

GAMMA, LMBDA, C_BAR = 0.95, 0.9, 1.0
A = 3  # actions
# id -> (batch size [*B, T] of the rollout, time_dim given to the module, or None for TorchRL's default: the last)
BATCHES = {
    "B4-T25": ((4, 25), None),
    "B2x3-T17": ((2, 3, 17), None),
    "T25-B4-tdim0": ((25, 4), 0),
    "B3-T1": ((3, 1), None),
}
CUT_BATCHES = {k: v for k, v in BATCHES.items() if k != "B3-T1"}


@pytest.fixture(params=["torch", "triton"])
def backend(request, monkeypatch):
    monkeypatch.setenv("RL_TRITON_TORCHRL_BACKEND", request.param)
    return request.param


def _tdim(batch, time_dim):
    return len(batch) - 1 if time_dim is None else time_dim % len(batch)


def _along_time(td, tdim, sl):
    return td[(slice(None),) * tdim + (sl,)]


def rollout(batch, time_dim=None, *, form="generic", pattern="random", features=(), seed=0):
    """A rollout TensorDict of batch size ``batch`` in TorchRL's layout, with the inputs of one module.

    ``form``: ``"generic"`` or ``"discrete"`` (Retrace), ``"traces"`` (a ``trace_input`` of trailing shape
    ``features``), ``"sums"`` (a second summed entry ``("next", "cost")`` of trailing shape ``features``, and
    ``is_init``).
    """
    g = torch.Generator().manual_seed(seed)
    tdim = _tdim(batch, time_dim)
    done, term = flags((*batch, 1), pattern, g, time_dim=tdim)
    td = TensorDict({"next": {"reward": torch.randn(*batch, 1, generator=g), "done": done.cpu(),
                              "terminated": term.cpu(), "truncated": (done & ~term).cpu()}}, batch_size=batch)
    if form == "generic":
        td["state_action_value"] = torch.randn(*batch, 1, generator=g)
        td["next", "expected_state_value"] = torch.randn(*batch, 1, generator=g)
        td["target_log_prob"] = -torch.rand(*batch, generator=g) * 2
        td["action_log_prob"] = -torch.rand(*batch, generator=g) * 2
    elif form == "discrete":
        for prefix in ((), ("next",)):
            td[(*prefix, "action_value")] = torch.randn(*batch, A, generator=g)
            td[(*prefix, "target_probs")] = torch.randn(*batch, A, generator=g).softmax(-1)
        td["action"] = torch.randint(A, batch, generator=g)
        mu = torch.randn(*batch, A, generator=g).softmax(-1)
        td["action_log_prob"] = mu.gather(-1, td["action"].unsqueeze(-1)).squeeze(-1).log()
    elif form == "traces":
        td["trace_input"] = torch.randn(*batch, *features, generator=g)
    elif form == "sums":
        td["next", "cost"] = torch.randn(*batch, *features, generator=g)
        td["is_init"] = torch.rand(*batch, 1, generator=g) < 0.2
    return td.to(DEVICE)


def _flag_as(flag, x):
    """A ``[*B, T, 1]`` flag as ``x`` ``[*B, T, *F]`` (written out here, independently of the module)."""
    flag = flag.squeeze(-1)
    return flag.reshape(*flag.shape, *([1] * (x.dim() - flag.dim()))).expand(x.shape)


def retrace_expected(td, tdim, *, gamma=GAMMA, lmbda=LMBDA, c_bar=C_BAR, terminated_key="terminated",
                     initial_state=None):
    """(value_target, advantage, final state) of the reference, from the rollout's default keys."""
    kw = dict(gamma=gamma, lmbda=lmbda, c_bar=c_bar, time_dim=tdim, initial_state=initial_state)
    done, term = td["next", "done"], td["next", terminated_key]
    if "state_action_value" in td.keys():
        q = td["state_action_value"]
        log_ratio = (td["target_log_prob"] - td["action_log_prob"]).unsqueeze(-1)
        return retrace_ref(q, td["next", "expected_state_value"], td["next", "reward"], done, term,
                           log_ratio=log_ratio, **kw)
    action = td["action"]
    if action.shape == td["action_value"].shape:
        action = action.argmax(-1)
    q_ret, adv, state = retrace_discrete_ref(
        td["target_probs"], action, td["action_value"], td["next", "target_probs"], td["next", "action_value"],
        td["next", "reward"].squeeze(-1), done.squeeze(-1), term.squeeze(-1),
        behavior_log_prob=td["action_log_prob"], **kw)
    return q_ret.unsqueeze(-1), adv.unsqueeze(-1), state


# ---------------------------------------------------------------------------------------------------- Retrace


@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("case", list(BATCHES))
def test_retrace_generic(case, pattern, backend):
    batch, time_dim = BATCHES[case]
    td = rollout(batch, time_dim, form="generic", pattern=pattern)
    out = Retrace(gamma=GAMMA, lmbda=LMBDA, c_bar=C_BAR, time_dim=time_dim)(td.clone())
    q_ret, adv, _ = retrace_expected(td, _tdim(batch, time_dim))
    assert_close("value_target", out["value_target"], q_ret)
    assert_close("advantage", out["advantage"], adv)


def test_retrace_generic_per_feature(backend):
    """Q of several critics ``[*B, T, 2]``: the ``[*B, T]`` log-probabilities and ``[*B, T, 1]`` rewards and flags
    are expanded over the critics."""
    td = rollout((3, 11), form="generic", seed=9)
    td["state_action_value"] = torch.randn(3, 11, 2)
    td["next", "expected_state_value"] = torch.randn(3, 11, 2)
    out = Retrace(gamma=GAMMA, lmbda=LMBDA)(td.clone())
    expand = {k: td["next", k].expand(3, 11, 2) for k in ("reward", "done", "terminated")}
    log_ratio = (td["target_log_prob"] - td["action_log_prob"]).unsqueeze(-1).expand(3, 11, 2)
    q_ret, adv, _ = retrace_ref(td["state_action_value"], td["next", "expected_state_value"], expand["reward"],
                                expand["done"], expand["terminated"], log_ratio=log_ratio, gamma=GAMMA, lmbda=LMBDA)
    assert_close("value_target", out["value_target"], q_ret)
    assert_close("advantage", out["advantage"], adv)


@pytest.mark.parametrize("action", ["index", "index1", "one_hot", "one_hot_bool"])
@pytest.mark.parametrize("case", list(BATCHES))
def test_retrace_discrete(case, action, backend):
    batch, time_dim = BATCHES[case]
    td = rollout(batch, time_dim, form="discrete", seed=1)
    q_ret, adv, _ = retrace_expected(td, _tdim(batch, time_dim), c_bar=0.7)
    if action == "index1":
        td["action"] = td["action"].unsqueeze(-1)
    elif action.startswith("one_hot"):
        hot = torch.nn.functional.one_hot(td["action"], A)
        td["action"] = hot.bool() if action == "one_hot_bool" else hot.float()
    out = Retrace(gamma=GAMMA, lmbda=LMBDA, c_bar=0.7, time_dim=time_dim)(td)
    assert out["value_target"].shape == (*batch, 1)
    assert_close("value_target", out["value_target"], q_ret)
    assert_close("advantage", out["advantage"], adv)


@pytest.mark.parametrize("form", ["generic", "discrete"])
def test_retrace_behaviour_prob_and_default_terminated(form, backend):
    """A behaviour probability (no log-probability) key, and a rollout without ("next", "terminated")."""
    td = rollout((3, 20), form=form, pattern="trunc_last", seed=2)
    expected = retrace_expected(td, 1, terminated_key="done")
    td["sample_prob"] = td.pop("action_log_prob").exp()
    del td["next", "terminated"]
    out = Retrace(gamma=GAMMA, lmbda=LMBDA)(td)
    assert_close("value_target", out["value_target"], expected[0])
    assert_close("advantage", out["advantage"], expected[1])


def test_retrace_generic_wins_when_both_forms_are_complete(backend):
    td = rollout((3, 12), form="discrete", seed=3)
    td.update(rollout((3, 12), form="generic", seed=4).exclude("next", "action_log_prob"))
    td["next", "expected_state_value"] = torch.randn(3, 12, 1)
    # the discrete rollout's own behaviour log-probabilities serve the generic form too
    out = Retrace(gamma=GAMMA, lmbda=LMBDA)(td.clone())
    assert_close("value_target", out["value_target"], retrace_expected(td, 1)[0])


@pytest.mark.parametrize("form", ["generic", "discrete"])
def test_retrace_set_keys(form, backend):
    td = rollout((4, 15), form=form, seed=5)
    q_ret, adv, _ = retrace_expected(td, 1)
    nxt = td["next"]
    renamed = TensorDict({"behaviour": {"lp": td["action_log_prob"]},
                          "next": {"rew": nxt["reward"], "d": nxt["done"], "term": nxt["terminated"]}},
                         batch_size=td.batch_size)
    renames = {"reward": "rew", "done": "d", "terminated": "term", "sample_log_prob": ("behaviour", "lp"),
               "value_target": ("retrace", "target"), "advantage": "adv"}
    if form == "generic":
        renames.update(state_action_value="q", expected_state_value=("critic", "expected_q"), target_log_prob="pi_lp")
        renamed["q"], renamed["pi_lp"] = td["state_action_value"], td["target_log_prob"]
        renamed["next", "critic", "expected_q"] = nxt["expected_state_value"]
    else:
        renames.update(action_value=("agent", "q"), target_probs="pi", action="a")
        renamed["agent", "q"], renamed["pi"], renamed["a"] = td["action_value"], td["target_probs"], td["action"]
        renamed["next", "agent", "q"], renamed["next", "pi"] = nxt["action_value"], nxt["target_probs"]
    module = Retrace(gamma=GAMMA, lmbda=LMBDA)
    module.set_keys(**renames)
    assert module.tensor_keys.value_target == ("retrace", "target")
    assert ("next", "rew") in module.in_keys and module.out_keys == [("retrace", "target"), "adv"]
    out = module(renamed)
    assert_close("value_target", out["retrace", "target"], q_ret)
    assert_close("advantage", out["adv"], adv)
    with pytest.raises(KeyError, match="'value' is not an accepted tensordict key of Retrace"):
        module.set_keys(value="v")
    with pytest.raises(ValueError, match="NestedKey"):
        module.set_keys(reward=None)


@pytest.mark.parametrize("form", ["generic", "discrete"])
@pytest.mark.parametrize("case", list(CUT_BATCHES))
def test_retrace_carry_from_the_end(case, form, backend):
    """Steps [k:T] first, then [0:k]: the same targets as one call on [0:T]."""
    batch, time_dim = CUT_BATCHES[case]
    tdim = _tdim(batch, time_dim)
    td = rollout(batch, time_dim, form=form, seed=6)
    whole = Retrace(gamma=GAMMA, lmbda=LMBDA, time_dim=time_dim)(td.clone())
    module = Retrace(gamma=GAMMA, lmbda=LMBDA, time_dim=time_dim, carry_state=True)
    k = batch[tdim] // 2
    late = module(_along_time(td, tdim, slice(k, None)).clone())
    late_state = module.carried_state["value_target"]
    early = module(_along_time(td, tdim, slice(0, k)).clone())
    for key in ("value_target", "advantage"):
        glued = torch.cat([early[key], late[key]], dim=tdim)
        assert_close(key, glued, whole[key])
    # the state carried out of the late piece is the reference's c_k (Q_ret_k - Q_k)
    _, _, expected_state = retrace_expected(_along_time(td, tdim, slice(k, None)), tdim)
    assert_close("carried state", late_state, expected_state.to(late_state.dtype))
    module.reset_state()
    assert module.carried_state == {"value_target": None}
    assert_close("after reset_state", module(_along_time(td, tdim, slice(0, k)).clone())["value_target"],
                 Retrace(gamma=GAMMA, lmbda=LMBDA, time_dim=time_dim)(_along_time(td, tdim, slice(0, k)).clone())[
                     "value_target"])


@pytest.mark.parametrize(
    "form, delete, named",
    [
        ("generic", ("next", "expected_state_value"), r"\('next', 'expected_state_value'\)"),
        ("generic", "state_action_value", "'state_action_value'"),
        ("discrete", ("next", "target_probs"), r"\('next', 'target_probs'\)"),
        ("discrete", "action", "'action'"),
        ("generic", "action_log_prob", "'action_log_prob'.*'sample_prob'"),
        ("discrete", ("next", "reward"), r"\('next', 'reward'\)"),
        ("generic", ("next", "done"), r"\('next', 'done'\)"),
    ],
)
def test_retrace_missing_keys(form, delete, named):
    td = rollout((2, 5), form=form)
    del td[delete]
    with pytest.raises(KeyError, match=f"Retrace.*{named}"):
        Retrace(gamma=GAMMA)(td)


def test_retrace_names_both_forms_when_neither_is_complete():
    td = rollout((2, 5), form="generic")
    del td["next", "expected_state_value"]
    with pytest.raises(KeyError) as info:
        Retrace(gamma=GAMMA)(td)
    msg = str(info.value)
    assert "generic form" in msg and "discrete form" in msg and "'action_value'" in msg and "set_keys" in msg


def test_retrace_bad_one_hot():
    """Checked on CPU tensors (on CUDA the check would synchronise the device)."""
    td = rollout((2, 5), form="discrete").cpu()
    td["action"] = torch.ones(2, 5, A)
    with pytest.raises(ValueError, match="Retrace: 'action'.*one-hot"):
        Retrace(gamma=GAMMA)(td)
    td["action"] = torch.zeros(2, 5, 2, dtype=torch.int64)
    with pytest.raises(ValueError, match="Retrace: 'action' has shape"):
        Retrace(gamma=GAMMA)(td)


def test_retrace_differentiable():
    """``differentiable=True``: the gradients of the advantage with respect to Q(s, a) and the next expected Q are
    those through the float64 reference (autograd through ``retrace_ref``), for a random cotangent."""
    td = rollout((2, 8), form="generic")
    q = td["state_action_value"].requires_grad_()
    nq = td["next", "expected_state_value"].requires_grad_()
    assert not Retrace(gamma=GAMMA)(td.clone())["value_target"].requires_grad
    out = Retrace(gamma=GAMMA, lmbda=LMBDA, c_bar=C_BAR, differentiable=True)(td.clone())
    cotangent = torch.randn(out["advantage"].shape, generator=torch.Generator().manual_seed(1)).to(DEVICE)
    (out["advantage"] * cotangent).sum().backward()
    q64, nq64 = (x.detach().double().requires_grad_() for x in (q, nq))
    log_ratio = (td["target_log_prob"] - td["action_log_prob"]).unsqueeze(-1).double()
    _, adv_ref, _ = retrace_ref(q64, nq64, td["next", "reward"].double(), td["next", "done"],
                                td["next", "terminated"], log_ratio=log_ratio, gamma=GAMMA, lmbda=LMBDA,
                                c_bar=C_BAR, time_dim=1)
    (adv_ref * cotangent.double()).sum().backward()
    assert_close("d advantage / d state_action_value", q.grad, q64.grad.float())
    assert_close("d advantage / d next expected_state_value", nq.grad, nq64.grad.float())


# ---------------------------------------------------------------------------------------- EligibilityTraces


@pytest.mark.parametrize("features", [(), (1,), (5,), (2, 3)], ids=["F-", "F1", "F5", "F2x3"])
@pytest.mark.parametrize("pattern", ["none", "all", "random"])
@pytest.mark.parametrize("case", list(BATCHES))
def test_eligibility_traces(case, pattern, features, backend):
    batch, time_dim = BATCHES[case]
    tdim = _tdim(batch, time_dim)
    td = rollout(batch, time_dim, form="traces", pattern=pattern, features=features)
    out = EligibilityTraces(gamma=GAMMA, lmbda=LMBDA, time_dim=time_dim)(td.clone())
    x = td["trace_input"]
    expected, _ = eligibility_traces_ref(x, _flag_as(td["next", "done"], x), gamma=GAMMA, lmbda=LMBDA, time_dim=tdim)
    assert_close("eligibility_trace", out["eligibility_trace"], expected)


@pytest.mark.parametrize("case", list(CUT_BATCHES))
def test_eligibility_traces_carry(case, backend):
    """Two consecutive batches (in collection order) give the traces of the uncut rollout."""
    batch, time_dim = CUT_BATCHES[case]
    tdim = _tdim(batch, time_dim)
    td = rollout(batch, time_dim, form="traces", features=(4,), seed=7)
    whole = EligibilityTraces(gamma=GAMMA, lmbda=LMBDA, time_dim=time_dim)(td.clone())["eligibility_trace"]
    module = EligibilityTraces(gamma=GAMMA, lmbda=LMBDA, time_dim=time_dim, carry_state=True)
    k = batch[tdim] // 2
    first = module(_along_time(td, tdim, slice(0, k)).clone())["eligibility_trace"]
    second = module(_along_time(td, tdim, slice(k, None)).clone())["eligibility_trace"]
    assert_close("eligibility_trace", torch.cat([first, second], dim=tdim), whole)


def test_eligibility_traces_set_keys(backend):
    td = rollout((3, 10), form="traces", features=(2,))
    renamed = TensorDict({"grads": {"v": td["trace_input"]}, "next": {"end": td["next", "done"]}}, [3, 10])
    module = EligibilityTraces(gamma=GAMMA, lmbda=LMBDA)
    module.set_keys(trace_input=("grads", "v"), done="end", eligibility_trace="e")
    assert module.in_keys == [("grads", "v"), ("next", "end")] and module.out_keys == ["e"]
    expected = EligibilityTraces(gamma=GAMMA, lmbda=LMBDA)(td)["eligibility_trace"]
    assert_close("e", module(renamed)["e"], expected)
    with pytest.raises(KeyError, match="'reward' is not an accepted tensordict key of EligibilityTraces"):
        module.set_keys(reward="r")


def test_eligibility_traces_missing_keys():
    td = rollout((2, 5), form="traces")
    with pytest.raises(KeyError, match=r"EligibilityTraces.*\('next', 'done'\)"):
        EligibilityTraces(gamma=GAMMA, lmbda=LMBDA)(td.exclude(("next", "done")))
    with pytest.raises(KeyError, match="EligibilityTraces.*'trace_input'.*set_keys"):
        EligibilityTraces(gamma=GAMMA, lmbda=LMBDA)(td.exclude("trace_input"))


# ---------------------------------------------------------------------------------------- EpisodicPrefixSum


@pytest.mark.parametrize("reset", ["after_done", "at_start"])
@pytest.mark.parametrize("pattern", ["none", "all", "random"])
@pytest.mark.parametrize("case", list(BATCHES))
def test_episodic_prefix_sum(case, pattern, reset, backend):
    batch, time_dim = BATCHES[case]
    tdim = _tdim(batch, time_dim)
    td = rollout(batch, time_dim, form="sums", pattern=pattern, features=(2,))
    module = EpisodicPrefixSum([("next", "reward"), ("next", "cost")], ["return_so_far", ("costs", "so_far")],
                               reset=reset, time_dim=time_dim)
    out = module(td.clone())
    boundary = td["next", "done"] if reset == "after_done" else td["is_init"]
    for in_key, out_key in module.sum_keys:
        x = td[in_key]
        expected, _ = episodic_prefix_sum_ref(x, _flag_as(boundary, x), reset=reset, time_dim=tdim)
        assert_close(str(out_key), out[out_key], expected)
    length, _ = episodic_prefix_sum_ref(torch.ones(boundary.shape), boundary, reset=reset, time_dim=tdim)
    assert out["episode_length_so_far"].dtype == torch.int64
    assert torch.equal(out["episode_length_so_far"].cpu(), length.cpu().to(torch.int64))


def test_episodic_prefix_sum_defaults(backend):
    td = rollout((4, 30), form="sums")
    out = EpisodicPrefixSum()(td.clone())
    expected, _ = episodic_prefix_sum_ref(td["next", "reward"], td["next", "done"], reset="after_done")
    assert_close("episode_return_so_far", out["episode_return_so_far"], expected)
    module = EpisodicPrefixSum(length_key=None)
    assert module.in_keys == [("next", "reward"), ("next", "done")]
    assert module.out_keys == ["episode_return_so_far"]
    assert "episode_length_so_far" not in module(td.clone()).keys()
    lengths_only = EpisodicPrefixSum([], [], reset="at_start")
    assert lengths_only.in_keys == ["is_init"] and lengths_only.out_keys == ["episode_length_so_far"]


@pytest.mark.parametrize("reset", ["after_done", "at_start"])
@pytest.mark.parametrize("case", list(CUT_BATCHES))
def test_episodic_prefix_sum_carry(case, reset, backend):
    """Two consecutive batches (in collection order) give the sums of the uncut rollout, one state per output."""
    batch, time_dim = CUT_BATCHES[case]
    tdim = _tdim(batch, time_dim)
    td = rollout(batch, time_dim, form="sums", features=(3,), seed=8)
    kw = dict(in_keys=[("next", "reward"), ("next", "cost")], out_keys=["ret", "cost_so_far"], reset=reset,
              time_dim=time_dim)
    whole = EpisodicPrefixSum(**kw)(td.clone())
    module = EpisodicPrefixSum(**kw, carry_state=True)
    k = batch[tdim] // 2
    first = module(_along_time(td, tdim, slice(0, k)).clone())
    assert set(module.carried_state) == {"ret", "cost_so_far", "episode_length_so_far"}
    assert module.carried_state["cost_so_far"].shape == _along_time(td, tdim, 0)["next", "cost"].shape
    second = module(_along_time(td, tdim, slice(k, None)).clone())
    for key in ("ret", "cost_so_far", "episode_length_so_far"):
        glued = torch.cat([first[key], second[key]], dim=tdim)
        if key == "episode_length_so_far":
            assert torch.equal(glued, whole[key])
        else:
            assert_close(key, glued, whole[key])


def test_episodic_prefix_sum_errors():
    with pytest.raises(ValueError, match="reset must be one of"):
        EpisodicPrefixSum(reset="before_done")
    with pytest.raises(ValueError, match="one out_key per in_key"):
        EpisodicPrefixSum([("next", "reward")], ["a", "b"])
    with pytest.raises(ValueError, match="need out_keys"):
        EpisodicPrefixSum([("next", "reward")])
    with pytest.raises(ValueError, match="nothing to compute"):
        EpisodicPrefixSum([], [], length_key=None)
    td = rollout((2, 5), form="sums")
    with pytest.raises(KeyError, match="EpisodicPrefixSum.*'is_init'"):
        EpisodicPrefixSum(reset="at_start")(td.exclude("is_init"))
    with pytest.raises(KeyError, match=r"EpisodicPrefixSum.*\('next', 'penalty'\)"):
        EpisodicPrefixSum([("next", "penalty")], ["p"])(td)


# --------------------------------------------------------------------------------------- all three modules

# name -> (module factory, rollout form, an output key)
MODULES = {
    "Retrace": (lambda **kw: Retrace(gamma=GAMMA, lmbda=LMBDA, **kw), "generic", "value_target"),
    "EligibilityTraces": (lambda **kw: EligibilityTraces(gamma=GAMMA, lmbda=LMBDA, **kw), "traces",
                          "eligibility_trace"),
    "EpisodicPrefixSum": (lambda **kw: EpisodicPrefixSum(**kw), "sums", "episode_return_so_far"),
}


@pytest.mark.parametrize("name", list(MODULES))
def test_time_dim_from_names(name):
    """Without time_dim, the batch dim named "time" is the time dimension (TorchRL's rule), else the last."""
    make, form, key = MODULES[name]
    td = rollout((20, 3), 0, form=form, features=(2,))
    expected = make(time_dim=0)(td.clone())[key]
    named = td.clone()
    named.names = ["time", None]
    assert_close(key, make()(named)[key], expected)
    assert_close(key, make()(td.clone())[key], make(time_dim=-1)(td.clone())[key])
    with pytest.raises(ValueError, match=f"{name}: time_dim=2 is out of range"):
        make(time_dim=2)(td.clone())


@pytest.mark.parametrize("name", list(MODULES))
def test_batch_shape_change_raises(name):
    make, form, key = MODULES[name]
    module = make(carry_state=True)
    module(rollout((4, 6), form=form, features=(2,)))
    with pytest.raises(ValueError, match=f"{name}: the state carried for .* reset_state"):
        module(rollout((3, 6), form=form, features=(2,)))
    module.reset_state()
    assert all(state is None for state in module.carried_state.values())
    module(rollout((3, 6), form=form, features=(2,)))  # a fresh stream after the reset


@pytest.mark.parametrize("name", ["Retrace", "EligibilityTraces"])
def test_state_dict_round_trip(name):
    make, form, key = MODULES[name]
    buffers = {"Retrace": {"gamma", "lmbda", "c_bar"}, "EligibilityTraces": {"gamma", "lmbda"}}[name]
    source = make(carry_state=True)
    source.gamma.fill_(0.5)
    source.lmbda.fill_(0.7)
    td = rollout((3, 9), form=form, features=(2,))
    source(td.clone())  # a carried state exists now, and stays out of the state_dict
    assert set(source.state_dict()) == buffers
    target = make()
    target.load_state_dict(source.state_dict())
    assert target.gamma.item() == 0.5 and target.lmbda.item() == pytest.approx(0.7)
    source.reset_state()
    assert_close(key, target(td.clone())[key], source(td.clone())[key])


@pytest.mark.parametrize("name", list(MODULES))
def test_runs_our_kernels(name, monkeypatch):
    """An invalid backend in the environment reaches the kernel functions: the modules run our kernels."""
    make, form, _ = MODULES[name]
    monkeypatch.setenv("RL_TRITON_TORCHRL_BACKEND", "nonsense")
    with pytest.raises(ValueError, match="RL_TRITON_TORCHRL_BACKEND"):
        make()(rollout((2, 4), form=form))


# ---------------------------------------------------------------------------------------------- shared checks


@pytest.mark.parametrize("case", ["retrace-done", "retrace-reward-dtype", "retrace-discrete-dtype", "traces-done",
                                  "traces-input", "sums-boundary", "sums-input"])
def test_errors_name_the_entry(case):
    """A kernel's InputError / TypeError names the tensordict entry that holds the bad tensor (same type)."""
    module, form = {"retrace": (Retrace(gamma=GAMMA), "generic"), "traces": (EligibilityTraces(gamma=GAMMA,
                    lmbda=LMBDA), "traces"), "sums": (EpisodicPrefixSum(), "sums")}[case.split("-")[0]]
    if case == "retrace-discrete-dtype":
        module, form = Retrace(gamma=GAMMA), "discrete"
    td = rollout((2, 5), form=form, features=(2,))
    name = type(module).__name__
    if case in ("retrace-done", "traces-done", "sums-boundary"):
        td["next", "done"] = td["next", "done"].long()
        exc, match = TypeError, rf"^{name}: \('next', 'done'\): .*must be a bool tensor"
    elif case == "retrace-reward-dtype":
        td["next", "reward"] = td["next", "reward"].double()
        exc, match = TypeError, rf"^{name}: .*\('next', 'reward'\).*: .*dtype"
    elif case == "retrace-discrete-dtype":
        td["next", "action_value"] = td["next", "action_value"].double()
        exc, match = TypeError, r"^Retrace: .*\('next', 'action_value'\).*: .*dtype"
    elif case == "traces-input":
        td["trace_input"] = td["trace_input"].long()
        exc, match = TypeError, r"^EligibilityTraces: 'trace_input': x must be a floating-point tensor"
    else:
        td["next", "reward"] = td["next", "reward"].long()
        exc, match = TypeError, r"^EpisodicPrefixSum: \('next', 'reward'\): x must be a floating-point tensor"
    with pytest.raises(exc, match=match):
        module(td)


@pytest.mark.parametrize("make,match", [
    (lambda: Retrace(gamma=1.5), r"Retrace: gamma must lie in \[0.0, 1.0\], got 1.5"),
    (lambda: Retrace(gamma=0.9, lmbda=-0.5), r"Retrace: lmbda must lie in \[0.0, 1.0\], got -0.5"),
    (lambda: Retrace(gamma=0.9, c_bar=-1.0), r"Retrace: c_bar must be finite and >= 0.0, got -1.0"),
    (lambda: Retrace(gamma=torch.tensor(float("nan"))), "Retrace: gamma must lie in .* got a value of nan"),
    (lambda: EligibilityTraces(gamma=0.9, lmbda=1.2), r"EligibilityTraces: lmbda must lie in \[0.0, 1.0\]"),
], ids=["retrace-gamma", "retrace-lmbda", "retrace-c_bar", "retrace-gamma-tensor", "traces-lmbda"])
def test_constructor_checks_coefficients(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_constructor_accepts_coefficient_tensors():
    """In-range tensors (and the boundaries) build and give the reference's numbers."""
    td = rollout((2, 6), form="generic")
    out = Retrace(gamma=torch.tensor(GAMMA), lmbda=torch.tensor(LMBDA), c_bar=0.0)(td.clone())
    expected = retrace_expected(td, 1, c_bar=0.0)
    assert_close("value_target", out["value_target"], expected[0])
    EligibilityTraces(gamma=1.0, lmbda=0.0)
