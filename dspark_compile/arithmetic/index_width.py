"""Index width of the sparse-MLA window indices (docs/design.md, "DSpark indices").

The index ops return ``[T, width]`` rows; ``width`` is a multiple of
``INDEX_WIDTH_ALIGN`` large enough for the longest visible range. Attention
sinks (``sink_size`` S tokens, kept as ``S_b = ceil(S / b) * b`` tokens, whole
KV blocks of ``b``) add ``S_b`` columns in front of the window.
"""

from __future__ import annotations

import math
from typing import Optional

from dspark_compile.arithmetic.window import sink_tokens
from dspark_compile.validation import check_int

INDEX_WIDTH_ALIGN = 128

WIDTH_RULE = (
    "non-causal needs ceil((S_b + W + max_q_len) / 128) * 128, causal "
    "ceil((S_b + W) / 128) * 128, S_b = ceil(sink_size / block_size) * block_size"
)


def _sinks(sink_size: int, block_size: Optional[int]) -> int:
    """``S_b = ceil(S / b) * b``: the attention-sink prefix in whole blocks (0 for S = 0)."""
    check_int("sink_size", sink_size, 0, "a non-negative int (0: no attention sinks)")
    if sink_size == 0:
        return 0
    if block_size is None:
        raise ValueError(
            f"sink_size={sink_size} needs block_size: the sinks are the first "
            "ceil(sink_size / block_size) * block_size KV tokens"
        )
    return sink_tokens(sink_size, block_size)


def noncausal_width(
    window_size: int, max_query_len: int, sink_size: int = 0, block_size: Optional[int] = None
) -> int:
    """Index width of the non-causal form: ``ceil((S_b + W + max_q_len) / 128) * 128``
    (>= 128), ``S_b = ceil(sink_size / block_size) * block_size`` (``block_size`` is needed
    only when ``sink_size > 0``)."""
    check_int("window_size", window_size, 1)
    check_int("max_query_len", max_query_len, 0)
    span = _sinks(sink_size, block_size) + window_size + max_query_len
    return max(1, math.ceil(span / INDEX_WIDTH_ALIGN)) * INDEX_WIDTH_ALIGN


def causal_width(window_size: int, sink_size: int = 0, block_size: Optional[int] = None) -> int:
    """Index width of the causal form: ``ceil((S_b + W) / 128) * 128`` (``S_b`` as in
    ``noncausal_width``)."""
    check_int("window_size", window_size, 1)
    span = _sinks(sink_size, block_size) + window_size
    return math.ceil(span / INDEX_WIDTH_ALIGN) * INDEX_WIDTH_ALIGN
