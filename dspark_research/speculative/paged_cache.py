"""A one-request paged KV cache and the step metadata the paged ops read."""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass
class StepInputs:
    """Metadata of one forward over cache positions ``[start, end)`` of one request."""

    positions: torch.Tensor  # [T] int64
    block_table: torch.Tensor  # [1, max_blocks] int32
    seq_lens: torch.Tensor  # [1] int32, == end
    query_start_loc: torch.Tensor  # [2] int32, == [0, T]
    slot_mapping: torch.Tensor  # [T] int64


class PagedKVCache:
    """Per-layer ``[num_blocks, b, Hkv, D]`` key/value caches for one request.

    The request's blocks are a random permutation of the pool (so paging is
    exercised, not a contiguous layout) and the block table has a fixed width
    (``ceil(capacity / b)``), so its shape never changes between steps.
    ``length`` is the number of valid tokens; :meth:`truncate` rolls it back
    (stale KV past ``length`` is overwritten by the next write). The caches
    start random, never zero, so a read of an unwritten slot shows.
    """

    def __init__(
        self,
        num_layers: int,
        num_kv_heads: int,
        head_dim: int,
        capacity: int,
        block_size: int = 16,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str = "cpu",
        seed: int = 0,
        spare_blocks: int = 2,
    ) -> None:
        if not isinstance(capacity, int) or capacity <= 0:
            raise ValueError(f"capacity={capacity!r} is invalid: expected a positive int")
        if not isinstance(block_size, int) or block_size <= 0:
            raise ValueError(f"block_size={block_size!r} is invalid: expected a positive int")
        generator = torch.Generator().manual_seed(seed)
        blocks = -(-capacity // block_size)
        num_blocks = blocks + spare_blocks
        table = torch.randperm(num_blocks, generator=generator)[:blocks]
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        self.key_caches = [
            torch.randn(shape, generator=generator).to(device=device, dtype=dtype)
            for _ in range(num_layers)
        ]
        self.value_caches = [
            torch.randn(shape, generator=generator).to(device=device, dtype=dtype)
            for _ in range(num_layers)
        ]
        self.block_table = table.to(torch.int32).unsqueeze(0).to(device)
        positions = torch.arange(blocks * block_size)
        self._slots = (table[positions // block_size] * block_size + positions % block_size).to(
            device
        )
        self._positions = positions.to(device)
        self.capacity, self.block_size, self.device = capacity, block_size, torch.device(device)
        self.length = 0

    def step(self, num_new: int) -> StepInputs:
        """Inputs for ``num_new`` tokens at positions ``[length, length + num_new)``;
        advances ``length``."""
        start, end = self.length, self.length + num_new
        if num_new <= 0:
            raise ValueError(f"num_new={num_new} is invalid: expected a positive int")
        if end > self.capacity:
            raise ValueError(
                f"num_new={num_new} is invalid: {start} + {num_new} tokens exceed "
                f"the cache capacity {self.capacity}"
            )
        self.length = end
        return StepInputs(
            positions=self._positions[start:end],
            block_table=self.block_table,
            seq_lens=torch.tensor([end], dtype=torch.int32, device=self.device),
            query_start_loc=torch.tensor([0, num_new], dtype=torch.int32, device=self.device),
            slot_mapping=self._slots[start:end],
        )

    def truncate(self, length: int) -> None:
        """Roll back to ``length`` valid tokens (``0 <= length <= self.length``)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"length={length} is invalid: expected 0 <= length <= {self.length}")
        self.length = length
