"""A small DFlash-style reference draft with random weights.

Decoder layers of RMSNorm -> QKV -> RoPE -> KV write (``dspark.reshape_and_cache``
at absolute slots) -> GQA attention (``dspark.paged_attention``, non-causal
over the draft block by default) -> output projection -> RMSNorm -> SiLU MLP.
Every layer shares one (seq_lens, block_table) pair, like a real draft step.
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence

import torch
from torch import nn

import dspark_compile.ops  # noqa: F401  (torch.ops.dspark.*)
from dspark_compile.models.layers import RMSNorm, apply_rope

AttentionFn = Callable[..., torch.Tensor]


@dataclasses.dataclass(frozen=True)
class DraftModelConfig:
    hidden_size: int = 256
    num_layers: int = 2
    num_heads: int = 8
    num_kv_heads: int = 2
    head_dim: int = 32
    intermediate_size: int = 512
    causal: bool = False
    rope_theta: float = 10000.0
    eps: float = 1e-6


class DraftAttention(nn.Module):
    def __init__(self, cfg: DraftModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        self.qkv_proj = nn.Linear(cfg.hidden_size, q_size + 2 * kv_size, bias=False)
        self.o_proj = nn.Linear(q_size, cfg.hidden_size, bias=False)
        self.scale = cfg.head_dim**-0.5

    def forward(
        self,
        hidden,
        positions,
        key_cache,
        value_cache,
        block_table,
        seq_lens,
        query_start_loc,
        slot_mapping,
        attention: Optional[AttentionFn],
    ):
        cfg = self.cfg
        q_size, kv_size = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim
        q, k, v = self.qkv_proj(hidden).split([q_size, kv_size, kv_size], dim=-1)
        q = apply_rope(q.view(-1, cfg.num_heads, cfg.head_dim), positions, cfg.rope_theta)
        k = apply_rope(k.view(-1, cfg.num_kv_heads, cfg.head_dim), positions, cfg.rope_theta)
        v = v.view(-1, cfg.num_kv_heads, cfg.head_dim)
        torch.ops.dspark.reshape_and_cache(k, v, key_cache, value_cache, slot_mapping)
        attention = attention or torch.ops.dspark.paged_attention
        out = attention(
            q,
            key_cache,
            value_cache,
            block_table,
            seq_lens,
            query_start_loc,
            self.scale,
            cfg.causal,
        )
        return self.o_proj(out.reshape(-1, q_size))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DraftModelConfig) -> None:
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.eps, weight_noise=0.1)
        self.attn = DraftAttention(cfg)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.eps, weight_noise=0.1)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(
        self,
        hidden,
        positions,
        key_cache,
        value_cache,
        block_table,
        seq_lens,
        query_start_loc,
        slot_mapping,
        attention,
    ):
        hidden = hidden + self.attn(
            self.input_norm(hidden),
            positions,
            key_cache,
            value_cache,
            block_table,
            seq_lens,
            query_start_loc,
            slot_mapping,
            attention,
        )
        gate, up = self.gate_up(self.post_attn_norm(hidden)).chunk(2, dim=-1)
        return hidden + self.down(torch.nn.functional.silu(gate) * up)


class DFlashReferenceDraft(nn.Module):
    """``forward(hidden [T, hidden], positions [T], key_caches, value_caches, block_table,
    seq_lens, query_start_loc, slot_mapping) -> hidden [T, hidden]``.

    ``key_caches``/``value_caches``: one ``[num_blocks, b, Hkv, D]`` cache per layer,
    written in place at ``slot_mapping``. ``attention_override`` (eager only)
    replaces ``dspark.paged_attention`` with a function of the same signature.
    """

    def __init__(self, cfg: DraftModelConfig = DraftModelConfig(), seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.layers = nn.ModuleList(DraftLayer(cfg) for _ in range(cfg.num_layers))
            self.norm = RMSNorm(cfg.hidden_size, cfg.eps, weight_noise=0.1)
        self.attention_override: Optional[AttentionFn] = None

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        key_caches: Sequence[torch.Tensor],
        value_caches: Sequence[torch.Tensor],
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> torch.Tensor:
        for layer, key_cache, value_cache in zip(self.layers, key_caches, value_caches):
            hidden = layer(
                hidden,
                positions,
                key_cache,
                value_cache,
                block_table,
                seq_lens,
                query_start_loc,
                slot_mapping,
                self.attention_override,
            )
        return self.norm(hidden)
