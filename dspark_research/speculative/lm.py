"""A byte-level RoPE transformer LM with two forwards over the same weights.

``forward_dense`` runs contiguous batches with causal SDPA (training);
``forward`` runs on a paged KV cache through ``dspark.reshape_and_cache`` and
``dspark.paged_attention`` (inference), so ``torch.compile(..., backend="dspark")``
windows its attention. With ``feature_size > 0`` the model is EAGLE-style: the
input at position p is ``fc([embed(x_p), feature_{p-1}])``, where the feature is
a target hidden state (the target's normed last hidden, i.e. its ``lm_head`` input).
Both forwards return ``(logits, hidden)`` with ``hidden`` the normed last hidden.
"""

from __future__ import annotations

import dataclasses
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

import dspark_compile.ops  # noqa: F401  (torch.ops.dspark.*)
from dspark_compile.models.layers import RMSNorm, apply_rope


@dataclasses.dataclass(frozen=True)
class LMConfig:
    """Shape of a :class:`TransformerLM`. ``feature_size``: 0 for a plain LM, else
    the size of the feature fed beside each token (EAGLE-style draft)."""

    vocab_size: int = 256
    hidden_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 768
    feature_size: int = 0
    rope_theta: float = 10000.0
    eps: float = 1e-6

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
            "intermediate_size",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}={value!r} is invalid: expected a positive int")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f"num_heads={self.num_heads} is invalid: expected a multiple of "
                f"num_kv_heads={self.num_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head_dim={self.head_dim} is invalid: expected an even int (RoPE)")
        if not isinstance(self.feature_size, int) or self.feature_size < 0:
            raise ValueError(f"feature_size={self.feature_size!r} is invalid: expected an int >= 0")


