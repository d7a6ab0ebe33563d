"""Torch reference of DSpark sequential Markov sampling (docs/design.md, "DSpark indices").

The definition of correct for ``dspark::markov_head_sample`` and the Triton samplers
(``markov_sampling_triton``, ``markov_head_sampling_triton``). Step i of a block takes
``logits_i = base_logits[:, i].float() + bias(prev).float()``, ``prev`` the token of
step i-1 (the anchor token for i = 0): greedy argmax at temperature 0, else Gumbel-max
with noise that is a pure function of ``(seed, position, token id)`` (``gumbel_noise``),
so a verifier can regenerate it. Fixed-shape torch ops over a fixed number of steps:
no host synchronisation, capturable in a CUDA graph.
"""

from __future__ import annotations

from typing import Callable, Optional, Union

import torch
import torch.nn.functional as F

from dspark_compile.kernels.sampling_args import check_head_sampling_args, check_sampling_args

_MASK32 = 0xFFFFFFFF

Bias = Callable[[torch.Tensor], torch.Tensor]


def _mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """``x * c mod 2**32`` for ``0 <= x < 2**32`` in int64 without overflow."""
    low = x * (c & 0xFFFF)
    high = torch.bitwise_and(x * (c >> 16), 0xFFFF) * 0x10000
    return torch.bitwise_and(low + high, _MASK32)


def _mix32(x: torch.Tensor) -> torch.Tensor:
    """The ``lowbias32`` integer hash on uint32 values held in int64."""
    x = torch.bitwise_xor(x, x >> 16)
    x = _mul32(x, 0x7FEB352D)
    x = torch.bitwise_xor(x, x >> 15)
    x = _mul32(x, 0x846CA68B)
    return torch.bitwise_xor(x, x >> 16)


def noise_bits(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """The 32-bit hash behind ``gumbel_noise``: ``[R, V]`` int64 in ``[0, 2**32)``,
    ``h = mix(mix(mix(seed_lo ^ mix(seed_hi)) ^ position) + token)`` (32-bit
    ``lowbias32`` mixes). ``seeds``, ``positions``: ``[R]`` ints."""
    seeds = seeds.to(torch.int64)
    key = torch.bitwise_xor(
        torch.bitwise_and(seeds, _MASK32), _mix32(torch.bitwise_and(seeds >> 32, _MASK32))
    )
    key = _mix32(
        torch.bitwise_xor(_mix32(key), torch.bitwise_and(positions.to(torch.int64), _MASK32))
    )
    tokens = torch.arange(vocab_size, device=seeds.device, dtype=torch.int64)
    return _mix32(torch.bitwise_and(key.unsqueeze(1) + tokens.unsqueeze(0), _MASK32))


def gumbel_from_bits(bits: torch.Tensor) -> torch.Tensor:
    """The noise of hash ``bits``: ``u = ((h >> 9) + 0.5) / 2**23`` (exact in float32,
    strictly inside (0, 1)), noise ``-log(-log(u))`` in float32."""
    uniform = ((bits >> 9).to(torch.float32) + 0.5) * (1.0 / float(1 << 23))
    return -torch.log(-torch.log(uniform))


def gumbel_noise(seeds: torch.Tensor, positions: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Standard Gumbel noise ``[R, V]`` float32, a pure function of (seed, position, token):
    ``gumbel_from_bits(noise_bits(seeds, positions, vocab_size))``."""
    return gumbel_from_bits(noise_bits(seeds, positions, vocab_size))


def sample_with_bias(
    base_logits: torch.Tensor,
    anchor_tokens: torch.Tensor,
    bias: Bias,
    temperature: Union[float, torch.Tensor],
    seeds: torch.Tensor,
    positions: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """Sample a draft block left to right, ``bias(prev [R] int64) -> [R, V]`` the Markov
    bias of the previous tokens; arguments and result as ``sample_sequential``'s
    (``models.markov_sampling``): ``[R, N]`` int64 tokens, no host synchronisation."""
    checked = check_sampling_args(base_logits, anchor_tokens, temperature, seeds, positions)
    return _sample_steps(base_logits, anchor_tokens, bias, seeds, *checked)


def _sample_steps(
    base_logits: torch.Tensor,
    anchor_tokens: torch.Tensor,
    bias: Bias,
    seeds: torch.Tensor,
    temperature: torch.Tensor,
    positions: torch.Tensor,
    greedy_only: bool,
) -> torch.Tensor:
    """The sampling loop on checked arguments (``check_sampling_args``'s results)."""
    num_reqs, num_steps, vocab = base_logits.shape
    temperature = temperature.unsqueeze(1)
    greedy_rows = temperature == 0
    safe_temperature = torch.where(greedy_rows, torch.ones_like(temperature), temperature)
    prev = anchor_tokens.to(torch.int64)
    tokens = []
    for step in range(num_steps):
        logits = base_logits[:, step].float() + bias(prev).float()
        token = logits.argmax(dim=-1)
        if not greedy_only:
            noise = gumbel_noise(seeds, positions.to(torch.int64) + step, vocab)
            sampled = (logits / safe_temperature + noise).argmax(dim=-1)
            token = torch.where(greedy_rows.squeeze(1), token, sampled)
        tokens.append(token)
        prev = token
    if not tokens:
        return torch.empty((num_reqs, 0), dtype=torch.int64, device=base_logits.device)
    return torch.stack(tokens, dim=1)


def low_rank_bias(prev: torch.Tensor, embed: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``[R, V]`` bias ``embed[prev] @ weight^T`` (the factors' dtype), computed by the
    calls ``DSparkMarkovHead.forward`` makes (``nn.Embedding`` then ``nn.Linear``
    without bias), so it equals the module's bias bit for bit."""
    return F.linear(F.embedding(prev, embed), weight)


def markov_head_sample_ref(
    base_logits: torch.Tensor,
    anchor_tokens: torch.Tensor,
    embed: torch.Tensor,
    weight: torch.Tensor,
    temperature: Union[float, torch.Tensor],
    seeds: torch.Tensor,
    positions: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``sample_with_bias`` with the low-rank head ``(embed [V, r], weight [V, r])``
    (``low_rank_bias``): the reference of ``dspark::markov_head_sample``. On CPU a
    temperature tensor of zeros skips the noise, as a float 0 does (no host sync there)."""
    temperature, positions, greedy_only = check_head_sampling_args(
        base_logits, anchor_tokens, embed, weight, temperature, seeds, positions
    )
    if base_logits.device.type == "cpu" and not greedy_only:
        greedy_only = not bool(temperature.any())
    return _sample_steps(
        base_logits,
        anchor_tokens,
        lambda prev: low_rank_bias(prev, embed, weight),
        seeds,
        temperature,
        positions,
        greedy_only,
    )
