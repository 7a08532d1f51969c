"""V-trace and Retrace, every path (torch; Triton, through the interpreter without a GPU), against their float64
references, and V-trace against TorchRL's loop ``vtrace_advantage_estimate``.

One table (ALGOS) says how to call each variant and its reference; the tests sweep it over sequence lengths, done
patterns, layouts, dtypes, coefficient tensors, carried states, the multi-chunk path and bad inputs.
"""
from __future__ import annotations

import sys

import pytest
import torch
from torchrl.objectives.value.functional import vtrace_advantage_estimate

from _helpers import BACKENDS, DEVICE, PATTERNS, assert_close, case_id, kernel_global, randn, window_states, windows
from test_algorithms import make_inputs
from rl_triton_torchrl.kernels import reference as R
from rl_triton_torchrl.kernels import scan
from rl_triton_torchrl.kernels._triton import tl
from rl_triton_torchrl.kernels._utils import check_inputs
from rl_triton_torchrl.kernels.retrace import retrace, retrace_discrete
from rl_triton_torchrl.kernels.vtrace import vtrace

GAMMA, LMBDA = 0.97, 0.9
# a power of two: the sweeps' contiguous per-action tensors take the kernel's grouped reads (``A_GROUP``);
# test_retrace_discrete_action_groups sweeps the number of actions, other ones included
N_ACTIONS = 4


def make_rollout(shape, time_dim=-2, pattern="random", dtype=torch.float32, layout="contig", seed=0,
                 n_actions=N_ACTIONS):
    """``make_inputs`` plus log-probabilities (in the same layout) and the per-action tensors of a discrete rollout
    of ``shape + (n_actions,)``."""
    x = make_inputs(shape, time_dim, pattern, dtype, layout, seed)
    extra = make_inputs(shape, time_dim, pattern, dtype, layout, seed + 1)  # fresh numbers, same layout
    x.update(log_pi=extra["reward"], log_mu=extra["value"], log_ratio=extra["next_value"])
    g = torch.Generator().manual_seed(seed + 2)
    per_action = tuple(shape) + (n_actions,)
    x["pi"] = torch.softmax(randn(per_action, g, torch.float64), -1).to(dtype)
    x["next_pi"] = torch.softmax(randn(per_action, g, torch.float64), -1).to(dtype)
    x["q_values"], x["next_q_values"] = randn(per_action, g, dtype), randn(per_action, g, dtype)
    x["action"] = torch.randint(n_actions, tuple(shape), generator=g).to(DEVICE)
    x["behavior_prob"] = (0.1 + 0.9 * torch.rand(tuple(shape), generator=g, dtype=torch.float64)).to(dtype).to(DEVICE)
    return x


def _vtrace(x, **kw):
    return vtrace(x["log_pi"], x["log_mu"], x["value"], x["next_value"], x["reward"], x["done"], x["terminated"],
                  **kw)


def _vtrace_ref(x, **kw):
    adv, vs, h = R.vtrace_ref(x["log_pi"], x["log_mu"], x["value"], x["next_value"], x["reward"], x["done"],
                              x["terminated"], **kw)
    return (adv, vs), h


def last_step(y, time_dim):
    """``y`` at its last step along ``time_dim`` (zeros for T = 0)."""
    td = time_dim % y.dim()
    return y.select(td, -1) if y.shape[td] else y.new_zeros(y.shape[:td] + y.shape[td + 1:])


def one_step_on(y, last, time_dim):
    """What the shifted modes read for step t: ``y`` one step on along ``time_dim``, then ``last`` (``y``'s shape
    without that dimension) after its last step."""
    td = time_dim % y.dim()
    if not y.shape[td]:
        return y
    return torch.cat([y.narrow(td, 1, y.shape[td] - 1), last.unsqueeze(td)], dim=td)


def _last_value(x, time_dim):
    """The last value the shifted mode is given as ``last_state_value``: ``x``'s ``last_value`` if it holds one,
    else the last step's ``next_value``."""
    return x["last_value"] if "last_value" in x else last_step(x["next_value"], time_dim)


def _shifted(x, time_dim):
    """V(s_(t+1)) as the shifted mode reads it: ``value`` one step on, then the last value."""
    return one_step_on(x["value"], _last_value(x, time_dim), time_dim)


def _vtrace_shifted(x, time_dim=None, **kw):
    return vtrace(x["log_pi"], x["log_mu"], x["value"], None, x["reward"], x["done"], x["terminated"],
                  time_dim=time_dim, last_state_value=_last_value(x, -2 if time_dim is None else time_dim), **kw)


def _vtrace_shifted_ref(x, time_dim=-2, **kw):
    adv, vs, h = R.vtrace_ref(x["log_pi"], x["log_mu"], x["value"], _shifted(x, time_dim), x["reward"], x["done"],
                              x["terminated"], time_dim=time_dim, **kw)
    return (adv, vs), h


def _retrace(ratio_form):
    def weights(x):
        return {"ratio": x["log_ratio"].exp()} if ratio_form else {"log_ratio": x["log_ratio"]}

    def call(x, **kw):
        return retrace(x["value"], x["next_value"], x["reward"], x["done"], x["terminated"], **weights(x), **kw)

    def ref(x, **kw):
        q_ret, adv, h = R.retrace_ref(x["value"], x["next_value"], x["reward"], x["done"], x["terminated"],
                                      **weights(x), **kw)
        return (q_ret, adv), h

    return call, ref


