"""Triton latent-KV write for ``dspark.mla_cache_write`` (reference: ``mla_cache_write_ref``).

Row t of ``kv [T, L+P]`` goes to absolute slot ``slot_mapping[t]`` of
``kv_cache [num_blocks, b, L+P]`` (``block = slot // b``, ``offset = slot % b``);
a negative slot skips its row. One program per row decides on device, so the
write has no host synchronisation (the reference's boolean-mask selection
has one) and a draft step that calls it captures as a CUDA graph.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _mla_cache_write_kernel(
    kv_ptr,
    kv_stride,
    cache_ptr,
    cache_stride0,
    cache_stride1,
    slot_ptr,
    HEAD_DIM: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    BLOCK_D: tl.constexpr,
):
    row = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + row).to(tl.int64)
    if slot >= 0:
        d = tl.arange(0, BLOCK_D)
        mask = d < HEAD_DIM
        values = tl.load(kv_ptr + row * kv_stride + d, mask=mask)
        dest = (
            cache_ptr + (slot // BLOCK_SIZE) * cache_stride0 + (slot % BLOCK_SIZE) * cache_stride1
        )
        tl.store(dest + d, values.to(cache_ptr.dtype.element_ty), mask=mask)


def mla_cache_write_triton(
    kv: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """In-place write; ``kv [T, D]``, ``kv_cache [num_blocks, b, D]``, ``slot_mapping [T]``
    int32/int64. Raises ``ValueError`` on mismatched shapes."""
    if kv.dim() != 2 or kv_cache.dim() != 3 or kv.shape[1] != kv_cache.shape[2]:
        raise ValueError(
            f"kv {tuple(kv.shape)} and kv_cache {tuple(kv_cache.shape)} are "
            "invalid: expected [T, D] rows and a [num_blocks, b, D] cache"
        )
    if tuple(slot_mapping.shape) != (kv.shape[0],):
        raise ValueError(
            f"slot_mapping has shape {tuple(slot_mapping.shape)}: expected "
            f"({kv.shape[0]},), one slot per row"
        )
    if kv.shape[0] == 0:
        return
    kv = kv if kv.stride(1) == 1 else kv.contiguous()
    if kv_cache.stride(2) != 1:
        raise ValueError("kv_cache has a non-contiguous last dim: expected stride 1")
    _mla_cache_write_kernel[(kv.shape[0],)](
        kv,
        kv.stride(0),
        kv_cache,
        kv_cache.stride(0),
        kv_cache.stride(1),
        slot_mapping,
        HEAD_DIM=kv.shape[1],
        BLOCK_SIZE=kv_cache.shape[1],
        BLOCK_D=triton.next_power_of_2(kv.shape[1]),
    )
