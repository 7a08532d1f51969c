"""Runs the Triton kernels through Triton's interpreter when there is no GPU, and skips what needs Triton where it
is not installed.

TRITON_INTERPRET must be set before triton is imported (torchrl imports it), hence here, first.

Without Triton (``kernels._triton.HAS_TRITON`` False: macOS, Windows, a CPU-only environment) the torch path is all
there is: a test that needs Triton is skipped, never failed. A test needs Triton when it is marked
``@pytest.mark.triton`` (a test file that needs it throughout either sets ``pytestmark`` or, when it imports
``triton`` itself, calls ``pytest.importorskip("triton")`` first) or when it is parametrized with ``backend="triton"``
(an argument or a fixture named ``backend``; ``_helpers.BACKENDS``).
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402

from rl_triton_torchrl.kernels import _triton, scan  # noqa: E402

# Triton versions whose interpreter ``_patch_device_calls_once`` knows
INTERPRETER_PATCH_ONCE = ("3.6.0", "3.9.0")


def _patch_device_calls_once() -> bool:
    """Triton's interpreter (3.6 and 3.9) maps ``triton.language`` onto its interpreted builtins when a kernel starts,
    and again at every call of a ``@triton.jit`` helper inside it, where nothing is left to map: every builtin of the
    language, looked up by ``inspect.getmembers`` each time. The kernels here are built from many small helpers:
    ``test_launch_modes.py::test_lookback_matches_reference`` (320 cases, two workers) takes 77 s without this and 65
    s with it. This skips the mapping at a helper's call while a kernel's own mapping is in force for the same
    modules, and changes nothing else: the kernel's mapping is made and undone as before, and every helper runs as
    before. Only on the Triton versions named in INTERPRETER_PATCH_ONCE (another Triton runs its interpreter as it
    is); returns whether it is in place."""
    if not _triton.HAS_TRITON or os.environ.get("TRITON_INTERPRET") != "1":
        return False
    import inspect

    import triton
    from triton.runtime import interpreter
    if triton.__version__ not in INTERPRETER_PATCH_ONCE:
        return False
    tl = interpreter.tl
    mapped = []  # the language modules a running kernel has mapped (one entry while a kernel runs)
    patch_lang, grid_call = interpreter._patch_lang, interpreter.GridExecutor.__call__

    def langs(fn):
        return {id(v) for v in fn.__globals__.values() if inspect.ismodule(v) and v in (tl, tl.core)}

    def _patch_lang(fn):
        if mapped and mapped[-1] is not None and langs(fn) <= mapped[-1]:
            return interpreter._LangPatchScope()  # a helper's call: its modules are mapped already
        scope = patch_lang(fn)
        if mapped and mapped[-1] is None:  # the kernel's own mapping
            mapped[-1] = langs(fn)
        return scope

    def _grid_call(self, *args, **kwargs):
        mapped.append(None)
        try:
            return grid_call(self, *args, **kwargs)
        finally:
            mapped.pop()

    interpreter._patch_lang = _patch_lang
    interpreter.GridExecutor.__call__ = _grid_call
    return True


INTERPRETER_PATCHED_ONCE = _patch_device_calls_once()


def needs_triton(item) -> bool:
    """Whether a collected test needs Triton: the ``triton`` marker, or ``backend="triton"`` among its parameters."""
    callspec = getattr(item, "callspec", None)
    return item.get_closest_marker("triton") is not None or (
        callspec is not None and callspec.params.get("backend") == "triton")


def pytest_report_header(config):
    if not _triton.HAS_TRITON:
        return f"no Triton: tests that need it are skipped ({_triton.TRITON_IMPORT_ERROR})"


def pytest_runtest_logreport(report):
    """With ``$PYTEST_FAILURE_LOG`` set, appends each failure's traceback to that file as it happens (in the process
    that reports to the terminal: the xdist controller, or the one process): a run that a time limit stops before
    pytest's summary, such as the GPU sessions' whole-suite runs, still leaves every failure's cause."""
    path = os.environ.get("PYTEST_FAILURE_LOG")
    if path and report.failed and "PYTEST_XDIST_WORKER" not in os.environ:
        with open(path, "a") as log:
            log.write(f"==== {report.nodeid} ({report.when})\n{report.longreprtext}\n\n")


def pytest_collection_modifyitems(config, items):
    if _triton.HAS_TRITON:
        return
    skip = pytest.mark.skip(reason=f"needs Triton: {_triton.install_hint()}")
    for item in items:
        if needs_triton(item):
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _poison_outputs(monkeypatch):
    """Every output starts as NaN, so an element a kernel fails to write fails the comparison."""
    monkeypatch.setattr(scan, "POISON_OUTPUTS", True)
    yield


@pytest.fixture
def small_tiles(monkeypatch):
    """Tiny tiles, so that short sequences already walk the multi-chunk and multi-program paths."""
    monkeypatch.setattr(scan, "MAX_BLOCK_T", 16)
    monkeypatch.setattr(scan, "WIDE_MAX_ROWS", 0)  # row tiles of several rows, not one wide tile per row
    monkeypatch.setattr(scan, "TILE_ELEMENTS", 32)
    yield