def _retrace_discrete(log_form, shifted=False):
    """retrace_discrete's call and reference; ``shifted``: the call in its shifted input mode (``next_pi`` and
    ``next_q_values`` read from ``pi`` and ``q_values`` one step on, the last ones those of the rollout's last step),
    the reference with them built explicitly."""
    def weights(x):
        return {"behavior_log_prob": x["behavior_prob"].log()} if log_form else {"behavior_prob": x["behavior_prob"]}

    def args(x, td, explicit):
        nxt = (x["next_pi"], x["next_q_values"])
        if shifted:
            last = (x.get("last_pi", last_step(nxt[0], td)), x.get("last_q_values", last_step(nxt[1], td)))
            nxt = tuple(one_step_on(y, lst, td) for y, lst in zip((x["pi"], x["q_values"]), last)) if explicit \
                else (None, None)
            extra = {} if explicit else {"last_pi": last[0], "last_q_values": last[1]}
        else:
            extra = {}
        return (x["pi"], x["action"], x["q_values"], *nxt, x["reward"], x["done"], x["terminated"]), extra

    def call(x, time_dim=-2, **kw):
        td = time_dim % x["reward"].dim()
        a, extra = args(x, td, explicit=False)
        return retrace_discrete(*a, **weights(x), time_dim=td, **extra, **kw)

    def ref(x, time_dim=-2, **kw):
        td = time_dim % x["reward"].dim()
        q_ret, adv, h = R.retrace_discrete_ref(*args(x, td, explicit=True)[0], **weights(x), time_dim=td, **kw)
        return (q_ret, adv), h

    return call, ref


# name -> (call(inputs, **kw), reference(inputs, **kw) -> (outputs, final state), its coefficient names)
ALGOS = {
    "vtrace": (_vtrace, _vtrace_ref, ("rho_thresh", "c_thresh")),
    # the shifted input mode (next_state_value=None), its last value the last step's next_value
    "vtrace_shifted": (_vtrace_shifted, _vtrace_shifted_ref, ("rho_thresh", "c_thresh")),
    "retrace": (*_retrace(ratio_form=False), ("lmbda", "c_bar")),
    "retrace_ratio": (*_retrace(ratio_form=True), ("lmbda", "c_bar")),
    "retrace_discrete": (*_retrace_discrete(log_form=False), ("lmbda", "c_bar")),
    "retrace_discrete_log": (*_retrace_discrete(log_form=True), ("lmbda", "c_bar")),
    # the shifted input mode (next_pi=None, next_q_values=None), its last ones the last step's next ones
    "retrace_discrete_shifted": (*_retrace_discrete(log_form=False, shifted=True), ("lmbda", "c_bar")),
}
# Default values of the two coefficients of each algorithm in the sweeps: clipping and traces both active.
COEFS = {"vtrace": {"rho_thresh": 1.0, "c_thresh": 0.8}, "retrace": {"lmbda": LMBDA, "c_bar": 1.0}}


def _coefs(algo):
    return dict(COEFS["vtrace" if algo.startswith("vtrace") else "retrace"])


def run_and_check(algo, x, backend, *, time_dim=-2, dtype=None, **kw):
    call, ref, _ = ALGOS[algo]
    kw = {"gamma": GAMMA, **_coefs(algo), "time_dim": time_dim, **kw}
    out = call(x, backend=backend, **kw)
    expected, _ = ref(x, **kw)
    assert len(out) == len(expected) == 2
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
DISCRETE_ALGOS = ["retrace_discrete", "retrace_discrete_log", "retrace_discrete_shifted"]
# the other variants differ only in how the weights are given
SWEPT = ["vtrace", "vtrace_shifted", "retrace", "retrace_discrete", "retrace_discrete_shifted"]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", SWEPT)
@pytest.mark.parametrize("shape,time_dim,pattern", T_SWEEP, ids=[case_id(*c) for c in T_SWEEP])
def test_t_sweep(algo, backend, shape, time_dim, pattern):
    run_and_check(algo, make_rollout(shape, time_dim, pattern), backend, time_dim=time_dim)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", ["vtrace", "retrace", "retrace_discrete_log"])
@pytest.mark.parametrize("shape,time_dim,layout", LAYOUTS, ids=[case_id(s, t, extra=lay) for s, t, lay in LAYOUTS])
def test_layouts(algo, backend, shape, time_dim, layout):
    run_and_check(algo, make_rollout(shape, time_dim, "random", layout=layout), backend, time_dim=time_dim)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(ALGOS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_dtypes(algo, backend, dtype):
    run_and_check(algo, make_rollout((4, 63, 2), -2, "random", dtype=dtype), backend)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(ALGOS))
def test_coefficient_tensors(algo, backend):
    """Per-step gamma, per-row first coefficient and a 0-d second one, as broadcastable tensors."""
    shape = (3, 41, 2)
    x = make_rollout(shape)
    g = torch.Generator().manual_seed(1)
    first, second = ALGOS[algo][2]
    gamma = (0.9 + 0.1 * torch.rand(shape, generator=g)).to(DEVICE)
    per_row = (0.5 + torch.rand(3, 1, 1, generator=g)).clamp_max(1.0).to(DEVICE)
    run_and_check(algo, x, backend, gamma=gamma, **{first: per_row, second: torch.tensor(0.7, device=DEVICE)})
    run_and_check(algo, x, backend, gamma=torch.tensor(0.95), **{first: 0.6, second: torch.tensor(2.0)})
    # large clips (no clipping) and zero clips (no traces / zero-weighted TD errors) are both allowed
    run_and_check(algo, x, backend, **{first: 1.0, second: 1e30})
    run_and_check(algo, x, backend, **{first: 0.0, second: 0.0})


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", SWEPT)
@pytest.mark.parametrize("shape,time_dim", [((3, 200, 1), -2), ((45, 2, 3), 0)], ids=["B3-T200", "T45-tdim0"])
def test_chunked_path(algo, backend, shape, time_dim, small_tiles):
    """With 16-step tiles and 32-element programs every sequence crosses many chunks and programs; V-trace's shifted
    scan hands each chunk's last column the state of the chunk after it."""
    x = make_rollout(shape, time_dim, "trunc_last")
    run_and_check(algo, x, backend, time_dim=time_dim)
    x = make_rollout(shape, time_dim, "none")
    run_and_check(algo, x, backend, time_dim=time_dim, initial_state=_state_for(algo, x, time_dim, seed=3))


