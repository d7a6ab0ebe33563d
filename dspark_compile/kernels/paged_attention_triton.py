"""Triton paged attention for ``dspark.paged_attention`` (split-KV flash decoding).

Same semantics as ``paged_attention_ref`` (the definition of correct): query
``[T, Hq, D]``, caches ``[num_blocks, b, Hkv, D]``, ``block_table [R, width]``,
``seq_lens [R]``, ``query_start_loc [R+1]`` (``query_start_loc[0] == 0``,
``query_start_loc[R] == T``). Request i's queries sit at positions
``seq_lens[i] - q_len .. seq_lens[i] - 1``; causal queries see tokens ``<=``
their position, non-causal ones all ``seq_lens[i]`` tokens; a query that sees
nothing outputs zeros. With ``window_size`` W (and ``future_offset`` K,
``kv_offset`` = absolute position of table token 0), a query at absolute
position p also hides keys before ``lo(p) = floor(max(p + 1 + K - W, 0) / b) * b``
(causal: its own p; non-causal: the request's last position). With
``sink_size`` S, keys at absolute positions ``< S_b = ceil(S / b) * b`` stay
visible too (attention sinks); a windowed table then starts with the kept
sink blocks (``arithmetic.window.table_token_positions``).

Layout of the work:
- one program per (query tile, KV head, KV split). A query tile is up to
  ``BLOCK_Q`` queries of one request times the ``Hq/Hkv`` query heads of one
  KV head (GQA packed into the M dimension, so each KV tile is read once per
  query tile, not once per query head). Tiles are found in-kernel by binary
  search over ``query_start_loc``: the grid is ``T // BLOCK_Q + R`` tiles, an
  upper bound computed from shapes only.
- each query tile's KV span ``[kv_begin, kv_end)`` is cut into ``num_splits``
  runs of whole ``BLOCK_N`` tiles (flash decoding). The NUMBER of splits comes
  from shapes only, never a host read of ``seq_lens``: the fewest whose programs
  fill whole waves of the programs the GPU holds at once for the table's width
  (``choose_launch``, ``kernels/paged_attention_launch.py``); their LENGTH is
  computed in the kernel from the tile's own span, so a table wider than the
  context (a CUDA graph captured for the longest context) still spreads the
  work over every split. Decode (one query per tile) has exactly ``T`` tiles,
  with the KV head as the fastest grid axis. After windowing the width is
  ``max_window_blocks``, so a 128k context with W=2048 launches work for ~2k
  tokens. With a window, a tile's span starts at the block of its first query's
  ``lo``; on the full table (no ``kv_offset``) the window then costs no extra
  launch. With sinks, split 0 also reads the table tokens
  ``[0, min(S_b, that lo))`` (a separate loop, compiled only when S > 0):
  never a token twice.
- fp32 online softmax (exp2) and fp32 accumulation; a second small kernel
  combines the splits by their log-sum-exp.
No host synchronisation anywhere: CUDA-graph capturable.
"""

from __future__ import annotations

import logging
import os
from typing import Optional

import torch
import triton
import triton.language as tl

from dspark_compile.arithmetic.window import sink_tokens
from dspark_compile.kernels.paged_attention import check_window_args
from dspark_compile.kernels.paged_attention_launch import (
    LAUNCH_KNOBS,
    LaunchConfig,
    choose_launch,
    launch_fitted,
)
from dspark_compile.validation import warn_once

logger = logging.getLogger(__name__)

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32)
_LOG2E = 1.4426950408889634


