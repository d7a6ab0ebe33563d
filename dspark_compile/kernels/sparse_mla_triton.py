"""Triton kernels for sparse-MLA index generation and sparse MLA attention.

Semantics are those of the torch references in ``sparse_mla`` (tested
against them). No host synchronisation: an index row that does not fit
``width`` raises a flag that an asynchronous device assert checks (on CPU,
under ``TRITON_INTERPRET=1``, the check is immediate).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from dspark_compile.arithmetic.index_width import WIDTH_RULE
from dspark_compile.kernels.online_softmax_triton import online_softmax_step
from dspark_compile.kernels.sparse_mla import check_index_args, check_sparse_mla_args

INDEX_BLOCK = 128


@triton.jit
def _swa_indices_kernel(
    seq_lens_ptr,
    qsl_ptr,
    block_table_ptr,
    bt_stride,
    slot_mapping_ptr,
    out_ptr,
    out_stride,
    overflow_ptr,
    num_reqs,
    max_blocks,
    block_size,
    window_size,
    width,
    sink_end,
    NONCAUSAL: tl.constexpr,
    HAS_SINKS: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK: tl.constexpr,
):
    token = tl.program_id(0)
    reqs = tl.arange(0, BLOCK_R)
    ends = tl.load(qsl_ptr + 1 + reqs, mask=reqs < num_reqs, other=2147483647)
    req = tl.sum((ends <= token).to(tl.int32), axis=0)
    valid = req < num_reqs
    req = tl.minimum(req, tl.maximum(num_reqs - 1, 0))
    q_begin = tl.load(qsl_ptr + req).to(tl.int64)
    q_end = tl.load(qsl_ptr + req + 1).to(tl.int64)
    seq = tl.load(seq_lens_ptr + req).to(tl.int64)
    slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
    valid = valid & (slot >= 0)
    ctx = seq - (q_end - q_begin)
    if NONCAUSAL:
        lo = tl.maximum(ctx - window_size, 0)
        hi = seq
    else:
        q_pos = ctx + (token - q_begin)
        lo = tl.maximum(q_pos - window_size + 1, 0)
        hi = q_pos + 1
    valid = valid & (hi > lo)
    span = hi - lo
    if HAS_SINKS:  # columns [0, num_sinks) hold positions 0.. (the first S_b tokens)
        num_sinks = tl.minimum(lo, sink_end)
        span += num_sinks
    if valid & (span > width):
        tl.store(overflow_ptr, 1)
    cols = tl.arange(0, BLOCK)
    for start in range(0, width, BLOCK):
        col = start + cols
        if HAS_SINKS:
            kv_pos = tl.where(col < num_sinks, col, lo + col - num_sinks)
        else:
            kv_pos = lo + col
        block_col = kv_pos // block_size
        visible = valid & (kv_pos < hi) & (block_col < max_blocks)
        block = tl.load(
            block_table_ptr + req.to(tl.int64) * bt_stride + block_col, mask=visible, other=0
        ).to(tl.int64)
        slots = tl.where(visible, block * block_size + (kv_pos - block_col * block_size), -1)
        tl.store(
            out_ptr + token.to(tl.int64) * out_stride + col, slots.to(tl.int32), mask=col < width
        )


def launch_index_kernel(
    seq_lens,
    query_start_loc,
    block_table,
    slot_mapping,
    block_size,
    window_size,
    width,
    noncausal,
    sink_size=0,
):
    """Run the index kernel; returns ``(indices [T, width] int32, overflow [1] int32)``.

    ``overflow`` is 1 when some valid token's range (sinks included) is longer
    than ``width`` (its row is then incomplete); nothing is checked here.
    ``sink_size=0`` compiles the kernel without the sink code.
    """
    check_index_args(
        seq_lens,
        query_start_loc,
        block_table,
        slot_mapping,
        block_size,
        window_size,
        width,
        sink_size,
    )
    num_tokens, num_reqs = slot_mapping.shape[0], seq_lens.shape[0]
    device = slot_mapping.device
    out = torch.empty((num_tokens, width), dtype=torch.int32, device=device)
    overflow = torch.zeros(1, dtype=torch.int32, device=device)
    if num_tokens == 0:
        return out, overflow
    if num_reqs == 0 or block_table.shape[1] == 0:
        return out.fill_(-1), overflow
    table = block_table if block_table.stride(1) == 1 else block_table.contiguous()
    _swa_indices_kernel[(num_tokens,)](
        seq_lens,
        query_start_loc,
        table,
        table.stride(0),
        slot_mapping,
        out,
        out.stride(0),
        overflow,
        num_reqs,
        table.shape[1],
        block_size,
        window_size,
        width,
        -(-sink_size // block_size) * block_size,
        NONCAUSAL=noncausal,
        HAS_SINKS=sink_size > 0,
        BLOCK_R=triton.next_power_of_2(max(num_reqs, 1)),
        BLOCK=INDEX_BLOCK,
    )
    return out, overflow


def _indices(
    seq_lens,
    query_start_loc,
    block_table,
    slot_mapping,
    block_size,
    window_size,
    width,
    noncausal,
    sink_size=0,
):
    out, overflow = launch_index_kernel(
        seq_lens,
        query_start_loc,
        block_table,
        slot_mapping,
        block_size,
        window_size,
        width,
        noncausal,
        sink_size,
    )
    form = "non-causal block" if noncausal else "causal window"
    message = (
        f"a token's {form} (with its attention sinks) is longer than width={width}: "
        f"widen the index ({WIDTH_RULE})"
    )
    if overflow.device.type == "cpu":
        if int(overflow) != 0:
            raise ValueError(message)
    else:
        torch._assert_async(overflow == 0, message)
    return out


def swa_indices_triton(
    seq_lens,
    query_start_loc,
    block_table,
    slot_mapping,
    block_size,
    window_size,
    width,
    sink_size=0,
):
    """Triton ``dspark.swa_indices`` (causal); see ``sparse_mla.swa_indices_ref``."""
    return _indices(
        seq_lens,
        query_start_loc,
        block_table,
        slot_mapping,
        block_size,
        window_size,
        width,
        noncausal=False,
        sink_size=sink_size,
    )


def noncausal_swa_indices_triton(
    seq_lens,
    query_start_loc,
    block_table,
    slot_mapping,
    block_size,
    window_size,
    width,
    sink_size=0,
):
    """Triton ``dspark.noncausal_swa_indices``; see ``sparse_mla.noncausal_swa_indices_ref``."""
    return _indices(
        seq_lens,
        query_start_loc,
        block_table,
        slot_mapping,
        block_size,
        window_size,
        width,
        noncausal=True,
        sink_size=sink_size,
    )


@triton.jit
def _sparse_mla_kernel(
    q_ptr,
    q_stride_t,
    q_stride_h,
    kv_ptr,
    kv_stride,
    idx_ptr,
    idx_stride,
    out_ptr,
    out_stride_t,
    out_stride_h,
    mixed_ptr,
    num_heads,
    width,
    scale,
    GROUP: tl.constexpr,
    ONLY_MIXED: tl.constexpr,
    LORA: tl.constexpr,
    ROPE: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    PRECISION: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    head_mask = heads < num_heads
    if ONLY_MIXED:  # after the grouped kernel: only tokens of groups it marked mixed
        active = tl.load(mixed_ptr + token // GROUP) != 0
        head_mask = head_mask & active
        width = tl.where(active, width, 0)
    lat = tl.arange(0, BLOCK_L)
    lat_mask = lat < LORA
    rope = tl.arange(0, BLOCK_P)
    rope_mask = rope < ROPE
    q_rows = q_ptr + token * q_stride_t + heads[:, None] * q_stride_h
    q_lat = tl.load(q_rows + lat[None, :], mask=head_mask[:, None] & lat_mask[None, :], other=0.0)
    q_rope = tl.load(
        q_rows + LORA + rope[None, :], mask=head_mask[:, None] & rope_mask[None, :], other=0.0
    )
    m_i = tl.full([BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_L], dtype=tl.float32)
    cols = tl.arange(0, BLOCK_N)
    for start in range(0, width, BLOCK_N):
        col = start + cols
        slot = tl.load(idx_ptr + token * idx_stride + col, mask=col < width, other=-1)
        live = slot >= 0
        if tl.sum(live.to(tl.int32), axis=0) > 0:
            rows = kv_ptr + tl.where(live, slot, 0).to(tl.int64)[:, None] * kv_stride
            kv_lat = tl.load(rows + lat[None, :], mask=live[:, None] & lat_mask[None, :], other=0.0)
            kv_rope = tl.load(
                rows + LORA + rope[None, :], mask=live[:, None] & rope_mask[None, :], other=0.0
            )
            scores = tl.dot(q_lat, tl.trans(kv_lat), input_precision=PRECISION)
            scores += tl.dot(q_rope, tl.trans(kv_rope), input_precision=PRECISION)
            scores = tl.where(live[None, :], scores * scale, float("-inf"))
            m_i, l_i, acc = online_softmax_step(m_i, l_i, acc, scores, kv_lat, PRECISION)
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    out_rows = out_ptr + token * out_stride_t + heads[:, None] * out_stride_h
    tl.store(
        out_rows + lat[None, :],
        out.to(out_ptr.dtype.element_ty),
        mask=head_mask[:, None] & lat_mask[None, :],
    )


def launch_per_token(
    query: torch.Tensor,
    kv: torch.Tensor,
    indices: torch.Tensor,
    out: torch.Tensor,
    scale: float,
    kv_lora_rank: int,
    mixed: torch.Tensor | None = None,
    group: int = 1,
) -> None:
    """Per-token kernel into ``out [T, H, L]``; ``kv [slots, L+P]`` and ``indices`` with a
    contiguous last dim. With ``mixed [cdiv(T, group)]`` only tokens whose group is
    marked non-zero are computed (the rest of ``out`` is left as it is)."""
    num_tokens, num_heads, head_dim = query.shape
    rope_dim = head_dim - kv_lora_rank
    block_h = max(16, min(64, triton.next_power_of_2(num_heads)))
    precision = "ieee" if query.dtype == torch.float32 else "tf32"
    _sparse_mla_kernel[(num_tokens, triton.cdiv(num_heads, block_h))](
        query,
        query.stride(0),
        query.stride(1),
        kv,
        kv.stride(0),
        indices,
        indices.stride(0),
        out,
        out.stride(0),
        out.stride(1),
        out if mixed is None else mixed,
        num_heads,
        indices.shape[1],
        float(scale),
        GROUP=group,
        ONLY_MIXED=mixed is not None,
        LORA=kv_lora_rank,
        ROPE=rope_dim,
        BLOCK_H=block_h,
        BLOCK_L=max(16, triton.next_power_of_2(kv_lora_rank)),
        BLOCK_P=max(16, triton.next_power_of_2(max(rope_dim, 1))),
        BLOCK_N=32,
        PRECISION=precision,
    )


def sparse_mla_attention_triton(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    scale: float,
    kv_lora_rank: int,
) -> torch.Tensor:
    """Per-token sparse MLA attention; see ``sparse_mla.sparse_mla_attention_ref``.

    The registered CUDA kernel (``sparse_mla_grouped_triton``) uses it for groups of
    tokens whose index rows differ; alone it is the baseline the benchmarks compare
    with (it reloads a shared index row's KV once per query token). One program per
    (token, block of heads); online softmax over blocks of ``BLOCK_N`` indices,
    skipping blocks that are all ``-1``.
    """
    check_sparse_mla_args(query, kv_cache, indices, kv_lora_rank)
    num_tokens, num_heads, head_dim = query.shape
    out = torch.empty((num_tokens, num_heads, kv_lora_rank), dtype=query.dtype, device=query.device)
    if num_tokens == 0 or num_heads == 0:
        return out
    query = query if query.stride(-1) == 1 else query.contiguous()
    kv = kv_cache.reshape(-1, head_dim)
    kv = kv if kv.stride(-1) == 1 else kv.contiguous()
    indices = indices if indices.stride(-1) == 1 else indices.contiguous()
    launch_per_token(query, kv, indices, out, scale, kv_lora_rank)
    return out
