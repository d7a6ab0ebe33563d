"""Triton KV write for ``dspark.reshape_and_cache`` (reference: ``reshape_and_cache_ref``).

Row t of ``key/value [T, Hkv, D]`` goes to absolute slot ``slot_mapping[t]``
(``block = slot // b``, ``offset = slot % b``) of ``key_cache/value_cache
[num_blocks, b, Hkv, D]``; a negative slot skips its row. The reference
selects rows with a boolean mask (a host synchronisation); this kernel
launches ``T`` programs and skips on device, so a draft step that writes KV
stays free of host syncs and CUDA-graph capturable.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _reshape_and_cache_kernel(
    key_ptr,
    key_stride0,
    key_stride1,
    value_ptr,
    value_stride0,
    value_stride1,
    kc_ptr,
    kc_stride0,
    kc_stride1,
    kc_stride2,
    vc_ptr,
    vc_stride0,
    vc_stride1,
    vc_stride2,
    slot_ptr,
    NUM_KV_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    slot = tl.load(slot_ptr + token).to(tl.int64)
    if slot < 0:
        return
    block = slot // BLOCK_SIZE
    offset = slot % BLOCK_SIZE
    h = tl.arange(0, BLOCK_H)[:, None]
    d = tl.arange(0, BLOCK_D)[None, :]
    mask = (h < NUM_KV_HEADS) & (d < HEAD_DIM)
    k = tl.load(key_ptr + token * key_stride0 + h * key_stride1 + d, mask=mask)
    v = tl.load(value_ptr + token * value_stride0 + h * value_stride1 + d, mask=mask)
    tl.store(
        kc_ptr + block * kc_stride0 + offset * kc_stride1 + h * kc_stride2 + d,
        k.to(kc_ptr.dtype.element_ty),
        mask=mask,
    )
    tl.store(
        vc_ptr + block * vc_stride0 + offset * vc_stride1 + h * vc_stride2 + d,
        v.to(vc_ptr.dtype.element_ty),
        mask=mask,
    )


def supports(
    key: torch.Tensor, value: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor
) -> bool:
    """Last dims contiguous and matching shapes; otherwise use the reference."""
    return (
        key.dim() == 3
        and key.shape == value.shape
        and key_cache.dim() == 4
        and key_cache.shape == value_cache.shape
        and tuple(key.shape[1:]) == tuple(key_cache.shape[2:])
        and key.stride(2) == value.stride(2) == 1
        and key_cache.stride(3) == value_cache.stride(3) == 1
    )


def reshape_and_cache_triton(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """In-place KV write at absolute slots; ``slot_mapping [T]`` int32/int64."""
    if not supports(key, value, key_cache, value_cache):
        raise ValueError(
            f"key {tuple(key.shape)}, value {tuple(value.shape)} and caches "
            f"{tuple(key_cache.shape)} are invalid: expected [T, Hkv, D] rows and "
            "[num_blocks, b, Hkv, D] caches with a contiguous last dim"
        )
    if slot_mapping.shape != (key.shape[0],):
        raise ValueError(
            f"slot_mapping has shape {tuple(slot_mapping.shape)}, expected "
            f"({key.shape[0]},): one slot per row"
        )
    if key.shape[0] == 0:
        return
    _reshape_and_cache_kernel[(key.shape[0],)](
        key,
        key.stride(0),
        key.stride(1),
        value,
        value.stride(0),
        value.stride(1),
        key_cache,
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache,
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        slot_mapping,
        NUM_KV_HEADS=key.shape[1],
        HEAD_DIM=key.shape[2],
        BLOCK_H=triton.next_power_of_2(key.shape[1]),
        BLOCK_D=triton.next_power_of_2(key.shape[2]),
        BLOCK_SIZE=key_cache.shape[1],
    )
