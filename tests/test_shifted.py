"""GAE's shifted input mode (``next_state_value=None, last_state_value=...``) against the float64 reference.

The oracle is ``reference.gae_ref`` with the next values built explicitly, ``torch.cat`` of ``state_value`` one step
on and the last value, so the kernel's own reading of ``V(s_(t+1))`` from ``state_value`` is what is tested. Both
paths (torch; Triton, through the interpreter without a GPU), every output NaN-poisoned first (conftest).
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
from test_algorithms import GAMMA, LMBDA, make_inputs


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


def shifted_next_values(value, last_value, time_dim):
    """V(s_(t+1)) as a tensor: ``value`` one step on along ``time_dim``, then ``last_value``."""
    td = time_dim % value.dim()
    return torch.cat([value.narrow(td, 1, value.shape[td] - 1), last_value.unsqueeze(td)], dim=td)


def check(x, backend, *, time_dim=-2, gamma=GAMMA, lmbda=LMBDA, dtype=None, terminated=True, **kw):
    term = x["terminated"] if terminated else None
    out = K.gae(x["reward"], x["value"], None, x["done"], term, gamma=gamma, lmbda=lmbda, time_dim=time_dim,
                last_state_value=x["last_value"], backend=backend, **kw)
    nv = shifted_next_values(x["value"], x["last_value"], time_dim)
    ref_kw = {k: v for k, v in kw.items() if k != "output_final_state"}
    adv, vt, h = R.gae_ref(x["reward"], x["value"], nv, x["done"], term, gamma=gamma, lmbda=lmbda,
                           time_dim=time_dim, **ref_kw)
    dtype = dtype or x["reward"].dtype
    for name, o, e in (("advantage", out[0], adv), ("value_target", out[1], vt)):
        assert o.dtype == x["reward"].dtype and o.shape == x["reward"].shape, f"{name}: {o.dtype} {o.shape}"
        assert_close(name, o, e, dtype)
    if kw.get("output_final_state"):
        assert_close("final state", out[2], h, torch.float32 if dtype != torch.float64 else dtype)
    return out


SHAPES = [((3, T, 1), -2) for T in (1, 3, 63)] + [((T, 4, 1), 0) for T in (1, 3, 63)]
T_SWEEP = [(s, td, p) for s, td in SHAPES for p in PATTERNS]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape,time_dim,pattern", T_SWEEP, ids=[case_id(*c) for c in T_SWEEP])
def test_t_sweep(backend, shape, time_dim, pattern):
    check(with_last_value(make_inputs(shape, time_dim, pattern), time_dim), backend, time_dim=time_dim)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("pattern", PATTERNS)
def test_rsl_rl_storage(backend, pattern):
    """rsl_rl's layout: ``[T, N, 1]`` time-major, one flag tensor for done and terminated (read once)."""
    x = with_last_value(make_inputs((24, 37, 1), 0, pattern), 0)
    check({**x, "terminated": x["done"]}, backend, time_dim=0, terminated=False)


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


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("lv_layout", ["contig", "strided"])
@pytest.mark.parametrize("shape,time_dim,layout", LAYOUTS, ids=[case_id(s, t, extra=lay) for s, t, lay in LAYOUTS])
def test_layouts(backend, shape, time_dim, layout, lv_layout):
    x = with_last_value(make_inputs(shape, time_dim, "random", layout=layout), time_dim, layout=lv_layout)
    if lv_layout == "strided" and x["last_value"].dim() > 0 and x["last_value"].shape[-1] > 1:
        assert not x["last_value"].is_contiguous()
    check(x, backend, time_dim=time_dim)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_dtypes(backend, dtype):
    check(with_last_value(make_inputs((4, 63, 2), -2, "random", dtype=dtype), -2), backend)


@pytest.mark.parametrize("backend", BACKENDS)
def test_coefficient_tensors(backend):
    shape = (3, 41, 2)
    g = torch.Generator().manual_seed(2)
    gamma = (0.9 + 0.1 * torch.rand(shape, generator=g)).to(DEVICE)
    lmbda = (0.5 + 0.5 * torch.rand(3, 1, 1, generator=g)).to(DEVICE)
    check(with_last_value(make_inputs(shape), -2), backend, gamma=gamma, lmbda=lmbda)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape,time_dim", [((3, 200, 1), -2), ((45, 2, 3), 0)], ids=["B3-T200", "T45-tdim0"])
def test_chunked_path(backend, shape, time_dim, small_tiles):
    """16-step tiles: the value one step on crosses from one chunk into the next."""
    check(with_last_value(make_inputs(shape, time_dim, "trunc_last"), time_dim), backend, time_dim=time_dim)


@pytest.mark.triton
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("T", [65, 128, 129, 300])
def test_warp_local_tiles(T, pattern, monkeypatch):
    """Batch-major rows in 128-step tiles (the few-rows rule off): rows of one chunk (partial, whole) read V(s_(t+1))
    one step on; rows of several chunks (one step past one, several) take it from the tile's own values one column
    on and its last column from the chunk after it; with a carried state and the final state."""
    monkeypatch.setattr(scan, "WIDE_MAX_ROWS", 0)
    layout = check_inputs(-2, {"x": torch.empty((3, T, 1), device="meta")}, {})
    assert scan.launch_config(layout, "_gae_fwd_kernel")["BLOCK_T"] == scan.WARP_LOCAL_T
    x = with_last_value(make_inputs((3, T, 1), -2, pattern, seed=T), -2)
    h0 = randn((3, 1), torch.Generator().manual_seed(T), torch.float32)
    check(x, "triton", initial_state=h0, output_final_state=True)


