"""Argument checks of DSpark sequential Markov sampling, shared by the torch reference
(``kernels.markov_sampling``), the fused Triton kernels and ``dspark::markov_head_sample``'s
fake implementation."""

from __future__ import annotations

from typing import Optional, Union

import torch


def check_sampling_args(
    base_logits: torch.Tensor,
    anchor_tokens: torch.Tensor,
    temperature: Union[float, torch.Tensor],
    seeds: torch.Tensor,
    positions: Optional[torch.Tensor],
):
    """Validate ``sample_sequential``'s arguments (``ValueError``) and normalise them.

    Returns ``(temperature [R] float32, positions [R], greedy_only)``;
    ``greedy_only`` is True when ``temperature`` is the number 0.
    """
    if base_logits.dim() != 3:
        raise ValueError(f"base_logits has shape {tuple(base_logits.shape)}: expected [R, N, V]")
    num_reqs = base_logits.shape[0]
    for name, tensor in (
        ("anchor_tokens", anchor_tokens),
        ("seeds", seeds),
        ("positions", positions),
    ):
        if tensor is not None and tuple(tensor.shape) != (num_reqs,):
            raise ValueError(f"{name} has shape {tuple(tensor.shape)}: expected [{num_reqs}]")
    device = base_logits.device
    if positions is None:
        positions = torch.zeros(num_reqs, dtype=torch.int64, device=device)
    greedy_only = isinstance(temperature, (int, float)) and temperature == 0
    if isinstance(temperature, (int, float)):
        if temperature < 0:
            raise ValueError(f"temperature={temperature!r} is invalid: expected >= 0")
        temperature = torch.full((num_reqs,), float(temperature), device=device)
    elif tuple(temperature.shape) != (num_reqs,):
        raise ValueError(
            f"temperature has shape {tuple(temperature.shape)}: expected a float or [{num_reqs}]"
        )
    return temperature.to(device=device, dtype=torch.float32), positions, greedy_only


def check_head_sampling_args(
    base_logits: torch.Tensor,
    anchor_tokens: torch.Tensor,
    embed: torch.Tensor,
    weight: torch.Tensor,
    temperature: Union[float, torch.Tensor],
    seeds: torch.Tensor,
    positions: Optional[torch.Tensor],
):
    """``check_sampling_args`` (and its results) for a low-rank Markov head given by its
    factors: ``embed`` and ``weight`` ``[V, r]`` of one floating dtype on the logits'
    device, ``V`` the logits' vocabulary."""
    checked = check_sampling_args(base_logits, anchor_tokens, temperature, seeds, positions)
    vocab, device = base_logits.shape[2], base_logits.device
    for name, factor in (("embed", embed), ("weight", weight)):
        if factor.dim() != 2 or factor.shape[0] != vocab:
            raise ValueError(
                f"{name} has shape {tuple(factor.shape)}: expected [{vocab}, r], "
                f"{vocab} being base_logits' vocabulary"
            )
        if factor.device != device:
            raise ValueError(
                f"{name} is on {factor.device}: expected {device}, where base_logits are"
            )
    if weight.shape[1] != embed.shape[1]:
        raise ValueError(
            f"weight has shape {tuple(weight.shape)}: expected embed's {tuple(embed.shape)}"
        )
    if not embed.dtype.is_floating_point or weight.dtype != embed.dtype:
        raise ValueError(
            f"embed is {embed.dtype} and weight {weight.dtype}: expected one floating dtype"
        )
    return checked


def kernel_sampling_inputs(base_logits: torch.Tensor, seeds: torch.Tensor, positions: torch.Tensor):
    """``(base_logits, seeds, positions)`` as the Triton samplers read them: the logits
    with unit stride along V, seeds and positions int64 on the logits' device."""
    if base_logits.stride(2) != 1:
        base_logits = base_logits.contiguous()
    device = base_logits.device
    return (
        base_logits,
        seeds.to(device=device, dtype=torch.int64),
        positions.to(device=device, dtype=torch.int64),
    )
