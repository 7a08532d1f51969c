"""The estimator classes' direct path (values precomputed) against TorchRL's re-bound forward and TorchRL's class.

``GAE``, ``MultiAgentGAE``, ``TDLambdaEstimator``, ``TD1Estimator`` and ``TD0Estimator`` skip TorchRL's forward
machinery when the rollout carries its values (``estimators._OurMath._direct_entries`` says when). The direct path
calls the same functional with the same arguments, so its outputs must equal the re-bound forward's bit for bit
(``direct_path = False`` forces that one), and TorchRL's class to its tolerance. Also pinned: which path runs when,
the tensordict left behind (the outputs, nothing else: no completed flag), errors, grad modes, key caching and the
TorchRL versions the direct path is enabled for.
"""
from __future__ import annotations

import os

import pytest
import torch
import torchrl.objectives.value as trl_value
from tensordict import LazyStackedTensorDict, TensorDict
from tensordict.nn import TensorDictModule
from torch import nn

import rl_triton_torchrl as rtt
from _helpers import DEVICE, assert_close, flags

OBS = 3
CLASSES = {
    "GAE": {"gamma": 0.98, "lmbda": 0.93},
    "MultiAgentGAE": {"gamma": 0.98, "lmbda": 0.93},
    "TDLambdaEstimator": {"gamma": 0.98, "lmbda": 0.93},
    "TD1Estimator": {"gamma": 0.98},
    "TD0Estimator": {"gamma": 0.98},
}
# (batch size, time_dim of the rollout or None for TorchRL's default, the last one)
LAYOUTS = {"B4-T25": ((4, 25), None), "B2x3-T17": ((2, 3, 17), None), "T25-B4-tdim0": ((25, 4), 0),
           "B3-T1": ((3, 1), None)}


@pytest.fixture(params=["torch", "triton"])
def backend(request, monkeypatch):
    monkeypatch.setenv("RL_TRITON_TORCHRL_BACKEND", request.param)
    return request.param


def rollout(batch=(4, 25), time_dim=None, pattern="random", seed=0, agents=None, keys=None, steps=False,
            dtype=torch.float32):
    """A rollout TensorDict of batch size ``batch`` with values precomputed (TorchRL's layout)."""
    g = torch.Generator().manual_seed(seed)
    keys = {"reward": "reward", "done": "done", "terminated": "terminated", "truncated": "truncated",
            "value": "state_value", **(keys or {})}
    shape = (*batch, 1)
    done, term = flags(shape, pattern, g, time_dim=(time_dim if time_dim is not None else len(batch) - 1))
    vshape = (*batch, agents, 1) if agents else shape
    td = TensorDict({"observation": torch.randn(*batch, OBS, generator=g),
                     "next": {"observation": torch.randn(*batch, OBS, generator=g)}}, batch_size=batch)
    entries = {("next", keys["reward"]): torch.randn(shape, generator=g, dtype=dtype),
               ("next", keys["done"]): done.cpu(), ("next", keys["terminated"]): term.cpu(),
               ("next", keys["truncated"]): (done & ~term).cpu(),
               keys["value"]: torch.randn(vshape, generator=g, dtype=dtype),
               ("next", keys["value"]): torch.randn(vshape, generator=g, dtype=dtype)}
    for key, value in entries.items():
        td.set(key, value)
    if steps:
        td["steps_to_next_obs"] = torch.randint(1, 4, shape, generator=g)
    return td.to(DEVICE)


def build(name, module=rtt, **kwargs):
    return getattr(module, name)(**{**CLASSES[name], "value_network": None, **kwargs})


