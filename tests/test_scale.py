"""Scale, GPU only (marked ``gpu_scale``): more than 2^31 elements in one call, sequences of 2^22 steps, and the peak
device memory of a call, which must not exceed its outputs plus a small workspace.

    python -m pytest tests/test_scale.py -m gpu_scale -s -q

prints one ``SCALE`` line per call (shape, input and output sizes, the memory a call takes beyond its inputs, time).
The 2^31 tests need about 50 GiB of GPU memory. Under pytest-xdist they take turns (``_one_at_a_time``): on one
80 GB card 14 workers running them at once ran out of memory.
"""
from __future__ import annotations

import gc
import os
import tempfile

import pytest
import torch

try:
    import fcntl
except ImportError:  # not on Windows: no lock there
    fcntl = None

from _algos import TABLE, as_tuple, state_shape
from _helpers import assert_close
from rl_triton_torchrl import kernels as K
from rl_triton_torchrl.kernels import reference as R

pytestmark = [
    pytest.mark.gpu_scale,
    pytest.mark.triton,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]
GiB, MiB = 2**30, 2**20
ROWS, STEPS = 2**16 + 1, 2**15 + 1  # 2_147_581_953 elements, just over 2^31 = 2_147_483_648
WORKSPACE = 16 * MiB  # what a fused call may allocate beyond its outputs (allocator rounding)
N_ACTIONS = 3


@pytest.fixture(autouse=True)
def _one_at_a_time():
    """Holds an exclusive lock on a file shared by every pytest process of this machine for the test's duration,
    so that no two scale tests share the GPU (each needs most of its memory), and returns the memory the test's
    process cached before the next one's turn. Uncontended in a single process."""
    if fcntl is None:
        yield
        return
    path = os.path.join(tempfile.gettempdir(), f"rl_triton_torchrl_gpu_scale_{os.getuid()}.lock")
    with open(path, "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            # H100, 6 workers: a worker done with its test kept 50 GiB cached, and the next test ran out of memory
            gc.collect()
            torch.cuda.empty_cache()
            fcntl.flock(lock, fcntl.LOCK_UN)


def _bytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if isinstance(t, torch.Tensor))


def _allocations(snapshot: dict, min_bytes: int) -> list[str]:
    """The allocations of at least ``min_bytes`` in a recorded memory trace (``torch.cuda.memory._snapshot``), each
    with the innermost Python frames outside torch that made it."""
    found = []
    for trace in snapshot.get("device_traces", []):
        for event in trace:
            if event.get("action") == "alloc" and event.get("size", 0) >= min_bytes:
                frames = [f"{f['filename'].rsplit('/', 1)[-1]}:{f['line']} {f['name']}" for f in event.get("frames", [])
                          if "/torch/" not in f["filename"]][:5]
                found.append(f"{event['size'] / MiB:.1f} MiB at " + " <- ".join(frames))
    return found


def _measured_call(label, fn, inputs, allowance=WORKSPACE):
    """Runs ``fn()`` once, prints its figures, and asserts that the device memory it took beyond ``inputs`` (already
    allocated) is at most its outputs plus ``allowance``; the failure lists every allocation of 1 MiB or more the call
    made (its memory is recorded: an extra allocation was seen in runs on several workers only, never alone)."""
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.memory._record_memory_history(max_entries=10_000)
    try:
        start.record()
        out = as_tuple(fn())
        end.record()
        torch.cuda.synchronize()
        snapshot = torch.cuda.memory._snapshot()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    extra = torch.cuda.max_memory_allocated() - before
    out_bytes = _bytes(out)
    print(f"\nSCALE {label}: inputs {_bytes(inputs) / GiB:.2f} GiB, outputs {out_bytes / GiB:.2f} GiB, "
          f"peak - before {extra / GiB:.3f} GiB, workspace {(extra - out_bytes) / MiB:.1f} MiB, "
          f"{start.elapsed_time(end):.1f} ms ({torch.cuda.get_device_name()})", flush=True)
    assert extra <= out_bytes + allowance, (f"{label}: the call took {(extra - out_bytes) / MiB:.1f} MiB beyond its "
                                            f"outputs (allowed {allowance / MiB:.1f} MiB); its allocations:\n"
                                            + "\n".join(_allocations(snapshot, MiB)))
    return out