@pytest.mark.triton
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("T", [65, 128, 129, 300])
def test_vtrace_warp_local_tiles(T, pattern, monkeypatch):
    """Batch-major rows in 128-step tiles (the few-rows rule off): rows of one chunk (partial, whole) read V_(t+1)
    one step on; rows of several chunks (one step past one, several) take it from the tile's own values one column
    on and its last column from the chunk after it in time; with a carried state and the final state."""
    monkeypatch.setattr(scan, "WIDE_MAX_ROWS", 0)
    layout = check_inputs(-2, {"x": torch.empty((3, T, 1), device="meta")}, {})
    assert scan.launch_config(layout, "_vtrace_fwd_kernel")["BLOCK_T"] == scan.WARP_LOCAL_T
    x = make_rollout((3, T, 1), -2, pattern, seed=T)
    h0 = _state_for("vtrace", x, -2, seed=T)
    call, ref, _ = ALGOS["vtrace"]
    kw = {"gamma": GAMMA, **_coefs("vtrace"), "initial_state": h0}
    *out, h = call(x, backend="triton", output_final_state=True, **kw)
    expected, h_expected = ref(x, **kw)
    for i, (o, e) in enumerate(zip(out, expected)):
        assert_close(f"vtrace[{i}]", o, e)
    assert_close("vtrace final state", h, h_expected, torch.float32)


NARROW = [((5, 1, 1), -2), ((5, 3, 1), -2), ((37, 8, 1), -2), ((3, 24, 1), -2), ((40, 63, 1), -2), ((24, 3), 0)]


@pytest.mark.triton
@pytest.mark.parametrize("with_state", [False, True], ids=["no-state", "state"])
@pytest.mark.parametrize("pattern", PATTERNS)
@pytest.mark.parametrize("shape,time_dim", NARROW, ids=[case_id(s, t) for s, t in NARROW])
@pytest.mark.parametrize("algo", ["vtrace", "vtrace_shifted"])
def test_vtrace_reads_vs_back_in_narrow_tiles(algo, shape, time_dim, pattern, with_state):
    """``vtrace.RELOAD_NARROW`` (off until a GPU A/B): tiles of fewer than 128 steps, whose rows share a warp, read
    vs_(t+1) back from the output just stored instead of gathering it one column on. The same numbers, masked rows
    and steps included (T = 1, 3, 8, 24, 63; time-major), with and without a carried state, and the final state."""
    x = make_rollout(shape, time_dim, pattern, seed=shape[time_dim])
    h0 = _state_for(algo, x, time_dim, seed=7) if with_state else None
    call, ref, _ = ALGOS[algo]
    kw = {"gamma": GAMMA, **_coefs(algo), "time_dim": time_dim, "initial_state": h0}
    module = sys.modules[vtrace.__module__]
    with kernel_global(module, "RELOAD_NARROW", tl.constexpr(True), module._vtrace_fwd_kernel):
        *out, h = call(x, backend="triton", output_final_state=True, **kw)
    expected, h_expected = ref(x, **kw)
    for i, (o, e) in enumerate(zip(out, expected)):
        assert_close(f"{algo}[{i}]", o, e)
    assert_close(f"{algo} final state", h, h_expected, torch.float32)


def _state_for(algo, x, time_dim, seed):
    """A random carried state of the right shape for ``algo`` on rollout ``x``."""
    ref = x["reward"]
    shape = ref.shape[: time_dim % ref.dim()] + ref.shape[time_dim % ref.dim() + 1:]
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed)).to(DEVICE)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(ALGOS))
@pytest.mark.parametrize("T", [1, 63])
def test_initial_state(algo, backend, T):
    """A given carried state, on inputs where the following segment need not be consistent with this one."""
    x = make_rollout((3, T, 2), -2, "random")
    run_and_check(algo, x, backend, initial_state=_state_for(algo, x, -2, seed=5))


