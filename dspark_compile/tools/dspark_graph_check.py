"""CUDA-graph check of the compiled DSpark reference draft step.

``check_draft_step_graph`` compiles the draft with the dspark backend
(``method="dspark"``, a draft window), captures one step with
``torch.cuda.graph`` (capture fails on any host synchronisation), then, for
each list of ``seq_lens``, writes new lengths, positions, slots and hidden
states into the captured input buffers, replays, and compares the output and
the written latent caches with the eager non-causal torch reference on CPU.
"""

from __future__ import annotations

import copy
import functools
from typing import Sequence

import torch

from dspark_compile.arithmetic.index_width import noncausal_width
from dspark_compile.backend import dspark_backend
from dspark_compile.kernels.sparse_mla import noncausal_swa_indices_ref
from dspark_compile.models import make_paged_batch
from dspark_compile.models.dspark_draft import (
    DSparkDraftConfig,
    DSparkReferenceDraft,
    random_latent_caches,
)
from dspark_compile.tools.cuda_graphs import capture_cuda_graph


def _positions_and_slots(
    table: torch.Tensor, seq_lens: Sequence[int], q_len: int, block_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    rows = torch.arange(len(seq_lens)).repeat_interleave(q_len)
    pos = torch.cat([torch.arange(s - q_len, s) for s in seq_lens])
    slots = table.cpu().long()[rows, pos // block_size] * block_size + pos % block_size
    return pos, slots


def check_draft_step_graph(
    cfg: DSparkDraftConfig,
    window: int,
    block_size: int,
    step_seq_lens: Sequence[Sequence[int]],
    q_len: int,
    seed: int = 0,
) -> list[float]:
    """Max abs error (output and caches) of each replayed step against the CPU reference."""
    num_reqs = len(step_seq_lens[0])
    gen = torch.Generator().manual_seed(seed)
    longest = [max(lens[r] for lens in step_seq_lens) for r in range(num_reqs)]
    batch = make_paged_batch(longest, [q_len] * num_reqs, block_size, generator=gen)
    caches = random_latent_caches(
        cfg.num_layers, batch.num_blocks, block_size, cfg.head_dim, generator=gen
    )
    model = DSparkReferenceDraft(cfg, seed=seed).eval()
    cpu_model = copy.deepcopy(model)
    width = noncausal_width(window, batch.num_tokens)

    def index_fn(seq_lens, locs, table, slots, b, _window, _width):
        return noncausal_swa_indices_ref(seq_lens, locs, table, slots, b, window, width)

    cpu_model.index_override = index_fn
    dev = "cuda"
    model = model.to(dev)
    num_tokens = batch.num_tokens
    static = {
        "hidden": torch.randn(num_tokens, cfg.hidden_size, generator=gen).to(dev),
        "positions": batch.positions.to(dev),
        "caches": [c.to(dev) for c in caches],
        "block_table": batch.block_table.to(dev),
        "seq_lens": batch.seq_lens.to(dev),
        "query_start_loc": batch.query_start_loc.to(dev),
        "slot_mapping": batch.slot_mapping.to(dev),
    }

    def args():
        return (
            static["hidden"],
            static["positions"],
            static["caches"],
            static["block_table"],
            static["seq_lens"],
            static["query_start_loc"],
            static["slot_mapping"],
        )

    def set_step(seq_lens: Sequence[int]) -> None:
        pos, slots = _positions_and_slots(batch.block_table, seq_lens, q_len, block_size)
        static["seq_lens"].copy_(torch.tensor(list(seq_lens), dtype=torch.int32))
        static["positions"].copy_(pos)
        static["slot_mapping"].copy_(slots)
        static["hidden"].copy_(torch.randn(num_tokens, cfg.hidden_size, generator=gen))

    backend = functools.partial(
        dspark_backend, options={"method": "dspark", "draft_window_size": window}
    )
    compiled = torch.compile(model, backend=backend, dynamic=False)
    errors = []
    with torch.no_grad():
        set_step(step_seq_lens[0])
        graph, out = capture_cuda_graph(lambda: compiled(*args()))
        for seq_lens in step_seq_lens:
            set_step(seq_lens)
            before = [c.cpu() for c in static["caches"]]
            graph.replay()
            torch.cuda.synchronize()
            want = cpu_model(
                static["hidden"].cpu(),
                static["positions"].cpu(),
                before,
                batch.block_table,
                static["seq_lens"].cpu(),
                batch.query_start_loc,
                static["slot_mapping"].cpu(),
            )
            err = (out.cpu() - want).abs().max().item()
            for got_cache, want_cache in zip(static["caches"], before):
                err = max(err, (got_cache.cpu() - want_cache).abs().max().item())
            errors.append(err)
    return errors
