"""Run an unmodified TorchRL script with ``patch_torchrl()`` on, and report which of our classes it used.

``python tools/run_patched.py SCRIPT [ARGS...]`` patches TorchRL, counts the constructions and calls of our estimator
classes and functionals, runs ``SCRIPT`` as ``__main__`` (its folder first on ``sys.path``, ``ARGS`` as its
``sys.argv``: hydra overrides for TorchRL's sota-implementations) and, when the script ends (also through
``sys.exit``), prints the counts. The exit status is 3 when ``--require CLASS`` is given and CLASS's estimate never
ran. Example (TorchRL's PPO on MuJoCo for 4096 frames on the CPU)::

    python tools/run_patched.py <rl>/sota-implementations/ppo/ppo_mujoco.py --require GAE \\
        logger.backend= collector.total_frames=4096 collector.frames_per_batch=1024 optim.device=cpu

The script's own files are not part of this repository.
"""
from __future__ import annotations

import atexit
import collections
import functools
import os
import runpy
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # this repository's rl_triton_torchrl

import rl_triton_torchrl  # noqa: E402
from rl_triton_torchrl import estimators, functional  # noqa: E402

CALLS = collections.Counter()


def _counted(label, fn):
    @functools.wraps(fn)
    def counted(*args, **kwargs):
        CALLS[label] += 1
        return fn(*args, **kwargs)

    return counted


def _instrument() -> None:
    """Counters around our classes' constructors, ``forward`` and ``value_estimate``, and around the functionals
    ``patch_torchrl`` installs (before it installs them)."""
    for name in estimators.EXPECTED_FUNCTIONALS:
        cls = getattr(estimators, name)
        cls.__init__ = _counted(f"{name}()", cls.__init__)
        cls.value_estimate = _counted(f"{name}.value_estimate", cls.value_estimate)
        cls.forward = _counted(f"{name}.forward", cls.forward)
    table = rl_triton_torchrl.patch.PATCHES
    for i, (module, attr, replacement) in enumerate(table):
        if callable(replacement) and getattr(replacement, "__module__", "") == functional.__name__:
            table[i] = (module, attr, _counted(f"functional.{attr}", replacement))


def _report(required: list[str]) -> None:
    print("run_patched: calls of rl_triton_torchrl: " + (", ".join(f"{k} {v}" for k, v in sorted(CALLS.items()))
                                                         or "none"), flush=True)
    missing = [c for c in required if not (CALLS[f"{c}.forward"] or CALLS[f"{c}.value_estimate"])]
    if missing:
        print(f"run_patched: the estimate of {', '.join(missing)} never ran", flush=True)
        os._exit(3)


def main() -> None:
    args = sys.argv[1:]
    required = []
    while len(args) >= 2 and args[0] == "--require":
        required.append(args[1])
        args = args[2:]
    if not args:
        sys.exit(__doc__)
    script, script_args = Path(args[0]).resolve(), args[1:]
    _instrument()
    rl_triton_torchrl.patch_torchrl()
    atexit.register(_report, required)
    sys.argv = [str(script), *script_args]
    sys.path.insert(0, str(script.parent))
    runpy.run_path(str(script), run_name="__main__")


if __name__ == "__main__":
    main()
