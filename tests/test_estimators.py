"""Our estimator classes against TorchRL's own, on random rollout TensorDicts, and patch/unpatch.

Paths: the torch path (default on CPU) and the Triton kernels (forced with RL_TRITON_TORCHRL_BACKEND=triton: the
interpreter without a GPU, CUDA on the GPU).
"""
from __future__ import annotations

import copy
import functools

import pytest
import torch
import torchrl.objectives.value as trl_value
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.objectives import A2CLoss, ClipPPOLoss, ValueEstimators
from torchrl.objectives.utils import _VALUE_ESTIMATOR_REGISTRY

import rl_triton_torchrl as rtt
from _helpers import DEVICE, assert_close, flags

OBS = 3
# name -> (constructor kwargs); ours and TorchRL's class share the name
CLASSES = {
    "GAE": {"gamma": 0.98, "lmbda": 0.93},
    "TDLambdaEstimator": {"gamma": 0.98, "lmbda": 0.93},
    "TD1Estimator": {"gamma": 0.98},
    "TD0Estimator": {"gamma": 0.98},
}


@pytest.fixture(params=["torch", "triton"])
def backend(request, monkeypatch):
    monkeypatch.setenv("RL_TRITON_TORCHRL_BACKEND", request.param)
    return request.param


def rollout(batch=(4, 25), seed=0, pattern="random", agents=None, keys=None, with_values=True):
    """A rollout TensorDict of batch size [*B, T] in TorchRL's layout."""
    g = torch.Generator().manual_seed(seed)
    keys = {"reward": "reward", "done": "done", "terminated": "terminated", "value": "state_value", **(keys or {})}
    shape = (*batch, 1)
    done, term = flags(shape, pattern, g, time_dim=-2)
    vshape = (*batch, agents, 1) if agents else shape
    td = TensorDict(
        {
            "observation": torch.randn(*batch, OBS, generator=g),
            "next": {
                "observation": torch.randn(*batch, OBS, generator=g),
                keys["reward"]: torch.randn(shape, generator=g),
                keys["done"]: done.cpu(),
                keys["terminated"]: term.cpu(),
                "truncated": (done & ~term).cpu(),
            },
        },
        batch_size=batch,
    )
    if with_values:
        td[keys["value"]] = torch.randn(vshape, generator=g)
        td["next", keys["value"]] = torch.randn(vshape, generator=g)
    return td.to(DEVICE)


def value_net(seed=0, out_key="state_value"):
    torch.manual_seed(seed)
    return TensorDictModule(nn.Linear(OBS, 1), in_keys=["observation"], out_keys=[out_key]).to(DEVICE)


def pair(name, **kwargs):
    """(ours, TorchRL's) estimators built with the same arguments; the value network is shared."""
    kw = {**CLASSES.get(name, {}), **kwargs}
    return getattr(rtt, name)(**kw), getattr(trl_value, name)(**kw)


def compare(td_ours, td_theirs, keys=("advantage", "value_target")):
    """Every one of ``keys`` is in both outputs and equal to rounding; a key missing on either side fails."""
    for key in keys:
        assert key in td_theirs.keys(True), f"TorchRL's output has no {key!r} entry"
        assert key in td_ours.keys(True), f"our output has no {key!r} entry (TorchRL's has)"
        assert_close(key, td_ours[key], td_theirs[key])


@pytest.mark.parametrize("name", list(CLASSES))
@pytest.mark.parametrize("pattern", ["none", "all", "random", "trunc_last"])
def test_precomputed_values(name, pattern, backend):
    ours, theirs = pair(name, value_network=None)
    td = rollout(pattern=pattern)
    compare(ours(td.clone()), theirs(td.clone()))


@pytest.mark.parametrize("name", list(CLASSES))
@pytest.mark.parametrize("shifted", [False, True])
def test_value_network(name, shifted, backend):
    net = value_net()
    ours, theirs = pair(name, value_network=net, shifted=shifted)
    td = rollout(with_values=False)
    out_o, out_t = ours(td.clone()), theirs(td.clone())
    compare(out_o, out_t, ("advantage", "value_target", "state_value"))


