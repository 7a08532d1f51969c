"""Every row of the error table in docs/errors.md, raised as documented.

``CASES`` has one entry per row (the row's id): a call that must raise the row's exception with a message that
contains the row's message example (``…`` in the example stands for any text). The table and ``CASES`` must have the
same ids. Value checks run on CPU tensors (CUDA tensors are not value-checked: no device synchronisation); the
other rows run on the test device, on both paths.
"""
from __future__ import annotations

import os
import re
from pathlib import Path
from unittest import mock

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule

import rl_triton_torchrl as rtt
from _algos import TABLE, make_rollout
from _helpers import BACKENDS, DEVICE
from rl_triton_torchrl import functional as F
from rl_triton_torchrl import kernels as K

DOC = Path(__file__).resolve().parent.parent / "docs" / "errors.md"
SHAPE = (2, 5, 1)
# the Triton path on CPU tensors runs through the interpreter only (conftest sets it without a GPU)
CPU_BACKENDS = BACKENDS if os.environ.get("TRITON_INTERPRET") == "1" else ("torch",)


def _x(shape=SHAPE, dtype=torch.float32, device=DEVICE):
    return torch.linspace(-1.0, 1.0, torch.Size(shape).numel()).reshape(shape).to(dtype).to(device)


def _d(shape=SHAPE, device=DEVICE):
    return torch.zeros(shape, dtype=torch.bool, device=device)


def _gae(backend, **over):
    args = dict(reward=_x(), state_value=_x(), next_state_value=_x(), done=_d(), terminated=None, gamma=0.9,
                lmbda=0.9, backend=backend)
    args.update(over)
    return K.gae(args.pop("reward"), args.pop("state_value"), args.pop("next_state_value"), args.pop("done"),
                 args.pop("terminated"), **args)


def _vtrace(backend, **over):
    return K.vtrace(_x(), _x(), _x(), _x(), _x(), _d(), gamma=0.9, backend=backend, **over)


def _retrace(backend, device=DEVICE, **over):
    args = dict(ratio=_x(device=device).abs(), gamma=0.9, backend=backend) | over
    return K.retrace(_x(device=device), _x(device=device), _x(device=device), _d(device=device), **args)


def _discrete(backend, device=DEVICE, **over):
    """retrace_discrete on [2, 5, 3] per-action inputs (CPU for the value checks)."""
    pi = torch.full((2, 5, 3), 1 / 3, device=device)
    args = dict(pi=pi, action=torch.zeros(2, 5, dtype=torch.int64, device=device),
                q_values=_x((2, 5, 3), device=device), next_pi=pi, next_q_values=_x((2, 5, 3), device=device),
                reward=_x((2, 5), device=device), done=_d((2, 5), device=device),
                behavior_prob=torch.full((2, 5), 0.5, device=device), gamma=0.9, backend=backend) | over
    return K.retrace_discrete(args.pop("pi"), args.pop("action"), args.pop("q_values"), args.pop("next_pi"),
                              args.pop("next_q_values"), args.pop("reward"), args.pop("done"), **args)


def _rollout(drop=(), device=DEVICE):
    td = TensorDict({
        "state_value": _x(device=device), "action_log_prob": _x(device=device), "trace_input": _x(device=device),
        "next": {"state_value": _x(device=device), "reward": _x(device=device), "done": _d(device=device),
                 "terminated": _d(device=device)},
    }, batch_size=SHAPE[:2])
    for key in drop:
        del td[key]
    return td


def _patch_with_missing_attribute():
    saved = rtt.patch.PATCHES
    rtt.patch.PATCHES = [*saved, ("torchrl.objectives.value.advantages", "no_such_estimator", None)]
    try:
        rtt.patch_torchrl()
    finally:
        rtt.patch.PATCHES = saved
        assert not rtt.patch.is_patched()


