"""Windowed vLLM metadata WITH attention sinks (``draft_sink_size`` S > 0; ``metadata``,
"Sinks").

The layer runs with no native window (``backends.check_no_native_window``); the metadata
alone decides what each query reads, by the block-aligned rule of
``dspark.paged_attention``: causal calls expanded to one single-query row per query
token, each the decode-form window (``arithmetic.window.compute_window``) of
``seq_len = p + 1`` plus kept sink blocks; non-causal calls one row per request.
"""

from __future__ import annotations

from typing import Any

import torch

from dspark_compile.arithmetic.window import (
    compute_window,
    max_window_blocks,
    table_columns,
    windowed_len_bound,
)
from dspark_compile.config import WindowSpec
from dspark_compile.integrations.vllm.backends import (
    check_supported,
    cpu_scheduler_metadata,
    is_causal,
    metadata_backend,
    shallow_copy,
)


class SinkWindowBuffers:
    """Persistent windowed metadata of one KV-cache group with attention sinks.

    ``seq_lens [rows]``, ``block_table [rows, cols]`` and ``query_start_loc =
    arange(rows + 1)`` with ``rows`` the most query tokens of a step (vLLM's
    ``max_num_batched_tokens``; causal calls get one row per query token) and
    ``cols = max_window_blocks(W, b, sink_size=S)`` (sink blocks + the
    decode-form window). Sized once; never reallocated, so pointers captured
    in CUDA graphs stay valid. A step that does not fit raises.
    """

    def __init__(
        self,
        rows: int,
        cols: int,
        device: torch.device,
        seq_lens_dtype: torch.dtype,
        table_dtype: torch.dtype,
        query_start_loc_dtype: torch.dtype,
    ) -> None:
        self.seq_lens = torch.zeros(rows, dtype=seq_lens_dtype, device=device)
        self.block_table = torch.zeros(rows, cols, dtype=table_dtype, device=device)
        self.query_start_loc = torch.arange(rows + 1, dtype=query_start_loc_dtype, device=device)

    def check_fits(self, rows: int, metadata: Any) -> None:
        seq_lens, table = metadata.seq_lens, metadata.block_table
        capacity = self.block_table.shape[0]
        if (
            rows > capacity
            or seq_lens.device != self.seq_lens.device
            or seq_lens.dtype != self.seq_lens.dtype
            or table.dtype != self.block_table.dtype
            or metadata.query_start_loc.dtype != self.query_start_loc.dtype
        ):
            raise RuntimeError(
                f"draft window + sink buffers ({capacity} rows of {self.block_table.dtype} on "
                f"{self.block_table.device}) cannot hold a step needing {rows} rows (one per "
                f"query token of a causal call, one per request otherwise) with "
                f"{seq_lens.dtype} seq_lens and a {table.dtype} block table on {table.device}; "
                "they are sized once from max_num_batched_tokens and never reallocated "
                "(CUDA graphs keep their pointers)"
            )


def sink_window_metadata(
    metadata: Any,
    buffers: SinkWindowBuffers,
    spec: WindowSpec,
    layer: Any = None,
    query_dtype: torch.dtype | None = None,
) -> Any:
    """Windowed copy of a FlashAttention/Triton/CPU metadata object WITH attention sinks
    (``spec.sink_size > 0``; module docstring, "Sinks").

    Causal: one single-query row per query token ``t`` (``query_start_loc ->
    arange(T + 1)``, ``max_query_len -> 1``): ``seq_lens[t]`` and ``block_table[t]``
    are the decode-form window (``window_seq_lens_and_block_table``) of
    ``seq_len = p_t + 1`` on the token's request row, sinks included. Non-causal:
    one row per request, the window of its last token, sinks included. In both
    ``max_seq_len -> min(max_seq_len, windowed_len_bound(W, b, K, 1, S))``;
    FlashAttention's AOT ``scheduler_metadata`` is dropped, CPU attention's is
    recomputed for the new rows (no sliding window). The layer must run without
    a native window. ``slot_mapping`` and every other field are shared.
    """
    backend = metadata_backend(metadata)
    check_supported(metadata)
    if getattr(metadata, "use_cascade", False):
        raise NotImplementedError(
            f"{type(metadata).__name__}.use_cascade is set (cascade attention): the draft "
            "window with sinks does not support cascade attention"
        )
    seq_lens, table, qsl = metadata.seq_lens, metadata.block_table, metadata.query_start_loc
    num_reqs, width = table.shape
    causal = is_causal(metadata)
    rows = int(metadata.num_actual_tokens) if causal else num_reqs
    buffers.check_fits(rows, metadata)
    window, offset, block, sinks = (
        spec.window_size,
        spec.future_offset,
        spec.block_size,
        spec.sink_size,
    )
    cols = max(
        1,
        min(width, buffers.block_table.shape[1], max_window_blocks(window, block, sink_size=sinks)),
    )
    new_lens = buffers.seq_lens[:rows]
    new_table = buffers.block_table[:rows, :cols]
    if rows and num_reqs and width:
        if causal:
            tokens = torch.arange(rows, device=qsl.device, dtype=qsl.dtype)
            req = torch.clamp(
                torch.searchsorted(qsl[1 : num_reqs + 1].contiguous(), tokens, right=True),
                max=num_reqs - 1,
            )
            first = qsl[req]
            s_req = seq_lens[req]
            # p_t + 1 (clamped to [1, s] so that padding rows stay harmless)
            ends = (
                s_req
                - (qsl[req + 1] - first).to(s_req.dtype)
                + (tokens - first).to(s_req.dtype)
                + 1
            )
            ends = torch.clamp(torch.minimum(ends, s_req), min=1)
        else:
            req = torch.arange(num_reqs, device=seq_lens.device)
            ends = seq_lens
        bounds = compute_window(ends, window, block, offset, sink_size=sinks)
        col = torch.arange(cols, device=table.device, dtype=bounds.start_block.dtype)[None, :]
        index = table_columns(col, bounds.start_block[:, None], bounds.kept_sinks[:, None])
        valid = (col < bounds.needed[:, None]) & (index < width)
        values = table[req.long()[:, None], torch.clamp(index, min=0, max=width - 1).long()]
        torch.where(
            valid, values, torch.zeros((), dtype=table.dtype, device=table.device), out=new_table
        )
        new_lens.copy_(bounds.windowed_len)
    else:
        new_lens.zero_()
        new_table.zero_()
    out = shallow_copy(metadata)
    out.seq_lens = new_lens
    out.block_table = new_table
    out.max_seq_len = min(
        int(metadata.max_seq_len), windowed_len_bound(window, block, offset, 1, sinks)
    )
    if causal:
        out.query_start_loc = buffers.query_start_loc[: rows + 1]
        out.max_query_len = 1
    if backend == "FLASH_ATTN" and getattr(metadata, "scheduler_metadata", None) is not None:
        out.scheduler_metadata = None
    if backend == "CPU_ATTN":
        out.scheduler_metadata = cpu_scheduler_metadata(
            out, layer, spec, query_dtype, sliding_window=-1
        )
    out.dspark_expanded = causal
    return out
