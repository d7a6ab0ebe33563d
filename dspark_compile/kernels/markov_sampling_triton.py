"""Fused Markov-head sampling step: logits + bias, temperature, Gumbel noise and argmax.

``sample_sequential_triton`` returns the same tokens, bit for bit, as
``models.markov_sampling.sample_sequential`` (the definition of correct): it
calls the same ``markov_head(prev)`` for the bias, then one kernel per step
reads ``base_logits[:, i]`` and the bias once and forms ``logits = base.float()
+ bias.float()``. Greedy rows take the argmax of the logits. Sampled rows take
the argmax of ``exact = div_rn(logits, T) + g`` with ``g`` the noise of
``gumbel_noise``, regenerated in-kernel from (seed, position, token) with the
same 32-bit hash and, on CUDA, libdevice ``logf`` as torch uses. The first
maximal index wins, as in ``torch.argmax``.

Sampled rows filter before they compute ``exact``. Every token gets a cheap
``approx = logits * div_rn(1, T) + g_fast`` (hardware ``lg2.approx``; a series
for ``-ln(u)`` when ``u`` is within 2**-8 of 1), with ``|approx - exact| <=
_ABS + _REL * |approx|``: ``_ABS`` is 4x ``NOISE_ERROR_LIMIT``, which bounds the
noise error over all 2**23 possible noise inputs (``gumbel_fast_error``
measures it; a test checks it on the device it runs on), and ``_REL`` (2**-19)
covers the roundings of ``1/T``, the product and the sums (3 x 2**-24 of
``|logits / T|``). A token whose upper bound lies below the program's best lower
bound cannot win or tie (docs/design.md, "DSpark indices").

Program (row, part) reads ``blocks_per_program`` blocks of ``BLOCK_V`` tokens in
turn (loading the next while it folds one in). Lane ``p`` of a block sees the
program's tokens ``p, p + BLOCK_V, ...`` in increasing order and keeps, with no
cross-lane work until the span is done, its best value and that value's first
token (greedy rows: the logit; sampled rows: ``approx``, and also its second best
``approx``). Then one reduction gives the program's best. Sampled rows: the
candidates are the lanes' best tokens whose upper bound reaches the best lower
bound; if there are 1..``max_candidates`` of them and no lane's second best is a
candidate, they get ``exact`` one at a time in index order (a single token on
1023 of 1024 programs of two simulated benchmark steps: randn logits, T = 1);
otherwise (more candidates, a lane holding two, or a maximal ``approx`` not finite
or beyond 2**100) every token of the span gets ``exact``. Either way the program's
(value, index) is the one ``exact`` defines. The program merges it into the row's
winner with one 64-bit ``atomic_max`` on a key that orders by value, then by lower
index. The row's last program to finish (an ``atomic_add`` counter,
acquire-release) decodes the winner and writes the token, which is the next step's
``prev``: one launch per step besides the head. No host synchronisation: the whole
draft block captures as one CUDA graph. Logits must not hold NaN (``torch.argmax``
would pick the NaN; this kernel does not).
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import triton
import triton.language as tl
from torch import nn
from triton.language.extra import libdevice

from dspark_compile.kernels.sampling_args import check_sampling_args

BLOCK_V = 2048              # H200 sweep (benchmarks/results/2026-12-01-h200-session10.md)
NUM_WARPS = 8
MAX_CANDIDATES = 8
BLOCKS_PER_PROGRAM = 16         # rows that sample (fewer, longer programs: faster there)
GREEDY_BLOCKS_PER_PROGRAM = 8   # calls whose temperature is the number 0
_NO_TOKEN = tl.constexpr(2147483647)
_LN2 = tl.constexpr(0.6931471805599453)
_SERIES_BELOW = tl.constexpr(2.0 ** -8)     # 1 - u below this: -ln(u) by its series
NOISE_ERROR_LIMIT = 2.0 ** -13              # gumbel_fast_error() stays below this
APPROX_ABS_BOUND = 4 * NOISE_ERROR_LIMIT     # bound on |approx - exact| besides _REL
_ABS = tl.constexpr(APPROX_ABS_BOUND)
_REL = tl.constexpr(2.0 ** -19)
_FINITE_LIMIT = tl.constexpr(2.0 ** 100)


@triton.jit
def _mix32(x):
    """``lowbias32`` on uint32 (wrapping multiplies)."""
    x = x ^ (x >> 16)
    x = x * 0x7FEB352D
    x = x ^ (x >> 15)
    x = x * 0x846CA68B
    return x ^ (x >> 16)


@triton.jit
def _row_key(seed, position):
    """The 32-bit noise key of (int64 seed, int64 position), as ``gumbel_noise``."""
    key = seed.to(tl.uint32) ^ _mix32((seed >> 32).to(tl.uint32))
    return _mix32(_mix32(key) ^ position.to(tl.uint32))


@triton.jit
def _noise_bits(key, tokens):
    return _mix32(key + tokens.to(tl.uint32))


@triton.jit
def _gumbel_exact(bits, LIBDEVICE: tl.constexpr):
    """``gumbel_noise``'s value for hash ``bits``, bit for bit."""
    uniform = ((bits >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)
    if LIBDEVICE:
        return -libdevice.log(-libdevice.log(uniform))
    else:
        return -tl.log(-tl.log(uniform))


@triton.jit
def _gumbel_fast(bits, LIBDEVICE: tl.constexpr):
    """``_gumbel_exact(bits)`` within ``NOISE_ERROR_LIMIT`` (hardware log2 on CUDA)."""
    one_to_two = ((bits >> 9) | 0x3F800000).to(tl.float32, bitcast=True)  # 1 + k / 2**23
    uniform = one_to_two - (1.0 - 1.0 / 16777216.0)                       # exact
    below_one = 1.0 - uniform                              # exact where the series is used
    # -log2(u) = (x + x**2/2 + x**3/3 + ...) / ln 2 for x = 1 - u; relative error < 2**-24
    series = below_one * (1.0 / _LN2 + below_one * (0.5 / _LN2 + below_one * (1.0 / 3.0 / _LN2)))
    if LIBDEVICE:
        neg_log2_u = tl.where(below_one < _SERIES_BELOW, series, -libdevice.fast_log2f(uniform))
        log2_neg_log = libdevice.fast_log2f(neg_log2_u)
    else:
        neg_log2_u = tl.where(below_one < _SERIES_BELOW, series, -tl.log2(uniform))
        log2_neg_log = tl.log2(neg_log2_u)
    # -ln(-ln u) = -ln(ln2 * (-log2 u)) = -ln2 * log2(-log2 u) - ln(ln2)
    return log2_neg_log * (-_LN2) + 0.36651292058166435


@triton.jit
def _block_argmax(value, tokens):
    """(max, first index of the max) of a block; ``value`` -inf off the vocabulary."""
    best = tl.max(value, axis=0)
    return best, tl.min(tl.where(value == best, tokens, _NO_TOKEN), axis=0)


@triton.jit
def _exact_value(logit, token, key, temperature, LIBDEVICE: tl.constexpr):
    """``div_rn(logit, T) + noise`` as the reference computes it; -0.0 made +0.0."""
    return (tl.math.div_rn(logit, temperature)
            + _gumbel_exact(_noise_bits(key, token), LIBDEVICE) + 0.0)


@triton.jit
def _approx_value(logits, bits, in_vocab, inverse_temperature, LIBDEVICE: tl.constexpr):
    """``exact`` within ``_ABS + _REL * |approx|``; -inf off the vocabulary.
    ``inverse_temperature`` is ``div_rn(1, T)``."""
    approx = logits * inverse_temperature + _gumbel_fast(bits, LIBDEVICE)
    return tl.where(in_vocab, approx, float("-inf"))


@triton.jit
def _merge(best, first, value, token):
    """The better of two (value, token) pairs: larger value, then lower token."""
    better = (value > best) | ((value == best) & (token < first))
    return tl.where(better, value, best), tl.where(better, token, first)


@triton.jit
def _candidates_argmax(candidate, tokens, row_logits, row_bias, key, temperature,
                       LIBDEVICE: tl.constexpr):
    """(max, first token of the max) of ``exact`` over the candidates, one at a time."""
    best = tl.full([], float("-inf"), tl.float32)
    first = tl.full([], _NO_TOKEN, tl.int32)
    token = tl.min(tl.where(candidate, tokens, _NO_TOKEN), axis=0)
    while token < _NO_TOKEN:                        # index order: a tie keeps the first
        logit = (tl.load(row_logits + token).to(tl.float32)
                 + tl.load(row_bias + token).to(tl.float32))
        best, first = _merge(best, first,
                             _exact_value(logit, token, key, temperature, LIBDEVICE), token)
        token = tl.min(tl.where(candidate & (tokens > token), tokens, _NO_TOKEN), axis=0)
    return best, first


@triton.jit
def _exact_span_argmax(row_logits, row_bias, start, stop, key, temperature,
                       BLOCK: tl.constexpr, LIBDEVICE: tl.constexpr):
    """(max, first token of the max) of every token's ``exact`` in ``[start, stop)``."""
    best = tl.full([], float("-inf"), tl.float32)
    first = tl.full([], _NO_TOKEN, tl.int32)
    for block_start in range(start, stop, BLOCK):
        tokens = block_start + tl.arange(0, BLOCK)
        in_vocab = tokens < stop
        logits = (tl.load(row_logits + tokens, mask=in_vocab, other=0.0).to(tl.float32)
                  + tl.load(row_bias + tokens, mask=in_vocab, other=0.0).to(tl.float32))
        exact = tl.math.div_rn(logits, temperature) + _gumbel_exact(
            _noise_bits(key, tokens), LIBDEVICE)
        block_best, block_first = _block_argmax(
            tl.where(in_vocab, exact + 0.0, float("-inf")), tokens)
        best, first = _merge(best, first, block_best, block_first)
    return best, first


@triton.jit
def _sampled_lanes_argmax(top, top_token, second, row_logits, row_bias, start, stop, key,
                          temperature, BLOCK: tl.constexpr, MAX_CANDIDATES: tl.constexpr,
                          LIBDEVICE: tl.constexpr):
    """The program's (max, first token of the max) of ``exact``, from each lane's best
    ``approx`` (``top``, at ``top_token``) and second best (``second``).

    A token is a candidate when its upper bound reaches the program's best lower bound
    (module docstring). When no lane's second best is a candidate, the candidates are
    the lanes' best tokens whose ``top`` is: 1..MAX_CANDIDATES of them get ``exact``
    one at a time. Otherwise (more candidates, a lane with two, or a maximal ``approx``
    not finite or beyond 2**100) every token of the span gets it."""
    best_approx = tl.max(top, axis=0)
    floor = best_approx - 2.0 * _ABS - _REL * tl.abs(best_approx)
    floor = tl.where(tl.abs(best_approx) < _FINITE_LIMIT, floor, float("nan"))  # NaN: none
    # at -inf, -inf + inf is NaN: never a candidate (its exact value is -inf too)
    candidate = top + _REL * tl.abs(top) >= floor
    crowded = tl.max((second + _REL * tl.abs(second) >= floor).to(tl.int32), axis=0)
    count = tl.sum(candidate.to(tl.int32), axis=0)
    if (crowded == 0) & (count >= 1) & (count <= MAX_CANDIDATES):
        best, first = _candidates_argmax(candidate, top_token, row_logits, row_bias, key,
                                         temperature, LIBDEVICE)
    else:
        best, first = _exact_span_argmax(row_logits, row_bias, start, stop, key, temperature,
                                         BLOCK, LIBDEVICE)
    return best, first


@triton.jit(do_not_specialize=["step"])
def _markov_step_kernel(base_ptr, base_stride, bias_ptr, bias_stride, temp_ptr, seed_ptr,
                        pos_ptr, step, best_ptr, count_ptr, token_ptr, vocab, span,
                        SAMPLE: tl.constexpr, LIBDEVICE: tl.constexpr, BLOCK: tl.constexpr,
                        MAX_CANDIDATES: tl.constexpr, APPROX_WOBBLE: tl.constexpr):
    """Program (row, part) reduces tokens ``[part * span, min((part + 1) * span, vocab))``
    in blocks of BLOCK (loading the next while it folds one in), then merges its
    (value, token) into the row's.

    Lane ``p`` of the block sees tokens ``start + p + k * BLOCK`` in increasing order
    and keeps its best value and that value's first token (greedy rows: the logit;
    sampled rows: ``approx``, and the second best ``approx``). No cross-lane work
    happens until the span is done. APPROX_WOBBLE (tests only; 0 otherwise) moves each
    approx up or down by that much, to check that any approx within the bound gives the
    same tokens.
    """
    row = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1) * span
    stop = tl.minimum(start + span, vocab)
    row_logits = base_ptr + row * base_stride
    row_bias = bias_ptr + row * bias_stride
    sampled = False
    if SAMPLE:
        temperature = tl.load(temp_ptr + row)
        sampled = temperature != 0.0
        inverse_temperature = tl.math.div_rn(1.0, temperature)
        key = _row_key(tl.load(seed_ptr + row).to(tl.int64),
                       tl.load(pos_ptr + row).to(tl.int64) + step)
    top = tl.full([BLOCK], float("-inf"), tl.float32)
    top_token = tl.full([BLOCK], _NO_TOKEN, tl.int32)
    second = tl.full([BLOCK], float("-inf"), tl.float32)
    tokens = start + tl.arange(0, BLOCK)
    base = tl.load(row_logits + tokens, mask=tokens < stop, other=0.0)
    bias = tl.load(row_bias + tokens, mask=tokens < stop, other=0.0)
    for block in range(0, tl.cdiv(stop - start, BLOCK)):
        in_vocab = tokens < stop
        logits = base.to(tl.float32) + bias.to(tl.float32)
        next_tokens = tokens + BLOCK                          # prefetch the next block
        base = tl.load(row_logits + next_tokens, mask=next_tokens < stop, other=0.0)
        bias = tl.load(row_bias + next_tokens, mask=next_tokens < stop, other=0.0)
        if SAMPLE:
            if sampled:
                value = _approx_value(logits, _noise_bits(key, tokens), in_vocab,
                                      inverse_temperature, LIBDEVICE)
                if APPROX_WOBBLE != 0.0:
                    sign = (_mix32(tokens.to(tl.uint32) ^ 0x9E3779B9) & 1).to(tl.float32)
                    value += (2.0 * sign - 1.0) * APPROX_WOBBLE
                second = tl.maximum(second, tl.minimum(value, top))
            else:
                value = tl.where(in_vocab, logits + 0.0, float("-inf"))   # -0.0: +0.0
        else:
            value = tl.where(in_vocab, logits + 0.0, float("-inf"))
        take = (value > top) | (block == 0)        # strict: a lane keeps its first maximum
        top_token = tl.where(take, tokens, top_token)
        top = tl.where(take, value, top)
        tokens = next_tokens
    # the lane maxima's first token; lanes of block 0 past the vocabulary hold tokens
    # above every real one, so they win only where no token does (impossible: start < vocab)
    if SAMPLE:
        if sampled:
            best, first = _sampled_lanes_argmax(top, top_token, second, row_logits, row_bias,
                                                start, stop, key, temperature, BLOCK,
                                                MAX_CANDIDATES, LIBDEVICE)
        else:
            best, first = _block_argmax(top, top_token)
    else:
        best, first = _block_argmax(top, top_token)
    bits = best.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)
    low = tl.full([], 4294967295, dtype=tl.int64) - first.to(tl.int64)
    packed = (ordered << 32) | low
    tl.atomic_max(best_ptr + row, packed)
    # acq_rel: the last arrival sees every program's atomic_max of this row
    if tl.atomic_add(count_ptr + row, 1) == tl.num_programs(1) - 1:
        winner = tl.atomic_max(best_ptr + row, packed)     # the row's final key
        tl.store(token_ptr + row, 4294967295 - (winner & 4294967295))


