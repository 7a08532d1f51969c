"""The shifted input mode of GAE and V-trace (``next_state_value=None, last_state_value=...``) against the float64
references; at the end, what is particular to retrace_discrete's (``last_pi``, ``last_q_values``).

The oracle is each algorithm's reference with the next values built explicitly, ``torch.cat`` of ``state_value``
one step on and the last value, so the kernels' own reading of ``V(s_(t+1))`` from ``state_value`` is what is
tested. Both paths (torch; Triton, through the interpreter without a GPU), every output NaN-poisoned first
(conftest).
"""
from __future__ import annotations

import pytest
import torch

from _helpers import BACKENDS, DEVICE, PATTERNS, assert_close, case_id, randn
from rl_triton_torchrl import kernels as K
from rl_triton_torchrl.kernels import InputError
from rl_triton_torchrl.kernels import reference as R
from rl_triton_torchrl.kernels import scan
from rl_triton_torchrl.kernels._utils import check_inputs
from test_algorithms import GAMMA, LMBDA
from test_vtrace_retrace import make_rollout as make_inputs, one_step_on


def state_shape(shape, time_dim):
    shape = list(shape)
    del shape[time_dim]
    return tuple(shape)


def with_last_value(x, time_dim, seed=1, layout="contig"):
    """The rollout ``x`` with a random last value ``[*B, *F]``."""
    g = torch.Generator().manual_seed(seed)
    lv = randn(state_shape(x["reward"].shape, time_dim), g, x["reward"].dtype)
    if layout == "strided":  # every other element of a buffer twice as long in its last dimension
        lv = torch.repeat_interleave(lv, 2, dim=-1)[..., ::2] if lv.dim() else lv
    return {**x, "last_value": lv}


# name -> (call(x, value, next value, last value, terminated, **kw), reference(x, value, next value, terminated,
# **kw) -> (advantage, target, state), its default coefficients, the name of the first float input (dtype errors
# name it))
ALGOS = {
    "gae": (
        lambda x, v, nv, lv, term, **kw: K.gae(x["reward"], v, nv, x["done"], term, last_state_value=lv, **kw),
        lambda x, v, nv, term, **kw: R.gae_ref(x["reward"], v, nv, x["done"], term, **kw),
        {"gamma": GAMMA, "lmbda": LMBDA},
        "reward",
    ),
    "vtrace": (
        lambda x, v, nv, lv, term, **kw: K.vtrace(x["log_pi"], x["log_mu"], v, nv, x["reward"], x["done"], term,
                                                  last_state_value=lv, **kw),
        lambda x, v, nv, term, **kw: R.vtrace_ref(x["log_pi"], x["log_mu"], v, nv, x["reward"], x["done"], term,
                                                  **kw),
        {"gamma": GAMMA, "rho_thresh": 1.0, "c_thresh": 0.8},
        "log_pi",
    ),
}
algos = pytest.mark.parametrize("algo", list(ALGOS))


def call(algo, x, value=None, last_value=None, *, terminated=True, **kw):
    """``algo`` on ``x`` in the shifted mode (``value`` and ``last_value`` in place of x's)."""
    fn, _, coefs, _ = ALGOS[algo]
    value = x["value"] if value is None else value
    last_value = x["last_value"] if last_value is None else last_value
    return fn(x, value, None, last_value, x["terminated"] if terminated else None, **{**coefs, **kw})


def reference(algo, x, value=None, last_value=None, *, time_dim=-2, terminated=True, **kw):
    """The float64 reference of ``algo`` on ``x`` with the next values built explicitly: (outputs..., state)."""
    _, ref, coefs, _ = ALGOS[algo]
    value = x["value"] if value is None else value
    last_value = x["last_value"] if last_value is None else last_value
    nv = one_step_on(value, last_value, time_dim)  # V(s_(t+1)) as a tensor
    kw = {k: v for k, v in kw.items() if k != "output_final_state"}
    return ref(x, value, nv, x["terminated"] if terminated else None, time_dim=time_dim, **{**coefs, **kw})


def check(algo, x, backend, *, time_dim=-2, dtype=None, terminated=True, **kw):
    out = call(algo, x, terminated=terminated, time_dim=time_dim, backend=backend, **kw)
    *expected, h = reference(algo, x, terminated=terminated, time_dim=time_dim, **kw)
    dtype = dtype or x["reward"].dtype
    for name, o, e in zip(("advantage", "value_target"), out, expected):
        assert o.dtype == x["reward"].dtype and o.shape == x["reward"].shape, f"{algo} {name}: {o.dtype} {o.shape}"
        assert_close(f"{algo} {name}", o, e, dtype)
    if kw.get("output_final_state"):
        assert_close(f"{algo} final state", out[2], h, torch.float32 if dtype != torch.float64 else dtype)
    return out


