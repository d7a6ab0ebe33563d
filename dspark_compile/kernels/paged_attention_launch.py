"""Launch policy of ``kernels/paged_attention_triton.py``: how a call is cut into
programs (tile and stage choice, KV splits), and fitting a launch to the GPU.

``choose_launch`` picks the launch from tensor SHAPES only (never values), so a launch is
CUDA-graph safe. ``launch_fitted`` runs it, retrying with fewer stages, then a smaller KV
tile (``smaller_tile``) while Triton raises ``OutOfResources`` (``launch_fit``), and
remembers, per shape and process, the launch that fit. The result does not depend on the
launch beyond float rounding. Defaults and their measurements: docs/notes/tuning-history.md.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Optional

import torch
import triton

from dspark_compile.kernels.launch_fit import launch_until_it_fits


@dataclasses.dataclass(frozen=True)
class LaunchConfig:
    """How a call is cut into programs (see the module docstring).

    ``exact_tiles``: one query tile per token (only with ``block_q == 1``), so
    the grid has ``T`` tiles instead of the upper bound ``T // block_q + R``.
    ``heads_first``: the KV head is the grid's fastest axis (all KV heads of a
    tile and split are scheduled side by side) instead of the query tile.
    ``tokens_per_split``: a split's length over the longest span the shapes allow
    (``num_splits x tokens_per_split`` covers it); the kernel cuts each query
    tile's actual span into ``num_splits`` runs of whole ``block_n`` tiles.
    """

    block_q: int
    block_m: int
    block_n: int
    num_splits: int
    tokens_per_split: int
    num_warps: int
    num_stages: int
    exact_tiles: bool = False
    heads_first: bool = False

    def grid(self, num_tokens: int, num_reqs: int, num_kv_heads: int) -> tuple[int, int, int]:
        tiles = num_tokens if self.exact_tiles else num_tokens // self.block_q + num_reqs
        if self.heads_first:
            return (num_kv_heads, tiles, self.num_splits)
        return (tiles, num_kv_heads, self.num_splits)


@dataclasses.dataclass(frozen=True)
class TileDefaults:
    """Default launch of one kind of query tile on a GPU (``choose_launch``).

    ``resident_per_sm``: programs of this tile one SM holds at once (from the
    compiled kernel's registers and shared memory on the H200); the split count
    is chosen so the programs fill whole waves of ``resident_per_sm x SMs``.
    """

    block_n: int
    num_warps: int
    num_stages: int
    resident_per_sm: int
    exact_tiles: bool
    heads_first: bool


# Measured on the H200, torch 2.11 / triton 3.6, Hq 32 / Hkv 8, D 128, bf16, b=16
# (benchmarks/results/2026-11-30/2026-11-30-h200-peer-attention-tuning.md and
# 2026-11-30-h200-pipelined-launches.md). The KV loop loads block-table entries and
# then gathers K/V rows with them; triton 3.6 overlaps those gathers with the dots
# only from num_stages=5 on (below that the loop waits for every copy it has issued
# before each tile: `cp.async.wait_group 0`), so the long-table launches use 5.
# Decode-sized tiles (block_m <= 16: one query x the GQA group) over long tables:
# BLOCK_N 128 pipelined (188 registers, 137 KiB of shared memory -> 1 program per SM).
DECODE_TILES = TileDefaults(
    block_n=128, num_warps=4, num_stages=5, resident_per_sm=1, exact_tiles=True, heads_first=True
)
# Decode tiles over short tables (<= SHORT_TABLE_TOKENS, e.g. a 2048-token draft
# window): 2 resident programs (188 registers, 72 KiB) beat the pipelined launch
# there (80 vs 84 us at batch 32): one wave of 256 short programs, each ramping up
# once. Batch 32 decode runs 1 split (no combine kernel).
SHORT_DECODE_TILES = TileDefaults(
    block_n=128, num_warps=4, num_stages=3, resident_per_sm=2, exact_tiles=True, heads_first=True
)
# Query blocks (block_m >= 32, e.g. 16 non-causal queries x GQA 4 = 64 rows), any
# table length: BLOCK_N 64 pipelined (221 registers, 113 KiB -> 2 per SM; batch 32
# at 128k and over a 2048-token window: 1 split).
BLOCK_TILES = TileDefaults(
    block_n=64, num_warps=4, num_stages=5, resident_per_sm=2, exact_tiles=False, heads_first=False
)
SHORT_BLOCK_TILES = BLOCK_TILES
SHORT_TABLE_TOKENS = 8192  # measured at 2064 (short) and 32768 / 131072 (long) tokens only
# Launch knobs a caller (tests, benchmarks/bench_peer_attention.py --configs) may
# override; None keeps the heuristic's choice. ``programs_per_sm`` selects the
# earlier split rule (ceil(programs_per_sm x SMs / programs), 16 before tuning).
LAUNCH_KNOBS = (
    "num_splits",
    "block_n",
    "num_warps",
    "num_stages",
    "programs_per_sm",
    "resident_per_sm",
    "min_split_tokens",
    "exact_tiles",
    "heads_first",
)
DEFAULT_MIN_SPLIT_TOKENS = 256
MAX_SPLITS = 512
MIN_WAVE_FILL = 0.9


@functools.cache
def _num_sms(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _rounded_splits(max_kv: int, splits: int, block_n: int) -> tuple[int, int]:
    """``(num_splits, tokens_per_split)`` once a split is rounded up to whole KV tiles."""
    tokens_per_split = -(-max_kv // splits)
    tokens_per_split = -(-tokens_per_split // block_n) * block_n
    return -(-max_kv // tokens_per_split), tokens_per_split


@functools.lru_cache(maxsize=4096)
def wave_fit_splits(programs: int, slots: int, max_kv: int, block_n: int, max_splits: int) -> int:
    """Fewest splits (1..max_splits) whose ``splits x programs`` fill their waves of
    ``slots`` resident programs to at least ``MIN_WAVE_FILL``; else the best fill.

    Fill = programs / (waves x slots): a last wave half full runs at about half
    the machine (H200, 256 decode programs, 4 resident per SM = 528 slots: 2
    splits ran at 96% of SDPA, 3 splits at 85%, 1 split at 60%).
    """
    best_fill, best = -1.0, 1
    for wanted in range(1, max(1, max_splits) + 1):
        splits, _ = _rounded_splits(max_kv, wanted, block_n)
        total = splits * programs
        fill = total / (-(-total // slots) * slots)
        if fill >= MIN_WAVE_FILL:
            return splits
        if fill > best_fill + 1e-9:
            best_fill, best = fill, splits
    return best


def choose_launch(
    num_tokens: int,
    num_reqs: int,
    num_kv_heads: int,
    group: int,
    table_width: int,
    block_size: int,
    device: torch.device,
    num_splits: Optional[int] = None,
    block_n: Optional[int] = None,
    num_warps: Optional[int] = None,
    num_stages: Optional[int] = None,
    num_sms: Optional[int] = None,
    programs_per_sm: Optional[int] = None,
    resident_per_sm: Optional[int] = None,
    min_split_tokens: Optional[int] = None,
    exact_tiles: Optional[bool] = None,
    heads_first: Optional[bool] = None,
    window_tokens: Optional[int] = None,
) -> LaunchConfig:
    """Launch shape from tensor SHAPES only (never values): CUDA-graph safe.

    Tiles: decode tiles when a query tile has at most 16 rows, else block tiles;
    ``SHORT_*`` for at most ``SHORT_TABLE_TOKENS`` tokens of KV per query tile
    (each knob given here overrides its default). Splits
    (``wave_fit_splits``): the fewest that fill whole waves of
    ``resident_per_sm x SMs`` programs, each split at least ``min_split_tokens``
    (256) tokens, at most 512 splits. With ``programs_per_sm`` the earlier rule:
    ``ceil(programs_per_sm x SMs / programs)`` splits, same bounds.
    ``window_tokens`` W: the kernel applies a W-token window to a full table
    itself, so a query tile reads at most ``W + b + block_q`` tokens (the
    splits then cut that span, not the table's width).
    """
    mean_q = max(1, -(-num_tokens // max(num_reqs, 1)))
    block_q = min(triton.next_power_of_2(mean_q), max(1, 64 // group))
    block_m = max(16, triton.next_power_of_2(block_q * group))
    max_kv = max(table_width * block_size, 1)
    if window_tokens is not None:  # lo(first query) .. last query + 1, block aligned
        max_kv = min(max_kv, window_tokens + block_size + block_q)
    short = max_kv <= SHORT_TABLE_TOKENS
    if block_m <= 16:
        tiles = SHORT_DECODE_TILES if short else DECODE_TILES
    else:
        tiles = SHORT_BLOCK_TILES if short else BLOCK_TILES
    on_gpu = device.type == "cuda"
    block_n = block_n or (tiles.block_n if on_gpu else 16)
    if num_splits is None:
        sms = num_sms or (_num_sms(device.index or 0) if on_gpu else 4)
        min_tokens = min_split_tokens or DEFAULT_MIN_SPLIT_TOKENS
        programs = max(1, num_reqs * -(-mean_q // block_q) * num_kv_heads)
        max_splits = max(1, min(-(-max_kv // min_tokens), MAX_SPLITS))
        if programs_per_sm is not None:
            num_splits = max(1, min(-(-programs_per_sm * sms // programs), max_splits))
        else:
            slots = (resident_per_sm or tiles.resident_per_sm) * sms
            num_splits = wave_fit_splits(programs, slots, max_kv, block_n, max_splits)
    if not isinstance(num_splits, int) or num_splits < 1:
        raise ValueError(f"num_splits={num_splits!r} is invalid: expected a positive int")
    num_splits, tokens_per_split = _rounded_splits(max_kv, num_splits, block_n)
    exact = (tiles.exact_tiles if exact_tiles is None else bool(exact_tiles)) and block_q == 1
    heads = tiles.heads_first if heads_first is None else bool(heads_first)
    grid_tiles = num_tokens if exact else num_tokens // block_q + num_reqs
    return LaunchConfig(
        block_q,
        block_m,
        block_n,
        num_splits,
        tokens_per_split,
        num_warps or tiles.num_warps,
        num_stages or (tiles.num_stages if on_gpu else 1),
        exact_tiles=exact,
        heads_first=heads and grid_tiles <= 65535,
    )  # grid y limit


# (device, dtype, head_dim, block_m, num_warps, block_n, num_stages) of a launch that ran
# out of shared memory or registers -> the (block_n, num_stages) that replaced it.
_FITTED_SHAPES: dict[tuple, tuple[int, int]] = {}


def smaller_tile(block_n: int, num_stages: int) -> Optional[tuple[int, int]]:
    """The next smaller ``(block_n, num_stages)`` after an out-of-resources launch
    (None: none left): one stage fewer down to 1, then half the KV tile (>= 16)
    with 2 stages. The long-table defaults need ~113-137 KiB of shared memory;
    GPUs with ~100 KiB per block get the same result from a smaller launch."""
    if num_stages > 1:
        return block_n, num_stages - 1
    if block_n > 16:
        return block_n // 2, 2
    return None


def launch_fitted(
    launch_for: Callable[[Optional[int], Optional[int]], LaunchConfig],
    run: Callable[[LaunchConfig], object],
    block_n: Optional[int],
    num_stages: Optional[int],
    key: tuple,
) -> LaunchConfig:
    """Run ``run(launch_for(block_n, num_stages))`` until a launch fits; returns it.

    ``launch_for(block_n, num_stages)``: the launch with those knobs (None: default).
    ``key`` (device, dtype, head dim) and the first launch's shape index the shapes
    that ran out of resources in this process: such a shape starts from the one that
    fit. On ``OutOfResources`` the next launch is ``smaller_tile``'s (logged); when none
    is left the error propagates.
    """
    cfg = launch_for(block_n, num_stages)
    fit_key = (*key, cfg.block_m, cfg.num_warps, cfg.block_n, cfg.num_stages)
    if fit_key in _FITTED_SHAPES:  # this shape ran out of resources here before
        cfg = launch_for(*_FITTED_SHAPES[fit_key])

    def smaller(tried: LaunchConfig) -> Optional[LaunchConfig]:
        shape = smaller_tile(tried.block_n, tried.num_stages)
        return None if shape is None else launch_for(*shape)

    _, fitted = launch_until_it_fits(run, cfg, smaller, "paged attention")
    if fitted is not cfg:
        _FITTED_SHAPES[fit_key] = (fitted.block_n, fitted.num_stages)
    return fitted
