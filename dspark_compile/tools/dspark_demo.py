"""The DSpark demo: a sparse-MLA DSpark reference draft through backend="dspark".

For each context length it compiles the built-in DSpark draft with
``method="dspark"`` and ``draft_window_size=W`` (the pass turns its causal
sparse-MLA indices into the non-causal block form), checks it against the
eager non-causal reference, shows that the non-causal indices change the
output compared with the causal draft, samples the draft block greedily
through the Markov head from both, and times one draft step.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Iterator, Sequence

import torch

from dspark_compile.arithmetic.index_width import noncausal_width
from dspark_compile.backend import compile_caches_off
from dspark_compile.kernels.sparse_mla import noncausal_swa_indices_ref
from dspark_compile.models import make_paged_batch
from dspark_compile.models.dspark_draft import (
    DSparkDraftConfig,
    DSparkReferenceDraft,
    random_latent_caches,
)
from dspark_compile.passes import clear_pass_records, pass_records
from dspark_compile.tools.demo import best_time_ms

logger = logging.getLogger(__name__)


@dataclasses.dataclass
class DSparkDemoRow:
    context_len: int
    max_err: float  # compiled vs eager non-causal reference
    noncausal_effect: float  # max |non-causal - causal| over the block's hidden states
    rewritten_calls: int
    tokens_equal: bool  # greedy draft tokens: compiled == eager reference
    eager_ms: float
    compiled_ms: float


def run_dspark_demo(
    context_lens: Sequence[int] = (1024, 4096),
    window_size: int = 512,
    num_requests: int = 4,
    block_q_len: int = 8,
    block_size: int = 16,
    lowering: str = "inductor",
    device: str = "cpu",
    repeats: int = 3,
    seed: int = 0,
) -> Iterator[DSparkDemoRow]:
    """Yield one ``DSparkDemoRow`` per context length."""
    cfg = DSparkDraftConfig(
        hidden_size=256,
        num_layers=2,
        num_heads=8,
        kv_lora_rank=64,
        rope_dim=32,
        intermediate_size=512,
        vocab_size=1024,
        markov_rank=32,
        sliding_window=window_size,
    )
    model = DSparkReferenceDraft(cfg, seed=seed).eval().to(device)
    gen = torch.Generator().manual_seed(seed)
    for context_len in context_lens:
        seq_lens = [context_len + block_q_len - 37 * i for i in range(num_requests)]
        batch = make_paged_batch(
            seq_lens, [block_q_len] * num_requests, block_size, device=device, generator=gen
        )
        caches = random_latent_caches(
            cfg.num_layers, batch.num_blocks, block_size, cfg.head_dim, device=device, generator=gen
        )
        hidden = torch.randn(batch.num_tokens, cfg.hidden_size, generator=gen).to(device)
        width = noncausal_width(window_size, batch.num_tokens)
        anchors = torch.randint(0, cfg.vocab_size, (num_requests,), generator=gen).to(device)
        seeds = torch.arange(num_requests, device=device)

        def args():
            return (
                hidden,
                batch.positions,
                [c.clone() for c in caches],
                batch.block_table,
                batch.seq_lens,
                batch.query_start_loc,
                batch.slot_mapping,
            )

        def noncausal(seq_lens, locs, table, slots, block, _window, _width):
            return noncausal_swa_indices_ref(
                seq_lens, locs, table, slots, block, window_size, width
            )

        def propose(out):
            return model.propose(out, batch.query_start_loc, anchors, block_q_len - 1, 0.0, seeds)

        with torch.no_grad():
            causal = model(*args())
            model.index_override = noncausal
            try:
                want = model(*args())
                eager_ms = best_time_ms(lambda: model(*args()), repeats)
            finally:
                model.index_override = None
            torch._dynamo.reset()
            clear_pass_records()
            compiled = torch.compile(
                model,
                backend="dspark",
                dynamic=False,
                options={
                    "lowering": lowering,
                    "method": "dspark",
                    "draft_window_size": window_size,
                },
            )
            with compile_caches_off():  # the passes run (and report) on every demo run
                got = compiled(*args())
            stats = [r.stats for r in pass_records() if r.pass_name == "dspark_noncausal_indices"]
            row = DSparkDemoRow(
                context_len=context_len,
                max_err=(got - want).abs().max().item(),
                noncausal_effect=(want - causal).abs().max().item(),
                rewritten_calls=sum(s["rewritten"] for s in stats),
                tokens_equal=bool(torch.equal(propose(got), propose(want))),
                eager_ms=eager_ms,
                compiled_ms=best_time_ms(lambda: compiled(*args()), repeats),
            )
        logger.info("dspark demo row: %s", row)
        yield row
