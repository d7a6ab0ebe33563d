"""Which FX targets torchair's GE graph mode can convert (the Ascend route's op constraint).

The list is ``data/torchair_ge_converters.txt`` (torchair's converter
registry; source in the file's header).
"""

from __future__ import annotations

import functools
import importlib.resources
from typing import Any, Iterable

import torch
import torch.fx

# Python callables torchair's FX interpreter lowers through a GE converter;
# every other builtin callable (operator.getitem, ...) it evaluates in Python.
_CONVERTED_BUILTINS = frozenset(
    {
        "operator.add",
        "operator.sub",
        "operator.mul",
        "operator.truediv",
        "operator.floordiv",
        "operator.pow",
        "operator.mod",
        "operator.neg",
        "math.floor",
        "math.ceil",
    }
)
_PYTHON_MODULES = {
    "_operator": "operator",
    "operator": "operator",
    "builtins": "builtins",
    "math": "math",
}


@functools.cache
def ge_convertible_ops() -> frozenset[str]:
    """Names of the ops torchair's GE graph mode converts (``torch.ops.aten.add.Tensor``...)."""
    text = (
        importlib.resources.files("dspark_compile")
        .joinpath("data/torchair_ge_converters.txt")
        .read_text()
    )
    return frozenset(
        line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")
    )


def op_name(target: Any) -> str:
    """The name torchair's converter registry uses for an FX ``call_function`` target."""
    if isinstance(target, torch._ops.OpOverload):
        return f"torch.ops.{target}"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"torch.ops.higher_order.{target.name()}"
    module = getattr(target, "__module__", None) or ""
    name = getattr(target, "__name__", None) or repr(target)
    module = _PYTHON_MODULES.get(module, module)
    return f"{module}.{name}" if module else name


def is_ge_convertible(target: Any) -> bool:
    """Whether torchair's GE mode can lower a node calling ``target``."""
    name = op_name(target)
    if name in ge_convertible_ops():
        return True
    module = name.split(".", 1)[0]
    if module in _PYTHON_MODULES.values() and name not in _CONVERTED_BUILTINS:
        return True  # evaluated in Python by torchair's interpreter
    short = getattr(target, "__name__", None)
    return short is not None and short in ge_convertible_ops()  # e.g. "sym_sqrt"


def unconvertible_ops(nodes: Iterable[torch.fx.Node]) -> dict[str, list[str]]:
    """``{op name: [node names]}`` of the ``call_function`` nodes GE mode cannot convert."""
    found: dict[str, list[str]] = {}
    for node in nodes:
        if node.op == "call_function" and not is_ge_convertible(node.target):
            found.setdefault(op_name(node.target), []).append(node.name)
        elif node.op in ("call_method", "call_module"):
            found.setdefault(f"{node.op}:{node.target}", []).append(node.name)
    return found