@pytest.mark.parametrize("name", list(CLASSES))
@pytest.mark.parametrize("layout", ["time-major", "extra-batch"])
def test_time_dims(name, layout, backend):
    if layout == "time-major":
        # TD(0) has no recursion along time and takes no time_dim
        ours, theirs = pair(name, value_network=None, **({} if name == "TD0Estimator" else {"time_dim": 0}))
        td = rollout(batch=(25, 4))
        compare(ours(td.clone()), theirs(td.clone()))
    else:
        ours, theirs = pair(name, value_network=None)
        td = rollout(batch=(2, 3, 17))
        compare(ours(td.clone()), theirs(td.clone()))


def test_multi_agent_gae(backend):
    ours = rtt.MultiAgentGAE(gamma=0.97, lmbda=0.9, value_network=None)
    theirs = trl_value.MultiAgentGAE(gamma=0.97, lmbda=0.9, value_network=None)
    td = rollout(batch=(3, 20), agents=4)
    out_o, out_t = ours(td.clone()), theirs(td.clone())
    assert out_o["advantage"].shape == (3, 20, 4, 1)
    compare(out_o, out_t)


@pytest.mark.parametrize("name", list(CLASSES))
def test_set_keys(name, backend):
    renamed = {"reward": "rew", "done": "d", "terminated": "term", "value": "v"}
    ours, theirs = pair(name, value_network=None)
    for est in (ours, theirs):
        est.set_keys(reward="rew", done="d", terminated="term", value="v", advantage="adv", value_target="vt")
    td = rollout(keys=renamed)
    compare(ours(td.clone()), theirs(td.clone()), ("adv", "vt"))


def _snapshot(td):
    """Every leaf of ``td``, by key: the tensor object and a copy of its values."""
    return {k: (v, v.clone()) for k, v in td.items(include_nested=True, leaves_only=True)}


def assert_unchanged_but(td, before, written):
    """``td`` holds exactly the entries of ``before`` plus ``written`` (the outputs TorchRL writes), and every entry
    of ``before`` is the same tensor with the same values."""
    keys = set(td.keys(include_nested=True, leaves_only=True))
    assert keys == set(before) | set(written), f"entries added or removed: {keys ^ (set(before) | set(written))}"
    for key, (tensor, values) in before.items():
        assert td.get(key) is tensor, f"{key!r} was replaced"
        assert torch.equal(tensor, values), f"{key!r} was written in place"


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "torchrl-forward"])
@pytest.mark.parametrize("missing", ["done", "terminated"])
@pytest.mark.parametrize("name", list(CLASSES))
def test_truncated_key_completes_flags(name, missing, direct, backend):
    """A rollout without ("next", "done") (or without terminated) but with truncated: done = terminated | truncated
    (terminated = done & ~truncated), as TorchRL computes on the full rollout; the input gets the outputs TorchRL
    writes and nothing else (no completed flag), on the direct path and through TorchRL's forward."""
    ours, theirs = pair(name, value_network=None)
    ours.direct_path = direct
    ours.set_keys(truncated="trunc")
    full = rollout()
    full["next", "trunc"] = full["next", "truncated"]
    td = full.clone()
    del td["next", missing]
    before = _snapshot(td)
    out = ours(td)
    assert out is td
    assert_unchanged_but(td, before, ["advantage", "value_target"])
    compare(out, theirs(full.clone()))


@pytest.mark.parametrize("name", list(CLASSES))
def test_value_network_call_writes_what_torchrl_writes(name):
    """With a value network and a completed flag (TorchRL's forward on a shallow copy): the same entries as
    TorchRL's class writes on the full rollout, except the completed flag."""
    net = value_net()
    ours, theirs = pair(name, value_network=net)
    full = rollout(with_values=False)
    td = full.clone()
    del td["next", "done"]
    before = _snapshot(td)
    out_t = theirs(full.clone())
    written = set(out_t.keys(True, True)) - set(full.keys(True, True))
    ours(td)
    assert_unchanged_but(td, before, written)
    compare(td, out_t, sorted(written, key=str))


