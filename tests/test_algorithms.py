"""Every algorithm, every path (torch; Triton, through the interpreter without a GPU) against its float64 reference.

One table (ALGOS) says how to call each algorithm and its reference; the tests sweep it over sequence lengths, done
patterns, layouts (time-major, sliced, permuted, stride-0 flags, 1-D), dtypes, coefficient tensors, carried states
and long sequences.
"""
from __future__ import annotations

import os

import pytest
import torch

from _helpers import BACKENDS, DEVICE, PATTERNS, assert_close, case_id, flags, randn, window_states, windows
from rl_triton_torchrl import kernels as K
from rl_triton_torchrl.kernels import reference as R

GAMMA, LMBDA = 0.97, 0.9


def _gae(x, **kw):
    return K.gae(x["reward"], x["value"], x["next_value"], x["done"], x["terminated"], **kw)


def _gae_ref(x, **kw):
    adv, vt, h = R.gae_ref(x["reward"], x["value"], x["next_value"], x["done"], x["terminated"], **kw)
    return (adv, vt), h


def _td(lmbda, advantage=False, done_or_terminated=False, value_target=False):
    def call(x, **kw):
        kw.setdefault("lmbda", lmbda)
        if advantage:
            return K.td_lambda_advantage(x["reward"], x["value"], x["next_value"], x["done"], x["terminated"],
                                         done_or_terminated=done_or_terminated, return_value_target=value_target,
                                         **kw)
        return K.td_lambda_return(x["reward"], x["next_value"], x["done"], x["terminated"],
                                  done_or_terminated=done_or_terminated, **kw)

    def ref(x, **kw):
        kw.setdefault("lmbda", lmbda)
        ret, h = R.td_lambda_return_ref(x["reward"], x["next_value"], x["done"], x["terminated"],
                                        done_or_terminated=done_or_terminated, **kw)
        if value_target:
            return (ret - x["value"].double(), ret), h
        return (ret - x["value"].double() if advantage else ret), h

    return call, ref


def _discounted(x, **kw):
    return K.discounted_return(x["reward"], x["done"], **kw)


def _discounted_ref(x, **kw):
    return R.discounted_return_ref(x["reward"], x["done"], output_final_state=True, **kw)


def _discounted_boot(x, **kw):
    return K.discounted_return(x["reward"], x["done"], next_state_value=x["next_value"], terminated=x["terminated"],
                               **kw)


def _discounted_boot_ref(x, **kw):
    return R.discounted_return_ref(x["reward"], x["done"], next_state_value=x["next_value"],
                                   terminated=x["terminated"], output_final_state=True, **kw)


# name -> (call(inputs, **kw), reference(inputs, **kw) -> (outputs, final state), takes lmbda)
ALGOS = {
    "gae": (_gae, _gae_ref, True),
    "td_lambda": (*_td(None), True),
    "td_lambda_adv": (*_td(None, advantage=True), True),
    "td_lambda_adv_vt": (*_td(None, advantage=True, value_target=True), True),  # (advantage, value_target)
    "td0": (*_td(0.0), False),
    "td1": (_td(1.0, done_or_terminated=True)[0], _discounted_boot_ref, False),  # TD(1): the discounted return
    "discounted": (_discounted, _discounted_ref, False),
    "discounted_boot": (_discounted_boot, _discounted_boot_ref, False),
}


def make_inputs(shape, time_dim=-2, pattern="random", dtype=torch.float32, layout="contig", seed=0):
    """A random rollout of ``shape``: reward, value, next_value (dtype) and done, terminated (bool)."""
    g = torch.Generator().manual_seed(seed)
    done, term = flags(shape, pattern, g, time_dim)
    x = {"reward": randn(shape, g, dtype), "value": randn(shape, g, dtype), "next_value": randn(shape, g, dtype),
         "done": done, "terminated": term}
    return {k: _relayout(v, layout, time_dim) for k, v in x.items()}


def _relayout(t, layout, time_dim):
    """The same values in another memory layout."""
    if layout == "contig":
        return t
    if layout == "sliced":  # every other step of a twice-as-long buffer
        td = time_dim % t.dim()
        big = torch.repeat_interleave(t, 2, dim=td)
        return big.narrow(td, 0, big.shape[td] - 1)[(slice(None),) * td + (slice(None, None, 2),)]
    if layout == "permuted":  # stored with the dims reversed
        dims = tuple(reversed(range(t.dim())))
        return t.permute(dims).contiguous().permute(dims)
    if layout == "broadcast":  # stride 0 along the last dim (e.g. one done flag shared by all agents)
        return t[..., :1].expand(t.shape)
    raise ValueError(layout)


