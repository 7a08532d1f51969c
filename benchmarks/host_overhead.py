"""Where the host time of one GAE call goes: our Python, Triton's launcher (or ours), and the kernel itself.

    python benchmarks/host_overhead.py [--B 4096] [--T 128]               # on a GPU
    python benchmarks/host_overhead.py --device cpu --B 64                # our Python only, anywhere

Prints one JSON line. Per call (host wall time, calls back to back, device drained once at the end; the best of
``--repeats`` measurements, to leave out most of the noise of other processes):

- ``gae_call_us``: the public ``gae`` call (GPU only);
- ``ours_python_us``: the same with the compiled kernel's own launcher (``CompiledKernel.run``, Triton's C launcher)
  replaced by a no-op: our validation, views, output allocation, and the launch plan's key and replay
  (``scan.launch``; ``kernels/_launcher.py``), all that is ours of a call. ``gae_call_us - ours_python_us`` is
  Triton's C launcher as the plans call it (pointers passed as ints);
- ``parts_us``: pieces of it timed alone on the same inputs: ``check_inputs``, both ``check_coef``,
  ``resolve_backend``, one ``rows_strides``, and the allocation of the two outputs (``scan.new_outputs``);
- ``triton_launch_us``: a bare ``kernel[grid](**kwargs)`` with the arguments prepared once (Triton's launch path);
- ``lean_launch_us``: the same launch through ``kernels._launcher`` (compiled kernel reused, tensors passed),
  reported only if its outputs equal the plain launch's (``lean_launch_ok``);
- ``device_us``: the kernel's device time.

With ``--device cpu`` the kernels would run in Triton's interpreter, so only the Python rows are measured (on CPU
tensors, with ``TRITON_INTERPRET=1`` and ``$RL_TRITON_TORCHRL_BACKEND=triton``, so that the "auto" backend takes the
Triton path as it does on CUDA; the CPU path adds one environment lookup of its own). Large CPU outputs are
allocated by the system allocator, page by page: a small ``--B`` (e.g. 64) leaves the Python alone.
"""
import argparse
import json
import os
import sys
import types


def parse_args():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--B", type=int, default=4096)
    parser.add_argument("--T", type=int, default=128)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--calls", type=int, default=2000, help="calls per wall-time measurement")
    parser.add_argument("--repeats", type=int, default=5, help="wall-time measurements per row; the best is kept")
    return parser.parse_args()


if __name__ == "__main__":
    ARGS = parse_args()
    if ARGS.device == "cpu":  # before triton is imported
        os.environ["TRITON_INTERPRET"] = "1"
        os.environ["RL_TRITON_TORCHRL_BACKEND"] = "triton"

import torch  # noqa: E402

from _common import device_time_us, environment, wall_time_us  # noqa: E402
from triton.runtime.jit import JITFunction  # noqa: E402
from rl_triton_torchrl.kernels import _launcher, _utils, gae, scan  # noqa: E402

gae_module = sys.modules["rl_triton_torchrl.kernels.gae"]


def timer(calls: int, repeats: int):
    """``fn -> us per call``: the best of ``repeats`` wall-time measurements of ``calls`` calls."""
    return lambda fn: min(wall_time_us(fn, calls) for _ in range(repeats))


class _NoLaunch:
    """Stands in for a ``CompiledKernel`` whose launch does nothing; records the plain call that "compiled" it.

    It has the metadata and signature of a compiled kernel, so that launch plans launch it natively
    (``_launcher.NativeLaunch``), on a driver call that does nothing (``python_only_us``)."""

    function = 1
    packed_metadata = (4, 1, 0)

    def run(self, *args):
        pass

    def compile(self, *args, grid, warmup, **kwargs):
        """What ``JITFunction.run`` is replaced with: keeps the grid and arguments, returns this kernel."""
        from triton.backends.compiler import GPUTarget
        from triton.compiler.compiler import make_backend
        from triton.runtime.jit import native_specialize_impl

        self.grid, self.kwargs = grid, kwargs
        backend = make_backend(GPUTarget("cuda", 90, 32))
        params = gae_module._gae_fwd_kernel.params
        signature = {p.name: "constexpr" if p.is_constexpr else
                     native_specialize_impl(backend, kwargs[p.name], False, True, True)[0] for p in params}
        self.src = types.SimpleNamespace(signature=signature)
        self.metadata = types.SimpleNamespace(num_warps=kwargs["num_warps"], num_ctas=1, shared=0,
                                              global_scratch_size=0, profile_scratch_size=0)
        return self