def assert_identical(actual: TensorDict, expected: TensorDict):
    """The same entries, dtypes, shapes and values bit for bit (NaN where NaN); names the first mismatch."""
    a_keys = set(actual.keys(include_nested=True, leaves_only=True))
    e_keys = set(expected.keys(include_nested=True, leaves_only=True))
    assert a_keys == e_keys, f"entries differ: {a_keys ^ e_keys}"
    for key in sorted(e_keys, key=str):
        a, e = actual.get(key), expected.get(key)
        assert a.dtype == e.dtype and a.shape == e.shape, f"{key}: {a.dtype} {tuple(a.shape)} != {e.dtype} " \
                                                          f"{tuple(e.shape)}"
        assert a.requires_grad == e.requires_grad, f"{key}: requires_grad {a.requires_grad} != {e.requires_grad}"
        same = (a == e) | (a.isnan() & e.isnan()) if a.is_floating_point() else a == e
        if not same.all():
            idx = tuple(int(i) for i in (~same).nonzero()[0])
            raise AssertionError(f"{key}: first difference at {idx}: {a[idx].item()!r} != {e[idx].item()!r}")


class Spy:
    """Counts the calls of a class's re-bound TorchRL forward (the inherited path)."""

    def __init__(self, monkeypatch, cls):
        self.calls = 0
        inner = cls._torchrl_forward

        def forward(*args, **kwargs):
            self.calls += 1
            return inner(*args, **kwargs)

        monkeypatch.setattr(cls, "_torchrl_forward", forward)


def run_both(est, td):
    """(direct path, inherited path) outputs of ``est`` on copies of ``td``."""
    direct = est(td.clone())
    est.direct_path = False
    try:
        inherited = est(td.clone())
    finally:
        est.direct_path = True
    return direct, inherited


def run_checked(monkeypatch, est, td):
    """Both paths of ``est`` on copies of ``td``; the direct one must not have touched TorchRL's forward."""
    spy = Spy(monkeypatch, type(est))
    direct, inherited = run_both(est, td)
    assert spy.calls == 1, "the direct path did not run (or the forced inherited path did not)"
    return direct, inherited


def compare_torchrl(name, out, td, **kwargs):
    theirs = build(name, trl_value, **kwargs)
    expected = theirs(td.clone())
    for key in (theirs.tensor_keys.advantage, theirs.tensor_keys.value_target):
        # float32 tolerance for float64 rollouts too: the gamma/lmbda buffers are float32 and TorchRL's vectorised
        # functionals and ours round their products differently
        dtype = torch.bfloat16 if out.get(key).dtype == torch.bfloat16 else torch.float32
        assert_close(str(key), out.get(key), expected.get(key), dtype=dtype)


@pytest.mark.parametrize("name", list(CLASSES))
@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("pattern", ["none", "all", "random", "trunc_last"])
def test_direct_equals_inherited(name, layout, pattern, backend, monkeypatch):
    batch, time_dim = LAYOUTS[layout]
    # (TD(0) has no recursion along time and takes no time_dim)
    kw = {} if time_dim is None or name == "TD0Estimator" else {"time_dim": time_dim}
    agents = 3 if name == "MultiAgentGAE" else None
    est = build(name, **kw)
    td = rollout(batch, time_dim, pattern, agents=agents)
    direct, inherited = run_checked(monkeypatch, est, td)
    assert_identical(direct, inherited)
    compare_torchrl(name, direct, td, **kw)


@pytest.mark.filterwarnings("ignore:To copy construct from a tensor")  # TorchRL's torch.tensor(gamma)
@pytest.mark.parametrize("name", list(CLASSES))
@pytest.mark.parametrize("option", ["vectorized-off", "steps_to_next_obs", "float64", "bfloat16", "differentiable",
                                    "average_gae",
                                    "average_gae-groups", "renamed-keys", "nested-keys", "named-time-dim",
                                    "tensor-gamma"])
