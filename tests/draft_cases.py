"""Shared builders for tests that run the reference DFlash draft."""

from __future__ import annotations

import dataclasses

import torch

from dspark_compile.kernels.paged_attention import windowed_attention_ref
from dspark_compile.models import (DFlashReferenceDraft, DraftModelConfig, make_paged_batch,
                                   random_kv_cache)


@dataclasses.dataclass
class DraftCase:
    model: DFlashReferenceDraft
    hidden: torch.Tensor
    batch: object
    key_caches: list
    value_caches: list

    def args(self, key_caches=None, value_caches=None):
        b = self.batch
        return (self.hidden, b.positions, key_caches or self.key_caches,
                value_caches or self.value_caches, b.block_table, b.seq_lens,
                b.query_start_loc, b.slot_mapping)

    def clone_caches(self):
        return [k.clone() for k in self.key_caches], [v.clone() for v in self.value_caches]


def make_draft_case(seq_lens, q_lens, *, causal=False, num_layers=3, block_size=4,
                    seed=0) -> DraftCase:
    cfg = DraftModelConfig(hidden_size=64, num_layers=num_layers, num_heads=4, num_kv_heads=2,
                           head_dim=16, intermediate_size=96, causal=causal)
    gen = torch.Generator().manual_seed(seed)
    model = DFlashReferenceDraft(cfg, seed=seed).eval()
    batch = make_paged_batch(seq_lens, q_lens, block_size, generator=gen)
    caches = [random_kv_cache(batch.num_blocks, block_size, cfg.num_kv_heads, cfg.head_dim,
                              generator=gen) for _ in range(num_layers)]
    hidden = torch.randn(batch.num_tokens, cfg.hidden_size, generator=gen)
    return DraftCase(model, hidden, batch, [k for k, _ in caches], [v for _, v in caches])


def run_eager_reference(case: DraftCase, window_size, future_offset=0):
    """Eager model, attention masked to the window on the full table; returns (out, caches)."""
    keys, values = case.clone_caches()
    case.model.attention_override = windowed_attention_ref(window_size, future_offset)
    try:
        with torch.no_grad():
            out = case.model(*case.args(keys, values))
    finally:
        case.model.attention_override = None
    return out, keys, values
