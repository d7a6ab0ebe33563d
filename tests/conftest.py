import pytest
import torch


@pytest.fixture(autouse=True)
def _fresh_compiles():
    """Each test compiles for real: pass records come only from real compiles,
    never from Inductor's FX graph cache."""
    torch._dynamo.reset()
    with torch._inductor.config.patch(fx_graph_cache=False):
        yield
    torch._dynamo.reset()