@pytest.mark.parametrize("name", list(CLASSES))
def test_differentiable_gradients(name, backend):
    """With differentiable=True the value network's parameters get exactly TorchRL's gradients (or, where TorchRL
    holds the network out of the graph, none either)."""
    grads = {}
    for which in ("ours", "theirs"):
        net = value_net(seed=1)
        module = rtt if which == "ours" else trl_value
        est = getattr(module, name)(**CLASSES[name], value_network=net, differentiable=True)
        td = rollout(with_values=False)
        out = est(td)
        key = "advantage" if "advantage" in out.keys() else "value_target"
        if not out[key].requires_grad:
            grads[which] = None
            continue
        (out[key] ** 2).sum().backward()
        grads[which] = [p.grad.clone() for p in net.parameters()]
    assert (grads["ours"] is None) == (grads["theirs"] is None)
    for i, (a, b) in enumerate(zip(grads["ours"] or [], grads["theirs"] or [])):
        assert_close(f"param {i} grad", a, b)


@pytest.mark.parametrize("name", ["GAE", "TDLambdaEstimator"])
def test_differentiable_functional_params(name, backend):
    """Gradients through the estimate with respect to the values themselves (as a Dreamer-style loss needs)."""
    grads = {}
    for which in ("ours", "theirs"):
        module = rtt if which == "ours" else trl_value
        est = getattr(module, name)(**CLASSES[name], value_network=None, differentiable=True)
        td = rollout()
        v = td["state_value"].clone().requires_grad_()
        nv = td["next", "state_value"].clone().requires_grad_()
        td["state_value"], td["next", "state_value"] = v, nv
        out = est(td)
        key = "advantage" if "advantage" in out.keys() else "value_target"
        (out[key] ** 2).sum().backward()
        grads[which] = (v.grad, nv.grad)
    for i, (a, b) in enumerate(zip(grads["ours"], grads["theirs"])):
        if b is None:
            assert a is None or not a.any()
        else:
            assert_close(f"grad {i}", a, b)


@pytest.mark.parametrize("name", list(CLASSES))
def test_state_dict_round_trip(name):
    ours, theirs = pair(name, value_network=None)
    ours.gamma.fill_(0.5)
    theirs.load_state_dict(ours.state_dict())
    assert theirs.gamma.item() == 0.5
    theirs.gamma.fill_(0.7)
    ours.load_state_dict(theirs.state_dict())
    assert ours.gamma.item() == pytest.approx(0.7)
    assert set(ours.state_dict()) == set(theirs.state_dict())


@pytest.mark.parametrize("name", list(CLASSES))
def test_ours_actually_runs(name, monkeypatch):
    """An invalid backend in the environment reaches our functional: proof that the math is ours."""
    monkeypatch.setenv("RL_TRITON_TORCHRL_BACKEND", "nonsense")
    ours, theirs = pair(name, value_network=None)
    td = rollout()
    with pytest.raises(ValueError, match="RL_TRITON_TORCHRL_BACKEND"):
        ours(td.clone())
    theirs(td.clone())  # TorchRL's class is untouched


@pytest.mark.parametrize("vectorized", [False, True])
@pytest.mark.parametrize("name", ["GAE", "TDLambdaEstimator"])
def test_vectorized_flag(name, vectorized, backend):
    """Either value of ``vectorized`` gives TorchRL's class's result with that value (ours are exact both ways;
    TorchRL's vectorised series is cut at 1e-7, within the float32 tolerance)."""
    td = rollout()
    ours, theirs = pair(name, value_network=None)
    ours.vectorized = theirs.vectorized = vectorized
    compare(ours(td.clone()), theirs(td.clone()))


