"""The vLLM route's window-table Triton kernel: the windowed ``seq_lens`` and block table
of one attention metadata object in one launch (``query_window_table_triton``).

Per request, from the window of its FIRST query token; ``arithmetic.window.
first_query_window_table`` is the reference.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


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
    overwritten. ``arithmetic.window.first_query_window_table`` is the reference.
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
