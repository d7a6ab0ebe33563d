"""``dspark.paged_attention`` and ``dspark.reshape_and_cache`` custom ops.

Both are opaque ``torch.library.custom_op``s (so the window pass finds them by
name in the post-grad graph) with fake implementations so they trace.
Their default implementation is the torch reference in
``dspark_compile.kernels.paged_attention``; device kernels register on top.
"""

from __future__ import annotations

from typing import Optional

import torch

from dspark_compile.kernels.paged_attention import (
    check_window_args,
    paged_attention_ref,
    reshape_and_cache_ref,
)


@torch.library.custom_op("dspark::paged_attention", mutates_args=())
def paged_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    causal: bool,
    kv_offset: Optional[torch.Tensor] = None,
    window_size: Optional[int] = None,
    future_offset: int = 0,
    sink_size: int = 0,
) -> torch.Tensor:
    """Attention of ``query [T, Hq, D]`` over a paged KV cache; returns ``[T, Hq, D]``.

    ``window_size`` W / ``future_offset`` K: the per-token draft window, a query
    at absolute position p sees keys ``>= floor(max(p + 1 + K - W, 0) / b) * b``;
    ``kv_offset [R]``: the absolute position of the window's first table token;
    ``sink_size`` S: keys ``< ceil(S / b) * b`` stay visible (attention sinks;
    the table then starts with the kept sink blocks).
    Semantics: ``dspark_compile.kernels.paged_attention.paged_attention_ref``.
    """
    return paged_attention_ref(
        query,
        key_cache,
        value_cache,
        block_table,
        seq_lens,
        query_start_loc,
        scale,
        causal,
        kv_offset=kv_offset,
        window_size=window_size,
        future_offset=future_offset,
        sink_size=sink_size,
    )


@paged_attention.register_fake
def _paged_attention_fake(
    query,
    key_cache,
    value_cache,
    block_table,
    seq_lens,
    query_start_loc,
    scale,
    causal,
    kv_offset=None,
    window_size=None,
    future_offset=0,
    sink_size=0,
):
    check_window_args(window_size, future_offset, sink_size)
    return query.new_empty(query.shape[0], query.shape[1], value_cache.shape[-1])


@torch.library.custom_op("dspark::reshape_and_cache", mutates_args=("key_cache", "value_cache"))
def reshape_and_cache(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``key/value [T, Hkv, D]`` at absolute ``slot_mapping [T]`` slots (negative: skip)."""
    reshape_and_cache_ref(key, value, key_cache, value_cache, slot_mapping)


@reshape_and_cache.register_fake
def _reshape_and_cache_fake(key, value, key_cache, value_cache, slot_mapping):
    return None


@paged_attention.register_kernel("cuda")
def _paged_attention_cuda(
    query,
    key_cache,
    value_cache,
    block_table,
    seq_lens,
    query_start_loc,
    scale,
    causal,
    kv_offset=None,
    window_size=None,
    future_offset=0,
    sink_size=0,
):
    """CUDA: the split-KV Triton kernel (``kernels.paged_attention_triton``); the
    torch reference for dtypes/layouts it does not handle."""
    from dspark_compile.kernels import paged_attention_triton as kernel

    window = dict(
        kv_offset=kv_offset,
        window_size=window_size,
        future_offset=future_offset,
        sink_size=sink_size,
    )
    if kernel.supports(query, key_cache, value_cache):
        return kernel.paged_attention_triton(
            query,
            key_cache,
            value_cache,
            block_table,
            seq_lens,
            query_start_loc,
            scale,
            causal,
            **window,
        )
    kernel.warn_fallback(f"query {query.dtype}, cache {key_cache.dtype}/{value_cache.dtype}")
    return paged_attention_ref(
        query,
        key_cache,
        value_cache,
        block_table,
        seq_lens,
        query_start_loc,
        scale,
        causal,
        **window,
    )


@reshape_and_cache.register_kernel("cuda")
def _reshape_and_cache_cuda(key, value, key_cache, value_cache, slot_mapping):
    """CUDA: the Triton KV write (no host sync, unlike the reference's boolean mask)."""
    from dspark_compile.kernels import reshape_and_cache_triton as kernel

    if kernel.supports(key, value, key_cache, value_cache):
        kernel.reshape_and_cache_triton(key, value, key_cache, value_cache, slot_mapping)
    else:
        reshape_and_cache_ref(key, value, key_cache, value_cache, slot_mapping)
