"""Call replay: a kernels-API call whose signature was seen before launches straight away.

A public function decorated with ``replayable`` keys each call by its signature (``signature``): for every argument,
a tensor's shape, strides, dtype, device, ``requires_grad`` and the low four bits of its data pointer, and any
other argument's type and value (floats included, their sign of zero too); plus the global state the call reads
(grad mode, the backend variable, ``scan``'s launch constants). A call whose signature was recorded (``Entry``)
checks nothing and builds nothing: its outputs are allocated as the recording call allocated them
(``scan.new_outputs``), and the launch plan that call replayed (``scan._LaunchPlan``) is launched again with this
call's data pointers. Every check the recording call passed holds for this one too, since each reads only what the
signature holds; the values of CUDA tensors are never checked (that would synchronise), and a call that checked
values (CPU tensors) is never recorded.

A call is recorded while it runs the plain way, where it:

- launched exactly one kernel, through a launch plan (``scan.launch`` says so to the recording: ``note_launch``);
- passed every tensor to that launch as an argument's own memory (the argument itself or a view of it at a fixed
  offset, such as ``retrace_discrete``'s per-action views), never a copy or a tensor computed from one;
- passed no argument whose data pointer another argument shares (which of them the launch read would be a guess);
- returned the outputs of that launch (or its final state) as they are, untouched since (their version counters);
- checked no tensor values (``note_value_check``).

Anything else is not replayed: it runs the plain way, the same call as without this module, and after
``RECORDINGS`` calls that gave no entry (at once for a call that launched nothing, such as the torch path) its
signature runs unrecorded from then on. A nested replayable call (``eligibility_traces`` calling
``episodic_prefix_sum``) runs the plain way while an outer one records, so that the outer one sees its launch.
``REPLAY = False`` (``RL_TRITON_TORCHRL_REPLAY=0``) turns it off; it is off where no kernel can launch (a CPU-only
build of torch outside Triton's interpreter).

Where the C++ extension ``_fastcall`` is loaded (built on first use; a GPU), a call recorded or replayed in Python
whose entry launches natively (``Entry.fast``) is remembered there by its facts (what the signature keys), and the
calls with the same facts are made in one C++ function; the rest, and every call where it is not loaded, take the
Python path of this module.

H200 host, 4096 x 128 float32, bare calls back to back (``benchmarks/results/h200/host_floor.md``): GAE 32.9 -> 23.5
µs, ``retrace_discrete`` 75.5 -> 27.5 µs, every algorithm 1.3-2.7x less host time.
"""
from __future__ import annotations

import functools
import math
import os
import threading
from typing import NamedTuple

import torch

__all__ = ["RECORDINGS", "REPLAY", "Entry", "adopt", "note_launch", "note_value_check", "recording", "replayable",
           "signature"]

REPLAY = os.environ.get("RL_TRITON_TORCHRL_REPLAY", "1") != "0" and (
    torch.backends.cuda.is_built() or os.environ.get("TRITON_INTERPRET") == "1")
# Recordings of one signature that may give no entry before it is run the plain way, unrecorded, from then on (a
# first call may launch before its plan exists; a call passing one tensor twice is not recorded, the next may be).
RECORDINGS = 3
# Entries by signature, over every replayable function; cleared when full (the next call records again).
_ENTRIES: dict = {}
_MAX_ENTRIES = 256
_TENSOR = torch.Tensor
_SCALARS = frozenset({float, int, bool, str, type(None)})
_DATA_PTR = torch.Tensor.data_ptr


class _Local(threading.local):
    """Per thread: ``recordings``, the stack of this thread's recordings (outermost first); the class's empty tuple
    until the thread's first recording, so that a look-up never misses (a missed ``getattr`` costs 0.4 µs)."""

    recordings = ()


_local = _Local()
_getenv = _BACKEND_ENV = _config_key = _new_outputs = _output_like = _launcher = None  # bound by ``_bind``
_FAST = None  # the C++ extension (``_fastcall``) once adopted by a caller's thread (``_adopt``)
_READY = None  # the C++ extension once loaded (``adopt``), not yet adopted
_FAST_STARTED = False  # whether ``_start_fast`` ran


class _Recording:
    """What ``scan.launch`` and the checks told a call while it ran the plain way."""

    __slots__ = ("launches", "tainted", "unplanned")

    def __init__(self):
        self.launches = []  # (plan, layout, ptrs, cvals, outputs, final state) of each launch
        self.tainted = False  # values checked
        self.unplanned = False  # a launch without a plan


def _recordings() -> list:
    stack = _local.recordings
    if type(stack) is not list:
        stack = _local.recordings = []
    return stack


def note_launch(plan, layout, ptrs: tuple, cvals: tuple, outputs: tuple, ht) -> None:
    """``scan.launch`` launched (``plan`` None: without a launch plan): told to every recording of this thread."""
    for rec in _local.recordings:
        rec.launches.append((plan, layout, ptrs, cvals, outputs, ht))
        rec.unplanned |= plan is None


