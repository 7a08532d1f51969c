"""rl_triton_torchrl: fused Triton kernels for RL credit assignment, as drop-in TorchRL estimators.

- ``rl_triton_torchrl.kernels``: the kernels and their plain-torch CPU path (needs only torch + triton).
- ``rl_triton_torchrl.functional``: TorchRL's value functionals, same names and signatures.
"""
from . import functional, kernels
from .kernels import InputError

__version__ = "0.1.0"

__all__ = ["functional", "kernels", "InputError", "__version__"]
