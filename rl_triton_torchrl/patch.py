"""Make unmodified TorchRL code use our kernels: ``patch_torchrl()``, ``unpatch_torchrl()``, ``torchrl_patched()``.

One table (``PATCHES``) names every place that changes; patching and unpatching both read it. Patched:

- the value-estimator registry, so that ``loss.make_value_estimator(ValueEstimators.GAE, ...)`` and the losses'
  defaults (``ClipPPOLoss``, ``A2CLoss``, ...) build our estimator classes;
- the module globals TorchRL's estimator classes look their functionals up in
  (``torchrl.objectives.value.advantages``), so already-built TorchRL estimators compute with our kernels too;
- the public names in ``torchrl.objectives.value`` (classes) and ``torchrl.objectives.value.functional``
  (functionals), and DreamerV3's imported lambda-return functionals.

``unpatch_torchrl()`` puts back exactly the objects that were there before.
"""
from __future__ import annotations

import contextlib
import importlib

from . import estimators, functional

__all__ = ["patch_torchrl", "unpatch_torchrl", "torchrl_patched", "is_patched", "PATCHES"]

_FUNCTIONALS = [n for n in functional.__all__ if n != "reward2go"]
_CLASSES = ["GAE", "MultiAgentGAE", "TD0Estimator", "TD1Estimator", "TDLambdaEstimator", "VTrace"]
_CLASSES = [c for c in _CLASSES if hasattr(estimators, c)]

# (module, attribute, replacement): every module global that patching replaces.
PATCHES = (
    [("torchrl.objectives.value.advantages", name, getattr(functional, name))
     for name in estimators.TORCHRL_FUNCTIONALS]
    + [("torchrl.objectives.value.functional", name, getattr(functional, name)) for name in _FUNCTIONALS]
    + [("torchrl.objectives.value.functional", "reward2go", functional.reward2go)]
    + [("torchrl.objectives.dreamer_v3", name, getattr(functional, name))
       for name in ("td_lambda_return_estimate", "vec_td_lambda_return_estimate")]
    + [(mod, cls, getattr(estimators, cls))
       for mod in ("torchrl.objectives.value", "torchrl.objectives.value.advantages") for cls in _CLASSES]
)

_saved: dict | None = None


def _registry():
    from torchrl.objectives import utils

    return utils._VALUE_ESTIMATOR_REGISTRY, utils._ValueEstimatorRegistryEntry


def is_patched() -> bool:
    return _saved is not None


def patch_torchrl() -> None:
    """Routes TorchRL's value estimators and functionals to ours. Idempotent.

    Every place of ``PATCHES`` is looked up before anything is replaced: if one is missing (a TorchRL release
    renamed or moved it), nothing is patched and ``TorchRLCouplingError`` (an ``ImportError``) names the module and
    the attribute. A partial patch would leave some of TorchRL's math in place silently.

    Raises:
        TorchRLCouplingError: a module of ``PATCHES`` lacks the attribute to replace.
    """
    global _saved
    if _saved is not None:
        return
    targets = []
    for mod_name, attr, replacement in PATCHES:
        module = importlib.import_module(mod_name)
        if not hasattr(module, attr):
            raise estimators.TorchRLCouplingError(
                f"patch_torchrl: {mod_name} has no attribute {attr!r} to replace (TorchRL "
                f"{getattr(importlib.import_module('torchrl'), '__version__', '?')}); nothing was patched")
        targets.append((module, attr, replacement))
    saved = {"globals": [], "registry": {}}
    for module, attr, replacement in targets:
        saved["globals"].append((module, attr, getattr(module, attr)))
        setattr(module, attr, replacement)
    registry, entry_cls = _registry()
    ours = {c.__mro__[2]: c for c in (getattr(estimators, name) for name in _CLASSES)}
    for key, entry in list(registry.items()):
        if entry.cls in ours:
            saved["registry"][key] = entry
            registry[key] = entry_cls(ours[entry.cls], entry.default_kwargs)
    _saved = saved


def unpatch_torchrl() -> None:
    """Restores exactly what ``patch_torchrl`` replaced. A no-op when not patched."""
    global _saved
    if _saved is None:
        return
    for module, attr, original in reversed(_saved["globals"]):
        setattr(module, attr, original)
    registry, _ = _registry()
    registry.update(_saved["registry"])
    _saved = None


@contextlib.contextmanager
def torchrl_patched():
    """``with torchrl_patched(): ...`` runs the block with TorchRL patched, and restores it after (if it was not
    patched before)."""
    was = is_patched()
    patch_torchrl()
    try:
        yield
    finally:
        if not was:
            unpatch_torchrl()
