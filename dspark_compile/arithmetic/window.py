"""Draft KV sliding-window arithmetic (docs/design.md, "Window arithmetic").

With W the window size, b the kernel block size and K the future offset, a
query at absolute position p attends to keys ``j`` with ``lo(p) <= j`` where::

    lo(p) = floor(max(p + 1 + K - W, 0) / b) * b       # block aligned

(causal queries also need ``j <= p``). A request with ``seq_len`` KV tokens and
``q_len`` queries at positions ``seq_len - q_len .. seq_len - 1`` is windowed
from the window of ONE anchor query::

    decode / non-causal (anchor = the last query, p = seq_len - 1):
        start    = floor(clamp(seq_lens + K - W, min=0) / b) * b
    causal blocks (anchor = the first query, p = seq_len - max(q_len, 1)):
        start    = floor(clamp(seq_lens - max(q_len, 1) + 1 + K - W, min=0) / b) * b
    windowed_len = seq_lens - start                    # <= W - K + b - 2 + max_q_len
    start_block  = start // b
    needed       = ceil(windowed_len / b)              # <= max_window_blocks(W, b, max_q_len)

With one query (decode) both anchors coincide.

Attention sinks (``sink_size`` S, default 0): the first ``nsink = ceil(S / b)``
blocks (``S_b = nsink * b`` tokens) stay visible beside the window. Per request
``kept = min(nsink, start_block)`` sink blocks are put in front of the window's
blocks, so a window that already starts inside the sinks reads no block twice::

    windowed_len = kept * b + seq_lens - start
    needed       = kept + ceil((seq_lens - start) / b)
    table column c -> full column c            (c <  kept)
                      start_block + c - kept   (c >= kept)

``start`` stays the absolute position of the window's first key; table token
t is at absolute position t (t < kept * b), else ``start + t - kept * b``.
A query at p then sees keys j with ``j <= p`` (causal) and
``j < S_b or j >= lo(p)``. In the causal form the attention
kernel applies each later query's own ``lo(p)`` itself (``dspark.paged_attention``'s
``kv_offset`` / ``window_size`` / ``future_offset`` arguments); ``lo`` never
decreases with p, so the anchor's window covers every query of the block.

Everything runs on the tensors' device with no host synchronisation. The
functions use only ops that Inductor fuses and torchair's GE mode converts
(add, clamp, div(floor), mul, sub, arange, unsqueeze, slice, lt, logical_and,
where, gather, as_strided, mul-by-mask); the graph pass traces these same functions, so the
eager API and the compiled graph share one definition.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Union

import torch
from torch._subclasses.fake_tensor import is_fake

from dspark_compile.validation import check_int

IntLike = Union[int, torch.SymInt]  # a token count may be symbolic under dynamic shapes


def sink_blocks(sink_size: int, block_size: int) -> int:
    """Sink blocks ``ceil(S / b)`` (S = ``sink_size`` tokens, rounded up to blocks)."""
    check_int("sink_size", sink_size, 0, "a non-negative int (0: no attention sinks)")
    check_int("block_size", block_size)
    return -(-sink_size // block_size)


def sink_tokens(sink_size: int, block_size: int) -> int:
    """``S_b = ceil(S / b) * b``: the sink tokens, whole blocks."""
    return sink_blocks(sink_size, block_size) * block_size


def max_window_blocks(
    window_size: int, block_size: int, max_query_len: IntLike = 1, sink_size: int = 0
) -> IntLike:
    """Width of the windowed block table: ``ceil((W + max_query_len - 1) / b) + 1``
    plus ``ceil(S / b)`` sink blocks.

    ``max_query_len`` (default 1: decode and non-causal windows) bounds every
    causal query block's length. With 1 this is ``ceil(W / b) + 1``, which
    covers the worst case ``ceil((W - K + b - 1) / b)`` for every K >= 0, also
    when b does not divide W (``W // b + 1`` does not: W=100, b=16 needs 8).
    A causal block of q queries adds at most ``q - 1`` tokens. ``max_query_len``
    may be a SymInt (a symbolic token count); the result is then one too.
    """
    check_int("window_size", window_size)
    check_int("block_size", block_size)
    _check_query_bound(max_query_len)
    return (
        (window_size + max_query_len - 2 + block_size) // block_size
        + 1
        + sink_blocks(sink_size, block_size)
    )


def windowed_len_bound(
    window_size: int,
    block_size: int,
    future_offset: int = 0,
    max_query_len: IntLike = 1,
    sink_size: int = 0,
) -> IntLike:
    """Largest possible ``windowed_len``: ``W - K + b - 2 + max_query_len`` plus
    ``S_b`` sink tokens (``W - K + b - 1`` for decode and non-causal windows)."""
    return (
        window_size
        - future_offset
        + block_size
        - 2
        + max_query_len
        + sink_tokens(sink_size, block_size)
    )


def window_upper_bound(
    bound: int,
    window_size: int,
    block_size: int,
    future_offset: int = 0,
    max_query_len: int = 1,
    sink_size: int = 0,
) -> int:
    """Window a scalar upper bound of seq_lens (e.g. ``max_seq_len``)."""
    return min(
        bound, windowed_len_bound(window_size, block_size, future_offset, max_query_len, sink_size)
    )


def first_query_window_start(
    seq_lens: torch.Tensor, query_lens: torch.Tensor, window_tokens: int, block_size: int
) -> torch.Tensor:
    """Block-aligned start of the TOKEN-EXACT window of each request's first query
    (the vLLM route without sinks, docs/design.md "Two window mechanisms").

    With ``n = window_tokens`` (``W - K``) and a request's first query at position
    ``seq_len - q_len``, that query reads keys from ``lo = max(seq_len - q_len + 1 - n, 0)``
    on; ``start = floor(lo / b) * b``. Every later query of the request reads from a
    later ``lo``, so ``[start, seq_len)`` holds every key the request's queries read.
    ``query_lens`` of 1 give the window of the last position (decode, non-causal
    blocks); a request with ``q_len = 0`` (padding) gets the window of position
    ``seq_len``. ``[R]`` tensors of ``seq_lens``' dtype; the formula of
    ``kernels.query_window_table.query_window_table_triton``.
    """
    first = seq_lens - query_lens
    lo = torch.clamp(first + 1 - window_tokens, min=0)
    return torch.div(lo, block_size, rounding_mode="floor") * block_size


def window_cuts_nothing(max_seq_len: int, window_tokens: int, block_size: int) -> bool:
    """Whether ``first_query_window_start`` is 0 for every request WITH a query of a batch
    whose ``seq_lens`` are at most ``max_seq_len``: ``max_seq_len < n + b`` (``n = W - K``).
    (A request without queries, ``q_len = 0``, may start one block in; it reads no key.)

    A request's first query sits at ``seq_len - q_len <= seq_len - 1``, so its window
    starts at ``lo <= max(seq_len - n, 0) <= max_seq_len - n < b``: ``floor(lo / b) = 0``,
    the windowed lengths equal ``seq_lens`` and the windowed table is the table's first
    columns. (Tokens the token-exact window hides, up to ``b - 1`` per query, are hidden
    by the native per-token window, as in any other step.)
    """
    return max_seq_len < window_tokens + block_size


def native_window_cuts_nothing(max_seq_len: int, window_tokens: int) -> bool:
    """Whether the token-exact causal window of ``n`` keys hides no key from any query of
    a batch whose ``seq_lens`` are at most ``max_seq_len``: ``max_seq_len <= n``.

    A causal query at position ``p <= seq_len - 1`` sees keys ``[max(p - n + 1, 0), p]``,
    and ``p - n + 1 <= seq_len - n <= 0``: the window is all of ``[0, p]``, the plain
    causal attention.
    """
    return max_seq_len <= window_tokens


def first_query_window_columns(
    window_tokens: int, block_size: int, max_query_len: int, table_width: int
) -> int:
    """Columns of a table windowed by ``first_query_window_start``:
    ``max(1, min(table_width, ceil((max(max_query_len, 1) + n) / b) + 1))``, ``n = W - K``.

    A request of ``q <= max_query_len`` queries needs at most
    ``ceil((q - 1 + n + b - 1) / b)`` blocks (its windowed length is at most
    ``windowed_len_bound(W, b, K, q)``), never more than this.
    """
    needed = -(-(max(max_query_len, 1) + window_tokens) // block_size) + 1
    return max(1, min(table_width, needed))


def batch_window_start(
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    window_tokens: int,
    block_size: int,
    causal: bool = True,
) -> torch.Tensor:
    """``first_query_window_start`` of a batch: per request the window of its first query
    (``causal``; query lengths from ``query_start_loc [>= R + 1]``) or of its last
    position (non-causal: every query of a block reads the same keys)."""
    num_reqs = seq_lens.shape[0]
    if causal:
        q_lens = query_lens(query_start_loc[: num_reqs + 1]).to(seq_lens.dtype)
    else:
        q_lens = torch.ones_like(seq_lens)
    return first_query_window_start(seq_lens, q_lens, window_tokens, block_size)


def first_query_window_table(
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    block_table: torch.Tensor,
    window_tokens: int,
    block_size: int,
    out_lens: torch.Tensor,
    out_table: torch.Tensor,
    causal: bool = True,
) -> None:
    """The windowed ``seq_lens`` and block table of ``first_query_window_start``, written
    into ``out_lens [R]`` and ``out_table [R, C]`` (the reference of
    ``kernels.query_window_table.query_window_table_triton``).

    ``start`` is the window of each request's first query (``causal``; else of its last
    position, ``q`` taken as 1); ``out_lens = seq_lens - start``; column ``c`` of row
    ``r`` is ``block_table[r, start[r] / b + c]`` while ``c`` is below the row's needed
    blocks ``ceil(out_lens[r] / b)`` and inside the table, else 0. Few ops and no
    temporaries beyond them.
    """
    width, cols = block_table.shape[1], out_table.shape[1]
    start = batch_window_start(seq_lens, query_start_loc, window_tokens, block_size, causal)
    torch.sub(seq_lens, start, out=out_lens)
    offsets = torch.arange(cols, device=block_table.device, dtype=torch.int64)
    src = torch.div(start, block_size, rounding_mode="floor").long().unsqueeze(1) + offsets
    needed = torch.div(out_lens + (block_size - 1), block_size, rounding_mode="floor")
    valid = (offsets < needed.unsqueeze(1)) & (src < width)
    gathered = torch.gather(block_table, 1, src.clamp_(max=width - 1))
    torch.mul(gathered, valid, out=out_table)


def query_lens(query_start_loc: torch.Tensor) -> torch.Tensor:
    """``q_len [R]`` from ``query_start_loc [R+1]``: ``qsl[1:] - qsl[:-1]``."""
    return query_start_loc[1:] - query_start_loc[:-1]


@dataclasses.dataclass(frozen=True)
class WindowBounds:
    """Per-request window, all ``[num_reqs]`` tensors of ``seq_lens``' dtype.

    ``start``/``start_block``: the window's first key (absolute), block aligned;
    ``windowed_len``/``needed``: tokens/blocks of the windowed table, sinks
    included; ``kept_sinks``: sink blocks in front of the window (``None``
    without sinks).
    """

    start: torch.Tensor
    windowed_len: torch.Tensor
    start_block: torch.Tensor
    needed: torch.Tensor
    kept_sinks: Optional[torch.Tensor] = None


def compute_window(
    seq_lens: torch.Tensor,
    window_size: int,
    block_size: int,
    future_offset: int = 0,
    query_lens: Optional[torch.Tensor] = None,
    max_query_len: IntLike = 1,
    sink_size: int = 0,
) -> WindowBounds:
    """Window bounds for ``seq_lens`` (``[num_reqs]`` int tensor, any device).

    ``query_lens`` None: the window of each request's last position (decode,
    non-causal blocks). ``query_lens [R]`` (causal blocks): the window of each
    request's first query, at ``seq_len - max(q_len, 1)`` (an empty request
    gets the decode window). ``max_query_len`` must bound every ``q_len``: it
    sizes ``max_window_blocks``, which caps ``needed``. ``sink_size`` S: the
    first ``ceil(S / b)`` blocks stay visible (module docstring).
    """
    check_int("window_size", window_size)
    check_int("block_size", block_size)
    check_int("future_offset", future_offset, 0)
    nsink = sink_blocks(sink_size, block_size)
    anchor_end = seq_lens  # position + 1 of the query whose window is taken
    if query_lens is not None:
        extra = torch.clamp(query_lens, min=1) - 1
        anchor_end = seq_lens - (
            extra if extra.dtype == seq_lens.dtype else extra.to(seq_lens.dtype)
        )
    shifted = torch.clamp(anchor_end + (future_offset - window_size), min=0)
    start_block = torch.div(shifted, block_size, rounding_mode="floor")
    start = start_block * block_size
    windowed_len = seq_lens - start
    window_blocks = torch.div(windowed_len + (block_size - 1), block_size, rounding_mode="floor")
    kept = None
    if nsink:
        kept = torch.clamp(start_block, max=nsink)
        windowed_len = kept * block_size + windowed_len
        window_blocks = kept + window_blocks
    needed = torch.clamp(
        window_blocks, max=max_window_blocks(window_size, block_size, max_query_len, sink_size)
    )
    return WindowBounds(start, windowed_len, start_block, needed, kept)


def table_columns(
    cols: torch.Tensor, start_block: torch.Tensor, kept_sinks: Optional[torch.Tensor]
) -> torch.Tensor:
    """Full-table column of windowed column ``cols`` (broadcasting): ``start_block
    + cols``, or with sinks ``cols`` for ``cols < kept_sinks`` and
    ``start_block - kept_sinks + cols`` after them."""
    if kept_sinks is None:
        return start_block + cols
    return cols + (cols >= kept_sinks).to(cols.dtype) * (start_block - kept_sinks)


def gather_window_block_table(
    block_table: torch.Tensor,
    start_block: torch.Tensor,
    needed: torch.Tensor,
    num_window_blocks: int,
    kept_sinks: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Columns ``start_block[i] + [0, num_window_blocks)`` of ``block_table``,
    after ``kept_sinks[i]`` leading sink columns ``[0, kept_sinks[i])`` when given.

    Returns a new ``[num_reqs, num_window_blocks]`` table of ``block_table``'s
    dtype; columns at or past ``needed[i]`` or past the full table's width
    are 0.
    """
    num_reqs, width = block_table.shape[0], block_table.shape[1]
    if width == 0:
        return block_table.new_zeros((num_reqs, num_window_blocks))
    cols = torch.arange(num_window_blocks, device=block_table.device, dtype=start_block.dtype)
    index = table_columns(
        cols.unsqueeze(0),
        start_block.unsqueeze(1),
        None if kept_sinks is None else kept_sinks.unsqueeze(1),
    )
    valid = torch.logical_and(cols.unsqueeze(0) < needed.unsqueeze(1), index < width)
    safe_index = torch.clamp(index, min=0, max=width - 1).to(torch.int64)
    gathered = torch.gather(block_table, 1, safe_index)
    return gathered * valid.to(block_table.dtype)


