"""Forward-in-time algorithms (eligibility traces, episodic prefix sums), every path against its float64 reference.

One table (ALGOS) says how to call each algorithm and its reference; the tests sweep it over sequence lengths, flag
patterns, layouts (time-major, sliced, permuted, stride-0 flags shared by 64 features), dtypes, coefficient tensors,
carried states (a rollout cut in two, with and without an episode boundary at the cut), the multi-chunk path and
empty inputs, plus hand-computed examples and the argument checks.
"""
from __future__ import annotations

import pytest
import torch

from _helpers import BACKENDS, DEVICE, assert_close, case_id, randn, window_states, windows
from test_algorithms import make_inputs
from rl_triton_torchrl.kernels.reference import eligibility_traces_ref, episodic_prefix_sum_ref
from rl_triton_torchrl.kernels._utils import check_inputs, rows_strides
from rl_triton_torchrl.kernels.eligibility_traces import eligibility_traces
from rl_triton_torchrl.kernels.prefix_sum import episodic_prefix_sum

GAMMA, LMBDA, DISCOUNT = 0.97, 0.9, 0.95
PATTERNS = ("none", "all", "random")


def _traces(x, **kw):
    return eligibility_traces(x["reward"], x["done"], **kw)


def _traces_ref(x, **kw):
    return eligibility_traces_ref(x["reward"], x["done"], **kw)


def _prefix(reset):
    def call(x, **kw):
        return episodic_prefix_sum(x["reward"], x["done"], reset=reset, **kw)

    def ref(x, **kw):
        return episodic_prefix_sum_ref(x["reward"], x["done"], reset=reset, **kw)

    return call, ref


# name -> (call(inputs, **kw), reference(inputs, **kw) -> (output, final state), default coefficients)
ALGOS = {
    "traces": (_traces, _traces_ref, {"gamma": GAMMA, "lmbda": LMBDA}),
    "sum_after_done": (*_prefix("after_done"), {}),
    "sum_at_start": (*_prefix("at_start"), {}),
    "disc_after_done": (*_prefix("after_done"), {"discount": DISCOUNT}),
    "disc_at_start": (*_prefix("at_start"), {"discount": DISCOUNT}),
}


def run_and_check(algo, x, backend, *, time_dim=-2, initial_state=None, final_state=False, **coefs):
    """Calls ``algo`` on ``x`` and compares its output (and final state) to the reference."""
    call, ref, default = ALGOS[algo]
    kw = {**default, **coefs, "time_dim": time_dim, "initial_state": initial_state}
    out = call(x, backend=backend, output_final_state=final_state, **kw)
    expected, h_expected = ref(x, **kw)
    dtype = x["reward"].dtype
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    if final_state:
        out, h = out
        assert h.dtype == acc, f"{algo} final state dtype {h.dtype}"
        assert_close(f"{algo} final state", h, h_expected, acc)
    assert out.dtype == dtype and out.device == x["reward"].device, f"{algo} output {out.dtype} {out.device}"
    assert out.is_contiguous()
    assert_close(algo, out, expected, dtype)


def _state(shape, time_dim, seed=5):
    """A random carried state of the input shape without its time dimension."""
    s = list(shape)
    del s[time_dim]
    return randn(s, torch.Generator().manual_seed(seed))


T_SWEEP = [((3, T, 2), -2, p) for T in (1, 3, 63, 200, 1000) for p in PATTERNS]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(ALGOS))
@pytest.mark.parametrize("shape,time_dim,pattern", T_SWEEP, ids=[case_id(*c) for c in T_SWEEP])
def test_t_sweep(algo, backend, shape, time_dim, pattern):
    x = make_inputs(shape, time_dim, pattern)
    run_and_check(algo, x, backend, time_dim=time_dim, initial_state=_state(shape, time_dim), final_state=True)


def _shared_done(x):
    """The done flag of the first feature shared by all: a stride-0 expand, as for per-feature traces."""
    return {**x, "done": x["done"][..., :1].expand(x["done"].shape)}


