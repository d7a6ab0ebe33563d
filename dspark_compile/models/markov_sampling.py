"""DSpark Markov head and sequential sampling (docs/design.md, "DSpark indices").

DSpark drafts a whole block in one non-causal forward, then injects the
left-to-right dependency while sampling: for step i,
``logits_i = base_logits[:, i] + bias(embed(prev))`` with ``prev`` the token
sampled at step i-1 (the anchor token for i = 0).

Sampling is greedy argmax at temperature 0, else Gumbel-max with noise that
is a pure function of ``(seed, position, token id)`` (``gumbel_noise``), so a
verifier can regenerate it. The loop is ``kernels.markov_sampling.sample_with_bias``
(shared with ``dspark::markov_head_sample``): fixed-shape torch ops over a fixed
number of steps, no host synchronisation, capturable in a CUDA graph.
"""

from __future__ import annotations

from typing import Optional, Union

import torch
from torch import nn

from dspark_compile.kernels.markov_sampling import sample_with_bias
from dspark_compile.validation import check_int


class DSparkMarkovHead(nn.Module):
    """Low-rank Markov bias ``B(prev) = bias(embed(prev))``: ``[V] -> r -> [V]``.

    ``forward(prev_tokens [R] int) -> [R, V]``.
    """

    def __init__(self, vocab_size: int, rank: int) -> None:
        super().__init__()
        check_int("vocab_size", vocab_size)
        check_int("rank", rank)
        self.embed = nn.Embedding(vocab_size, rank)
        self.bias = nn.Linear(rank, vocab_size, bias=False)

    @property
    def vocab_size(self) -> int:
        return self.embed.num_embeddings

    def forward(self, prev_tokens: torch.Tensor) -> torch.Tensor:
        return self.bias(self.embed(prev_tokens))

    def low_rank_factors(self) -> tuple[torch.Tensor, torch.Tensor]:
        """``(embed [V, r], weight [V, r])``, detached, with ``forward(prev) ==
        F.linear(embed[prev], weight)``: for kernels that compute the bias themselves.
        ``ValueError`` where ``forward`` is not that (a subclass's own ``forward``,
        forward hooks, replaced submodules, ``max_norm``, an additive bias)."""
        hooks = (
            self._forward_hooks,
            self._forward_pre_hooks,
            self.embed._forward_hooks,
            self.embed._forward_pre_hooks,
            self.bias._forward_hooks,
            self.bias._forward_pre_hooks,
        )
        if (
            type(self).forward is not DSparkMarkovHead.forward
            or any(hooks)
            or type(self.embed) is not nn.Embedding
            or type(self.bias) is not nn.Linear
        ):
            raise ValueError(
                "markov_head has its own forward, forward hooks or replaced "
                "submodules: its bias is not embed[prev] @ weight^T"
            )
        if self.embed.max_norm is not None:
            raise ValueError(
                f"markov_head.embed.max_norm={self.embed.max_norm!r} is invalid "
                f"here: expected None (no renormalisation)"
            )
        if self.bias.bias is not None:
            raise ValueError(
                "markov_head.bias has an additive bias: expected bias=False, as "
                "DSparkMarkovHead builds it"
            )
        return self.embed.weight.detach(), self.bias.weight.detach()


def sample_sequential(
    base_logits: torch.Tensor,
    anchor_tokens: torch.Tensor,
    markov_head: nn.Module,
    temperature: Union[float, torch.Tensor],
    seeds: torch.Tensor,
    positions: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Sample a draft block left to right through the Markov head.

    Args:
        base_logits: ``[R, N, V]`` logits of the non-causal block forward.
        anchor_tokens: ``[R]`` token before the block (``prev`` of step 0).
        markov_head: ``prev [R] -> bias [R, V]`` (``DSparkMarkovHead``).
        temperature: a float or ``[R]`` tensor; rows at 0 are greedy (argmax),
            others Gumbel-max over ``logits / temperature``.
        seeds: ``[R]`` int seeds of the noise.
        positions: ``[R]`` position of step 0 (noise key of step i is
            ``positions + i``); defaults to 0.
    Returns:
        ``[R, N]`` int64 tokens. No host synchronisation.
    """
    return sample_with_bias(base_logits, anchor_tokens, markov_head, temperature, seeds, positions)


def block_sample_indices(
    query_start_loc: torch.Tensor, num_steps: int, num_rows: int, offset: int = 1
) -> torch.Tensor:
    """Token rows whose logits drive each draft step: ``[num_rows, num_steps]`` int64.

    Request r (``r < len(query_start_loc) - 1``) maps step i to token
    ``query_start_loc[r] + offset + i`` (offset 1 skips the anchor/bonus token
    of a DFlash-style block); entries past the request's tokens and every
    padding row ``r >= num_reqs`` (CUDA-graph padding) are ``-1``, never 0.
    """
    num_reqs = query_start_loc.shape[0] - 1
    if num_reqs > num_rows:
        raise ValueError(f"num_rows={num_rows} is invalid: expected >= num_reqs ({num_reqs})")
    device = query_start_loc.device
    locs = torch.full((num_rows + 1,), 0, dtype=torch.int64, device=device)
    locs[: num_reqs + 1] = query_start_loc.to(torch.int64)
    rows = torch.arange(num_rows, device=device)
    index = locs[:-1].unsqueeze(1) + offset + torch.arange(num_steps, device=device).unsqueeze(0)
    valid = (rows < num_reqs).unsqueeze(1) & (index < locs[1:].unsqueeze(1))
    return torch.where(valid, index, torch.full_like(index, -1))