def _retrace_module_rollout(action):
    td = _rollout()
    td.update({"action_value": _x((2, 5, 3)), "target_probs": torch.full((2, 5, 3), 1 / 3, device=DEVICE),
               "action": action, "next": {"action_value": _x((2, 5, 3)),
                                          "target_probs": torch.full((2, 5, 3), 1 / 3, device=DEVICE)}})
    return td


def _carried_state_mismatch(backend):
    traces = rtt.EligibilityTraces(gamma=0.9, lmbda=0.9, carry_state=True)
    traces(_rollout())
    traces(TensorDict({"trace_input": _x((3, 5, 1)), "next": {"done": _d((3, 5, 1))}}, batch_size=[3, 5]))


def _triton_without_interpreter(backend):
    os.environ["TRITON_INTERPRET"] = "0"  # restored by the test
    return _gae("triton", reward=_x(device="cpu"), state_value=_x(device="cpu"), next_state_value=_x(device="cpu"),
                done=_d(device="cpu"))


def _triton_missing(backend):
    """Where Triton is not installed (here or not): the environment variable asks for it."""
    from rl_triton_torchrl.kernels import _triton

    os.environ["RL_TRITON_TORCHRL_BACKEND"] = "triton"  # restored by the test
    error = _triton.TRITON_IMPORT_ERROR or "ModuleNotFoundError: No module named 'triton'"
    with mock.patch.object(_triton, "HAS_TRITON", False), mock.patch.object(_triton, "TRITON_IMPORT_ERROR", error):
        return _gae(backend)


def _backend_env(backend):
    os.environ["RL_TRITON_TORCHRL_BACKEND"] = "fast"  # restored by the test
    return _gae("auto")