def _consistent(x, algo="vtrace"):
    """The rollout made self-consistent for V-trace's carried state: V'_t = V_(t+1) wherever step t is not done (a
    collector's data); for the shifted modes everywhere, as their storage is (the next value is the value one step
    on; for retrace_discrete's, the next probabilities and Q values). Other algorithms' rollouts as they are."""
    if algo == "vtrace_shifted":
        return dict(x, next_value=_shifted(x, -2))
    if algo == "retrace_discrete_shifted":
        return dict(x, **{f"next_{k}": one_step_on(x[k], x[f"next_{k}"][:, -1], 1) for k in ("pi", "q_values")})
    if algo != "vtrace":
        return x
    x = dict(x)
    v, nv, d = x["value"], x["next_value"].clone(), x["done"]
    nv[:, :-1] = torch.where(d[:, :-1], nv[:, :-1], v[:, 1:])
    x["next_value"] = nv
    return x


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(ALGOS))
@pytest.mark.parametrize("split", [1, 17, 39])
def test_carried_state(algo, backend, split):
    """A rollout cut in two: the later part's final state, fed to the earlier part, gives the uncut result.

    V-trace's carried state takes V at the cut from the earlier part's next_state_value, so the rollout is made
    consistent (as a collector's is); Retrace's state is exact on any inputs.
    """
    call, ref, _ = ALGOS[algo]
    kw = {"gamma": GAMMA, **_coefs(algo)}
    x = make_rollout((3, 40, 2), -2, "random")
    x = _consistent(x, algo)
    head = {k: v[:, :split] for k, v in x.items()}
    tail = {k: v[:, split:] for k, v in x.items()}
    *tail_out, h_tail = call(tail, backend=backend, output_final_state=True, **kw)
    *head_out, h_head = call(head, backend=backend, initial_state=h_tail, output_final_state=True, **kw)
    expected, h_expected = ref(x, **kw)
    for i, e in enumerate(expected):
        assert_close(f"{algo}[{i}]", torch.cat([head_out[i], tail_out[i]], dim=1), e)
    assert h_head.dtype == torch.float32
    assert_close(f"{algo} final state", h_head, h_expected, torch.float32)
    _, h_ref_tail = ref(tail, **kw)  # the reference agrees on the carried state
    assert_close(f"{algo} tail state", h_tail, h_ref_tail, torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", ["vtrace", "retrace"])
def test_done_isolates_episodes(algo, backend):
    """Nothing after a done step (of the next episode) changes any output up to it."""
    call, _, _ = ALGOS[algo]
    kw = {"gamma": GAMMA, **_coefs(algo)}
    x = make_rollout((2, 30, 1), -2, "none")
    for k in ("done", "terminated"):
        x[k] = x[k].clone()
    x["done"][:, 11] = True  # a truncation at step 11
    y = {k: (v.clone() if v.is_floating_point() else v) for k, v in x.items()}
    for k in ("reward", "value", "next_value", "log_pi", "log_mu", "log_ratio"):
        y[k][:, 12:] += 10.0
    (ref_x, _), (ref_y, _) = ALGOS[algo][1](x, **kw), ALGOS[algo][1](y, **kw)
    for i, (a, b) in enumerate(zip(ref_x, ref_y)):  # the oracle has the property
        assert_close(f"{algo} reference[{i}] up to the truncation", a[:, :12], b[:, :12])
    for name, rollout, expected in (("x", x, ref_x), ("y", y, ref_y)):  # and each call is the oracle's answer
        for i, (o, e) in enumerate(zip(call(rollout, backend=backend, **kw), expected)):
            assert_close(f"{algo}[{i}] on {name}", o, e)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", ["vtrace", "retrace", "retrace_discrete"])
def test_window_end_is_truncation(algo, backend):
    """Without a carried state the window end bootstraps like a truncation there, and a zero state is no state."""
    call, _, _ = ALGOS[algo]
    kw = {"gamma": GAMMA, **_coefs(algo)}
    x = make_rollout((3, 25, 1), -2, "random")
    trunc = dict(x, done=x["done"].clone(), terminated=x["terminated"].clone())
    trunc["done"][:, -1], trunc["terminated"][:, -1] = True, False
    plain = dict(x, terminated=trunc["terminated"])
    zero = torch.zeros(_state_for(algo, x, -2, 0).shape, device=DEVICE)
    ref = ALGOS[algo][1]
    expected, _ = ref(trunc, **kw)
    for i, (a, b, c) in enumerate(zip(ref(plain, **kw)[0], expected, ref(plain, initial_state=zero, **kw)[0])):
        assert_close(f"{algo} reference[{i}] window end vs truncation", a, b)  # the oracle has the property
        assert_close(f"{algo} reference[{i}] zero state", c, b)
    for name, rollout, state in (("plain", plain, None), ("truncated", trunc, None), ("zero state", plain, zero)):
        for i, (o, e) in enumerate(zip(call(rollout, backend=backend, initial_state=state, **kw), expected)):
            assert_close(f"{algo}[{i}] {name}", o, e)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(ALGOS))
def test_empty(algo, backend):
    """T = 0 and an empty batch return empty outputs of the right shape, and a carried state passes through."""
    call, _, _ = ALGOS[algo]
    kw = {"gamma": GAMMA, **_coefs(algo)}
    for shape in [(3, 0, 1), (0, 5, 1)]:
        x = make_rollout(shape)
        for o in call(x, backend=backend, **kw):
            assert o.shape == shape
    x = make_rollout((3, 0, 1))
    h0 = torch.randn(3, 1, device=DEVICE)
    *_, h = call(x, backend=backend, initial_state=h0, output_final_state=True, **kw)
    assert torch.equal(h, h0)


# ---------------------------------------------------------------------------------------------------------------
# Retrace against its sum form (an oracle independent of the recursion the kernels and retrace_ref scan)
# ---------------------------------------------------------------------------------------------------------------