LAYOUTS = [
    ((37, 4, 1), 0, "contig"),  # time-major
    ((2, 29, 3, 1), 1, "contig"),  # multi-agent
    ((2, 29, 64), 1, "shared_done"),  # per-feature traces, one done per step
    ((23, 2, 64), 0, "shared_done"),  # time-major, wide
    ((2, 29, 3, 2), 1, "broadcast"),  # every input stride 0 along the last dim
    ((3, 40, 2), 1, "sliced"),
    ((4, 31, 3), 1, "permuted"),
    ((2, 3, 45), -1, "permuted"),
    ((50,), 0, "contig"),
    ((3, 2, 17, 2), -2, "sliced"),
]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(ALGOS))
@pytest.mark.parametrize("shape,time_dim,layout", LAYOUTS, ids=[case_id(s, t, extra=lay) for s, t, lay in LAYOUTS])
def test_layouts(algo, backend, shape, time_dim, layout):
    if layout == "shared_done":
        x = _shared_done(make_inputs(shape, time_dim, "random"))
    else:
        x = make_inputs(shape, time_dim, "random", layout=layout)
    run_and_check(algo, x, backend, time_dim=time_dim)


def test_shared_done_is_not_copied():
    """An expanded flag is addressed with stride 0 over the features, in place."""
    x = _shared_done(make_inputs((2, 29, 64), -2, "random"))
    layout = check_inputs(-2, {"x": x["reward"]}, {"done": x["done"]})
    view, (so, st, si) = rows_strides(x["done"], layout)
    assert si == 0 and view.data_ptr() == x["done"].data_ptr()
    assert (so, st) == x["done"].stride()[:2]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(ALGOS))
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_dtypes(algo, backend, dtype):
    shape = (4, 63, 2)
    run_and_check(algo, make_inputs(shape, -2, "random", dtype=dtype), backend,
                  initial_state=_state(shape, -2).to(dtype), final_state=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(ALGOS))
def test_bool_like_values(algo, backend):
    """Ones as x: the episode length so far (and its discounted form), from bfloat16 inputs."""
    x = make_inputs((3, 200, 1), -2, "random", dtype=torch.bfloat16)
    x["reward"] = torch.ones_like(x["reward"])
    run_and_check(algo, x, backend, final_state=True)


@pytest.mark.parametrize("backend", BACKENDS)
def test_coefficient_tensors(backend):
    """Per-step coefficients (e.g. gamma ** steps), per-row ones, 0-d ones and stride-0 ones, as tensors."""
    shape = (3, 41, 2)
    x = make_inputs(shape)
    g = torch.Generator().manual_seed(1)
    per_step = (0.8 + 0.2 * torch.rand(shape, generator=g)).to(DEVICE)
    per_row = (0.5 + 0.5 * torch.rand(3, 1, 1, generator=g)).to(DEVICE)
    per_time = (0.8 + 0.2 * torch.rand(1, 41, 1, generator=g)).to(DEVICE)  # stride 0 over rows
    zero_d = torch.tensor(0.9, device=DEVICE)
    h0 = _state(shape, -2)
    run_and_check("traces", x, backend, gamma=per_step, lmbda=per_row, initial_state=h0, final_state=True)
    run_and_check("traces", x, backend, gamma=zero_d, lmbda=per_time, initial_state=h0, final_state=True)
    run_and_check("traces", x, backend, gamma=torch.tensor(0.95), lmbda=1.0)  # a CPU 0-d tensor is fine anywhere
    for algo in ("disc_after_done", "disc_at_start"):
        run_and_check(algo, x, backend, discount=per_step, initial_state=h0, final_state=True)
        run_and_check(algo, x, backend, discount=per_time.expand(shape), initial_state=h0, final_state=True)
        run_and_check(algo, x, backend, discount=zero_d)
    with pytest.raises(ValueError, match="discount must lie in"):  # range-checked on CPU tensors (CUDA: no sync)
        episodic_prefix_sum(x["reward"].cpu(), x["done"].cpu(), reset="at_start", discount=per_step.cpu() + 1.0,
                            backend="torch")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(ALGOS))
@pytest.mark.parametrize("shape,time_dim", [((3, 200, 1), -2), ((45, 2, 3), 0)], ids=["B3-T200", "T45-tdim0"])
def test_chunked_path(algo, backend, shape, time_dim, small_tiles):
    """With 16-step tiles and 32-element programs every sequence crosses many chunks and programs."""
    x = make_inputs(shape, time_dim, "random")
    run_and_check(algo, x, backend, time_dim=time_dim, initial_state=_state(shape, time_dim), final_state=True)
    run_and_check(algo, x, backend, time_dim=time_dim)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", ["traces", "sum_after_done", "disc_at_start"])
