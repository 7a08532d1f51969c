"""rl_triton_torchrl: fused Triton kernels for RL credit assignment, as drop-in TorchRL estimators.

- ``rl_triton_torchrl.kernels``: the kernels and their plain-torch path (needs only torch, and triton for the
  kernels).
- ``rl_triton_torchrl.functional``: TorchRL's value functionals, same names and signatures.
- ``GAE``, ``MultiAgentGAE``, ``TD0Estimator``, ``TD1Estimator``, ``TDLambdaEstimator``: TorchRL's estimator
  classes with the math on our kernels.
- ``Retrace``, ``EligibilityTraces``, ``EpisodicPrefixSum``: TensorDict modules, in TorchRL's style, for what
  TorchRL lacks.
- ``patch_torchrl()`` / ``unpatch_torchrl()`` / ``torchrl_patched()``: make unmodified TorchRL code use them.
- ``normalize_advantage`` / ``normalize_tensordict_advantage`` (``rl_triton_torchrl.distributed``): advantage
  normalisation over the global batch of a data-parallel run (one all-reduce; local without torch.distributed).

Everything but ``kernels`` needs TorchRL; it is imported on first use, so ``rl_triton_torchrl.kernels`` works
with torch alone (its torch path) or torch and triton (the kernels; Linux).
"""
import importlib

from . import kernels
from .kernels import InputError

__version__ = "0.1.0"

# public name -> submodule that defines it (imported on first access)
_LAZY = {
    "functional": None,
    "estimators": None,
    "patch": None,
    "modules": None,
    "sb3": None,
    "distributed": None,
    "GAE": "estimators",
    "MultiAgentGAE": "estimators",
    "TD0Estimator": "estimators",
    "TD1Estimator": "estimators",
    "TDLambdaEstimator": "estimators",
    "VTrace": "estimators",
    "Retrace": "modules",
    "EligibilityTraces": "modules",
    "EpisodicPrefixSum": "modules",
    "patch_torchrl": "patch",
    "unpatch_torchrl": "patch",
    "torchrl_patched": "patch",
    "normalize_advantage": "distributed",
    "normalize_tensordict_advantage": "distributed",
}

__all__ = ["kernels", "InputError", "__version__", *_LAZY]


def __dir__():
    """The public names, the lazily imported ones too (tab completion, ``dir()``)."""
    return sorted(set(globals()) | set(__all__))


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'rl_triton_torchrl' has no attribute {name!r}")
    module = importlib.import_module(f".{_LAZY[name] or name}", __name__)
    value = module if _LAZY[name] is None else getattr(module, name)
    globals()[name] = value
    return value
