"""Draft KV sliding-window pass.

Rewires every call of a registered attention op (``attention_registry``) to
read windowed ``seq_lens`` and a gathered windowed block table. The window
code (``dspark_compile.arithmetic.window``) is inserted as plain ATen ops once per
distinct ``(seq_lens, block_table, block_size)`` (and, for per-token calls,
``query_start_loc`` and token count), right before the first call that reads
it; every later call reuses it. Host mirrors are windowed with the same
arithmetic (once per distinct mirror) and scalar upper bounds become
``min(bound, windowed_len_bound)``. slot_mapping and KV writes are never
touched: they are not attention-op inputs.

Two forms:
- per request (non-causal calls, and ops without ``per_token_window``): the
  table starts at the window of each request's last position; every query
  sees ``[start, seq_len)``.
- per token (causal calls of ops with ``per_token_window``, e.g.
  ``dspark.paged_attention``): the table starts at the window of each
  request's FIRST query and is ``max_window_blocks(W, b, T)`` wide, T the
  graph's token count (an upper bound of every q_len; symbolic under dynamic
  shapes); the call also gets ``kv_offset``, ``window_size`` and
  ``future_offset`` and hides, per query, the keys before its own ``lo(p)``.

Attention sinks (``draft_sink_size`` S > 0, docs/design.md "Attention sinks"):
every windowing call gets ``sink_size=S``, so each windowed table starts with
``kept = min(ceil(S / b), start_block)`` sink blocks and is ``ceil(S / b)``
columns wider, the windowed lengths count the kept sink tokens, host mirrors
are windowed the same way and scalar bounds are capped at
``windowed_len_bound(..., sink_size=S)``. Per-request calls need nothing more
(the op reads ``[0, windowed_len)`` of the table, sinks first, in position
order); per-token calls also get the op's ``sink_size`` argument, and an op
whose ``PerTokenWindowArgs`` has no ``sink_size`` makes the pass raise. With
S = 0 the inserted code and the rewired calls are exactly those without sinks.
"""

from __future__ import annotations

import functools
import logging
from typing import Any, Optional

import torch
import torch.fx
from torch.torch_version import TorchVersion

from dspark_compile.arithmetic import window
from dspark_compile.config import DraftWindowConfig
from dspark_compile.passes import stats as keys
from dspark_compile.passes.attention_registry import (
    AttentionOpSpec,
    PerTokenWindowArgs,
    attention_op_specs,
)
from dspark_compile.passes.base import GraphPass
from dspark_compile.passes.graph_utils import (
    Decompositions,
    find_calls,
    get_arg,
    inductor_decompositions,
    insert_traced,
    set_arg,
)

logger = logging.getLogger(__name__)

DECOMPOSITION_MODES = ("inductor", "none")