SHAPES = [((3, T, 1), -2) for T in (1, 3, 63)] + [((T, 4, 1), 0) for T in (1, 3, 63)]
T_SWEEP = [(s, td, p) for s, td in SHAPES for p in PATTERNS]


@algos
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape,time_dim,pattern", T_SWEEP, ids=[case_id(*c) for c in T_SWEEP])
def test_t_sweep(algo, backend, shape, time_dim, pattern):
    check(algo, with_last_value(make_inputs(shape, time_dim, pattern), time_dim), backend, time_dim=time_dim)


@algos
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern", PATTERNS)
def test_rsl_rl_storage(algo, backend, pattern):
    """rsl_rl's layout: ``[T, N, 1]`` time-major, one flag tensor for done and terminated (read once)."""
    x = with_last_value(make_inputs((24, 37, 1), 0, pattern), 0)
    check(algo, {**x, "terminated": x["done"]}, backend, time_dim=0, terminated=False)


LAYOUTS = [
    ((37, 4, 1), 0, "contig"),
    ((2, 29, 3, 1), 1, "contig"),  # multi-agent
    ((2, 29, 3, 2), 1, "broadcast"),  # stride-0 inner dim
    ((3, 40, 2), 1, "sliced"),
    ((4, 31, 3), 1, "permuted"),
    ((2, 3, 45), -1, "permuted"),
    ((50,), 0, "contig"),  # one sequence: the last value is 0-d
    ((3, 2, 17, 2), -2, "sliced"),
]


@algos
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("lv_layout", ["contig", "strided"])
@pytest.mark.parametrize("shape,time_dim,layout", LAYOUTS, ids=[case_id(s, t, extra=lay) for s, t, lay in LAYOUTS])
def test_layouts(algo, backend, shape, time_dim, layout, lv_layout):
    x = with_last_value(make_inputs(shape, time_dim, "random", layout=layout), time_dim, layout=lv_layout)
    if lv_layout == "strided" and x["last_value"].dim() > 0 and x["last_value"].shape[-1] > 1:
        assert not x["last_value"].is_contiguous()
    check(algo, x, backend, time_dim=time_dim)


@algos
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_dtypes(algo, backend, dtype):
    check(algo, with_last_value(make_inputs((4, 63, 2), -2, "random", dtype=dtype), -2), backend)


@algos
@pytest.mark.parametrize("backend", BACKENDS)
def test_coefficient_tensors(algo, backend):
    """Per-step gamma and a per-row second coefficient, as broadcastable tensors."""
    shape = (3, 41, 2)
    g = torch.Generator().manual_seed(2)
    second = list(ALGOS[algo][2])[1]
    coefs = {"gamma": (0.9 + 0.1 * torch.rand(shape, generator=g)).to(DEVICE),
             second: (0.5 + 0.5 * torch.rand(3, 1, 1, generator=g)).to(DEVICE)}
    check(algo, with_last_value(make_inputs(shape), -2), backend, **coefs)


@algos
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape,time_dim", [((3, 200, 1), -2), ((45, 2, 3), 0)], ids=["B3-T200", "T45-tdim0"])
def test_chunked_path(algo, backend, shape, time_dim, small_tiles):
    """16-step tiles: the value one step on crosses from one chunk into the next."""
    check(algo, with_last_value(make_inputs(shape, time_dim, "trunc_last"), time_dim), backend, time_dim=time_dim)


@algos
@pytest.mark.triton
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("T", [65, 128, 129, 300])
def test_warp_local_tiles(algo, T, pattern, monkeypatch):
    """Batch-major rows in 128-step tiles (the few-rows rule off): rows of one chunk (partial, whole) read V(s_(t+1))
    one step on; rows of several chunks (one step past one, several) take it from the tile's own values one column
    on and its last column from the chunk after it; with a carried state and the final state."""
    monkeypatch.setattr(scan, "WIDE_MAX_ROWS", 0)
    layout = check_inputs(-2, {"x": torch.empty((3, T, 1), device="meta")}, {})
    assert scan.launch_config(layout, f"_{algo}_fwd_kernel")["BLOCK_T"] == scan.WARP_LOCAL_T
    x = with_last_value(make_inputs((3, T, 1), -2, pattern, seed=T), -2)
    h0 = randn((3, 1), torch.Generator().manual_seed(T), torch.float32)
    check(algo, x, "triton", initial_state=h0, output_final_state=True)


