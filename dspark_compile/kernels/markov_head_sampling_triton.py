"""Markov-head sampling with the head's low-rank bias computed in the kernel.

``sample_sequential_factors_triton`` is ``markov_head_sample_ref`` for a low-rank head
``(embed, weight)`` with float16 or bfloat16 factors (``sample_sequential_head_triton``:
``sample_sequential`` for a ``DSparkMarkovHead``, through its ``low_rank_factors()``;
``markov_head_sample_triton``: ``dspark::markov_head_sample`` on CUDA, the reference
for other dtypes), in one kernel launch per step and nothing else: no embedding lookup,
no GEMM launch, no ``[R, V]`` bias in memory.
Program (row block, part) takes up to ``BLOCK_R`` rows and the vocabulary tiles
``[part * tiles, (part + 1) * tiles)`` of ``BLOCK_V`` tokens. For each tile it computes

    bias = round_to_head_dtype(embed[prev] @ weight[tile]^T)   # fp32 accumulation
    logits = base_logits[rows, i, tile].float() + bias.float()

on tensor cores, so a step reads the head's ``[V, r]`` weight once for all the rows of
a block, and the base logits once. Greedy rows take the argmax of the logits. Sampled
rows take the argmax of ``exact = div_rn(logits, T) + g``, ``g`` the noise of
``gumbel_noise`` regenerated from (seed, position, token), and filter first: every
token gets ``fast = logits * div_rn(1, T) + g_fast`` (hardware ``lg2``; within
``NOISE_ERROR_LIMIT`` of ``g`` over all 2**23 noise inputs, which
``gumbel_fast_error`` measures on the device), and only the tokens whose ``fast``
can still reach the best get ``exact`` (``_filtered_rows``). The first maximal index
wins, as in ``torch.argmax``. Each program merges its rows' (value, token) into the
rows' winners with one relaxed 64-bit ``atomic_max`` per row on ``_order_key``; the
row block's last program to finish (acquire-release counter) writes the tokens, which
are the next step's ``prev``. No host synchronisation: the draft block captures as
one CUDA graph.

Exactness: the tokens are ``sample_sequential``'s whenever this bias equals
``markov_head(prev)`` bit for bit. It sums the rank's products in fp32 in increasing
order (tensor-core ``k``-steps; the interpreter widens to fp32 first) and rounds to
the head's dtype to nearest-even, as a GEMM without split-K does.
``markov_head_bias_triton`` returns this bias, so a caller can compare it with the
module on its own device and library; ``benchmarks/bench_dspark_kernels.py`` does so
and records the result. Where the two differ, they differ in the last place of a
bias, and a token differs only where its row's top two values are that close. Logits
must not hold NaN (``torch.argmax`` would pick the NaN; this kernel does not).
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import triton
import triton.language as tl
from torch import nn
from triton.language.extra import libdevice

from dspark_compile.kernels.markov_sampling import markov_head_sample_ref
from dspark_compile.kernels.markov_sampling_triton import (
    _FINITE_LIMIT,
    _LN2,
    _NO_TOKEN,
    _REL,
    _exact_value,
    _gumbel_exact,
    _key_token,
    _merge,
    _mix32,
    _noise_bits,
    _order_key,
    _row_key,
)
from dspark_compile.kernels.sampling_args import check_head_sampling_args, kernel_sampling_inputs

BLOCK_R = 64  # rows per program: one warpgroup's tensor-core tile
BLOCK_V = 32  # tokens per tile (H200 sweep,
TILES_PER_PROGRAM = 16  # benchmarks/results/2026-12-01/2026-12-01-h200-session12.md)
NUM_WARPS = 4
NUM_STAGES = 3  # tiles whose loads are in flight (software-pipelined)
_HEAD_DTYPES = (torch.float16, torch.bfloat16)
NOISE_ERROR_LIMIT = 2.0**-16  # gumbel_fast_error() stays below (H200: 9.1e-6)
_FAST_ABS = tl.constexpr(2 * NOISE_ERROR_LIMIT)  # |exact - fast| <= this + _REL * |fast|
_SERIES_BELOW = tl.constexpr(2.0**-8)  # 1 - u below this: -ln(u) by its series


@triton.jit
def _tile_bias(
    embedded, weight_ptr, weight_stride, tokens, in_vocab, ranks, rank, TENSOR_CORES: tl.constexpr
):
    """``[rows, BLOCK_V]`` bias of one tile, rounded to the weight's dtype then widened
    to fp32: ``embedded [rows, K] @ weight[tokens, :K]^T`` with fp32 accumulation.
    Without TENSOR_CORES (the interpreter, whose bf16 ``dot`` misreads its
    inputs and whose bf16 cast truncates) the operands are widened first (their
    products are exact in fp32 either way) and bf16 rounds by ``_bf16_nearest_even``."""
    weight = tl.load(
        weight_ptr + tokens[:, None].to(tl.int64) * weight_stride + ranks[None, :],
        mask=in_vocab[:, None] & (ranks[None, :] < rank),
        other=0.0,
    )
    if TENSOR_CORES:
        product = tl.dot(embedded, tl.trans(weight), out_dtype=tl.float32)
    else:
        product = tl.dot(
            embedded.to(tl.float32), tl.trans(weight.to(tl.float32)), input_precision="ieee"
        )
    if TENSOR_CORES or weight_ptr.dtype.element_ty != tl.bfloat16:
        return product.to(weight_ptr.dtype.element_ty).to(tl.float32)
    else:
        return _bf16_nearest_even(product)


@triton.jit
def _bf16_nearest_even(x):
    """fp32 -> bf16 -> fp32 rounding to nearest, ties to even (the interpreter's cast
    truncates); inf stays inf, large finite values round to inf. No NaN inputs."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def _embedded_rows(embed_ptr, embed_stride, prev_ptr, rows, row_ok, ranks, rank):
    """``embed[prev[rows]]``: ``[rows, K]`` in the embedding's dtype, 0 past the rank."""
    prev = tl.load(prev_ptr + rows, mask=row_ok, other=0).to(tl.int64)
    return tl.load(
        embed_ptr + prev[:, None] * embed_stride + ranks[None, :],
        mask=row_ok[:, None] & (ranks[None, :] < rank),
        other=0.0,
    )