def test_long_sequence(algo, backend):
    """T = 3000 > MAX_BLOCK_T: the real chunk loop (two rows: two 2048-step tiles per row; the look-back mode
    from 4096 steps), with carries between tiles."""
    shape = (2, 3000, 1)
    run_and_check(algo, make_inputs(shape, -2, "random"), backend, initial_state=_state(shape, -2), final_state=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(ALGOS))
@pytest.mark.parametrize("cut_at_boundary", [False, True], ids=["cut-inside", "cut-at-boundary"])
@pytest.mark.parametrize("split", [1, 17, 39])
def test_carried_state(algo, backend, split, cut_at_boundary):
    """A rollout cut in two: the head's final state, fed to the tail, gives the uncut result.

    ``cut-at-boundary`` puts an episode boundary exactly at the cut (a done at the head's last step, an is_init at
    the tail's first step), so the reset has to cross the cut through the carried state.
    """
    call, ref, kw = ALGOS[algo]
    x = make_inputs((3, 40, 2), -2, "random")
    if cut_at_boundary:
        x["done"] = x["done"].clone()
        x["done"][:2, split - 1 if "after_done" in algo or algo == "traces" else split] = True
    h0 = _state((3, 40, 2), -2)
    head = {k: v[:, :split] for k, v in x.items()}
    tail = {k: v[:, split:] for k, v in x.items()}
    head_out, h_head = call(head, backend=backend, initial_state=h0, output_final_state=True, **kw)
    tail_out, h_tail = call(tail, backend=backend, initial_state=h_head, output_final_state=True, **kw)
    expected, h_expected = ref(x, initial_state=h0, **kw)
    assert_close(f"{algo} cut at {split}", torch.cat([head_out, tail_out], dim=1), expected)
    assert_close(f"{algo} final state", h_tail, h_expected, torch.float32)
    _, h_ref_head = ref(head, initial_state=h0, **kw)
    assert_close(f"{algo} head state", h_head, h_ref_head, torch.float32)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(ALGOS))
def test_empty(algo, backend):
    """T = 0 and an empty batch return empty outputs of the right shape, and a carried state passes through."""
    call, _, kw = ALGOS[algo]
    for shape in [(3, 0, 1), (0, 5, 1), (2, 0, 64)]:
        x = make_inputs(shape)
        out = call(x, backend=backend, **kw)
        assert out.shape == shape and out.dtype == torch.float32
        out, h = call(x, backend=backend, output_final_state=True, **kw)
        assert h.shape == (shape[0], shape[2]) and torch.equal(h, torch.zeros_like(h))
    x = make_inputs((3, 0, 1))
    h0 = torch.randn(3, 1, device=DEVICE)
    _, h = call(x, backend=backend, initial_state=h0, output_final_state=True, **kw)
    assert torch.equal(h, h0)


