"""Window a vLLM attention-metadata object (FlashAttention and Triton backends).

``window_attention_metadata`` returns a shallow copy of the metadata in which
everything attention reads as a KV length is windowed with
``dspark_compile.arithmetic.window`` (docs/design.md, "Two window mechanisms"):

- ``seq_lens`` -> ``windowed_len`` (device, no host sync),
- ``block_table`` -> columns ``start_block + [0, ceil(W/b) + 1)``, zero padded,
- ``max_seq_len`` -> ``min(max_seq_len, W - K + b - 1)``,
- FlashAttention's AOT ``scheduler_metadata`` (planned from the full
  ``seq_lens``) -> ``None``: FA3 then plans from the windowed ``seq_lens``.

``slot_mapping`` (KV writes) is the same tensor object; every other field is
shared. Features whose metadata holds absolute positions or per-rank context
lengths (multimodal prefix ranges, R-SWA, decode context parallel) raise.

``StepWindows`` applies the window once per metadata object per forward step
(vLLM's forward context), writing into persistent per-KV-group buffers whose
``data_ptr()`` is stable across steps.
"""

from __future__ import annotations

import copy
import logging
from typing import Any

import torch

from dspark_compile.arithmetic.window import window_upper_bound
from dspark_compile.runtime.sliding_window import SlidingWindowAdapter

logger = logging.getLogger(__name__)

SUPPORTED_BACKENDS = ("FLASH_ATTN", "TRITON_ATTN")
_STEP_CACHE_KEY = "dspark_windowed_attn_metadata"
# (field, backend feature) pairs the window cannot shift: absolute positions
# or per-rank context lengths.
_UNSUPPORTED_FIELDS = (
    ("dcp_context_kv_lens", "decode context parallel"),
    ("mm_prefix_query_range_tensor", "multimodal prefix ranges"),
    ("mm_prefix_range_tensor", "multimodal prefix ranges"),
    ("rswa_prefix_lens", "R-SWA"),
)


def supported_metadata_types() -> tuple[type, ...]:
    from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadata
    from vllm.v1.attention.backends.triton_attn import TritonAttentionMetadata

    return (FlashAttentionMetadata, TritonAttentionMetadata)


def kernel_block_size(kv_cache: torch.Tensor) -> int:
    """Block size of a FlashAttention/Triton KV cache, logical ``[B, Hkv, b, 2*D]``."""
    if kv_cache.dim() != 4:
        raise ValueError(f"kv_cache of shape {tuple(kv_cache.shape)} is not a "
                         "[num_blocks, num_kv_heads, block_size, 2 * head_size] cache")
    return int(kv_cache.shape[2])


class WindowBuffers:
    """Persistent outputs of one KV-cache group: windowed seq_lens and block table."""

    def __init__(self, window_size: int, block_size: int, future_offset: int,
                 max_num_reqs: int, device: torch.device, seq_lens_dtype: torch.dtype,
                 table_dtype: torch.dtype) -> None:
        self.adapter = SlidingWindowAdapter(window_size, block_size, max_num_reqs,
                                            future_offset, device=device, dtype=table_dtype)
        self.seq_lens = torch.zeros(max_num_reqs, dtype=seq_lens_dtype, device=device)

    def fits(self, num_reqs: int, seq_lens: torch.Tensor, block_table: torch.Tensor) -> bool:
        return (num_reqs <= self.seq_lens.shape[0]
                and self.seq_lens.device == seq_lens.device
                and self.seq_lens.dtype == seq_lens.dtype
                and self.adapter.block_table_buffer.dtype == block_table.dtype)


def window_attention_metadata(metadata: Any, buffers: WindowBuffers) -> Any:
    """Windowed shallow copy of a FlashAttention/Triton metadata object (see module doc)."""
    if not isinstance(metadata, supported_metadata_types()):
        raise TypeError(
            f"attention metadata of type {type(metadata).__name__} cannot be windowed: "
            f"the draft window supports the {', '.join(SUPPORTED_BACKENDS)} backends")
    for field, feature in _UNSUPPORTED_FIELDS:
        if getattr(metadata, field, None) is not None:
            raise NotImplementedError(
                f"{type(metadata).__name__}.{field} is set ({feature}): the draft window "
                f"does not support {feature}")
    adapter = buffers.adapter
    num_reqs = metadata.seq_lens.shape[0]
    windowed = adapter.apply(metadata.seq_lens, metadata.block_table)
    seq_lens = buffers.seq_lens[:num_reqs]
    seq_lens.copy_(windowed.seq_lens)
    out = copy.copy(metadata)
    out.seq_lens = seq_lens
    out.block_table = windowed.block_table
    out.max_seq_len = window_upper_bound(metadata.max_seq_len, adapter.window_size,
                                         adapter.block_size, adapter.future_offset)
    if getattr(metadata, "scheduler_metadata", None) is not None:
        out.scheduler_metadata = None
    return out


class StepWindows:
    """Windowed metadata, computed once per metadata object per forward step.

    Buffers are keyed by the first layer that reads a metadata object in a
    step: layers of one KV-cache group share it, distinct groups get distinct
    buffers (no group ever reads another group's windowed table).
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple, WindowBuffers] = {}

    def windowed(self, forward_context: Any, layer_name: str, metadata: Any,
                 kv_cache: torch.Tensor, window_size: int, future_offset: int) -> Any:
        step = forward_context.additional_kwargs.setdefault(_STEP_CACHE_KEY, {})
        hit = step.get(id(metadata))
        if hit is not None and hit[0] is metadata:
            return hit[1]
        block_size = kernel_block_size(kv_cache)
        buffers = self._buffers_for(layer_name, metadata, window_size, block_size, future_offset)
        result = window_attention_metadata(metadata, buffers)
        step[id(metadata)] = (metadata, result)
        return result

    def _buffers_for(self, layer_name: str, metadata: Any, window_size: int,
                     block_size: int, future_offset: int) -> WindowBuffers:
        key = (layer_name, window_size, block_size, future_offset)
        num_reqs = metadata.seq_lens.shape[0]
        buffers = self._buffers.get(key)
        if buffers is None or not buffers.fits(num_reqs, metadata.seq_lens, metadata.block_table):
            capacity = max(num_reqs, _max_num_seqs(), 1)
            logger.debug("dspark draft window: buffers for %s (%d requests)", layer_name, capacity)
            buffers = WindowBuffers(window_size, block_size, future_offset, capacity,
                                    metadata.seq_lens.device, metadata.seq_lens.dtype,
                                    metadata.block_table.dtype)
            self._buffers[key] = buffers
        return buffers


def _max_num_seqs() -> int:
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    scheduler = getattr(config, "scheduler_config", None)
    return int(getattr(scheduler, "max_num_seqs", 0) or 0)