@triton.jit
def _tile_logits(
    tile,
    row_logits,
    row_ok,
    embedded,
    weight_ptr,
    weight_stride,
    vocab,
    ranks,
    rank,
    BLOCK_V: tl.constexpr,
    TENSOR_CORES: tl.constexpr,
):
    """``(logits [rows, BLOCK_V] fp32, tokens [BLOCK_V], in_vocab)`` of one tile:
    ``base.float() + bias.float()``."""
    tokens = tile * BLOCK_V + tl.arange(0, BLOCK_V)
    in_vocab = tokens < vocab
    bias = _tile_bias(
        embedded, weight_ptr, weight_stride, tokens, in_vocab, ranks, rank, TENSOR_CORES
    )
    base = tl.load(
        row_logits[:, None] + tokens[None, :], mask=row_ok[:, None] & in_vocab[None, :], other=0.0
    ).to(tl.float32)
    return base + bias, tokens, in_vocab


@triton.jit
def _exact_rows(
    first_tile,
    last_tile,
    row_logits,
    row_ok,
    embedded,
    weight_ptr,
    weight_stride,
    vocab,
    ranks,
    rank,
    key,
    temperature,
    sampled,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    SAMPLE: tl.constexpr,
    LIBDEVICE: tl.constexpr,
    STAGES: tl.constexpr,
):
    """Per row (max, first token of the max) over tiles ``[first_tile, last_tile)`` of
    every token's value: the logit (+0.0 for -0.0) on greedy rows, else
    ``div_rn(logit, T) + g``."""
    best = tl.full([BLOCK_R], float("-inf"), tl.float32)
    first = tl.full([BLOCK_R], _NO_TOKEN, tl.int32)
    for tile in tl.range(first_tile, last_tile, num_stages=STAGES):
        logits, tokens, in_vocab = _tile_logits(
            tile,
            row_logits,
            row_ok,
            embedded,
            weight_ptr,
            weight_stride,
            vocab,
            ranks,
            rank,
            BLOCK_V,
            LIBDEVICE,
        )
        value = logits + 0.0
        if SAMPLE:
            exact = _exact_value(
                logits, tokens[None, :], key[:, None], temperature[:, None], LIBDEVICE
            )
            value = tl.where(sampled[:, None], exact, value)
        tile_best, tile_first = _rows_argmax_tokens(
            tl.where(in_vocab[None, :], value, float("-inf")), tokens[None, :]
        )
        best, first = _merge(best, first, tile_best, tile_first)
    return best, first


