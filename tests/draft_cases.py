"""Shared builders for tests that run the reference DFlash draft (see dspark_compile.testing)."""

from __future__ import annotations

import torch

from dspark_compile.models import DraftModelConfig
from dspark_compile.testing import DraftCase, make_draft_case as _make_draft_case

__all__ = ["DraftCase", "cuda_args", "make_draft_case", "post_pass_graph", "run_eager_reference"]


def make_draft_case(
    seq_lens, q_lens, *, causal=False, num_layers=3, block_size=4, seed=0
) -> DraftCase:
    cfg = DraftModelConfig(
        hidden_size=64,
        num_layers=num_layers,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        intermediate_size=96,
        causal=causal,
    )
    return _make_draft_case(seq_lens, q_lens, config=cfg, block_size=block_size, seed=seed)


def run_eager_reference(case: DraftCase, window_size, future_offset=0, sink_size=0):
    """Eager model, attention masked to the window (and sinks) on the full table;
    returns (out, caches)."""
    return case.run_reference(window_size, future_offset, sink_size)


def cuda_args(case: DraftCase) -> tuple:
    """``case.args()`` (the draft's forward arguments) copied to CUDA."""
    return tuple([t.cuda() for t in a] if isinstance(a, list) else a.cuda() for a in case.args())


def post_pass_graph(case: DraftCase, options) -> torch.fx.Graph:
    """The forward ATen graph after our passes (decompositions "none", aot_autograd),
    from one static-shape run of ``case.model`` compiled with ``DraftWindowConfig(**options)``."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    from dspark_compile.backend import build_passes
    from dspark_compile.config import DraftWindowConfig
    from dspark_compile.passes import PassManager

    manager = PassManager(build_passes(DraftWindowConfig(**options), "none"))
    seen = {}

    def fw(gm, _):
        manager(gm.graph)
        gm.recompile()
        seen["graph"] = gm.graph
        return make_boxed_func(gm)

    torch._dynamo.reset()
    compiled = torch.compile(case.model, backend=aot_autograd(fw_compiler=fw), dynamic=False)
    with torch.no_grad():
        compiled(*case.args(*case.clone_caches()))
    return seen["graph"]