# id -> (call(backend), the backends it runs on)
CASES = {
    # kernels: types, shapes, devices
    "not-a-tensor": (lambda b: _gae(b, reward=[0.0, 1.0]), BACKENDS),
    "missing-tensor": (lambda b: _gae(b, done=None), BACKENDS),
    "missing-values": (lambda b: K.td_lambda_return(_x(), None, _d(), gamma=0.9, lmbda=0.9, backend=b), BACKENDS),
    "not-dense": (lambda b: _gae(b, reward=_x().to_sparse()), BACKENDS),
    "float-dtype": (lambda b: _gae(b, reward=_x().long()), BACKENDS),
    "mixed-dtype": (lambda b: _gae(b, state_value=_x(dtype=torch.float64)), BACKENDS),
    "flag-dtype": (lambda b: _gae(b, done=_d().long()), BACKENDS),
    "shape-mismatch": (lambda b: _gae(b, state_value=_x((2, 6, 1))), BACKENDS),
    "device-mismatch": (lambda b: _gae(b, state_value=_x(device="meta")), BACKENDS),
    "zero-dim": (lambda b: _gae(b, reward=_x(()), state_value=_x(()), next_state_value=_x(()), done=_d(())), BACKENDS),
    "time-dim-type": (lambda b: _gae(b, time_dim=1.0), BACKENDS),
    "time-dim-range": (lambda b: _gae(b, time_dim=3), BACKENDS),
    "time-dim-2d": (lambda b: _gae(b, reward=_x((2, 5)), state_value=_x((2, 5)), next_state_value=_x((2, 5)),
                                   done=_d((2, 5))), BACKENDS),
    "state-shape": (lambda b: _gae(b, initial_state=_x((2, 5))), BACKENDS),
    "state-dtype": (lambda b: _gae(b, initial_state=_x((2, 1)).long()), BACKENDS),
    "state-device": (lambda b: _gae(b, initial_state=_x((2, 1), device="meta")), BACKENDS),
    "shifted-both": (lambda b: _gae(b, last_state_value=_x((2, 1))), BACKENDS),
    "shifted-missing": (lambda b: _gae(b, next_state_value=None), BACKENDS),
    "last-value-dtype": (lambda b: K.vtrace(_x(), _x(), _x(), None, _x(), _d(), gamma=0.9, backend=b,
                                            last_state_value=_x((2, 1), dtype=torch.float64)), BACKENDS),
    "shifted-mixed": (lambda b: _discrete(b, next_q_values=None, last_q_values=_x((2, 3))), BACKENDS),
    "td-flags": (lambda b: K.td_lambda_return(_x(), _x(), None, None, gamma=0.9, lmbda=0.9, backend=b), BACKENDS),
    "reset": (lambda b: K.episodic_prefix_sum(_x(), _d(), reset="end", backend=b), BACKENDS),
    # coefficients
    "coef-type": (lambda b: _gae(b, gamma="0.9"), BACKENDS),
    "coef-dtype": (lambda b: _gae(b, lmbda=torch.ones(SHAPE, dtype=torch.int64, device=DEVICE)), BACKENDS),
    "coef-shape": (lambda b: _gae(b, gamma=torch.full((3,), 0.9, device=DEVICE)), BACKENDS),
    "coef-device": (lambda b: _gae(b, gamma=torch.full(SHAPE, 0.9, device="meta")), BACKENDS),
    "coef-range": (lambda b: _gae(b, gamma=1.5), BACKENDS),
    "coef-range-tensor": (lambda b: _gae(b, reward=_x(device="cpu"), state_value=_x(device="cpu"),
                                         next_state_value=_x(device="cpu"), done=_d(device="cpu"),
                                         lmbda=torch.tensor([[[0.9]], [[float("nan")]]])), CPU_BACKENDS),
    "threshold-range": (lambda b: _vtrace(b, rho_thresh=-1.0), BACKENDS),
    # backend
    "backend-name": (lambda b: _gae("cuda"), BACKENDS),
    "backend-env": (_backend_env, ("auto",)),
    "triton-needs-cuda": (_triton_without_interpreter, ("triton",)),
    "triton-device": (lambda b: _gae("triton", reward=_x(device="meta"), state_value=_x(device="meta"),
                                     next_state_value=_x(device="meta"), done=_d(device="meta")), ("triton",)),
    "triton-missing": (_triton_missing, ("auto",)),
    # probabilities and actions (Retrace)
    "weights-exactly-one": (lambda b: _retrace(b, ratio=None), BACKENDS),
    "negative-probability": (lambda b: _discrete(b, "cpu", pi=torch.tensor([[-0.5, 1.0, 0.5]]).expand(2, 5, 3)),
                             CPU_BACKENDS),
    "zero-over-zero": (lambda b: _discrete(b, "cpu", pi=torch.tensor([0.0, 0.5, 0.5]).expand(2, 5, 3),
                                           behavior_prob=torch.zeros(2, 5)), CPU_BACKENDS),
    "action-dtype": (lambda b: _discrete(b, action=torch.zeros(2, 5, dtype=torch.int32, device=DEVICE)), BACKENDS),
    "action-shape": (lambda b: _discrete(b, action=torch.zeros(2, 4, dtype=torch.int64, device=DEVICE)), BACKENDS),
    "action-range": (lambda b: _discrete(b, "cpu", action=torch.tensor([[0, 1, 2, 3, -1]] * 2)), CPU_BACKENDS),
    "action-device": (lambda b: _discrete(b, action=torch.zeros(2, 5, dtype=torch.int64, device="meta")), BACKENDS),
    "no-actions": (lambda b: _discrete(b, pi=_x((2, 5, 0)), q_values=_x((2, 5, 0)), next_pi=_x((2, 5, 0)),
                                       next_q_values=_x((2, 5, 0))), BACKENDS),
    "action-time-dim": (lambda b: _discrete(b, time_dim=-1), BACKENDS),
    # TorchRL-compatible functionals
    "td0-terminated": (lambda b: F.td0_return_estimate(0.9, _x(), _x(), backend=b), BACKENDS),
    "reward2go-shape": (lambda b: F.reward2go(_x(), _d((2, 4, 1)), 0.9, backend=b), BACKENDS),
    # TorchRL estimator classes
    "estimator-missing-key": (lambda b: rtt.GAE(gamma=0.9, lmbda=0.9, value_network=None)(
        _rollout(drop=[("next", "reward")])), ("auto",)),
    "estimator-missing-value": (lambda b: rtt.TD0Estimator(gamma=0.9, value_network=None)(
        _rollout(drop=[("next", "state_value")])), ("auto",)),
    "constructor-coef-range": (lambda b: rtt.GAE(gamma=1.5, lmbda=0.9, value_network=None), ("auto",)),
    "estimator-entry": (lambda b: rtt.GAE(gamma=0.9, lmbda=0.9, value_network=None)(
        _rollout().set(("next", "done"), _d().long())), ("auto",)),
    "patch-missing-attribute": (lambda b: _patch_with_missing_attribute(), ("auto",)),
    # TensorDict modules
    "module-missing-key": (lambda b: rtt.EligibilityTraces(gamma=0.9, lmbda=0.9)(_rollout(drop=["trace_input"])),
                           ("auto",)),
    "module-missing-form": (lambda b: rtt.Retrace(gamma=0.9)(_rollout()), ("auto",)),
    "module-unknown-key": (lambda b: rtt.Retrace(gamma=0.9).set_keys(value="v"), ("auto",)),
    "module-key-type": (lambda b: rtt.Retrace(gamma=0.9).set_keys(reward=1), ("auto",)),
    "module-time-dim-type": (lambda b: rtt.EligibilityTraces(gamma=0.9, lmbda=0.9, time_dim=1.0), ("auto",)),
    "module-time-dim-range": (lambda b: rtt.EligibilityTraces(gamma=0.9, lmbda=0.9, time_dim=2)(_rollout()),
                              ("auto",)),
    "module-no-time-dim": (lambda b: rtt.EpisodicPrefixSum()(TensorDict(
        {"next": {"reward": _x(()), "done": _d(())}}, batch_size=[])), ("auto",)),
    "module-entry-shape": (lambda b: rtt.EligibilityTraces(gamma=0.9, lmbda=0.9)(
        _rollout().set(("next", "done"), _d((2, 5, 3)))), ("auto",)),
    "module-carried-state": (_carried_state_mismatch, ("auto",)),
    "module-one-hot": (lambda b: rtt.Retrace(gamma=0.9)(  # a value check: CPU tensors only
        _retrace_module_rollout(torch.ones(2, 5, 3, device=DEVICE)).to("cpu")), ("auto",)),
    "module-action-dtype": (lambda b: rtt.Retrace(gamma=0.9)(_retrace_module_rollout(_x((2, 5)))), ("auto",)),
    "module-prefix-keys": (lambda b: rtt.EpisodicPrefixSum(in_keys=["a", "b"], out_keys=["c"]), ("auto",)),
}


