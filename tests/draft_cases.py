"""Shared builders for tests that run the reference DFlash draft (see dspark_compile.testing)."""

from __future__ import annotations

from dspark_compile.models import DraftModelConfig
from dspark_compile.testing import DraftCase
from dspark_compile.testing import make_draft_case as _make_draft_case

__all__ = ["DraftCase", "make_draft_case", "run_eager_reference"]


def make_draft_case(seq_lens, q_lens, *, causal=False, num_layers=3, block_size=4,
                    seed=0) -> DraftCase:
    cfg = DraftModelConfig(hidden_size=64, num_layers=num_layers, num_heads=4, num_kv_heads=2,
                           head_dim=16, intermediate_size=96, causal=causal)
    return _make_draft_case(seq_lens, q_lens, config=cfg, block_size=block_size, seed=seed)


def run_eager_reference(case: DraftCase, window_size, future_offset=0, sink_size=0):
    """Eager model, attention masked to the window (and sinks) on the full table;
    returns (out, caches)."""
    return case.run_reference(window_size, future_offset, sink_size)
