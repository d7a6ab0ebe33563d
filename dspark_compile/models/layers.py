"""Model layers shared by the reference drafts and the speculative study's LM."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    """``x / rms(x) * weight`` over the last dim, computed in float32, returned in
    ``x.dtype``. ``weight`` starts at 1, plus ``weight_noise * N(0, 1)`` per channel when
    ``weight_noise`` > 0 (random-weight drafts, whose norms should not be the identity)."""

    def __init__(self, size: int, eps: float, weight_noise: float = 0.0) -> None:
        super().__init__()
        if weight_noise < 0:
            raise ValueError(f"weight_noise={weight_noise!r} is invalid: expected >= 0")
        weight = torch.ones(size)
        if weight_noise:
            weight = 1.0 + weight_noise * torch.randn(size)
        self.weight = nn.Parameter(weight)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        variance = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(variance + self.eps)).to(x.dtype) * self.weight


def apply_rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half RoPE of ``x [T, H, D]`` at integer ``positions [T]``."""
    half = x.shape[-1] // 2
    inv_freq = 1.0 / (theta ** (torch.arange(half, device=x.device, dtype=torch.float32) / half))
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    cos, sin = angles.cos()[:, None, :], angles.sin()[:, None, :]
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1).to(x.dtype)
