"""Advantage normalisation over the global batch: in two gloo processes, each holding a slice, it equals normalising
the concatenated batch with TorchRL's ClipPPOLoss formula; in one process it is that formula. The data-parallel PPO
example trains, checkpoints and resumes under torchrun (2 CPU processes, a few tiny iterations)."""
from __future__ import annotations

import csv
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tensordict import TensorDict
from tensordict.nn import TensorDictModule
from torch import nn
from torchrl.modules import OneHotCategorical, ProbabilisticActor, ValueOperator
from torchrl.objectives import ClipPPOLoss

from _helpers import assert_close
from rl_triton_torchrl.distributed import normalize_advantage, normalize_tensordict_advantage

ROOT = Path(__file__).resolve().parent.parent


def torchrl_normalisation(advantage, mask=None):
    """TorchRL's own ClipPPOLoss(normalize_advantage=True) on ``advantage`` (its forward does not return the
    normalised advantage, so the method it calls is called here)."""
    actor = ProbabilisticActor(TensorDictModule(nn.Linear(3, 2), in_keys=["observation"], out_keys=["logits"]),
                               in_keys=["logits"], distribution_class=OneHotCategorical, return_log_prob=True)
    loss = ClipPPOLoss(actor, ValueOperator(nn.Linear(3, 1), in_keys=["observation"]), normalize_advantage=True)
    batch = TensorDict({} if mask is None else {"shifted_valid": mask}, batch_size=advantage.shape[:-1])
    return loss._maybe_normalize_advantage(advantage, batch, update_norm=False)


def env_with_repo():
    env = dict(os.environ, OMP_NUM_THREADS="1")
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---- one process ----

@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("shape", [(8, 33, 1), (3, 1, 1), (1000, 1)], ids=lambda s: "x".join(map(str, s)))
def test_single_process_equals_torchrl(shape, masked, dtype):
    g = torch.Generator().manual_seed(0)
    advantage = (torch.randn(shape, generator=g, dtype=torch.float64) * 3 + 2).to(dtype)
    mask = torch.rand(shape[:-1], generator=g) < 0.7 if masked else None
    expected = torchrl_normalisation(advantage, mask)
    assert_close("normalize_advantage", normalize_advantage(advantage, mask=mask), expected)
    td = TensorDict({"adv": advantage.clone(), "valid": mask} if masked else {"adv": advantage.clone()},
                    batch_size=shape[:-1])
    normalize_tensordict_advantage(td, key="adv", mask_key="valid" if masked else None)
    assert_close("normalize_tensordict_advantage", td["adv"], expected)


def test_single_process_edge_cases():
    constant = torch.full((4, 5, 1), 2.5)  # std 0: floored by eps, as TorchRL does
    assert_close("constant", normalize_advantage(constant), torchrl_normalisation(constant))
    one = torch.tensor([[3.0]])  # at most one element: returned unchanged, as TorchRL leaves it
    assert normalize_advantage(one) is one
    with pytest.raises(RuntimeError, match="not initialised"):
        normalize_advantage(torch.randn(4, 1), group=object())
    with pytest.raises(TypeError, match="floating-point"):
        normalize_advantage(torch.arange(4))
    with pytest.raises(ValueError, match="does not broadcast"):
        normalize_advantage(torch.randn(4, 3, 1), mask=torch.ones(5, 3, dtype=torch.bool))


# ---- two gloo processes ----

WORKER = r"""
import sys

import torch
import torch.distributed as dist

from rl_triton_torchrl.distributed import normalize_advantage

rank, world_size, workdir = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
dist.init_process_group("gloo", init_method=f"file://{workdir}/store", rank=rank, world_size=world_size)
outputs = {}
for name, case in torch.load(f"{workdir}/inputs.pt").items():
    lo, hi = case["bounds"][rank], case["bounds"][rank + 1]  # this rank's rows of the batch
    mask = None if case["mask"] is None else case["mask"][lo:hi]
    group = dist.new_group(list(range(world_size))) if case["group"] else None  # every rank, same order
    outputs[name] = normalize_advantage(case["advantage"][lo:hi], mask=mask, group=group)
torch.save(outputs, f"{workdir}/out{rank}.pt")
dist.destroy_process_group()
"""