def run_and_check(algo, x, backend, *, gamma=GAMMA, lmbda=LMBDA, time_dim=-2, dtype=None):
    call, ref, takes_lmbda = ALGOS[algo]
    kw = {"gamma": gamma, "time_dim": time_dim}
    if takes_lmbda:
        kw["lmbda"] = lmbda
    out = call(x, backend=backend, **kw)
    expected, _ = ref(x, **kw)
    out = out if isinstance(out, tuple) else (out,)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for i, (o, e) in enumerate(zip(out, expected)):
        assert o.dtype == x["reward"].dtype, f"{algo} output {i} dtype {o.dtype}"
        assert o.device == x["reward"].device
        assert_close(f"{algo}[{i}]", o, e, dtype or x["reward"].dtype)


T_SWEEP = [((3, T, 1), -2, p) for T in (1, 3, 63, 200, 1000) for p in PATTERNS]
LAYOUTS = [
    ((37, 4, 1), 0, "contig"),  # time-major
    ((2, 29, 3, 1), 1, "contig"),  # multi-agent
    ((2, 29, 3, 2), 1, "broadcast"),  # stride-0 inner dim
    ((3, 40, 2), 1, "sliced"),
    ((4, 31, 3), 1, "permuted"),
    ((2, 3, 45), -1, "permuted"),
    ((50,), 0, "contig"),
    ((3, 2, 17, 2), -2, "sliced"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(ALGOS))
@pytest.mark.parametrize("shape,time_dim,pattern", T_SWEEP, ids=[case_id(*c) for c in T_SWEEP])
def test_t_sweep(algo, backend, shape, time_dim, pattern):
    run_and_check(algo, make_inputs(shape, time_dim, pattern), backend, time_dim=time_dim)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(ALGOS))
@pytest.mark.parametrize("shape,time_dim,layout", LAYOUTS, ids=[case_id(s, t, extra=lay) for s, t, lay in LAYOUTS])
def test_layouts(algo, backend, shape, time_dim, layout):
    run_and_check(algo, make_inputs(shape, time_dim, "random", layout=layout), backend, time_dim=time_dim)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(ALGOS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_dtypes(algo, backend, dtype):
    run_and_check(algo, make_inputs((4, 63, 2), -2, "random", dtype=dtype), backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("pattern", ["random", "none", "all"])
def test_td_lambda_value_target_exact(backend, dtype, pattern):
    """``return_value_target``: the value targets are ``td_lambda_return``'s and the advantages exactly
    ``value_target - state_value`` in the inputs' dtype (what TorchRL's TD(lambda) estimator computes), bit for bit."""
    if backend == "triton" and dtype.itemsize == 2 and os.environ.get("TRITON_INTERPRET") == "1":
        pytest.skip("Triton's interpreter casts float32 to 16 bits by truncation, where a GPU and torch round to "
                    "nearest even: bit for bit only compiled")
    x = make_inputs((5, 63, 2), -2, pattern, dtype=dtype, seed=3)
    kw = {"gamma": GAMMA, "lmbda": LMBDA, "backend": backend}
    adv, vt = K.td_lambda_advantage(x["reward"], x["value"], x["next_value"], x["done"], x["terminated"],
                                    return_value_target=True, **kw)
    ret = K.td_lambda_return(x["reward"], x["next_value"], x["done"], x["terminated"], **kw)
    assert torch.equal(vt, ret)
    assert torch.equal(adv, vt - x["value"])


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(ALGOS))
def test_coefficient_tensors(algo, backend):
    """Per-step gamma (e.g. gamma ** steps_to_next_obs) and per-row lambda as broadcastable tensors."""
    shape = (3, 41, 2)
    x = make_inputs(shape)
    g = torch.Generator().manual_seed(1)
    gamma = (0.9 + 0.1 * torch.rand(shape, generator=g)).to(DEVICE)
    lmbda = (0.5 + 0.5 * torch.rand(3, 1, 1, generator=g)).to(DEVICE)
    run_and_check(algo, x, backend, gamma=gamma, lmbda=lmbda)
    run_and_check(algo, x, backend, gamma=torch.tensor(0.95, device=DEVICE), lmbda=torch.tensor(0.8))


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(ALGOS))
@pytest.mark.parametrize("shape,time_dim", [((3, 200, 1), -2), ((45, 2, 3), 0)], ids=["B3-T200", "T45-tdim0"])
def test_chunked_path(algo, backend, shape, time_dim, small_tiles):
    """With 16-step tiles and 32-element programs every sequence crosses many chunks and programs."""
    run_and_check(algo, make_inputs(shape, time_dim, "trunc_last"), backend, time_dim=time_dim)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", ["gae", "td_lambda", "td_lambda_adv_vt", "discounted_boot"])
