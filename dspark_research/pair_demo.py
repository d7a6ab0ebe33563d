"""Acceptance of a trained draft/target pair with and without the draft window.

The committed tiny pair (``tests_engine/data/trained_pair``: a 3-layer byte-level
Llama target trained to 1152 tokens and a 2-layer ``draft_model`` draft trained at 64,
HF checkpoints that vLLM loads too) is decoded greedily by
:class:`~dspark_research.speculative.loop.SpeculativeDecoder` on its held-out prompts,
the draft compiled with ``backend="dspark"`` without a window and with W = its
training context. One row per prompt length: the mean acceptance length
``tau = 1 + accepted / rounds`` both ways, and whether both runs generated exactly the
target's own greedy tokens (:func:`~dspark_research.speculative.loop.target_greedy_decode`,
the target alone, one token per forward): greedy speculative decoding must emit them
with or without the window. Comparing the two speculative runs with each other would
not do: a defect common to both (in the loop, or the compiled draft's verification)
would pass.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path
from typing import Iterator, Optional, Sequence

logger = logging.getLogger(__name__)

PAIR_DIR = Path(__file__).resolve().parents[1] / "tests_engine" / "data" / "trained_pair"


@dataclasses.dataclass(frozen=True)
class PairRow:
    context: int
    window: int
    tau_off: float
    tau_window: float
    rounds: int
    tokens_equal: bool


def pair_contexts(pair_dir: Path = PAIR_DIR) -> list[int]:
    """Prompt lengths the pair's ``prompts.json`` holds."""
    return sorted(int(c) for c in _prompts(pair_dir))


def _prompts(pair_dir: Path) -> dict[str, list[list[int]]]:
    path = Path(pair_dir) / "prompts.json"
    if not path.exists():
        raise FileNotFoundError(
            f"{path} not found: expected a pair written by benchmarks/train_engine_pair.py "
            "(a source checkout has tests_engine/data/trained_pair)"
        )
    return json.loads(path.read_text())["prompts"]


def run_pair_demo(
    pair_dir: Path = PAIR_DIR,
    contexts: Optional[Sequence[int]] = None,
    window: Optional[int] = None,
    num_prompts: int = 4,
    new_tokens: int = 32,
    num_speculative_tokens: int = 5,
    lowering: str = "aot_eager",
) -> Iterator[PairRow]:
    """Yield one :class:`PairRow` per context (default: every prompt length of the pair).

    ``window`` defaults to the draft's training context (``dspark_training_context``
    of its ``config.json``). Runs on the CPU (the pair is float32 and tiny).
    """
    import torch

    from dspark_research.speculative import hf_export
    from dspark_research.speculative.loop import (
        SpeculativeDecoder,
        compile_draft,
        target_greedy_decode,
    )

    pair_dir = Path(pair_dir)
    prompts = _prompts(pair_dir)
    contexts = list(contexts) if contexts else pair_contexts(pair_dir)
    for c in contexts:
        if str(c) not in prompts:
            raise ValueError(
                f"context={c} is invalid: the pair has prompts of {pair_contexts(pair_dir)} tokens"
            )
    if window is None:
        window = hf_export.training_context(pair_dir / "draft")
        if window is None:
            raise ValueError(
                f"{pair_dir / 'draft'} names no training context: pass window explicitly"
            )
    target = hf_export.load_llama(pair_dir / "target")
    draft = hf_export.load_llama(pair_dir / "draft")
    longest = max(len(p) for c in contexts for p in prompts[str(c)][:num_prompts])
    reference = {
        c: [
            target_greedy_decode(target, torch.tensor(p, dtype=torch.long), new_tokens, 16)[0]
            for p in prompts[str(c)][:num_prompts]
        ]
        for c in contexts
    }
    results: dict[Optional[int], dict[int, list]] = {}
    for setting in (None, window):
        torch._dynamo.reset()
        decoder = SpeculativeDecoder(
            target,
            draft,
            num_speculative_tokens=num_speculative_tokens,
            draft_fn=compile_draft(draft, setting, None, lowering),
            block_size=16,
            max_len=longest + new_tokens + 2 * num_speculative_tokens + 2,
        )
        results[setting] = {}
        for c in contexts:
            logger.info("pair demo: window %s, %d-token prompts", setting, c)
            results[setting][c] = [
                decoder.generate(torch.tensor(p, dtype=torch.long), new_tokens)
                for p in prompts[str(c)][:num_prompts]
            ]
            if setting == window:
                yield _row(c, window, results[None][c], results[window][c], reference[c])


def _row(context: int, window: int, off: list, on: list, reference: list) -> PairRow:
    """``reference``: the target's own greedy tokens, one list per prompt."""

    def tau(runs) -> float:
        accepted = [a for r in runs for a in r.accepted]
        return 1.0 + sum(accepted) / max(len(accepted), 1)

    return PairRow(
        context=context,
        window=window,
        tau_off=tau(off),
        tau_window=tau(on),
        rounds=sum(len(r.accepted) for r in on),
        tokens_equal=len(off) == len(on) == len(reference)
        and all(a.tokens == t and b.tokens == t for a, b, t in zip(off, on, reference)),
    )
