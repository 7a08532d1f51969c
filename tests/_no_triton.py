"""Runs Python as if Triton were not installed: ``import triton`` (and any ``triton.*``) raises ModuleNotFoundError.

    python tests/_no_triton.py -c "import rl_triton_torchrl"
    python tests/_no_triton.py -m pytest tests/test_estimators.py -q

A finder first on ``sys.meta_path`` refuses the names, as a missing package would; torch, TorchRL and this package
then take the paths they take where Triton is absent. CI also runs the tests in an environment where Triton is
really not installed (``.ci/run``); this is the quick way, in any environment.
"""
import runpy
import sys


class BlockTriton:
    """A ``sys.meta_path`` finder under which ``triton`` and its submodules cannot be imported."""

    def find_spec(self, name, path=None, target=None):
        if name == "triton" or name.startswith("triton."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


def block_triton() -> None:
    if any(name == "triton" or name.startswith("triton.") for name in sys.modules):
        raise RuntimeError("triton is already imported")
    sys.meta_path.insert(0, BlockTriton())


if __name__ == "__main__":
    if len(sys.argv) < 3 or sys.argv[1] not in ("-c", "-m"):
        raise SystemExit(__doc__)
    block_triton()
    flag, target, *rest = sys.argv[1:]
    if flag == "-c":
        sys.argv = ["-c", *rest]
        exec(compile(target, "<string>", "exec"), {"__name__": "__main__"})
    else:
        sys.argv = [target, *rest]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
