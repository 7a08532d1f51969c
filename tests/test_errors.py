"""Bad input gets a clear error naming the argument: never a Triton compile error or a silently wrong answer."""
from __future__ import annotations

import pytest
import torch

from _algos import DISCRETE, TABLE, as_tuple, make_rollout
from _helpers import BACKENDS, DEVICE, assert_close
from rl_triton_torchrl import functional as F
from rl_triton_torchrl import kernels as K
from rl_triton_torchrl.kernels import InputError
from rl_triton_torchrl.kernels.reference import gae_ref, linear_scan_ref


def _x(shape=(2, 5, 1), dtype=torch.float32):
    return torch.randn(shape, dtype=dtype, device=DEVICE)


def _d(shape=(2, 5, 1)):
    return torch.zeros(shape, dtype=torch.bool, device=DEVICE)


def _gae(**over):
    args = dict(reward=_x(), state_value=_x(), next_state_value=_x(), done=_d(), terminated=None, gamma=0.9,
                lmbda=0.9)
    args.update(over)
    return K.gae(args.pop("reward"), args.pop("state_value"), args.pop("next_state_value"), args.pop("done"),
                 args.pop("terminated"), **args)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "over,exc,match",
    [
        (dict(state_value=_x((2, 6, 1))), ValueError, r"state_value has shape \(2, 6, 1\) but reward has \(2, 5, 1\)"),
        (dict(done=_d((2, 5))), ValueError, r"done has shape \(2, 5\)"),
        (dict(done=torch.zeros(2, 5, 1, device=DEVICE)), TypeError, "done must be a bool tensor"),
        (dict(terminated=torch.zeros(2, 5, 1, dtype=torch.int64, device=DEVICE)), TypeError,
         "terminated must be a bool tensor"),
        (dict(reward=torch.zeros(2, 5, 1, dtype=torch.int64, device=DEVICE)), TypeError,
         "reward must be a floating-point tensor"),
        (dict(state_value=_x(dtype=torch.float64)), TypeError, "state_value has dtype torch.float64"),
        (dict(state_value=torch.zeros(2, 5, 1, device="meta")), ValueError, "state_value is on meta"),
        (dict(time_dim=3), ValueError, r"time_dim=3 is out of range for inputs of shape \(2, 5, 1\)"),
        (dict(time_dim=-4), ValueError, "time_dim=-4 is out of range"),
        (dict(time_dim=1.0), TypeError, "time_dim must be an int"),
        (dict(gamma=1.5), ValueError, r"gamma must lie in \[0.0, 1.0\], got 1.5"),
        (dict(gamma=-0.1), ValueError, "gamma must lie in"),
        (dict(lmbda=float("nan")), ValueError, "lmbda must lie in"),
        (dict(gamma="0.9"), TypeError, "gamma must be a float or a tensor"),
        (dict(gamma=torch.tensor([0.9, 1.2], device=DEVICE)), ValueError, "gamma has shape"),
        (dict(lmbda=torch.zeros(2, 5, 1, dtype=torch.int64)), TypeError, "lmbda must be a floating-point tensor"),
        (dict(initial_state=_x((2, 5))), ValueError, r"initial_state has shape \(2, 5\), expected \(2, 1\)"),
        (dict(reward=[1.0]), TypeError, "reward must be a torch.Tensor"),
        (dict(reward=torch.tensor(1.0)), ValueError, "shape"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_gae_bad_input(over, exc, match, backend):
    with pytest.raises(exc, match=match):
        _gae(backend=backend, **over)


def test_coefficient_tensors_range_checked_on_cpu():
    """CPU tensors are range-checked; CUDA ones are not (that would synchronise the device)."""
    x, d = torch.randn(2, 5, 1), torch.zeros(2, 5, 1, dtype=torch.bool)
    with pytest.raises(ValueError, match="gamma must lie in"):
        K.gae(x, x, x, d, gamma=torch.full((2, 5, 1), 1.2), lmbda=0.9, backend="torch")


def test_errors_are_value_and_runtime_errors():
    """TorchRL raises RuntimeError for these mistakes; ours are both, so code catching either keeps working."""
    with pytest.raises(RuntimeError):
        _gae(state_value=_x((2, 6, 1)))
    assert issubclass(InputError, ValueError) and issubclass(InputError, RuntimeError)


def test_bad_backend(monkeypatch):
    with pytest.raises(ValueError, match="backend must be one of"):
        _gae(backend="cuda")
    monkeypatch.setenv("RL_TRITON_TORCHRL_BACKEND", "fast")
    with pytest.raises(ValueError, match="RL_TRITON_TORCHRL_BACKEND"):
        _gae()


@pytest.mark.triton
def test_backend_env_overrides_auto(monkeypatch):
    """The environment variable picks the path of backend='auto'; each path's numbers are the float64 reference's."""
    from rl_triton_torchrl.kernels._utils import resolve_backend

    assert resolve_backend("auto", torch.device("cpu")) == "torch"
    assert resolve_backend("auto", torch.device("cuda")) == "triton"
    assert resolve_backend("auto", torch.device("cuda"), torch.ones(1, requires_grad=True)) == "triton_scan"
    with torch.no_grad():
        assert resolve_backend("auto", torch.device("cuda"), torch.ones(1, requires_grad=True)) == "triton"
    inputs = dict(reward=_x(), state_value=_x(), next_state_value=_x(), done=_d())
    out = {}
    for env in ("torch", "triton"):
        monkeypatch.setenv("RL_TRITON_TORCHRL_BACKEND", env)
        assert resolve_backend("auto", DEVICE) == env
        assert resolve_backend("torch", DEVICE) == "torch"  # an explicit choice wins
        out[env] = _gae(**inputs)
    expected = gae_ref(*(inputs[k] for k in ("reward", "state_value", "next_state_value", "done")), gamma=0.9,
                       lmbda=0.9)
    for env, got in out.items():
        for name, o, e in zip(("advantage", "value_target"), got, expected):
            assert_close(f"{env} {name}", o, e, torch.float32)


def test_functional_shape_errors_match_torchrl_types():
    x = _x()
    with pytest.raises(RuntimeError, match="shape"):
        F.td_lambda_return_estimate(0.9, 0.9, x, _x((2, 4, 1)), _d())
    with pytest.raises(ValueError, match="reward and done must share the same shape"):
        F.reward2go(x, _d((2, 4, 1)), 0.9)
    with pytest.raises(ValueError, match="td0_return_estimate needs terminated"):
        F.td0_return_estimate(0.9, x, x)


@pytest.mark.parametrize("backend", BACKENDS)
def test_td_lambda_needs_flags(backend):
    with pytest.raises(ValueError, match="done"):
        K.td_lambda_return(_x(), _x(), None, None, gamma=0.9, lmbda=0.9, backend=backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_linear_scan_bad_input(backend):
    with pytest.raises(ValueError, match="b has shape"):
        K.linear_scan(_x(), _x((2, 4, 1)), backend=backend)


TIME_DIM_2D = r"time_dim must be given for 2-D inputs \(shape \(4, 7\)\): time_dim=-1 for \[B, T\].*" \
              r"time_dim=0 \(or -2\) for TorchRL's time-major \[T, B\]"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", [a for a in TABLE if a not in DISCRETE])
def test_2d_inputs_need_time_dim(algo, backend):
    """A 2-D input is [B, T] (rl-triton's [num_envs, T]) or TorchRL's time-major [T, B]: without time_dim every
    kernel function refuses it (the default, -2, would scan B as time), naming both conventions; an explicit
    time_dim (-2 included) gives the reference's answer."""
    call, ref, coefs = TABLE[algo]
    x = make_rollout((4, 7), -1, "random", seed=1)
    with pytest.raises(InputError, match=TIME_DIM_2D):
        call(x, backend=backend, **coefs)
    for time_dim in (-1, -2, 0):
        out = as_tuple(call(x, backend=backend, time_dim=time_dim, **coefs))
        expected, _ = ref(x, time_dim=time_dim, **coefs)
        for i, (o, e) in enumerate(zip(out, as_tuple(expected))):
            assert_close(f"{algo}[{i}] time_dim={time_dim}", o, e)


@pytest.mark.parametrize("backend", BACKENDS)
def test_2d_linear_scan_needs_time_dim(backend):
    a, b = torch.rand(4, 7, device=DEVICE), torch.randn(4, 7, device=DEVICE)
    with pytest.raises(InputError, match=TIME_DIM_2D):
        K.linear_scan(a, b, backend=backend)
    assert_close("h", K.linear_scan(a, b, time_dim=-1, backend=backend), linear_scan_ref(a, b, time_dim=-1)[0])


@pytest.mark.parametrize("backend", BACKENDS)
def test_default_time_dim_of_other_shapes(backend):
    """3-D inputs keep TorchRL's default (-2); [T] inputs name time_dim=0; retrace_discrete's [T, A] inputs (actions
    last) need no time_dim."""
    x = make_rollout((4, 7, 1), -2, "random", seed=2)
    call, ref, coefs = TABLE["gae"]
    for i, (o, e) in enumerate(zip(call(x, backend=backend, **coefs), ref(x, **coefs)[0])):
        assert_close(f"gae[{i}]", o, e)
    x1 = make_rollout((7,), 0, "random", seed=2)
    with pytest.raises(InputError, match=r"time_dim=-2 is out of range for inputs of shape \(7,\) \(the default\): "
                                         r"pass time_dim=0"):
        call(x1, backend=backend, **coefs)
    xd = make_rollout((7,), 0, "random", seed=3)
    _, ref_d, coefs_d = TABLE["retrace_discrete"]
    out = K.retrace_discrete(xd["pi"], xd["action"], xd["q_values"], xd["next_pi"], xd["next_q_values"],
                             xd["reward"], xd["done"], xd["terminated"], behavior_prob=xd["behavior_prob"],
                             backend=backend, **coefs_d)
    for i, (o, e) in enumerate(zip(out, ref_d(xd, time_dim=0, **coefs_d)[0])):
        assert_close(f"retrace_discrete[{i}]", o, e)