def test_patch_unpatch():
    originals = {name: getattr(trl_value, name) for name in ("GAE", "TDLambdaEstimator", "TD0Estimator")}
    import torchrl.objectives.value.advantages as adv
    import torchrl.objectives.value.functional as fn

    fn_originals = {k: getattr(fn, k) for k in fn.__all__}
    reg_originals = {k: v.cls for k, v in _VALUE_ESTIMATOR_REGISTRY.items()}
    rtt.patch_torchrl()
    try:
        assert rtt.patch.is_patched()
        assert trl_value.GAE is rtt.GAE and adv.GAE is rtt.GAE
        assert fn.generalized_advantage_estimate is rtt.functional.generalized_advantage_estimate
        assert adv.vec_generalized_advantage_estimate is rtt.functional.vec_generalized_advantage_estimate
        assert _VALUE_ESTIMATOR_REGISTRY[ValueEstimators.GAE].cls is rtt.GAE
        rtt.patch_torchrl()  # idempotent
    finally:
        rtt.unpatch_torchrl()
    assert not rtt.patch.is_patched()
    for name, cls in originals.items():
        assert getattr(trl_value, name) is cls
    assert {k: getattr(fn, k) for k in fn.__all__} == fn_originals
    assert {k: v.cls for k, v in _VALUE_ESTIMATOR_REGISTRY.items()} == reg_originals
    with rtt.torchrl_patched():
        assert trl_value.GAE is rtt.GAE
    assert trl_value.GAE is originals["GAE"]


def _actor_critic(seed=0):
    from tensordict.nn import NormalParamExtractor
    from torchrl.modules import ProbabilisticActor, TanhNormal

    torch.manual_seed(seed)
    actor_net = nn.Sequential(nn.Linear(OBS, 4), NormalParamExtractor())
    actor = ProbabilisticActor(
        TensorDictModule(actor_net, in_keys=["observation"], out_keys=["loc", "scale"]),
        in_keys=["loc", "scale"], distribution_class=TanhNormal, return_log_prob=True,
    ).to(DEVICE)
    return actor, value_net(seed + 1)


def _loss_rollout(actor, seed=0):
    td = rollout(batch=(4, 30), seed=seed, with_values=False)
    with torch.no_grad():
        actor(td)
    return td


@pytest.mark.parametrize("loss_cls", [ClipPPOLoss, A2CLoss], ids=["ClipPPOLoss", "A2CLoss"])
@pytest.mark.parametrize("how", ["make_value_estimator", "patch"])
def test_losses_identical(loss_cls, how, backend):
    """ClipPPOLoss / A2CLoss give the same losses and gradients with our estimator as with TorchRL's."""
    results = {}
    for which in ("theirs", "ours"):
        actor, critic = _actor_critic()
        loss = loss_cls(actor, critic)
        if how == "make_value_estimator":
            if which == "ours":
                loss._value_estimator = rtt.GAE(gamma=0.99, lmbda=0.95, value_network=critic)
            else:
                loss.make_value_estimator(ValueEstimators.GAE, gamma=0.99, lmbda=0.95)
        else:
            if which == "ours":
                with rtt.torchrl_patched():
                    loss.make_value_estimator(ValueEstimators.GAE, gamma=0.99, lmbda=0.95)
                assert isinstance(loss.value_estimator, rtt.GAE)
            else:
                loss.make_value_estimator(ValueEstimators.GAE, gamma=0.99, lmbda=0.95)
                assert type(loss.value_estimator) is trl_value.GAE
        td = _loss_rollout(actor)
        out = loss(td)
        total = sum(v for k, v in out.items() if k.startswith("loss_"))
        total.backward()
        results[which] = ({k: v.detach() for k, v in out.items() if k.startswith("loss_")},
                          [p.grad.clone() for p in list(actor.parameters()) + list(critic.parameters())])
    for k in results["theirs"][0]:
        assert_close(k, results["ours"][0][k], results["theirs"][0][k])
    for i, (a, b) in enumerate(zip(results["ours"][1], results["theirs"][1])):
        assert_close(f"grad {i}", a, b)


@pytest.mark.parametrize("pattern", ["none", "random", "trunc_last"])
@pytest.mark.parametrize("thresholds", [(1.0, 1.0), (0.5, 2.0)], ids=["clip1", "clip0.5-2"])
def test_vtrace(pattern, thresholds, backend):
    """VTrace against TorchRL's, with a stale behaviour policy (perturbed log-probabilities)."""
    actor, critic = _actor_critic()
    td = rollout(batch=(3, 20), pattern=pattern, with_values=False)
    with torch.no_grad():
        actor(td)
    td["action_log_prob"] = td["action_log_prob"] + 0.3 * torch.randn_like(td["action_log_prob"])
    kw = dict(gamma=0.97, actor_network=actor, value_network=critic, rho_thresh=thresholds[0],
              c_thresh=thresholds[1])
    ours, theirs = rtt.VTrace(**kw), trl_value.VTrace(**kw)
    compare(ours(td.clone()), theirs(td.clone()))