def test_long_sequence(algo, backend):
    """T = 5000 > MAX_BLOCK_T: chunks with carries between them (look-back chunks in float32 at the default
    constants, else 2048-step tiles walked in turn)."""
    run_and_check(algo, make_inputs((2, 5000, 1), -2, "random"), backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(ALGOS))
@pytest.mark.parametrize("split", [1, 17, 39])
def test_carried_state(algo, backend, split):
    """A rollout cut in two: the later part's final state, fed to the earlier part, gives the uncut result."""
    call, ref, takes_lmbda = ALGOS[algo]
    kw = {"gamma": GAMMA, **({"lmbda": LMBDA} if takes_lmbda else {})}
    x = make_inputs((3, 40, 2), -2, "random")
    head = {k: v[:, :split] for k, v in x.items()}
    tail = {k: v[:, split:] for k, v in x.items()}
    *tail_out, h_tail = call(tail, backend=backend, output_final_state=True, **kw)
    *head_out, h_head = call(head, backend=backend, initial_state=h_tail, output_final_state=True, **kw)
    expected, h_expected = ref(x, **kw)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for i, e in enumerate(expected):
        assert_close(f"{algo}[{i}]", torch.cat([head_out[i], tail_out[i]], dim=1), e)
    assert h_head.dtype == torch.float32
    assert_close(f"{algo} final state", h_head, h_expected, torch.float32)
    # the reference agrees on the carried state
    _, h_ref_tail = ref(tail, **kw)
    assert_close(f"{algo} tail state", h_tail, h_ref_tail, torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(ALGOS))
def test_empty(algo, backend):
    """T = 0 and an empty batch return empty outputs of the right shape, and a carried state passes through."""
    call, _, takes_lmbda = ALGOS[algo]
    kw = {"gamma": GAMMA, **({"lmbda": LMBDA} if takes_lmbda else {})}
    for shape in [(3, 0, 1), (0, 5, 1)]:
        x = make_inputs(shape)
        out = call(x, backend=backend, **kw)
        for o in out if isinstance(out, tuple) else (out,):
            assert o.shape == shape
    x = make_inputs((3, 0, 1))
    h0 = torch.randn(3, 1, device=DEVICE)
    *_, h = call(x, backend=backend, initial_state=h0, output_final_state=True, **kw)
    assert torch.equal(h, h0)


GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (too slow for the interpreter)")
# (shape, window): a million steps in one row, 16 rows of 65536 (both in the look-back mode on a GPU), and a short
# case that runs everywhere (it checks the windowed oracle itself)
VERY_LONG = [pytest.param((1, 2**20, 1), 4096, marks=GPU, id="B1-T2^20"),
             pytest.param((16, 2**16, 1), 4096, marks=GPU, id="B16-T2^16"),
             pytest.param((2, 512, 1), 128, id="B2-T512")]
# per algorithm: the state each step passes on to the step before it, from the outputs and inputs
PASSED_ON = {"gae": lambda out, x: out[0], "td_lambda": lambda out, x: out[0], "td_lambda_adv_vt": lambda out, x: out[1],
             "discounted": lambda out, x: out[0]}


@pytest.mark.parametrize("pattern", ["random", "none"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("algo", list(PASSED_ON))
@pytest.mark.parametrize("shape,window", VERY_LONG)
@pytest.mark.triton
def test_very_long_sequence(algo, shape, window, dtype, pattern):
    """Long sequences with a carried state, against the float64 reference run on windows of ``window`` steps, each
    entering with the outputs' state at its edge (``_helpers.window_states``): every window is checked against the
    recurrence, without a float64 loop over a million steps."""
    call, ref, takes_lmbda = ALGOS[algo]
    kw = {"gamma": GAMMA, **({"lmbda": LMBDA} if takes_lmbda else {})}
    x = make_inputs(shape, -2, pattern, dtype=dtype)
    h0 = randn((shape[0], shape[2]), torch.Generator().manual_seed(7), dtype)
    *out, h = call(x, backend="triton", initial_state=h0, output_final_state=True, **kw)
    out = [o.cpu().double() for o in out]
    cpu = {k: windows(v.cpu().double() if v.is_floating_point() else v.cpu(), window) for k, v in x.items()}
    states = window_states(PASSED_ON[algo](out, x).cpu().double(), h0.cpu().double(), window, reverse=True)
    expected, h_expected = ref(cpu, initial_state=states, **kw)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for i, (o, e) in enumerate(zip(out, expected)):
        assert_close(f"{algo}[{i}] (rows of {window}-step windows)", windows(o, window), e, dtype)
    # the final state is the first window's
    assert_close(f"{algo} final state", h, h_expected.reshape(shape[0], -1, shape[2])[:, 0], torch.float32
                 if dtype != torch.float64 else dtype)