@pytest.mark.parametrize("layout", ["batch_major", "time_major"])
@pytest.mark.parametrize("algo", ["gae", "discounted_return"])
def test_more_than_2_31_elements(algo, layout):
    """One call over 2^31 + 98_305 float32 elements; the rows checked against the float64 reference include the
    last ones, whose element offsets exceed 2^31 (batch-major: the last rows; time-major: the last steps of every
    row)."""
    shape, time_dim = ((ROWS, STEPS), -1) if layout == "batch_major" else ((STEPS, ROWS), 0)
    assert torch.Size(shape).numel() > 2**31
    g = torch.Generator(device="cuda").manual_seed(0)
    reward = torch.randn(shape, device="cuda", generator=g)
    done = torch.rand(shape, device="cuda", generator=g) < 1e-3
    terminated = done & (torch.rand(shape, device="cuda", generator=g) < 0.5)
    kw = {"gamma": 0.99, "time_dim": time_dim}
    if algo == "gae":
        value = torch.randn(shape, device="cuda", generator=g)
        next_value = torch.randn(shape, device="cuda", generator=g)
        inputs = (reward, value, next_value, done, terminated)
        outs = _measured_call(f"gae {layout} {shape}", lambda: K.gae(*inputs, lmbda=0.95, backend="triton", **kw),
                              inputs)
    else:
        inputs = (reward, done)
        outs = _measured_call(f"discounted_return {layout} {shape}",
                              lambda: K.discounted_return(reward, done, backend="triton", **kw), inputs)
    rows = torch.tensor([0, 1, ROWS // 2, ROWS - 2, ROWS - 1], device="cuda")

    def pick(t):  # the checked rows, as [5, T]
        return (t.index_select(0, rows) if layout == "batch_major" else t.index_select(1, rows).t()).cpu()

    if algo == "gae":
        expected = R.gae_ref(*(pick(t) for t in inputs), gamma=0.99, lmbda=0.95, time_dim=-1)[:2]
    else:
        expected = (R.discounted_return_ref(pick(reward), pick(done), gamma=0.99, time_dim=-1),)
    for i, (o, e) in enumerate(zip(outs, expected)):
        assert_close(f"{algo}[{i}] rows {rows.tolist()}", pick(o), e, torch.float32)


def _rollout(shape, dtype, p_done, seed=0):
    """A rollout built on the GPU (the CPU generator of ``make_rollout`` is slow at this size), the same fields."""
    g = torch.Generator(device="cuda").manual_seed(seed)

    def randn(s=shape):
        return torch.randn(s, device="cuda", generator=g, dtype=torch.float64).to(dtype)

    done = torch.rand(shape, device="cuda", generator=g) < p_done
    per_action = (*shape, N_ACTIONS)
    return {
        "reward": randn(), "value": randn(), "next_value": randn(), "log_pi": randn(), "log_mu": randn(),
        "log_ratio": randn(), "done": done, "terminated": done & (torch.rand(shape, device="cuda", generator=g) < 0.5),
        "pi": torch.softmax(randn(per_action).double(), -1).to(dtype),
        "next_pi": torch.softmax(randn(per_action).double(), -1).to(dtype),
        "q_values": randn(per_action), "next_q_values": randn(per_action),
        "action": torch.randint(N_ACTIONS, shape, device="cuda", generator=g),
        "behavior_prob": (0.1 + 0.9 * torch.rand(shape, device="cuda", generator=g, dtype=torch.float64)).to(dtype),
    }


@pytest.mark.parametrize("case", ["float32-rare_dones", "float64-no_dones-gamma1"])
@pytest.mark.parametrize("algo", list(TABLE))
def test_2_22_steps(algo, case):
    """2^22 steps in two rows against the float64 torch path on the GPU (itself checked against the float64
    reference wherever a Python loop over the steps is affordable). float32 with episodes of ~10^4 steps; float64
    without any episode end and gamma = 1 where the algorithm has one, the hardest case for accumulated error."""
    dtype = torch.float32 if case.startswith("float32") else torch.float64
    shape = (2, 2**22, 1)
    x = _rollout(shape, dtype, p_done=1e-4 if dtype == torch.float32 else 0.0)
    call, _, coefs = TABLE[algo]
    if dtype == torch.float64 and "gamma" in coefs:
        coefs = coefs | {"gamma": 1.0}
    kw = {**coefs, "initial_state": torch.randn(state_shape(x, -2), device="cuda"), "output_final_state": True}
    inputs = [v for v in x.values()]
    # per-step tensors allocated before the kernel by the test's call: retrace's ratio = exp(log_ratio), the log of
    # behavior_prob (retrace_discrete's gathers and sum over actions are its kernel's: on the GPU its calls took
    # nothing beyond their outputs, 3c3dc46)
    n_steps = {"retrace_ratio": 1, "retrace_discrete_log": 1}.get(algo, 0)
    out = _measured_call(f"{algo} {case} {shape}", lambda: call(x, backend="triton", **kw), inputs,
                         WORKSPACE + n_steps * x["reward"].numel() * x["reward"].element_size())
    x64 = {k: (v.double() if v.is_floating_point() else v) for k, v in x.items()}
    expected = as_tuple(call(x64, backend="torch", **kw))
    for i, (o, e) in enumerate(zip(out, expected)):
        assert_close(f"{algo}[{i}]", o, e, dtype)
