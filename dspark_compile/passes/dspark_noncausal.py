"""DSpark non-causal sparse-MLA index pass (docs/design.md, "DSpark indices").

In a DSpark draft graph every call of ``dspark.swa_indices`` (the causal index
generation feeding sparse MLA attention) becomes ``dspark.noncausal_swa_indices``:
each query of a request's draft block then sees the window of context plus
the whole block, ``[max(ctx - W, 0), ctx + q_len)``. No attention kernel
changes, only its indices.

Composition with the draft window: W is ``draft_window_size`` when the window
is on, else the call's own ``window_size``. Attention sinks likewise: with the
window on the call gets ``sink_size = draft_sink_size`` (S; 0 leaves the
argument as it was when the call had none, so the graph is today's), with it
off it keeps its own ``sink_size`` (default 0). Each token then also sees the
first ``S_b = ceil(S / b) * b`` KV tokens, b the call's ``block_size``. The
index width becomes ``ceil((S_b + W + T) / 128) * 128`` with T the graph's
static token count (an upper bound of every request's q_len), checked when the
graph is built; the op itself guards on device that no row overflows. Other
methods leave the graph alone.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx

from dspark_compile.arithmetic.index_width import noncausal_width
from dspark_compile.config import DraftWindowConfig
from dspark_compile.passes import stats as keys
from dspark_compile.passes.base import GraphPass
from dspark_compile.passes.graph_utils import (
    find_calls,
    get_arg,
    schema_index,
    set_arg,
    sync_eager_input_vals,
)

logger = logging.getLogger(__name__)


class DSparkNonCausalIndexPass(GraphPass):
    """Replace causal sparse-MLA index generation with the DSpark non-causal block form."""

    name = keys.NONCAUSAL_INDEX_PASS
    stat_keys = (keys.INDEX_CALLS, keys.REWRITTEN, keys.WINDOWED, keys.WITH_SINKS)

    def __init__(self, config: DraftWindowConfig) -> None:
        self.window_config = config

    def config(self) -> dict[str, Any]:
        return {"window": self.window_config.as_dict()}

    def apply(self, graph: torch.fx.Graph) -> dict[str, int]:
        causal_op = torch.ops.dspark.swa_indices.default
        noncausal_op = torch.ops.dspark.noncausal_swa_indices.default
        stats = self.new_stats()
        calls = find_calls(graph, [causal_op])
        stats[keys.INDEX_CALLS] = len(calls)
        if self.window_config.method != "dspark":
            return stats
        for call in calls:
            own_sinks = get_arg(call, schema_index(causal_op, "sink_size"), "sink_size") or 0
            window = self.window_config.draft_window_size
            if window is None:
                window = get_arg(call, schema_index(causal_op, "window_size"), "window_size")
                sinks = own_sinks
            else:
                stats[keys.WINDOWED] += 1
                sinks = self.window_config.draft_sink_size
            slot_mapping = get_arg(call, schema_index(causal_op, "slot_mapping"), "slot_mapping")
            num_tokens = slot_mapping.meta["val"].shape[0]
            if not isinstance(num_tokens, int):
                raise ValueError(
                    f"{call.format_node()}: the draft's token count is symbolic ({num_tokens}); "
                    "the non-causal index width ceil((S_b + W + max_q_len) / 128) * 128 needs "
                    "a static bound: compile with dynamic=False"
                )
            block_size = get_arg(call, schema_index(causal_op, "block_size"), "block_size")
            if sinks and not isinstance(block_size, int):
                raise ValueError(
                    f"{call.format_node()}: block_size={block_size} is not a static int; the "
                    f"index width with sink_size={sinks} needs S_b = ceil(S / b) * b"
                )
            width = noncausal_width(window, num_tokens, sinks, block_size if sinks else None)
            call.target = noncausal_op
            set_arg(call, schema_index(noncausal_op, "window_size"), "window_size", window)
            set_arg(call, schema_index(noncausal_op, "width"), "width", width)
            if sinks != own_sinks:
                set_arg(call, schema_index(noncausal_op, "sink_size"), "sink_size", sinks)
            if sinks:
                stats[keys.WITH_SINKS] += 1
            old = call.meta["val"]
            call.meta["val"] = old.new_empty((old.shape[0], width))
            for user in call.users:  # the indices they read have the new width
                sync_eager_input_vals(
                    user, positions=[i for i, arg in enumerate(user.args) if arg is call]
                )
            stats[keys.REWRITTEN] += 1
            logger.debug(
                "%s -> noncausal_swa_indices(window_size=%d, width=%d, sink_size=%d)",
                call.name,
                window,
                width,
                sinks,
            )
        graph.lint()
        return stats
