"""Graph helpers of our passes: find calls, read and replace op arguments, insert traced code."""

from __future__ import annotations

from typing import Any, Callable, Iterable, Optional, Sequence

import torch
import torch.fx
from torch._inductor.pattern_matcher import get_arg_value
from torch.fx.experimental.proxy_tensor import make_fx

Decompositions = Optional[dict]


def inductor_decompositions() -> dict:
    """Inductor's decomposition table (what its post-grad graphs are made of)."""
    from torch._inductor.decomposition import select_decomp_table

    return select_decomp_table()


def insert_traced(
    graph: torch.fx.Graph,
    before: torch.fx.Node,
    fn: Callable[..., Any],
    inputs: Sequence[torch.fx.Node],
    decompositions: Decompositions = None,
) -> Any:
    """Trace ``fn(*inputs' meta values)`` to ATen and inline it before ``before``.

    Returns ``fn``'s output structure with tensors replaced by the new nodes.
    Inserted nodes carry ``meta["val"]`` (fake tensors) like the rest of a
    post-grad graph.
    """
    fake_args = [node.meta["val"] for node in inputs]
    traced = _trace(fn, fake_args, decompositions)
    env: dict[torch.fx.Node, torch.fx.Node] = {}
    placeholders = [n for n in traced.graph.nodes if n.op == "placeholder"]
    for placeholder, node in zip(placeholders, inputs):
        env[placeholder] = node
    result = None
    with graph.inserting_before(before):
        for node in traced.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "output":
                result = torch.fx.map_arg(node.args[0], env.__getitem__)
                break
            if node.op == "get_attr":
                raise RuntimeError(f"traced window code created a constant ({node.target})")
            env[node] = graph.node_copy(node, env.__getitem__)
    return result


def _trace(
    fn: Callable[..., Any], fake_args: Sequence[Any], decompositions: Decompositions
) -> torch.fx.GraphModule:
    """make_fx over the graph's own fake tensors (their shape env and symbols)."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._guards import detect_fake_mode

    fake_mode = detect_fake_mode(fake_args)
    if fake_mode is None:
        raise RuntimeError("graph inputs of the window code carry no fake tensors in meta['val']")
    with enable_python_dispatcher(), fake_mode:
        return make_fx(fn, decomposition_table=decompositions, tracing_mode="real")(*fake_args)


def find_calls(graph: torch.fx.Graph, targets: Iterable[Any]) -> list[torch.fx.Node]:
    """``call_function`` nodes of any of ``targets``, in graph order (``graph.find_nodes``)."""
    found: list[torch.fx.Node] = []
    for target in targets:
        found.extend(graph.find_nodes(op="call_function", target=target, sort=False))
    return sorted(found)


def schema_index(op: torch._ops.OpOverload, name: str) -> int:
    """Position of argument ``name`` in ``op``'s schema."""
    return [a.name for a in op._schema.arguments].index(name)


def get_arg(node: torch.fx.Node, index: int, name: str) -> Any:
    """Argument ``name`` (schema position ``index``) of a call node."""
    return get_arg_value(node, index, name)


def set_arg(node: torch.fx.Node, index: int, name: str, value: Any) -> None:
    """Replace argument ``name`` (schema position ``index``) of a call node.

    Also updates ``meta["eager_input_vals"]`` (see ``sync_eager_input_vals``).
    """
    if index < len(node.args):
        node.args = node.args[:index] + (value,) + node.args[index + 1 :]
        sync_eager_input_vals(node, positions=(index,))
    else:
        node.kwargs = {**node.kwargs, name: value}
        sync_eager_input_vals(node, names=(name,))


def sync_eager_input_vals(
    node: torch.fx.Node, positions: Iterable[int] = (), names: Iterable[str] = ()
) -> None:
    """Refresh ``node.meta["eager_input_vals"]`` for the changed arguments.

    Inductor lays custom-op inputs out with the strides recorded there at trace
    time, and re-traces ``auto_functionalized`` nodes from it; a stale entry
    (an old input's shape) would make it copy the new input once per call.
    ``positions``: changed ``node.args`` indices; ``names``: changed
    ``node.kwargs`` keys (added when absent). A node argument is recorded as
    its ``meta["val"]``, any other value as is. No-op without the entry.
    """
    if "eager_input_vals" not in node.meta:
        return
    args, kwargs = node.meta["eager_input_vals"]
    args, kwargs = list(args), dict(kwargs)

    def fake(value: Any) -> Any:
        return torch.fx.map_arg(value, lambda n: n.meta.get("val"))

    for index in positions:
        if index < len(args):
            args[index] = fake(node.args[index])
    for name in names:
        kwargs[name] = fake(node.kwargs.get(name))
    node.meta["eager_input_vals"] = (tuple(args), kwargs)
