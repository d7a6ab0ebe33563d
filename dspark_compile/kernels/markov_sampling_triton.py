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

Sampled rows filter before they compute ``exact``. Every token gets a cheap upper
bound ``upper = logits * div_rn(1, T) + g_upper`` with no transcendental function:
``g <= -ln(1 - u)``, and ``-log2`` of a float is bounded by reading its bits as a
number (``_gumbel_upper``; in the Gumbel tail it exceeds ``g`` by at most about 0.06).
``exact <= upper + _ABS + _REL * |upper|``: ``_ABS`` is 16x ``NOISE_SHORTFALL_LIMIT``,
which bounds what float roundings and ``logf`` take from ``g_upper`` over all 2**23
possible noise inputs (``gumbel_upper_error`` measures it; a test checks it on the
device it runs on), and ``_REL`` (2**-19) covers the roundings of ``1/T``, the product
and the sums (3 x 2**-24 of ``|logits / T|``).

Program (row, part) reads ``blocks_per_program`` blocks of ``BLOCK_V`` tokens in turn,
``num_stages`` whole blocks' loads in flight (a software pipeline; only a partial last
block is masked). Lane ``p`` of a block sees the program's tokens ``p, p + BLOCK_V,
...`` in increasing order and keeps, with no cross-lane work until the span is done,
its best value and that value's first token (greedy rows: the logit; sampled rows:
``upper``, and also its second best ``upper``). Then one reduction gives the program's
best. Sampled rows: the token of the largest ``upper`` (the pivot) gets ``exact``; the
candidates are the lanes' best tokens whose ``upper`` can still reach it. If there are
1..``max_candidates`` of them (the pivot included) and no lane's second best is a
candidate, they get ``exact`` one at a time in index order; otherwise (more
candidates, a lane holding two, or the largest ``upper`` or the pivot's ``exact`` not
finite or beyond 2**100) every token of the span gets ``exact``. Either way the
program's (value, index) is the one ``exact`` defines. The program merges it into the
row's winner with one relaxed 64-bit ``atomic_max`` on a key that orders by value,
then by lower index. The row's last program to finish (an acquire-release
``atomic_add`` counter) decodes the winner and writes the token, which is the next
step's ``prev``: one launch per step besides the head. No host synchronisation: the
whole draft block captures as one CUDA graph. Logits must not hold NaN
(``torch.argmax`` would pick the NaN; this kernel does not).
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import triton
import triton.language as tl
from torch import nn
from triton.language.extra import libdevice

from dspark_compile.kernels.sampling_args import check_sampling_args, kernel_sampling_inputs

BLOCK_V = 2048  # H200 sweeps (benchmarks/results/2026-12-01/2026-12-01-h200-session11.md)
NUM_WARPS = 8
NUM_STAGES = 4  # whole blocks whose loads are in flight (software-pipelined)
MAX_CANDIDATES = 8
BLOCKS_PER_PROGRAM = 16  # rows that sample (fewer, longer programs: faster there)
GREEDY_BLOCKS_PER_PROGRAM = 8  # calls whose temperature is the number 0
_NO_TOKEN = tl.constexpr(2147483647)
_LN2 = tl.constexpr(0.6931471805599453)
NOISE_SHORTFALL_LIMIT = 2.0**-16  # gumbel_upper_error()'s shortfall stays below
UPPER_ABS_SLACK = 16 * NOISE_SHORTFALL_LIMIT  # exact <= upper + this + _REL * |upper|
_ABS = tl.constexpr(UPPER_ABS_SLACK)
_REL = tl.constexpr(2.0**-19)
_FINITE_LIMIT = tl.constexpr(2.0**100)


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
def _gumbel_upper(bits):
    """An upper bound of ``_gumbel_exact(bits)`` (to ``NOISE_SHORTFALL_LIMIT``), from
    integer and FMA arithmetic only: with ``x = 1 - u``, ``-ln u >= x`` gives
    ``g <= -ln x = ln2 * -log2 x``, and reading x's float bits as a number,
    ``127 - bits(x) / 2**23 = -(e + f) >= -log2 x`` for ``x = 2**e * (1 + f)``.
    In the Gumbel tail (x small) it exceeds ``g`` by at most ``0.06 + x``."""
    one_to_two = ((bits >> 9) | 0x3F800000).to(tl.float32, bitcast=True)  # 1 + k / 2**23
    below_one = (2.0 - one_to_two) - 1.0 / 16777216.0  # 1 - u = (2**24 - 2k - 1) / 2**24
    neg_log2_scaled = 0x3F800000 - below_one.to(tl.int32, bitcast=True)  # (-e - f) * 2**23
    return neg_log2_scaled.to(tl.float32) * (_LN2 / 8388608.0)


