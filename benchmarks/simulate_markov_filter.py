"""How often the fused Markov sampler's filter leaves the pivot alone: a CPU simulation.

    python benchmarks/simulate_markov_filter.py [--requests 64] [--steps 2]
        [--vocab 129280] [--span 32768] [--block 2048] [--temperature 1.0]

Mirrors ``kernels/markov_sampling_triton.py`` on the benchmark's inputs (``torch.randn``
bf16 logits plus a bias of std 0.58, the random rank-256 head's): each program covers
``span`` tokens of a row, lane ``p`` sees tokens ``p, p + block, ...`` and keeps its best
and second-best ``upper`` (computed in float32 as the kernel does); the pivot is the
first token of the largest ``upper``. Prints how many programs end with the pivot alone,
2..8 candidates (one at a time), a crowded lane, or more than 8 candidates (both: every
token of the span gets the exact value), and the mean number of candidates.
"""

from __future__ import annotations

import argparse
import math
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from dspark_compile.kernels.markov_sampling import (
    gumbel_from_bits,  # noqa: E402
    noise_bits,
)
from dspark_compile.kernels.markov_sampling_triton import (
    MAX_CANDIDATES,  # noqa: E402
    UPPER_ABS_SLACK,
)

_LN2 = 0.6931471805599453


def gumbel_upper(bits: torch.Tensor) -> torch.Tensor:
    """The kernel's ``_gumbel_upper`` in float32: ``ln2 * (127 - bits(1 - u) / 2**23)``."""
    one_to_two = ((bits >> 9) | 0x3F800000).to(torch.int32).view(torch.float32)
    below_one = (2.0 - one_to_two) - 1.0 / 16777216.0
    scaled = 0x3F800000 - below_one.view(torch.int32)
    return scaled.to(torch.float32) * (_LN2 / 8388608.0)


def classify(upper: torch.Tensor, exact: torch.Tensor, block: int) -> tuple[str, int]:
    """One program's path: ``(alone | few | crowded | many, candidates)`` from its
    tokens' ``upper`` and ``exact`` values (1-D, float32)."""
    padded = math.ceil(upper.numel() / block) * block
    up = torch.full((padded,), -math.inf)
    ex = torch.full((padded,), -math.inf)
    up[: upper.numel()], ex[: exact.numel()] = upper, exact
    up, ex = up.view(-1, block), ex.view(-1, block)
    top, where = up.max(0)  # first maximum per lane
    second = (
        up.sort(0, descending=True).values[1]
        if up.shape[0] > 1
        else torch.full((block,), -math.inf)
    )
    tokens = where * block + torch.arange(block)
    pivot = int(torch.where(top == top.max(), tokens, padded).argmin())  # its lane
    floor = ex[where[pivot], pivot] - UPPER_ABS_SLACK
    candidates = int((top >= floor).sum())
    if bool((second >= floor).any()):
        return "crowded", candidates
    if candidates == 1:
        return "alone", 1
    return ("few" if candidates <= MAX_CANDIDATES else "many"), candidates


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--vocab", type=int, default=129280)
    parser.add_argument("--span", type=int, default=32768)
    parser.add_argument("--block", type=int, default=2048)
    parser.add_argument("--temperature", type=float, default=1.0)
    args = parser.parse_args(argv)
    for name in ("requests", "steps", "vocab", "span", "block"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}={getattr(args, name)} is invalid: expected >= 1")
    if not args.temperature > 0:
        parser.error(f"--temperature={args.temperature} is invalid: expected > 0")
    torch.manual_seed(0)
    rows, vocab = args.requests, args.vocab
    logits = (
        torch.randn(rows, vocab).bfloat16().float()
        + (torch.randn(rows, vocab) * 0.58).bfloat16().float()
    )
    seeds = torch.randint(-(2**62), 2**62, (rows,))
    positions = torch.randint(0, 2**20, (rows,))
    paths = {"alone": 0, "few": 0, "crowded": 0, "many": 0}
    total_candidates = 0
    for step in range(args.steps):
        bits = noise_bits(seeds, positions + step, vocab)
        exact = logits / args.temperature + gumbel_from_bits(bits)
        upper = logits * (1.0 / args.temperature) + gumbel_upper(bits)
        for row in range(rows):
            for start in range(0, vocab, args.span):
                stop = min(start + args.span, vocab)
                path, candidates = classify(
                    upper[row, start:stop], exact[row, start:stop], args.block
                )
                paths[path] += 1
                total_candidates += candidates
        print(f"step {step + 1}/{args.steps}: {paths}", flush=True)
    programs = sum(paths.values())
    print(
        f"{programs} programs: {paths['alone']} pivot alone, {paths['few']} with 2.."
        f"{MAX_CANDIDATES} candidates, {paths['crowded']} crowded, {paths['many']} with more; "
        f"{total_candidates / programs:.3f} candidates per program"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
