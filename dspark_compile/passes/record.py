"""The one record of what a pass did to a graph, and running a pass so it is recorded.

Every pass run, by ``PassManager``, by calling a ``GraphPass`` directly or by the vLLM
pass, goes through :func:`record_pass`: one :class:`PassRecord` (the pass's name and its
counters, keyed by ``passes.stats`` constants) per pass and graph, kept for
``pass_records()`` (the most recent 256) and logged at DEBUG.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
from typing import Callable, Optional, Protocol

import torch

logger = logging.getLogger(__name__)

_graph_ids = itertools.count()
_RECORDS: collections.deque = collections.deque(maxlen=256)

GraphHook = Callable[[str, torch.fx.Graph], None]


@dataclasses.dataclass(frozen=True)
class PassRecord:
    """What one pass did to one graph."""

    graph_id: int
    pass_name: str
    stats: dict[str, int]
    #: What the pass says beyond its counters (the vLLM pass: model tag, rewritten
    #: layers, resolved window); empty when it says nothing.
    details: dict = dataclasses.field(default_factory=dict)


class RecordedPass(Protocol):
    """What :func:`run_pass` needs of a pass (``GraphPass``, the vLLM pass)."""

    name: str

    def apply(self, graph: torch.fx.Graph) -> dict[str, int]: ...


def pass_records() -> list[PassRecord]:
    """Records of the most recent pass runs (oldest first, at most 256)."""
    return list(_RECORDS)


def clear_pass_records() -> None:
    _RECORDS.clear()


def new_graph_id() -> int:
    """A fresh id for one graph's records."""
    return next(_graph_ids)


def record_pass(
    graph_id: int, pass_name: str, stats: dict[str, int], details: Optional[dict] = None
) -> PassRecord:
    """Record what ``pass_name`` did to graph ``graph_id`` and log it at DEBUG."""
    record = PassRecord(graph_id, pass_name, dict(stats), dict(details or {}))
    _RECORDS.append(record)
    logger.debug(
        "graph %d: %s: %s", graph_id, pass_name, ", ".join(f"{k}={v}" for k, v in stats.items())
    )
    return record


def run_pass(
    graph_pass: RecordedPass,
    graph: torch.fx.Graph,
    graph_id: Optional[int] = None,
    graph_hook: Optional[GraphHook] = None,
) -> dict[str, int]:
    """``graph_pass.apply(graph)``, recorded under ``graph_id`` (default: a fresh one);
    returns its counters. ``graph_hook(stage, graph)`` is called with
    ``"before_<name>"`` before it and ``"after_<name>"`` after it is recorded."""
    graph_id = new_graph_id() if graph_id is None else graph_id
    if graph_hook is not None:
        graph_hook(f"before_{graph_pass.name}", graph)
    stats = graph_pass.apply(graph)
    record_pass(graph_id, graph_pass.name, stats)
    if graph_hook is not None:
        graph_hook(f"after_{graph_pass.name}", graph)
    return stats
