"""Triton where it is installed, and a stand-in where it is not (macOS, Windows, CPU-only images).

Every kernel module takes ``triton`` and ``tl`` from here (``from ._triton import tl, triton``). With Triton
installed they ARE ``triton`` and ``triton.language``, the very module objects, so Triton's JIT sees exactly what a
plain ``import triton`` gives (it reads each kernel's source, globals and annotations). Without Triton, ``HAS_TRITON``
is False and the stand-ins provide what the kernel modules use while they are imported: ``triton.jit`` (as a
decorator or a call) returns a kernel object that raises ``TritonNotInstalledError`` when launched, and
``tl.constexpr(value)`` holds a value. Kernel annotations such as ``BLOCK_T: tl.constexpr`` are never evaluated: every
kernel module starts with ``from __future__ import annotations``. The torch path needs none of it;
``_utils.resolve_backend`` sends every call there when Triton is missing.
"""
from __future__ import annotations

import functools

__all__ = ["HAS_TRITON", "TRITON_IMPORT_ERROR", "TritonNotInstalledError", "install_hint", "tl", "triton"]

INSTALL_HINT = "on Linux, `pip install triton` (the version your torch requires; torch's CUDA wheels bring it)"


class TritonNotInstalledError(RuntimeError):
    """A Triton kernel was launched where Triton is not installed."""


def install_hint() -> str:
    """Why Triton is unavailable and how to install it, for error messages and warnings ("" with Triton)."""
    if TRITON_IMPORT_ERROR is None:
        return ""
    missing = TRITON_IMPORT_ERROR.startswith("ModuleNotFoundError: No module named 'triton'")
    state = "not installed" if missing else "installed but cannot be imported"
    return f"Triton is {state} (import triton: {TRITON_IMPORT_ERROR}); {INSTALL_HINT}"


try:
    import triton
    import triton.language as tl
except ImportError as err:  # no Triton on this platform: the torch path only
    HAS_TRITON = False
    TRITON_IMPORT_ERROR: str | None = f"{type(err).__name__}: {err}"

    class _MissingKernel:
        """What ``triton.jit`` gives without Triton: the function, which raises when launched as a kernel."""

        def __init__(self, fn):
            self.fn = fn
            functools.update_wrapper(self, fn)

        def _fail(self, *args, **kwargs):
            raise TritonNotInstalledError(f"cannot launch the Triton kernel {self.__name__}: {install_hint()}")

        def __getitem__(self, grid):
            return self._fail

        __call__ = _fail

        def __repr__(self):
            return f"<Triton kernel {self.__name__} (Triton not installed)>"

    class _MissingTriton:
        """The stand-in for the ``triton`` module: only ``jit``."""

        __name__ = "triton"

        @staticmethod
        def jit(fn=None, **kwargs):
            if fn is None:  # @triton.jit(...)
                return _MissingKernel
            return _MissingKernel(fn)

        def __getattr__(self, name):
            raise AttributeError(f"triton.{name} is not available: {install_hint()}")

    class _MissingConstexpr:
        """The stand-in for ``tl.constexpr(value)``: holds ``value``, compares and hashes as it."""

        def __init__(self, value):
            self.value = value.value if isinstance(value, _MissingConstexpr) else value

        def __eq__(self, other):
            return self.value == (other.value if isinstance(other, _MissingConstexpr) else other)

        def __hash__(self):
            return hash(self.value)

        def __index__(self):
            return self.value.__index__()

        def __int__(self):
            return int(self.value)

        def __repr__(self):
            return f"constexpr[{self.value!r}]"

    class _MissingLanguage:
        """The stand-in for ``triton.language``: only ``constexpr``."""

        __name__ = "triton.language"
        constexpr = _MissingConstexpr

        def __getattr__(self, name):
            raise AttributeError(f"triton.language.{name} is not available: {install_hint()}")

    triton = _MissingTriton()
    tl = _MissingLanguage()
else:
    HAS_TRITON = True
    TRITON_IMPORT_ERROR = None