def window_seq_lens_and_block_table(
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    window_size: int,
    block_size: int,
    future_offset: int = 0,
    sink_size: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(windowed_len, windowed_block_table)`` for one (seq_lens, block_table) pair."""
    bounds = compute_window(seq_lens, window_size, block_size, future_offset, sink_size=sink_size)
    table = gather_window_block_table(
        block_table,
        bounds.start_block,
        bounds.needed,
        max_window_blocks(window_size, block_size, sink_size=sink_size),
        bounds.kept_sinks,
    )
    return bounds.windowed_len, table


def window_seq_lens_and_block_table_packed(
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    window_size: int,
    block_size: int,
    future_offset: int = 0,
    sink_size: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same values as ``window_seq_lens_and_block_table``, as contiguous views
    of ONE flat buffer ``[R * max_window_blocks + R]`` (table rows, then the
    lengths) computed by a single elementwise expression, so that a compiler
    emits one kernel for both. Needs equal dtypes (else: two tensors).
    """
    if block_table.dtype != seq_lens.dtype or block_table.shape[1] == 0:
        return window_seq_lens_and_block_table(
            seq_lens, block_table, window_size, block_size, future_offset, sink_size
        )
    return _packed_window(seq_lens, block_table, window_size, block_size, future_offset, sink_size)


def causal_window_metadata(
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    window_size: int,
    block_size: int,
    future_offset: int = 0,
    *,
    max_query_len: IntLike,
    sink_size: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(windowed_len, windowed_block_table, kv_offset)`` for causal query blocks.

    The table starts at the window of each request's FIRST query
    (``compute_window(..., query_lens=...)``), so it holds every key any query
    of the block may see; ``kv_offset [R]`` (= ``start``, seq_lens' dtype) is
    the absolute position of its column 0. The attention kernel then applies
    each query's own bound ``lo(p)`` (``dspark.paged_attention(...,
    kv_offset=kv_offset, window_size=W, future_offset=K)``). The table has
    ``max_window_blocks(W, b, max_query_len)`` columns; ``max_query_len`` must
    bound every ``q_len`` (the window pass uses the graph's token count).
    With sinks (``sink_size`` S) the table holds ``min(ceil(S/b), start/b)``
    sink blocks before the window; ``kv_offset`` is still the window's first
    key, and the kernel (given the same S) maps table tokens to positions.
    """
    _check_query_lens_bound(query_start_loc, max_query_len)
    bounds = compute_window(
        seq_lens,
        window_size,
        block_size,
        future_offset,
        query_lens=query_lens(query_start_loc),
        max_query_len=max_query_len,
        sink_size=sink_size,
    )
    table = gather_window_block_table(
        block_table,
        bounds.start_block,
        bounds.needed,
        max_window_blocks(window_size, block_size, max_query_len, sink_size),
        bounds.kept_sinks,
    )
    return bounds.windowed_len, table, bounds.start


def causal_window_metadata_packed(
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    window_size: int,
    block_size: int,
    future_offset: int = 0,
    *,
    max_query_len: IntLike,
    sink_size: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Same values as ``causal_window_metadata``, as contiguous views of ONE flat
    buffer ``[2R + R * max_window_blocks]`` (lengths, offsets, table rows) from a
    single elementwise expression. Needs equal dtypes (else: three tensors).
    """
    if block_table.dtype != seq_lens.dtype or block_table.shape[1] == 0:
        return causal_window_metadata(
            seq_lens,
            block_table,
            query_start_loc,
            window_size,
            block_size,
            future_offset,
            max_query_len=max_query_len,
            sink_size=sink_size,
        )
    _check_query_lens_bound(query_start_loc, max_query_len)
    return _packed_causal_window(
        seq_lens,
        block_table,
        query_start_loc,
        window_size,
        block_size,
        future_offset,
        max_query_len,
        sink_size,
    )


def _packed_window(seq_lens, block_table, window_size, block_size, future_offset, sink_size):
    """The packed per-request form: one flat iota over [table rows | lengths]."""
    num_reqs, width = block_table.shape[0], block_table.shape[1]
    num_window_blocks = max_window_blocks(window_size, block_size, sink_size=sink_size)
    table_numel = num_reqs * num_window_blocks
    flat = torch.arange(table_numel + num_reqs, device=block_table.device)
    in_table = flat < table_numel
    row_in_table = torch.div(flat, num_window_blocks, rounding_mode="floor")
    row = torch.where(in_table, row_in_table, flat - table_numel)
    col = flat - row_in_table * num_window_blocks
    bounds = compute_window(
        torch.gather(seq_lens, 0, row), window_size, block_size, future_offset, sink_size=sink_size
    )
    index = table_columns(col, bounds.start_block, bounds.kept_sinks)
    valid = torch.logical_and(torch.logical_and(in_table, col < bounds.needed), index < width)
    safe_index = torch.clamp(index, min=0, max=width - 1)
    table_values = torch.gather(block_table.reshape(-1), 0, row * width + safe_index)
    packed = torch.where(in_table, table_values * valid.to(block_table.dtype), bounds.windowed_len)
    # as_strided (not slice/view): Inductor then realizes `packed` once and hands
    # every consumer a view of that one buffer.
    return (
        torch.as_strided(packed, (num_reqs,), (1,), table_numel),
        torch.as_strided(packed, (num_reqs, num_window_blocks), (num_window_blocks, 1), 0),
    )


def _packed_causal_window(
    seq_lens,
    block_table,
    query_start_loc,
    window_size,
    block_size,
    future_offset,
    max_query_len,
    sink_size,
):
    """The packed per-token form: one flat iota over [lengths | offsets | table rows].

    The vectors come first: with the table first, Inductor (torch 2.14, CPU)
    computed only the table part of the buffer once it had more than 8 columns
    (measured 2026-11-30).
    """
    num_reqs, width = block_table.shape[0], block_table.shape[1]
    num_window_blocks = max_window_blocks(window_size, block_size, max_query_len, sink_size)
    vectors = 2 * num_reqs
    flat = torch.arange(vectors + num_reqs * num_window_blocks, device=block_table.device)
    in_vectors = flat < vectors
    in_lens = flat < num_reqs
    table_flat = flat - vectors
    row_in_table = torch.div(table_flat, num_window_blocks, rounding_mode="floor")
    row = torch.where(in_vectors, torch.where(in_lens, flat, flat - num_reqs), row_in_table)
    col = table_flat - row_in_table * num_window_blocks  # in [0, cols) everywhere
    q_lens = torch.gather(query_start_loc, 0, row + 1) - torch.gather(query_start_loc, 0, row)
    bounds = compute_window(
        torch.gather(seq_lens, 0, row),
        window_size,
        block_size,
        future_offset,
        query_lens=q_lens,
        max_query_len=max_query_len,
        sink_size=sink_size,
    )
    index = table_columns(col, bounds.start_block, bounds.kept_sinks)
    valid = torch.logical_and(col < bounds.needed, index < width)
    safe_index = torch.clamp(index, min=0, max=width - 1)
    table_values = torch.gather(block_table.reshape(-1), 0, row * width + safe_index)
    packed = torch.where(
        in_vectors,
        torch.where(in_lens, bounds.windowed_len, bounds.start),
        table_values * valid.to(block_table.dtype),
    )
    return (
        torch.as_strided(packed, (num_reqs,), (1,), 0),
        torch.as_strided(packed, (num_reqs, num_window_blocks), (num_window_blocks, 1), vectors),
        torch.as_strided(packed, (num_reqs,), (1,), num_reqs),
    )


def window_seq_lens(
    seq_lens: torch.Tensor,
    window_size: int,
    block_size: int,
    future_offset: int = 0,
    sink_size: int = 0,
) -> torch.Tensor:
    """Windowed lengths only (for host mirrors such as ``seq_lens_cpu``)."""
    return compute_window(
        seq_lens, window_size, block_size, future_offset, sink_size=sink_size
    ).windowed_len


def table_token_positions(
    table_tokens: torch.Tensor, kv_offset: torch.Tensor, sink_size: int, block_size: int
) -> torch.Tensor:
    """Absolute position of windowed-table token ``t`` (broadcasting): ``t`` for
    the ``min(S_b, kv_offset)`` kept sink tokens, else ``kv_offset + t - kept``."""
    kept = torch.clamp(kv_offset, max=sink_tokens(sink_size, block_size))
    return torch.where(table_tokens < kept, table_tokens, table_tokens + (kv_offset - kept))


def key_visible(
    key_pos: torch.Tensor,
    query_pos: torch.Tensor,
    window_size: int,
    block_size: int,
    future_offset: int = 0,
    sink_size: int = 0,
) -> torch.Tensor:
    """The window rule by position (broadcasting, no causality): ``j >= lo(p)``
    or ``j < S_b``, with ``lo(p) = floor(max(p + 1 + K - W, 0) / b) * b``."""
    shifted = torch.clamp(query_pos + (1 + future_offset - window_size), min=0)
    lo = torch.div(shifted, block_size, rounding_mode="floor") * block_size
    visible = key_pos >= lo
    if sink_size:
        visible = torch.logical_or(visible, key_pos < sink_tokens(sink_size, block_size))
    return visible


def _check_query_lens_bound(query_start_loc: torch.Tensor, max_query_len: IntLike) -> None:
    """``max_query_len`` bounds every q_len: checked on real CPU tensors (a host
    read); on devices and under tracing it is the caller's contract."""
    _check_query_bound(max_query_len)
    if query_start_loc.dim() != 1 or query_start_loc.shape[0] < 1:
        raise ValueError(
            f"query_start_loc {tuple(query_start_loc.shape)} is invalid: expected [num_reqs + 1]"
        )
    if (
        torch.compiler.is_compiling()
        or query_start_loc.device.type != "cpu"
        or isinstance(max_query_len, torch.SymInt)
        or is_fake(query_start_loc)
        or query_start_loc.shape[0] < 2
    ):
        return
    longest = int(query_lens(query_start_loc).max())
    if longest > max_query_len:
        raise ValueError(
            f"max_query_len={max_query_len} is invalid: a request has {longest} "
            "queries (max_query_len must bound every q_len)"
        )


def _check_query_bound(value: object) -> None:
    check_int("max_query_len", value, allow_symbolic=True)
