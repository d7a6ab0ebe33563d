"""Test oracles: independent eager formulations that compiled results are checked against."""

from __future__ import annotations

from typing import Optional

from dspark_compile.kernels.paged_attention import paged_attention_ref


def windowed_attention_ref(window_size: Optional[int], future_offset: int = 0, sink_size: int = 0):
    """``dspark.paged_attention``-compatible reference with the draft window
    ``window_size`` (None: no window) applied by position on the FULL table.

    Causal queries each see ``[lo(p), p]``; non-causal queries all see
    ``[lo(seq_len - 1), seq_len)`` (``kernels.paged_attention.window_lower_bound``,
    block size from the KV cache), plus the ``ceil(S / b) * b`` sink tokens
    when ``sink_size`` S > 0. An independent formulation of what the
    window pass achieves by rewriting metadata.
    """

    def attention(
        query, key_cache, value_cache, block_table, seq_lens, query_start_loc, scale, causal
    ):
        return paged_attention_ref(
            query,
            key_cache,
            value_cache,
            block_table,
            seq_lens,
            query_start_loc,
            scale,
            causal,
            window_size=window_size,
            future_offset=future_offset if window_size else 0,
            sink_size=sink_size if window_size else 0,
        )

    return attention
