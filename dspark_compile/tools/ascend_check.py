"""``check_ascend``: which ops of a draft's post-pass graph torchair's GE mode cannot convert."""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional, Union

import torch
import torch.fx

from dspark_compile.routes.ge_converters import unconvertible_ops
from dspark_compile.tools.post_pass_graphs import trace_passes


@dataclasses.dataclass
class AscendCheck:
    """Result of ``check_ascend``: ``unsupported`` maps op name -> node names."""

    unsupported: dict[str, list[str]]
    num_graphs: int
    num_nodes: int

    @property
    def ok(self) -> bool:
        return not self.unsupported

    def __str__(self) -> str:
        if self.ok:
            return (
                f"every op of {self.num_graphs} graph(s) ({self.num_nodes} nodes) is "
                "convertible by torchair's GE graph mode"
            )
        lines = [
            f"{len(self.unsupported)} op(s) torchair's GE graph mode cannot convert "
            f"({self.num_graphs} graph(s), {self.num_nodes} nodes):"
        ]
        for name, nodes in sorted(self.unsupported.items()):
            shown = ", ".join(nodes[:5]) + (", ..." if len(nodes) > 5 else "")
            lines.append(f"  {name}  ({len(nodes)} node(s): {shown})")
        return "\n".join(lines)


GraphLike = Union[torch.fx.GraphModule, torch.fx.Graph]


def check_ascend(
    fn_or_graph: Union[GraphLike, Callable[..., Any]],
    *example_inputs: Any,
    options: Optional[Mapping[str, Any]] = None,
    inserted_only: bool = False,
) -> AscendCheck:
    """List the ops torchair's GE graph mode cannot convert, before you reach the NPU.

    ``fn_or_graph``: an ATen ``torch.fx.GraphModule``/``Graph`` (checked as is),
    or a function / ``nn.Module`` that is traced with ``backend="dspark"``
    (``options`` as for ``torch.compile``; eager lowering, so it runs once on
    ``example_inputs``) and whose post-pass ATen graphs are checked - what the
    NPU route hands to torchair. ``inserted_only``: check only the nodes our
    passes insert (then ``num_nodes`` counts those).
    """
    if isinstance(fn_or_graph, (torch.fx.GraphModule, torch.fx.Graph)):
        graphs = [
            fn_or_graph.graph if isinstance(fn_or_graph, torch.fx.GraphModule) else fn_or_graph
        ]
    elif callable(fn_or_graph):
        trace = trace_passes(fn_or_graph, example_inputs, options)
        if inserted_only:
            return AscendCheck(
                unconvertible_ops(trace.inserted), len(trace.graphs), len(trace.inserted)
            )
        graphs = trace.graphs
    else:
        raise TypeError(
            f"fn_or_graph={fn_or_graph!r} is invalid: expected a torch.fx.GraphModule, "
            "a torch.fx.Graph, a function or an nn.Module"
        )
    unsupported: dict[str, list[str]] = {}
    for graph in graphs:
        for name, nodes in unconvertible_ops(graph.nodes).items():
            unsupported.setdefault(name, []).extend(nodes)
    return AscendCheck(unsupported, len(graphs), sum(len(g.nodes) for g in graphs))