SUM_CASES = [((3, T, 2), p) for T in (1, 3, 40) for p in PATTERNS]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("with_state", [False, True], ids=["no-state", "state"])
@pytest.mark.parametrize("shape,pattern", SUM_CASES, ids=[case_id(s, -2, p) for s, p in SUM_CASES])
def test_retrace_matches_sum_form(shape, pattern, with_state, backend, small_tiles):
    """Q_ret_t = Q_t + sum_s (prod_k gamma_k (1 - done_k) c_(k+1)) delta_s: the kernels (16-step tiles: 40 steps
    cross chunks), both weight forms, and the recursion reference, with per-step gamma and lambda tensors, clipped
    traces and the final state u_0."""
    x = make_rollout(shape, -2, pattern, dtype=torch.float64, seed=len(pattern) + shape[1])
    g = torch.Generator().manual_seed(shape[1])
    kw = {"gamma": (0.8 + 0.2 * torch.rand(shape, generator=g, dtype=torch.float64)).to(DEVICE),
          "lmbda": (0.5 + 0.5 * torch.rand(shape, generator=g, dtype=torch.float64)).to(DEVICE), "c_bar": 1.2}
    if with_state:
        kw["initial_state"] = _state_for("retrace", x, -2, seed=9).double()
    expected = R.retrace_sum_ref(x["value"], x["next_value"], x["reward"], x["done"], x["terminated"],
                                 log_ratio=x["log_ratio"], **kw)
    ref = R.retrace_ref(x["value"], x["next_value"], x["reward"], x["done"], x["terminated"],
                        log_ratio=x["log_ratio"], **kw)
    args = (x["value"], x["next_value"], x["reward"], x["done"], x["terminated"])
    for name, out in (("retrace_ref", ref),
                      ("retrace", retrace(*args, log_ratio=x["log_ratio"], output_final_state=True, backend=backend,
                                          **kw)),
                      ("retrace ratio", retrace(*args, ratio=x["log_ratio"].exp(), output_final_state=True,
                                                backend=backend, **kw))):
        for i, (o, e) in enumerate(zip(out, expected)):
            assert_close(f"{name}[{i}]", o, e)


def test_retrace_sum_form_by_hand():
    """The sum form itself on numbers worked out by hand: one episode of 3 steps, Q = 0, E_pi Q' = 0, rewards 1,
    gamma 0.5, traces c = (_, 0.5, 1): Q_ret_2 = 1, Q_ret_1 = 1 + 0.5 * 1 * 1 = 1.5,
    Q_ret_0 = 1 + 0.5 * 0.5 * 1 + 0.5^2 * 0.5 * 1 * 1 = 1.375; a done at step 1 cuts step 0 to 1 + 0.5 * 0.5 * 1."""
    zero = torch.zeros(1, 3, 1, dtype=torch.float64)
    ratio = torch.tensor([2.0, 0.5, 1.0], dtype=torch.float64).view(1, 3, 1)
    done = torch.zeros(1, 3, 1, dtype=torch.bool)
    q_ret, _, _ = R.retrace_sum_ref(zero, zero, zero + 1, done, ratio=ratio, gamma=0.5)
    assert_close("Q_ret", q_ret, torch.tensor([1.375, 1.5, 1.0], dtype=torch.float64).view(1, 3, 1))
    done[0, 1] = True
    q_ret, _, _ = R.retrace_sum_ref(zero, zero, zero + 1, done, ratio=ratio, gamma=0.5)
    assert_close("Q_ret (done at 1)", q_ret, torch.tensor([1.25, 1.0, 1.0], dtype=torch.float64).view(1, 3, 1))


# ---------------------------------------------------------------------------------------------------------------
# Parity with TorchRL's loop functional
# ---------------------------------------------------------------------------------------------------------------

TORCHRL_CASES = [((3, T, 1), p) for T in (1, 3, 63) for p in PATTERNS] + [((2, 3, 40, 2), "random")]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("shape,pattern", TORCHRL_CASES, ids=[case_id(s, -2, p) for s, p in TORCHRL_CASES])
def test_vtrace_matches_torchrl(backend, shape, pattern):
    """Float64 and a dyadic gamma, so that TorchRL's float32 discount products are exact: the same numbers."""
    x = make_rollout(shape, -2, pattern, dtype=torch.float64)
    args = (x["log_pi"], x["log_mu"], x["value"], x["next_value"], x["reward"], x["done"], x["terminated"])
    for rho_thresh, c_thresh in [(1.0, 1.0), (1.5, 0.75), (torch.tensor(0.5), torch.full(shape, 1.25, device=DEVICE))]:
        adv_e, vs_e = vtrace_advantage_estimate(0.9375, *args, rho_thresh=rho_thresh, c_thresh=c_thresh)
        adv, vs = vtrace(*args, gamma=0.9375, rho_thresh=rho_thresh, c_thresh=c_thresh, backend=backend)
        assert_close("advantage", adv, adv_e)
        assert_close("value_target", vs, vs_e)


@pytest.mark.parametrize("backend", BACKENDS)
def test_vtrace_matches_torchrl_float32(backend):
    """Float32, any gamma and terminated defaulting to done, within float32 tolerance."""
    x = make_rollout((4, 200, 1), -2, "trunc_last")
    args = (x["log_pi"], x["log_mu"], x["value"], x["next_value"], x["reward"], x["done"])
    adv_e, vs_e = vtrace_advantage_estimate(GAMMA, *args)
    adv, vs = vtrace(*args, gamma=GAMMA, backend=backend)
    assert_close("advantage", adv, adv_e)
    assert_close("value_target", vs, vs_e)


# ---------------------------------------------------------------------------------------------------------------
# Bad inputs
# ---------------------------------------------------------------------------------------------------------------


def _cpu_rollout(shape):
    """Validation does not depend on the device; on the CPU an out-of-range action is caught before any gather."""
    return {k: v.cpu() for k, v in make_rollout(shape).items()}