@triton.jit
def _block_argmax(value, tokens):
    """(max, first index of the max) of a block; ``value`` -inf off the vocabulary."""
    best = tl.max(value, axis=0)
    return best, tl.min(tl.where(value == best, tokens, _NO_TOKEN), axis=0)


@triton.jit
def _exact_value(logit, token, key, temperature, LIBDEVICE: tl.constexpr):
    """``div_rn(logit, T) + noise`` as the reference computes it; -0.0 made +0.0."""
    return (
        tl.math.div_rn(logit, temperature) + _gumbel_exact(_noise_bits(key, token), LIBDEVICE) + 0.0
    )


@triton.jit
def _merge(best, first, value, token):
    """The better of two (value, token) pairs: larger value, then lower token."""
    better = (value > best) | ((value == best) & (token < first))
    return tl.where(better, value, best), tl.where(better, token, first)


@triton.jit
def _exact_at(row_logits, row_bias, token, key, temperature, LIBDEVICE: tl.constexpr):
    """``exact`` of one token of the row."""
    logit = tl.load(row_logits + token).to(tl.float32) + tl.load(row_bias + token).to(tl.float32)
    return _exact_value(logit, token, key, temperature, LIBDEVICE)


@triton.jit
def _candidates_argmax(
    candidate, tokens, best, first, row_logits, row_bias, key, temperature, LIBDEVICE: tl.constexpr
):
    """(max, first token of the max) of (best, first) and ``exact`` over the candidates,
    taken one at a time in index order."""
    token = tl.min(tl.where(candidate, tokens, _NO_TOKEN), axis=0)
    while token < _NO_TOKEN:
        best, first = _merge(
            best, first, _exact_at(row_logits, row_bias, token, key, temperature, LIBDEVICE), token
        )
        token = tl.min(tl.where(candidate & (tokens > token), tokens, _NO_TOKEN), axis=0)
    return best, first


@triton.jit
def _exact_span_argmax(
    row_logits,
    row_bias,
    start,
    stop,
    key,
    temperature,
    BLOCK: tl.constexpr,
    LIBDEVICE: tl.constexpr,
):
    """(max, first token of the max) of every token's ``exact`` in ``[start, stop)``."""
    best = tl.full([], float("-inf"), tl.float32)
    first = tl.full([], _NO_TOKEN, tl.int32)
    for block_start in range(start, stop, BLOCK):
        tokens = block_start + tl.arange(0, BLOCK)
        in_vocab = tokens < stop
        logits = tl.load(row_logits + tokens, mask=in_vocab, other=0.0).to(tl.float32) + tl.load(
            row_bias + tokens, mask=in_vocab, other=0.0
        ).to(tl.float32)
        exact = tl.math.div_rn(logits, temperature) + _gumbel_exact(
            _noise_bits(key, tokens), LIBDEVICE
        )
        block_best, block_first = _block_argmax(
            tl.where(in_vocab, exact + 0.0, float("-inf")), tokens
        )
        best, first = _merge(best, first, block_best, block_first)
    return best, first


@triton.jit
def _order_key(value, token):
    """An int64 key that orders (value, token) by value, then by the lower token."""
    bits = value.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF).to(tl.int64)
    return (ordered << 32) | (4294967295 - token.to(tl.int64))


@triton.jit
def _key_value(key):
    """The value of an ``_order_key``."""
    ordered = (key >> 32).to(tl.int32)
    return tl.where(ordered >= 0, ordered, ordered ^ 0x7FFFFFFF).to(tl.float32, bitcast=True)