def test_vtrace_runs_ours(monkeypatch):
    actor, critic = _actor_critic()
    td = rollout(batch=(2, 6), with_values=False)
    with torch.no_grad():
        actor(td)
    monkeypatch.setenv("RL_TRITON_TORCHRL_BACKEND", "nonsense")
    with pytest.raises(ValueError, match="RL_TRITON_TORCHRL_BACKEND"):
        rtt.VTrace(gamma=0.9, actor_network=actor, value_network=critic)(td.clone())
    trl_value.VTrace(gamma=0.9, actor_network=actor, value_network=critic)(td.clone())


def test_vtrace_list_valued_sample_log_prob(backend):
    """A list of keys for ``sample_log_prob`` (TorchRL's set_keys accepts one, as composite action distributions
    need): read as TorchRL reads it, and the same result as TorchRL's class."""
    actor, critic = _actor_critic()
    td = rollout(batch=(3, 12), with_values=False)
    with torch.no_grad():
        actor(td)
    kw = dict(gamma=0.97, actor_network=actor, value_network=critic)
    ours, theirs = rtt.VTrace(**kw), trl_value.VTrace(**kw)
    for est in (ours, theirs):
        est.set_keys(sample_log_prob=["action_log_prob"])
    compare(ours(td.clone()), theirs(td.clone()))
    del td["action_log_prob"]
    with pytest.raises(rtt.estimators.MissingKeyError, match="'action_log_prob'"):
        ours(td.clone())


def test_td0_value_estimate_without_time_dim():
    """DQN and CQL call TD(0)'s value_estimate on entries without a time dimension (batch size [] or [1]): TorchRL
    computes them elementwise, and so do we."""
    for batch in ([], [1], [5]):
        g = torch.Generator().manual_seed(len(batch))
        shape = (*batch, 1) if batch else ()
        td = TensorDict({"next": {"reward": torch.randn(shape, generator=g),
                                  "done": torch.rand(shape, generator=g) < 0.5,
                                  "terminated": torch.rand(shape, generator=g) < 0.5}}, batch_size=batch)
        next_value = torch.randn(shape, generator=g)
        ours, theirs = pair("TD0Estimator", value_network=None)
        mine = ours.value_estimate(td.clone(), next_value=next_value)
        expected = theirs.value_estimate(td.clone(), next_value=next_value)
        assert mine.shape == expected.shape and torch.equal(mine, expected), f"batch {batch}: {mine} != {expected}"


@pytest.mark.filterwarnings("ignore:To copy construct from a tensor")  # TorchRL's torch.tensor(gamma)
@pytest.mark.parametrize("name,kwargs,match", [
    ("GAE", {"gamma": 1.5, "lmbda": 0.9}, r"GAE: gamma must lie in \[0.0, 1.0\], got 1.5"),
    ("GAE", {"gamma": 0.9, "lmbda": -0.1}, r"GAE: lmbda must lie in \[0.0, 1.0\], got -0.1"),
    ("TDLambdaEstimator", {"gamma": 0.9, "lmbda": float("nan")}, "TDLambdaEstimator: lmbda must lie in"),
    ("TD0Estimator", {"gamma": torch.tensor(1.01)}, "TD0Estimator: gamma must lie in .* got a value of 1.0099"),
    ("TD1Estimator", {"gamma": -0.5}, "TD1Estimator: gamma must lie in"),
    ("MultiAgentGAE", {"gamma": 0.9, "lmbda": 2}, "MultiAgentGAE: lmbda must lie in"),
], ids=["GAE-gamma", "GAE-lmbda", "TDLambda-lmbda-nan", "TD0-gamma-tensor", "TD1-gamma", "MAGAE-lmbda"])
def test_constructor_checks_coefficients(name, kwargs, match):
    """A bad coefficient fails where it is given (TorchRL's constructors accept these and fail, or compute
    something, at the first call), with a message naming the class and the argument."""
    getattr(trl_value, name)(**kwargs, value_network=None)  # TorchRL's constructor accepts it
    with pytest.raises(rtt.InputError, match=match):
        getattr(rtt, name)(**kwargs, value_network=None)