@algos
@pytest.mark.triton
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("T", [13, 45, 129, 131, 301])
def test_aligned_windows(algo, T, pattern, monkeypatch):
    """Rows whose length is no multiple of 4 in aligned windows (``scan.chunk``'s ``WINDOW``), whole or in 128-step
    tiles of several chunks, where V(s_(t+1)) comes from the window's own columns: the last value (read once per row,
    its storage a view off the 16-byte grid) does not stand in the way; with a carried state and the final state."""
    monkeypatch.setattr(scan, "WIDE_MAX_ROWS", 0)
    monkeypatch.setattr(scan, "WINDOW_KERNELS", scan.KERNELS)
    taken, rule = [], scan._aligned_window
    monkeypatch.setattr(scan, "_aligned_window", lambda *a: taken.append(rule(*a)) or taken[-1])
    x = with_last_value(make_inputs((3, T, 1), -2, pattern, seed=T), -2)
    lv = x["last_value"]
    x["last_value"] = torch.cat([lv.new_zeros(1), lv.reshape(-1)])[1:].view(lv.shape)
    h0 = randn((3, 1), torch.Generator().manual_seed(T), torch.float32)
    check(algo, x, "triton", initial_state=h0, output_final_state=True)
    assert taken == [True]


@algos
@pytest.mark.parametrize("backend", BACKENDS)
def test_long_sequence(algo, backend):
    """T = 5000: the chunk loop (and, on the Triton path, the look-back mode's one program per chunk)."""
    check(algo, with_last_value(make_inputs((2, 5000, 1), -2, "random"), -2), backend)


@algos
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("split", [1, 17, 39])
def test_carried_state(algo, backend, split):
    """A rollout cut in two: the head's last value is the tail's first value, and the tail's final state enters the
    head; together they give the uncut result."""
    x = with_last_value(make_inputs((3, 40, 2), -2, "random"), -2)
    head = {k: v[:, :split] for k, v in x.items() if k != "last_value"}
    tail = {k: v[:, split:] for k, v in x.items() if k != "last_value"}
    tail["last_value"], head["last_value"] = x["last_value"], x["value"][:, split]
    *tail_out, h_tail = check(algo, tail, backend, output_final_state=True)
    *head_out, _ = check(algo, head, backend, initial_state=h_tail, output_final_state=True)
    expected = reference(algo, x)
    for i, name in enumerate(("advantage", "value_target")):
        assert_close(f"{algo} {name}", torch.cat([head_out[i], tail_out[i]], 1), expected[i])


@algos
@pytest.mark.parametrize("backend", BACKENDS)
def test_non_finite_stays_put(algo, backend):
    """A NaN last value of a row whose last step terminated, and a NaN value right after a termination, are
    never read as a bootstrap; a NaN value elsewhere reaches exactly the outputs the reference gives."""
    x = with_last_value(make_inputs((4, 9, 1), -2, "none"), -2)
    done, term, value = x["done"].clone(), x["terminated"].clone(), x["value"].clone()
    lv = x["last_value"].clone()
    done[0, -1] = term[0, -1] = True
    lv[0] = float("nan")
    done[1, 3] = term[1, 3] = True
    value[1, 4] = float("nan")  # V_4 of row 1: its own step 4 and everything before it down to the termination
    value[2, 5] = float("nan")
    x = {**x, "done": done, "terminated": term, "value": value, "last_value": lv}
    adv, vt = check(algo, x, backend)
    assert torch.isfinite(adv[0]).all() and torch.isfinite(adv[1, :4]).all() and torch.isfinite(adv[3]).all()
    assert adv[1, 4].isnan().all() and adv[2, :6].isnan().all() and torch.isfinite(adv[2, 6:]).all()


@algos
@pytest.mark.parametrize("backend", BACKENDS)
def test_empty(algo, backend):
    for shape in [(3, 0, 1), (0, 5, 1)]:
        x = with_last_value(make_inputs(shape), -2)
        adv, vt = call(algo, x, terminated=False, backend=backend)
        assert adv.shape == vt.shape == shape


