"""What a replayed kernels-API call pays on the host, piece by piece, and every algorithm with call replay on and off.

A bare call at 4096 x 128 float32 (one GAE rollout, ``[B, T, 1]``) that call replay serves (``kernels._replay``) does
four things: the signature of its arguments and its dictionary look-up, the launcher's settings, two new outputs, and
the launch (one ``struct.pack_into`` and the driver's ``cuLaunchKernel`` through ctypes). This script times each of
them alone, and what torch and the driver cost for the same work in other ways (one output, one allocation for both,
a launch with its ctypes arguments built once), so that the floor of a Python call path on this host reads off the
table; and the same call made whole by the C++ extension (``kernels._fastcall``), the look-up of its remembered
facts alone among them. Then every algorithm's bare call back to back three ways, alternating in one process (the
best of six rounds of each): replayed in C++, replayed in Python (``_replay._FAST`` None), and not replayed
(``_replay.REPLAY`` off): the same host, the same moment, the only difference the path.

    python benchmarks/host_floor.py            # on a GPU host: results/h200/host_floor.{json,md}

Each timing is the best of 7 repeats of a loop of ``--calls`` calls (host wall time per call, the device drained
after each loop).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import sys
import timeit

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests"))
from _algos import TABLE, make_rollout  # noqa: E402
from _common import environment, write_results  # noqa: E402

ALGORITHMS = ("gae", "vtrace", "td_lambda", "discounted", "td0", "traces", "sum_after_done", "retrace_discrete")


def _best_us(fn, calls: int, repeats: int = 7) -> float:
    us = min(timeit.repeat(fn, number=calls, repeat=repeats)) / calls * 1e6
    torch.cuda.synchronize()
    return us


def _python_replay(fn):
    """``fn`` with calls replayed in Python (the C++ extension set aside)."""
    from rl_triton_torchrl.kernels import _replay

    def call():
        fast, _replay._FAST = _replay._FAST, None
        try:
            return fn()
        finally:
            _replay._FAST = fast

    return call


def pieces(calls: int) -> list[dict]:
    """The pieces of a replayed GAE call, each alone."""
    from rl_triton_torchrl.kernels import _fastcall, _launcher, _replay, gae, scan

    B, T = 4096, 128
    r, v, nv = (torch.randn(B, T, 1, device="cuda") for _ in range(3))
    done = torch.rand(B, T, 1, device="cuda") < 0.05
    term = done & (torch.rand(B, T, 1, device="cuda") < 0.5)
    args, kw = (r, v, nv, done, term), {"gamma": 0.99, "lmbda": 0.95}
    for _ in range(50):
        gae(*args, **kw)
    torch.cuda.synchronize()
    key, ptrs = _replay.signature(gae, args, kw)
    entry = _replay._ENTRIES[key]
    fast = _fastcall.loaded()
    python_call = _python_replay(lambda: gae(*args, **kw))
    layout, lean, native = entry.layout, entry.plan.lean, entry.plan.native
    outs = scan.new_outputs(layout, 2)
    launch_ptrs = (*ptrs, *[o.data_ptr() for o in outs])
    stream = _launcher.current_stream(0)
    cu_launch = _launcher._LIBCUDA[0]
    g = native.grid
    raw = ctypes.PyDLL("libcuda.so.1").cuLaunchKernel
    raw.restype = ctypes.c_int
    built = (ctypes.c_void_p(native.function), *map(ctypes.c_uint, (*g, native.block, 1, 1, native.shared)),
             ctypes.c_void_p(stream), ctypes.c_void_p(native.params_address), None)
    like = scan._output_like(layout)
    two = (2, *layout.shape)
    c_cases = [] if fast is None or entry.fast is None else [
        ("call", "gae, replayed in C++ (the whole call)", lambda: gae(*args, **kw)),
        ("signature", "C++: the call's facts read and found", lambda: fast.lookup(gae, args, kw)),
    ]
    cases = c_cases + [
        ("call", "gae, replayed in Python (the whole call)", lambda: python_call()),
        ("signature", "signature of the call (5 tensors, 2 floats)", lambda: _replay.signature(gae, args, kw)),
        ("signature", "signature + dictionary look-up", lambda: _replay._ENTRIES.get(_replay.signature(gae, args,
                                                                                                       kw)[0])),
        ("signature", "one tensor's six facts", lambda: (r.shape, r.stride(), r.dtype, r.device, r.requires_grad,
                                                         r.data_ptr())),
        ("settings", "launcher settings()", lean.settings),
        ("outputs", "new_outputs(layout, 2), as replayed", lambda: scan.new_outputs(layout, 2)),
        ("outputs", "2 x torch.empty_like(input)", lambda: (torch.empty_like(r), torch.empty_like(r))),
        ("outputs", "1 x torch.empty_like(stride-0 like)", lambda: torch.empty_like(
            like, memory_format=torch.contiguous_format)),
        ("outputs", "1 x torch.empty(2, *shape) + unbind (one allocation)", lambda: torch.empty(
            two, dtype=layout.dtype, device=layout.device).unbind(0)),
        ("launch", "plan.launch (stream, pack, cuLaunchKernel)", lambda: entry.plan.launch(0, layout, launch_ptrs,
                                                                                          entry.cvals)),
        ("launch", "native launch (pack + cuLaunchKernel)", lambda: native.launch(stream, *launch_ptrs, 0.99, 0.95)),
        ("launch", "struct.pack_into of the per-call values", lambda: native.pack(native.buffer, 0, *launch_ptrs,
                                                                                  0.99, 0.95)),
        ("launch", "cuLaunchKernel through ctypes (argtypes)", lambda: cu_launch(
            native.function, g[0], g[1], g[2], native.block, 1, 1, native.shared, stream, native.params_address,
            None)),
        ("launch", "cuLaunchKernel, ctypes arguments built once", lambda: raw(*built)),
        ("launch", "current stream", lambda: _launcher.current_stream(0)),
    ]
    return [{"part": "piece", "group": group, "what": what, "us": _best_us(fn, calls)} for group, what, fn in cases]


def replay_on_off(calls: int, rounds: int = 6) -> list[dict]:
    """Every algorithm's bare call replayed in C++, in Python and not at all, alternating rounds in this process."""
    from rl_triton_torchrl.kernels import _replay

    x = make_rollout((4096, 128, 1), seed=0)
    rows = []
    for algo in ALGORITHMS:
        call, _, coefs = TABLE[algo]
        fn = lambda: call(x, backend="triton", **coefs)  # noqa: E731
        for _ in range(30):
            fn()
        ways = {"c": fn, "python": _python_replay(fn), "plain": fn}
        best = dict.fromkeys(ways, float("inf"))
        for _ in range(rounds):
            for way, f in ways.items():
                _replay.REPLAY = way != "plain"
                best[way] = min(best[way], _best_us(f, calls, repeats=1))
        _replay.REPLAY = True
        rows.append({"part": "algorithm", "what": algo, "c_us": best["c"], "replay_us": best["python"],
                     "plain_us": best["plain"], "ratio": best["c"] / best["plain"]})
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=20000)
    parser.add_argument("--out", default="h200")
    parser.add_argument("--name", default="host_floor")
    args = parser.parse_args()
    from rl_triton_torchrl.kernels import _fastcall
    print("C++ extension:", _fastcall.load() is not None, _fastcall.status(), flush=True)
    rows = pieces(args.calls)
    for row in rows:
        print(f"{row['what']:56s} {row['us']:7.2f} us", flush=True)
    algos = replay_on_off(max(1, args.calls // 7))
    for row in algos:
        print(f"{row['what']:18s} C++ {row['c_us']:6.2f} us, Python replay {row['replay_us']:6.2f} us, "
              f"plain {row['plain_us']:6.2f} us", flush=True)
    columns = [("part", "part"), ("group", "group"), ("what", "what"), ("us", "µs per call"),
               ("c_us", "replayed in C++ µs"), ("replay_us", "replayed in Python µs"), ("plain_us", "plain µs"),
               ("ratio", "C++ / plain")]
    write_results(args.name, environment(), rows + algos, args.out, columns,
                  "Host time of a replayed call, piece by piece (4096 x 128 float32)",
                  notes="Command: `python benchmarks/host_floor.py`. Each row: host wall time per call, the best "
                        "of 7 loops (pieces) or of 6 alternating rounds (algorithms: replayed in C++, in Python, not "
                        f"replayed). Replay path: {_fastcall.status()}.")


if __name__ == "__main__":
    main()