@triton.jit
def _gumbel_fast(bits, LIBDEVICE: tl.constexpr):
    """``_gumbel_exact(bits)`` to within ``NOISE_ERROR_LIMIT`` (``gumbel_fast_error``):
    hardware ``lg2.approx`` on CUDA, and near ``u = 1`` the series of ``-ln u``."""
    one_to_two = ((bits >> 9) | 0x3F800000).to(tl.float32, bitcast=True)  # 1 + k / 2**23
    uniform = one_to_two - (1.0 - 1.0 / 16777216.0)  # exact
    below_one = 1.0 - uniform  # exact where the series is used
    # -log2(u) = (x + x**2/2 + x**3/3 + ...) / ln 2 for x = 1 - u
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
def _within(value):
    """The largest ``exact`` a token whose filter value is ``value`` can have (-inf
    stays -inf)."""
    finite = tl.where(value == float("-inf"), 0.0, value)
    return tl.where(value == float("-inf"), value, finite + _FAST_ABS + _REL * tl.abs(finite))


@triton.jit
def _filtered_rows(
    first_tile,
    last_tile,
    row_logits,
    row_ok,
    embedded,
    weight_ptr,
    weight_stride,
    vocab,
    ranks,
    rank,
    key,
    temperature,
    sampled,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    LIBDEVICE: tl.constexpr,
    STAGES: tl.constexpr,
    WOBBLE_DOWN: tl.constexpr,
    WOBBLE_UP: tl.constexpr,
):
    """``_exact_rows`` for SAMPLE, with ``exact`` only where the filter needs it.

    Each token gets ``fast = logit * div_rn(1, T) + _gumbel_fast``, within
    ``_FAST_ABS + _REL * |fast|`` of ``exact`` (the logit on greedy rows). Lane
    (row, p) sees the row's tokens ``p, p + BLOCK_V, ...`` of the span in increasing
    order and keeps its best ``fast``, that value's first token and logit, and its
    second best. At the end the pivot (a largest best) gets ``exact``; the row's
    candidates are the lanes' best tokens whose ``fast`` can still reach it. If any row
    has one, every lane's best gets ``exact``, and the row takes the largest (then the
    lowest token). A sampled row whose ``exact`` is not finite, or one of whose lanes'
    second best can reach it, takes ``_exact_rows`` over the span again (rare: two
    tokens of one lane within about ``2 * _FAST_ABS``). WOBBLE_DOWN / WOBBLE_UP (tests
    only; 0 otherwise) move each ``fast`` down or up by that much, to check that any value
    within the slack gives the same tokens. Returns (best, first, rescanned rows)."""
    top = tl.full([BLOCK_R, BLOCK_V], float("-inf"), tl.float32)
    # a lane with no finite value keeps its first token
    top_token = (
        tl.zeros([BLOCK_R, BLOCK_V], tl.int32)
        + (first_tile * BLOCK_V + tl.arange(0, BLOCK_V))[None, :]
    )
    top_logit = tl.zeros([BLOCK_R, BLOCK_V], tl.float32)
    second = tl.full([BLOCK_R, BLOCK_V], float("-inf"), tl.float32)
    inverse_temperature = tl.math.div_rn(1.0, temperature)
    for tile in tl.range(first_tile, last_tile, num_stages=STAGES):
        logits, tokens, in_vocab = _tile_logits(
            tile,
            row_logits,
            row_ok,
            embedded,
            weight_ptr,
            weight_stride,
            vocab,
            ranks,
            rank,
            BLOCK_V,
            LIBDEVICE,
        )
        bits = _noise_bits(key[:, None], tokens[None, :])
        fast = logits * inverse_temperature[:, None] + _gumbel_fast(bits, LIBDEVICE)
        if (WOBBLE_DOWN != 0.0) | (WOBBLE_UP != 0.0):
            fast += tl.where((_mix32(bits ^ 0x9E3779B9) & 1) == 1, WOBBLE_UP, -WOBBLE_DOWN)
        value = tl.where(sampled[:, None], fast, logits + 0.0)
        value = tl.where(in_vocab[None, :], value, float("-inf"))
        second = tl.maximum(second, tl.minimum(value, top))
        take = value > top
        top = tl.where(take, value, top)
        top_token = tl.where(take, tokens[None, :], top_token)
        top_logit = tl.where(take, logits, top_logit)
    # the pivot: the lowest token among a row's largest lane bests
    pivot_value, pivot = _rows_argmax_tokens(top, top_token)
    is_pivot = top_token == pivot[:, None]
    pivot_logit = tl.sum(tl.where(is_pivot, top_logit, 0.0), axis=1)
    # a best of -inf is a -inf logit or past the vocabulary: exact is -inf
    best = tl.where(
        sampled & (pivot_value != float("-inf")),
        _exact_value(pivot_logit, pivot, key, temperature, LIBDEVICE),
        pivot_value,
    )
    first = pivot
    others = sampled[:, None] & ~is_pivot & (_within(top) >= best[:, None])
    if tl.max(tl.max(others.to(tl.int32), axis=1), axis=0) > 0:
        exact = _exact_value(top_logit, top_token, key[:, None], temperature[:, None], LIBDEVICE)
        exact = tl.where(sampled[:, None] & (top != float("-inf")), exact, top)
        best, first = _rows_argmax_tokens(exact, top_token)
    reach = tl.max(_within(second), axis=1)
    rescan = sampled & ((tl.abs(best) >= _FINITE_LIMIT) | (reach >= best))
    if tl.max(rescan.to(tl.int32), axis=0) > 0:
        exact_best, exact_first = _exact_rows(
            first_tile,
            last_tile,
            row_logits,
            row_ok,
            embedded,
            weight_ptr,
            weight_stride,
            vocab,
            ranks,
            rank,
            key,
            temperature,
            sampled,
            BLOCK_R,
            BLOCK_V,
            True,
            LIBDEVICE,
            STAGES,
        )
        best = tl.where(rescan, exact_best, best)
        first = tl.where(rescan, exact_first, first)
    return best, first, rescan


