"""Test oracles: independent eager formulations that compiled results are checked against."""

from __future__ import annotations

from typing import Optional

from dspark_compile.arithmetic.window import compute_window
from dspark_compile.kernels.paged_attention import paged_attention_ref


def windowed_attention_ref(window_size: Optional[int], future_offset: int = 0):
    """``dspark.paged_attention``-compatible reference that sees only ``[start, seq_len)``.

    ``start`` is the block-aligned window start of ``arithmetic.window.compute_window``
    (block size from the KV cache); ``window_size=None`` means no window.
    Reads the FULL block table and masks by position: an independent
    formulation of what the window pass achieves by rewriting metadata.
    """
    def attention(query, key_cache, value_cache, block_table, seq_lens, query_start_loc,
                  scale, causal):
        kv_start = None
        if window_size is not None:
            kv_start = compute_window(seq_lens, window_size, key_cache.shape[1],
                                      future_offset).start
        return paged_attention_ref(query, key_cache, value_cache, block_table, seq_lens,
                                   query_start_loc, scale, causal, kv_start=kv_start)

    return attention
