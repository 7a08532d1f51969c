"""torch.compile, CUDA graphs and host synchronisation.

Under torch.compile every functional builds its coefficients with torch ops (which the compiler fuses) and runs the
scan as the custom op ``rl_triton_torchrl::linear_scan``: ``fullgraph=True`` traces our functionals, TorchRL-style
estimator modules and our TensorDict modules without a graph break, forward and backward. On the GPU the fused
kernels are captured in CUDA graphs (``torch.cuda.graph``, tensordict's ``CudaGraphModule``,
``mode="reduce-overhead"``) and never synchronise with the host.
"""
from __future__ import annotations

import pytest
import torch
from tensordict import TensorDict

import rl_triton_torchrl as rtt
from _helpers import BACKENDS, DEVICE, assert_close
from test_autograd import GRAD_CASES, _rollout

CUDA = torch.cuda.is_available()
needs_cuda = pytest.mark.skipif(not CUDA, reason="needs a CUDA device")
# On the CPU the compiler's graph is checked with AOT autograd and run eagerly (no C++ toolchain, fast); on the GPU
# inductor compiles it.
COMPILE_BACKEND = "inductor" if CUDA else "aot_eager"
COMPILED = ["gae", "td_lambda", "vtrace", "retrace", "prefix_sum", "linear_scan"]


@pytest.fixture(autouse=True)
def _fresh_compiler():
    torch._dynamo.reset()
    yield


def _call(algo, f, done, term, backend):
    out = GRAD_CASES[algo][0](f, done, term, backend=backend)
    return out if isinstance(out, tuple) else (out,)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", COMPILED)
def test_fullgraph_functionals(algo, backend):
    """Values and gradients of the compiled call equal the eager call's."""
    f, done, term = _rollout()
    names = GRAD_CASES[algo][1]
    compiled = torch.compile(lambda g: _call(algo, g, done, term, backend), fullgraph=True, backend=COMPILE_BACKEND)
    results = {}
    for mode, fn in (("eager", lambda g: _call(algo, g, done, term, backend)), ("compiled", compiled)):
        leaves = {k: f[k].clone().requires_grad_() for k in names}
        out = fn(dict(f, **leaves))
        sum((o * (1 + torch.arange(o.numel(), device=o.device).reshape(o.shape) % 3)).sum() for o in out).backward()
        results[mode] = (out, {k: v.grad for k, v in leaves.items()})
    for i, (a, b) in enumerate(zip(results["compiled"][0], results["eager"][0])):
        assert_close(f"{algo} output {i}", a, b)
    for k in names:
        assert_close(f"{algo} d/d{k}", results["compiled"][1][k], results["eager"][1][k])


def _rollout_td(B=3, T=11, seed=0):
    g = torch.Generator().manual_seed(seed)

    def x(*shape):
        return torch.randn(*shape, generator=g).to(DEVICE)

    done = (torch.rand(B, T, 1, generator=g) < 0.2).to(DEVICE)
    return TensorDict({
        "state_value": x(B, T, 1), "sample_log_prob": x(B, T, 1), "observation": x(B, T, 4),
        "next": {"state_value": x(B, T, 1), "reward": x(B, T, 1), "done": done, "terminated": done.clone(),
                 "observation": x(B, T, 4)},
    }, [B, T], device=DEVICE)