@triton.jit
def _key_token(key):
    """The token of an ``_order_key``."""
    return 4294967295 - (key & 4294967295)


@triton.jit
def _sampled_lanes_key(
    top,
    top_token,
    top_logit,
    second,
    row_logits,
    row_bias,
    start,
    stop,
    key,
    temperature,
    BLOCK: tl.constexpr,
    MAX_CANDIDATES: tl.constexpr,
    LIBDEVICE: tl.constexpr,
):
    """The program's ``_order_key`` of (max, first token of the max) of ``exact``, from
    each lane's best ``upper`` (``top``, at ``top_token``, whose logit is ``top_logit``)
    and second best (``second``).

    The pivot (the first token of the largest ``top``) gets ``exact``; a token is a
    candidate when its ``upper`` can still reach the pivot's (module docstring). When
    no lane's second best is a candidate, the candidates are the lanes' best tokens
    whose ``top`` is: if the pivot is the only one, it wins; 2..MAX_CANDIDATES of them
    get ``exact`` one at a time in index order. Otherwise (more candidates, a lane with
    two, or the largest ``top`` or the pivot's ``exact`` not finite or beyond 2**100)
    every token of the span gets it."""
    keys = _order_key(top, top_token)
    pivot_key = tl.max(keys, axis=0)
    pivot_logit = tl.max(tl.where(keys == pivot_key, top_logit, float("-inf")), axis=0)
    best_upper = _key_value(pivot_key)
    pivot = _key_token(pivot_key).to(tl.int32)
    pivot_value = _exact_value(pivot_logit, pivot, key, temperature, LIBDEVICE)
    usable = (tl.abs(best_upper) < _FINITE_LIMIT) & (tl.abs(pivot_value) < _FINITE_LIMIT)
    floor = tl.where(usable, pivot_value - _ABS, float("nan"))  # NaN: no candidates
    # at -inf, -inf + inf is NaN: never a candidate (its exact value is -inf too)
    candidate = top + _REL * tl.abs(top) >= floor
    crowded = second + _REL * tl.abs(second) >= floor
    tally = tl.sum(candidate.to(tl.int32) + (crowded.to(tl.int32) << 16), axis=0)
    count = tally & 65535
    pivot_alone = (count == 1) & (best_upper + _REL * tl.abs(best_upper) >= floor)
    if (tally < 65536) & (count >= 1) & (count <= MAX_CANDIDATES):
        if pivot_alone:
            result = _order_key(pivot_value, pivot)
        else:
            best, first = _candidates_argmax(
                candidate & (top_token != pivot),
                top_token,
                pivot_value,
                pivot,
                row_logits,
                row_bias,
                key,
                temperature,
                LIBDEVICE,
            )
            result = _order_key(best, first)
    else:
        best, first = _exact_span_argmax(
            row_logits, row_bias, start, stop, key, temperature, BLOCK, LIBDEVICE
        )
        result = _order_key(best, first)
    return result


@triton.jit
def _fold_block(
    top,
    top_token,
    top_logit,
    second,
    logits,
    tokens,
    stop,
    key,
    inverse_temperature,
    sampled,
    SAMPLE: tl.constexpr,
    MASKED: tl.constexpr,
    WOBBLE_DOWN: tl.constexpr,
    WOBBLE_UP: tl.constexpr,
):
    """Each lane's state after one more token: ``value`` is ``upper`` on sampled rows,
    else the logit (+0.0 for -0.0); -inf off the vocabulary. Strict ``>``: a lane keeps
    its first maximum."""
    if SAMPLE:
        if sampled:
            value = logits * inverse_temperature + _gumbel_upper(_noise_bits(key, tokens))
            if (WOBBLE_DOWN != 0.0) | (WOBBLE_UP != 0.0):
                up = (_mix32(tokens.to(tl.uint32) ^ 0x9E3779B9) & 1) == 1
                value += tl.where(up, WOBBLE_UP, -WOBBLE_DOWN)
        else:
            value = logits + 0.0
    else:
        value = logits + 0.0
    if MASKED:
        value = tl.where(tokens < stop, value, float("-inf"))
    if SAMPLE:
        second = tl.maximum(second, tl.minimum(value, top))
    take = value > top
    top_token = tl.where(take, tokens, top_token)
    if SAMPLE:
        top_logit = tl.where(take, logits, top_logit)
    return tl.where(take, value, top), top_token, top_logit, second