def test_constructor_checks_vtrace_thresholds():
    actor, critic = _actor_critic()
    with pytest.raises(rtt.InputError, match=r"VTrace: rho_thresh must be finite and >= 0.0, got -1.0"):
        rtt.VTrace(gamma=0.9, actor_network=actor, value_network=critic, rho_thresh=-1.0)
    with pytest.raises(rtt.InputError, match="VTrace: c_thresh must be finite"):
        rtt.VTrace(gamma=0.9, actor_network=actor, value_network=critic, c_thresh=torch.tensor(float("inf")))
    # TorchRL's own refusal comes first, with its own error
    with pytest.raises(NotImplementedError):
        rtt.VTrace(gamma=torch.full((2,), 0.9), actor_network=actor, value_network=critic)


@pytest.mark.filterwarnings("ignore:To copy construct from a tensor")  # TorchRL's torch.tensor(gamma)
@pytest.mark.parametrize("gamma", [0.0, 1.0, torch.tensor(0.99), torch.tensor(0.5, dtype=torch.float64),
                                   torch.tensor([0.9])],
                         ids=["0", "1", "tensor", "tensor64", "1-element-tensor"])
def test_constructor_accepts_what_torchrl_computes(gamma):
    """Values in range, tensors included, build and give TorchRL's results."""
    ours, theirs = pair("GAE", gamma=gamma, lmbda=1.0, value_network=None)
    td = rollout()
    compare(ours(td.clone()), theirs(td.clone()))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_constructor_does_not_read_cuda_coefficients():
    """A CUDA coefficient is not read at construction (that would synchronise): out of range, it still builds."""
    rtt.GAE(gamma=torch.tensor(1.5, device="cuda"), lmbda=0.9, value_network=None)


@pytest.mark.parametrize("direct", [True, False], ids=["direct", "torchrl-forward"])
@pytest.mark.parametrize("name", list(CLASSES))
def test_errors_name_the_entry(name, direct):
    """An error of the functional names the tensordict entry that holds the bad tensor, of the same type."""
    est, _ = pair(name, value_network=None)
    est.direct_path = direct
    td = rollout()
    flag = "terminated" if name == "TD0Estimator" else "done"
    td["next", flag] = td["next", flag].long()
    with pytest.raises(TypeError, match=rf"^{name}: \('next', '{flag}'\): {flag} must be a bool tensor"):
        est(td)
    td = rollout()
    td["next", "reward"] = td["next", "reward"].double()
    with pytest.raises(TypeError, match=rf"^{name}: .*\('next', 'reward'\).*: .*dtype"):
        est(td)


def test_value_estimate_errors_name_the_entry():
    est, _ = pair("TD0Estimator", value_network=None)
    td = rollout()
    td["next", "terminated"] = td["next", "terminated"].long()
    with pytest.raises(TypeError, match=r"^TD0Estimator: \('next', 'terminated'\): terminated must be a bool"):
        est.value_estimate(td, next_value=td["next", "state_value"])


# -- the coupling to TorchRL fails loudly --------------------------------------------------------------------------

def _fake_methods():
    """Stand-ins for TorchRL methods that reach a functional in ways re-binding does not replace."""
    import torchrl.objectives.value.functional as trl_functional

    def local_import(self, td):
        from torchrl.objectives.value.functional import generalized_advantage_estimate

        return generalized_advantage_estimate

    def attribute(self, td):
        return trl_functional.generalized_advantage_estimate(0.9, 0.9, td, td, td, td)

    def nested(self, td):
        return [(lambda: trl_functional.vtrace_advantage_estimate)() for _ in td]

    def decorated_inner(self, td):
        from torchrl.objectives.value.functional import td0_return_estimate

        return td0_return_estimate

    @functools.wraps(decorated_inner)
    def decorated(self, td):
        return decorated_inner(self, td)

    def calls_nothing(self, td):
        return self._helper(td)

    return {"local-import": local_import, "attribute": attribute, "nested-lambda": nested, "decorated": decorated,
            "calls-nothing": calls_nothing}