def test_direct_options(name, option, backend, monkeypatch):
    """Options the direct path takes on itself: equal to the inherited path bit for bit, and to TorchRL."""
    kw, rollout_kw, agents = {}, {}, 3 if name == "MultiAgentGAE" else None
    if option == "vectorized-off":
        if name not in ("GAE", "MultiAgentGAE", "TDLambdaEstimator"):
            pytest.skip("no vectorized flag")
        kw["vectorized"] = False
    elif option == "steps_to_next_obs":
        rollout_kw["steps"] = True
    elif option == "float64":
        rollout_kw["dtype"] = torch.float64
    elif option == "bfloat16":
        if backend == "triton" and name in ("TDLambdaEstimator", "TD1Estimator") and (
                os.environ.get("TRITON_INTERPRET") == "1"):
            # their kernel writes value_target - value too, rounded to bfloat16 as torch rounds the subtraction
            pytest.skip("Triton's interpreter casts float32 to 16 bits by truncation, where a GPU and torch round "
                        "to nearest even: bit for bit only compiled")
        rollout_kw["dtype"] = torch.bfloat16
    elif option == "differentiable":
        kw["differentiable"] = True
    elif option in ("average_gae", "average_gae-groups"):
        if "GAE" not in name:
            pytest.skip("GAE only")
        kw["average_gae"] = True
        if option == "average_gae-groups":
            kw["group_key"] = "group"
    elif option == "tensor-gamma":
        kw["gamma"] = torch.tensor(0.9, dtype=torch.float64)
    est = build(name, **kw)
    keys = None
    if option in ("renamed-keys", "nested-keys"):
        keys = {"reward": "rew", "done": "d", "terminated": "term", "truncated": "trunc", "value": "v"}
        if option == "nested-keys":
            keys = {k: ("agents", v) for k, v in keys.items()}
        est.set_keys(**keys, advantage=("out", "adv") if option == "nested-keys" else "adv", value_target="vt")
    td = rollout(agents=agents, keys=keys, **rollout_kw)
    if option == "named-time-dim":
        td = rollout(batch=(25, 4), agents=agents).refine_names("time", None)
    if option == "average_gae-groups":
        td["group"] = torch.arange(4, device=DEVICE).remainder(2).unsqueeze(-1).expand(4, 25)
    if name == "MultiAgentGAE" and option == "steps_to_next_obs":
        # a per-step gamma shaped like the team reward does not broadcast to the agents' values, in TorchRL too
        errors = []
        for direct in (True, False):
            est.direct_path = direct
            with pytest.raises(Exception) as info:
                est(td.clone())
            errors.append((type(info.value), str(info.value)))
        assert errors[0] == errors[1]
        with pytest.raises(Exception):
            build(name, trl_value, **kw)(td.clone())
        return
    # TorchRL's per-group standardisation sums with index_add_, whose CUDA atomics add in any order: repeated calls
    # are bit-equal (TorchRL's own class to itself included) only in PyTorch's deterministic mode
    deterministic = option == "average_gae-groups" and td.device.type == "cuda"
    was = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(deterministic or was)
    try:
        direct, inherited = run_checked(monkeypatch, est, td)
    finally:
        torch.use_deterministic_algorithms(was)
    assert_identical(direct, inherited)
    if keys is None:
        compare_torchrl(name, direct, td, **kw)
    else:
        theirs = build(name, trl_value, **kw)
        theirs.set_keys(**{k: v for k, v in keys.items() if k != "truncated"},
                        advantage=est.tensor_keys.advantage, value_target="vt")
        expected = theirs(td.clone())
        for key in (est.tensor_keys.advantage, "vt"):
            assert_close(str(key), direct.get(key), expected.get(key))


@pytest.mark.parametrize("name", ["GAE", "TD0Estimator", "TDLambdaEstimator"])
@pytest.mark.parametrize("missing", ["done", "terminated"])
def test_flags_completed_like_inherited(name, missing, monkeypatch):
    """A rollout without done (or terminated) but with truncated: both paths complete it the same way, without
    writing the completed flag into the input, and give TorchRL's result on the full rollout."""
    full = rollout(pattern="trunc_last")
    td = full.clone()
    del td["next", missing]
    est = build(name)
    direct_td, inherited_td = td.clone(), td.clone()
    spy = Spy(monkeypatch, type(est))
    est(direct_td)
    est.direct_path = False
    est(inherited_td)
    assert spy.calls == 1
    assert_identical(direct_td, inherited_td)
    assert ("next", missing) not in direct_td.keys(include_nested=True), "the completed flag was written"
    written = {est.tensor_keys.advantage, est.tensor_keys.value_target}
    assert set(direct_td.keys(True, True)) == set(td.keys(True, True)) | written
    compare_torchrl(name, direct_td, full)


