"""Every fused kernel compiles for sm_90 (H100/H200) with Triton's own compiler and assembler, on any machine: the
interpreter runs a kernel's Python, not its compilation, so code the compiler rejects would pass every other test
on a machine without a GPU (``tools/compile_sm90.py``)."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.triton  # Triton's own compiler and assembler
TOOL = Path(__file__).resolve().parent.parent / "tools" / "compile_sm90.py"


def test_every_kernel_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(TOOL)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert "0 failed" in proc.stdout


def _sass(*args):
    """``tools/sass_sm90.py`` with ``args`` (outside the interpreter), asserted to succeed."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, str(TOOL.parent / "sass_sm90.py"), *args], env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    return proc


def test_sass_counts_of_a_kernel():
    """``tools/sass_sm90.py`` compiles a kernel for sm_90 with the specialization of real arguments and counts its
    SASS: a GAE tile of 128 steps reverses itself (warp-local gather) and scans forward, with no shared memory; on rows
    of several chunks (pipelined: ``scan.PIPELINE_STAGES``) its loads are asynchronous copies into shared memory (no
    plain global load) and the reversal still writes nothing there. Every value of the kernel is in one layout (no
    layout conversion in Triton's GPU IR), and nothing spills."""
    proc = _sass("--shapes", "2048x128,2048x256", "--algorithms", "gae")
    one, several = (dict(re.findall(r"(tile|total|STS|LDS|BAR|LDG|STL|CVT)\s+(\S+)", ln))
                    for ln in proc.stdout.splitlines() if "_gae_fwd_kernel" in ln)
    assert one["tile"] == several["tile"] == "4x128" and int(one["total"]) > 0, proc.stdout
    assert one["STS"] == "0" and one["LDS"] == "0" and one["BAR"] == "0", proc.stdout
    assert one["CVT"] == several["CVT"] == "0" and one["STL"] == several["STL"] == "0", proc.stdout
    assert several["STS"] == "0" and several["LDG"] == "0", proc.stdout


def test_sass_of_a_16bit_row_tile_of_256_steps():
    """Many bfloat16 rows of several chunks take 2 x 256 row tiles (``scan.TILE256_*``: 8 values per lane, one
    16-byte load), pipelined (asynchronous copies, no plain global load), and their reversal in the warp writes
    nothing to shared memory."""
    proc = _sass("--shapes", "16384x512", "--algorithms", "gae", "--dtype", "bfloat16")
    (counts,) = (dict(re.findall(r"(tile|warps|STS|LDG)\s+(\S+)", ln))
                 for ln in proc.stdout.splitlines() if "_gae_fwd_kernel" in ln)
    assert counts["tile"] == "2x256" and counts["warps"] == "2", proc.stdout
    assert counts["STS"] == "0" and counts["LDG"] == "0", proc.stdout
