"""Every Python block of README.md runs as written, and says what it computes: its numbers against TorchRL's
estimators and functionals, or against a plain loop."""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch

from _helpers import assert_close

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)


def run(block: str) -> dict:
    namespace = {"__name__": "readme"}
    torch.manual_seed(0)
    exec(compile(block, "README.md", "exec"), namespace)
    return namespace


def check_import_swap(ns):
    import rl_triton_torchrl

    assert ns["GAE"] is rl_triton_torchrl.GAE


def check_estimator(ns):
    """The advantage module's outputs against TorchRL's own GAE on the same rollout."""
    from torchrl.objectives.value import GAE as TorchRLGAE

    rollout = ns["rollout"]
    expected = TorchRLGAE(gamma=0.99, lmbda=0.95, value_network=None)(rollout.exclude("advantage", "value_target"))
    for key in ("advantage", "value_target"):
        assert_close(key, rollout[key], expected[key])


def check_patch(ns):
    import torchrl.objectives.value as V
    from torchrl.objectives.value.advantages import GAE as TorchRLGAE

    assert V.GAE is TorchRLGAE, "unpatch_torchrl() must restore TorchRL's GAE"


def check_prefix_sum(ns):
    """The return and length of the episode so far, against a loop (the sums restart after each done step)."""
    rollout = ns["rollout"]
    reward, done = rollout["next", "reward"], rollout["next", "done"]
    total, length = torch.zeros_like(reward), torch.zeros_like(reward)
    for b in range(reward.shape[0]):
        running, steps = 0.0, 0
        for t in range(reward.shape[1]):
            running, steps = running + reward[b, t, 0].item(), steps + 1
            total[b, t, 0], length[b, t, 0] = running, steps
            if done[b, t, 0]:
                running, steps = 0.0, 0
    assert_close("episode_return_so_far", rollout["episode_return_so_far"], total)
    assert_close("episode_length_so_far", rollout["episode_length_so_far"].to(total.dtype), length)


def check_functionals(ns):
    from torchrl.objectives.value import functional as TF

    args = [ns[k] for k in ("state_value", "next_state_value", "reward", "done", "terminated")]
    advantage, value_target = TF.generalized_advantage_estimate(0.99, 0.95, *args, time_dim=-2)
    assert_close("advantage", ns["advantage"], advantage)
    assert_close("value_target", ns["value_target"], value_target)
    returns = TF.td_lambda_return_estimate(0.99, 0.95, *args[1:])
    assert_close("returns", ns["returns"], returns)


def check_sb3(ns):
    import rl_triton_torchrl.sb3

    model = ns["model"]
    assert isinstance(model.rollout_buffer, rl_triton_torchrl.sb3.RolloutBuffer)
    assert model.num_timesteps >= 256


def check_kernels(ns):
    """``gae`` against TorchRL's functional; the carried state against the one-call result (checked in the block
    itself); ``linear_scan`` against a float64 loop."""
    from torchrl.objectives.value import functional as TF

    advantage, value_target = TF.generalized_advantage_estimate(
        0.99, 0.95, ns["state_value"], ns["next_state_value"], ns["reward"], ns["done"], ns["terminated"])
    assert_close("adv", ns["adv"], advantage)
    assert_close("target", ns["target"], value_target)
    a, b = ns["a"].double(), ns["b"].double()
    h, state = torch.empty_like(b), torch.zeros_like(b[:, 0])
    for t in reversed(range(b.shape[1])):
        state = a[:, t] * state + b[:, t]
        h[:, t] = state
    assert_close("h", ns["h"], h, torch.float32)


def check_rsl_rl(ns):
    """The runner built our PPO from the config line, and its ``compute_returns`` gives rsl_rl's numbers on the
    trained runner's storage."""
    import rl_triton_torchrl.rsl_rl as ours
    from rsl_rl.algorithms import PPO as RslRlPPO

    alg = ns["runner"].alg
    assert type(alg) is ours.PPO
    st = alg.storage
    last_obs = ns["env"].get_observations().to(alg.device)
    with torch.inference_mode():  # as the runner calls them
        alg.compute_returns(last_obs)
        returns, advantages = st.returns.clone(), st.advantages.clone()
        RslRlPPO.compute_returns(alg, last_obs)  # rsl_rl's loop on the same storage and last observation
    assert_close("returns", returns, st.returns)
    assert_close("advantages", advantages, st.advantages)


# what identifies each block (a line only it has) -> the check of what it computed
CHECKS = {
    "from rl_triton_torchrl import GAE          # --estimator triton": check_import_swap,
    "advantage_module(rollout)": check_estimator,
    "rl_triton_torchrl.patch_torchrl()": check_patch,
    "EpisodicPrefixSum()(rollout)": check_prefix_sum,
    "from rl_triton_torchrl import functional as F": check_functionals,
    "from stable_baselines3 import PPO": check_sb3,
    "from rl_triton_torchrl.kernels import gae, linear_scan": check_kernels,
    '"rl_triton_torchrl.rsl_rl:PPO"': check_rsl_rl,
}


def check_of(block: str):
    matches = [check for marker, check in CHECKS.items() if marker in block]
    assert len(matches) == 1, f"README block matches {len(matches)} checks (add one to CHECKS):\n{block}"
    return matches[0]


@pytest.mark.parametrize("block", BLOCKS, ids=[f"block{i}-{check_of(b).__name__[6:]}" for i, b in enumerate(BLOCKS)])
def test_block_runs(block):
    if "stable_baselines3" in block:
        pytest.importorskip("stable_baselines3")
    if "rsl_rl" in block:
        pytest.importorskip("rsl_rl")
    check_of(block)(run(block))


def test_every_check_has_its_block():
    assert sorted(check_of(b).__name__ for b in BLOCKS) == sorted(c.__name__ for c in CHECKS.values())
