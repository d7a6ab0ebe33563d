"""Draft KV sliding-window arithmetic (docs/design.md, "Window arithmetic").

With W the window size, b the kernel block size and K the future offset::

    start        = floor(clamp(seq_lens + K - W, min=0) / b) * b
    windowed_len = seq_lens - start                    # <= W - K + b - 1
    start_block  = start // b
    needed       = ceil(windowed_len / b)              # <= max_window_blocks

Everything runs on the tensors' device with no host synchronisation. The
functions use only ops that Inductor fuses and torchair's GE mode converts
(add, clamp, div(floor), mul, sub, arange, unsqueeze, lt, logical_and,
gather, mul-by-mask); the graph pass traces these same functions, so the
eager API and the compiled graph share one definition.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from dspark_compile.validation import check_int


def max_window_blocks(window_size: int, block_size: int) -> int:
    """Width of the windowed block table: ``ceil(W / b) + 1``.

    Covers the worst case ``ceil((W - K + b - 1) / b)`` for every K >= 0, also
    when b does not divide W (``W // b + 1`` does not: W=100, b=16 needs 8).
    """
    check_int("window_size", window_size)
    check_int("block_size", block_size)
    return math.ceil(window_size / block_size) + 1


def windowed_len_bound(window_size: int, block_size: int, future_offset: int = 0) -> int:
    """Largest possible ``windowed_len``: ``W - K + b - 1``."""
    return window_size - future_offset + block_size - 1


def window_upper_bound(bound: int, window_size: int, block_size: int,
                       future_offset: int = 0) -> int:
    """Window a scalar upper bound of seq_lens (e.g. ``max_seq_len``)."""
    return min(bound, windowed_len_bound(window_size, block_size, future_offset))


@dataclasses.dataclass(frozen=True)
class WindowBounds:
    """Per-request window, all ``[num_reqs]`` tensors of ``seq_lens``' dtype."""

    start: torch.Tensor
    windowed_len: torch.Tensor
    start_block: torch.Tensor
    needed: torch.Tensor


def compute_window(seq_lens: torch.Tensor, window_size: int, block_size: int,
                   future_offset: int = 0) -> WindowBounds:
    """Window bounds for ``seq_lens`` (``[num_reqs]`` int tensor, any device)."""
    check_int("window_size", window_size)
    check_int("block_size", block_size)
    check_int("future_offset", future_offset, 0)
    shifted = torch.clamp(seq_lens + (future_offset - window_size), min=0)
    start_block = torch.div(shifted, block_size, rounding_mode="floor")
    start = start_block * block_size
    windowed_len = seq_lens - start
    needed = torch.clamp(
        torch.div(windowed_len + (block_size - 1), block_size, rounding_mode="floor"),
        max=max_window_blocks(window_size, block_size),
    )
    return WindowBounds(start, windowed_len, start_block, needed)


def gather_window_block_table(block_table: torch.Tensor, start_block: torch.Tensor,
                              needed: torch.Tensor, num_window_blocks: int) -> torch.Tensor:
    """Columns ``start_block[i] + [0, num_window_blocks)`` of ``block_table``.

    Returns a new ``[num_reqs, num_window_blocks]`` table of ``block_table``'s
    dtype; columns at or past ``needed[i]`` or past the full table's width
    are 0.
    """
    num_reqs, width = block_table.shape[0], block_table.shape[1]
    if width == 0:
        return block_table.new_zeros((num_reqs, num_window_blocks))
    cols = torch.arange(num_window_blocks, device=block_table.device, dtype=start_block.dtype)
    index = start_block.unsqueeze(1) + cols.unsqueeze(0)
    valid = torch.logical_and(cols.unsqueeze(0) < needed.unsqueeze(1), index < width)
    safe_index = torch.clamp(index, min=0, max=width - 1).to(torch.int64)
    gathered = torch.gather(block_table, 1, safe_index)
    return gathered * valid.to(block_table.dtype)


def window_seq_lens_and_block_table(
    seq_lens: torch.Tensor, block_table: torch.Tensor, window_size: int, block_size: int,
    future_offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(windowed_len, windowed_block_table)`` for one (seq_lens, block_table) pair."""
    bounds = compute_window(seq_lens, window_size, block_size, future_offset)
    table = gather_window_block_table(block_table, bounds.start_block, bounds.needed,
                                      max_window_blocks(window_size, block_size))
    return bounds.windowed_len, table


def window_seq_lens_and_block_table_packed(
    seq_lens: torch.Tensor, block_table: torch.Tensor, window_size: int, block_size: int,
    future_offset: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same values as ``window_seq_lens_and_block_table``, as contiguous views
    of ONE flat buffer ``[R * max_window_blocks + R]`` (table rows, then the
    lengths) computed by a single elementwise expression, so that a compiler
    emits one kernel for both. Needs equal dtypes (else: two tensors).
    """
    num_reqs, width = block_table.shape[0], block_table.shape[1]
    num_window_blocks = max_window_blocks(window_size, block_size)
    if block_table.dtype != seq_lens.dtype or width == 0:
        return window_seq_lens_and_block_table(seq_lens, block_table, window_size, block_size,
                                               future_offset)
    table_numel = num_reqs * num_window_blocks
    flat = torch.arange(table_numel + num_reqs, device=block_table.device)
    in_table = flat < table_numel
    row_in_table = torch.div(flat, num_window_blocks, rounding_mode="floor")
    row = torch.where(in_table, row_in_table, flat - table_numel)
    col = flat - row_in_table * num_window_blocks
    bounds = compute_window(torch.gather(seq_lens, 0, row), window_size, block_size,
                            future_offset)
    index = bounds.start_block + col
    valid = torch.logical_and(
        torch.logical_and(in_table, col < bounds.needed), index < width)
    safe_index = torch.clamp(index, min=0, max=width - 1)
    table_values = torch.gather(block_table.reshape(-1), 0, row * width + safe_index)
    packed = torch.where(in_table, table_values * valid.to(block_table.dtype),
                         bounds.windowed_len)
    # as_strided (not slice/view): Inductor then realizes `packed` once and hands
    # every consumer a view of that one buffer.
    return (torch.as_strided(packed, (num_reqs,), (1,), table_numel),
            torch.as_strided(packed, (num_reqs, num_window_blocks), (num_window_blocks, 1), 0))


def window_seq_lens(seq_lens: torch.Tensor, window_size: int, block_size: int,
                    future_offset: int = 0) -> torch.Tensor:
    """Windowed lengths only (for host mirrors such as ``seq_lens_cpu``)."""
    return compute_window(seq_lens, window_size, block_size, future_offset).windowed_len