def test_returns_the_input_tensordict():
    td = rollout()
    assert rtt.GAE(gamma=0.9, lmbda=0.9, value_network=None)(td) is td


@pytest.mark.parametrize("name", ["GAE", "TDLambdaEstimator"])
@pytest.mark.parametrize("differentiable", [False, True])
@pytest.mark.parametrize("grad_mode", ["enabled", "no_grad"])
def test_grad_modes(name, differentiable, grad_mode, monkeypatch):
    """TorchRL runs its forward under ``set_grad_enabled(differentiable)``: the direct path too (outputs that need
    grad exactly when TorchRL's do, and the same gradients)."""
    est = build(name, differentiable=differentiable)
    td = rollout()
    results = []
    for direct in (True, False):
        est.direct_path = direct
        data = td.clone()
        v = data["state_value"].clone().requires_grad_()
        nv = data["next", "state_value"].clone().requires_grad_()
        data["state_value"], data["next", "state_value"] = v, nv
        with torch.set_grad_enabled(grad_mode == "enabled"):
            out = est(data)
        adv = out["advantage"]
        grads = None
        if adv.requires_grad:
            grads = torch.autograd.grad((adv ** 2).sum() + out["value_target"].sum(), (v, nv), allow_unused=True)
        results.append((adv.requires_grad, adv.detach(), grads))
    assert results[0][0] == results[1][0] == differentiable
    assert torch.equal(results[0][1], results[1][1])
    for a, b in zip(results[0][2] or (), results[1][2] or ()):
        assert (a is None and b is None) or torch.equal(a, b)


def _value_net():
    torch.manual_seed(0)
    return TensorDictModule(nn.Linear(OBS, 1), in_keys=["observation"], out_keys=["state_value"]).to(DEVICE)


class _Sub(rtt.GAE):
    """A subclass of ours may override any method TorchRL's forward calls: it takes TorchRL's forward."""


def _shifted_valid(td):
    td["shifted_valid"] = torch.ones(td.shape, dtype=torch.bool, device=td.device)
    return td


# case -> (class, constructor kwargs, rollout transform, call kwargs): TorchRL's re-bound forward must run
INHERITED = {
    "value-network": ("GAE", {"value_network": "net"}, None, {}),
    "params-keyword": ("GAE", {}, None, {"params": None}),
    "time_dim-keyword": ("GAE", {}, None, {"time_dim": 1}),
    "shifted_valid-entry": ("GAE", {}, _shifted_valid, {}),
    "auto_reset_env": ("GAE", {"auto_reset_env": True}, None, {}),
    "average_rewards": ("TDLambdaEstimator", {"average_rewards": True}, None, {}),
    "lazy-stacked": ("GAE", {}, lambda td: LazyStackedTensorDict.lazy_stack(list(td.unbind(0)), 0), {}),
    "subclass": ("GAE", {}, None, {}),
    "direct_path-off": ("GAE", {}, None, {}),
}


@pytest.mark.parametrize("case", list(INHERITED))
def test_inherited_path_when_needed(case, monkeypatch):
    name, kw, transform, call_kw = INHERITED[case]
    if kw.get("value_network") == "net":
        kw = {**kw, "value_network": _value_net()}
    td = rollout()
    if transform is not None:
        td = transform(td)
    if case == "subclass":
        ours = _Sub(**CLASSES[name], value_network=None)
    else:
        ours = build(name, **kw)
    ours.direct_path = case != "direct_path-off"
    spy = Spy(monkeypatch, getattr(rtt, name))
    out = ours(td.clone(), **call_kw)
    assert spy.calls == 1
    expected = build(name, trl_value, **kw)(td.clone(), **call_kw)  # TorchRL's class, the same arguments
    for key in ("advantage", "value_target"):
        assert_close(key, out[key], expected[key])


