"""Draft KV sliding-window arithmetic (DESIGN.md section 1.1).

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
import logging
import math
from typing import Optional

import torch

logger = logging.getLogger(__name__)


def max_window_blocks(window_size: int, block_size: int) -> int:
    """Width of the windowed block table: ``ceil(W / b) + 1``.

    Covers the worst case ``ceil((W - K + b - 1) / b)`` for every K >= 0, also
    when b does not divide W (``W // b + 1`` does not: W=100, b=16 needs 8).
    """
    _check_positive("window_size", window_size)
    _check_positive("block_size", block_size)
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
    _check_positive("window_size", window_size)
    _check_positive("block_size", block_size)
    if future_offset < 0:
        raise ValueError(f"future_offset={future_offset!r} is invalid: expected an int >= 0")
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


def window_seq_lens(seq_lens: torch.Tensor, window_size: int, block_size: int,
                    future_offset: int = 0) -> torch.Tensor:
    """Windowed lengths only (for host mirrors such as ``seq_lens_cpu``)."""
    return compute_window(seq_lens, window_size, block_size, future_offset).windowed_len


@dataclasses.dataclass
class WindowedMetadata:
    """What an attention call reads after windowing.

    ``block_table`` is a view of the adapter's persistent buffer;
    ``full_block_table`` is the unmodified table, kept for KV writes.
    """

    seq_lens: torch.Tensor
    block_table: torch.Tensor
    full_block_table: torch.Tensor
    start: torch.Tensor
    seq_lens_cpu: Optional[torch.Tensor] = None
    max_seq_len: Optional[int] = None


class SlidingWindowAdapter:
    """Stateful window for runner integrations (outside torch.compile).

    Owns a persistent ``[max_num_reqs, max_window_blocks]`` block-table buffer
    that every ``apply`` overwrites in place, so its ``data_ptr()`` is stable
    across steps (CUDA-graph friendly). ``slot_mapping`` is never touched.
    """

    def __init__(self, window_size: int, block_size: int, max_num_reqs: int,
                 future_offset: int = 0, device: torch.device | str = "cpu",
                 dtype: torch.dtype = torch.int32, fused: Optional[bool] = None) -> None:
        _check_positive("max_num_reqs", max_num_reqs)
        # fused: one Triton launch (kernels.window_metadata) instead of ~8 torch ops;
        # None = on CUDA tensors only. The torch ops below stay the reference.
        self.fused = fused
        self.window_size = window_size
        self.block_size = block_size
        self.future_offset = future_offset
        self.max_window_blocks = max_window_blocks(window_size, block_size)
        self.block_table_buffer = torch.zeros(
            (max_num_reqs, self.max_window_blocks), dtype=dtype, device=device)

    def apply(self, seq_lens: torch.Tensor, block_table: torch.Tensor,
              seq_lens_cpu: Optional[torch.Tensor] = None,
              max_seq_len: Optional[int] = None) -> WindowedMetadata:
        num_reqs = seq_lens.shape[0]
        if num_reqs > self.block_table_buffer.shape[0]:
            raise ValueError(
                f"seq_lens has {num_reqs} requests but the adapter was built for "
                f"max_num_reqs={self.block_table_buffer.shape[0]}")
        if block_table.shape[0] != num_reqs:
            raise ValueError(
                f"block_table has {block_table.shape[0]} rows, expected one per request "
                f"({num_reqs})")
        if self.fused if self.fused is not None else seq_lens.is_cuda:
            return self._apply_fused(seq_lens, block_table, seq_lens_cpu, max_seq_len)
        bounds = compute_window(seq_lens, self.window_size, self.block_size, self.future_offset)
        out = self.block_table_buffer[:num_reqs]
        out.copy_(gather_window_block_table(block_table, bounds.start_block, bounds.needed,
                                            self.max_window_blocks))
        return WindowedMetadata(
            seq_lens=bounds.windowed_len,
            block_table=out,
            full_block_table=block_table,
            start=bounds.start,
            seq_lens_cpu=None if seq_lens_cpu is None else window_seq_lens(
                seq_lens_cpu, self.window_size, self.block_size, self.future_offset),
            max_seq_len=None if max_seq_len is None else window_upper_bound(
                max_seq_len, self.window_size, self.block_size, self.future_offset),
        )

    def _apply_fused(self, seq_lens, block_table, seq_lens_cpu, max_seq_len) -> WindowedMetadata:
        from dspark_compile.kernels.window_metadata import window_metadata_triton

        out = self.block_table_buffer[:seq_lens.shape[0]]
        windowed_len, start, _ = window_metadata_triton(
            seq_lens, block_table, self.window_size, self.block_size, self.future_offset,
            out_table=out)
        return WindowedMetadata(
            seq_lens=windowed_len,
            block_table=out,
            full_block_table=block_table,
            start=start,
            seq_lens_cpu=None if seq_lens_cpu is None else window_seq_lens(
                seq_lens_cpu, self.window_size, self.block_size, self.future_offset),
            max_seq_len=None if max_seq_len is None else window_upper_bound(
                max_seq_len, self.window_size, self.block_size, self.future_offset),
        )


def _check_positive(name: str, value: object) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
        raise ValueError(f"{name}={value!r} is invalid: expected a positive int")
