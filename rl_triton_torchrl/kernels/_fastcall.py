"""Call replay in C++: ``_fastcall.cpp``, compiled on first use against torch's headers and libraries.

A replayed call (``_replay``) spends most of its host time in Python: the signature's attribute reads and tuples,
the launcher's settings, two output allocations, and ``cuLaunchKernel`` through ctypes. ``_fastcall.cpp`` does the
same in one C++ function, ``call``, for the calls whose facts it remembers (``remember``: what the signature keys,
read through ATen, for the last 8 signatures of each function that the Python path replayed or recorded with an
entry that has a ``FastEntry``): where a call's facts match, it compares the launcher's settings, allocates the
outputs (``at::empty_like``) and the launch's per-call buffers (``_LaunchPlan.buffers``), writes their pointers and
the call's into the entry's own parameter buffer and calls the driver. Anything else it hands back to ``_replay``'s
Python path. H200 host, a GAE call at 4096 x 128 (``benchmarks/results/h200/host_floor_cpp_1.md``,
``host_floor_cpp_2.md``, ``host_floor_c_f42a3f8.md``): 25.9 µs replayed in Python, 10.1-11.1 µs in C++, 17.4 µs
in the C replay this replaced (the facts found in 0.25-0.43 µs, where the C replay built the signature in 3.9).

The module is compiled with the C++ compiler (``$CXX``, else ``c++``, ``g++`` or ``clang++``) against this Python's
and torch's headers, linked against torch's libraries, into ``$RL_TRITON_TORCHRL_CACHE_DIR`` (default
``~/.cache/rl_triton_torchrl``), once per source, Python and torch build (about 20 s), and loaded, in a daemon thread
started by the first call replayed in Python that launched natively (a GPU; the first call of a signature records
it). Calls replay in Python until it is loaded, and always where it cannot be built (no C++ compiler, no torch
headers, not Linux) or with ``RL_TRITON_TORCHRL_FASTCALL=0``; ``status()`` says which.
"""
from __future__ import annotations

import os
import sys
import threading
from pathlib import Path

# (what building and loading need is imported in their thread: a process's first calls import nothing)

__all__ = ["ENABLED", "fast_entry", "load", "loaded", "start", "status"]

ENABLED = os.environ.get("RL_TRITON_TORCHRL_FASTCALL", "1") != "0" and sys.platform.startswith("linux")
SOURCE = Path(__file__).with_name("_fastcall.cpp")
_NAME = "_fastcall_ext"
_lock = threading.Lock()
_thread: threading.Thread | None = None
_module = None  # the loaded extension, configured
_error: str | None = None  # why it was not built or loaded


def _cache_dir() -> Path:
    root = os.environ.get("RL_TRITON_TORCHRL_CACHE_DIR")
    if root:
        return Path(root)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "rl_triton_torchrl"


def _compiler() -> str | None:
    import shutil

    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx)
    return next(filter(None, map(shutil.which, ("c++", "g++", "clang++"))), None)


def _torch_build() -> tuple[str, Path, int]:
    """(torch's version and commit, its folder, its C++ ABI flag): what the extension is built against."""
    import torch

    return f"{torch.__version__} {torch.version.git_version}", Path(torch.__file__).parent, \
        int(torch._C._GLIBCXX_USE_CXX11_ABI)


def _target() -> Path:
    """Where the extension of this source, this Python and this torch build lies, once built."""
    import hashlib
    import sysconfig

    stamp = f"{sys.version} {sys.platform} {_torch_build()}".encode()
    digest = hashlib.sha256(SOURCE.read_bytes() + stamp).hexdigest()[:16]
    return _cache_dir() / f"{_NAME}_{digest}{sysconfig.get_config_var('EXT_SUFFIX') or '.so'}"