def _vtrace_args(x):
    return [x["log_pi"], x["log_mu"], x["value"], x["next_value"], x["reward"], x["done"], x["terminated"]]


def test_bad_inputs_vtrace():
    x = _cpu_rollout((2, 5, 1))
    args = _vtrace_args(x)
    with pytest.raises(ValueError, match="rho_thresh"):
        vtrace(*args, gamma=0.9, rho_thresh=-1.0)
    with pytest.raises(ValueError, match="c_thresh"):
        vtrace(*args, gamma=0.9, c_thresh=torch.full((2, 5, 1), -0.5))
    with pytest.raises(ValueError, match="c_thresh"):
        vtrace(*args, gamma=0.9, c_thresh=torch.ones(3, 1, 1))
    with pytest.raises(TypeError, match="rho_thresh"):
        vtrace(*args, gamma=0.9, rho_thresh="1.0")
    with pytest.raises(ValueError, match="gamma"):
        vtrace(*args, gamma=1.5)
    with pytest.raises(TypeError, match="log_pi"):
        vtrace(torch.zeros(2, 5, 1, dtype=torch.int64), *args[1:], gamma=0.9)
    with pytest.raises(TypeError, match="log_mu"):
        vtrace(args[0], args[1].double(), *args[2:], gamma=0.9)
    with pytest.raises(ValueError, match="log_mu"):
        vtrace(args[0], args[1][:, :4], *args[2:], gamma=0.9)
    with pytest.raises(TypeError, match="done"):
        vtrace(*args[:5], args[5].float(), gamma=0.9)
    with pytest.raises(ValueError, match="initial_state"):
        vtrace(*args, gamma=0.9, initial_state=torch.zeros(2, 5))
    with pytest.raises(ValueError, match="time_dim"):
        vtrace(*args, gamma=0.9, time_dim=3)
    with pytest.raises(ValueError, match="backend"):
        vtrace(*args, gamma=0.9, backend="cuda")


def test_bad_inputs_retrace():
    x = _cpu_rollout((2, 5, 1))
    args = (x["value"], x["next_value"], x["reward"], x["done"], x["terminated"])
    lr = x["log_ratio"]
    with pytest.raises(ValueError, match="ratio and log_ratio"):
        retrace(*args, gamma=0.9)
    with pytest.raises(ValueError, match="ratio and log_ratio"):
        retrace(*args, ratio=lr.exp(), log_ratio=lr, gamma=0.9)
    with pytest.raises(ValueError, match="c_bar"):
        retrace(*args, log_ratio=lr, gamma=0.9, c_bar=-1.0)
    with pytest.raises(ValueError, match="lmbda"):
        retrace(*args, log_ratio=lr, gamma=0.9, lmbda=1.5)
    with pytest.raises(TypeError, match="ratio"):
        retrace(*args, ratio=lr.double(), gamma=0.9)
    with pytest.raises(ValueError, match="log_ratio"):
        retrace(*args, log_ratio=lr[:1], gamma=0.9)
    with pytest.raises(TypeError, match="terminated"):
        retrace(*args[:4], args[4].float(), log_ratio=lr, gamma=0.9)


def _per_action_layout(x: torch.Tensor, layout: str) -> torch.Tensor:
    """The same values as the ``[*B, T, A]`` tensor ``x``, stored another way."""
    if layout == "actions_outermost":  # the action dimension has the largest stride
        return x.movedim(-1, 0).contiguous().movedim(0, -1)
    if layout == "every_other_action":  # a slice: stride 2 along the actions
        wide = torch.full((*x.shape[:-1], 2 * x.shape[-1]), float("nan"), dtype=x.dtype, device=x.device)
        wide[..., ::2] = x
        return wide[..., ::2]
    if layout == "batch_permuted":  # batch dimensions that do not merge into one stride
        return x.movedim(1, 0).contiguous().movedim(0, 1)
    return x


PER_ACTION_LAYOUTS = [((3, 41), 1, "actions_outermost"), ((3, 41), 1, "every_other_action"),
                      ((2, 3, 29), 2, "batch_permuted"), ((37, 4), 0, "actions_outermost"), ((37, 4), 0, "contig")]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("log_form", [False, True], ids=["prob", "log_prob"])
@pytest.mark.parametrize("shape,time_dim,layout", PER_ACTION_LAYOUTS,
                         ids=[case_id(s, t, extra=lay) for s, t, lay in PER_ACTION_LAYOUTS])
def test_retrace_discrete_per_action_layouts(shape, time_dim, layout, log_form, backend, monkeypatch):
    """The per-action tensors in any storage (the fused kernel reads them where they are, offsetting entry 0 by
    the action stride), time-major too, with carried states; against the float64 reference on contiguous copies.
    No per-action tensor is copied whose batch dimensions merge."""
    x = make_rollout(shape, time_dim, "random")
    stored = {k: _per_action_layout(x[k], layout) for k in ("pi", "q_values", "next_pi", "next_q_values")}
    call, ref, _ = ALGOS["retrace_discrete_log" if log_form else "retrace_discrete"]
    state = randn(x["reward"].shape[:time_dim] + x["reward"].shape[time_dim + 1:], torch.Generator().manual_seed(5))
    kw = {"gamma": GAMMA, **_coefs("retrace"), "time_dim": time_dim}
    launched = {}
    module = sys.modules[retrace_discrete.__module__]
    original = module.launch

    def spy(kernel, layout_, **kwargs):
        launched.update({k: v.data_ptr() for k, v in kwargs["inputs"].items()})
        return original(kernel, layout_, **kwargs)

    monkeypatch.setattr(module, "launch", spy)
    q_ret, adv, ht = call({**x, **stored}, backend=backend, initial_state=state.to(DEVICE), output_final_state=True,
                          **kw)
    (e_ret, e_adv), e_ht = ref(x, initial_state=state.double().to(DEVICE), **kw)
    for name, out, expected in (("q_ret", q_ret, e_ret), ("advantage", adv, e_adv), ("final state", ht, e_ht)):
        assert_close(name, out, expected, torch.float32)
    if backend == "triton":
        for short, name in (("pi", "pi"), ("q", "q_values"), ("npi", "next_pi"), ("nq", "next_q_values")):
            copied = launched[short] != stored[name].data_ptr()
            assert copied == (layout == "batch_permuted"), f"{name} copied: {copied}"