ESTIMATORS = {
    "GAE": dict(gamma=0.9, lmbda=0.95),
    "TDLambdaEstimator": dict(gamma=0.9, lmbda=0.95),
    "TD0Estimator": dict(gamma=0.9),
    "TD1Estimator": dict(gamma=0.9),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", list(ESTIMATORS))
def test_fullgraph_estimators(name, backend, monkeypatch):
    """The estimator module compiled whole, values precomputed (``value_network=None``)."""
    monkeypatch.setenv("RL_TRITON_TORCHRL_BACKEND", backend)
    est = getattr(rtt, name)(**ESTIMATORS[name], value_network=None)
    td = _rollout_td()
    expected = est(td.clone())
    out = torch.compile(est, fullgraph=True, backend=COMPILE_BACKEND)(td.clone())
    for key in ("advantage", "value_target"):
        assert_close(key, out[key], expected[key])


@pytest.mark.parametrize("name", ["GAE", "TD1Estimator"])
def test_compile_with_value_network(name):
    """As TorchRL's PPO scripts compile their advantage module (with its value network, no fullgraph): the same
    numbers, and no more graph breaks than TorchRL's own class has (its NaN check of next observations breaks
    the graph, ours adds none)."""
    from tensordict.nn import TensorDictModule
    from torchrl.objectives import value as trl_value

    value_net = TensorDictModule(torch.nn.Linear(4, 1), in_keys=["observation"], out_keys=["state_value"]).to(DEVICE)
    td = _rollout_td()
    breaks = {}
    for which, module in (("ours", rtt), ("torchrl", trl_value)):
        est = getattr(module, name)(**ESTIMATORS[name], value_network=value_net)
        expected = est(td.clone())
        if which == "ours":  # (TorchRL's compiled TD1 differs from its eager TD1 in torchrl 0.14.1: not checked)
            out = torch.compile(est, backend=COMPILE_BACKEND)(td.clone())
            for key in ("advantage", "value_target"):
                assert_close(f"{which} {key}", out[key], expected[key])
        torch._dynamo.reset()
        breaks[which] = torch._dynamo.explain(est)(td.clone()).graph_break_count
    assert breaks["ours"] <= breaks["torchrl"], breaks


@pytest.mark.parametrize("backend", BACKENDS)
def test_fullgraph_modules(backend, monkeypatch):
    """Our TensorDict modules (what TorchRL lacks) compile whole too."""
    monkeypatch.setenv("RL_TRITON_TORCHRL_BACKEND", backend)
    td = _rollout_td()
    td["trace_input"] = td["observation"]
    for module in (rtt.EligibilityTraces(gamma=0.9, lmbda=0.8, device=DEVICE), rtt.EpisodicPrefixSum()):
        expected = module(td.clone())
        out = torch.compile(module, fullgraph=True, backend=COMPILE_BACKEND)(td.clone())
        for key in module.out_keys:
            if expected[key].is_floating_point():
                assert_close(str(key), out[key], expected[key])
            else:
                assert torch.equal(out[key], expected[key]), key


# ---------------------------------------------------------------------------------------------------------------
# GPU: CUDA graphs, reduce-overhead, no host synchronisation
# ---------------------------------------------------------------------------------------------------------------


def _gpu_inputs(B=64, T=50, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    x = {k: torch.randn(B, T, 1, device="cuda", generator=g) for k in ("r", "v", "nv", "lpi", "lmu")}
    x["d"] = torch.rand(B, T, 1, device="cuda", generator=g) < 0.1
    x["t"] = x["d"] & (torch.rand(B, T, 1, device="cuda", generator=g) < 0.5)
    return x


def _all_fused(x):
    """One call of every fused kernel."""
    return (
        rtt.functional.vec_generalized_advantage_estimate(0.99, 0.95, x["v"], x["nv"], x["r"], x["d"], x["t"]),
        rtt.functional.vec_td_lambda_return_estimate(0.99, 0.95, x["nv"], x["r"], x["d"], x["t"]),
        rtt.kernels.vtrace(x["lpi"], x["lmu"], x["v"], x["nv"], x["r"], x["d"], x["t"], gamma=0.99),
        rtt.kernels.retrace(x["v"], x["nv"], x["r"], x["d"], x["t"], log_ratio=x["lpi"], gamma=0.99, lmbda=0.9),
        rtt.kernels.episodic_prefix_sum(x["r"], x["d"], reset="after_done"),
        rtt.kernels.discounted_return(x["r"], x["d"], gamma=0.99),
    )


@needs_cuda
def test_cuda_graph_capture_and_replay():
    """The fused kernels are captured in a CUDA graph and replayed on new data with the eager results."""
    x = _gpu_inputs()
    static = {k: v.clone() for k, v in x.items()}
    _all_fused(static)  # compile the kernels outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = _all_fused(static)
    for seed in (1, 2):
        fresh = _gpu_inputs(seed=seed)
        for k in static:
            static[k].copy_(fresh[k])
        graph.replay()
        expected = _all_fused(fresh)
        flat = lambda o: [t for item in o for t in (item if isinstance(item, tuple) else (item,))]  # noqa: E731
        for i, (a, b) in enumerate(zip(flat(outs), flat(expected))):
            torch.testing.assert_close(a, b, msg=f"output {i} after replay")


@needs_cuda
@pytest.mark.parametrize("name", ["GAE", "TDLambdaEstimator"])
def test_cuda_graph_module(name):
    """tensordict's CudaGraphModule around our estimator, as TorchRL's PPO scripts wrap their advantage module."""
    from tensordict.nn import CudaGraphModule

    est = getattr(rtt, name)(**ESTIMATORS[name], value_network=None)
    module = CudaGraphModule(est, warmup=2)
    for seed in range(5):
        td = _rollout_td(B=32, T=40, seed=seed)
        out = module(td.clone())
        expected = est(td.clone())
        for key in ("advantage", "value_target"):
            torch.testing.assert_close(out[key], expected[key], msg=f"{key} call {seed}")


@needs_cuda
def test_reduce_overhead_compile():
    """torch.compile(mode="reduce-overhead") (inductor + CUDA graphs) of a function calling our functionals, with
    a backward."""
    x = _gpu_inputs()

    def loss(v, nv):
        adv, target = rtt.kernels.gae(x["r"], v, nv, x["d"], x["t"], gamma=0.99, lmbda=0.95)
        return (adv ** 2).mean() + target.mean()

    compiled = torch.compile(loss, mode="reduce-overhead", fullgraph=True)
    for _ in range(3):
        v, nv = x["v"].clone().requires_grad_(), x["nv"].clone().requires_grad_()
        value = compiled(v, nv)
        value.backward()
        v2, nv2 = x["v"].clone().requires_grad_(), x["nv"].clone().requires_grad_()
        expected = loss(v2, nv2)
        expected.backward()
        torch.testing.assert_close(value, expected)
        torch.testing.assert_close(v.grad, v2.grad)
        torch.testing.assert_close(nv.grad, nv2.grad)


@needs_cuda
def test_no_host_synchronisation():
    """No call on the CUDA path waits for the device: functionals (fused and differentiable), the estimator
    modules, a backward."""
    x = _gpu_inputs()
    gamma_t = torch.full((), 0.99, device="cuda")
    est = rtt.GAE(gamma=0.99, lmbda=0.95, value_network=None)
    td = _rollout_td(B=32, T=40)
    _all_fused(x), est(td.clone())  # compile and warm up outside the check
    v = x["v"].clone().requires_grad_()
    rtt.kernels.gae(x["r"], v, x["nv"], x["d"], gamma=gamma_t, lmbda=0.95)[0].sum().backward()
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        _all_fused(x)
        rtt.kernels.gae(x["r"], x["v"], x["nv"], x["d"], gamma=gamma_t, lmbda=0.95)
        est(td)
        v = x["v"].clone().requires_grad_()
        rtt.kernels.gae(x["r"], v, x["nv"], x["d"], gamma=gamma_t, lmbda=0.95)[0].sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    torch.cuda.synchronize()
