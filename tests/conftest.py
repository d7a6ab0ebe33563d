import os

import pytest
import torch

# Triton kernels run on CPU tensors in the interpreter when no GPU is present.
# The variable is read when a kernel is decorated, so set it before any
# dspark_compile.kernels module is imported.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


import dspark_compile.backend  # noqa: E402,F401  (registers backend="dspark", also uninstalled)


@pytest.fixture(autouse=True)
def _fresh_compiles():
    """Each test compiles for real: pass records come only from real compiles,
    never from Inductor's FX graph cache."""
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False):
        yield
    torch._dynamo.reset()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    """A test that fails only because of the Triton-interpreter/NumPy defect is skipped
    with that reason: under ``TRITON_INTERPRET=1``, the error is the defect's
    ``TypeError`` raised inside Triton (``tests/triton_probe.py``), and an independent
    probe confirms this Triton has the defect. Every other failure stands."""
    from tests.triton_probe import interpreter_defect, raised_by_defect

    try:
        return (yield)
    except Exception as error:
        if (
            os.environ.get("TRITON_INTERPRET") == "1"
            and raised_by_defect(error)
            and interpreter_defect()
        ):
            pytest.skip(interpreter_defect())
        raise