@pytest.mark.parametrize("case", ["local-import", "attribute", "nested-lambda", "decorated", "calls-nothing"])
def test_check_rebound_fails_loudly(case):
    """A method that reaches a TorchRL functional by attribute or local import (also inside a nested function or
    through a decorator's closure), or that calls no functional at all, fails the import-time check, naming the
    method and the functional."""
    fn = _fake_methods()[case]
    expected = {"generalized_advantage_estimate"}
    match = "calls generalized_advantage_estimate" if case == "calls-nothing" else r"Fake\.forward .* reaches"
    with pytest.raises(rtt.estimators.TorchRLCouplingError, match=match) as info:
        rtt.estimators.check_rebound("Fake", {"forward": rtt.estimators._rebind(fn)}, expected)
    assert isinstance(info.value, ImportError)


def test_check_rebound_fails_on_a_global_left_to_torchrl():
    """A global look-up of a functional that is not among the replacements resolves to TorchRL's: an error."""
    import torchrl.objectives.value.functional as trl_functional

    namespace = {"__name__": "fake_torchrl_module", "td1_advantage_estimate": trl_functional.td1_advantage_estimate}
    exec("def forward(self, td):\n    return td1_advantage_estimate(0.9, td, td, td, td)\n", namespace)
    with pytest.raises(rtt.estimators.TorchRLCouplingError, match="looks td1_advantage_estimate up as a global"):
        rtt.estimators.check_rebound("Fake", {"forward": rtt.estimators._rebind(namespace["forward"])}, set())


def test_check_rebound_passes_for_our_classes():
    for name, expected in rtt.estimators.EXPECTED_FUNCTIONALS.items():
        cls = getattr(rtt, name)
        rtt.estimators.check_rebound(name, {"forward": cls._torchrl_forward,
                                            "value_estimate": cls._torchrl_value_estimate}, expected)
        with pytest.raises(rtt.estimators.TorchRLCouplingError):  # TorchRL's own methods resolve TorchRL's
            base = cls.__mro__[2]
            rtt.estimators.check_rebound(name, {"forward": base.forward, "value_estimate": base.value_estimate},
                                         expected)


def test_patch_refuses_a_missing_attribute(monkeypatch):
    """One missing place of the table: nothing is patched, and the error names the module and the attribute."""
    import torchrl.objectives.value.advantages as adv

    before = {name: getattr(adv, name) for name in dir(adv)}
    monkeypatch.setattr(rtt.patch, "PATCHES", [*rtt.patch.PATCHES,
                                               ("torchrl.objectives.value.advantages", "no_such_estimator", None)])
    with pytest.raises(rtt.estimators.TorchRLCouplingError,
                       match=r"torchrl.objectives.value.advantages has no attribute 'no_such_estimator'"):
        rtt.patch_torchrl()
    assert not rtt.patch.is_patched()
    assert {name: getattr(adv, name) for name in dir(adv)} == before
    assert all(v.cls.__module__.startswith("torchrl.") for v in _VALUE_ESTIMATOR_REGISTRY.values())


def test_dir_lists_the_public_names():
    names = dir(rtt)
    for name in rtt.__all__:
        assert name in names, name
    assert {"GAE", "VTrace", "patch_torchrl", "functional", "Retrace", "normalize_advantage"} <= set(names)


@pytest.mark.parametrize("name", list(CLASSES))
def test_integer_coefficients(name):
    """TorchRL accepts gamma=1 (an int, kept as an int64 buffer) and computes with it: so do we."""
    kw = {"gamma": 1, **({"lmbda": 1} if "lmbda" in CLASSES[name] else {})}
    ours, theirs = getattr(rtt, name)(**kw, value_network=None), getattr(trl_value, name)(**kw, value_network=None)
    assert ours.gamma.is_floating_point()
    td = rollout()
    compare(ours(td.clone()), theirs(td.clone()))
    with pytest.raises(rtt.InputError, match=f"{name}: gamma must lie in"):
        getattr(rtt, name)(**{**kw, "gamma": 2}, value_network=None)