class DraftWindowPass(GraphPass):
    """Window every registered attention call of a draft graph.

    ``decompositions``: ``"inductor"`` traces the window code with Inductor's
    decomposition table (for ``compile_fx``); ``"none"`` keeps plain core
    ATen ops (for the eager/aot lowering and torchair).
    """

    name = keys.DRAFT_WINDOW_PASS
    stat_keys = (
        keys.ATTENTION_CALLS,
        keys.REWRITTEN,
        keys.WINDOW_COMPUTATIONS,
        keys.HOST_MIRRORS_WINDOWED,
        keys.UPPER_BOUNDS_WINDOWED,
    )  # and keys.WITH_SINKS when draft_sink_size > 0

    def __init__(self, config: DraftWindowConfig, decompositions: str = "inductor") -> None:
        if decompositions not in DECOMPOSITION_MODES:
            raise ValueError(
                f"decompositions={decompositions!r} is invalid: expected one of "
                f"{', '.join(DECOMPOSITION_MODES)}"
            )
        self.window_config = config
        self.decompositions = decompositions

    def config(self) -> dict[str, Any]:
        specs = sorted(str(spec) for spec in attention_op_specs().values())
        return {
            "window": self.window_config.as_dict(),
            "decompositions": self.decompositions,
            "attention_ops": specs,
        }

    def _decomposition_table(self) -> Decompositions:
        return inductor_decompositions() if self.decompositions == "inductor" else None

    def apply(self, graph: torch.fx.Graph) -> dict[str, int]:
        sink_size = self.window_config.draft_sink_size
        stats = self.new_stats(*((keys.WITH_SINKS,) if sink_size else ()))
        specs = attention_op_specs()
        calls = find_calls(graph, specs)
        stats[keys.ATTENTION_CALLS] = len(calls)
        if not self.window_config.enabled or not calls:
            return stats
        windows: dict[tuple, tuple[torch.fx.Node, ...]] = {}
        mirrors: dict[tuple, torch.fx.Node] = {}
        for call in calls:
            spec = specs[call.target]
            block_size = self._block_size(call, spec)
            params = (
                self.window_config.draft_window_size,
                block_size,
                self.window_config.resolved_future_offset,
            )
            sinks = {"sink_size": sink_size} if sink_size else {}
            seq_lens = get_arg(call, spec.arg_index(spec.seq_lens), spec.seq_lens)
            table = get_arg(call, spec.arg_index(spec.block_table), spec.block_table)
            per_token = _per_token_args(call, spec)
            if per_token is not None and sink_size and per_token.sink_size is None:
                raise ValueError(
                    f"draft_sink_size={sink_size} is not supported by {call.name} "
                    f"({spec.op}): its causal calls get the per-token window, and its "
                    "registered PerTokenWindowArgs name no sink_size argument; register "
                    "the op with PerTokenWindowArgs(sink_size=...) or set draft_sink_size=0"
                )
            max_query_len = 1
            if per_token is None:
                key = (seq_lens, table, block_size)
                inputs = [seq_lens, table]
                fn = functools.partial(
                    _window_fn(),
                    window_size=params[0],
                    block_size=params[1],
                    future_offset=params[2],
                    **sinks,
                )
            else:
                query = get_arg(call, spec.arg_index(per_token.query), per_token.query)
                locs = get_arg(
                    call, spec.arg_index(per_token.query_start_loc), per_token.query_start_loc
                )
                max_query_len = query.meta["val"].shape[0]
                key = (seq_lens, table, block_size, locs, str(max_query_len))
                inputs = [seq_lens, table, locs, query]
                fn = functools.partial(
                    _causal_window,
                    window_fn=_causal_window_fn(),
                    window_size=params[0],
                    block_size=params[1],
                    future_offset=params[2],
                    **sinks,
                )
            if key not in windows:
                windows[key] = insert_traced(graph, call, fn, inputs, self._decomposition_table())
                stats[keys.WINDOW_COMPUTATIONS] += 1
            windowed_lens, windowed_table = windows[key][:2]
            set_arg(call, spec.arg_index(spec.seq_lens), spec.seq_lens, windowed_lens)
            set_arg(call, spec.arg_index(spec.block_table), spec.block_table, windowed_table)
            if per_token is not None:
                window_args = [
                    (per_token.kv_offset, windows[key][2]),
                    (per_token.window_size, params[0]),
                    (per_token.future_offset, params[2]),
                ]
                if sink_size:
                    window_args.append((per_token.sink_size, sink_size))
                for name, value in window_args:
                    set_arg(call, spec.arg_index(name), name, value)
            if sink_size:
                stats[keys.WITH_SINKS] += 1
            for name in spec.host_seq_lens:
                mirror = get_arg(call, spec.arg_index(name), name)
                if not isinstance(mirror, torch.fx.Node):
                    continue
                if (mirror, block_size) not in mirrors:
                    fn = functools.partial(
                        window.window_seq_lens,
                        window_size=params[0],
                        block_size=params[1],
                        future_offset=params[2],
                        **sinks,
                    )
                    mirrors[(mirror, block_size)] = insert_traced(
                        graph, call, fn, [mirror], self._decomposition_table()
                    )
                    stats[keys.HOST_MIRRORS_WINDOWED] += 1
                set_arg(call, spec.arg_index(name), name, mirrors[(mirror, block_size)])
            for name in spec.upper_bounds:
                bound = get_arg(call, spec.arg_index(name), name)
                new_bound = _window_bound(graph, call, bound, *params, max_query_len, sink_size)
                if new_bound is not None:
                    set_arg(call, spec.arg_index(name), name, new_bound)
                    stats[keys.UPPER_BOUNDS_WINDOWED] += 1
            stats[keys.REWRITTEN] += 1
        graph.lint()
        return stats

    def _block_size(self, call: torch.fx.Node, spec: AttentionOpSpec) -> int:
        """The option ``block_size`` if set (checked against a static cache
        shape), else the cache's static dim 1."""
        size = None
        if spec.kv_cache is not None:
            cache = get_arg(call, spec.arg_index(spec.kv_cache), spec.kv_cache)
            if isinstance(cache, torch.fx.Node):
                size = cache.meta["val"].shape[1]
        override = self.window_config.block_size
        if override is not None:
            if isinstance(size, int) and size != override:
                raise ValueError(
                    f"block_size={override} does not match the KV cache of "
                    f"{call.name} ({spec.op}), whose block size is {size}"
                )
            return override
        if not isinstance(size, int):
            raise ValueError(
                f"the KV block size of {call.name} ({spec.op}) is not static ({size!r}): set "
                "the block_size option, or torch._dynamo.mark_static(cache, 1)"
            )
        return size


