"""Compatibility module: the names ``dspark_compile.window`` had before the split.

The arithmetic now lives in ``dspark_compile.arithmetic.window`` and the
run-time adapter in ``dspark_compile.runtime.sliding_window`` (see CHANGELOG.md).
"""

from dspark_compile.arithmetic.window import (  # noqa: F401
    WindowBounds, causal_window_metadata, causal_window_metadata_packed, compute_window,
    gather_window_block_table, max_window_blocks, query_lens, window_seq_lens,
    window_seq_lens_and_block_table, window_seq_lens_and_block_table_packed,
    window_upper_bound, windowed_len_bound)
from dspark_compile.runtime.sliding_window import (  # noqa: F401
    SlidingWindowAdapter, WindowedMetadata)
from dspark_compile.validation import check_int as _check_positive  # noqa: F401
