"""Index width of the sparse-MLA window indices (docs/design.md, "DSpark indices").

The index ops return ``[T, width]`` rows; ``width`` is a multiple of
``INDEX_WIDTH_ALIGN`` large enough for the longest visible range.
"""

from __future__ import annotations

import math

from dspark_compile.validation import check_int

INDEX_WIDTH_ALIGN = 128


def noncausal_width(window_size: int, max_query_len: int) -> int:
    """Index width of the non-causal form: ``ceil((W + max_q_len) / 128) * 128`` (>= 128)."""
    check_int("window_size", window_size, 1)
    check_int("max_query_len", max_query_len, 0)
    return max(1, math.ceil((window_size + max_query_len) / INDEX_WIDTH_ALIGN)) * INDEX_WIDTH_ALIGN


def causal_width(window_size: int) -> int:
    """Index width of the causal form: ``ceil(W / 128) * 128``."""
    check_int("window_size", window_size, 1)
    return math.ceil(window_size / INDEX_WIDTH_ALIGN) * INDEX_WIDTH_ALIGN
