"""Base class of our graph passes over Inductor's post-grad ATen graph."""

from __future__ import annotations

import hashlib
import inspect
import json
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from dspark_compile.passes.source_hash import PASS_SOURCES, source_hash


class GraphPass(CustomGraphPass):
    """One graph rewrite with a config.

    Subclasses set ``name`` (a constant of ``passes.stats``), implement
    ``apply(graph) -> stats`` (counters keyed by ``passes.stats`` constants)
    and ``config()`` (a JSON-able dict). ``uuid()`` hashes the class source, the
    source files of every layer the passes draw on (``source_hash.PASS_SOURCES``)
    and the config, so Inductor's FX graph cache keys on all three.
    """

    name: str = "graph_pass"

    def apply(self, graph: torch.fx.Graph) -> dict[str, int]:
        raise NotImplementedError(f"{type(self).__name__} must implement apply()")

    def config(self) -> dict[str, Any]:
        return {}

    def __call__(self, graph: torch.fx.Graph) -> None:
        self.apply(graph)

    def uuid(self) -> str:
        hasher = hashlib.sha256()
        for cls in type(self).__mro__:
            if cls is GraphPass:
                break
            hasher.update(inspect.getsource(cls).encode())
        hasher.update(source_hash(PASS_SOURCES).encode())
        hasher.update(json.dumps(self.config(), sort_keys=True, default=str).encode())
        return hasher.hexdigest()