@pytest.mark.parametrize("backend", BACKENDS)
def test_hand_examples(backend):
    """Numbers worked out by hand: they pin the conventions (and check the references too)."""
    ones = torch.ones(1, 6, 1, device=DEVICE)
    done = torch.tensor([False, True, False, False, False, True], device=DEVICE).view(1, 6, 1)
    is_init = torch.tensor([False, False, True, False, False, False], device=DEVICE).view(1, 6, 1)
    h0 = torch.full((1, 1), 10.0, device=DEVICE)
    cases = [
        # episode length so far; the done at the last step zeroes the carried state
        (episodic_prefix_sum(ones, done, reset="after_done", initial_state=h0, output_final_state=True,
                             backend=backend), [11, 12, 1, 2, 3, 4], 0.0),
        # is_init restarts at its own step; the carried state is the last sum
        (episodic_prefix_sum(ones, is_init, reset="at_start", initial_state=h0, output_final_state=True,
                             backend=backend), [11, 12, 1, 2, 3, 4], 4.0),
        # decayed sum: S = 0.5 S + 1
        (episodic_prefix_sum(ones, done, reset="after_done", discount=0.5, initial_state=h0,
                             output_final_state=True, backend=backend), [6, 4, 1, 1.5, 1.75, 1.875], 0.0),
        # traces: e = 0.5 * 0.5 e + x, restarting after each done
        (eligibility_traces(ones, done, gamma=0.5, lmbda=0.5, initial_state=h0, output_final_state=True,
                            backend=backend), [3.5, 1.875, 1, 1.25, 1.3125, 1.328125], 0.0),
    ]
    refs = [
        episodic_prefix_sum_ref(ones, done, reset="after_done", initial_state=h0),
        episodic_prefix_sum_ref(ones, is_init, reset="at_start", initial_state=h0),
        episodic_prefix_sum_ref(ones, done, reset="after_done", discount=0.5, initial_state=h0),
        eligibility_traces_ref(ones, done, gamma=0.5, lmbda=0.5, initial_state=h0),
    ]
    for i, ((out, h), values, h_value) in enumerate(cases):
        expected = torch.tensor(values, dtype=torch.float64).view(1, 6, 1)
        assert_close(f"case {i}", out, expected)
        assert_close(f"case {i} state", h, torch.full((1, 1), h_value, dtype=torch.float64))
        assert_close(f"case {i} reference", refs[i][0], expected)
        assert_close(f"case {i} reference state", refs[i][1], torch.full((1, 1), h_value, dtype=torch.float64))


@pytest.mark.parametrize("backend", BACKENDS)
def test_conventions_agree(backend):
    """The same episodes flagged both ways (is_init_t = done_(t-1)) give the same sums; traces are the
    after_done prefix sum with discount gamma * lmbda."""
    x = make_inputs((3, 63, 4), -2, "random")
    r, done = x["reward"], x["done"]
    is_init = torch.zeros_like(done)
    is_init[:, 1:] = done[:, :-1]
    h0 = _state((3, 63, 4), -2)
    expected, _ = episodic_prefix_sum_ref(r, done, reset="after_done", discount=0.9, initial_state=h0)
    # the oracle has the property: is_init flags give the same sums, and traces are the decayed prefix sum
    assert_close("reference at_start", episodic_prefix_sum_ref(r, is_init, reset="at_start", discount=0.9,
                                                               initial_state=h0)[0], expected)
    expected_e, _ = eligibility_traces_ref(r, done, gamma=0.9, lmbda=0.5, initial_state=h0)
    assert_close("reference traces", episodic_prefix_sum_ref(r, done, reset="after_done", discount=0.45,
                                                             initial_state=h0)[0], expected_e)
    # and each call is the oracle's answer
    assert_close("after_done", episodic_prefix_sum(r, done, reset="after_done", discount=0.9, initial_state=h0,
                                                   backend=backend), expected)
    assert_close("at_start", episodic_prefix_sum(r, is_init, reset="at_start", discount=0.9, initial_state=h0,
                                                 backend=backend), expected)
    assert_close("traces", eligibility_traces(r, done, gamma=0.9, lmbda=0.5, initial_state=h0, backend=backend),
                 expected_e)
    assert_close("prefix sum 0.45", episodic_prefix_sum(r, done, reset="after_done", discount=0.45,
                                                        initial_state=h0, backend=backend), expected_e)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize(
    "reset", ["after", "AT_START", "at-start", "is_init", "done", "", None, 1, True, ("at_start",)], ids=repr
)
def test_reset_rejects_anything_else(reset, backend):
    x = make_inputs((2, 5, 1))
    with pytest.raises(ValueError, match="reset must be one of"):
        episodic_prefix_sum(x["reward"], x["done"], reset=reset, backend=backend)


