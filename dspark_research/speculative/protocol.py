"""The model protocol of the speculative-decoding loop.

Any target/draft pair plugs into :class:`~dspark_research.speculative.loop.SpeculativeDecoder`
when both implement :class:`PagedModel`: a forward over a paged KV cache that
writes its new tokens' KV (at ``slot_mapping``) and returns logits and a hidden
state per token. The draft should attend through ``torch.ops.dspark.paged_attention``
(or a registered attention op) so ``torch.compile(draft, backend="dspark")``
windows it. :class:`~dspark_research.speculative.lm.TransformerLM` is the
reference implementation.
"""

from __future__ import annotations

from typing import Protocol, Sequence, runtime_checkable

import torch


@runtime_checkable
class PagedModel(Protocol):
    """``feature_size``: 0 for a model that reads tokens only; > 0 for an EAGLE-style
    draft whose input at position p is token ``x_p`` plus feature ``f_{p-1}``: the
    target's ``hidden`` output at position p-1 (the loop passes it for committed
    tokens, and the draft's own previous ``hidden`` while it proposes). An EAGLE3 draft
    (:class:`~dspark_research.speculative.eagle3.Eagle3Draft`) also has ``aux_layer_ids``
    and ``combine``; its position p reads ``x_{p+1}`` and ``combine(aux_p)`` instead.
    ``kv_cache_shape``: ``(num_layers, num_kv_heads, head_dim)`` of its cache.
    """

    @property
    def feature_size(self) -> int: ...

    @property
    def kv_cache_shape(self) -> tuple[int, int, int]: ...

    def forward(
        self,
        tokens: torch.Tensor,
        features: torch.Tensor,
        positions: torch.Tensor,
        key_caches: Sequence[torch.Tensor],
        value_caches: Sequence[torch.Tensor],
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``tokens [T]`` int64, ``features [T, feature_size]``
        -> ``(logits [T, V], hidden [T, H])``.

        Causal over the cache: token t sees cache positions ``<= positions[t]``.
        """
        ...