@triton.jit
def _noise_error_kernel(error_ptr, LIBDEVICE: tl.constexpr, BLOCK: tl.constexpr):
    draws = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)  # the 23 bits u is made of
    bits = draws.to(tl.uint32) << 9
    error = tl.abs(_gumbel_fast(bits, LIBDEVICE) - _gumbel_exact(bits, LIBDEVICE))
    tl.store(error_ptr + tl.program_id(0), tl.max(error, axis=0))


def gumbel_fast_error(device: Union[str, torch.device] = "cuda") -> float:
    """Largest ``|g_fast - g_exact|`` over all 2**23 noise inputs, as compiled for
    ``device``. The filter is exact only while this stays below ``NOISE_ERROR_LIMIT``;
    it is a property of the device's ``lg2.approx``."""
    block = 1 << 14
    errors = torch.empty((1 << 23) // block, dtype=torch.float32, device=device)
    _noise_error_kernel[(errors.numel(),)](
        errors, LIBDEVICE=errors.device.type == "cuda", BLOCK=block
    )
    return float(errors.max())


@triton.jit
def _rows_argmax_tokens(value, token):
    """Per row (max, lowest token among the max) of ``value [rows, S]`` at ``token``
    (``[rows, S]``, or ``[1, S]`` shared by the rows)."""
    best = tl.max(value, axis=1)
    return best, tl.min(tl.where(value == best[:, None], token, _NO_TOKEN), axis=1)


@triton.jit(do_not_specialize=["step"])
def _head_step_kernel(
    base_ptr,
    base_stride,
    embed_ptr,
    embed_stride,
    weight_ptr,
    weight_stride,
    prev_ptr,
    temp_ptr,
    seed_ptr,
    pos_ptr,
    step,
    best_ptr,
    count_ptr,
    token_ptr,
    rescan_ptr,
    num_rows,
    vocab,
    rank,
    tiles_per_program,
    SAMPLE: tl.constexpr,
    LIBDEVICE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
    FILTER: tl.constexpr,
    STAGES: tl.constexpr,
    WOBBLE_DOWN: tl.constexpr,
    WOBBLE_UP: tl.constexpr,
):
    """Program (row block, part): rows ``[block * BLOCK_R, ...)`` over the tiles
    ``[part * tiles_per_program, ...)``; see the module docstring. Without FILTER every
    token of a sampled row gets ``exact``; else ``_filtered_rows`` (FILTER), which counts the
    rows it rescans in ``rescan_ptr``. LIBDEVICE: compiled for CUDA (libdevice ``logf``,
    and ``TENSOR_CORES`` for the bias); else the interpreter."""
    row_block = tl.program_id(0)
    rows = row_block * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < num_rows
    ranks = tl.arange(0, BLOCK_K)
    embedded = _embedded_rows(embed_ptr, embed_stride, prev_ptr, rows, row_ok, ranks, rank)
    row_logits = base_ptr + rows.to(tl.int64) * base_stride
    sampled = tl.zeros([BLOCK_R], tl.int1)
    key = tl.zeros([BLOCK_R], tl.uint32)
    temperature = tl.full([BLOCK_R], 1.0, tl.float32)
    if SAMPLE:
        temperature = tl.load(temp_ptr + rows, mask=row_ok, other=0.0)
        sampled = temperature != 0.0
        temperature = tl.where(sampled, temperature, 1.0)
        key = _row_key(
            tl.load(seed_ptr + rows, mask=row_ok, other=0).to(tl.int64),
            tl.load(pos_ptr + rows, mask=row_ok, other=0).to(tl.int64) + step,
        )
    first_tile = tl.program_id(1) * tiles_per_program
    last_tile = tl.minimum(first_tile + tiles_per_program, tl.cdiv(vocab, BLOCK_V))
    if SAMPLE and FILTER:
        best, first, rescan = _filtered_rows(
            first_tile,
            last_tile,
            row_logits,
            row_ok,
            embedded,
            weight_ptr,
            weight_stride,
            vocab,
            ranks,
            rank,
            key,
            temperature,
            sampled,
            BLOCK_R,
            BLOCK_V,
            LIBDEVICE,
            STAGES,
            WOBBLE_DOWN,
            WOBBLE_UP,
        )
        tl.atomic_add(rescan_ptr, tl.sum((rescan & row_ok).to(tl.int32), axis=0), sem="relaxed")
    else:
        best, first = _exact_rows(
            first_tile,
            last_tile,
            row_logits,
            row_ok,
            embedded,
            weight_ptr,
            weight_stride,
            vocab,
            ranks,
            rank,
            key,
            temperature,
            sampled,
            BLOCK_R,
            BLOCK_V,
            SAMPLE,
            LIBDEVICE,
            STAGES,
        )
    packed = _order_key(best, first)
    tl.atomic_max(best_ptr + rows, packed, mask=row_ok, sem="relaxed")
    # acq_rel: the last arrival sees every program's atomic_max of these rows
    if tl.atomic_add(count_ptr + row_block, 1, sem="acq_rel") == tl.num_programs(1) - 1:
        winner = tl.atomic_max(best_ptr + rows, packed, mask=row_ok, sem="relaxed")
        tl.store(token_ptr + rows, _key_token(winner), mask=row_ok)


@triton.jit
def _head_bias_kernel(
    embed_ptr,
    embed_stride,
    weight_ptr,
    weight_stride,
    prev_ptr,
    out_ptr,
    out_stride,
    num_rows,
    vocab,
    rank,
    TENSOR_CORES: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_R + tl.arange(0, BLOCK_R)
    row_ok = rows < num_rows
    ranks = tl.arange(0, BLOCK_K)
    embedded = _embedded_rows(embed_ptr, embed_stride, prev_ptr, rows, row_ok, ranks, rank)
    tokens = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    in_vocab = tokens < vocab
    bias = _tile_bias(
        embedded, weight_ptr, weight_stride, tokens, in_vocab, ranks, rank, TENSOR_CORES
    )
    tl.store(
        out_ptr + rows[:, None].to(tl.int64) * out_stride + tokens[None, :],
        bias.to(out_ptr.dtype.element_ty),
        mask=row_ok[:, None] & in_vocab[None, :],
    )


def in_kernel_head(embed: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether this kernel computes the bias of the factors ``(embed, weight)``: both
    float16 or both bfloat16."""
    return weight.dtype in _HEAD_DTYPES and embed.dtype == weight.dtype


def _kernel_factors(embed: torch.Tensor, weight: torch.Tensor, device: torch.device):
    """``(embed, weight)`` contiguous for the kernel; ``ValueError`` where it does not
    take them (``in_kernel_head``) or they are not on ``device``."""
    if not in_kernel_head(embed, weight):
        raise ValueError(
            f"the Markov head factors are {embed.dtype} (embed) and "
            f"{weight.dtype} (weight): the in-kernel head needs both float16 or "
            f"both bfloat16"
        )
    if embed.device != device or weight.device != device:
        raise ValueError(
            f"markov_head is on {weight.device}: expected {device}, where base_logits are"
        )
    return embed.contiguous(), weight.contiguous()


def _head_weights(markov_head: nn.Module):
    """``(embed [V, r], weight [V, r])`` of a head whose bias is ``embed[prev] @ weight^T``
    (``DSparkMarkovHead.low_rank_factors``); ``ValueError`` naming what is not."""
    factors = getattr(markov_head, "low_rank_factors", None)
    if factors is None:
        raise ValueError(
            f"markov_head is a {type(markov_head).__name__}: the in-kernel head "
            f"needs a DSparkMarkovHead (low_rank_factors()); use "
            f"sample_sequential_triton for any other module"
        )
    return factors()


def _block_k(rank: int) -> int:
    return max(16, triton.next_power_of_2(rank))


def _block_r(num_rows: int) -> int:
    return min(BLOCK_R, max(16, triton.next_power_of_2(num_rows)))


def markov_head_bias_triton(
    markov_head: nn.Module, prev: torch.Tensor, block_v: int = BLOCK_V
) -> torch.Tensor:
    """The bias ``[R, V]`` (the head's dtype) that ``sample_sequential_head_triton``
    adds for tokens ``prev [R]``: compare it with ``markov_head(prev)`` to know whether
    the tokens are bit-identical to ``sample_sequential``'s on this device."""
    _check_block_v(block_v)
    embed, weight = _kernel_factors(*_head_weights(markov_head), prev.device)
    num_rows, (vocab, rank) = prev.shape[0], weight.shape
    out = torch.empty((num_rows, vocab), dtype=weight.dtype, device=prev.device)
    if num_rows == 0:
        return out
    block_r = _block_r(num_rows)
    grid = (triton.cdiv(num_rows, block_r), triton.cdiv(vocab, block_v))
    _head_bias_kernel[grid](
        embed,
        embed.stride(0),
        weight,
        weight.stride(0),
        prev.contiguous(),
        out,
        out.stride(0),
        num_rows,
        vocab,
        rank,
        TENSOR_CORES=prev.device.type == "cuda",
        BLOCK_R=block_r,
        BLOCK_V=block_v,
        BLOCK_K=_block_k(rank),
    )
    return out


def _check_block_v(block_v) -> None:
    if (
        not isinstance(block_v, int)
        or isinstance(block_v, bool)
        or block_v < 16
        or block_v & (block_v - 1)
    ):
        raise ValueError(f"block_v={block_v!r} is invalid: expected a power of two >= 16")


def _check_launch(block_v, tiles_per_program, num_warps, num_stages) -> None:
    _check_block_v(block_v)
    for name, value in (("tiles_per_program", tiles_per_program), ("num_stages", num_stages)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 1:
            raise ValueError(f"{name}={value!r} is invalid: expected an int >= 1")
    if num_warps not in (4, 8):
        raise ValueError(f"num_warps={num_warps!r} is invalid: expected 4 or 8")


def sample_sequential_head_triton(
    base_logits: torch.Tensor,
    anchor_tokens: torch.Tensor,
    markov_head: nn.Module,
    temperature: Union[float, torch.Tensor],
    seeds: torch.Tensor,
    positions: Optional[torch.Tensor] = None,
    **knobs,
) -> torch.Tensor:
    """``sample_sequential`` with the ``DSparkMarkovHead``'s bias computed in one kernel
    per step (module docstring, also for when the tokens are bit-identical): the head's
    ``low_rank_factors()`` through ``sample_sequential_factors_triton`` (``knobs``: its
    launch knobs). ``[R, N]`` int64 tokens, no host synchronisation."""
    embed, weight = _head_weights(markov_head)
    return sample_sequential_factors_triton(
        base_logits, anchor_tokens, embed, weight, temperature, seeds, positions, **knobs
    )


def markov_head_sample_triton(
    base_logits: torch.Tensor,
    anchor_tokens: torch.Tensor,
    embed: torch.Tensor,
    weight: torch.Tensor,
    temperature: torch.Tensor,
    seeds: torch.Tensor,
    positions: Optional[torch.Tensor] = None,
) -> torch.Tensor:
    """``dspark::markov_head_sample`` on CUDA: this kernel for float16 or bfloat16 factors
    (``in_kernel_head``), else the torch reference ``markov_head_sample_ref``."""
    if in_kernel_head(embed, weight):
        return sample_sequential_factors_triton(
            base_logits, anchor_tokens, embed, weight, temperature, seeds, positions
        )
    return markov_head_sample_ref(
        base_logits, anchor_tokens, embed, weight, temperature, seeds, positions
    )


def sample_sequential_factors_triton(
    base_logits: torch.Tensor,
    anchor_tokens: torch.Tensor,
    embed: torch.Tensor,
    weight: torch.Tensor,
    temperature: Union[float, torch.Tensor],
    seeds: torch.Tensor,
    positions: Optional[torch.Tensor] = None,
    *,
    block_v: int = BLOCK_V,
    tiles_per_program: int = TILES_PER_PROGRAM,
    num_warps: int = NUM_WARPS,
    num_stages: int = NUM_STAGES,
    filter_upper: bool = True,
    rescans: Optional[torch.Tensor] = None,
    _fast_wobble: tuple[float, float] = (0.0, 0.0),
) -> torch.Tensor:
    """``markov_head_sample_ref`` for the low-rank head ``(embed [V, r], weight [V, r])``,
    both float16 or both bfloat16, with its bias computed in one kernel per step (module
    docstring); ``[R, N]`` int64 tokens, no host synchronisation.

    Launch knobs (the tokens do not depend on them): ``block_v`` (a power of two >= 16)
    tokens per tile, ``tiles_per_program`` (an int >= 1), ``num_warps`` (4 or 8) and
    ``num_stages`` (an int >= 1: tiles whose loads are in flight at once) and
    ``filter_upper`` (False: every token of a sampled row gets ``exact``, no filter).
    ``rescans``, an optional int32 ``[1]`` tensor, accumulates how many (row, program)
    pairs the filter sent back to the exact scan. ``_fast_wobble`` is for tests
    (``_filtered_rows``).
    """
    _check_launch(block_v, tiles_per_program, num_warps, num_stages)
    if not isinstance(filter_upper, bool):
        raise ValueError(f"filter_upper={filter_upper!r} is invalid: expected True or False")
    temperature, positions, greedy_only = check_head_sampling_args(
        base_logits, anchor_tokens, embed, weight, temperature, seeds, positions
    )
    num_reqs, num_steps, vocab = base_logits.shape
    device = base_logits.device
    embed, weight = _kernel_factors(embed, weight, device)
    if num_steps == 0 or num_reqs == 0:
        return torch.empty((num_reqs, num_steps), dtype=torch.int64, device=device)
    base_logits, seeds, positions = kernel_sampling_inputs(base_logits, seeds, positions)
    block_r = _block_r(num_reqs)
    row_blocks = triton.cdiv(num_reqs, block_r)
    grid = (row_blocks, triton.cdiv(triton.cdiv(vocab, block_v), tiles_per_program))
    packed = torch.full(
        (num_steps, num_reqs), torch.iinfo(torch.int64).min, dtype=torch.int64, device=device
    )
    arrivals = torch.zeros((num_steps, row_blocks), dtype=torch.int32, device=device)
    tokens = torch.empty((num_steps, num_reqs), dtype=torch.int64, device=device)
    prev = anchor_tokens.to(device=device, dtype=torch.int64).contiguous()
    if rescans is None:
        rescans = torch.zeros(1, dtype=torch.int32, device=device)
    elif rescans.dtype != torch.int32 or rescans.numel() != 1 or rescans.device != device:
        raise ValueError(
            f"rescans is {rescans.dtype} {tuple(rescans.shape)} on "
            f"{rescans.device}: expected int32 [1] on {device}"
        )
    step_views = zip(
        base_logits.unbind(1), packed.unbind(0), arrivals.unbind(0), tokens.unbind(0)
    )  # host: one call per tensor
    for step, (step_base, step_best, step_arrivals, step_tokens) in enumerate(step_views):
        _head_step_kernel[grid](
            step_base,
            base_logits.stride(0),
            embed,
            embed.stride(0),
            weight,
            weight.stride(0),
            prev,
            temperature,
            seeds,
            positions,
            step,
            step_best,
            step_arrivals,
            step_tokens,
            rescans,
            num_reqs,
            vocab,
            weight.shape[1],
            tiles_per_program,
            SAMPLE=not greedy_only,
            LIBDEVICE=device.type == "cuda",
            BLOCK_R=block_r,
            BLOCK_V=block_v,
            BLOCK_K=_block_k(weight.shape[1]),
            FILTER=filter_upper,
            STAGES=num_stages,
            WOBBLE_DOWN=float(_fast_wobble[0]),
            WOBBLE_UP=float(_fast_wobble[1]),
            num_warps=num_warps,
        )
        prev = step_tokens
    return tokens.t().contiguous()