@triton.jit
def _scan_lanes(
    row_logits,
    row_bias,
    start,
    stop,
    key,
    inverse_temperature,
    sampled,
    SAMPLE: tl.constexpr,
    BLOCK: tl.constexpr,
    STAGES: tl.constexpr,
    WOBBLE_DOWN: tl.constexpr,
    WOBBLE_UP: tl.constexpr,
):
    """Lane state (best value, its first token, its logit, second best) over tokens
    ``[start, stop)``: whole blocks unmasked, their loads software-pipelined STAGES deep
    (asynchronous copies through shared memory on CUDA), then a masked partial block."""
    top = tl.full([BLOCK], float("-inf"), tl.float32)
    top_token = start + tl.arange(0, BLOCK)  # a lane with no finite value keeps its first
    top_logit = tl.zeros([BLOCK], tl.float32)
    second = tl.full([BLOCK], float("-inf"), tl.float32)
    whole = (stop - start) // BLOCK
    for block in tl.range(0, whole, num_stages=STAGES):
        tokens = start + block * BLOCK + tl.arange(0, BLOCK)
        logits = tl.load(row_logits + tokens).to(tl.float32) + tl.load(row_bias + tokens).to(
            tl.float32
        )
        top, top_token, top_logit, second = _fold_block(
            top,
            top_token,
            top_logit,
            second,
            logits,
            tokens,
            stop,
            key,
            inverse_temperature,
            sampled,
            SAMPLE,
            False,
            WOBBLE_DOWN,
            WOBBLE_UP,
        )
    tokens = start + whole * BLOCK + tl.arange(0, BLOCK)
    if start + whole * BLOCK < stop:
        in_vocab = tokens < stop
        logits = tl.load(row_logits + tokens, mask=in_vocab, other=0.0).to(tl.float32) + tl.load(
            row_bias + tokens, mask=in_vocab, other=0.0
        ).to(tl.float32)
        top, top_token, top_logit, second = _fold_block(
            top,
            top_token,
            top_logit,
            second,
            logits,
            tokens,
            stop,
            key,
            inverse_temperature,
            sampled,
            SAMPLE,
            True,
            WOBBLE_DOWN,
            WOBBLE_UP,
        )
    return top, top_token, top_logit, second


@triton.jit(do_not_specialize=["step"])
def _markov_step_kernel(
    base_ptr,
    base_stride,
    bias_ptr,
    bias_stride,
    temp_ptr,
    seed_ptr,
    pos_ptr,
    step,
    best_ptr,
    count_ptr,
    token_ptr,
    vocab,
    span,
    SAMPLE: tl.constexpr,
    LIBDEVICE: tl.constexpr,
    BLOCK: tl.constexpr,
    MAX_CANDIDATES: tl.constexpr,
    STAGES: tl.constexpr,
    WOBBLE_DOWN: tl.constexpr,
    WOBBLE_UP: tl.constexpr,
):
    """Program (row, part) reduces tokens ``[part * span, min((part + 1) * span, vocab))``
    in blocks of BLOCK, then merges its (value, token) into the row's.

    Lane ``p`` of the block sees tokens ``start + p + k * BLOCK`` in increasing order
    and keeps its best value and that value's first token (greedy rows: the logit;
    sampled rows: ``upper``, its logit, and the second best ``upper``). No cross-lane
    work happens until the span is done; only a span's last, partial block masks its
    loads. WOBBLE_DOWN / WOBBLE_UP (tests only; 0 otherwise) move each ``upper`` down
    or up by that much, to check that any bound within the slack gives the same tokens.
    """
    row = tl.program_id(0).to(tl.int64)
    start = tl.program_id(1) * span
    stop = tl.minimum(start + span, vocab)
    row_logits = base_ptr + row * base_stride
    row_bias = bias_ptr + row * bias_stride
    sampled = False
    key = 0
    temperature = 1.0
    inverse_temperature = 1.0
    if SAMPLE:
        temperature = tl.load(temp_ptr + row)
        sampled = temperature != 0.0
        inverse_temperature = tl.math.div_rn(1.0, temperature)
        key = _row_key(
            tl.load(seed_ptr + row).to(tl.int64), tl.load(pos_ptr + row).to(tl.int64) + step
        )
    top, top_token, top_logit, second = _scan_lanes(
        row_logits,
        row_bias,
        start,
        stop,
        key,
        inverse_temperature,
        sampled,
        SAMPLE,
        BLOCK,
        STAGES,
        WOBBLE_DOWN,
        WOBBLE_UP,
    )
    if SAMPLE:
        if sampled:
            packed = _sampled_lanes_key(
                top,
                top_token,
                top_logit,
                second,
                row_logits,
                row_bias,
                start,
                stop,
                key,
                temperature,
                BLOCK,
                MAX_CANDIDATES,
                LIBDEVICE,
            )
        else:
            packed = tl.max(_order_key(top, top_token), axis=0)
    else:
        packed = tl.max(_order_key(top, top_token), axis=0)
    tl.atomic_max(best_ptr + row, packed, sem="relaxed")
    # acq_rel: the last arrival sees every program's atomic_max of this row
    if tl.atomic_add(count_ptr + row, 1, sem="acq_rel") == tl.num_programs(1) - 1:
        winner = tl.atomic_max(best_ptr + row, packed, sem="relaxed")  # the row's final key
        tl.store(token_ptr + row, _key_token(winner))


