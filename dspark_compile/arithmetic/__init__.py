"""Pure integer arithmetic of the window and the index widths (no kernels, no graphs)."""

from dspark_compile.arithmetic.index_width import INDEX_WIDTH_ALIGN, causal_width, noncausal_width
from dspark_compile.arithmetic.window import (
    WindowBounds, causal_window_metadata, causal_window_metadata_packed, compute_window,
    gather_window_block_table, key_visible, max_window_blocks, query_lens, sink_blocks,
    sink_tokens, table_columns, table_token_positions, window_seq_lens,
    window_seq_lens_and_block_table, window_seq_lens_and_block_table_packed,
    window_upper_bound, windowed_len_bound)

__all__ = ["INDEX_WIDTH_ALIGN", "WindowBounds", "causal_width", "causal_window_metadata",
           "causal_window_metadata_packed", "compute_window", "query_lens",
           "gather_window_block_table", "key_visible", "max_window_blocks", "sink_blocks",
           "sink_tokens", "table_columns", "table_token_positions", "noncausal_width",
           "window_seq_lens", "window_seq_lens_and_block_table",
           "window_seq_lens_and_block_table_packed", "window_upper_bound", "windowed_len_bound"]