def _doc_rows() -> dict:
    """id -> (exception name, message example) from the error table of docs/errors.md."""
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("| `") else []
        if len(cells) == 5:
            rows[cells[0].strip("`")] = (cells[3].strip("`").split("`")[0], cells[4].strip("`").replace("\\|", "|"))
    return rows


DOC_ROWS = _doc_rows()
PARAMS = [pytest.param(case, backend, id=f"{case}-{backend}") for case, (_, backends) in CASES.items()
          for backend in backends]


def test_table_and_cases_agree():
    assert sorted(DOC_ROWS) == sorted(CASES), (f"only in docs/errors.md: {sorted(set(DOC_ROWS) - set(CASES))}; "
                                               f"only in CASES: {sorted(set(CASES) - set(DOC_ROWS))}")


@pytest.mark.parametrize("case,backend", PARAMS)
def test_error_row(case, backend, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", ""))  # restored after the test
    monkeypatch.setenv("RL_TRITON_TORCHRL_BACKEND", os.environ.get("RL_TRITON_TORCHRL_BACKEND", ""))
    exc_name, example = DOC_ROWS[case]
    call, _ = CASES[case]
    with pytest.raises(Exception) as info:
        call(backend)
    assert type(info.value).__name__ == exc_name, f"{case}: raised {type(info.value).__name__}: {info.value}"
    message = str(info.value)
    pattern = ".*".join(re.escape(piece) for piece in example.split("…"))
    assert re.search(pattern, message, re.S), f"{case}: the message\n  {message}\ndoes not match\n  {example}"


def test_errors_are_the_documented_bases():
    """InputError is a ValueError and a RuntimeError (TorchRL raises RuntimeError); MissingKeyError a KeyError and a
    ValueError (TorchRL raises ValueError for a missing value entry)."""
    assert issubclass(K.InputError, ValueError) and issubclass(K.InputError, RuntimeError)
    assert issubclass(rtt.estimators.MissingKeyError, KeyError)
    assert issubclass(rtt.estimators.MissingKeyError, ValueError)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("algo", list(TABLE))
@pytest.mark.triton
def test_checks_do_not_synchronise_cuda(algo):
    """The checks of a CUDA call read no values (no device synchronisation), coefficient tensors included."""
    call, _, coefs = TABLE[algo]
    x = make_rollout((4, 33, 2), seed=1)
    if "gamma" in coefs:
        coefs = coefs | {"gamma": torch.full(x["reward"].shape, coefs["gamma"], device="cuda")}
    call(x, backend="triton", **coefs)  # compile first: compiling may synchronise
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        call(x, backend="triton", **coefs)
    finally:
        torch.cuda.set_sync_debug_mode(0)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", BACKENDS)
def test_unchecked_actions_on_cuda(backend):
    """Out-of-range action indices in CUDA tensors are not checked (that would synchronise): the steps that hold
    one read NaN for the taken action's Q and probability, so their advantages are NaN and so are the targets of
    the earlier steps of their episode (which read that Q and trace); no crash (a CUDA gather would assert), no
    silent number. A step's own target Q_ret never reads its own action's Q."""
    done = _d((2, 5), device="cuda")
    done[:, 2] = True  # steps 0-2 are one episode, 3-4 the next
    q_ret, adv = _discrete(backend, "cuda", action=torch.tensor([[0, 1, 2, 3, -1]] * 2, device="cuda"), done=done)
    torch.cuda.synchronize()
    assert adv[:, 3:].isnan().all() and q_ret[:, 3].isnan().all()
    assert q_ret[:, 4].isfinite().all()  # r_4 + gamma E_pi Q(s'_4): nothing of the invalid action
    assert q_ret[:, :3].isfinite().all() and adv[:, :3].isfinite().all()


def _estimator(name):
    kw = {"gamma": 0.9, "value_network": None}
    if name in ("GAE", "MultiAgentGAE", "TDLambdaEstimator"):
        kw["lmbda"] = 0.9
    if name == "VTrace":  # never called: the keys are checked first
        kw["actor_network"] = TensorDictModule(torch.nn.Identity(), in_keys=["obs"], out_keys=["loc"])
    return getattr(rtt, name)(**kw)


ESTIMATORS = ["GAE", "MultiAgentGAE", "TD0Estimator", "TD1Estimator", "TDLambdaEstimator", "VTrace"]
# entries each estimator needs (groups: one entry of a group suffices)
NEEDED = {
    name: [[("next", "reward")], ["state_value"], [("next", "state_value")]]
    + ([[("next", "terminated"), ("next", "done")]] if name == "TD0Estimator" else [[("next", "done")]])
    + ([["action_log_prob"]] if name == "VTrace" else [])
    for name in ESTIMATORS
}


@pytest.mark.parametrize("name,group", [(n, g) for n in ESTIMATORS for g in NEEDED[n]],
                         ids=[f"{n}-{'|'.join(map(str, g))}" for n in ESTIMATORS for g in NEEDED[n]])
def test_estimator_names_every_missing_key(name, group):
    """estimator-missing-key and estimator-missing-value, for every estimator class and every entry it needs."""
    with pytest.raises(rtt.estimators.MissingKeyError) as info:
        _estimator(name)(_rollout(drop=group))
    message = str(info.value)
    assert message.startswith(f"{name}: the tensordict has no ") and all(repr(k) in message for k in group), message