@triton.jit
def _noise_error_kernel(error_ptr, LIBDEVICE: tl.constexpr, BLOCK: tl.constexpr):
    draws = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)      # the 23 bits u is made of
    bits = draws.to(tl.uint32) << 9
    error = tl.abs(_gumbel_fast(bits, LIBDEVICE) - _gumbel_exact(bits, LIBDEVICE))
    tl.store(error_ptr + tl.program_id(0), tl.max(error, axis=0))


def gumbel_fast_error(device: Union[str, torch.device] = "cuda") -> float:
    """Largest ``|g_fast - g_exact|`` over all 2**23 noise inputs, as compiled for ``device``.

    The filter of sampled rows is exact only while this stays below
    ``NOISE_ERROR_LIMIT``; it is a property of the device's ``lg2.approx``.
    """
    block = 1 << 14
    errors = torch.empty((1 << 23) // block, dtype=torch.float32, device=device)
    _noise_error_kernel[(errors.numel(),)](errors, LIBDEVICE=errors.device.type == "cuda",
                                           BLOCK=block)
    return float(errors.max())


def sample_sequential_triton(base_logits: torch.Tensor, anchor_tokens: torch.Tensor,
                             markov_head: nn.Module, temperature: Union[float, torch.Tensor],
                             seeds: torch.Tensor, positions: Optional[torch.Tensor] = None,
                             *, block_v: int = BLOCK_V, num_warps: int = NUM_WARPS,
                             max_candidates: int = MAX_CANDIDATES,
                             blocks_per_program: Optional[int] = None,
                             _approx_wobble: float = 0.0) -> torch.Tensor:
    """``sample_sequential`` with one fused kernel per step; ``[R, N]`` int64 tokens.

    Launch knobs (the tokens do not depend on them): ``block_v`` (a power of
    two >= 128) vocabulary entries per block, ``blocks_per_program`` (an int >= 1)
    blocks read in turn by one program (default: ``GREEDY_BLOCKS_PER_PROGRAM`` when
    ``temperature`` is the number 0, else ``BLOCKS_PER_PROGRAM``; H200 sweep),
    ``num_warps`` (1, 2, 4, 8 or 16) and ``max_candidates`` (an int >= 0: a program
    whose filter leaves at most this many candidates, one per lane, computes them one
    at a time, else every token's exact value). ``_approx_wobble`` is for tests
    (``_markov_step_kernel``).
    """
    if not isinstance(block_v, int) or block_v < 128 or block_v & (block_v - 1):
        raise ValueError(f"block_v={block_v!r} is invalid: expected a power of two >= 128")
    if num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"num_warps={num_warps!r} is invalid: expected 1, 2, 4, 8 or 16")
    if not isinstance(max_candidates, int) or isinstance(max_candidates, bool) \
            or max_candidates < 0:
        raise ValueError(f"max_candidates={max_candidates!r} is invalid: expected an int >= 0")
    if blocks_per_program is not None and (
            not isinstance(blocks_per_program, int) or isinstance(blocks_per_program, bool)
            or blocks_per_program < 1):
        raise ValueError(f"blocks_per_program={blocks_per_program!r} is invalid: expected an "
                         f"int >= 1 or None")
    temperature, positions, greedy_only = check_sampling_args(base_logits, anchor_tokens,
                                                              temperature, seeds, positions)
    if blocks_per_program is None:
        blocks_per_program = GREEDY_BLOCKS_PER_PROGRAM if greedy_only else BLOCKS_PER_PROGRAM
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
    span = block_v * blocks_per_program
    grid = (num_reqs, triton.cdiv(vocab, span))
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
            seeds, positions, step, step_best, step_arrivals, step_tokens, vocab, span,
            SAMPLE=not greedy_only, LIBDEVICE=device.type == "cuda", BLOCK=block_v,
            MAX_CANDIDATES=max_candidates, APPROX_WOBBLE=float(_approx_wobble), num_warps=num_warps)
        prev = step_tokens
    return tokens.t().contiguous()
