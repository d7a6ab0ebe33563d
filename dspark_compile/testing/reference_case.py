"""One draft step of the built-in DFlash reference draft: model, paged batch, caches, inputs.

The single builder behind the demo, ``inspect``'s default example and the tests
(random weights and KV, never zeros; nothing is downloaded).
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch

from dspark_compile.models import (
    DFlashReferenceDraft,
    DraftModelConfig,
    PagedBatch,
    make_paged_batch,
    random_kv_cache,
)
from dspark_compile.testing.oracles import windowed_attention_ref


@dataclasses.dataclass
class DraftCase:
    """A reference draft and the inputs of one step (``args()`` is its call signature)."""

    model: DFlashReferenceDraft
    hidden: torch.Tensor
    batch: PagedBatch
    key_caches: list
    value_caches: list

    def args(self, key_caches=None, value_caches=None) -> tuple:
        """``(hidden, positions, key_caches, value_caches, block_table, seq_lens,
        query_start_loc, slot_mapping)``: the draft's forward arguments."""
        b = self.batch
        return (
            self.hidden,
            b.positions,
            key_caches or self.key_caches,
            value_caches or self.value_caches,
            b.block_table,
            b.seq_lens,
            b.query_start_loc,
            b.slot_mapping,
        )

    def clone_caches(self) -> tuple[list, list]:
        return [k.clone() for k in self.key_caches], [v.clone() for v in self.value_caches]

    def fresh_args(self) -> tuple:
        """``args()`` with cloned caches (a step writes KV into them)."""
        return self.args(*self.clone_caches())

    def run_reference(self, window_size: Optional[int], future_offset: int = 0, sink_size: int = 0):
        """Eager model with attention masked to the window (plus ``sink_size`` sink
        tokens) on the FULL block table (``windowed_attention_ref``); returns
        ``(out, key_caches, value_caches)``."""
        keys, values = self.clone_caches()
        self.model.attention_override = windowed_attention_ref(
            window_size, future_offset, sink_size
        )
        try:
            with torch.no_grad():
                out = self.model(*self.args(keys, values))
        finally:
            self.model.attention_override = None
        return out, keys, values


def make_draft_case(
    seq_lens: Sequence[int],
    q_lens: Sequence[int],
    *,
    config: Optional[DraftModelConfig] = None,
    block_size: int = 4,
    seed: int = 0,
    device: torch.device | str = "cpu",
    model: Optional[DFlashReferenceDraft] = None,
    generator: Optional[torch.Generator] = None,
) -> DraftCase:
    """Build a ``DraftCase``: request i has ``seq_lens[i]`` tokens, ``q_lens[i]`` of them new.

    ``model`` (reused across cases) defaults to a new draft of ``config``
    seeded with ``seed``; ``generator`` (shared across cases) defaults to a new
    one seeded with ``seed``.
    """
    if model is None:
        if config is None:
            config = DraftModelConfig(
                hidden_size=64,
                num_layers=3,
                num_heads=4,
                num_kv_heads=2,
                head_dim=16,
                intermediate_size=96,
                causal=False,
            )
        model = DFlashReferenceDraft(config, seed=seed).eval().to(device)
    cfg = model.cfg
    gen = generator if generator is not None else torch.Generator().manual_seed(seed)
    batch = make_paged_batch(seq_lens, q_lens, block_size, device=device, generator=gen)
    caches = [
        random_kv_cache(
            batch.num_blocks,
            block_size,
            cfg.num_kv_heads,
            cfg.head_dim,
            device=device,
            generator=gen,
        )
        for _ in range(cfg.num_layers)
    ]
    hidden = torch.randn(batch.num_tokens, cfg.hidden_size, generator=gen).to(device)
    return DraftCase(model, hidden, batch, [k for k, _ in caches], [v for _, v in caches])
