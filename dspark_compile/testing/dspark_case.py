"""One step of a small DSpark reference draft: model, paged batch, latent caches, hidden.

Random weights, KV and hidden states from one seed (nothing is downloaded).
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Sequence

import torch

from dspark_compile.models import PagedBatch, make_paged_batch
from dspark_compile.models.dspark_draft import (
    DSparkDraftConfig,
    DSparkReferenceDraft,
    random_latent_caches,
)

#: A draft small enough for CPU tests: two layers, three heads, a 24-token sliding window.
SMALL_DSPARK_CONFIG = DSparkDraftConfig(
    hidden_size=48,
    num_layers=2,
    num_heads=3,
    kv_lora_rank=16,
    rope_dim=8,
    intermediate_size=64,
    vocab_size=40,
    markov_rank=4,
    sliding_window=24,
)


class DSparkCase(NamedTuple):
    """A DSpark reference draft and the inputs of one step."""

    model: DSparkReferenceDraft
    batch: PagedBatch
    caches: list
    hidden: torch.Tensor


def make_dspark_case(
    seq_lens: Sequence[int],
    q_lens: Sequence[int],
    *,
    block_size: int = 4,
    seed: int = 0,
    config: DSparkDraftConfig = SMALL_DSPARK_CONFIG,
) -> DSparkCase:
    """Request i has ``seq_lens[i]`` tokens, ``q_lens[i]`` of them new; the model is seeded
    with ``seed`` and the batch, caches and hidden states come from one generator seeded
    with ``seed``."""
    gen = torch.Generator().manual_seed(seed)
    model = DSparkReferenceDraft(config, seed=seed).eval()
    batch = make_paged_batch(seq_lens, q_lens, block_size, generator=gen)
    caches = random_latent_caches(
        config.num_layers, batch.num_blocks, block_size, config.head_dim, generator=gen
    )
    hidden = torch.randn(batch.num_tokens, config.hidden_size, generator=gen)
    return DSparkCase(model, batch, caches, hidden)


def dspark_args(batch: PagedBatch, hidden: torch.Tensor, caches: list) -> tuple:
    """The draft's forward arguments: ``(hidden, positions, caches, block_table, seq_lens,
    query_start_loc, slot_mapping)``."""
    return (
        hidden,
        batch.positions,
        caches,
        batch.block_table,
        batch.seq_lens,
        batch.query_start_loc,
        batch.slot_mapping,
    )


def run_dspark_eager(
    model: DSparkReferenceDraft,
    batch: PagedBatch,
    hidden: torch.Tensor,
    caches: list,
    index_fn: Optional[Callable] = None,
) -> tuple:
    """Eager forward on cloned caches, with ``index_fn`` as the model's ``index_override``
    (None: the model's own causal indices); returns ``(out, caches)``."""
    caches = [c.clone() for c in caches]
    model.index_override = index_fn
    try:
        with torch.no_grad():
            return model(*dspark_args(batch, hidden, caches)), caches
    finally:
        model.index_override = None