class Block(nn.Module):
    """Pre-norm decoder layer: RMSNorm -> GQA attention with RoPE -> RMSNorm -> SiLU MLP."""

    def __init__(self, cfg: LMConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        self.attn_norm = RMSNorm(cfg.hidden_size, cfg.eps)
        self.qkv = nn.Linear(cfg.hidden_size, self.q_size + 2 * self.kv_size, bias=False)
        self.o_proj = nn.Linear(self.q_size, cfg.hidden_size, bias=False)
        self.mlp_norm = RMSNorm(cfg.hidden_size, cfg.eps)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def _mlp(self, hidden: torch.Tensor) -> torch.Tensor:
        gate, up = self.gate_up(self.mlp_norm(hidden)).chunk(2, dim=-1)
        return hidden + self.down(F.silu(gate) * up)

    def _qkv(self, hidden: torch.Tensor, positions: torch.Tensor):
        cfg = self.cfg
        q, k, v = self.qkv(self.attn_norm(hidden)).split(
            [self.q_size, self.kv_size, self.kv_size], dim=-1
        )
        q = apply_rope(q.reshape(-1, cfg.num_heads, cfg.head_dim), positions, cfg.rope_theta)
        k = apply_rope(k.reshape(-1, cfg.num_kv_heads, cfg.head_dim), positions, cfg.rope_theta)
        return q, k, v.reshape(-1, cfg.num_kv_heads, cfg.head_dim)

    def forward_dense(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [B, S, H]``, positions ``0..S-1``, causal."""
        cfg = self.cfg
        batch, seq = hidden.shape[:2]
        positions = torch.arange(seq, device=hidden.device).repeat(batch)
        q, k, v = self._qkv(hidden.reshape(batch * seq, -1), positions)
        q, k, v = (t.reshape(batch, seq, -1, cfg.head_dim).transpose(1, 2) for t in (q, k, v))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        out = out.transpose(1, 2).reshape(batch, seq, self.q_size)
        return self._mlp(hidden + self.o_proj(out))

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
    ):
        q, k, v = self._qkv(hidden, positions)
        torch.ops.dspark.reshape_and_cache(k, v, key_cache, value_cache, slot_mapping)
        out = torch.ops.dspark.paged_attention(
            q,
            key_cache,
            value_cache,
            block_table,
            seq_lens,
            query_start_loc,
            self.cfg.head_dim**-0.5,
            True,
        )
        return self._mlp(hidden + self.o_proj(out.reshape(-1, self.q_size)))


class TransformerLM(nn.Module):
    """Byte LM; implements the speculative loop's model protocol
    (:class:`dspark_research.speculative.protocol.PagedModel`)."""

    def __init__(self, cfg: LMConfig, seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embed = nn.Embedding(cfg.vocab_size, cfg.hidden_size)
            self.feature_proj = (
                nn.Linear(cfg.hidden_size + cfg.feature_size, cfg.hidden_size, bias=False)
                if cfg.feature_size
                else None
            )
            self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.num_layers))
            self.norm = RMSNorm(cfg.hidden_size, cfg.eps)
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
            for module in self.modules():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(module.weight, std=0.02)

    # -- protocol -------------------------------------------------------------------------
    @property
    def feature_size(self) -> int:
        return self.cfg.feature_size

    @property
    def kv_cache_shape(self) -> tuple[int, int, int]:
        """(num_layers, num_kv_heads, head_dim) of the paged KV cache this model writes."""
        return self.cfg.num_layers, self.cfg.num_kv_heads, self.cfg.head_dim

    def _input(self, tokens: torch.Tensor, features: torch.Tensor | None) -> torch.Tensor:
        hidden = self.embed(tokens)
        if self.feature_proj is not None:
            hidden = self.feature_proj(torch.cat([hidden, features.to(hidden.dtype)], dim=-1))
        return hidden

    def forward_dense(self, tokens: torch.Tensor, features: torch.Tensor | None = None):
        """``tokens [B, S]`` (int64), ``features [B, S, F]`` already shifted (the feature
        of position p-1 at p, zeros at 0) -> ``(logits [B, S, V] fp32, hidden [B, S, H])``."""
        hidden = self._input(tokens, features)
        for layer in self.layers:
            hidden = layer.forward_dense(hidden)
        hidden = self.norm(hidden)
        return self.lm_head(hidden).float(), hidden

    def forward(
        self,
        tokens: torch.Tensor,
        features: torch.Tensor,
        positions: torch.Tensor,
        key_caches: Sequence[torch.Tensor],
        value_caches: Sequence[torch.Tensor],
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        slot_mapping: torch.Tensor,
        aux_layer_ids: Optional[Sequence[int]] = None,
    ):
        """Paged forward of ``T`` new tokens of one or more requests.

        ``tokens [T]`` int64, ``features [T, F]`` (``[T, 0]`` when ``feature_size == 0``),
        ``positions [T]``, one ``[num_blocks, b, Hkv, D]`` key/value cache per layer
        (written in place at ``slot_mapping``), ``block_table [R, max_blocks]`` int32,
        ``seq_lens [R]`` int32 (KV length including the new tokens),
        ``query_start_loc [R + 1]`` int32. Returns ``(logits [T, V] fp32, hidden [T, H])``.

        ``aux_layer_ids`` (an EAGLE3 draft's, strictly ascending ids in ``[0, num_layers)``)
        also returns ``aux [T, len(ids) * H]``: for each id i the residual stream entering
        layer i (before any norm), concatenated in id order, as vLLM's Llama collects
        its aux hidden states: ``(logits, hidden, aux)``.
        """
        ids = self._check_aux_layer_ids(aux_layer_ids) if aux_layer_ids is not None else ()
        aux = []
        hidden = self._input(tokens, features)
        for i, (layer, key_cache, value_cache) in enumerate(
            zip(self.layers, key_caches, value_caches)
        ):
            if i in ids:
                aux.append(hidden)
            hidden = layer(
                hidden,
                positions,
                key_cache,
                value_cache,
                block_table,
                seq_lens,
                query_start_loc,
                slot_mapping,
            )
        hidden = self.norm(hidden)
        if aux_layer_ids is None:
            return self.lm_head(hidden).float(), hidden
        return self.lm_head(hidden).float(), hidden, torch.cat(aux, dim=-1)

    def _check_aux_layer_ids(self, aux_layer_ids: Sequence[int]) -> tuple[int, ...]:
        ids = tuple(aux_layer_ids)
        if (
            not ids
            or any(not isinstance(i, int) or isinstance(i, bool) for i in ids)
            or list(ids) != sorted(set(ids))
            or ids[0] < 0
            or ids[-1] >= self.cfg.num_layers
        ):
            raise ValueError(
                f"aux_layer_ids={list(aux_layer_ids)!r} is invalid: expected strictly "
                f"ascending ints in [0, {self.cfg.num_layers}) (id i: the input of layer i)"
            )
        return ids


def shift_features(features: torch.Tensor) -> torch.Tensor:
    """``[B, S, F]`` -> the same with position p holding ``features[:, p - 1]`` (zeros at 0)."""
    return torch.cat([torch.zeros_like(features[:, :1]), features[:, :-1]], dim=1)
