"""Base class of our graph passes over Inductor's post-grad ATen graph (the draft-window
pass, the DSpark non-causal index pass).

Modelled on vLLM's ``vllm/compilation`` passes: a small base with a ``name``, ``apply``
returning what it did, ``uuid()`` hashing its source and config; the pass manager runs the
passes and records what each did (``passes/record.py``: one ``PassRecord`` per pass run).
"""

from __future__ import annotations

import hashlib
import inspect
import json
from typing import Any

import torch
from torch._inductor.custom_graph_pass import CustomGraphPass

from dspark_compile.passes.record import run_pass
from dspark_compile.passes.source_hash import PASS_SOURCES, source_hash
from dspark_compile.passes.stats import new_stats


class GraphPass(CustomGraphPass):
    """One graph rewrite with a config.

    Subclasses set ``name`` (a constant of ``passes.stats``) and ``stat_keys`` (the
    counters every run reports, ``passes.stats`` constants, in order), implement
    ``apply(graph) -> stats`` (starting from ``new_stats()``) and ``config()`` (a
    JSON-able dict). ``uuid()`` hashes the class source, the source files of every
    layer the passes draw on (``source_hash.PASS_SOURCES``) and the config, so
    Inductor's FX graph cache keys on all three. Calling the pass applies it and
    records what it did, as the pass manager does.
    """

    name: str = "graph_pass"
    stat_keys: tuple[str, ...] = ()

    def new_stats(self, *extra: str) -> dict[str, int]:
        """``{key: 0}`` for ``stat_keys`` and then ``extra``, in order."""
        return new_stats(*self.stat_keys, *extra)

    def apply(self, graph: torch.fx.Graph) -> dict[str, int]:
        raise NotImplementedError(f"{type(self).__name__} must implement apply()")

    def config(self) -> dict[str, Any]:
        return {}

    def __call__(self, graph: torch.fx.Graph) -> None:
        run_pass(self, graph)

    def uuid(self) -> str:
        hasher = hashlib.sha256()
        for cls in type(self).__mro__:
            if cls is GraphPass:
                break
            hasher.update(inspect.getsource(cls).encode())
        hasher.update(source_hash(PASS_SOURCES).encode())
        hasher.update(json.dumps(self.config(), sort_keys=True, default=str).encode())
        return hasher.hexdigest()
