"""Checks shared by the TorchRL-aware classes (estimators, modules): constructor coefficients, and errors that name
the tensordict entry behind a bad kernel argument."""
from __future__ import annotations

import math
import numbers
import re

import torch

from .kernels import InputError

__all__ = ["Described", "check_coefficient", "keyed_error"]


class Described(str):
    """An argument's source that is not one entry (e.g. a difference of two), shown in words by ``keyed_error``."""


def check_coefficient(owner: str, name: str, value, low: float = 0.0, high: float | None = 1.0) -> None:
    """Range-checks a constructor coefficient (``gamma``, ``lmbda``, a clipping threshold) as the kernels would at
    the first call, so that a bad value fails where it is given.

    Python numbers (NumPy scalars too) and CPU tensors are checked, every element; CUDA (and meta) tensors are not
    read (that would synchronise the device), nor are tensors while torch.compile traces: the kernels treat them as
    at every call (docs/errors.md).
    """
    rule = f"lie in [{low}, {high}]" if high is not None else f"be finite and >= {low}"
    if isinstance(value, torch.Tensor):
        if not value.is_floating_point():
            raise TypeError(f"{owner}: {name} must be a floating-point tensor or a float, got a {value.dtype} tensor")
        if value.device.type != "cpu" or torch.compiler.is_compiling() or value.numel() == 0:
            return
        v = value.detach().double()
        bad = ~torch.isfinite(v) | (v < low)
        if high is not None:
            bad |= v > high
        if bad.any():
            raise InputError(f"{owner}: {name} must {rule}, got a value of {v[bad].flatten()[0].item()}")
        return
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{owner}: {name} must be a float or a tensor, got {type(value).__name__}")
    v = float(value)
    if not math.isfinite(v) or v < low or (high is not None and v > high):
        raise InputError(f"{owner}: {name} must {rule}, got {value}")


def keyed_error(owner: str, err: BaseException, keys: dict) -> BaseException | None:
    """``err`` (an ``InputError`` or ``TypeError`` of a kernel or functional, whose message starts with the
    argument's name) again, of the same type, its message prefixed by ``owner`` and the tensordict entries that hold
    the arguments it names: ``GAE: ('next', 'done'): done must be a bool tensor ...``, ``GAE: 'state_value' and
    ('next', 'reward'): state_value has dtype torch.float32 but reward has torch.float64 ...``.

    ``keys`` maps argument names to entries (keys; a ``Described`` string is shown as it is). None when the message
    does not start with an argument of ``keys`` (or was prefixed already): the caller re-raises ``err`` as it is.
    """
    message = str(err)
    if message.split(" ", 1)[0] not in keys or getattr(err, "_rl_triton_keyed", False):
        return None
    named = sorted((m.start(), name) for name in keys if (m := re.search(rf"\b{re.escape(name)}\b", message)))
    entries = " and ".join(keys[name] if isinstance(keys[name], Described) else repr(keys[name])
                           for _, name in named)
    try:
        new = type(err)(f"{owner}: {entries}: {message}")
    except Exception:  # noqa: BLE001 - an exception type with another constructor: keep the original
        return None
    new._rl_triton_keyed = True
    return new.with_traceback(err.__traceback__)