def note_value_check() -> None:
    """A check read tensor values: the calls recording now are never replayed."""
    for rec in _local.recordings:
        rec.tainted = True


def recording() -> bool:
    """Whether a call of this thread is being recorded."""
    return bool(_local.recordings)


def _state() -> tuple:
    """The global state a call reads besides its arguments: the grad mode and the backend variable (which pick
    its path) and ``scan``'s launch constants."""
    return torch.is_grad_enabled(), _getenv(_BACKEND_ENV), _config_key()


def _bind() -> None:
    """Binds what ``_state`` and ``Entry`` use of the modules that import this one (once, at the first call)."""
    global _getenv, _BACKEND_ENV, _config_key, _new_outputs, _output_like, _launcher
    from . import _launcher, _utils, scan
    _getenv, _BACKEND_ENV, _config_key, _new_outputs = _utils.getenv, _utils.BACKEND_ENV, scan._config_key, \
        scan.new_outputs
    _output_like = scan._output_like


def adopt(module) -> None:
    """The C++ extension is loaded (by any thread): the next call of a caller's thread adopts it (``_adopt``)."""
    global _READY
    _READY = module


def _adopt() -> None:
    """Makes the calls through the C++ extension from now on, and gives the entries recorded before their
    ``FastEntry``."""
    global _FAST, _READY
    _FAST, _READY = _READY, None
    for key, entry in list(_ENTRIES.items()):
        if type(entry) is Entry and entry.fast is None:
            _ENTRIES[key] = _with_fast(entry)


def _start_fast() -> None:
    """Starts loading the C++ extension (``_fastcall.start``: once, in its thread)."""
    global _FAST_STARTED
    _FAST_STARTED = True
    from . import _fastcall
    _fastcall.start()


def _with_fast(entry: Entry) -> Entry:
    """``entry`` with its ``FastEntry`` where the C++ extension can make its calls (a native launch, outputs allocated
    as ``new_outputs`` allocates them), else ``entry``."""
    if entry.plan.native is None:
        return entry
    from . import _fastcall
    if _fastcall.loaded() is None:
        return entry
    address, like = _launcher.launch_address(), _output_like(entry.layout)
    if address is None or like is None or (
            torch.empty_like(like).stride() != torch.empty_like(like, memory_format=torch.contiguous_format).stride()):
        return entry  # (the extension allocates as torch.empty_like(like): contiguous but where every size is 1)
    return entry._replace(fast=_fastcall.fast_entry(entry, address, _launcher.active_driver().get_current_stream, like))


def signature(fn, args: tuple, kwargs: dict) -> tuple[tuple, list] | None:
    """(the key of a call, the data pointers of its tensor arguments in order), or None for a call never replayed
    (an argument that is neither an exact ``torch.Tensor`` nor a number, bool, string or None; a tensor without data,
    as under torch.compile)."""
    parts, ptrs = [], []
    try:
        for v in (*args, *kwargs.values()):
            t = type(v)
            if t is _TENSOR:
                p = v.data_ptr()
                ptrs.append(p)
                parts.append((v.shape, v.stride(), v.dtype, v.device, v.requires_grad, p & 15))
            elif t in _SCALARS:
                # (1 == 1.0 == True: the type keeps them apart; 0.0 == -0.0: so does the sign)
                parts.append((t, v, math.copysign(1.0, v)) if t is float and not v else (t, v))
            else:
                return None
    except RuntimeError:  # a tensor without storage
        return None
    return (fn, len(args), tuple(kwargs), *parts, _state()), ptrs


class Entry(NamedTuple):
    """A recorded call: launch ``plan`` over ``layout`` with ``n_outputs`` new outputs and the pointers that ``head``
    and ``tail`` name (the outputs' between them, in ``scan._plan_key``'s order), and return ``result``."""

    plan: object  # scan._LaunchPlan
    layout: object
    settings: tuple  # the launcher's settings when recorded (a plan is never replayed under others)
    n_outputs: int
    head: tuple  # (argument, byte offset) of each pointer before the outputs'
    tail: tuple  # likewise after them (tensor coefficients, the initial state)
    cvals: tuple  # the coefficients' values (numbers, the same in every call of the signature)
    result: object  # an int: that output; -1: the final state; a tuple of those: a tuple
    fast: object = None  # the same call made by the C++ extension (``_with_fast``), or None

    def replay(self, ptrs: list):
        """The call's result, or None where the plan did not launch (the caller then runs the plain way)."""
        if self.plan.lean.settings() != self.settings:
            return None
        outs = _new_outputs(self.layout, self.n_outputs)
        launch_ptrs = (*[ptrs[i] + off for i, off in self.head], *map(_DATA_PTR, outs),
                       *[ptrs[i] + off for i, off in self.tail])
        done, ht = self.plan.launch(self.settings[0], self.layout, launch_ptrs, self.cvals)
        if not done:
            return None
        result = self.result
        if type(result) is int:
            return ht if result < 0 else outs[result]
        return tuple([ht if r < 0 else outs[r] for r in result])


