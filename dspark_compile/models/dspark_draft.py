"""A small DSpark-style reference draft with random weights.

Parallel block drafting over sparse MLA: every layer is RMSNorm -> latent
KV (``kv_lora_rank`` + RoPE ``rope_dim`` channels) written at absolute slots
(``dspark.mla_cache_write``) -> index-driven MLA attention
(``dspark.sparse_mla_attention``) -> output projection -> RMSNorm -> SiLU MLP.
One index tensor (``dspark.swa_indices``, the draft's own causal sliding
window) is computed per step and shared by every layer. Compiled with
``backend="dspark", options={"method": "dspark"}`` the index call becomes the
non-causal block form; ``propose`` turns the block's hidden states into
draft tokens through the Markov head (``dspark.markov_head_sample``, or
``sample_sequential`` for a head that is not plain low rank).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Optional, Sequence, Union

import torch
from torch import nn

import dspark_compile.ops  # noqa: F401  (torch.ops.dspark.*)
from dspark_compile.arithmetic.index_width import causal_width
from dspark_compile.kernels.sampling_args import check_sampling_args
from dspark_compile.models.layers import RMSNorm, apply_rope
from dspark_compile.models.markov_sampling import (
    DSparkMarkovHead,
    block_sample_indices,
    sample_sequential,
)

IndexFn = Callable[..., torch.Tensor]


@dataclasses.dataclass(frozen=True)
class DSparkDraftConfig:
    hidden_size: int = 64
    num_layers: int = 2
    num_heads: int = 4
    kv_lora_rank: int = 32
    rope_dim: int = 16
    intermediate_size: int = 128
    vocab_size: int = 96
    markov_rank: int = 8
    sliding_window: int = 64  # the draft's own causal window (its trained window)
    rope_theta: float = 10000.0
    eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.kv_lora_rank + self.rope_dim


class SparseMLAAttention(nn.Module):
    def __init__(self, cfg: DSparkDraftConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.q_proj = nn.Linear(cfg.hidden_size, cfg.num_heads * cfg.head_dim, bias=False)
        self.kv_proj = nn.Linear(cfg.hidden_size, cfg.head_dim, bias=False)
        self.kv_norm = RMSNorm(cfg.kv_lora_rank, cfg.eps, weight_noise=0.1)
        self.o_proj = nn.Linear(cfg.num_heads * cfg.kv_lora_rank, cfg.hidden_size, bias=False)
        self.scale = cfg.head_dim**-0.5

    def forward(self, hidden, positions, kv_cache, slot_mapping, indices):
        cfg = self.cfg
        lora = cfg.kv_lora_rank
        q = self.q_proj(hidden).view(-1, cfg.num_heads, cfg.head_dim)
        q = torch.cat([q[..., :lora], apply_rope(q[..., lora:], positions, cfg.rope_theta)], -1)
        kv = self.kv_proj(hidden)
        kv_rope = apply_rope(kv[:, None, lora:], positions, cfg.rope_theta)[:, 0]
        kv = torch.cat([self.kv_norm(kv[:, :lora]), kv_rope], dim=-1)
        torch.ops.dspark.mla_cache_write(kv, kv_cache, slot_mapping)
        out = torch.ops.dspark.sparse_mla_attention(q, kv_cache, indices, self.scale, lora)
        return self.o_proj(out.reshape(-1, cfg.num_heads * lora))


class DSparkLayer(nn.Module):
    def __init__(self, cfg: DSparkDraftConfig) -> None:
        super().__init__()
        self.input_norm = RMSNorm(cfg.hidden_size, cfg.eps, weight_noise=0.1)
        self.attn = SparseMLAAttention(cfg)
        self.post_attn_norm = RMSNorm(cfg.hidden_size, cfg.eps, weight_noise=0.1)
        self.gate_up = nn.Linear(cfg.hidden_size, 2 * cfg.intermediate_size, bias=False)
        self.down = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, hidden, positions, kv_cache, slot_mapping, indices):
        hidden = hidden + self.attn(
            self.input_norm(hidden), positions, kv_cache, slot_mapping, indices
        )
        gate, up = self.gate_up(self.post_attn_norm(hidden)).chunk(2, dim=-1)
        return hidden + self.down(torch.nn.functional.silu(gate) * up)


class DSparkReferenceDraft(nn.Module):
    """``forward(hidden [T, hidden], positions [T], kv_caches, block_table, seq_lens,
    query_start_loc, slot_mapping) -> hidden [T, hidden]``.

    ``kv_caches``: one latent cache ``[num_blocks, b, kv_lora_rank + rope_dim]``
    per layer, written in place at ``slot_mapping``. ``index_override`` (eager
    only) replaces ``dspark.swa_indices`` with a function of the same signature.
    """

    def __init__(self, cfg: DSparkDraftConfig = DSparkDraftConfig(), seed: int = 0) -> None:
        super().__init__()
        self.cfg = cfg
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.layers = nn.ModuleList(DSparkLayer(cfg) for _ in range(cfg.num_layers))
            self.norm = RMSNorm(cfg.hidden_size, cfg.eps, weight_noise=0.1)
            self.lm_head = nn.Linear(cfg.hidden_size, cfg.vocab_size, bias=False)
            self.markov_head = DSparkMarkovHead(cfg.vocab_size, cfg.markov_rank)
        self.index_override: Optional[IndexFn] = None

    def forward(
        self,
        hidden: torch.Tensor,
        positions: torch.Tensor,
        kv_caches: Sequence[torch.Tensor],
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> torch.Tensor:
        window = self.cfg.sliding_window
        index_fn = self.index_override or torch.ops.dspark.swa_indices
        indices = index_fn(
            seq_lens,
            query_start_loc,
            block_table,
            slot_mapping,
            kv_caches[0].shape[1],
            window,
            causal_width(window),
        )
        for layer, kv_cache in zip(self.layers, kv_caches):
            hidden = layer(hidden, positions, kv_cache, slot_mapping, indices)
        return self.norm(hidden)

    def propose(
        self,
        hidden: torch.Tensor,
        query_start_loc: torch.Tensor,
        anchor_tokens: torch.Tensor,
        num_steps: int,
        temperature: Union[float, torch.Tensor],
        seeds: torch.Tensor,
        positions: Optional[torch.Tensor] = None,
    ) -> torch.Tensor:
        """Draft tokens ``[R, num_steps]`` from the block's output ``hidden``.

        Step i of request r reads the logits of token ``query_start_loc[r] + 1 + i``
        (``block_sample_indices``) plus the Markov bias of the previous token;
        rows (``R = anchor_tokens.shape[0]``, CUDA-graph padding included)
        without such a token are ``-1``. ``temperature``, ``seeds`` and ``positions``
        as in ``sample_sequential``.

        Sampler: where ``markov_head.low_rank_factors()`` succeeds (a plain
        ``DSparkMarkovHead``), ``dspark.markov_head_sample``: on CUDA with float16 or
        bfloat16 head weights the fused Triton kernel that computes the bias itself,
        elsewhere the torch reference; any other head (forward hooks, its own forward,
        any module) runs through ``sample_sequential`` with the module. The tokens are
        ``sample_sequential``'s, on the fused kernel whenever its in-kernel bias equals
        ``markov_head(prev)`` bit for bit (``markov_head_bias_triton`` compares them).
        """
        rows = anchor_tokens.shape[0]
        sample_index = block_sample_indices(query_start_loc, num_steps, rows)
        base = self.lm_head(hidden[torch.clamp(sample_index, min=0)])  # [R, N, V]
        factors = _low_rank_factors(self.markov_head)
        if factors is None:
            tokens = sample_sequential(
                base, anchor_tokens, self.markov_head, temperature, seeds, positions
            )
        else:
            temperature = check_sampling_args(base, anchor_tokens, temperature, seeds, positions)[
                0
            ]  # [R] float32
            tokens = torch.ops.dspark.markov_head_sample(
                base, anchor_tokens, *factors, temperature, seeds, positions
            )
        return torch.where(sample_index >= 0, tokens, torch.full_like(tokens, -1))


def _low_rank_factors(markov_head: nn.Module) -> Optional[tuple[torch.Tensor, torch.Tensor]]:
    """``markov_head.low_rank_factors()``, or None where the head has no such method or
    it raises ``ValueError`` (the head's bias is not ``embed[prev] @ weight^T``)."""
    factors = getattr(markov_head, "low_rank_factors", None)
    if factors is None:
        return None
    try:
        return factors()
    except ValueError:
        return None


def random_latent_caches(
    num_layers: int,
    num_blocks: int,
    block_size: int,
    head_dim: int,
    dtype: torch.dtype = torch.float32,
    device: torch.device | str = "cpu",
    generator: torch.Generator | None = None,
) -> list[torch.Tensor]:
    """Random (never zero) latent KV caches ``[num_blocks, b, head_dim]``, one per layer."""
    return [
        torch.randn((num_blocks, block_size, head_dim), generator=generator).to(
            dtype=dtype, device=device
        )
        for _ in range(num_layers)
    ]