def _spy_a_group(monkeypatch) -> dict:
    """A dict that holds, after a ``retrace_discrete`` call, the ``A_GROUP`` its launch got."""
    module = sys.modules[retrace_discrete.__module__]
    launched, original = {}, module.launch

    def spy(kernel, layout_, **kwargs):
        launched["A_GROUP"] = kwargs["A_GROUP"]
        return original(kernel, layout_, **kwargs)

    monkeypatch.setattr(module, "launch", spy)
    return launched


ACTION_GROUP_CASES = [(a, T) for a in (1, 2, 3, 5, 8, 16) for T in (1, 3, 24, 63, 200)]


@pytest.mark.triton
@pytest.mark.parametrize("algo", DISCRETE_ALGOS)
@pytest.mark.parametrize("n_actions,T", ACTION_GROUP_CASES, ids=[f"A{a}-T{T}" for a, T in ACTION_GROUP_CASES])
def test_retrace_discrete_action_groups(algo, n_actions, T, monkeypatch):
    """Contiguous per-action tensors of a power-of-two number of actions up to ``MAX_ACTION_GROUP`` are read a
    group of steps' actions per load (``A_GROUP``), others with a load per action; with carried and final states,
    against the float64 reference. The launch gets ``A_GROUP`` exactly where it applies."""
    x = make_rollout((3, T), -1, "random", n_actions=n_actions, seed=T + n_actions)
    module = sys.modules[retrace_discrete.__module__]
    launched = _spy_a_group(monkeypatch)
    call, ref, _ = ALGOS[algo]
    state = randn((3,), torch.Generator().manual_seed(7))
    kw = {"gamma": GAMMA, **_coefs("retrace"), "time_dim": -1}
    q_ret, adv, ht = call(x, backend="triton", initial_state=state.to(DEVICE), output_final_state=True, **kw)
    (e_ret, e_adv), e_ht = ref(x, initial_state=state.double().to(DEVICE), **kw)
    for name, out, expected in (("q_ret", q_ret, e_ret), ("advantage", adv, e_adv), ("final state", ht, e_ht)):
        assert_close(name, out, expected, torch.float32)
    grouped = n_actions & (n_actions - 1) == 0 and n_actions <= module.MAX_ACTION_GROUP
    assert launched["A_GROUP"] == (n_actions if grouped else 0)


# bench_peers' cells where retrace_discrete read NaN or wrong values on an H200 at 16d0127 (one-row tiles of one chunk)
ONE_CHUNK_ROWS = [(128, 1024), (256, 1024), (512, 2048)]


@pytest.mark.triton
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (too slow for the interpreter)")
@pytest.mark.parametrize("algo", ["retrace_discrete", "retrace_discrete_shifted"])
@pytest.mark.parametrize("n_actions", [3, 4], ids=["A3", "A4"])
@pytest.mark.parametrize("shape", ONE_CHUNK_ROWS, ids=[f"B{b}-T{t}" for b, t in ONE_CHUNK_ROWS])
def test_retrace_discrete_one_chunk_rows(shape, n_actions, algo):
    """Rows of 1024-2048 steps in one-row tiles of one chunk, both per-action paths (3 actions: a load per action; 4:
    groups), every call twice (the same bits), against the float64 reference."""
    x = make_rollout(shape, -1, "random", n_actions=n_actions, seed=shape[0])
    call, ref, _ = ALGOS[algo]
    kw = {"gamma": GAMMA, **_coefs("retrace"), "time_dim": -1}
    out = call(x, backend="triton", **kw)
    again = call(x, backend="triton", **kw)
    expected, _ = ref(x, **kw)
    for i, (o, a, e) in enumerate(zip(out, again, expected)):
        assert torch.equal(o, a), f"{algo}[{i}]: two calls differ"
        assert_close(f"{algo}[{i}]", o, e, torch.float32)


GROUP_LENGTH_CASES = [(T, layout) for T in (1000, 1024) for layout in ("contig", "time_sliced")]