def _entry(rec: _Recording, args: tuple, kwargs: dict, ptrs: list, result) -> Entry | None:
    """The entry of a call recorded as ``rec`` that returned ``result``, or None where it cannot be replayed."""
    if rec.tainted or rec.unplanned or len(rec.launches) != 1 or len(set(ptrs)) != len(ptrs):
        return None
    plan, layout, launch_ptrs, cvals, outputs, ht = rec.launches[0]
    if plan is None or not all(type(c) is float or type(c) is _TENSOR for c in cvals):
        return None
    tensors = [v for v in (*args, *kwargs.values()) if type(v) is _TENSOR]
    spans = [(p, p + _extent(x)) for p, x in zip(ptrs, tensors)]

    def source(p: int):
        exact = [i for i, q in enumerate(ptrs) if q == p]
        within = exact or [i for i, (lo, hi) in enumerate(spans) if lo <= p < hi]
        return (within[0], p - ptrs[within[0]]) if len(within) == 1 else None

    n_in = len(launch_ptrs) - len(outputs)
    n_head = next((i for i in range(n_in + 1) if launch_ptrs[i:i + len(outputs)] == tuple(map(_DATA_PTR, outputs))),
                  None)
    if n_head is None or any(y._version for y in outputs) or (ht is not None and ht._version):
        return None
    sources = [source(p) for p in (*launch_ptrs[:n_head], *launch_ptrs[n_head + len(outputs):])]
    if None in sources:
        return None

    def ref(x):
        if x is ht and ht is not None:
            return -1
        return next((i for i, y in enumerate(outputs) if x is y), None)

    refs = ref(result) if type(result) is _TENSOR else (
        tuple(map(ref, result)) if type(result) is tuple and all(type(x) is _TENSOR for x in result) else None)
    if refs is None or (type(refs) is tuple and None in refs):
        return None
    settings = plan.lean.settings()
    index = layout.device.index  # (None: CPU tensors, launched on stand-ins in the tests)
    if settings is None or index is not None and settings[0] != index:  # launched under another current device
        return None
    cvals = tuple(c if type(c) is float else None for c in cvals)  # a tensor's pointer is one of the sources
    return _with_fast(Entry(plan, layout, settings, len(outputs), tuple(sources[:n_head]), tuple(sources[n_head:]),
                            cvals, refs))


def _extent(x: torch.Tensor) -> int:
    """Bytes from ``x``'s data pointer to one past its last element (1 for an empty tensor)."""
    if not x.numel():
        return 1
    return x.element_size() * (1 + sum((n - 1) * s for n, s in zip(x.shape, x.stride()) if s > 0))


def replayable(fn):
    """``fn`` with call replay (see the module docstring)."""

    @functools.wraps(fn)
    def call(*args, **kwargs):
        if not REPLAY or torch.compiler.is_compiling():
            return fn(*args, **kwargs)
        fast = _FAST
        if fast is not None:
            out = fast.call(call, args, kwargs)  # a call whose facts it remembers, or None
            if out is not None:
                return out
        else:
            if _getenv is None:
                _bind()
            if _READY is not None:
                _adopt()
                fast = _FAST
        sig = signature(call, args, kwargs)
        if sig is None:
            return fn(*args, **kwargs)
        key, ptrs = sig
        entry = _ENTRIES.get(key, 0)  # an int: the recordings of this signature that gave no entry so far
        stack = _recordings()
        if type(entry) is int:
            if entry >= RECORDINGS:
                return fn(*args, **kwargs)
        elif not stack:
            try:
                out = entry.replay(ptrs)
            except Exception:  # noqa: BLE001 - anything unexpected: forgotten, and the plain way (which raises)
                out = None
                _ENTRIES.pop(key, None)
            if out is not None:
                if fast is not None and entry.fast is not None:
                    fast.remember(call, args, kwargs, entry)  # the next call with these facts is made in C++
                elif not _FAST_STARTED and entry.plan.native is not None:
                    _start_fast()
                return out
        rec = _Recording()
        stack.append(rec)
        try:
            result = fn(*args, **kwargs)
        finally:
            stack.pop()
        if type(entry) is int:
            made = _entry(rec, args, kwargs, ptrs, result) if rec.launches else None
            if len(_ENTRIES) >= _MAX_ENTRIES:
                _ENTRIES.clear()
            # (a launch without a plan, as while the launcher takes the plain path, is not counted against it)
            _ENTRIES[key] = made if made is not None else RECORDINGS if not rec.launches else entry + (
                not rec.unplanned)
            if made is not None and made.fast is not None and fast is not None:
                fast.remember(call, args, kwargs, made)  # the next call with these facts is made in C++
        return result

    return call