@algos
@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients(algo, backend):
    """Gradients with respect to the values and the last value (float64) equal those through the reference."""
    x = with_last_value(make_inputs((3, 11, 1), -2, "random", dtype=torch.float64), -2)
    w = torch.randn(3, 11, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(3)).to(DEVICE)

    def grads(fn):
        v = x["value"].clone().requires_grad_(True)
        lv = x["last_value"].clone().requires_grad_(True)
        adv, vt = fn(v, lv)[:2]
        ((adv * w).sum() + (vt * w * w).sum()).backward()
        return v.grad, lv.grad

    ours = grads(lambda v, lv: call(algo, x, v, lv, backend=backend))
    ref = grads(lambda v, lv: reference(algo, x, v, lv))
    assert_close("d/d state_value", ours[0], ref[0])
    assert_close("d/d last_state_value", ours[1], ref[1])


@algos
def test_errors(algo):
    fn, _, coefs, first = ALGOS[algo]
    x = with_last_value(make_inputs((3, 5, 1)), -2)

    def bad(nv=None, lv=x["last_value"]):
        return fn(x, x["value"], nv, lv, x["terminated"], backend="torch", **coefs)

    with pytest.raises(InputError, match="next_state_value or last_state_value, not both"):
        bad(nv=x["next_value"])
    with pytest.raises(TypeError, match="next_state_value must be a floating-point torch.Tensor, got None"):
        bad(lv=None)
    with pytest.raises(InputError, match=r"last_state_value has shape \(3, 5, 1\), expected \(3, 1\)"):
        bad(lv=x["value"])
    with pytest.raises(TypeError, match=f"last_state_value has dtype torch.float64 but {first} has torch.float32"):
        bad(lv=x["last_value"].double())
    with pytest.raises(TypeError, match="last_state_value must be a torch.Tensor, got list"):
        bad(lv=[[0.0]] * 3)


@algos
@pytest.mark.triton
def test_input_not_mutated(algo):
    x = with_last_value(make_inputs((3, 7, 1), -2, "random"), -2)
    before = {k: v.clone() for k, v in x.items()}
    for backend in BACKENDS:
        check(algo, x, backend)
    for k, v in x.items():
        assert torch.equal(v, before[k]), f"{k} was modified"


# --- retrace_discrete: pi and q_values one step on (next_pi=None, next_q_values=None, last_pi, last_q_values) ---
# Its sweeps run from test_vtrace_retrace's table ("retrace_discrete_shifted"); here what is its own.

def _discrete(x, last_pi=None, last_q=None, *, backend, nxt=(None, None), **kw):
    """retrace_discrete on ``x`` ([*B, T, 1] steps, [*B, T, 1, A] per action; time_dim 1), in the shifted mode
    with the given last ones (default: the last step's next ones)."""
    last_pi = x["next_pi"][:, -1] if last_pi is None else last_pi
    last_q = x["next_q_values"][:, -1] if last_q is None else last_q
    return K.retrace_discrete(x["pi"], x["action"], x["q_values"], *nxt, x["reward"], x["done"],
                              behavior_prob=x["behavior_prob"], gamma=GAMMA, lmbda=LMBDA, time_dim=1,
                              last_pi=last_pi, last_q_values=last_q, backend=backend, **kw)


def _discrete_ref(x, last_pi, last_q):
    nxt = [one_step_on(x[k], last, 1) for k, last in (("pi", last_pi), ("q_values", last_q))]
    return R.retrace_discrete_ref(x["pi"], x["action"], x["q_values"], *nxt, x["reward"], x["done"],
                                  behavior_prob=x["behavior_prob"], gamma=GAMMA, lmbda=LMBDA, time_dim=1)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("layout", ["contig", "strided", "expanded"])
def test_retrace_discrete_last_layouts(backend, layout):
    """The last probabilities and Q values as views: every other element of a longer buffer, or one row's
    broadcast to all rows (stride 0)."""
    x = make_inputs((4, 37, 1), 1, "random")
    last_pi, last_q = x["next_pi"][:, -1], x["next_q_values"][:, -1]  # [4, 1, A]
    if layout == "strided":
        last_pi, last_q = (torch.repeat_interleave(v, 2, dim=-1)[..., ::2] for v in (last_pi, last_q))
        assert not last_pi.is_contiguous()
    elif layout == "expanded":
        last_pi, last_q = (v[:1].expand_as(v) for v in (last_pi, last_q))
    out = _discrete(x, last_pi, last_q, backend=backend)
    expected = _discrete_ref(x, last_pi, last_q)
    for name, o, e in zip(("q_ret", "advantage"), out, expected):
        assert_close(f"retrace_discrete {name}", o, e)


