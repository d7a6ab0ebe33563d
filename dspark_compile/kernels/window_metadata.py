"""Fused window-metadata Triton kernel: one launch for a whole window.

Computes, per request i (``dspark_compile.arithmetic.window`` is the reference)::

    start        = floor(clamp(seq_lens + K - W, min=0) / b) * b
    windowed_len = seq_lens - start
    table[i, c]  = block_table[i, start // b + c]   if c < needed[i] and the column exists
                   0                                 otherwise,   c in [0, max_window_blocks)

With attention sinks (``sink_size`` S, ``nsink = ceil(S / b)`` blocks) the
first ``kept = min(nsink, start // b)`` columns are the sink blocks and the
window's blocks follow them (no block twice)::

    windowed_len = kept * b + seq_lens - start
    table[i, c]  = block_table[i, c]                      c < kept
                   block_table[i, start // b + c - kept]  kept <= c < needed[i]

``start`` stays the absolute position of the window's first key (the
``kv_offset`` of ``dspark.paged_attention``). S = 0 compiles no sink code.

and writes ``windowed_len``, ``start`` and the gathered table into
caller-owned buffers (the adapter's persistent block-table buffer), in one
launch of ``num_reqs`` programs. No host synchronisation: the grid depends
only on shapes, so the launch is CUDA-graph capturable.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from dspark_compile.arithmetic.window import max_window_blocks, sink_blocks
from dspark_compile.validation import check_int


@triton.jit
def _window_metadata_kernel(
    seq_lens_ptr,
    table_ptr,
    table_stride0,
    table_stride1,
    table_width,
    out_lens_ptr,
    out_start_ptr,
    out_table_ptr,
    out_stride0,
    out_stride1,
    window_size,
    future_offset,
    BLOCK_SIZE: tl.constexpr,
    NUM_COLS: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
    NUM_SINKS: tl.constexpr,
):
    req = tl.program_id(0)
    seq_len = tl.load(seq_lens_ptr + req)
    shifted = tl.maximum(seq_len + future_offset - window_size, 0)
    start_block = shifted // BLOCK_SIZE
    start = start_block * BLOCK_SIZE
    windowed_len = seq_len - start
    window_blocks = (windowed_len + BLOCK_SIZE - 1) // BLOCK_SIZE
    if NUM_SINKS > 0:  # the kept sink blocks go in front of the window's blocks
        kept = tl.minimum(start_block, NUM_SINKS)
        windowed_len = windowed_len + kept * BLOCK_SIZE
        window_blocks = window_blocks + kept
    needed = tl.minimum(window_blocks, NUM_COLS)
    tl.store(out_lens_ptr + req, windowed_len)
    tl.store(out_start_ptr + req, start)
    row = table_ptr + req.to(tl.int64) * table_stride0
    out_row = out_table_ptr + req.to(tl.int64) * out_stride0
    for col0 in range(0, NUM_COLS, BLOCK_COLS):
        cols = col0 + tl.arange(0, BLOCK_COLS)
        src = start_block + cols
        if NUM_SINKS > 0:
            src = tl.where(cols < kept, cols, src - kept)
        valid = (cols < needed) & (src < table_width)
        blocks = tl.load(row + src.to(tl.int64) * table_stride1, mask=valid, other=0)
        tl.store(out_row + cols * out_stride1, blocks, mask=cols < NUM_COLS)


def window_metadata_triton(
    seq_lens: torch.Tensor,
    block_table: torch.Tensor,
    window_size: int,
    block_size: int,
    future_offset: int = 0,
    out_table: Optional[torch.Tensor] = None,
    sink_size: int = 0,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(windowed_len, start, windowed_table)`` in one kernel launch.

    ``seq_lens [R]`` int32/int64, ``block_table [R, width]`` int32/int64 (any
    strides). ``out_table [R, max_window_blocks(W, b)]`` (any int dtype and
    strides, e.g. a row slice of a persistent buffer; with sinks
    ``max_window_blocks(W, b, sink_size=S)`` columns) is overwritten in place
    and returned; a new table of ``block_table``'s dtype when None.
    ``windowed_len`` (sinks included) and ``start`` (the window's first key) are
    new tensors of ``seq_lens``' dtype. Same values as ``compute_window`` +
    ``gather_window_block_table`` (``window_seq_lens_and_block_table(...,
    sink_size=S)``).
    """
    check_int("window_size", window_size)
    check_int("block_size", block_size)
    check_int("future_offset", future_offset, 0)
    if seq_lens.dim() != 1 or block_table.dim() != 2 or block_table.shape[0] != seq_lens.shape[0]:
        raise ValueError(
            f"seq_lens {tuple(seq_lens.shape)} and block_table "
            f"{tuple(block_table.shape)} are invalid: expected [R] and [R, width]"
        )
    num_sinks = sink_blocks(sink_size, block_size)
    num_reqs = seq_lens.shape[0]
    num_cols = max_window_blocks(window_size, block_size, sink_size=sink_size)
    if out_table is None:
        out_table = block_table.new_empty((num_reqs, num_cols))
    elif tuple(out_table.shape) != (num_reqs, num_cols):
        raise ValueError(
            f"out_table has shape {tuple(out_table.shape)}, expected "
            f"({num_reqs}, {num_cols}) = (requests, max_window_blocks)"
        )
    windowed_len = torch.empty_like(seq_lens)
    start = torch.empty_like(seq_lens)
    if num_reqs == 0:
        return windowed_len, start, out_table
    if block_table.shape[1] == 0:  # nothing to gather: keep the arithmetic, zero the table
        out_table.zero_()
        block_table = out_table  # any valid pointer; every load is masked (width 0)
        width = 0
    else:
        width = block_table.shape[1]
    block_cols = min(triton.next_power_of_2(num_cols), 1024)
    _window_metadata_kernel[(num_reqs,)](
        seq_lens,
        block_table,
        block_table.stride(0),
        block_table.stride(1),
        width,
        windowed_len,
        start,
        out_table,
        out_table.stride(0),
        out_table.stride(1),
        window_size,
        future_offset,
        BLOCK_SIZE=block_size,
        NUM_COLS=num_cols,
        BLOCK_COLS=block_cols,
        NUM_SINKS=num_sinks,
    )
    return windowed_len, start, out_table