@triton.jit
def _find_request(qsl_ptr, tile, num_reqs, BLOCK_Q: tl.constexpr, EXACT_TILES: tl.constexpr):
    """Request whose tiles contain ``tile``: tiles of request i start at
    ``query_start_loc[i] // BLOCK_Q + i`` (strictly increasing in i), or, with
    ``EXACT_TILES`` (only when ``BLOCK_Q == 1``: one tile per query token), at
    ``query_start_loc[i]`` (the last request starting at or before ``tile`` is
    the one holding it; empty requests are skipped)."""
    lo = 0
    hi = num_reqs
    while lo < hi:
        mid = (lo + hi) // 2
        if EXACT_TILES:
            first_tile = tl.load(qsl_ptr + mid)
        else:
            first_tile = tl.load(qsl_ptr + mid) // BLOCK_Q + mid
        if first_tile <= tile:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _attend_range(
    q,
    q_pos,
    lo,
    m_i,
    l_i,
    acc,
    n_begin,
    n_end,
    table_row,
    table_stride1,
    k_head,
    k_stride0,
    k_stride1,
    v_head,
    v_stride0,
    v_stride1,
    d,
    d_valid,
    scale_log2,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOWED: tl.constexpr,
    SINK_TOKENS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    """Online-softmax update of (m_i, l_i, acc) with the table tokens
    ``[n_begin, n_end)``: a query row sees token t if t <= its table position
    (causal), and t >= its ``lo`` or t < ``SINK_TOKENS`` (windowed)."""
    for n0 in range(n_begin, n_end, BLOCK_N):
        kv = n0 + tl.arange(0, BLOCK_N)
        kv_valid = kv < n_end
        blocks = tl.load(table_row + (kv // BLOCK_SIZE) * table_stride1, mask=kv_valid, other=0).to(
            tl.int64
        )
        offsets = kv % BLOCK_SIZE
        k = tl.load(
            k_head + blocks[None, :] * k_stride0 + offsets[None, :] * k_stride1 + d[:, None],
            mask=kv_valid[None, :] & d_valid[:, None],
            other=0.0,
        )
        if UPCAST_DOT:
            k = k.to(tl.float32)
        scores = tl.dot(q, k, input_precision=DOT_PRECISION) * scale_log2  # [M, N]
        visible = kv_valid[None, :]
        if CAUSAL:
            visible = visible & (kv[None, :] <= q_pos[:, None])
        if WINDOWED:
            if SINK_TOKENS > 0:
                visible = visible & ((kv[None, :] >= lo[:, None]) | (kv[None, :] < SINK_TOKENS))
            else:
                visible = visible & (kv[None, :] >= lo[:, None])
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(scores, 1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # all masked so far: no NaN
        p = tl.exp2(scores - m_safe[:, None])
        alpha = tl.exp2(m_i - m_safe)
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(
            v_head + blocks[:, None] * v_stride0 + offsets[:, None] * v_stride1 + d[None, :],
            mask=kv_valid[:, None] & d_valid[None, :],
            other=0.0,
        )
        if UPCAST_DOT:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=DOT_PRECISION)
        m_i = m_new
    return m_i, l_i, acc


@triton.jit
def _paged_attention_kernel(
    q_ptr,
    q_stride0,
    q_stride1,
    k_ptr,
    k_stride0,
    k_stride1,
    k_stride2,
    v_ptr,
    v_stride0,
    v_stride1,
    v_stride2,
    table_ptr,
    table_stride0,
    table_stride1,
    seq_lens_ptr,
    qsl_ptr,
    num_reqs,
    out_ptr,
    out_stride0,
    out_stride1,
    part_ptr,
    lse_ptr,
    scale_log2,
    num_splits,
    offset_ptr,
    window_size,
    future_offset,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    GROUP: tl.constexpr,
    BLOCK_Q: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_SIZE: tl.constexpr,
    SPLIT_KV: tl.constexpr,
    CAUSAL: tl.constexpr,
    WINDOWED: tl.constexpr,
    HAS_OFFSET: tl.constexpr,
    SINK_TOKENS: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
    EXACT_TILES: tl.constexpr,
    HEADS_FIRST: tl.constexpr,
):
    if HEADS_FIRST:  # grid (KV head, tile, split): a request's KV heads run side by side
        kv_head = tl.program_id(0)
        tile = tl.program_id(1)
    else:  # grid (tile, KV head, split)
        tile = tl.program_id(0)
        kv_head = tl.program_id(1)
    split = tl.program_id(2)
    if EXACT_TILES:  # decode: token `tile` is usually request `tile`'s only query, so
        # guess that (three independent loads) before a binary search (~6 dependent ones)
        in_range = tile < num_reqs
        q_begin = tl.load(qsl_ptr + tile, mask=in_range, other=-1)
        q_len = tl.load(qsl_ptr + tile + 1, mask=in_range, other=-1) - q_begin
        seq_len = tl.load(seq_lens_ptr + tile, mask=in_range, other=0)
        req = tile
        if (q_begin != tile) | (q_len != 1):
            req = _find_request(qsl_ptr, tile, num_reqs, BLOCK_Q, EXACT_TILES)
            q_begin = tl.load(qsl_ptr + req)
            q_len = tl.load(qsl_ptr + req + 1) - q_begin
            seq_len = tl.load(seq_lens_ptr + req)
        local_tile = tile - q_begin
    else:
        req = _find_request(qsl_ptr, tile, num_reqs, BLOCK_Q, EXACT_TILES)
        q_begin = tl.load(qsl_ptr + req)
        q_len = tl.load(qsl_ptr + req + 1) - q_begin
        seq_len = tl.load(seq_lens_ptr + req)
        local_tile = tile - (q_begin // BLOCK_Q + req)
    if local_tile * BLOCK_Q >= q_len:
        return

    rows = tl.arange(0, BLOCK_M)
    q_idx = local_tile * BLOCK_Q + rows // GROUP  # query index within the request
    head = kv_head * GROUP + rows % GROUP
    row_valid = (rows < BLOCK_Q * GROUP) & (q_idx < q_len)
    token = (q_begin + q_idx).to(tl.int64)
    q_pos = seq_len - q_len + q_idx  # absolute position (may be < 0)
    d = tl.arange(0, BLOCK_D)
    d_valid = d < HEAD_DIM
    q = tl.load(
        q_ptr + token[:, None] * q_stride0 + head[:, None] * q_stride1 + d[None, :],
        mask=row_valid[:, None] & d_valid[None, :],
        other=0.0,
    )
    if UPCAST_DOT:
        q = q.to(tl.float32)

    kv_end = seq_len
    if CAUSAL:  # the tile's last query bounds what any of its rows can see
        last_q = tl.minimum(local_tile * BLOCK_Q + BLOCK_Q, q_len) - 1
        kv_end = seq_len - q_len + last_q + 1
    kv_begin = 0
    lo = q_pos  # unused unless WINDOWED
    if WINDOWED:  # per-query lower bound lo(p), in table coordinates
        # Table token t is at absolute position t + shift (t >= kept), or t (t < kept:
        # the kept sink blocks in front of the window); without sinks kept = 0.
        shift = 0
        if HAS_OFFSET:
            shift = tl.load(offset_ptr + req)
        if CAUSAL:
            anchor = q_pos  # each query's own position
            first_anchor = seq_len - q_len + local_tile * BLOCK_Q
        else:
            anchor = tl.zeros([BLOCK_M], tl.int32) + (seq_len - 1)  # the request's last
            first_anchor = seq_len - 1
        if SINK_TOKENS > 0 and HAS_OFFSET:
            kept = tl.minimum(shift, SINK_TOKENS)
            shift = shift - kept
            # anchors inside the kept sinks sit at their own table position
            anchor = tl.where(anchor < kept, anchor - shift, anchor)
            first_anchor = tl.where(first_anchor < kept, first_anchor - shift, first_anchor)
        lo = (
            tl.maximum(shift + anchor + 1 + future_offset - window_size, 0)
            // BLOCK_SIZE
            * BLOCK_SIZE
            - shift
        )
        # lo never decreases with the position: the tile's first query bounds them all
        kv_begin = tl.maximum(
            tl.maximum(shift + first_anchor + 1 + future_offset - window_size, 0)
            // BLOCK_SIZE
            * BLOCK_SIZE
            - shift,
            0,
        )
    # Splits cut the tile's own span [kv_begin, kv_end) into runs of whole BLOCK_N tiles,
    # sized here from seq_lens: a table wider than the context (a CUDA graph captured for
    # the longest one) still spreads the context over every split. With a window on the
    # full table kv_begin is the window's start, so the window costs no extra launch.
    per_split = tl.cdiv(tl.cdiv(tl.maximum(kv_end - kv_begin, 0), num_splits), BLOCK_N) * BLOCK_N
    split_begin = kv_begin + split * per_split
    split_end = tl.minimum(split_begin + per_split, kv_end)
    sink_begin = 0
    if SINK_TOKENS > 0:  # table tokens [0, S_b) below the window, always visible: split 0
        sink_end = tl.where(split == 0, tl.minimum(SINK_TOKENS, kv_begin), 0)

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    table_row = table_ptr + req.to(tl.int64) * table_stride0
    k_head = k_ptr + kv_head.to(tl.int64) * k_stride2
    v_head = v_ptr + kv_head.to(tl.int64) * v_stride2
    if SINK_TOKENS > 0:  # the sinks below the tile's window: a second, disjoint range
        m_i, l_i, acc = _attend_range(
            q,
            q_pos,
            lo,
            m_i,
            l_i,
            acc,
            sink_begin,
            sink_end,
            table_row,
            table_stride1,
            k_head,
            k_stride0,
            k_stride1,
            v_head,
            v_stride0,
            v_stride1,
            d,
            d_valid,
            scale_log2,
            BLOCK_N,
            BLOCK_SIZE,
            CAUSAL,
            WINDOWED,
            SINK_TOKENS,
            DOT_PRECISION,
            UPCAST_DOT,
        )
    m_i, l_i, acc = _attend_range(
        q,
        q_pos,
        lo,
        m_i,
        l_i,
        acc,
        split_begin,
        split_end,
        table_row,
        table_stride1,
        k_head,
        k_stride0,
        k_stride1,
        v_head,
        v_stride0,
        v_stride1,
        d,
        d_valid,
        scale_log2,
        BLOCK_N,
        BLOCK_SIZE,
        CAUSAL,
        WINDOWED,
        SINK_TOKENS,
        DOT_PRECISION,
        UPCAST_DOT,
    )

    empty = l_i == 0.0
    result = acc / tl.where(empty, 1.0, l_i)[:, None]
    mask = row_valid[:, None] & d_valid[None, :]
    if not SPLIT_KV:
        tl.store(
            out_ptr + token[:, None] * out_stride0 + head[:, None] * out_stride1 + d[None, :],
            result.to(out_ptr.dtype.element_ty),
            mask=mask,
        )
    else:
        slot = (token * NUM_HEADS + head) * num_splits + split
        tl.store(part_ptr + slot[:, None] * HEAD_DIM + d[None, :], result, mask=mask)
        lse = tl.where(empty, float("-inf"), m_i + tl.log2(tl.where(empty, 1.0, l_i)))
        tl.store(lse_ptr + slot, lse, mask=row_valid)


@triton.jit
def _combine_splits_kernel(
    part_ptr,
    lse_ptr,
    out_ptr,
    out_stride0,
    out_stride1,
    num_splits,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    token = tl.program_id(0).to(tl.int64)
    head = tl.program_id(1)
    s = tl.arange(0, BLOCK_S)
    s_valid = s < num_splits
    base = (token * NUM_HEADS + head) * num_splits
    lse = tl.load(lse_ptr + base + s, mask=s_valid, other=float("-inf"))
    m = tl.max(lse, 0)
    m_safe = tl.where(m == float("-inf"), 0.0, m)
    w = tl.exp2(lse - m_safe)  # 0 for empty splits
    total = tl.sum(w, 0)
    d = tl.arange(0, BLOCK_D)
    d_valid = d < HEAD_DIM
    used = s_valid & (w > 0.0)
    parts = tl.load(
        part_ptr + (base + s[:, None]) * HEAD_DIM + d[None, :],
        mask=used[:, None] & d_valid[None, :],
        other=0.0,
    )
    result = tl.sum(parts * w[:, None], 0) / tl.where(total == 0.0, 1.0, total)
    tl.store(
        out_ptr + token * out_stride0 + head * out_stride1 + d,
        result.to(out_ptr.dtype.element_ty),
        mask=d_valid,
    )


def paged_attention_triton(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    causal: bool,
    out: Optional[torch.Tensor] = None,
    num_splits: Optional[int] = None,
    block_n: Optional[int] = None,
    num_warps: Optional[int] = None,
    num_stages: Optional[int] = None,
    kv_offset: Optional[torch.Tensor] = None,
    window_size: Optional[int] = None,
    future_offset: int = 0,
    sink_size: int = 0,
    **launch,
) -> torch.Tensor:
    """``dspark.paged_attention`` semantics (``paged_attention_ref``) in Triton.

    ``kv_offset [R]`` / ``window_size`` / ``future_offset``: the per-token draft
    window (see the reference). The first KV tile a query tile reads is the
    block of its first query's lower bound; splits wholly below it exit at once.
    ``sink_size`` S (needs ``window_size``): table tokens ``< S_b = ceil(S / b) * b``
    stay visible beside the window. With ``kv_offset`` the table starts with
    ``kept = min(S_b, kv_offset[i])`` sink tokens (absolute positions ``0 ..
    kept - 1``) and token ``t >= kept`` is at ``kv_offset[i] + t - kept``; each
    query tile then reads two disjoint ranges, ``[0, min(S_b, first lo))`` and
    its window. S = 0 compiles the kernel without any sink code.
    ``window_size`` without ``kv_offset`` applies the window to the FULL table
    in this one launch (no window-metadata kernel, no gathered table): the
    splits then cut each query tile's window span (``W + b + block_q``
    tokens at most), not the table's width, and the sinks are read by split 0.
    ``out [T, Hq, D]`` (query's dtype) is written in place when given.
    ``num_splits``/``block_n``/``num_warps``/``num_stages`` and the other
    ``LAUNCH_KNOBS`` (keyword only: ``programs_per_sm``, ``min_split_tokens``,
    ``exact_tiles``, ``heads_first``) override the launch heuristics (tests,
    tuning); the result does not depend on them beyond float rounding. A launch
    that needs more shared memory or registers than the GPU has is retried with
    fewer stages, then a smaller KV tile (``smaller_tile``; logged, and remembered
    for that shape in this process).
    """
    unknown = sorted(set(launch) - set(LAUNCH_KNOBS))
    if unknown:
        raise ValueError(f"launch options {unknown} are invalid: expected some of {LAUNCH_KNOBS}")
    _check_inputs(query, key_cache, value_cache, block_table, seq_lens, query_start_loc)
    check_window_args(window_size, future_offset, sink_size)
    if kv_offset is not None and tuple(kv_offset.shape) != tuple(seq_lens.shape):
        raise ValueError(
            f"kv_offset {tuple(kv_offset.shape)} is invalid: expected one offset "
            f"per request, {tuple(seq_lens.shape)}"
        )
    num_tokens, num_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    group = num_heads // num_kv_heads
    if out is None:
        out = torch.empty_like(query, memory_format=torch.contiguous_format)
    elif out.shape != query.shape or out.dtype != query.dtype or out.stride(2) != 1:
        raise ValueError(
            f"out {tuple(out.shape)} {out.dtype} is invalid: expected query's shape "
            f"{tuple(query.shape)} and dtype {query.dtype}, contiguous last dim"
        )
    num_reqs = seq_lens.shape[0]
    if num_tokens == 0 or num_reqs == 0:
        return out
    if block_table.shape[1] == 0:  # no KV anywhere: every query sees nothing
        return out.zero_()
    window_splits = window_size is not None and kv_offset is None

    def launch_for(tile_n, stages):
        return choose_launch(
            num_tokens,
            num_reqs,
            num_kv_heads,
            group,
            block_table.shape[1],
            block_size,
            query.device,
            num_splits,
            tile_n,
            num_warps,
            stages,
            window_tokens=window_size if window_splits else None,
            **launch,
        )

    launch_fitted(
        launch_for,
        lambda c: _launch(
            c,
            query,
            key_cache,
            value_cache,
            block_table,
            seq_lens,
            query_start_loc,
            scale,
            causal,
            out,
            kv_offset,
            window_size,
            future_offset,
            sink_size,
        ),
        block_n,
        num_stages,
        key=(query.device, query.dtype, head_dim),
    )
    return out


def _launch(
    cfg: LaunchConfig,
    query,
    key_cache,
    value_cache,
    block_table,
    seq_lens,
    query_start_loc,
    scale,
    causal,
    out,
    kv_offset,
    window_size,
    future_offset,
    sink_size,
) -> None:
    """Launch the attention kernel (and the split combine) with ``cfg`` into ``out``."""
    num_tokens, num_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    num_reqs = seq_lens.shape[0]
    if cfg.num_splits > 1:
        parts = torch.empty(
            (num_tokens, num_heads, cfg.num_splits, head_dim),
            dtype=torch.float32,
            device=query.device,
        )
        lse = torch.empty(
            (num_tokens, num_heads, cfg.num_splits), dtype=torch.float32, device=query.device
        )
    else:
        parts = lse = out  # unused
    block_d = max(16, triton.next_power_of_2(head_dim))
    precision = "ieee" if query.dtype == torch.float32 else "tf32"
    grid = cfg.grid(num_tokens, num_reqs, num_kv_heads)
    _paged_attention_kernel[grid](
        query,
        query.stride(0),
        query.stride(1),
        key_cache,
        key_cache.stride(0),
        key_cache.stride(1),
        key_cache.stride(2),
        value_cache,
        value_cache.stride(0),
        value_cache.stride(1),
        value_cache.stride(2),
        block_table,
        block_table.stride(0),
        block_table.stride(1),
        seq_lens,
        query_start_loc,
        num_reqs,
        out,
        out.stride(0),
        out.stride(1),
        parts,
        lse,
        float(scale) * _LOG2E,
        cfg.num_splits,
        seq_lens if kv_offset is None else kv_offset,
        window_size or 0,
        future_offset,
        NUM_HEADS=num_heads,
        HEAD_DIM=head_dim,
        BLOCK_D=block_d,
        GROUP=num_heads // num_kv_heads,
        BLOCK_Q=cfg.block_q,
        BLOCK_M=cfg.block_m,
        BLOCK_N=cfg.block_n,
        BLOCK_SIZE=block_size,
        SPLIT_KV=cfg.num_splits > 1,
        CAUSAL=bool(causal),
        WINDOWED=window_size is not None,
        HAS_OFFSET=kv_offset is not None,
        SINK_TOKENS=sink_tokens(sink_size, block_size),
        DOT_PRECISION=precision,
        UPCAST_DOT=_upcast_dot(query),
        EXACT_TILES=cfg.exact_tiles,
        HEADS_FIRST=cfg.heads_first,
        num_warps=cfg.num_warps,
        num_stages=cfg.num_stages,
    )
    if cfg.num_splits > 1:
        _combine_splits_kernel[(num_tokens, num_heads)](
            parts,
            lse,
            out,
            out.stride(0),
            out.stride(1),
            cfg.num_splits,
            NUM_HEADS=num_heads,
            HEAD_DIM=head_dim,
            BLOCK_D=block_d,
            BLOCK_S=triton.next_power_of_2(cfg.num_splits),
            num_warps=4,
        )


def _upcast_dot(query: torch.Tensor) -> bool:
    """The Triton interpreter (CPU tests) computes bf16 ``tl.dot`` wrongly (triton
    3.8: garbage of order 1e10), so there the tiles are upcast to fp32 first. On a
    GPU the dots take bf16/fp16 operands with fp32 accumulation."""
    return query.dtype == torch.bfloat16 and os.environ.get("TRITON_INTERPRET") == "1"


def supports(query: torch.Tensor, key_cache: torch.Tensor, value_cache: torch.Tensor) -> bool:
    """Whether the Triton kernel handles these dtypes/shapes (else use the reference)."""
    return (
        query.dtype in SUPPORTED_DTYPES
        and key_cache.dtype == query.dtype
        and value_cache.dtype == query.dtype
        and query.dim() == 3
        and key_cache.shape[-1] == value_cache.shape[-1] == query.shape[-1]
        and query.stride(2) == 1
        and key_cache.stride(3) == 1
        and value_cache.stride(3) == 1
    )


def warn_fallback(description: str) -> None:
    """Log once per input kind that the host-syncing torch reference runs instead."""
    warn_once(
        logger,
        description,
        "dspark.paged_attention: no Triton kernel for %s; using the torch "
        "reference (reads lengths on the host: not CUDA-graph capturable)",
        description,
    )


def _check_inputs(query, key_cache, value_cache, block_table, seq_lens, query_start_loc):
    if query.dim() != 3 or key_cache.dim() != 4 or value_cache.shape != key_cache.shape:
        raise ValueError(
            f"query {tuple(query.shape)}, key_cache {tuple(key_cache.shape)} and "
            f"value_cache {tuple(value_cache.shape)} are invalid: expected "
            "[T, Hq, D] and two equal [num_blocks, b, Hkv, D]"
        )
    if query.shape[1] % key_cache.shape[2] or query.shape[2] != key_cache.shape[3]:
        raise ValueError(
            f"query has {query.shape[1]} heads of dim {query.shape[2]}: expected a "
            f"multiple of the cache's {key_cache.shape[2]} heads of dim "
            f"{key_cache.shape[3]}"
        )
    if not supports(query, key_cache, value_cache):
        raise ValueError(
            f"dtype {query.dtype}/{key_cache.dtype}/{value_cache.dtype} or strides "
            f"are invalid: expected one of {SUPPORTED_DTYPES} for all three and a "
            "contiguous last dim"
        )
    num_reqs = seq_lens.shape[0]
    if (
        block_table.dim() != 2
        or block_table.shape[0] != num_reqs
        or tuple(query_start_loc.shape) != (num_reqs + 1,)
    ):
        raise ValueError(
            f"block_table {tuple(block_table.shape)}, seq_lens "
            f"{tuple(seq_lens.shape)} and query_start_loc "
            f"{tuple(query_start_loc.shape)} are invalid: expected [R, width], "
            "[R] and [R+1]"
        )