def test_compiling_takes_the_inherited_path(monkeypatch):
    """While torch.compile traces, TorchRL's forward runs (what tests/test_compile.py compiles)."""
    spy = Spy(monkeypatch, rtt.GAE)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    build("GAE")(rollout())
    assert spy.calls == 1


def test_vtrace_always_inherited(monkeypatch):
    from torchrl.modules import OneHotCategorical, ProbabilisticActor

    torch.manual_seed(0)
    actor = ProbabilisticActor(TensorDictModule(nn.Linear(OBS, 4), ["observation"], ["logits"]), in_keys=["logits"],
                               distribution_class=OneHotCategorical, return_log_prob=True).to(DEVICE)
    td = rollout()
    with torch.no_grad():
        actor(td)
    spy = Spy(monkeypatch, rtt.VTrace)
    rtt.VTrace(gamma=0.9, actor_network=actor, value_network=None)(td)
    assert spy.calls == 1


@pytest.mark.parametrize("name", list(CLASSES))
@pytest.mark.parametrize("case", ["no-value", "no-next-value", "no-reward", "no-done", "no-batch-dims"])
def test_errors_as_inherited(name, case):
    """A rollout the estimate cannot run on raises the same error, message included, on both paths."""
    agents = 3 if name == "MultiAgentGAE" else None
    td = rollout(agents=agents)
    if case == "no-batch-dims":
        td = TensorDict({k: v for k, v in td.items()}, batch_size=[])
    else:
        del td[{"no-value": "state_value", "no-next-value": ("next", "state_value"), "no-reward": ("next", "reward"),
                "no-done": ("next", "done")}[case]]
        if case == "no-done":
            del td["next", "truncated"]
    errors = []
    for direct in (True, False):
        est = build(name)
        est.direct_path = direct
        data = td.clone()
        if name == "TD0Estimator" and case == "no-done":  # TD(0) reads terminated in done's place
            est(data)
            errors.append(None)
            continue
        with pytest.raises(Exception) as info:
            est(data)
        errors.append((type(info.value), str(info.value)))
    assert errors[0] == errors[1]


@pytest.mark.parametrize("name", ["GAE", "TDLambdaEstimator", "TD0Estimator"])
@pytest.mark.parametrize("case", ["int-reward", "bad-steps-shape", "value-shape", "bad-backend"])
def test_functional_errors_as_inherited(name, case, monkeypatch):
    """Errors raised by the functional (or by TorchRL's steps_to_next_obs handling) are the same on both paths."""
    td = rollout(steps=case == "bad-steps-shape")
    if case == "int-reward":
        td["next", "reward"] = td["next", "reward"].long()
    elif case == "bad-steps-shape":
        td["steps_to_next_obs"] = torch.ones(4, 25, 2, dtype=torch.long, device=DEVICE)  # no view_as(reward)
    elif case == "value-shape":
        td["state_value"] = torch.randn(4, 25, 2, 2, device=DEVICE)  # fits no functional, no subtraction
    else:
        monkeypatch.setenv("RL_TRITON_TORCHRL_BACKEND", "nonsense")
    errors = []
    for direct in (True, False):
        est = build(name)
        est.direct_path = direct
        try:
            est(td.clone())
            errors.append(None)
        except Exception as e:  # noqa: BLE001 - compared below
            errors.append((type(e), str(e)))
    assert errors[0] is not None, "no error raised: the case tests nothing"
    assert errors[0] == errors[1]


