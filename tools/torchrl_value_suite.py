"""Pytest plugin: run TorchRL's own value tests with our classes and vectorised functionals swapped in.

TorchRL's ``test/objectives/test_values.py`` (pytorch/rl, with ``_objectives_common.py`` beside it) compares its
estimator classes and ``vec_*`` functionals against its loop functionals. This plugin replaces, before the test
module imports them, the classes and the ``vec_*`` functionals by ours and leaves the loop functionals TorchRL's,
so every comparison in that file becomes ours-against-TorchRL. Usage (the test files are not part of this repo):

    cd <dir with test_values.py and _objectives_common.py>
    PYTHONPATH=<this repo>:<this repo>/tools python -m pytest test_values.py -p torchrl_value_suite -q

Set RL_TRITON_TORCHRL_BACKEND=triton (and TRITON_INTERPRET=1 without a GPU) to run the Triton kernels.
"""
import torchrl.objectives.value as value
import torchrl.objectives.value.advantages as advantages
import torchrl.objectives.value.functional as functional

import rl_triton_torchrl as ours

CLASSES = [name for name in ("GAE", "MultiAgentGAE", "TD0Estimator", "TD1Estimator", "TDLambdaEstimator", "VTrace")
           if name in dir(ours.estimators)]
VECTORISED = [name for name in functional.__all__ if name.startswith("vec_")]

for name in CLASSES:
    for module in (advantages, value):
        setattr(module, name, getattr(ours.estimators, name))
for name in VECTORISED:
    setattr(functional, name, getattr(ours.functional, name))
print(f"torchrl_value_suite: ours for {CLASSES + VECTORISED}")