@pytest.mark.parametrize("backend", BACKENDS)
def test_retrace_discrete_non_finite_stays_put(backend):
    """A NaN last Q value of a row whose last step terminated, and NaN Q values and probabilities right after a
    termination, are never read as a bootstrap: the latter reach that step's advantage alone (Q_ret_t does not read
    Q(s_t, a_t))."""
    x = make_inputs((3, 9, 1), 1, "none")
    done, pi, q = x["done"].clone(), x["pi"].clone(), x["q_values"].clone()
    last_pi, last_q = x["next_pi"][:, -1].clone(), x["next_q_values"][:, -1].clone()
    done[0, -1] = True
    last_q[0] = float("nan")
    last_pi[0] = float("nan")
    done[1, 3] = True
    q[1, 4] = pi[1, 4] = float("nan")  # step 4 of row 1: its own outputs and those back to the termination
    x = {**x, "done": done, "terminated": done, "pi": pi, "q_values": q}
    q_ret, adv = _discrete(x, last_pi, last_q, backend=backend)
    expected = _discrete_ref(x, last_pi, last_q)
    assert_close("q_ret", q_ret, expected[0])
    assert_close("advantage", adv, expected[1])
    assert torch.isfinite(q_ret).all()
    assert adv[1, 4].isnan().all() and adv.isnan().sum() == 1


@pytest.mark.parametrize("backend", BACKENDS)
def test_retrace_discrete_empty(backend):
    for shape in [(3, 0, 1), (0, 5, 1)]:
        x = make_inputs(shape, 1, "random")
        last = torch.zeros(shape[0], 1, x["pi"].shape[-1], device=DEVICE)
        q_ret, adv = _discrete(x, last, last, backend=backend)
        assert q_ret.shape == adv.shape == shape


def test_retrace_discrete_errors():
    x = make_inputs((3, 5, 1), 1, "random", n_actions=3)
    last_pi, last_q = x["next_pi"][:, -1], x["next_q_values"][:, -1]

    def bad(**kw):
        return _discrete(x, **{"last_pi": last_pi, "last_q": last_q, "backend": "torch", **kw})

    with pytest.raises(InputError, match="pass next_pi or last_pi, not both"):
        bad(nxt=(x["next_pi"], None))
    with pytest.raises(InputError, match="pass next_q_values or last_q_values, not both"):
        bad(nxt=(None, x["next_q_values"]))
    with pytest.raises(InputError, match="pass next_pi and next_q_values, or last_pi and last_q_values"):
        K.retrace_discrete(x["pi"], x["action"], x["q_values"], x["next_pi"], None, x["reward"], x["done"],
                           behavior_prob=x["behavior_prob"], gamma=GAMMA, time_dim=1, last_q_values=last_q)
    with pytest.raises(InputError, match=r"last_q_values has shape \(3, 5, 1, 3\), expected \(3, 1, 3\)"):
        bad(last_q=x["q_values"])
    with pytest.raises(TypeError, match="last_pi has dtype torch.float64 but pi has torch.float32"):
        bad(last_pi=last_pi.double())
    with pytest.raises(TypeError, match="last_q_values has dtype torch.float64 but pi has torch.float32"):
        bad(last_q=last_q.double())
    cpu = {k: v.cpu() for k, v in x.items()}  # value checks run on CPU tensors (CUDA ones are not synchronised)
    with pytest.raises(InputError, match="last_pi must not be negative"):
        _discrete(cpu, -last_pi.cpu(), last_q.cpu(), backend="torch")
    with pytest.raises(TypeError, match=r"next_q_values must be a floating-point torch.Tensor, got None \(or pass "
                                        r"last_q_values"):
        K.retrace_discrete(x["pi"], x["action"], x["q_values"], x["next_pi"], None, x["reward"], x["done"],
                           behavior_prob=x["behavior_prob"], gamma=GAMMA, time_dim=1)


@pytest.mark.triton
def test_retrace_discrete_input_not_mutated():
    x = make_inputs((3, 7, 1), 1, "random")
    last_pi, last_q = x["next_pi"][:, -1].clone(), x["next_q_values"][:, -1].clone()
    before = {k: v.clone() for k, v in x.items()} | {"last_pi": last_pi.clone(), "last_q": last_q.clone()}
    for backend in BACKENDS:
        _discrete(x, last_pi, last_q, backend=backend)
    for k, v in (x | {"last_pi": last_pi, "last_q": last_q}).items():
        assert torch.equal(v, before[k]), f"{k} was modified"