class _Driver:
    """Triton's driver on a machine without a GPU: device 0, stream 0."""

    def get_current_device(self):
        return 0

    def get_current_stream(self, device):
        return 0


def python_only_us(call, time_us) -> tuple[float, tuple, dict]:
    """Wall time of ``call`` with the GAE kernel's compiled launcher replaced by ``_NoLaunch``: a ``JITFunction`` of
    the same kernel, "compiled" by ``_NoLaunch.compile``, so that calls take the lean launch path as they do on a
    GPU (on the CPU, on a stand-in driver). Returns (us, grid, launch kwargs)."""
    real, stand_in = gae_module._gae_fwd_kernel, _NoLaunch()
    jit = JITFunction(real.fn)  # a compiled-kind JITFunction even under TRITON_INTERPRET=1
    jit.run = stand_in.compile
    active, libcuda = _launcher.driver._active, _launcher._LIBCUDA
    gae_module._gae_fwd_kernel = jit
    _launcher._LIBCUDA = (lambda *args: 0, None)  # the driver's launch, as a no-op
    scan._PLANS.clear()
    if not torch.cuda.is_available():
        _launcher.driver._active = _Driver()
    try:
        us = time_us(call)
    finally:
        gae_module._gae_fwd_kernel = real
        _launcher.driver._active, _launcher._LIBCUDA = active, libcuda
        scan._PLANS.clear()
    return us, stand_in.grid, stand_in.kwargs


def parts_us(r, v, nv, d, time_us) -> dict:
    """Our validation pieces timed alone on the inputs of the GAE call."""
    floats, flags = {"reward": r, "state_value": v, "next_state_value": nv}, {"done": d, "terminated": None}
    layout = _utils.check_inputs(-2, floats, flags, {"initial_state": None}, optional=("terminated",))
    return {
        "check_inputs": time_us(
            lambda: _utils.check_inputs(-2, floats, flags, {"initial_state": None}, optional=("terminated",))),
        "check_coef": time_us(
            lambda: (_utils.check_coef("gamma", 0.99, layout), _utils.check_coef("lmbda", 0.95, layout))),
        "resolve_backend": time_us(lambda: _utils.resolve_backend("auto", layout.device, r, v, nv, 0.99, 0.95, None)),
        "rows_strides": time_us(lambda: _utils.rows_strides(r, layout)),
        "outputs": time_us(lambda: scan.new_outputs(layout, 2)),
    }


def lean_launch(kernel, grid, kwargs: dict, time_us) -> dict:
    """The prepared launch through our launcher: checked against the plain launch's outputs, then timed."""
    kwargs = dict(kwargs)
    num_warps = kwargs.pop("num_warps")
    lean = _launcher.launcher(kernel)
    outputs = [kwargs[name] for name in ("adv_ptr", "vt_ptr")]
    kernel[grid](**kwargs, num_warps=num_warps)
    want = [y.clone() for y in outputs]
    ok = True
    for _ in range(3):  # the first call may take the plain path; the others must launch lean
        for y in outputs:
            y.fill_(float("nan"))
        lean(grid, num_warps, **kwargs)
        ok &= all(torch.equal(y, w) for y, w in zip(outputs, want))
    ok &= bool(lean.compiled) or not _launcher.LEAN_LAUNCH
    us = time_us(lambda: lean(grid, num_warps, **kwargs)) if ok else None
    return {"lean_launch_us": us, "lean_launch_ok": ok, "lean_enabled": _launcher.LEAN_LAUNCH}


def main(args):
    B, T, device, time_us = args.B, args.T, args.device, timer(args.calls, args.repeats)
    shape = (B, T, 1)
    r, v, nv = (torch.randn(shape, device=device) for _ in range(3))
    d = torch.rand(shape, device=device) < 0.02

    def call():
        return gae(r, v, nv, d, gamma=0.99, lmbda=0.95)

    out = {"B": B, "T": T, "device": device}
    if device == "cuda":
        out["gae_call_us"] = time_us(call)
    out["ours_python_us"], grid, kwargs = python_only_us(call, time_us)
    out["parts_us"] = parts_us(r, v, nv, d, time_us)
    out["kernel_args"] = len(kwargs)
    if device == "cuda":
        kernel = gae_module._gae_fwd_kernel
        out["triton_launch_us"] = time_us(lambda: kernel[grid](**kwargs))
        out.update(lean_launch(kernel, grid, kwargs, time_us))
        out["device_us"], _ = device_time_us(lambda: kernel[grid](**kwargs))
    out["environment"] = environment()
    print(json.dumps(out))


if __name__ == "__main__":
    main(ARGS)