def _build(target: Path) -> None:
    import subprocess
    import sysconfig
    import tempfile

    cxx = _compiler()
    include = sysconfig.get_paths()["include"]
    _, root, abi = _torch_build()
    headers, lib = root / "include", root / "lib"
    if cxx is None or not Path(include, "Python.h").exists() or not (headers / "ATen" / "ATen.h").exists():
        raise RuntimeError("no C++ compiler" if cxx is None else f"no Python.h in {include}"
                           if not Path(include, "Python.h").exists() else f"no torch headers in {headers}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as tmp:
        out = Path(tmp) / target.name
        # C++17 as built and measured against torch 2.11 and 2.13; C++20 where a later torch's headers need it
        for std in ("c++17", "c++20"):
            cmd = [cxx, "-O2", f"-std={std}", "-w", "-shared", "-fPIC", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
                   "-I", include, "-I", str(headers), "-I", str(headers / "torch" / "csrc" / "api" / "include"),
                   str(SOURCE), "-o", str(out), f"-L{lib}", "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python",
                   f"-Wl,-rpath,{lib}"]
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
            if not done.returncode:
                break
        else:
            raise RuntimeError(f"{' '.join(cmd)} failed: {done.stderr.strip()[-2000:]}")
        os.replace(out, target)  # whole or not at all, for a process building it beside this one


def _build_once(target: Path) -> None:
    """Builds the extension unless another process builds it meanwhile: the processes of one machine that start
    together (DDP's ranks, pytest's workers) build it once, the others wait for it (about 20 s) under a file lock."""
    import fcntl

    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.with_name(target.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not target.exists():
            _build(target)


def _load_from(target: Path):
    import importlib.machinery
    import importlib.util

    loader = importlib.machinery.ExtensionFileLoader(_NAME, str(target))
    spec = importlib.util.spec_from_file_location(_NAME, target, loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _load_or_build() -> None:
    global _module, _error
    try:
        target = _target()
        if not target.exists():
            _build_once(target)
        module = _load_from(target)
        from . import _replay, _utils, scan
        _replay._bind()  # (what its _state reads)
        environ = os.environ
        data, key = getattr(environ, "_data", None), None
        if isinstance(data, dict):
            key = environ.encodekey(_utils.BACKEND_ENV)
        module.configure(_replay._local, scan, _replay.Entry._fields.index("fast"), os, environ, data, key)
        _module = module
        _replay.adopt(module)
    except Exception as e:  # noqa: BLE001 - any failure leaves the Python path, and says why
        _error = f"{type(e).__name__}: {e}"


def start() -> None:
    """Loads the extension in a daemon thread (once), building it first where it is not built: the call that starts
    it (``_replay``: the first call replayed in Python) pays nothing, and a later call of a caller's thread adopts it
    (``_replay.adopt``)."""
    global _thread
    if not ENABLED or _thread is not None:
        return
    with _lock:
        if _thread is None:
            _thread = threading.Thread(target=_load_or_build, name="rl_triton_torchrl-fastcall", daemon=True)
            _thread.start()


def load(timeout: float | None = None):
    """The loaded extension (``start``, then waiting for it), or None where it is not built or loaded."""
    start()
    _join(timeout)
    return _module


def loaded():
    """The extension if it is loaded, else None (without starting anything)."""
    return _module


def status() -> str:
    """Which path replays calls, and why."""
    if _module is not None:
        return f"C++ ({_target()})"
    if not ENABLED:
        return "Python (RL_TRITON_TORCHRL_FASTCALL=0, or not Linux)"
    if _error is not None:
        return f"Python (the C++ module could not be built or loaded: {_error})"
    return "Python (the C++ module is being built or loaded)" if _thread is not None else "Python (no native launch yet)"


def _join(timeout: float | None = None) -> None:
    """Waits for the loading thread, if one runs (``load``, and before a fork)."""
    thread = _thread
    if thread is not None and thread is not threading.current_thread() and thread.is_alive():
        thread.join(timeout)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(before=_join)


def fast_entry(entry, launch_address: int, stream_fn, like):
    """The ``FastEntry`` of an ``_replay.Entry`` whose plan launches natively, on ``cuLaunchKernel`` at
    ``launch_address``, the stream of ``stream_fn(device)``, outputs ``at::empty_like(like)`` and the buffers of
    ``_LaunchPlan.buffers``; None where the extension is not loaded."""
    module = _module
    if module is None:
        return None
    import ctypes

    plan, layout = entry.plan, entry.layout
    prepared = plan.native
    makers, at = plan.buffers(layout, entry.cvals)
    numbers = plan.numbers_of(entry.cvals)
    n_ptrs = len(entry.head) + entry.n_outputs + len(entry.tail)
    buffer = bytearray(prepared.buffer.raw)
    prepared.pack(buffer, 0, *[0] * n_ptrs, *numbers, *[0] * len(makers))
    base = ctypes.addressof(prepared.buffer)
    offsets = tuple(p - base for p in prepared.params)
    return module.FastEntry(launch_address, prepared.function, prepared.grid, prepared.block, prepared.shared,
                            bytes(buffer), offsets, entry.head, entry.n_outputs, entry.tail, like,
                            plan.lean.settings, entry.settings, stream_fn, entry.settings[0], entry.result, makers,
                            n_ptrs + len(numbers), -1 if at is None else at, tuple(layout.state_shape))
