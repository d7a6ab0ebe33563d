"""Grouped sparse MLA attention: each KV row loaded once for the query tokens sharing it.

Semantics: ``sparse_mla.sparse_mla_attention_ref`` (tested against it).

A program owns ``GROUP`` consecutive query tokens x ``BLOCK_H`` heads, i.e. a
``[GROUP * BLOCK_H, L+P]`` query tile. It first compares the group's index rows
(index bytes only):

- rows all equal (every token of a DSpark non-causal block has the same row):
  it walks the columns in tiles of ``BLOCK_N`` slots, each KV tile loaded once
  and multiplied with the whole query tile on tensor cores (``tl.dot``), so KV
  traffic is once per group instead of once per token. Columns can be split
  over ``num_splits`` programs (flash-decoding: partial outputs and
  log-sum-exps, merged by a second kernel).
- rows different (causal rows, shifted by one column per token, or a group
  that straddles two requests): the program marks the group mixed and does
  nothing; a third launch, the per-token kernel of ``sparse_mla_triton``,
  computes those tokens (one program per token, KV loaded per token: the cost
  of the per-token kernel plus one flag read per program for shared groups).

No host synchronisation; any number of tokens, heads, ``width`` and ``-1``
holes. Math in float32, output in the query's dtype.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

from dspark_compile.kernels.launch_fit import launch_until_it_fits
from dspark_compile.kernels.online_softmax_triton import online_softmax_step
from dspark_compile.kernels.sparse_mla import check_sparse_mla_args
from dspark_compile.kernels.sparse_mla_triton import launch_per_token


@dataclasses.dataclass(frozen=True)
class GroupedMLAConfig:
    """Launch shape: ``group`` tokens x ``block_h`` heads per program, ``block_n``
    slots per tile, ``num_splits`` programs along the index columns (``None``:
    enough to fill one wave of SMs). ``scan_block``: index columns per step of the
    pre-scan (a power of two; fewer, wider steps wait on fewer loads).

    The defaults are the fastest 16-bit shape measured on the H200
    (``benchmarks/results/2026-11-30/2026-11-30-h200-dspark-kernels.md``; ``scan_block``:
    ``benchmarks/results/2026-11-30/2026-11-30-h200-mla-scan-markov.md``); they need ~221 KB
    of shared memory, and a launch that does not fit retries with smaller shapes.
    """

    group: int = 4
    block_h: int = 16
    block_n: int = 64
    num_splits: int | None = None
    num_warps: int = 8
    num_stages: int = 2
    scan_block: int = 2048

    def __post_init__(self) -> None:
        for name in ("group", "block_h", "block_n", "num_warps", "scan_block"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1 or value & (value - 1):
                raise ValueError(f"{name}={value!r} is invalid: expected a power of two")
        if self.num_stages < 1 or (self.num_splits is not None and self.num_splits < 1):
            raise ValueError(
                f"num_stages={self.num_stages!r} / num_splits={self.num_splits!r} "
                "are invalid: expected >= 1 (num_splits None: automatic)"
            )


@triton.jit
def _tile_scores(
    q_lat,
    q_rope,
    kv_ptr,
    kv_stride,
    slot,
    live,
    lat,
    lat_mask,
    rope,
    rope_mask,
    LORA: tl.constexpr,
    PRECISION: tl.constexpr,
):
    rows = kv_ptr + tl.where(live, slot, 0).to(tl.int64)[:, None] * kv_stride
    kv_lat = tl.load(rows + lat[None, :], mask=live[:, None] & lat_mask[None, :], other=0.0)
    kv_rope = tl.load(
        rows + LORA + rope[None, :], mask=live[:, None] & rope_mask[None, :], other=0.0
    )
    scores = tl.dot(q_lat, tl.trans(kv_lat), input_precision=PRECISION)
    scores += tl.dot(q_rope, tl.trans(kv_rope), input_precision=PRECISION)
    return scores, kv_lat


@triton.jit
def _grouped_sparse_mla_kernel(
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
    part_o_ptr,
    part_lse_ptr,
    mixed_ptr,
    num_tokens,
    num_heads,
    width,
    cols_per_split,
    scale,
    LORA: tl.constexpr,
    ROPE: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_L: tl.constexpr,
    BLOCK_P: tl.constexpr,
    BLOCK_N: tl.constexpr,
    SPLIT: tl.constexpr,
    PRECISION: tl.constexpr,
    SCAN: tl.constexpr,
):
    pid_g = tl.program_id(0)
    pid_h = tl.program_id(1)
    pid_s = tl.program_id(2)
    t0 = pid_g * GROUP
    rows = tl.arange(0, GROUP * BLOCK_H)
    row_tok = rows // BLOCK_H
    token = (t0 + row_tok).to(tl.int64)
    head = pid_h * BLOCK_H + rows % BLOCK_H
    lat = tl.arange(0, BLOCK_L)
    lat_mask = lat < LORA
    rope = tl.arange(0, BLOCK_P)
    rope_mask = rope < ROPE
    group_tok = t0 + tl.arange(0, GROUP)
    group_valid = group_tok < num_tokens
    cols = tl.arange(0, BLOCK_N)
    scan_cols = tl.arange(0, SCAN)
    idx_row = idx_ptr + t0.to(tl.int64) * idx_stride
    # Pre-scan of the whole rows (index bytes only, SCAN columns per step): does every
    # token of the group list the same slots? Mixed groups go to the per-token kernel.
    differ = 0
    for start in range(0, width, SCAN):
        col = start + scan_cols
        lead = tl.load(idx_row + col, mask=col < width, other=-1)
        tile = tl.load(
            idx_ptr + group_tok.to(tl.int64)[:, None] * idx_stride + col[None, :],
            mask=group_valid[:, None] & (col < width)[None, :],
            other=-1,
        )
        differ += tl.sum(((tile != lead[None, :]) & group_valid[:, None]).to(tl.int32))
    shared = differ == 0
    if (pid_h == 0) & (pid_s == 0):
        tl.store(mixed_ptr + pid_g, (differ != 0).to(tl.int32))
    # A mixed group's program reads no query, loops over no column, writes nothing.
    row_mask = (token < num_tokens) & (head < num_heads) & shared
    q_rows = q_ptr + token[:, None] * q_stride_t + head[:, None] * q_stride_h
    q_lat = tl.load(q_rows + lat[None, :], mask=row_mask[:, None] & lat_mask[None, :], other=0.0)
    q_rope = tl.load(
        q_rows + LORA + rope[None, :], mask=row_mask[:, None] & rope_mask[None, :], other=0.0
    )
    m_i = tl.full([GROUP * BLOCK_H], float("-inf"), dtype=tl.float32)
    l_i = tl.zeros([GROUP * BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([GROUP * BLOCK_H, BLOCK_L], dtype=tl.float32)
    col_lo = pid_s * cols_per_split
    col_hi = tl.where(shared, tl.minimum(width, col_lo + cols_per_split), col_lo)
    # Shared rows: one KV tile load serves the whole [GROUP * BLOCK_H] query tile.
    for start in range(col_lo, col_hi, BLOCK_N):
        col = start + cols
        lead = tl.load(idx_row + col, mask=col < col_hi, other=-1)
        live = lead >= 0
        scores, kv_lat = _tile_scores(
            q_lat,
            q_rope,
            kv_ptr,
            kv_stride,
            lead,
            live,
            lat,
            lat_mask,
            rope,
            rope_mask,
            LORA,
            PRECISION,
        )
        scores = tl.where(live[None, :], scores * scale, float("-inf"))
        m_i, l_i, acc = online_softmax_step(m_i, l_i, acc, scores, kv_lat, PRECISION)
    safe_l = tl.where(l_i > 0, l_i, 1.0)
    out = acc / safe_l[:, None]
    if SPLIT:
        lse = tl.where(l_i > 0, m_i + tl.log(safe_l), float("-inf"))
        part_row = (pid_s * num_tokens + token) * num_heads + head
        tl.store(part_lse_ptr + part_row, lse, mask=row_mask)
        tl.store(
            part_o_ptr + part_row[:, None] * LORA + lat[None, :],
            out,
            mask=row_mask[:, None] & lat_mask[None, :],
        )
    else:
        out_rows = out_ptr + token[:, None] * out_stride_t + head[:, None] * out_stride_h
        tl.store(
            out_rows + lat[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_mask[:, None] & lat_mask[None, :],
        )


@triton.jit
def _merge_splits_kernel(
    part_o_ptr,
    part_lse_ptr,
    mixed_ptr,
    out_ptr,
    out_stride_t,
    out_stride_h,
    num_tokens,
    num_heads,
    num_splits,
    LORA: tl.constexpr,
    BLOCK_L: tl.constexpr,
    GROUP: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    lat = tl.arange(0, BLOCK_L)
    lat_mask = (lat < LORA) & (tl.load(mixed_ptr + token // GROUP) == 0)
    m = tl.full([], float("-inf"), dtype=tl.float32)
    for s in range(num_splits):
        m = tl.maximum(m, tl.load(part_lse_ptr + (s * num_tokens + token) * num_heads + head))
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    total = tl.zeros([], dtype=tl.float32)
    acc = tl.zeros([BLOCK_L], dtype=tl.float32)
    for s in range(num_splits):
        row = (s * num_tokens + token) * num_heads + head
        weight = tl.exp(tl.load(part_lse_ptr + row) - m_safe)
        total += weight
        acc += weight * tl.load(part_o_ptr + row * LORA + lat, mask=lat_mask, other=0.0)
    out = acc / tl.where(total > 0, total, 1.0)
    tl.store(
        out_ptr + token * out_stride_t + head * out_stride_h + lat,
        out.to(out_ptr.dtype.element_ty),
        mask=lat_mask,
    )


def default_config(dtype: torch.dtype) -> GroupedMLAConfig:
    """Launch shape by element size: 16-bit inputs use ``GroupedMLAConfig()``; float32
    (twice the shared memory per tile) a smaller tile."""
    if dtype == torch.float32:
        return GroupedMLAConfig(group=2, block_n=16, num_warps=4, num_stages=2)
    return GroupedMLAConfig()


def _smaller(cfg: GroupedMLAConfig) -> GroupedMLAConfig | None:
    """The next smaller launch shape after an out-of-resources launch (None: none left)."""
    if cfg.num_stages > 1:
        return dataclasses.replace(cfg, num_stages=cfg.num_stages - 1)
    if cfg.block_n > 16:
        return dataclasses.replace(cfg, block_n=cfg.block_n // 2, num_stages=2)
    if cfg.group * cfg.block_h > 16:
        if cfg.group > 1:
            return dataclasses.replace(cfg, group=cfg.group // 2, num_stages=2)
        return dataclasses.replace(cfg, block_h=cfg.block_h // 2, num_stages=2)
    return None


def _default_splits(programs: int, width: int, block_n: int, device: torch.device) -> int:
    """Splits so that the programs fill one wave of SMs (CPU: 1). One program per SM
    fits (shared memory), and every split adds partial-output traffic, so no more."""
    if device.type != "cuda":
        return 1
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    tiles = triton.cdiv(width, block_n)
    return max(1, min(tiles, sms // max(programs, 1), 8))


def grouped_sparse_mla_attention_triton(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    scale: float,
    kv_lora_rank: int,
    config: GroupedMLAConfig | None = None,
) -> torch.Tensor:
    """Triton ``dspark.sparse_mla_attention`` (module docstring); returns ``[T, H, L]``."""
    check_sparse_mla_args(query, kv_cache, indices, kv_lora_rank)
    out, _ = launch_until_it_fits(
        lambda cfg: _launch(query, kv_cache, indices, scale, kv_lora_rank, cfg),
        config or default_config(query.dtype),
        _smaller,
        "sparse MLA",
    )
    return out


def _launch(query, kv_cache, indices, scale, kv_lora_rank, cfg):
    num_tokens, num_heads, head_dim = query.shape
    out = torch.empty((num_tokens, num_heads, kv_lora_rank), dtype=query.dtype, device=query.device)
    if num_tokens == 0 or num_heads == 0:
        return out
    width = indices.shape[1]
    query = query if query.stride(-1) == 1 else query.contiguous()
    kv = kv_cache.reshape(-1, head_dim)
    kv = kv if kv.stride(-1) == 1 else kv.contiguous()
    indices = indices if indices.stride(-1) == 1 else indices.contiguous()
    rope_dim = head_dim - kv_lora_rank
    block_h = min(cfg.block_h, triton.next_power_of_2(num_heads))
    group = max(cfg.group, 16 // block_h)  # tl.dot needs >= 16 query rows
    groups, head_blocks = triton.cdiv(num_tokens, group), triton.cdiv(num_heads, block_h)
    splits = cfg.num_splits or _default_splits(
        groups * head_blocks, width, cfg.block_n, query.device
    )
    splits = max(1, min(splits, triton.cdiv(width, cfg.block_n)))
    cols_per_split = triton.cdiv(triton.cdiv(width, splits), cfg.block_n) * cfg.block_n
    splits = triton.cdiv(width, cols_per_split)
    if splits > 1:
        part_o = torch.empty(
            (splits, num_tokens, num_heads, kv_lora_rank), dtype=torch.float32, device=query.device
        )
        part_lse = torch.empty(
            (splits, num_tokens, num_heads), dtype=torch.float32, device=query.device
        )
    else:
        part_o = part_lse = out
    block_l = max(16, triton.next_power_of_2(kv_lora_rank))
    mixed = torch.empty(groups, dtype=torch.int32, device=query.device)
    _grouped_sparse_mla_kernel[(groups, head_blocks, splits)](
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
        part_o,
        part_lse,
        mixed,
        num_tokens,
        num_heads,
        width,
        cols_per_split,
        float(scale),
        LORA=kv_lora_rank,
        ROPE=rope_dim,
        GROUP=group,
        BLOCK_H=block_h,
        BLOCK_L=block_l,
        BLOCK_P=max(16, triton.next_power_of_2(max(rope_dim, 1))),
        BLOCK_N=cfg.block_n,
        SPLIT=splits > 1,
        PRECISION="ieee" if query.dtype == torch.float32 else "tf32",
        SCAN=cfg.scan_block,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if splits > 1:
        _merge_splits_kernel[(num_tokens, num_heads)](
            part_o,
            part_lse,
            mixed,
            out,
            out.stride(0),
            out.stride(1),
            num_tokens,
            num_heads,
            splits,
            LORA=kv_lora_rank,
            BLOCK_L=block_l,
            GROUP=group,
            num_warps=4,
        )
    # Tokens of mixed groups (causal rows, groups straddling requests): per token.
    launch_per_token(query, kv, indices, out, scale, kv_lora_rank, mixed=mixed, group=group)
    return out