@triton.jit(do_not_specialize=["num_cols", "tokens"])
def _query_window_table_kernel(
    seq_lens_ptr,
    query_start_loc_ptr,
    table_ptr,
    table_stride0,
    table_stride1,
    table_width,
    out_lens_ptr,
    out_table_ptr,
    out_stride0,
    out_stride1,
    num_cols,
    tokens,
    CAUSAL: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_COLS: tl.constexpr,
):
    req = tl.program_id(0)
    seq_len = tl.load(seq_lens_ptr + req)
    if CAUSAL:
        q_len = tl.load(query_start_loc_ptr + req + 1) - tl.load(query_start_loc_ptr + req)
        first = seq_len - q_len.to(seq_len.dtype)
    else:
        first = seq_len - 1
    start_block = tl.maximum(first + 1 - tokens, 0) // BLOCK_SIZE
    windowed_len = seq_len - start_block * BLOCK_SIZE
    needed = (windowed_len + BLOCK_SIZE - 1) // BLOCK_SIZE
    tl.store(out_lens_ptr + req, windowed_len)
    row = table_ptr + req.to(tl.int64) * table_stride0
    out_row = out_table_ptr + req.to(tl.int64) * out_stride0
    for col0 in range(0, num_cols, BLOCK_COLS):
        cols = col0 + tl.arange(0, BLOCK_COLS)
        src = start_block + cols
        valid = (cols < needed) & (src < table_width)
        blocks = tl.load(row + src.to(tl.int64) * table_stride1, mask=valid, other=0)
        tl.store(out_row + cols * out_stride1, blocks, mask=cols < num_cols)


def query_window_table_triton(
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    block_table: torch.Tensor,
    tokens: int,
    block_size: int,
    out_lens: torch.Tensor,
    out_table: torch.Tensor,
    causal: bool = True,
) -> None:
    """The windowed ``seq_lens`` and block table of vLLM attention metadata, one launch.

    Per request ``r`` with ``s = seq_lens[r]`` and ``q`` its query length
    (``query_start_loc[r + 1] - query_start_loc[r]``; 1 when not ``causal``):
    ``start = floor(max(s - q + 1 - tokens, 0) / b) * b``, ``out_lens[r] = s - start``,
    ``out_table[r, c] = block_table[r, start / b + c]`` for ``c < ceil((s - start) / b)``
    within the table's width, 0 otherwise (``tokens`` = W - K: the window of the request's
    first query token). ``seq_lens [R]``, ``query_start_loc [>= R + 1]``, ``block_table
    [R, width >= 1]``: int32/int64, any strides; ``out_lens [R]`` (seq_lens' dtype) and
    ``out_table [R, C]`` (any int dtype and strides, e.g. slices of persistent buffers) are
    overwritten. ``metadata.window_attention_metadata``'s torch code is the reference.
    No host synchronisation; CUDA-graph capturable.
    """
    num_reqs, width = block_table.shape
    if width == 0:
        raise ValueError("block_table has no columns: expected width >= 1")
    if (
        tuple(out_lens.shape) != (num_reqs,)
        or out_table.dim() != 2
        or out_table.shape[0] != num_reqs
    ):
        raise ValueError(
            f"out_lens {tuple(out_lens.shape)} and out_table {tuple(out_table.shape)} are "
            f"invalid: expected [{num_reqs}] and [{num_reqs}, C]"
        )
    if num_reqs == 0 or out_table.shape[1] == 0:
        return
    _query_window_table_kernel[(num_reqs,)](
        seq_lens,
        query_start_loc,
        block_table,
        block_table.stride(0),
        block_table.stride(1),
        width,
        out_lens,
        out_table,
        out_table.stride(0),
        out_table.stride(1),
        out_table.shape[1],
        tokens,
        CAUSAL=bool(causal),
        BLOCK_SIZE=block_size,
        BLOCK_COLS=64,
    )
