"""Runs our passes in order; each run leaves one record (``passes/record.py``,
``pass_records()``) and a DEBUG log line.

A ``PassManager`` is itself a ``CustomGraphPass`` (installable as Inductor's
``post_grad_custom_post_pass``); its ``uuid()`` covers every pass's uuid and
the chained user pass, so the FX graph cache keys on the whole config.
"""

from __future__ import annotations

import hashlib
from typing import Any, Callable, Optional, Sequence

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from dspark_compile.passes.base import GraphPass

# The record lives in passes/record.py; these names stay importable from here.
from dspark_compile.passes.record import (  # noqa: F401
    GraphHook,
    PassRecord,
    clear_pass_records,
    new_graph_id,
    pass_records,
    record_pass,
    run_pass,
)


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
            run_pass(graph_pass, graph, graph_id, self.graph_hook)
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
