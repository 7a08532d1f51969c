"""Property-based parity (hypothesis): every algorithm, both paths, against the float64 references.

Each example is a case drawn as plain data (``cases``), then built into a rollout: shapes of 1 to 4 dims with up to
``MAX_T`` = 300 steps, any time_dim, memory layouts (contiguous, sliced, permuted/transposed, stride-0 broadcast),
dtypes, coefficients (numbers, edges included, or per-step tensors broadcast over some dims), carried states, and
the flags drawn directly: terminations and truncations at drawn steps, shifted from row to row, or every step done,
and the kind of the last step (none, terminated, truncated) set explicitly. The Triton path runs under drawn tile
settings (``TILES``: small tiles, so that the chunk loop and several programs run at any T; the look-back mode
with one row or with segments per chunk; the short-sequence tiles), set for the call and restored after it. The
linear-scan property draws a time-varying ``a`` with zeros (episode cuts) and NaN/inf entries.

The cases a fixed draw might miss are ``@example``\\ s of every test: T = 1, every step done, a termination or a
truncation at the last step, no flag at all, each with tile settings that cross chunks.

CI runs ``HYPOTHESIS_EXAMPLES`` (default 5) generated examples per test besides those, derandomized (the same
examples every run, so a failure reproduces); more examples draw fresh ones every run (on a GPU the Triton path is
the real kernel):

    HYPOTHESIS_EXAMPLES=500 python -m pytest tests/test_properties.py -q
"""
from __future__ import annotations

import contextlib
import math
import os

import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st

from _algos import TABLE, as_tuple, make_rollout, relayout, state_shape
from _helpers import BACKENDS, DEVICE, assert_close
from rl_triton_torchrl import kernels as K
from rl_triton_torchrl.kernels import reference as R
from rl_triton_torchrl.kernels import scan
from test_launch_modes import KERNELS

EXAMPLES = int(os.environ.get("HYPOTHESIS_EXAMPLES", "5"))
# No health check is suppressed: the cases are drawn without filters, in small buffers, quickly; what is slow is
# running them (Triton's interpreter), which the health checks do not time (deadline=None: nor does hypothesis).
SETTINGS = settings(max_examples=EXAMPLES, deadline=None, derandomize=EXAMPLES <= 10)
DTYPES = [torch.float64, torch.float32, torch.bfloat16, torch.float16]
LAYOUTS = ["contig", "sliced", "permuted", "broadcast"]
THRESHOLDS = ("rho_thresh", "c_thresh", "c_bar")  # clipping thresholds: [0, inf); the others lie in [0, 1]
COEFS = ("gamma", "lmbda", "rho_thresh", "c_thresh", "c_bar", "discount")  # every algorithm's are among these
MAX_T = 300
MAX_ROWS = 8  # the non-time dims hold at most this many elements (the interpreter's time grows with the programs)
# Tile settings of the Triton path -> (scan constants, longest T drawn with them). The interpreter runs programs and
# chunks one after another: the smaller the tiles, the shorter the sequences drawn.
TILES = {
    "default": ({}, MAX_T),  # few rows: one wide tile per row (300 steps: one 512-step tile)
    "rows128": ({"WIDE_MAX_ROWS": 0}, MAX_T),  # 128-step row tiles: 300 steps are three chunks
    "tiles16": ({"MAX_BLOCK_T": 16, "TILE_ELEMENTS": 32, "WIDE_MAX_ROWS": 0}, 128),  # 2 rows per program
    "tiles8": ({"MAX_BLOCK_T": 8, "TILE_ELEMENTS": 8, "WIDE_MAX_ROWS": 0}, 48),  # 1 row per program
    # 16-step wide tiles (no WIDE_LONG_T-step tiles, which would take these rows whole)
    "wide_chunks": ({"MAX_BLOCK_T": 8, "WIDE_MAX_T": 16, "WIDE_4_WARPS_MAX_T": {}, "WIDE_LONG_MAX_ROWS": {}}, 64),
    "short": ({"SHORT_BLOCK_R": 4}, 8),  # 5-8 steps in 8-step tiles of 4 rows from 4 rows on
    "lookback": ({"LOOKBACK_MIN_T": 0, "LOOKBACK_MAX_ROWS": 10**9, "LOOKBACK_BLOCK_T": 32, "LOOKBACK_WINDOW": -2,
                  "LOOKBACK_SEGMENTED": frozenset()}, 96),  # one program per 32-step chunk, the sparse window
    "lookback_segments": ({"LOOKBACK_MIN_T": 0, "LOOKBACK_MAX_ROWS": 10**9, "LOOKBACK_SEGMENTS": 4,
                           "LOOKBACK_SEGMENT_T": 8, "LOOKBACK_SEGMENTED": KERNELS, "LOOKBACK_WINDOW": 2}, 96),
}
KINDS = {"none": 0, "terminated": 1, "truncated": 2}  # a step's flag kind; every termination is also done


