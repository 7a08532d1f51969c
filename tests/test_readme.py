"""The README's runnable snippets run."""
import re
from pathlib import Path

import pytest

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
BLOCKS = re.findall(r"```python\n(.*?)```", README, flags=re.S)
# the self-contained snippets (the quickstart's two-line import swap is a fragment)
RUNNABLE = [b for b in BLOCKS if "--estimator" not in b and any(
    m in b for m in ("from rl_triton_torchrl import GAE", "patch_torchrl()",
                     "from rl_triton_torchrl import EpisodicPrefixSum"))]


@pytest.mark.parametrize("block", RUNNABLE, ids=[f"block{i}" for i in range(len(RUNNABLE))])
def test_snippet_runs(block):
    namespace = {}
    exec(compile(block, "README.md", "exec"), namespace)
    if "from rl_triton_torchrl import GAE" in block:
        assert "advantage" in namespace["rollout"].keys()
    if "from rl_triton_torchrl import EpisodicPrefixSum" in block:
        assert "episode_return_so_far" in namespace["rollout"].keys()


def test_snippets_found():
    assert len(RUNNABLE) == 3
