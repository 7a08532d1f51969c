"""Input checks, layouts and backend choice shared by every algorithm.

Nothing here knows an algorithm: the algorithm files describe their inputs (name, tensor, kind) and get back
validated tensors, the time layout and the accumulation dtype.
"""
from __future__ import annotations

import math
import numbers
import os
import warnings
from dataclasses import dataclass
from functools import cached_property
from itertools import repeat

import torch

from . import _replay, _triton

__all__ = [
    "DEFAULT_TIME_DIM", "InputError", "Layout", "check_inputs", "check_coef", "check_last_value_dtype",
    "check_nonnegative", "check_shifted", "check_values", "checks_values", "getenv", "is_cached", "resolve_backend",
    "resolve_time_dim", "rows_strides",
]

FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)
_TENSOR, _BOOL, _STRIDED = torch.Tensor, torch.bool, torch.strided
BACKENDS = ("auto", "triton", "torch")
BACKEND_ENV = "RL_TRITON_TORCHRL_BACKEND"
# Layouts already built, by (shape, time_dim, dtype, device): a call reuses its shape's layout and the values cached
# on it. Cleared when full (a workload of ever-changing shapes only rebuilds them).
_LAYOUTS: dict = {}
_MAX_LAYOUTS = 256


class InputError(ValueError, RuntimeError):
    """A bad argument (shape, time_dim, value range).

    A ``ValueError``, and also a ``RuntimeError`` because TorchRL's functionals raise ``RuntimeError`` for the same
    mistakes: code written against either keeps working.
    """


@dataclass(frozen=True)
class Layout:
    """Shape of the common input viewed as ``(outer, T, inner)`` around the time dimension."""

    shape: torch.Size
    time_dim: int  # non-negative
    outer: int
    T: int
    inner: int
    dtype: torch.dtype  # dtype of the float inputs and of the outputs
    acc_dtype: torch.dtype  # float64 for float64 inputs, float32 otherwise
    device: torch.device

    @property
    def rows(self) -> int:
        return self.outer * self.inner

    @property
    def state_shape(self) -> torch.Size:
        """Shape of a carried state: the input shape without its time dimension."""
        return self.shape[: self.time_dim] + self.shape[self.time_dim + 1 :]

    @property
    def empty(self) -> bool:
        return self.outer * self.T * self.inner == 0

    @cached_property
    def contiguous_strides(self) -> tuple[int, int, int]:
        """``rows_strides`` of a contiguous, non-empty tensor of this shape: (outer, T, inner) strides, 0 for a
        dimension of size one (a merged dimension whose sizes are all one has no stride that matters)."""
        return (self.T * self.inner if self.outer > 1 else 0, self.inner if self.T > 1 else 0,
                1 if self.inner > 1 else 0)


def _layout(shape: torch.Size, time_dim: int, dtype: torch.dtype, device: torch.device) -> Layout:
    """The ``Layout`` of inputs of ``shape`` (``time_dim`` non-negative), cached outside torch.compile tracing."""
    key = (shape, time_dim, dtype, device)
    layout = None if torch.compiler.is_compiling() else _LAYOUTS.get(key)
    if layout is None:
        layout = Layout(
            shape=shape,
            time_dim=time_dim,
            outer=math.prod(shape[:time_dim]),
            T=shape[time_dim],
            inner=math.prod(shape[time_dim + 1 :]),
            dtype=dtype,
            acc_dtype=torch.float64 if dtype == torch.float64 else torch.float32,
            device=device,
        )
        if not torch.compiler.is_compiling():
            if len(_LAYOUTS) >= _MAX_LAYOUTS:
                _LAYOUTS.clear()
            _LAYOUTS[key] = layout
    return layout


def is_cached(layout: Layout) -> bool:
    """Whether ``layout`` is the one kept for its inputs: later calls on inputs of its shape get this very object
    (so that values cached by its id serve them). Layouts built otherwise (``scan._rows_layout``, or while
    torch.compile traces) are not."""
    key = (layout.shape, layout.time_dim, layout.dtype, layout.device)
    return _LAYOUTS.get(key) is layout