def test_reset_is_required():
    x = make_inputs((2, 5, 1))
    with pytest.raises(TypeError, match="reset"):
        episodic_prefix_sum(x["reward"], x["done"])


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_inputs(backend):
    x = make_inputs((2, 5, 4))
    r, done = x["reward"], x["done"]

    def traces(*args, **kw):
        return eligibility_traces(*args, backend=backend, **{"gamma": 0.9, "lmbda": 0.9, **kw})

    def psum(*args, **kw):
        return episodic_prefix_sum(*args, backend=backend, **{"reset": "after_done", **kw})

    for fn in (traces, psum):
        name = "done" if fn is traces else "boundary"
        with pytest.raises(TypeError, match=name):
            fn(r, done.float())
        with pytest.raises(TypeError, match=name):
            fn(r, None)
        with pytest.raises(TypeError, match="x must be a floating-point"):
            fn(r.long(), done)
        with pytest.raises(TypeError, match="x must be a torch.Tensor"):
            fn(r.tolist(), done)
        with pytest.raises(ValueError, match=f"{name} has shape"):
            fn(r, done[..., :1])  # a shared flag must be expanded (stride 0, no copy)
        with pytest.raises(ValueError, match="initial_state has shape"):
            fn(r, done, initial_state=torch.zeros(2, 5, device=DEVICE))
        with pytest.raises(TypeError, match="initial_state must be a floating-point"):
            fn(r, done, initial_state=torch.zeros(2, 4, dtype=torch.long, device=DEVICE))
        with pytest.raises(ValueError, match="time_dim"):
            fn(r, done, time_dim=3)
    with pytest.raises(ValueError, match="backend"):
        eligibility_traces(r, done, gamma=0.9, lmbda=0.9, backend="gpu")
    with pytest.raises(ValueError, match="backend"):
        episodic_prefix_sum(r, done, reset="at_start", backend="gpu")
    with pytest.raises(ValueError, match="gamma"):
        traces(r, done, gamma=1.5)
    with pytest.raises(ValueError, match="lmbda"):
        traces(r, done, lmbda=-0.1)
    with pytest.raises(TypeError, match="gamma"):
        traces(r, done, gamma="0.9")
    with pytest.raises(ValueError, match="gamma has shape"):
        traces(r, done, gamma=torch.full((3, 5, 4), 0.9, device=DEVICE))
    with pytest.raises(ValueError, match="discount"):
        psum(r, done, discount=1.1)
    with pytest.raises(TypeError, match="discount"):
        psum(r, done, discount=torch.ones(2, 5, 4, dtype=torch.long, device=DEVICE))


GPU = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (too slow for the interpreter)")
# (shape, window): a million steps in one row, 16 rows of 65536, 64 features of 16384 steps (on a GPU), and a short
# case that runs everywhere (it checks the windowed oracle itself)
VERY_LONG = [pytest.param((1, 2**20, 1), 4096, marks=GPU, id="B1-T2^20"),
             pytest.param((16, 2**16, 1), 4096, marks=GPU, id="B16-T2^16"),
             pytest.param((4, 2**14, 64), 4096, marks=GPU, id="B4-T2^14-F64"),
             pytest.param((2, 512, 3), 128, id="B2-T512-F3")]
# per algorithm: the state each step passes on to the next one (the reset after a done step applied, or not)
PASSED_ON = {"traces": lambda out, x: torch.where(x["done"].cpu(), 0.0, out),
             "sum_after_done": lambda out, x: torch.where(x["done"].cpu(), 0.0, out),
             "disc_at_start": lambda out, x: out}


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("algo", list(PASSED_ON))
@pytest.mark.parametrize("shape,window", VERY_LONG)
@pytest.mark.triton
def test_very_long_sequence(algo, shape, window, dtype):
    """Long sequences, flags shared over F by a stride-0 expand, a carried state in and out, against the float64
    reference run on windows of ``window`` steps, each entering with the outputs' state at its edge
    (``_helpers.window_states``): every window is checked against the recurrence, without a float64 loop over a
    million steps."""
    call, ref, kw = ALGOS[algo]
    x = _shared_done(make_inputs(shape, -2, "random", dtype=dtype))
    h0 = _state(shape, -2).to(dtype)
    out, h = call(x, backend="triton", initial_state=h0, output_final_state=True, **kw)
    out = out.cpu().double()
    cpu = {k: windows(v.cpu().double() if v.is_floating_point() else v.cpu(), window) for k, v in x.items()}
    states = window_states(PASSED_ON[algo](out, x), h0.cpu().double(), window, reverse=False)
    expected, h_expected = ref(cpu, initial_state=states, **kw)
    assert_close(f"{algo} (rows of {window}-step windows)", windows(out, window), expected, dtype)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    assert_close(f"{algo} final state", h, h_expected.reshape(shape[0], -1, shape[2])[:, -1], acc)