def _window_fn():
    """The window code the pass inserts.

    torch >= 2.14: the packed form (one buffer, one kernel for every layer).
    Older Inductor miscompiles the packed form on CPU (wrong lengths, measured
    with torch 2.11 on 2026-11-30), so there the pass inserts two tensors.
    """
    if TorchVersion(torch.__version__) >= "2.14":
        return window.window_seq_lens_and_block_table_packed
    return window.window_seq_lens_and_block_table


def _per_token_args(call: torch.fx.Node, spec: AttentionOpSpec) -> Optional[PerTokenWindowArgs]:
    """The spec's per-token arguments if this call gets the per-token form
    (a constant ``causal=True``), else None. A call that already carries a
    window of its own is an error: the pass cannot combine two windows."""
    args = spec.per_token_window
    if args is None:
        return None
    own = get_arg(call, spec.arg_index(args.window_size), args.window_size)
    if own is not None:
        raise ValueError(
            f"{call.name} ({spec.op}) already has window_size={own!r}: the "
            "draft window cannot be combined with a window of the call's own"
        )
    causal = get_arg(call, spec.arg_index(args.causal), args.causal)
    return args if causal is True else None


def _causal_window(
    seq_lens,
    block_table,
    query_start_loc,
    query,
    *,
    window_fn,
    window_size,
    block_size,
    future_offset,
    sink_size=0,
):
    """The per-token window code; ``query``'s token count bounds every q_len
    (traced as ``sym_size`` when symbolic)."""
    sinks = {"sink_size": sink_size} if sink_size else {}
    return window_fn(
        seq_lens,
        block_table,
        query_start_loc,
        window_size,
        block_size,
        future_offset,
        max_query_len=query.shape[0],
        **sinks,
    )


def _causal_window_fn():
    """Packed on torch >= 2.14, three tensors before (see ``_window_fn``)."""
    if TorchVersion(torch.__version__) >= "2.14":
        return window.causal_window_metadata_packed
    return window.causal_window_metadata


def _window_bound(
    graph: torch.fx.Graph,
    call: torch.fx.Node,
    bound: Any,
    window_size: int,
    block_size: int,
    future_offset: int,
    max_query_len: Any = 1,
    sink_size: int = 0,
) -> Optional[Any]:
    """``min(bound, W - K + b - 2 + max_query_len + S_b)`` for an int or a
    SymInt-valued node (``S_b = ceil(S / b) * b`` sink tokens); None: leave it
    (also when ``max_query_len`` is symbolic: a bound of seq_lens still bounds
    the windowed lengths, sinks included, as they are never more than seq_lens)."""
    if not isinstance(max_query_len, int):
        return None
    cap = window.windowed_len_bound(
        window_size, block_size, future_offset, max_query_len, sink_size
    )
    if isinstance(bound, int) and not isinstance(bound, bool):
        return min(bound, cap)
    if isinstance(bound, torch.fx.Node) and isinstance(bound.meta.get("val"), torch.SymInt):
        with graph.inserting_before(call):
            node = graph.call_function(torch.sym_min, (bound, cap))
        node.meta["val"] = torch.sym_min(bound.meta["val"], cap)
        return node
    return None
