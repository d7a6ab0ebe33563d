"""Verification of draft tokens: greedy acceptance and rejection sampling.

Both return ``(num_accepted [N] int64, next_token [N] int64)``: the first
``num_accepted`` draft tokens are kept and ``next_token`` follows them (the
target's correction on a rejection, its bonus token when all K are accepted).
"""

from __future__ import annotations

from typing import Optional

import torch


def _leading_true(mask: torch.Tensor) -> torch.Tensor:
    """``[N, K]`` bool -> number of leading True per row."""
    return mask.long().cumprod(dim=1).sum(dim=1)


def greedy_verify(draft_tokens: torch.Tensor, target_logits: torch.Tensor):
    """Greedy: keep draft tokens while they equal the target's argmax.

    ``draft_tokens [N, K]``, ``target_logits [N, K + 1, V]`` (position j scores the
    token after draft token j-1; position 0 the first draft token's slot).
    """
    target_tokens = target_logits.argmax(dim=-1)
    accepted = _leading_true(draft_tokens == target_tokens[:, :-1])
    next_token = target_tokens.gather(1, accepted.unsqueeze(1)).squeeze(1)
    return accepted, next_token


def rejection_sample(
    draft_tokens: torch.Tensor,
    draft_probs: torch.Tensor,
    target_probs: torch.Tensor,
    generator: Optional[torch.Generator] = None,
):
    """Speculative sampling (Leviathan et al. 2023; Chen et al. 2023).

    ``draft_tokens [N, K]`` were drawn from ``draft_probs [N, K, V]``;
    ``target_probs [N, K + 1, V]``. Draft token j is accepted with probability
    ``min(1, p_j(d) / q_j(d))``; the first rejection resamples from
    ``normalize(max(p_j - q_j, 0))``; if all K pass, the bonus token is drawn from
    ``p_K``. ``generator``: a CPU generator (random numbers are drawn on the CPU
    so runs reproduce across devices). The emitted tokens are then distributed exactly as
    sampling from the target alone.
    """
    n, k = draft_tokens.shape
    index = draft_tokens.unsqueeze(-1)
    p = target_probs[:, :k].gather(2, index).squeeze(-1)
    q = draft_probs.gather(2, index).squeeze(-1)
    u = torch.rand(n, k, generator=generator).to(p.device)
    accepted = _leading_true(u * q < p)  # u < p / q, without dividing by 0
    rows = torch.arange(n, device=p.device)
    p_next = target_probs[rows, accepted]  # [N, V]
    q_next = torch.cat([draft_probs, torch.zeros_like(draft_probs[:, :1])], dim=1)[rows, accepted]
    residual = (p_next - q_next).clamp_min(0)
    residual_mass = residual.sum(-1, keepdim=True)
    # All K accepted: q_next is 0 and the residual is p_K itself. A rejection with a
    # zero residual cannot happen (it needs p <= q everywhere and p(d) < q(d), i.e. sum p < 1);
    # fall back to p for float round-off.
    dist = torch.where(residual_mass > 0, residual / residual_mass.clamp_min(1e-30), p_next)
    next_token = torch.multinomial(dist.float().cpu(), 1, generator=generator).squeeze(1)
    return accepted, next_token.to(p.device)
