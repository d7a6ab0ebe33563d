"""Helpers to insert traced torch code into an FX graph and to read op arguments."""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch
import torch.fx
from torch.fx.experimental.proxy_tensor import make_fx

Decompositions = Optional[dict]


def inductor_decompositions() -> dict:
    """Inductor's decomposition table (what its post-grad graphs are made of)."""
    from torch._inductor.decomposition import select_decomp_table

    return select_decomp_table()


def insert_traced(graph: torch.fx.Graph, before: torch.fx.Node, fn: Callable[..., Any],
                  inputs: Sequence[torch.fx.Node], decompositions: Decompositions = None,
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


def _trace(fn: Callable[..., Any], fake_args: Sequence[Any],
           decompositions: Decompositions) -> torch.fx.GraphModule:
    """make_fx over the graph's own fake tensors (their shape env and symbols)."""
    from torch._dispatch.python import enable_python_dispatcher
    from torch._guards import detect_fake_mode

    fake_mode = detect_fake_mode(fake_args)
    if fake_mode is None:
        raise RuntimeError("graph inputs of the window code carry no fake tensors in meta['val']")
    with enable_python_dispatcher(), fake_mode:
        return make_fx(fn, decomposition_table=decompositions, tracing_mode="real")(*fake_args)


def get_arg(node: torch.fx.Node, index: int, name: str) -> Any:
    """Argument ``name`` (schema position ``index``) of a call node."""
    if index < len(node.args):
        return node.args[index]
    return node.kwargs.get(name)


def set_arg(node: torch.fx.Node, index: int, name: str, value: Any) -> None:
    """Replace argument ``name`` (schema position ``index``) of a call node.

    Also updates ``meta["eager_input_vals"]``: Inductor lays custom-op inputs
    out with the strides recorded there, so a stale entry (the old input's
    shape) would make it copy the new input once per call.
    """
    if index < len(node.args):
        args = list(node.args)
        args[index] = value
        node.args = tuple(args)
    else:
        kwargs = dict(node.kwargs)
        kwargs[name] = value
        node.kwargs = kwargs
    if "eager_input_vals" in node.meta:
        fake_args, fake_kwargs = node.meta["eager_input_vals"]
        fake = value.meta.get("val") if isinstance(value, torch.fx.Node) else value
        if index < len(fake_args):
            fake_args = tuple(fake if i == index else a for i, a in enumerate(fake_args))
        else:
            fake_kwargs = {**fake_kwargs, name: fake}
        node.meta["eager_input_vals"] = (fake_args, fake_kwargs)
