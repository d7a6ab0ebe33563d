"""Trace a function with ``backend="dspark"`` and keep its ATen graphs after our passes."""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable, Mapping, Optional, Sequence

import torch
import torch.fx

from dspark_compile.backend import dspark_backend, graph_hook


@dataclasses.dataclass
class PassTrace:
    """The post-pass ATen graphs of one traced run and the nodes our passes inserted."""

    graphs: list[torch.fx.Graph]
    inserted: list[torch.fx.Node]


def trace_passes(
    fn: Callable[..., Any],
    example_inputs: Sequence[Any],
    options: Optional[Mapping[str, Any]] = None,
) -> PassTrace:
    """Run ``fn(*example_inputs)`` once, compiled with ``lowering="aot_eager"``
    (decompositions "none": what the NPU route sees), and collect the graphs."""
    graphs: dict[int, torch.fx.Graph] = {}
    before: dict[int, set] = {}
    inserted: list[torch.fx.Node] = []

    def hook(stage: str, graph: torch.fx.Graph) -> None:
        graphs.setdefault(id(graph), graph)
        if stage.startswith("before_"):
            before[id(graph)] = set(graph.nodes)
        else:
            inserted.extend(
                n for n in graph.nodes if n not in before[id(graph)] and n not in inserted
            )

    backend = functools.partial(
        dspark_backend, options={**(options or {}), "lowering": "aot_eager"}
    )
    with graph_hook(hook), torch.no_grad():
        torch.compile(fn, backend=backend, dynamic=False)(*example_inputs)
    return PassTrace(list(graphs.values()), inserted)


def trace_post_pass_graphs(
    fn: Callable[..., Any],
    example_inputs: Sequence[Any],
    options: Optional[Mapping[str, Any]] = None,
) -> list[torch.fx.Graph]:
    """ATen graphs of ``fn`` after our passes (``lowering="aot_eager"``, decompositions "none")."""
    return trace_passes(fn, example_inputs, options).graphs
