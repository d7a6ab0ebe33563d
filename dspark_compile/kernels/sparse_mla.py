"""Torch references for sparse-MLA index generation and sparse MLA attention.

These functions are the definition of correct (docs/design.md, "DSpark indices"); the
Triton kernels in ``sparse_mla_triton`` are tested against them. They run on
any device with no host synchronisation except the input checks, which read
values only on CPU (on CUDA an overflowing row is caught by an asynchronous
device assert instead).

Token t of request r (``query_start_loc[r] <= t < query_start_loc[r+1]``) is
the j-th of ``q_len`` queries; ``ctx = seq_lens[r] - q_len`` and its absolute
position is ``pos = ctx + j``. KV token ``p`` of request r lives at slot
``block_table[r, p // b] * b + p % b``.

- causal (``swa_indices``): token t sees ``[max(pos - W + 1, 0), pos]``;
- non-causal (``noncausal_swa_indices``): every token of the block sees
  ``[max(ctx - W, 0), ctx + q_len)``.

Attention sinks (``sink_size`` S, default 0): with that window ``[lo, hi)``
the token also sees the first ``S_b = ceil(S / b) * b`` KV tokens, i.e.
``[0, min(S_b, lo)) U [lo, hi)`` (a window starting inside the sinks lists
nothing twice: the row is ``[0, hi)``). Every token of a non-causal block
keeps the same row.

Rows are the sink slots in ascending position order, then the window's, then ``-1``. A token
past ``query_start_loc[-1]`` or with a negative ``slot_mapping`` entry gets an
all ``-1`` row. A range longer than ``width`` is an error, never truncated.
"""

from __future__ import annotations

import torch

from dspark_compile.arithmetic.index_width import WIDTH_RULE
from dspark_compile.validation import check_int


def check_index_args(
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_size: int,
    window_size: int,
    width: int,
    sink_size: int = 0,
) -> None:
    """Shapes, dtypes and scalar ranges of the index ops; raises ``ValueError``."""
    check_int("block_size", block_size, 1, allow_symbolic=True)
    check_int("window_size", window_size, 1, allow_symbolic=True)
    check_int("width", width, 1, allow_symbolic=True)
    check_int(
        "sink_size", sink_size, 0, "a non-negative int (0: no attention sinks)", allow_symbolic=True
    )
    num_reqs = seq_lens.shape[0] if seq_lens.dim() == 1 else -1
    for name, tensor, dims, dtypes in (
        ("seq_lens", seq_lens, 1, (torch.int32,)),
        ("query_start_loc", query_start_loc, 1, (torch.int32,)),
        ("block_table", block_table, 2, (torch.int32,)),
        ("slot_mapping", slot_mapping, 1, (torch.int64, torch.int32)),
    ):
        if tensor.dim() != dims or tensor.dtype not in dtypes:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)} and dtype {tensor.dtype}: expected a "
                f"{dims}-d tensor of {' or '.join(str(d) for d in dtypes)}"
            )
    if query_start_loc.shape[0] != num_reqs + 1:
        raise ValueError(
            f"query_start_loc has {query_start_loc.shape[0]} entries: expected "
            f"num_reqs + 1 = {num_reqs + 1} (seq_lens has {num_reqs})"
        )
    if block_table.shape[0] != num_reqs:
        raise ValueError(
            f"block_table has {block_table.shape[0]} rows: expected one per request ({num_reqs})"
        )


def _token_ranges(seq_lens, query_start_loc, block_table, slot_mapping, window_size, noncausal):
    """Per token: request index (clamped), visible ``[lo, hi)`` and validity."""
    num_tokens, num_reqs = slot_mapping.shape[0], seq_lens.shape[0]
    device = slot_mapping.device
    tokens = torch.arange(num_tokens, device=device, dtype=torch.int64)
    if num_reqs == 0:
        zeros = torch.zeros(num_tokens, dtype=torch.int64, device=device)
        return zeros, zeros, zeros, torch.zeros(num_tokens, dtype=torch.bool, device=device)
    locs = query_start_loc.to(torch.int64)
    req = torch.searchsorted(locs[1:].contiguous(), tokens, right=True)
    valid = torch.logical_and(req < num_reqs, slot_mapping >= 0)
    req = torch.clamp(req, max=num_reqs - 1)
    q_begin, q_end = locs[req], locs[req + 1]
    q_len = q_end - q_begin
    seq = seq_lens.to(torch.int64)[req]
    ctx = seq - q_len
    if noncausal:
        lo = torch.clamp(ctx - window_size, min=0)
        hi = seq
    else:
        pos = ctx + (tokens - q_begin)
        lo = torch.clamp(pos - window_size + 1, min=0)
        hi = pos + 1
    valid = torch.logical_and(valid, hi > lo)
    return req, lo, hi, valid