@pytest.mark.triton
@pytest.mark.parametrize("algo", ["retrace_discrete", "retrace_discrete_shifted"])
@pytest.mark.parametrize("T,layout", GROUP_LENGTH_CASES, ids=[f"T{t}-{lay}" for t, lay in GROUP_LENGTH_CASES])
def test_retrace_discrete_groups_need_a_constant_length(algo, T, layout, monkeypatch):
    """Rows of a length that is no multiple of 16 are read in groups only where the launch is compiled for that
    length: contiguous per-action tensors, not ones sliced along time out of longer rows (their T stays a run-time
    argument, with which the groups read wrong values on the GPU at 3 x 1000). Against the float64 reference."""
    x = make_rollout((3, T), -1, "random", n_actions=4, seed=T)
    if layout == "time_sliced":  # the same values, each row 4 steps shorter than its storage (rows 16-byte aligned)
        for k in ("pi", "q_values", "next_pi", "next_q_values"):
            x[k] = torch.cat([x[k], x[k][:, :4]], 1)[:, :T]
    launched = _spy_a_group(monkeypatch)
    call, ref, _ = ALGOS[algo]
    kw = {"gamma": GAMMA, **_coefs("retrace"), "time_dim": -1}
    out = call(x, backend="triton", **kw)
    expected, _ = ref(x, **kw)
    for i, (o, e) in enumerate(zip(out, expected)):
        assert_close(f"{algo}[{i}]", o, e, torch.float32)
    assert launched["A_GROUP"] == (0 if T % 16 and layout == "time_sliced" else 4)


def test_bad_inputs_retrace_discrete():
    x = _cpu_rollout((2, 5))
    pi, action, q, npi, nq, r, d = (x[k] for k in ("pi", "action", "q_values", "next_pi", "next_q_values", "reward",
                                                    "done"))
    mu = x["behavior_prob"]

    def call(**kw):
        a = {"pi": pi, "action": action, "q_values": q, "next_pi": npi, "next_q_values": nq, "reward": r, "done": d,
             "behavior_prob": mu, "gamma": 0.9}
        return retrace_discrete(**{**a, **kw})

    call()  # the valid call works
    with pytest.raises(TypeError, match="action"):
        call(action=action.float())
    with pytest.raises(ValueError, match="action"):
        call(action=action[:, :4])
    with pytest.raises(ValueError, match="action"):
        call(action=action + N_ACTIONS)
    with pytest.raises(ValueError, match="time_dim"):
        call(time_dim=-1)
    with pytest.raises(ValueError, match="behavior_prob and behavior_log_prob"):
        call(behavior_prob=None)
    with pytest.raises(ValueError, match="behavior_prob"):
        call(behavior_prob=mu[:, :4])
    with pytest.raises(TypeError, match="behavior_prob"):
        call(behavior_prob=mu.double())
    with pytest.raises(ValueError, match="next_q_values"):
        call(next_q_values=nq[..., :2])
    with pytest.raises(TypeError, match="reward"):
        call(reward=r.double())
    with pytest.raises(ValueError, match="reward"):
        call(reward=r[:, :4])


# ---------------------------------------------------------------------------------------------------------------
# GPU
# ---------------------------------------------------------------------------------------------------------------


GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (too slow for the interpreter)")
# (shape, window): as test_algorithms.VERY_LONG
VERY_LONG = [pytest.param((1, 2**20, 1), 4096, marks=GPU, id="B1-T2^20"),
             pytest.param((16, 2**16, 1), 4096, marks=GPU, id="B16-T2^16"),
             pytest.param((2, 512, 1), 128, id="B2-T512")]


def _trace_c(x, algo):
    """The traces c_t = lmbda min(c_bar, pi / mu) of the taken actions, float64 on the CPU (the defaults' numbers)."""
    if algo == "retrace":
        w = x["log_ratio"].cpu().double().exp()
    else:
        pi = x["pi"].cpu().double().gather(-1, x["action"].cpu().unsqueeze(-1)).squeeze(-1)
        w = pi / x["behavior_prob"].cpu().double()
    return COEFS["retrace"]["lmbda"] * w.clamp_max(COEFS["retrace"]["c_bar"])


# per algorithm: the state each step passes on to the step before it (h_t = vs_t - V_t; u_t = c_t (Q_ret_t - Q_t))
PASSED_ON = {"vtrace": lambda out, x, algo: out[1] - x["value"].cpu().double(),
             "retrace": lambda out, x, algo: _trace_c(x, algo) * out[1],
             "retrace_discrete": lambda out, x, algo: _trace_c(x, algo) * out[1]}


@pytest.mark.parametrize("pattern", ["random", "none"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("algo", list(PASSED_ON))
@pytest.mark.parametrize("shape,window", VERY_LONG)
@pytest.mark.triton
def test_very_long_sequence(algo, shape, window, dtype, pattern):
    """Long sequences with a carried state, against the float64 reference run on windows of ``window`` steps, each
    entering with the outputs' state at its edge (``_helpers.window_states``). V-trace's state at a window edge
    takes V there from the window's last next_state_value, so the rollout is made consistent (a collector's)."""
    call, ref, _ = ALGOS[algo]
    kw = {"gamma": GAMMA, **_coefs(algo)}
    x = make_rollout(shape, -2, pattern, dtype=dtype)
    x = _consistent(x, algo)
    h0 = _state_for(algo, x, -2, seed=7).to(dtype)
    *out, h = call(x, backend="triton", initial_state=h0, output_final_state=True, **kw)
    out = [o.cpu().double() for o in out]
    cpu = {k: windows(v.cpu().double() if v.is_floating_point() else v.cpu(), window) for k, v in x.items()}
    states = window_states(PASSED_ON[algo](out, x, algo), h0.cpu().double(), window, reverse=True)
    expected, h_expected = ref(cpu, initial_state=states, **kw)
    for i, (o, e) in enumerate(zip(out, expected)):
        assert_close(f"{algo}[{i}] (rows of {window}-step windows)", windows(o, window), e, dtype)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    assert_close(f"{algo} final state", h, h_expected.reshape(shape[0], -1, *h.shape[1:])[:, 0], acc)