def resolve_backend(backend: str, device: torch.device, *inputs) -> str:
    """The path that runs: ``"triton"`` (fused kernel), ``"triton_scan"`` or ``"torch"``.

    ``"auto"`` -> ``$RL_TRITON_TORCHRL_BACKEND`` if set, else Triton on CUDA and torch elsewhere. A Triton call runs
    its fused kernel, unless autograd needs a gradient through any of ``inputs`` or torch.compile is tracing: then
    ``"triton_scan"``, the coefficients built with torch ops and the scan run by the Triton scan kernel as a
    differentiable custom op (``scan.scan_rows``), the same numbers.

    Without Triton installed (``_triton.HAS_TRITON`` False: macOS, Windows, CPU-only images), ``"auto"`` is the torch
    path on every device, CUDA tensors included (a warning says so the first time a CUDA tensor takes it), and
    ``"triton"`` (the argument or the environment variable) raises an ``InputError`` saying how to install Triton.
    """
    if backend not in BACKENDS:
        raise InputError(f"backend must be one of {BACKENDS}, got {backend!r}")
    kind = device.type
    if backend == "auto":
        env = getenv(BACKEND_ENV).strip().lower()
        if env and env != "auto":
            if env not in BACKENDS:
                raise InputError(f"${BACKEND_ENV} must be one of {BACKENDS}, got {env!r}")
            backend = env
        elif kind != "cuda":
            backend = "torch"
        elif _triton.HAS_TRITON:
            backend = "triton"
        else:
            _warn_cuda_without_triton()
            backend = "torch"
    if backend != "triton":
        return backend
    if not _triton.HAS_TRITON:
        raise InputError(f"backend='triton' needs Triton: {_triton.install_hint()}; or use backend='torch'")
    if kind not in ("cuda", "cpu"):  # e.g. meta tensors: no memory to read
        raise InputError(f"backend='triton' runs on CUDA tensors (or CPU ones through Triton's interpreter), got "
                         f"{device} tensors; use backend='torch'")
    if kind != "cuda" and getenv("TRITON_INTERPRET") != "1":
        raise InputError(
            f"backend='triton' needs CUDA tensors (got {device}); set TRITON_INTERPRET=1 before importing triton "
            "to run the kernels on the CPU through Triton's interpreter, or use backend='torch'"
        )
    # (inputs are tensors, numbers and None: only tensors have requires_grad)
    if torch.compiler.is_compiling() or (torch.is_grad_enabled() and any(
        map(getattr, inputs, repeat("requires_grad"), repeat(False))
    )):
        return "triton_scan"
    return backend


_WARNED_NO_TRITON = False


def _warn_cuda_without_triton() -> None:
    """Says once per process that CUDA tensors take the torch path because Triton is missing."""
    global _WARNED_NO_TRITON
    if not _WARNED_NO_TRITON:
        _WARNED_NO_TRITON = True
        warnings.warn(f"rl_triton_torchrl: CUDA tensors take the torch path (backend='auto'), not the Triton kernels: "
                      f"{_triton.install_hint()}", RuntimeWarning, stacklevel=4)


# os.environ's keys as stored in its mapping, by name
_ENV_KEYS: dict[str, object] = {}


def getenv(name: str) -> str:
    """``os.environ.get(name, "")``, read at every call as that is, without the KeyError that ``get`` raises and
    catches inside for an unset variable (1 µs, half of ``resolve_backend`` on CUDA): CPython's ``os.environ``
    keeps its variables in a dict, ``_data``, which ``get`` itself reads. Any other ``os.environ`` (one replaced by
    a plain mapping) is read with ``get``."""
    environ = os.environ
    try:
        key = _ENV_KEYS.get(name)
        if key is None:
            key = _ENV_KEYS[name] = environ.encodekey(name)
        value = environ._data.get(key)
        return "" if value is None else environ.decodevalue(value)
    except AttributeError:
        return environ.get(name, "")


def check_coef(name: str, value, layout: Layout, *, low: float = 0.0, high: float | None = 1.0):
    """Checks a coefficient (gamma, lmbda, ...) given as a Python number or a tensor broadcastable to the inputs.

    Python numbers and CPU tensors are range-checked; CUDA tensors are not (that would synchronise the device), nor
    are tensors while torch.compile traces (the values are not known then).
    """
    if type(value) is float:  # the common case first, without the type dispatch below
        return _check_number(name, value, low, high)
    if isinstance(value, torch.Tensor):
        return _check_coef_tensor(name, value, layout, low, high)
    if isinstance(value, bool) or not isinstance(value, numbers.Real):  # numbers.Real: numpy scalars too
        raise TypeError(f"{name} must be a float or a tensor, got {type(value).__name__}")
    return _check_number(name, float(value), low, high)


def _check_number(name: str, value: float, low: float, high: float | None) -> float:
    if not math.isfinite(value) or value < low or (high is not None and value > high):
        raise InputError(f"{name} must {_range(low, high)}, got {value}")
    return value


