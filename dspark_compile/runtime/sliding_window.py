"""DEPRECATED run-time draft window for runner integrations (outside torch.compile).

``SlidingWindowAdapter`` windows per-request (decode / non-causal) metadata on every
step with the arithmetic of ``dspark_compile.arithmetic.window`` (the definition of
correct), or with one fused Triton launch (``kernels.window_metadata``) on CUDA.

The vLLM route never used it: its run-time window is
``integrations.vllm.StepWindows`` (token exact, per forward step, with sinks), the one
run-time window kept (issue 39). Constructing an adapter warns (``DeprecationWarning``,
``DEPRECATION``); its results are unchanged. Other runners call
``arithmetic.window.window_seq_lens_and_block_table`` (or
``kernels.window_metadata.window_metadata_triton(..., out_table=)``) into their own
persistent buffer, which is all the adapter does.
"""

from __future__ import annotations

import dataclasses
import warnings
from typing import Optional

import torch

from dspark_compile.arithmetic.window import (
    compute_window,
    gather_window_block_table,
    max_window_blocks,
    window_seq_lens,
    window_upper_bound,
)
from dspark_compile.config import DraftWindowConfig, WindowSpec
from dspark_compile.validation import check_int

DEPRECATION = (
    "SlidingWindowAdapter is deprecated and will be removed: the vLLM route's run-time "
    "window is dspark_compile.integrations.vllm.StepWindows; other runner integrations "
    "call dspark_compile.arithmetic.window.window_seq_lens_and_block_table (or "
    "dspark_compile.kernels.window_metadata.window_metadata_triton with out_table=) into "
    "their own persistent block-table buffer (the same values)"
)


@dataclasses.dataclass
class WindowedMetadata:
    """What an attention call reads after windowing.

    ``block_table`` is a view of the adapter's persistent buffer;
    ``full_block_table`` is the unmodified table, kept for KV writes.
    ``start`` is the absolute position of the window's first key; with sinks
    the table holds ``min(ceil(S / b), start // b)`` sink blocks before it and
    ``seq_lens`` counts their tokens (``arithmetic.window``).
    """

    seq_lens: torch.Tensor
    block_table: torch.Tensor
    full_block_table: torch.Tensor
    start: torch.Tensor
    seq_lens_cpu: Optional[torch.Tensor] = None
    max_seq_len: Optional[int] = None


class SlidingWindowAdapter:
    """Stateful window for runner integrations (outside torch.compile).

    Owns a persistent ``[max_num_reqs, max_window_blocks(W, b, sink_size=S)]``
    block-table buffer that every ``apply`` overwrites in place, so its
    ``data_ptr()`` is stable across steps (CUDA-graph friendly).
    ``slot_mapping`` is never touched. ``sink_size`` S: the first ``ceil(S / b)``
    blocks stay visible beside the window (attention sinks; 0: none).
    ``fused``: one Triton launch instead of ~8 torch ops; ``None`` = on CUDA
    tensors only. Deprecated (module doc): construction warns.
    """

    def __init__(
        self,
        window_size: int,
        block_size: int,
        max_num_reqs: int,
        future_offset: int = 0,
        device: torch.device | str = "cpu",
        dtype: torch.dtype = torch.int32,
        fused: Optional[bool] = None,
        sink_size: int = 0,
    ) -> None:
        warnings.warn(DEPRECATION, DeprecationWarning, stacklevel=2)
        check_int("max_num_reqs", max_num_reqs)
        self.fused = fused
        self.max_window_blocks = max_window_blocks(window_size, block_size, sink_size=sink_size)
        #: The validated window (``config.WindowSpec``: ``0 <= future_offset < window_size``).
        self.spec = WindowSpec(window_size, future_offset, block_size, sink_size)
        self.window_size = window_size
        self.block_size = block_size
        self.future_offset = future_offset
        self.sink_size = sink_size
        self.block_table_buffer = torch.zeros(
            (max_num_reqs, self.max_window_blocks), dtype=dtype, device=device
        )

    @classmethod
    def from_config(
        cls,
        config: DraftWindowConfig,
        max_num_reqs: int,
        block_size: Optional[int] = None,
        **kwargs,
    ) -> SlidingWindowAdapter:
        """An adapter with W, K and S (``draft_sink_size``) from ``config``; b from
        ``config.block_size``, else ``block_size``. ``kwargs``: device, dtype, fused."""
        spec = WindowSpec.from_config(config, block_size)
        return cls(
            spec.window_size,
            spec.block_size,
            max_num_reqs,
            future_offset=spec.future_offset,
            sink_size=spec.sink_size,
            **kwargs,
        )

    def apply(
        self,
        seq_lens: torch.Tensor,
        block_table: torch.Tensor,
        seq_lens_cpu: Optional[torch.Tensor] = None,
        max_seq_len: Optional[int] = None,
    ) -> WindowedMetadata:
        """Window one step's metadata; the returned table is a view of the buffer."""
        num_reqs = seq_lens.shape[0]
        if num_reqs > self.block_table_buffer.shape[0]:
            raise ValueError(
                f"seq_lens has {num_reqs} requests but the adapter was built for "
                f"max_num_reqs={self.block_table_buffer.shape[0]}"
            )
        if block_table.shape[0] != num_reqs:
            raise ValueError(
                f"block_table has {block_table.shape[0]} rows, expected one per request "
                f"({num_reqs})"
            )
        out = self.block_table_buffer[:num_reqs]
        if self.fused if self.fused is not None else seq_lens.is_cuda:
            from dspark_compile.kernels.window_metadata import window_metadata_triton

            windowed_len, start, _ = window_metadata_triton(
                seq_lens,
                block_table,
                self.window_size,
                self.block_size,
                self.future_offset,
                out_table=out,
                sink_size=self.sink_size,
            )
        else:
            bounds = compute_window(
                seq_lens,
                self.window_size,
                self.block_size,
                self.future_offset,
                sink_size=self.sink_size,
            )
            out.copy_(
                gather_window_block_table(
                    block_table,
                    bounds.start_block,
                    bounds.needed,
                    self.max_window_blocks,
                    bounds.kept_sinks,
                )
            )
            windowed_len, start = bounds.windowed_len, bounds.start
        return WindowedMetadata(
            seq_lens=windowed_len,
            block_table=out,
            full_block_table=block_table,
            start=start,
            seq_lens_cpu=None
            if seq_lens_cpu is None
            else window_seq_lens(
                seq_lens_cpu, self.window_size, self.block_size, self.future_offset, self.sink_size
            ),
            max_seq_len=None
            if max_seq_len is None
            else window_upper_bound(
                max_seq_len,
                self.window_size,
                self.block_size,
                self.future_offset,
                sink_size=self.sink_size,
            ),
        )