def test_key_changes_after_a_call(monkeypatch):
    """The direct path's key cache follows set_keys and in-place edits of tensor_keys: the outputs are TorchRL's
    class's with the same keys, under the new names only."""
    est, theirs = build("GAE"), build("GAE", trl_value)
    td = rollout()
    est(td.clone())
    est.set_keys(advantage="adv2")
    theirs.set_keys(advantage="adv2")
    out, expected = est(td.clone()), theirs(td.clone())
    assert "advantage" not in out.keys()
    assert_close("adv2", out["adv2"], expected["adv2"])
    est.tensor_keys.value_target = theirs.tensor_keys.value_target = "vt2"
    out, expected = est(td.clone()), theirs(td.clone())
    assert set(out.keys()) == set(expected.keys()) and "value_target" not in out.keys()
    for key in ("adv2", "vt2"):
        assert_close(key, out[key], expected[key])


def test_buffers_read_on_every_call():
    """gamma/lmbda edited in place or loaded between calls are read on the next call (no cached numbers)."""
    est = build("GAE")
    td = rollout()
    assert_close("advantage", est(td.clone())["advantage"], build("GAE", trl_value)(td.clone())["advantage"])
    est.gamma.fill_(0.5)
    second = est(td.clone())["advantage"]
    assert_close("advantage gamma=0.5", second, build("GAE", trl_value, gamma=0.5)(td.clone())["advantage"])
    est.load_state_dict(build("GAE", lmbda=0.5).state_dict())
    third = est(td.clone())["advantage"]
    est.direct_path = False
    assert torch.equal(est(td.clone())["advantage"], third)
    assert_close("advantage lmbda=0.5", third, build("GAE", trl_value, lmbda=0.5)(td.clone())["advantage"])


@pytest.mark.parametrize("version", ["0.14.1", "0.14.1+cu126", "0.14.2", "0.15.0"])
def test_direct_path_only_on_verified_versions(version, monkeypatch):
    """The direct path re-implements TorchRL 0.14.1's forward: on any other version every call runs TorchRL's
    re-bound forward (same results)."""
    import torchrl

    monkeypatch.setattr(torchrl, "__version__", version)
    verified = version.split("+")[0] in rtt.estimators.DIRECT_PATH_VERSIONS
    assert rtt.estimators.direct_path_verified() == verified
    spy = Spy(monkeypatch, rtt.GAE)
    td = rollout()
    out = build("GAE")(td.clone())
    assert spy.calls == (0 if verified else 1)
    compare_torchrl("GAE", out, td)


@pytest.mark.parametrize("case", ["locked", "outputs-present", "no-device", "output-over-a-tensordict"])
def test_outputs_written_as_set_writes(case, monkeypatch):
    """The direct path writes its two outputs as ``TensorDict.set`` does (it skips ``set``'s checks only where they
    cannot fail): a locked tensordict refuses them with ``set``'s error, present entries are replaced (not written
    in place), a tensordict without a device takes them, an entry holding a tensordict is replaced by the tensor."""
    td = rollout()
    if case == "locked":
        td.lock_()
    elif case == "outputs-present":
        td["advantage"], td["value_target"] = torch.zeros(4, 25, 1), torch.zeros(4, 25, 1)
        td = td.to(DEVICE)
    elif case == "no-device":
        td = td.clear_device_()
    elif case == "output-over-a-tensordict":
        td["advantage"] = TensorDict({"x": torch.zeros(4, 25)}, batch_size=[4, 25], device=DEVICE)
    est = build("GAE")
    results = []
    for direct in (True, False):
        est.direct_path = direct
        data = td.clone() if case != "locked" else td
        before = {k: data.get(k) for k in ("advantage", "value_target") if k in data.keys()}
        if case == "locked":
            with pytest.raises(RuntimeError) as info:
                est(data)
            results.append(str(info.value))
            continue
        out = est(data)
        for key, old in before.items():
            assert out.get(key) is not old
            if isinstance(old, torch.Tensor):
                assert not old.any(), f"{key!r} was written in place"
        results.append(out)
    if case == "locked":
        assert results[0] == results[1]
        assert "advantage" not in td.keys()
    else:
        assert_identical(*results)