@contextlib.contextmanager
def tile_settings(name: str):
    """The scan constants of ``TILES[name]`` for the duration of one call (launch plans key them)."""
    changes = TILES[name][0]
    old = {k: getattr(scan, k) for k in changes}
    try:
        for k, v in changes.items():
            setattr(scan, k, v)
        yield
    finally:
        for k, v in old.items():
            setattr(scan, k, v)


@st.composite
def cases(draw):
    """A case as plain data (so that ``@example`` can give one): see ``build``."""
    tiles = draw(st.sampled_from(list(TILES)))
    ndim = draw(st.integers(1, 4))
    time_dim = draw(st.integers(-ndim, ndim - 1))
    shape, rows = [], 1
    for _ in range(ndim - 1):  # the other dims, within MAX_ROWS elements
        n = draw(st.integers(1, max(1, min(4, MAX_ROWS // rows))))
        shape.append(n)
        rows *= n
    T = draw(st.integers(5, 8) if tiles == "short" else st.integers(1, TILES[tiles][1]))
    shape.insert(time_dim % ndim, T)
    if draw(st.booleans()):
        flags = {"all_done": True}
    else:  # drawn terminations and truncations, each row's shifted by a drawn stride
        events = draw(st.lists(st.tuples(st.integers(0, T - 1), st.sampled_from(["terminated", "truncated"])),
                               max_size=max(1, T // 4)))
        flags = {"events": events, "shift": draw(st.integers(0, 7))}
    flags["last"] = draw(st.sampled_from([None, "none", "terminated", "truncated"]))  # None: as drawn
    coefs = {}
    for name in COEFS:
        high = 3.0 if name in THRESHOLDS else 1.0
        if draw(st.booleans()):  # a number, edges included
            coefs[name] = ("number", draw(st.one_of(st.sampled_from([0.0, high]), st.floats(0.0, high))))
        else:  # a per-step tensor, broadcast over the dims where it has size 1
            coefs[name] = ("tensor", tuple(draw(st.booleans()) for _ in shape))
    return {"shape": tuple(shape), "time_dim": time_dim, "tiles": tiles, "flags": flags, "coefs": coefs,
            "dtype": draw(st.sampled_from(DTYPES)), "layout": draw(st.sampled_from(LAYOUTS)),
            "state": draw(st.booleans()), "seed": draw(st.integers(0, 2**16))}


def _flags(case):
    """(done, terminated) bool tensors of the case's shape."""
    shape, time_dim, f = case["shape"], case["time_dim"] % len(case["shape"]), case["flags"]
    T = shape[time_dim]
    kinds = torch.zeros(T, dtype=torch.int64)
    if f.get("all_done"):
        kinds[:] = KINDS["truncated"]
        kinds[::2] = KINDS["terminated"]
    else:
        for t, kind in f["events"]:
            kinds[t % T] = KINDS[kind]
    other = [n for i, n in enumerate(shape) if i != time_dim]
    rows = math.prod(other)
    per_row = torch.stack([kinds.roll(r * f.get("shift", 0)) for r in range(rows)])  # [rows, T]
    if f["last"] is not None:
        per_row[:, -1] = KINDS[f["last"]]
    per_row = per_row.reshape(*other, T).movedim(-1, time_dim)
    return (per_row > 0).to(DEVICE), (per_row == KINDS["terminated"]).to(DEVICE)


def build(case, coef_names=()):
    """The case's rollout (``make_rollout``'s fields, the drawn flags, its layout) and keyword arguments (time_dim,
    the coefficients in ``coef_names``, the initial state)."""
    shape, time_dim, dtype = case["shape"], case["time_dim"], case["dtype"]
    x = make_rollout(shape, time_dim, "none", dtype=dtype, seed=case["seed"])
    x["done"], x["terminated"] = _flags(case)
    x = relayout(x, case["layout"], time_dim)
    g = torch.Generator().manual_seed(case["seed"] + 1)
    kw = {"time_dim": time_dim}
    for name in coef_names:
        kind, value = case["coefs"][name]
        high = 3.0 if name in THRESHOLDS else 1.0
        if kind == "number":
            kw[name] = value
        else:
            coef_shape = [n if keep else 1 for n, keep in zip(shape, value)]
            kw[name] = (high * torch.rand(coef_shape, generator=g, dtype=torch.float64)).to(dtype).to(DEVICE)
    if case["state"]:
        kw["initial_state"] = torch.randn(state_shape(x, time_dim), generator=g).to(DEVICE)
    return x, kw


def _case(shape, time_dim, tiles, flags, dtype=torch.float32, layout="contig", state=True, seed=1, tensors=True):
    """An explicit case (``@example``): per-step tensor coefficients, or numbers."""
    coefs = {name: (("tensor", tuple(True for _ in shape)) if tensors else ("number", 0.9)) for name in COEFS}
    return {"shape": shape, "time_dim": time_dim, "tiles": tiles, "flags": flags, "coefs": coefs, "dtype": dtype,
            "layout": layout, "state": state, "seed": seed}


# Every test runs these besides the drawn ones.
EXAMPLE_CASES = [
    _case((3, 1, 2), -2, "default", {"events": [], "last": "terminated"}),  # T = 1
    _case((2, 40, 1), -2, "tiles16", {"all_done": True, "last": None}, tensors=False),  # every step done
    _case((2, 70, 1), 1, "lookback", {"events": [(5, "truncated"), (40, "terminated")], "shift": 3,
                                      "last": "terminated"}),  # a termination at the last step
    _case((300, 2), 0, "default", {"events": [(127, "terminated"), (128, "truncated")], "shift": 1,
                                   "last": "truncated"}, dtype=torch.float64),  # a truncation at the last step
    _case((1, 2, 45), -1, "tiles8", {"events": [], "last": "none"}, layout="permuted", state=False),  # no flag
]


# The linear-scan property's other arguments in those examples: both directions, non-finite a inside, at the first
# and at the last step
SCAN_EXAMPLE_ARGS = [{"reverse": False, "nonfinite": [(0, math.inf)]},
                     {"reverse": True, "nonfinite": []},
                     {"reverse": True, "nonfinite": [(20, math.inf), (50, -math.inf)]},
                     {"reverse": False, "nonfinite": [(129, math.nan), (299, math.inf)]},
                     {"reverse": True, "nonfinite": [(44, -math.inf), (10, math.nan)]}]


def with_examples(extra=None):
    """``@example`` of every case of ``EXAMPLE_CASES`` (with the other arguments of ``extra``, one dict per case)."""
    def decorate(test):
        for i, case in enumerate(EXAMPLE_CASES):
            test = example(case=case, **(extra[i] if extra else {}))(test)
        return test
    return decorate


def _check(algo, backend, case):
    call, ref, defaults = TABLE[algo]
    x, kw = build(case, tuple(defaults))
    dtype = x["reward"].dtype
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    with tile_settings(case["tiles"]):
        out = as_tuple(call(x, backend=backend, output_final_state=True, **kw))
    expected, h_expected = ref(x, **kw)
    expected = as_tuple(expected)
    assert len(out) == len(expected) + 1
    for i, (o, e) in enumerate(zip(out, expected)):
        assert o.dtype == dtype and o.shape == e.shape and o.device == x["reward"].device, f"{algo}[{i}]"
        assert_close(f"{algo}[{i}]", o, e, dtype)
    assert out[-1].dtype == acc
    assert_close(f"{algo} final state", out[-1], h_expected, acc)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("algo", list(TABLE))
@SETTINGS
@with_examples()
@given(case=cases())
def test_algorithm_property(algo, backend, case):
    _check(algo, backend, case)


def _assert_close_nonfinite(name, actual, expected, dtype):
    """Non-finite exactly where the reference is (a NaN and an inf count alike), ``assert_close`` elsewhere."""
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    if not torch.equal(a.isfinite(), e.isfinite()):
        idx = tuple(int(i) for i in (a.isfinite() != e.isfinite()).nonzero()[0])
        raise AssertionError(f"{name}: finite where the reference is not, or the reverse; first at {idx}: got "
                             f"{a[idx].item()!r}, expected {e[idx].item()!r}")
    assert_close(name, torch.where(e.isfinite(), a, 0.0), torch.where(e.isfinite(), e, 0.0), dtype)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # the interpreter's NaN arithmetic
@pytest.mark.parametrize("backend", BACKENDS)
@SETTINGS
@with_examples(SCAN_EXAMPLE_ARGS)
@given(case=cases(), reverse=st.booleans(),
       nonfinite=st.lists(st.tuples(st.integers(0, MAX_T - 1), st.sampled_from([math.nan, math.inf, -math.inf])),
                          max_size=3))
def test_linear_scan_property(case, reverse, nonfinite, backend):
    """A time-varying ``a`` in [0, 1) with zeros at the done steps (episode cuts) and NaN/inf at drawn steps. A
    non-finite ``a`` must give non-finite outputs exactly where the sequential reference has them (the scan's
    compositions may give NaN where the sequence gives inf, as test_nonfinite allows for every algorithm)."""
    x, kw = build(case)
    dtype, time_dim = case["dtype"], case["time_dim"]
    g = torch.Generator().manual_seed(case["seed"] + 2)
    a = torch.rand(x["reward"].shape, generator=g, dtype=torch.float64).to(DEVICE)
    a = torch.where(x["done"], 0.0, a)
    T = case["shape"][time_dim]
    for t, value in nonfinite:  # at step t of every row
        a.select(time_dim, t % T).fill_(value)
    a = a.to(dtype)
    with tile_settings(case["tiles"]):
        h, ht = K.linear_scan(a, x["reward"], reverse=reverse, output_final_state=True, backend=backend, **kw)
    ref, ht_ref = R.linear_scan_ref(a, x["reward"], reverse=reverse, **kw)
    acc = torch.float64 if dtype == torch.float64 else torch.float32
    _assert_close_nonfinite("h", h, ref, dtype)
    _assert_close_nonfinite("final state", ht, ht_ref, acc)
