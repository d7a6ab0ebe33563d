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