@triton.jit
def _noise_bound_kernel(out_ptr, TAIL: tl.constexpr, LIBDEVICE: tl.constexpr, BLOCK: tl.constexpr):
    draws = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # the 23 bits u is made of
    bits = draws.to(tl.uint32) << 9
    exact = _gumbel_exact(bits, LIBDEVICE)
    excess = _gumbel_upper(bits) - exact
    tl.store(out_ptr + 2 * tl.program_id(0), tl.max(-excess, axis=0))
    tl.store(
        out_ptr + 2 * tl.program_id(0) + 1,
        tl.max(tl.where(exact > TAIL, excess, float("-inf")), axis=0),
    )


def gumbel_upper_error(
    device: Union[str, torch.device] = "cuda", tail: float = 4.0
) -> tuple[float, float]:
    """``(shortfall, tail_excess)`` of ``g_upper`` over all 2**23 noise inputs, as
    compiled for ``device``: the largest ``g_exact - g_upper`` (negative: the bound
    holds with room to spare), and the largest ``g_upper - g_exact`` where
    ``g_exact > tail`` (how tight the filter is where winners come from).

    The filter of sampled rows is exact only while the shortfall stays below
    ``NOISE_SHORTFALL_LIMIT``: ``g_upper`` is a bound in real arithmetic, and this
    measures what its float roundings and the device's ``logf`` take from it.
    """
    block = 1 << 14
    out = torch.empty(((1 << 23) // block, 2), dtype=torch.float32, device=device)
    _noise_bound_kernel[(out.shape[0],)](
        out, TAIL=float(tail), LIBDEVICE=out.device.type == "cuda", BLOCK=block
    )
    shortfall, tail_excess = out.max(dim=0).values.tolist()
    return shortfall, tail_excess


def sample_sequential_triton(
    base_logits: torch.Tensor,
    anchor_tokens: torch.Tensor,
    markov_head: nn.Module,
    temperature: Union[float, torch.Tensor],
    seeds: torch.Tensor,
    positions: Optional[torch.Tensor] = None,
    *,
    block_v: int = BLOCK_V,
    num_warps: int = NUM_WARPS,
    max_candidates: int = MAX_CANDIDATES,
    blocks_per_program: Optional[int] = None,
    num_stages: int = NUM_STAGES,
    _bound_wobble: tuple[float, float] = (0.0, 0.0),
) -> torch.Tensor:
    """``sample_sequential`` with one fused kernel per step; ``[R, N]`` int64 tokens.

    Launch knobs (the tokens do not depend on them): ``block_v`` (a power of
    two >= 128) vocabulary entries per block, ``blocks_per_program`` (an int >= 1)
    blocks read in turn by one program (default: ``GREEDY_BLOCKS_PER_PROGRAM`` when
    ``temperature`` is the number 0, else ``BLOCKS_PER_PROGRAM``; H200 sweep),
    ``num_warps`` (1, 2, 4, 8 or 16), ``num_stages`` (an int >= 1: whole blocks whose
    loads are in flight at once) and ``max_candidates`` (an int >= 0: a program
    whose filter leaves at most this many candidates, one per lane, computes them one
    at a time, else every token's exact value). ``_bound_wobble`` is for tests
    (``_markov_step_kernel``).
    """
    if not isinstance(block_v, int) or block_v < 128 or block_v & (block_v - 1):
        raise ValueError(f"block_v={block_v!r} is invalid: expected a power of two >= 128")
    if num_warps not in (1, 2, 4, 8, 16):
        raise ValueError(f"num_warps={num_warps!r} is invalid: expected 1, 2, 4, 8 or 16")
    if (
        not isinstance(max_candidates, int)
        or isinstance(max_candidates, bool)
        or max_candidates < 0
    ):
        raise ValueError(f"max_candidates={max_candidates!r} is invalid: expected an int >= 0")
    if not isinstance(num_stages, int) or isinstance(num_stages, bool) or num_stages < 1:
        raise ValueError(f"num_stages={num_stages!r} is invalid: expected an int >= 1")
    if blocks_per_program is not None and (
        not isinstance(blocks_per_program, int)
        or isinstance(blocks_per_program, bool)
        or blocks_per_program < 1
    ):
        raise ValueError(
            f"blocks_per_program={blocks_per_program!r} is invalid: expected an int >= 1 or None"
        )
    temperature, positions, greedy_only = check_sampling_args(
        base_logits, anchor_tokens, temperature, seeds, positions
    )
    if blocks_per_program is None:
        blocks_per_program = GREEDY_BLOCKS_PER_PROGRAM if greedy_only else BLOCKS_PER_PROGRAM
    num_reqs, num_steps, vocab = base_logits.shape
    device = base_logits.device
    if num_steps == 0 or num_reqs == 0:
        return torch.empty((num_reqs, num_steps), dtype=torch.int64, device=device)
    base_logits, seeds, positions = kernel_sampling_inputs(base_logits, seeds, positions)
    packed = torch.full(
        (num_steps, num_reqs), torch.iinfo(torch.int64).min, dtype=torch.int64, device=device
    )
    arrivals = torch.zeros((num_steps, num_reqs), dtype=torch.int32, device=device)
    tokens = torch.empty((num_steps, num_reqs), dtype=torch.int64, device=device)
    prev = anchor_tokens.to(torch.int64)
    span = block_v * blocks_per_program
    grid = (num_reqs, triton.cdiv(vocab, span))
    step_views = zip(
        base_logits.unbind(1), packed.unbind(0), arrivals.unbind(0), tokens.unbind(0)
    )  # host: one call per tensor
    for step, (step_base, step_best, step_arrivals, step_tokens) in enumerate(step_views):
        bias = markov_head(prev)
        if tuple(bias.shape) != (num_reqs, vocab):
            raise ValueError(
                f"markov_head returned shape {tuple(bias.shape)}: expected [{num_reqs}, {vocab}]"
            )
        bias = bias if bias.stride(1) == 1 else bias.contiguous()
        _markov_step_kernel[grid](
            step_base,
            base_logits.stride(0),
            bias,
            bias.stride(0),
            temperature,
            seeds,
            positions,
            step,
            step_best,
            step_arrivals,
            step_tokens,
            vocab,
            span,
            SAMPLE=not greedy_only,
            LIBDEVICE=device.type == "cuda",
            BLOCK=block_v,
            MAX_CANDIDATES=max_candidates,
            STAGES=num_stages,
            WOBBLE_DOWN=float(_bound_wobble[0]),
            WOBBLE_UP=float(_bound_wobble[1]),
            num_warps=num_warps,
        )
        prev = step_tokens
    return tokens.t().contiguous()
