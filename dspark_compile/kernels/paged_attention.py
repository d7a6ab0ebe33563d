"""Torch reference for ``dspark.paged_attention`` and ``dspark.reshape_and_cache``.

These functions are the definition of correct: every fast kernel is tested
against them. They work on any device (the attention loops over requests and
reads their lengths on the host).
"""

from __future__ import annotations

from typing import Optional

import torch

from dspark_compile.arithmetic.window import key_visible, table_token_positions


def paged_attention_ref(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    scale: float,
    causal: bool,
    kv_start: Optional[torch.Tensor] = None,
    kv_offset: Optional[torch.Tensor] = None,
    window_size: Optional[int] = None,
    future_offset: int = 0,
    sink_size: int = 0,
) -> torch.Tensor:
    """Paged attention over a block-table KV cache.

    Shapes: ``query [T, Hq, D]``, ``key_cache/value_cache [num_blocks, b, Hkv, D]``,
    ``block_table [R, max_blocks]``, ``seq_lens [R]``, ``query_start_loc [R+1]``.
    Request i has ``q_len = query_start_loc[i+1] - query_start_loc[i]`` queries at
    table positions ``seq_lens[i] - q_len .. seq_lens[i] - 1``; KV token t lives
    at ``block_table[i, t // b]``, offset ``t % b``, for ``t < seq_lens[i]``.
    Causal: a query sees tokens ``<=`` its position; non-causal: all tokens.

    Windows (all optional):
    - ``kv_start [R]`` hides table tokens ``< kv_start[i]`` (a per-request window).
    - ``window_size`` W (with ``future_offset`` K >= 0): a query at ABSOLUTE
      position p sees only tokens at absolute positions ``>= lo(p) =
      floor(max(p + 1 + K - W, 0) / b) * b`` (b = the cache's block size).
      Causal queries use their own p; non-causal queries all use the last
      position of their request (every query of a block sees the same keys).
    - ``sink_size`` S (needs W): tokens at absolute positions ``< S_b =
      ceil(S / b) * b`` stay visible beside the window (attention sinks).
    - ``kv_offset [R]`` is the absolute position of the window's first table
      token (default 0): absolute position = ``kv_offset[i] + t``; with sinks
      the table starts with ``kept = min(S_b, kv_offset[i])`` sink tokens at
      positions ``0 .. kept - 1`` and token t >= kept is at ``kv_offset[i] + t
      - kept`` (``arithmetic.window.table_token_positions``). A windowed table
      then gives the same result as the full table with the same W and S.
    A query that sees no token outputs zeros.
    Math in float32; returns ``[T, Hq, D]`` in ``query``'s dtype.
    """
    num_tokens, num_heads, head_dim = query.shape
    block_size, num_kv_heads = key_cache.shape[1], key_cache.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(
            f"query has {num_heads} heads, not a multiple of the cache's {num_kv_heads}"
        )
    check_window_args(window_size, future_offset, sink_size)
    group = num_heads // num_kv_heads
    out = torch.zeros(
        num_tokens, num_heads, value_cache.shape[-1], dtype=torch.float32, device=query.device
    )
    lens = seq_lens.tolist()
    locs = query_start_loc.tolist()
    starts = [0] * len(lens) if kv_start is None else kv_start.tolist()
    offsets = [0] * len(lens) if kv_offset is None else kv_offset.tolist()
    for i, seq_len in enumerate(lens):
        q_begin, q_end = locs[i], locs[i + 1]
        q_len = q_end - q_begin
        if q_len == 0 or seq_len == 0:
            continue
        num_blocks = -(-seq_len // block_size)
        if num_blocks > block_table.shape[1]:
            raise ValueError(
                f"seq_lens[{i}]={seq_len} is invalid: it needs {num_blocks} "
                f"blocks of {block_size}, the block table has "
                f"{block_table.shape[1]} columns"
            )
        blocks = block_table[i, :num_blocks].long()
        k = key_cache[blocks].flatten(0, 1)[:seq_len].float()  # [S, Hkv, D]
        v = value_cache[blocks].flatten(0, 1)[:seq_len].float()
        k = k.repeat_interleave(group, dim=1).transpose(0, 1)  # [Hq, S, D]
        v = v.repeat_interleave(group, dim=1).transpose(0, 1)
        q = query[q_begin:q_end].float().transpose(0, 1)  # [Hq, q_len, D]
        scores = torch.matmul(q, k.transpose(1, 2)) * scale  # [Hq, q_len, S]
        kv_pos = torch.arange(seq_len, device=query.device)
        q_pos = torch.arange(seq_len - q_len, seq_len, device=query.device)
        visible = (kv_pos >= starts[i]).unsqueeze(0).expand(q_len, seq_len)
        if causal:
            visible = visible & (kv_pos.unsqueeze(0) <= q_pos.unsqueeze(1))
        if window_size is not None:
            anchor = q_pos if causal else torch.full_like(q_pos, seq_len - 1)
            offset = torch.tensor(offsets[i], device=query.device)
            key_abs = table_token_positions(kv_pos, offset, sink_size, block_size)
            query_abs = table_token_positions(anchor, offset, sink_size, block_size)
            visible = visible & key_visible(
                key_abs.unsqueeze(0),
                query_abs.unsqueeze(1),
                window_size,
                block_size,
                future_offset,
                sink_size,
            )
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)  # all-masked rows -> 0
        out[q_begin:q_end] = torch.matmul(probs, v).transpose(0, 1)
    return out.to(query.dtype)


def window_lower_bound(
    position: torch.Tensor, window_size: int, block_size: int, future_offset: int = 0
) -> torch.Tensor:
    """``lo(p) = floor(max(p + 1 + K - W, 0) / b) * b``: the first key a query at
    absolute position p may see (block aligned; elementwise on int tensors)."""
    shifted = torch.clamp(position + (1 + future_offset - window_size), min=0)
    return torch.div(shifted, block_size, rounding_mode="floor") * block_size


def check_window_args(window_size: Optional[int], future_offset: int, sink_size: int = 0) -> None:
    """ValueError unless ``window_size`` is None or a positive int, ``future_offset``
    an int in ``[0, window_size)`` (0 without a window) and ``sink_size`` an int
    >= 0 (0 without a window)."""
    if window_size is not None and (
        not isinstance(window_size, int) or isinstance(window_size, bool) or window_size <= 0
    ):
        raise ValueError(f"window_size={window_size!r} is invalid: expected None or a positive int")
    limit = window_size if window_size is not None else 1
    if (
        not isinstance(future_offset, int)
        or isinstance(future_offset, bool)
        or not 0 <= future_offset < limit
    ):
        raise ValueError(
            f"future_offset={future_offset!r} is invalid: expected an int in "
            f"[0, {limit}) (0 without a window_size)"
        )
    if (
        not isinstance(sink_size, int)
        or isinstance(sink_size, bool)
        or sink_size < 0
        or (sink_size and window_size is None)
    ):
        raise ValueError(
            f"sink_size={sink_size!r} is invalid: expected an int >= 0 (0 without a window_size)"
        )


def reshape_and_cache_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write ``key/value [T, Hkv, D]`` rows at absolute slots, in place.

    ``slot = block * b + offset``; a negative slot skips its row.
    """
    block_size = key_cache.shape[1]
    slots = slot_mapping.long()
    keep = slots >= 0
    slots = slots[keep]
    blocks, offsets = slots // block_size, slots % block_size
    key_cache[blocks, offsets] = key[keep].to(key_cache.dtype)
    value_cache[blocks, offsets] = value[keep].to(value_cache.dtype)
