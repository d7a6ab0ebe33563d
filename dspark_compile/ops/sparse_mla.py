"""Sparse-MLA custom ops: ``dspark.swa_indices``, ``dspark.noncausal_swa_indices``,
``dspark.sparse_mla_attention`` and ``dspark.mla_cache_write``.

Opaque ``torch.library.custom_op``s (the DSpark pass finds the index ops by
name in the post-grad graph) with fake implementations. The default (CPU)
implementation is the torch reference in ``dspark_compile.kernels.sparse_mla``;
on CUDA Triton kernels are registered when Triton imports: the index kernels
of ``sparse_mla_triton``, the grouped attention of ``sparse_mla_grouped_triton``
(each KV row loaded once per group of tokens sharing it) and the cache write of
``mla_cache_write_triton``.
"""

from __future__ import annotations

import logging

import torch

from dspark_compile.kernels import sparse_mla as ref

logger = logging.getLogger(__name__)


@torch.library.custom_op("dspark::swa_indices", mutates_args=())
def swa_indices(
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_size: int,
    window_size: int,
    width: int,
    sink_size: int = 0,
) -> torch.Tensor:
    """Causal sliding-window KV slot ids ``[T, width]`` int32, ``-1`` padded; with
    ``sink_size`` S > 0 the first ``ceil(S / b) * b`` KV tokens too (attention sinks).

    Semantics: ``dspark_compile.kernels.sparse_mla.swa_indices_ref``.
    """
    return ref.swa_indices_ref(
        seq_lens,
        query_start_loc,
        block_table,
        slot_mapping,
        block_size,
        window_size,
        width,
        sink_size,
    )


@torch.library.custom_op("dspark::noncausal_swa_indices", mutates_args=())
def noncausal_swa_indices(
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_size: int,
    window_size: int,
    width: int,
    sink_size: int = 0,
) -> torch.Tensor:
    """DSpark non-causal KV slot ids ``[T, width]`` int32: every query of a request's
    block sees ``[max(ctx - W, 0), ctx + q_len)``, plus, with ``sink_size`` S > 0,
    the first ``ceil(S / b) * b`` KV tokens (attention sinks).

    Semantics: ``dspark_compile.kernels.sparse_mla.noncausal_swa_indices_ref``.
    """
    return ref.noncausal_swa_indices_ref(
        seq_lens,
        query_start_loc,
        block_table,
        slot_mapping,
        block_size,
        window_size,
        width,
        sink_size,
    )


def _indices_fake(
    seq_lens,
    query_start_loc,
    block_table,
    slot_mapping,
    block_size,
    window_size,
    width,
    sink_size=0,
):
    ref.check_index_args(
        seq_lens,
        query_start_loc,
        block_table,
        slot_mapping,
        block_size,
        window_size,
        width,
        sink_size,
    )
    return slot_mapping.new_empty((slot_mapping.shape[0], width), dtype=torch.int32)


swa_indices.register_fake(_indices_fake)
noncausal_swa_indices.register_fake(_indices_fake)


@torch.library.custom_op("dspark::sparse_mla_attention", mutates_args=())
def sparse_mla_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    scale: float,
    kv_lora_rank: int,
) -> torch.Tensor:
    """MLA attention of ``query [T, H, L+P]`` over the listed slots of
    ``kv_cache [num_blocks, b, L+P]``; returns ``[T, H, L]``.

    Semantics: ``dspark_compile.kernels.sparse_mla.sparse_mla_attention_ref``.
    """
    return ref.sparse_mla_attention_ref(query, kv_cache, indices, scale, kv_lora_rank)


@sparse_mla_attention.register_fake
def _sparse_mla_attention_fake(query, kv_cache, indices, scale, kv_lora_rank):
    return query.new_empty((query.shape[0], query.shape[1], kv_lora_rank))


@torch.library.custom_op("dspark::mla_cache_write", mutates_args=("kv_cache",))
def mla_cache_write(kv: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor) -> None:
    """Write latent rows ``kv [T, L+P]`` at absolute ``slot_mapping [T]`` slots (negative: skip)."""
    ref.mla_cache_write_ref(kv, kv_cache, slot_mapping)


@mla_cache_write.register_fake
def _mla_cache_write_fake(kv, kv_cache, slot_mapping):
    return None


def _register_triton_kernels() -> None:
    try:
        from dspark_compile.kernels import sparse_mla_triton as tri
        from dspark_compile.kernels.mla_cache_write_triton import mla_cache_write_triton
        from dspark_compile.kernels.sparse_mla_gluon import gluon_sparse_mla_attention
    except ImportError as error:  # CPU-only installs without Triton keep the references
        logger.info("Triton unavailable (%s): dspark sparse-MLA ops use torch references", error)
        return
    swa_indices.register_kernel("cuda")(tri.swa_indices_triton)
    noncausal_swa_indices.register_kernel("cuda")(tri.noncausal_swa_indices_triton)
    # Hopper + verified triton: the Gluon kernel; otherwise it calls the grouped Triton one
    sparse_mla_attention.register_kernel("cuda")(gluon_sparse_mla_attention)
    mla_cache_write.register_kernel("cuda")(mla_cache_write_triton)


_register_triton_kernels()