def _check_coef_tensor(name: str, value: torch.Tensor, layout: Layout, low: float, high: float | None):
    """``check_coef`` of a tensor: floating, dense, on the inputs' device (or one CPU element), broadcastable."""
    if not value.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor or a float, got a {value.dtype} tensor")
    if value.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {value.layout}")
    cpu = value.is_cpu
    if not (cpu and value.numel() == 1) and value.device != layout.device:
        raise InputError(f"{name} is on {value.device} but the inputs are on {layout.device} (a one-element "
                         "coefficient may also be a CPU tensor)")
    if value.dim() and not _broadcasts_to(value.shape, layout.shape):  # a 0-d tensor broadcasts to any shape
        raise InputError(f"{name} has shape {tuple(value.shape)}, which does not broadcast to the inputs' "
                         f"shape {tuple(layout.shape)}")
    if torch.compiler.is_compiling():  # reading values would break the graph: checked in eager calls only
        return value
    if cpu:
        _replay.note_value_check()
    if cpu and value.numel() == 1:  # the common case (an estimator's buffer): no tensor ops
        v = value.item()
        if not math.isfinite(v) or v < low or (high is not None and v > high):
            raise InputError(f"{name} must {_range(low, high)}, got a value of {v}")
    elif cpu and value.numel():
        v = value.detach().double()
        bad = ~torch.isfinite(v) | (v < low)
        if high is not None:
            bad |= v > high
        if bad.any():
            raise InputError(f"{name} must {_range(low, high)}, got a value of {v[bad].flatten()[0].item()}")
    return value


def _broadcasts_to(shape: torch.Size, target: torch.Size) -> bool:
    """Whether ``torch.broadcast_shapes(shape, target) == target`` (no more dimensions; aligned from the last one,
    each size 1 or the target's), without building the broadcast shape (12 µs)."""
    return len(shape) <= len(target) and all(
        n == 1 or n == m for n, m in zip(reversed(shape), reversed(target)))


def _range(low: float, high: float | None) -> str:
    return f"lie in [{low}, {high}]" if high is not None else f"be finite and >= {low}"


def _check_tensor(name: str, x) -> None:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.layout != torch.strided:
        raise TypeError(f"{name} must be a dense (strided) tensor, got layout {x.layout}")


# The time dimension of the kernel functions' ``time_dim=None``: TorchRL's (``[*B, T, 1]``), except for 2-D inputs
# (``resolve_time_dim``).
DEFAULT_TIME_DIM = -2


def resolve_time_dim(time_dim, shape) -> int:
    """``time_dim``, or for None (the kernel functions' default) ``DEFAULT_TIME_DIM``, except on 2-D inputs: there
    ``[B, T]`` (rl-triton's ``[num_envs, T]``, time last) and TorchRL's time-major ``[T, B]`` look alike, and the
    default would scan B as time without a word, so None raises an ``InputError`` that names both conventions.
    Anything but None is returned as it is (``check_inputs`` checks it)."""
    if time_dim is not None:
        return time_dim
    if len(shape) == 2:
        raise InputError(
            f"time_dim must be given for 2-D inputs (shape {tuple(shape)}): time_dim=-1 for [B, T] (one row per "
            "environment, rl-triton's [num_envs, T]), time_dim=0 (or -2) for TorchRL's time-major [T, B]; the "
            "default, -2, is for TorchRL's [B, T, 1] and inputs of any other number of dims")
    return DEFAULT_TIME_DIM


def check_inputs(time_dim: int | None, floats: dict, flags: dict, states: dict | None = None, *,
                 optional: tuple = ()) -> Layout:
    """Validates the inputs of one call and returns their common layout.

    Args:
        time_dim: the time dimension of every input; None (the kernel functions' default) for -2, which 2-D inputs
            refuse (``resolve_time_dim``).
        floats: name -> float tensor. All share one shape, dtype and device.
        flags: name -> bool tensor, of the same shape.
        states: name -> float tensor or None, of the input shape without the time dimension.
        optional: the names in ``floats`` and ``flags`` that may be None; any other None raises ``TypeError``.
    """
    layout = _uniform_layout(time_dim, floats, flags, optional) or _checked_layout(time_dim, floats, flags, optional)
    if states:
        _check_states(states, layout)
    return layout


