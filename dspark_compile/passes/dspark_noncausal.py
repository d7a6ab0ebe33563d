"""DSpark non-causal sparse-MLA index pass (DESIGN.md section 1.2).

In a DSpark draft graph every call of ``dspark.swa_indices`` (the causal index
generation feeding sparse MLA attention) becomes ``dspark.noncausal_swa_indices``:
each query of a request's draft block then sees the window of context plus
the whole block, ``[max(ctx - W, 0), ctx + q_len)``. No attention kernel
changes, only its indices.

Composition with the draft window: W is ``draft_window_size`` when the window
is on, else the call's own ``window_size``. The index width becomes
``ceil((W + T) / 128) * 128`` with T the graph's static token count (an upper
bound of every request's q_len), checked when the graph is built; the op
itself guards on device that no row overflows. Other methods leave the graph
alone.
"""

from __future__ import annotations

import logging
from typing import Any

import torch
import torch.fx

from dspark_compile.config import DraftWindowConfig
from dspark_compile.kernels.sparse_mla import noncausal_width
from dspark_compile.passes.base import DSparkPass
from dspark_compile.passes.graph_utils import get_arg, set_arg

logger = logging.getLogger(__name__)


def _arg_index(op: torch._ops.OpOverload, name: str) -> int:
    return [a.name for a in op._schema.arguments].index(name)


class DSparkNonCausalIndexPass(DSparkPass):
    """Replace causal sparse-MLA index generation with the DSpark non-causal block form."""

    name = "dspark_noncausal_indices"

    def __init__(self, config: DraftWindowConfig) -> None:
        self.window_config = config

    def config(self) -> dict[str, Any]:
        return {"window": self.window_config.as_dict()}

    def apply(self, graph: torch.fx.Graph) -> dict[str, int]:
        causal_op = torch.ops.dspark.swa_indices.default
        noncausal_op = torch.ops.dspark.noncausal_swa_indices.default
        stats = {"index_calls": 0, "rewritten": 0, "windowed": 0}
        calls = [n for n in graph.nodes if n.op == "call_function" and n.target == causal_op]
        stats["index_calls"] = len(calls)
        if self.window_config.method != "dspark":
            return stats
        for call in calls:
            window = self.window_config.draft_window_size
            if window is None:
                window = get_arg(call, _arg_index(causal_op, "window_size"), "window_size")
            else:
                stats["windowed"] += 1
            slot_mapping = get_arg(call, _arg_index(causal_op, "slot_mapping"), "slot_mapping")
            num_tokens = slot_mapping.meta["val"].shape[0]
            if not isinstance(num_tokens, int):
                raise ValueError(
                    f"{call.format_node()}: the draft's token count is symbolic ({num_tokens}); "
                    "the non-causal index width ceil((W + max_q_len) / 128) * 128 needs a "
                    "static bound: compile with dynamic=False")
            width = noncausal_width(window, num_tokens)
            call.target = noncausal_op
            set_arg(call, _arg_index(noncausal_op, "window_size"), "window_size", window)
            set_arg(call, _arg_index(noncausal_op, "width"), "width", width)
            old = call.meta["val"]
            call.meta["val"] = old.new_empty((old.shape[0], width))
            _refresh_eager_input_vals(call)
            stats["rewritten"] += 1
            logger.debug("%s -> noncausal_swa_indices(window_size=%d, width=%d)",
                         call.name, window, width)
        graph.lint()
        return stats


def _refresh_eager_input_vals(call: torch.fx.Node) -> None:
    """Keep ``meta["eager_input_vals"]`` in step with a rewritten call and its new output.

    Inductor lays out custom-op inputs with the strides recorded there at trace
    time; stale entries (the old index width) would make it copy the new
    indices into a buffer of the old row stride.
    """
    def refresh(node: torch.fx.Node, replace) -> None:
        if "eager_input_vals" not in node.meta:
            return
        args, kwargs = node.meta["eager_input_vals"]
        args = tuple(replace(node.args[i], value) if i < len(node.args) else value
                     for i, value in enumerate(args))
        kwargs = {key: replace(node.kwargs.get(key), value) for key, value in kwargs.items()}
        node.meta["eager_input_vals"] = (args, kwargs)

    # The call itself: its scalar arguments (window_size, width) changed.
    refresh(call, lambda arg, value: value if isinstance(arg, torch.fx.Node) else arg)
    # Its users: the indices they read have the new width.
    for user in call.users:
        refresh(user, lambda arg, value: call.meta["val"] if arg is call else value)