def _index_ref(
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
    req, lo, hi, valid = _token_ranges(
        seq_lens, query_start_loc, block_table, slot_mapping, window_size, noncausal
    )
    span = torch.where(valid, hi - lo, torch.zeros_like(hi))
    num_sinks = None
    if sink_size:  # sink_size == 0: exactly the window rows (no extra ops)
        sink_end = -(-sink_size // block_size) * block_size  # S_b
        num_sinks = torch.where(valid, torch.clamp(lo, max=sink_end), torch.zeros_like(lo))
        span = span + num_sinks  # min(S_b, lo) more
    _check_fits(span, width, noncausal)
    num_tokens = slot_mapping.shape[0]
    if num_tokens == 0 or block_table.shape[1] == 0:
        return torch.full((num_tokens, width), -1, dtype=torch.int32, device=slot_mapping.device)
    cols = torch.arange(width, device=slot_mapping.device, dtype=torch.int64)
    pos = lo.unsqueeze(1) + cols.unsqueeze(0)  # [T, width]
    if num_sinks is not None:  # columns [0, num_sinks): positions 0..; then the window
        sinks = num_sinks.unsqueeze(1)
        pos = torch.where(cols.unsqueeze(0) < sinks, cols.unsqueeze(0), pos - sinks)
    block_col = torch.div(pos, block_size, rounding_mode="floor")
    visible = valid.unsqueeze(1) & (pos < hi.unsqueeze(1)) & (block_col < block_table.shape[1])
    rows = block_table.to(torch.int64)[req]  # [T, max_blocks]
    blocks = torch.gather(rows, 1, torch.clamp(block_col, max=block_table.shape[1] - 1))
    slots = blocks * block_size + (pos - block_col * block_size)
    return torch.where(visible, slots, torch.full_like(slots, -1)).to(torch.int32)


def _check_fits(span: torch.Tensor, width: int, noncausal: bool) -> None:
    """A range longer than ``width`` is an error: host check on CPU, device assert on GPU."""
    form = "non-causal block" if noncausal else "causal window"
    message = (
        f"a token's {form} (with its attention sinks) is longer than width={width}: "
        f"widen the index ({WIDTH_RULE})"
    )
    if span.numel() == 0:
        return
    if span.device.type == "cpu":
        longest = int(span.max())
        if longest > width:
            raise ValueError(f"{message}; longest range has {longest} tokens")
    else:
        torch._assert_async(torch.all(span <= width), message)


def swa_indices_ref(
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_size: int,
    window_size: int,
    width: int,
    sink_size: int = 0,
) -> torch.Tensor:
    """Causal sliding-window KV slot ids ``[T, width]`` int32 (module docstring)."""
    return _index_ref(
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


def noncausal_swa_indices_ref(
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    block_table: torch.Tensor,
    slot_mapping: torch.Tensor,
    block_size: int,
    window_size: int,
    width: int,
    sink_size: int = 0,
) -> torch.Tensor:
    """DSpark non-causal KV slot ids ``[T, width]`` int32 (module docstring)."""
    return _index_ref(
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


def check_sparse_mla_args(
    query: torch.Tensor, kv_cache: torch.Tensor, indices: torch.Tensor, kv_lora_rank: int
) -> None:
    if query.dim() != 3:
        raise ValueError(f"query has shape {tuple(query.shape)}: expected [T, H, L + P]")
    if kv_cache.dim() != 3:
        raise ValueError(
            f"kv_cache has shape {tuple(kv_cache.shape)}: expected [num_blocks, block_size, L + P]"
        )
    if kv_cache.shape[-1] != query.shape[-1]:
        raise ValueError(
            f"kv_cache head dim {kv_cache.shape[-1]} != query head dim "
            f"{query.shape[-1]}: both are kv_lora_rank + rope_dim"
        )
    if indices.dim() != 2 or indices.shape[0] != query.shape[0] or indices.dtype != torch.int32:
        raise ValueError(
            f"indices has shape {tuple(indices.shape)} and dtype {indices.dtype}: "
            f"expected [{query.shape[0]}, width] int32"
        )
    check_int("kv_lora_rank", kv_lora_rank, 1, allow_symbolic=True)
    if kv_lora_rank > query.shape[-1]:
        raise ValueError(
            f"kv_lora_rank={kv_lora_rank} is invalid: expected at most the head "
            f"dim {query.shape[-1]}"
        )
    if indices.device.type == "cpu" and indices.numel():
        num_slots = kv_cache.shape[0] * kv_cache.shape[1]
        if int(indices.max()) >= num_slots or int(indices.min()) < -1:
            raise ValueError(
                f"indices hold slot ids in [{int(indices.min())}, "
                f"{int(indices.max())}]: expected -1 or [0, {num_slots})"
            )


def sparse_mla_attention_ref(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    scale: float,
    kv_lora_rank: int,
) -> torch.Tensor:
    """Index-driven MLA attention.

    ``query [T, H, L+P]``; ``kv_cache [num_blocks, b, L+P]`` viewed as
    ``[num_blocks*b, L+P]`` slots; ``indices [T, width]`` int32 slot ids, ``-1``
    skipped. Scores ``scale * q . kv`` over all L+P channels; values are the
    first ``L = kv_lora_rank`` channels. No mask other than the indices; a
    token with no valid index outputs zeros. Rows no index lists never reach the
    output (not even as NaN). Math in float32; returns
    ``[T, H, L]`` in ``query``'s dtype.
    """
    check_sparse_mla_args(query, kv_cache, indices, kv_lora_rank)
    flat = kv_cache.reshape(-1, kv_cache.shape[-1])
    valid = indices >= 0
    kv = flat[torch.clamp(indices, min=0).long()].float()  # [T, width, D]
    kv = kv.masked_fill(~valid.unsqueeze(-1), 0.0)  # unlisted rows never reach the output
    scores = torch.einsum("thd,tnd->thn", query.float(), kv) * scale
    scores = scores.masked_fill(~valid.unsqueeze(1), float("-inf"))
    probs = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    out = torch.einsum("thn,tnl->thl", probs, kv[..., :kv_lora_rank])
    return out.to(query.dtype)


def mla_cache_write_ref(
    kv: torch.Tensor, kv_cache: torch.Tensor, slot_mapping: torch.Tensor
) -> None:
    """Write latent rows ``kv [T, L+P]`` at absolute slots of ``kv_cache [nb, b, L+P]``, in place.

    A negative slot skips its row.
    """
    block_size = kv_cache.shape[1]
    slots = slot_mapping.long()
    keep = slots >= 0
    slots = slots[keep]
    kv_cache[slots // block_size, slots % block_size] = kv[keep].to(kv_cache.dtype)
