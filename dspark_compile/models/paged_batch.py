"""Random paged-KV batches for reference drafts, tests, demos and benchmarks."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import torch


@dataclasses.dataclass
class PagedBatch:
    """Attention metadata of one draft step over a paged KV cache.

    Request i has ``q_lens[i]`` new tokens at positions
    ``seq_lens[i] - q_lens[i] .. seq_lens[i] - 1``; ``slot_mapping [T]`` (int64)
    holds their absolute cache slots. ``block_table [R, max_blocks]`` (int32)
    is padded with random (garbage) block ids past each request's blocks.
    """

    block_table: torch.Tensor
    seq_lens: torch.Tensor
    query_start_loc: torch.Tensor
    slot_mapping: torch.Tensor
    positions: torch.Tensor
    num_blocks: int
    block_size: int

    @property
    def num_tokens(self) -> int:
        return self.slot_mapping.shape[0]


def make_paged_batch(
    seq_lens: Sequence[int],
    q_lens: Sequence[int],
    block_size: int,
    device: torch.device | str = "cpu",
    spare_blocks: int = 4,
    generator: torch.Generator | None = None,
) -> PagedBatch:
    """Scatter each request's blocks randomly over a cache of ``num_blocks`` blocks."""
    if len(seq_lens) != len(q_lens):
        raise ValueError(f"seq_lens has {len(seq_lens)} entries, q_lens {len(q_lens)}")
    for s, q in zip(seq_lens, q_lens):
        if not 0 <= q <= s:
            raise ValueError(
                f"q_len={q} is invalid for seq_len={s}: expected 0 <= q_len <= seq_len"
            )
    blocks_per_req = [-(-s // block_size) for s in seq_lens]
    num_blocks = sum(blocks_per_req) + spare_blocks
    width = max(blocks_per_req + [1])
    perm = torch.randperm(num_blocks, generator=generator)
    table = torch.randint(0, num_blocks, (len(seq_lens), width), generator=generator)
    slots, positions, offset = [], [], 0
    for i, (s, q) in enumerate(zip(seq_lens, q_lens)):
        table[i, : blocks_per_req[i]] = perm[offset : offset + blocks_per_req[i]]
        offset += blocks_per_req[i]
        for pos in range(s - q, s):
            slots.append(int(table[i, pos // block_size]) * block_size + pos % block_size)
            positions.append(pos)
    locs = torch.zeros(len(seq_lens) + 1, dtype=torch.int32)
    locs[1:] = torch.cumsum(torch.tensor(list(q_lens), dtype=torch.int32), 0)
    return PagedBatch(
        block_table=table.to(torch.int32).to(device),
        seq_lens=torch.tensor(list(seq_lens), dtype=torch.int32, device=device),
        query_start_loc=locs.to(device),
        slot_mapping=torch.tensor(slots, dtype=torch.int64, device=device),
        positions=torch.tensor(positions, dtype=torch.int64, device=device),
        num_blocks=num_blocks,
        block_size=block_size,
    )


def random_kv_cache(
    num_blocks: int,
    block_size: int,
    num_kv_heads: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random (never zero) key and value caches ``[num_blocks, b, Hkv, D]``."""
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    key = torch.randn(shape, generator=generator).to(dtype=dtype, device=device)
    value = torch.randn(shape, generator=generator).to(dtype=dtype, device=device)
    return key, value