@pytest.mark.triton
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("T", [13, 45, 129, 131, 301])
def test_aligned_windows(T, pattern, monkeypatch):
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
    check(x, "triton", initial_state=h0, output_final_state=True)
    assert taken == [True]


@pytest.mark.parametrize("backend", BACKENDS)
def test_long_sequence(backend):
    """T = 5000: the chunk loop (and, on the Triton path, the look-back mode's one program per chunk)."""
    check(with_last_value(make_inputs((2, 5000, 1), -2, "random"), -2), backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("split", [1, 17, 39])
def test_carried_state(backend, split):
    """A rollout cut in two: the head's last value is the tail's first value, and the tail's final state enters the
    head; together they give the uncut result."""
    x = with_last_value(make_inputs((3, 40, 2), -2, "random"), -2)
    head = {k: v[:, :split] for k, v in x.items() if k != "last_value"}
    tail = {k: v[:, split:] for k, v in x.items() if k != "last_value"}
    tail["last_value"], head["last_value"] = x["last_value"], x["value"][:, split]
    *tail_out, h_tail = check(tail, backend, output_final_state=True)
    *head_out, _ = check(head, backend, initial_state=h_tail, output_final_state=True)
    adv, vt, _ = R.gae_ref(x["reward"], x["value"], shifted_next_values(x["value"], x["last_value"], -2), x["done"],
                           x["terminated"], gamma=GAMMA, lmbda=LMBDA)
    assert_close("advantage", torch.cat([head_out[0], tail_out[0]], 1), adv)
    assert_close("value_target", torch.cat([head_out[1], tail_out[1]], 1), vt)


@pytest.mark.parametrize("backend", BACKENDS)
def test_non_finite_stays_put(backend):
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
    adv, vt = check(x, backend)
    assert torch.isfinite(adv[0]).all() and torch.isfinite(adv[1, :4]).all() and torch.isfinite(adv[3]).all()
    assert adv[1, 4].isnan().all() and adv[2, :6].isnan().all() and torch.isfinite(adv[2, 6:]).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_empty(backend):
    for shape in [(3, 0, 1), (0, 5, 1)]:
        x = with_last_value(make_inputs(shape), -2)
        adv, vt = K.gae(x["reward"], x["value"], None, x["done"], gamma=GAMMA, lmbda=LMBDA,
                        last_state_value=x["last_value"], backend=backend)
        assert adv.shape == vt.shape == shape


@pytest.mark.parametrize("backend", BACKENDS)
def test_gradients(backend):
    """Gradients with respect to the values and the last value (float64) equal those through the reference."""
    x = with_last_value(make_inputs((3, 11, 1), -2, "random", dtype=torch.float64), -2)
    w = torch.randn(3, 11, 1, dtype=torch.float64, generator=torch.Generator().manual_seed(3)).to(DEVICE)

    def grads(fn):
        v = x["value"].clone().requires_grad_(True)
        lv = x["last_value"].clone().requires_grad_(True)
        adv, vt = fn(v, lv)[:2]
        ((adv * w).sum() + (vt * w * w).sum()).backward()
        return v.grad, lv.grad

    ours = grads(lambda v, lv: K.gae(x["reward"], v, None, x["done"], x["terminated"], gamma=GAMMA, lmbda=LMBDA,
                                     last_state_value=lv, backend=backend))
    ref = grads(lambda v, lv: R.gae_ref(x["reward"], v, shifted_next_values(v, lv, -2), x["done"], x["terminated"],
                                        gamma=GAMMA, lmbda=LMBDA))
    assert_close("d/d state_value", ours[0], ref[0])
    assert_close("d/d last_state_value", ours[1], ref[1])


def _call(x, **kw):
    args = dict(gamma=GAMMA, lmbda=LMBDA, last_state_value=x["last_value"], backend="torch")
    args.update(kw)
    nv = args.pop("next_state_value", None)
    return K.gae(x["reward"], x["value"], nv, x["done"], x["terminated"], **args)


def test_errors():
    x = with_last_value(make_inputs((3, 5, 1)), -2)
    with pytest.raises(InputError, match="next_state_value or last_state_value, not both"):
        _call(x, next_state_value=x["next_value"])
    with pytest.raises(TypeError, match="next_state_value must be a floating-point torch.Tensor, got None"):
        _call(x, last_state_value=None)
    with pytest.raises(InputError, match=r"last_state_value has shape \(3, 5, 1\), expected \(3, 1\)"):
        _call(x, last_state_value=x["value"])
    with pytest.raises(TypeError, match="last_state_value has dtype torch.float64 but reward has torch.float32"):
        _call(x, last_state_value=x["last_value"].double())
    with pytest.raises(TypeError, match="last_state_value must be a torch.Tensor, got list"):
        _call(x, last_state_value=[[0.0]] * 3)


@pytest.mark.triton
def test_input_not_mutated():
    x = with_last_value(make_inputs((3, 7, 1), -2, "random"), -2)
    before = {k: v.clone() for k, v in x.items()}
    for backend in BACKENDS:
        check(x, backend)
    for k, v in x.items():
        assert torch.equal(v, before[k]), f"{k} was modified"
