"""Runs our passes in order and records what each did (``pass_records()``).

A ``PassManager`` is itself a ``CustomGraphPass`` (installable as Inductor's
``post_grad_custom_post_pass``); its ``uuid()`` covers every pass's uuid and
the chained user pass, so the FX graph cache keys on the whole config.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import logging
from typing import Any, Callable, Optional, Sequence

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from dspark_compile.passes.base import GraphPass

logger = logging.getLogger(__name__)

_graph_ids = itertools.count()
_RECORDS: collections.deque = collections.deque(maxlen=256)


@dataclasses.dataclass(frozen=True)
class PassRecord:
    """What one pass did to one graph."""

    graph_id: int
    pass_name: str
    stats: dict[str, int]


def pass_records() -> list[PassRecord]:
    """Records of the most recent pass runs (oldest first, at most 256)."""
    return list(_RECORDS)


def clear_pass_records() -> None:
    _RECORDS.clear()


def new_graph_id() -> int:
    """A fresh id for one graph's records."""
    return next(_graph_ids)


def record_pass(graph_id: int, pass_name: str, stats: dict[str, int]) -> None:
    """Record what ``pass_name`` did to graph ``graph_id`` and log it at DEBUG."""
    _RECORDS.append(PassRecord(graph_id, pass_name, dict(stats)))
    logger.debug(
        "graph %d: %s: %s", graph_id, pass_name, ", ".join(f"{k}={v}" for k, v in stats.items())
    )


GraphHook = Callable[[str, torch.fx.Graph], None]


class PassManager(CustomGraphPass):
    """Apply ``passes`` then the ``chained`` pass (e.g. one the user set before).

    ``graph_hook(stage, graph)``, if given, is called with stage
    ``"before_<pass>"`` / ``"after_<pass>"`` around each pass (inspection).
    """

    def __init__(
        self,
        passes: Sequence[GraphPass],
        chained: Optional[Callable[[torch.fx.Graph], None]] = None,
        graph_hook: Optional[GraphHook] = None,
    ) -> None:
        self.passes = list(passes)
        self.chained = chained
        self.graph_hook = graph_hook

    def __call__(self, graph: torch.fx.Graph) -> None:
        graph_id = new_graph_id()
        for graph_pass in self.passes:
            if self.graph_hook is not None:
                self.graph_hook(f"before_{graph_pass.name}", graph)
            stats = graph_pass.apply(graph)
            record_pass(graph_id, graph_pass.name, stats)
            if self.graph_hook is not None:
                self.graph_hook(f"after_{graph_pass.name}", graph)
        if self.chained is not None:
            self.chained(graph)

    def uuid(self) -> Optional[Any]:
        parts = [p.uuid() for p in self.passes]
        if self.chained is not None:
            chained_uuid = getattr(self.chained, "uuid", lambda: None)()
            if chained_uuid is None:
                return None  # an unhashable user pass: no FX graph caching
            parts.append(str(chained_uuid))
        return hashlib.sha256("|".join(parts).encode()).hexdigest()