def test_two_processes_equal_concatenated_batch(tmp_path):
    g = torch.Generator().manual_seed(1)

    def case(rows, bounds, dtype=torch.float32, masked=False, group=False, shape=(33, 1)):
        advantage = (torch.randn(rows, *shape, generator=g, dtype=torch.float64) * 3 + 2).to(dtype)
        mask = torch.rand(rows, *shape[:-1], generator=g) < 0.7 if masked else None
        return dict(advantage=advantage, mask=mask, bounds=bounds, group=group)

    cases = {
        "float32-uneven": case(6, [0, 2, 6]),
        "float64": case(5, [0, 1, 5], dtype=torch.float64, shape=(17, 1)),
        "mask": case(6, [0, 3, 6], masked=True),
        "group": case(6, [0, 4, 6], group=True),
        "rank0-empty": case(6, [0, 0, 6]),
        "mask-uneven": case(7, [0, 5, 7], masked=True, shape=(1,)),
    }
    torch.save(cases, tmp_path / "inputs.pt")
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    procs = [subprocess.Popen([sys.executable, str(script), str(rank), "2", str(tmp_path)], env=env_with_repo(),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for rank in range(2)]
    for rank, proc in enumerate(procs):
        out, _ = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"rank {rank} failed:\n{out[-3000:]}"
    outputs = [torch.load(tmp_path / f"out{rank}.pt") for rank in range(2)]
    for name, c in cases.items():
        expected = torchrl_normalisation(c["advantage"], c["mask"])
        for rank in range(2):
            lo, hi = c["bounds"][rank], c["bounds"][rank + 1]
            assert_close(f"{name} rank {rank}", outputs[rank][name], expected[lo:hi])


# ---- the data-parallel PPO example under torchrun ----

def torchrun(tmp_path, *args, nproc=2):
    cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", "--nnodes=1",
           "--master_addr=127.0.0.1", f"--master_port={free_port()}", str(ROOT / "examples" / "ppo_ddp.py"),
           "--num-envs", "4", "--rollout-len", "8", "--epochs", "2", "--minibatch-size", "16", "--no-progress",
           "--cross-check", "--out", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "ckpt.pt"), *args]
    result = subprocess.run(cmd, env=env_with_repo(), capture_output=True, text=True, timeout=300)
    # the head of stderr as well: a rank's own error comes before torchrun's long report of it
    assert result.returncode == 0, (f"{' '.join(cmd)} exited {result.returncode}:\n{result.stderr[:3000]}\n...\n"
                                    f"{result.stderr[-3000:]}")
    with open(tmp_path / "out" / "progress.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    return rows, summary, torch.load(tmp_path / "ckpt.pt")


@pytest.mark.parametrize("estimator", ["torchrl", "triton"])
def test_ppo_ddp_trains_checkpoints_and_resumes(tmp_path, estimator):
    # 2 ranks x 4 envs x 8 steps = 64 frames per iteration: 2 iterations
    rows, summary, ckpt = torchrun(tmp_path, "--estimator", estimator, "--total-frames", "128")
    assert [int(r["frames"]) for r in rows] == [64, 128]
    for r in rows:
        assert float(r["estimator_time_s"]) > 0 and float(r["update_time_s"]) > 0 and float(r["fps"]) > 0
        for key in ("adv_max_abs_diff", "target_max_abs_diff"):  # both classes on rank 0's batch
            assert float(r[key]) <= 1e-4, f"iteration {r['iteration']}: {key} = {r[key]}"
    assert summary["world_size"] == 2 and summary["total_frames"] == 128 and summary["fps"] > 0
    assert (tmp_path / "out" / "curves.png").read_bytes().startswith(b"\x89PNG")
    assert (ckpt["iteration"], ckpt["frames"]) == (2, 128)
    adam_steps = {int(s["step"]) for s in ckpt["optimizer"]["state"].values()}
    assert adam_steps == {8}, adam_steps  # 2 iterations x 2 epochs x (32 frames per rank / 16) minibatches

    if estimator == "torchrl":  # one resume is enough
        return
    rows, summary, ckpt = torchrun(tmp_path, "--estimator", estimator, "--total-frames", "192",
                                   "--resume", str(tmp_path / "ckpt.pt"))
    assert [int(r["iteration"]) for r in rows] == [0, 1, 2] and int(rows[-1]["frames"]) == 192
    assert float(rows[-1]["lr"]) == pytest.approx(1e-3 / 3, rel=1e-2)  # the schedule continues at iteration 2 of 3
    assert (summary["start_iteration"], summary["iterations"], summary["total_frames"]) == (2, 1, 192)
    assert (ckpt["iteration"], ckpt["frames"]) == (3, 192)
    adam_steps = {int(s["step"]) for s in ckpt["optimizer"]["state"].values()}
    assert adam_steps == {12}, adam_steps  # the restored optimiser's 8 steps, plus 4