def _uniform_layout(time_dim, floats: dict, flags: dict, optional: tuple) -> Layout | None:
    """The layout of the common call, found in a few comparisons per input: the first float given, every input a
    dense ``torch.Tensor`` of its shape and device (or None where optional), the floats of its float dtype, the
    flags bool, an int ``time_dim`` in range. None for any other call: ``_checked_layout`` then names the culprit."""
    ref = next(iter(floats.values()), None)
    if type(ref) is not _TENSOR or ref.dtype not in FLOAT_DTYPES or ref.layout is not _STRIDED:
        return None
    shape, device = ref.shape, ref.device
    if time_dim is None:
        if len(shape) == 2:
            return None  # ambiguous: _checked_layout raises
        time_dim = DEFAULT_TIME_DIM
    elif type(time_dim) is not int:
        return None
    for inputs, dtype in ((floats, ref.dtype), (flags, _BOOL)):
        for name, x in inputs.items():
            if x is ref:
                continue
            if x is None:
                if name in optional:
                    continue
                return None
            # (dtypes and layouts are singletons)
            if (type(x) is not _TENSOR or x.dtype is not dtype or x.layout is not _STRIDED or x.shape != shape
                    or x.device != device):
                return None
    ndim = len(shape)
    if not -ndim <= time_dim < ndim:  # a 0-d input fails this too
        return None
    return _layout(shape, time_dim % ndim, ref.dtype, device)


def _checked_layout(time_dim, floats: dict, flags: dict, optional: tuple) -> Layout:
    """``check_inputs`` of the floats and flags, input by input, raising the first error found."""
    for name, x in {**floats, **flags}.items():
        if x is None and name not in optional:
            if name in flags:
                raise TypeError(f"{name} must be a bool torch.Tensor, got None (pass torch.zeros_like("
                                f"{next(iter(floats))}, dtype=torch.bool) where no step is flagged)")
            raise TypeError(f"{name} must be a floating-point torch.Tensor, got None")
    given = {k: v for k, v in floats.items() if v is not None}
    if not given:
        raise InputError(f"at least one of {tuple(floats)} must be given")
    ref_name, ref = next(iter(given.items()))
    everything = {**given, **{k: v for k, v in flags.items() if v is not None}}
    for name, x in everything.items():
        _check_tensor(name, x)
    for name, x in given.items():
        if x.dtype not in FLOAT_DTYPES:
            raise TypeError(f"{name} must be a floating-point tensor ({', '.join(map(str, FLOAT_DTYPES))}), "
                            f"got {x.dtype}")
        if x.dtype != ref.dtype:
            raise TypeError(f"{name} has dtype {x.dtype} but {ref_name} has {ref.dtype}: pass one float dtype")
    for name, x in flags.items():
        if x is not None and x.dtype != torch.bool:
            # integer 0/1 flags are refused, not converted: TorchRL's flags are bool, and its loop functionals
            # negate them with ``~``, which maps integer 0/1 to -1/-2 (a silently wrong answer there)
            raise TypeError(f"{name} must be a bool tensor (True where the flag is set), got {x.dtype}")
    for name, x in everything.items():
        if x.shape != ref.shape:
            raise InputError(f"{name} has shape {tuple(x.shape)} but {ref_name} has {tuple(ref.shape)}: "
                             "every input must have the same [*B, T, *F] shape")
        if x.device != ref.device:
            raise InputError(f"{name} is on {x.device} but {ref_name} is on {ref.device}")
    if time_dim is not None and (isinstance(time_dim, bool) or not isinstance(time_dim, numbers.Integral)):
        raise TypeError(f"time_dim must be an int, got {type(time_dim).__name__}")
    ndim = ref.dim()
    if ndim == 0:
        raise InputError(f"{ref_name} must have a time dimension, got a 0-d tensor")
    defaulted = time_dim is None
    time_dim = int(resolve_time_dim(time_dim, ref.shape))
    if not -ndim <= time_dim < ndim:
        hint = " (the default): pass time_dim=0 for [T] inputs" if defaulted else ""
        raise InputError(f"time_dim={time_dim} is out of range for inputs of shape {tuple(ref.shape)}{hint}")
    return _layout(ref.shape, time_dim % ndim, ref.dtype, ref.device)


def _check_states(states: dict, layout: Layout) -> None:
    """Carried states (or None): dense float tensors of ``layout.state_shape`` on the inputs' device."""
    for name, s in states.items():
        if s is None:
            continue
        _check_tensor(name, s)
        if s.shape != layout.state_shape:
            raise InputError(f"{name} has shape {tuple(s.shape)}, expected {tuple(layout.state_shape)} "
                             "(the input shape without its time dimension)")
        if s.device != layout.device:
            raise InputError(f"{name} is on {s.device} but the inputs are on {layout.device}")
        if not s.is_floating_point():
            raise TypeError(f"{name} must be a floating-point tensor, got {s.dtype}")


def checks_values(x: torch.Tensor) -> bool:
    """Whether the values of ``x`` are checked: on CPU tensors, yes. On CUDA a check would synchronise the device
    (and torch.compile could not trace it): CUDA inputs are not value-checked, and the kernels propagate what they
    get as the float64 reference does."""
    checked = x.is_cpu and x.numel() > 0 and not torch.compiler.is_compiling()
    if checked:
        _replay.note_value_check()
    return checked


