"""``StepWindows``: the vLLM route's run-time window, once per metadata object per step.

The windowed attention op calls ``StepWindows.windowed`` for every draft-layer call;
the first call of a step per metadata object windows it (``token_window`` without
sinks, ``sink_window`` with sinks) into persistent buffers, later calls of the step
reuse the result.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from dspark_compile.arithmetic.window import max_window_blocks
from dspark_compile.config import WindowSpec
from dspark_compile.integrations.vllm import sink_window, token_window
from dspark_compile.integrations.vllm.backends import kernel_block_size
from dspark_compile.integrations.vllm.sink_window import SinkWindowBuffers
from dspark_compile.integrations.vllm.token_window import WindowBuffers

logger = logging.getLogger(__name__)

_STEP_CACHE_KEY = "dspark_windowed_attn_metadata"


@dataclasses.dataclass
class WindowStats:
    """What the windowed op did in this process (read by tests and logs)."""

    windowed_calls: dict[str, int] = dataclasses.field(default_factory=dict)
    metadata_windowed: int = 0
    # of those, metadata the window could not cut (kept as it was; token_window)
    metadata_uncut: int = 0
    # metadata objects windowed with sinks: per query token (causal) / per request
    metadata_expanded: int = 0
    metadata_sinks_noncausal: int = 0


class StepWindows:
    """Windowed metadata, computed once per metadata object per forward step.

    Buffers are keyed by the first layer that reads a metadata object in a
    step: layers of one KV-cache group share it, distinct groups get distinct
    buffers (no group ever reads another group's windowed table).
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple, Any] = {}
        self.stats = WindowStats()

    def windowed(
        self,
        forward_context: Any,
        layer_name: str,
        layer: Any,
        metadata: Any,
        kv_cache: torch.Tensor,
        window_size: int,
        future_offset: int,
        max_num_seqs: int,
        query_dtype: torch.dtype,
        sink_size: int = 0,
        max_num_tokens: int = 0,
    ) -> Any:
        """``sink_size`` S > 0: ``sink_window_metadata`` into buffers of
        ``max(max_num_tokens, max_num_seqs, rows of this call)`` rows; else
        ``window_attention_metadata`` (no sinks; ``max_num_tokens`` unused)."""
        self.stats.windowed_calls[layer_name] = self.stats.windowed_calls.get(layer_name, 0) + 1
        step = forward_context.additional_kwargs.setdefault(_STEP_CACHE_KEY, {})
        hit = step.get(id(metadata))
        if hit is not None and hit[0] is metadata:
            return hit[1]
        if sink_size:
            spec = WindowSpec.cached(
                window_size, future_offset, kernel_block_size(kv_cache), sink_size
            )
            buffers = self._sink_buffers_for(
                layer_name, metadata, spec, max_num_seqs, max_num_tokens
            )
            result = sink_window.sink_window_metadata(metadata, buffers, spec, layer, query_dtype)
            if result.dspark_expanded:
                self.stats.metadata_expanded += 1
            else:
                self.stats.metadata_sinks_noncausal += 1
        else:
            spec = WindowSpec.cached(window_size, future_offset, kernel_block_size(kv_cache))
            buffers = self._buffers_for(layer_name, metadata, spec, max_num_seqs)
            result = token_window.window_attention_metadata(
                metadata, buffers, spec, layer, query_dtype
            )
            if not result.dspark_window_cut:
                self.stats.metadata_uncut += 1
        result.dspark_window = spec
        self.stats.metadata_windowed += 1
        step[id(metadata)] = (metadata, result)
        return result

    def _buffers_for(
        self, layer_name: str, metadata: Any, spec: WindowSpec, max_num_seqs: int
    ) -> WindowBuffers:
        key = (layer_name, spec)
        buffers = self._buffers.get(key)
        if buffers is None:
            num_reqs, width = metadata.block_table.shape
            capacity = max(num_reqs, max_num_seqs, 1)
            logger.info(
                "dspark draft window: buffers for %s: %d requests x %d blocks",
                layer_name,
                capacity,
                width,
            )
            buffers = WindowBuffers(
                capacity,
                width,
                metadata.seq_lens.device,
                metadata.seq_lens.dtype,
                metadata.block_table.dtype,
            )
            self._buffers[key] = buffers
        return buffers

    def _sink_buffers_for(
        self,
        layer_name: str,
        metadata: Any,
        spec: WindowSpec,
        max_num_seqs: int,
        max_num_tokens: int,
    ) -> SinkWindowBuffers:
        key = (layer_name, spec)
        buffers = self._buffers.get(key)
        if buffers is None:
            rows = max(
                int(metadata.num_actual_tokens),
                metadata.block_table.shape[0],
                max_num_tokens,
                max_num_seqs,
                1,
            )
            cols = max_window_blocks(spec.window_size, spec.block_size, sink_size=spec.sink_size)
            logger.info(
                "dspark draft window + sinks: buffers for %s: %d rows x %d blocks",
                layer_name,
                rows,
                cols,
            )
            buffers = SinkWindowBuffers(
                rows,
                cols,
                metadata.seq_lens.device,
                metadata.seq_lens.dtype,
                metadata.block_table.dtype,
                metadata.query_start_loc.dtype,
            )
            self._buffers[key] = buffers
        return buffers
