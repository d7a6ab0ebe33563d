"""Fused Markov-head sampling step: logits + bias, temperature, Gumbel noise and argmax.

``sample_sequential_triton`` returns the same tokens, bit for bit, as
``models.markov_sampling.sample_sequential`` (the definition of correct): it
calls the same ``markov_head(prev)`` for the bias, then one kernel per step
reads ``base_logits[:, i]`` and the bias once, forms ``logits = base.float() +
bias.float()``, and for sampled rows adds the noise of ``gumbel_noise``
(regenerated in-kernel from (seed, position, token) with the same 32-bit hash,
IEEE division by the temperature and, on CUDA, libdevice ``logf`` as torch
uses). The first maximal index wins, as in ``torch.argmax``.

Each program reduces a ``BLOCK_V`` slice of one row to its best (value, index)
and merges it into the row's winner with one 64-bit ``atomic_max`` on a key
that orders by value, then by lower index. The row's last program to finish
(an ``atomic_add`` counter, acquire-release) decodes the winner and writes the
token, which is the next step's ``prev``: one launch per step besides the
head. No host synchronisation: the whole draft block captures as one CUDA
graph. Logits must not hold NaN (``torch.argmax`` would pick the NaN; this
kernel does not).
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import triton
import triton.language as tl
from torch import nn
from triton.language.extra import libdevice

from dspark_compile.kernels.sampling_args import check_sampling_args

BLOCK_V = 4096
NUM_WARPS = 8


@triton.jit
def _mix32(x):
    """``lowbias32`` on uint32 (wrapping multiplies)."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit(do_not_specialize=["step"])
def _markov_step_kernel(base_ptr, base_stride, bias_ptr, bias_stride, temp_ptr, seed_ptr,
                        pos_ptr, step, best_ptr, count_ptr, token_ptr, vocab,
                        SAMPLE: tl.constexpr, LIBDEVICE: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    tokens = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    in_vocab = tokens < vocab
    logits = (tl.load(base_ptr + row * base_stride + tokens, mask=in_vocab, other=0.0)
              .to(tl.float32)
              + tl.load(bias_ptr + row * bias_stride + tokens, mask=in_vocab, other=0.0)
              .to(tl.float32))
    value = logits
    if SAMPLE:
        temperature = tl.load(temp_ptr + row)
        if temperature != 0.0:
            seed = tl.load(seed_ptr + row).to(tl.int64)
            key = seed.to(tl.uint32) ^ _mix32((seed >> 32).to(tl.uint32))
            position = tl.load(pos_ptr + row).to(tl.int64) + step
            key = _mix32(_mix32(key) ^ position.to(tl.uint32))
            bits = _mix32(key + tokens.to(tl.uint32))
            uniform = ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
            if LIBDEVICE:
                noise = -libdevice.log(-libdevice.log(uniform))
            else:
                noise = -tl.log(-tl.log(uniform))
            value = tl.math.div_rn(logits, temperature) + noise
    value = tl.where(in_vocab, value + 0.0, float("-inf"))     # + 0.0: -0.0 ties +0.0
    best = tl.max(value, axis=0)
    first = tl.min(tl.where(value == best, tokens, 2147483647), axis=0)
    bits = best.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)
    low = tl.full([], 4294967295, dtype=tl.int64) - first.to(tl.int64)
    packed = (ordered << 32) | low
    tl.atomic_max(best_ptr + row, packed)
    # acq_rel: the last arrival sees every program's atomic_max of this row
    if tl.atomic_add(count_ptr + row, 1) == tl.num_programs(1) - 1:
        winner = tl.atomic_max(best_ptr + row, packed)     # the row's final key
        tl.store(token_ptr + row, 4294967295 - (winner & 4294967295))


def sample_sequential_triton(base_logits: torch.Tensor, anchor_tokens: torch.Tensor,
                             markov_head: nn.Module, temperature: Union[float, torch.Tensor],
                             seeds: torch.Tensor, positions: Optional[torch.Tensor] = None,
                             *, block_v: int = BLOCK_V, num_warps: int = NUM_WARPS,
                             ) -> torch.Tensor:
    """``sample_sequential`` with one fused kernel per step; ``[R, N]`` int64 tokens.

    ``block_v`` (a power of two >= 128) vocabulary entries per program and
    ``num_warps`` (1, 2, 4, 8 or 16) are launch knobs; the tokens do not
    depend on them.
    """
    if not isinstance(block_v, int) or block_v < 128 or block_v & (block_v - 1):
        raise ValueError(f"block_v={block_v!r} is invalid: expected a power of two >= 128")
    if num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"num_warps={num_warps!r} is invalid: expected 1, 2, 4, 8 or 16")
    temperature, positions, greedy_only = check_sampling_args(base_logits, anchor_tokens,
                                                              temperature, seeds, positions)
    num_reqs, num_steps, vocab = base_logits.shape
    device = base_logits.device
    if num_steps == 0 or num_reqs == 0:
        return torch.empty((num_reqs, num_steps), dtype=torch.int64, device=device)
    if base_logits.stride(2) != 1:
        base_logits = base_logits.contiguous()
    seeds = seeds.to(device=device, dtype=torch.int64)
    positions = positions.to(device=device, dtype=torch.int64)
    packed = torch.full((num_steps, num_reqs), torch.iinfo(torch.int64).min, dtype=torch.int64,
                        device=device)
    arrivals = torch.zeros((num_steps, num_reqs), dtype=torch.int32, device=device)
    tokens = torch.empty((num_steps, num_reqs), dtype=torch.int64, device=device)
    prev = anchor_tokens.to(torch.int64)
    grid = (num_reqs, triton.cdiv(vocab, block_v))
    step_views = zip(base_logits.unbind(1), packed.unbind(0), arrivals.unbind(0),
                     tokens.unbind(0))                       # host: one call per tensor
    for step, (step_base, step_best, step_arrivals, step_tokens) in enumerate(step_views):
        bias = markov_head(prev)
        if tuple(bias.shape) != (num_reqs, vocab):
            raise ValueError(f"markov_head returned shape {tuple(bias.shape)}: expected "
                             f"[{num_reqs}, {vocab}]")
        bias = bias if bias.stride(1) == 1 else bias.contiguous()
        _markov_step_kernel[grid](
            step_base, base_logits.stride(0), bias, bias.stride(0), temperature,
            seeds, positions, step, step_best, step_arrivals, step_tokens, vocab,
            SAMPLE=not greedy_only, LIBDEVICE=device.type == "cuda", BLOCK=block_v,
            num_warps=num_warps)
        prev = step_tokens
    return tokens.t().contiguous()