def check_shifted(next_state_value, last_state_value, next_name: str = "next_state_value",
                  last_name: str = "last_state_value", source: str = "state_value", what: str = "V(s_{t+1})",
                  shape: str = "[*B, *F]") -> bool:
    """Whether a call takes the shifted input mode: ``next_state_value=None`` with ``last_state_value``, so that
    :math:`V(s_{t+1})` is read from ``state_value`` one step on and from ``last_state_value`` after the last step.
    Raises for one of the two without the other. (Check ``last_state_value`` as a state of ``check_inputs``, then
    its dtype with ``check_last_value_dtype``.) The other arguments name the pair in the messages, for inputs other
    than values: ``source`` is the input read one step on, ``what`` the quantity, ``shape`` the last one's shape."""
    shifted = next_state_value is None
    if shifted != (last_state_value is not None):
        if shifted:
            raise TypeError(f"{next_name} must be a floating-point torch.Tensor, got None (or pass {last_name}, "
                            f"{shape}, to read {what} from {source} one step on)")
        raise InputError(f"pass {next_name} or {last_name}, not both ({last_name} reads {what} from {source} one "
                         f"step on, in place of {next_name})")
    return shifted


def check_last_value_dtype(last_state_value: torch.Tensor, layout: Layout, first: str,
                           name: str = "last_state_value") -> None:
    """``last_state_value`` (an input called ``name``) in the float inputs' dtype (``first`` names the first of
    them), as the kernels read it among them."""
    if last_state_value.dtype != layout.dtype:
        raise TypeError(f"{name} has dtype {last_state_value.dtype} but {first} has {layout.dtype}: pass one float "
                        "dtype")


def check_values(name: str, x: torch.Tensor, bad: torch.Tensor, rule: str) -> None:
    """Raises ``InputError`` naming the first index of ``x`` where the bool tensor ``bad`` holds (CPU tensors)."""
    if bad.any():
        idx = tuple(int(i) for i in bad.nonzero()[0])
        raise InputError(f"{name} {rule}; got {x[idx].item()!r} at index {idx} ({int(bad.sum())} such elements)")


def check_nonnegative(name: str, x: torch.Tensor | None) -> None:
    """A probability (or a ratio of them) must not be negative: a finite negative value would give a finite, wrong
    answer. Non-finite values (NaN, -inf) are not errors: they propagate to the outputs as in the reference."""
    if x is not None and checks_values(x):
        check_values(name, x, x.isfinite() & (x < 0), "must not be negative (a probability, or a ratio of them)")


def _merged_stride(sizes, strides) -> int | None:
    """Stride of the dims ``sizes`` seen as one flat dim, or None if they cannot be merged without a copy."""
    dims = [(n, s) for n, s in zip(sizes, strides) if n != 1]
    if not dims:
        return 0
    for (n0, s0), (n1, s1) in zip(dims, dims[1:]):
        if s0 != s1 * n1:
            return None
    return dims[-1][1]


def rows_strides(x: torch.Tensor, layout: Layout) -> tuple[torch.Tensor, tuple[int, int, int]]:
    """Views ``x`` (of ``layout.shape``, or broadcastable to it) as ``(outer, T, inner)``: (tensor, strides).

    No copy for any layout whose outer and inner dimensions each merge into one strided dimension: contiguous,
    time-major, sliced, or broadcast with stride 0. Anything else is copied once.
    """
    if x.shape != layout.shape:
        x = x.expand(layout.shape)
    elif x.is_contiguous() and not layout.empty:  # the common case, without merging dimensions
        return x, layout.contiguous_strides
    so, si = _outer_inner_strides(x, layout)
    if so is None or si is None:
        x = x.contiguous()
        return rows_strides(x, layout)
    st = x.stride(layout.time_dim) if layout.T > 1 else 0
    return x, (so, st, si)


def _outer_inner_strides(x: torch.Tensor, layout: Layout) -> tuple[int | None, int | None]:
    """The strides of the outer and of the inner dimensions of ``x`` each merged into one (None: not mergeable)."""
    td = layout.time_dim
    return _merged_stride(x.shape[:td], x.stride()[:td]), _merged_stride(x.shape[td + 1 :], x.stride()[td + 1 :])


def views_without_copy(x: torch.Tensor, layout: Layout) -> bool:
    """Whether ``rows_strides`` views ``x`` (of ``layout.shape``) as it is, without a copy."""
    return None not in _outer_inner_strides(x, layout)
