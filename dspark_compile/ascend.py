"""Ascend NPU route: our passes on the ATen graph, then torchair (untested on hardware).

``compile_with_torchair`` is what ``backend="dspark"`` does when the example
inputs live on an ``npu`` device. ``torchair_mode`` selects the compiler:

- ``"max-autotune"``: torchair's GE graph mode (only ops with a GE converter
  lower; see ``check_ascend``);
- ``"reduce-overhead"``: torchair's aclgraph mode (torch_npu eager kernels,
  captured);
- ``"npugraph_ex"``: ``npugraph_ex.compile_fx`` on the ATen graph.

In the torchair modes our ``PassManager`` is torchair's
``CompilerConfig.post_grad_custom_post_pass``, so it runs on the ATen graph
inside torchair's own ``aot_autograd``; for npugraph_ex it runs inside ours.

``check_ascend`` lists the ops of a traced graph that the GE mode cannot
convert, from ``data/torchair_ge_converters.txt`` (torchair's converter
registry, source in the file's header).
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import importlib.resources
import logging
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, Union

import torch
import torch.fx

from dspark_compile.passes.manager import PassManager

logger = logging.getLogger(__name__)

TORCHAIR_MODES = ("max-autotune", "reduce-overhead", "npugraph_ex")

# Python callables torchair's FX interpreter lowers through a GE converter;
# every other builtin callable (operator.getitem, ...) it evaluates in Python.
_CONVERTED_BUILTINS = frozenset({
    "operator.add", "operator.sub", "operator.mul", "operator.truediv", "operator.floordiv",
    "operator.pow", "operator.mod", "operator.neg", "math.floor", "math.ceil"})
_PYTHON_MODULES = {"_operator": "operator", "operator": "operator", "builtins": "builtins",
                   "math": "math"}


def on_npu(example_inputs: Sequence[Any]) -> bool:
    """True when any example input tensor lives on an Ascend ``npu`` device."""
    return any(isinstance(x, torch.Tensor) and x.device.type == "npu" for x in example_inputs)


def compile_with_torchair(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                          manager: PassManager, torchair_mode: str = "max-autotune"):
    """Compile ``gm`` (a Dynamo graph) for the NPU with ``manager``'s passes on its ATen graph."""
    if torchair_mode not in TORCHAIR_MODES:
        raise ValueError(f"torchair_mode={torchair_mode!r} is invalid: expected one of "
                         f"{', '.join(TORCHAIR_MODES)}")
    if torchair_mode == "npugraph_ex":
        return _compile_with_npugraph_ex(gm, example_inputs, manager)
    torchair = _import_or_explain("torchair", "torchair_mode=" + repr(torchair_mode))
    config = torchair.CompilerConfig()
    if not hasattr(config, "post_grad_custom_post_pass"):
        raise RuntimeError("this torchair's CompilerConfig has no post_grad_custom_post_pass: "
                           "upgrade torchair, or use torchair_mode='npugraph_ex'")
    config.mode = torchair_mode
    config.post_grad_custom_post_pass = functools.partial(_run_passes_torchair, manager)
    logger.info("compiling for the NPU with torchair (mode %s)", torchair_mode)
    return torchair.get_npu_backend(compiler_config=config)(gm, example_inputs)


def _run_passes_torchair(manager: PassManager, graph_module: torch.fx.GraphModule,
                         example_inputs: Any = None, config: Any = None) -> torch.fx.GraphModule:
    """torchair's custom-pass signature: ``pass(gm, example_inputs, config)``."""
    manager(graph_module.graph)
    graph_module.recompile()
    return graph_module


def _compile_with_npugraph_ex(gm, example_inputs, manager: PassManager):
    from torch._dynamo.backends.common import aot_autograd

    try:
        compile_fx = importlib.import_module("npugraph_ex").compile_fx
    except ModuleNotFoundError:
        _import_or_explain("torch_npu", "torchair_mode='npugraph_ex'")
        compile_fx = torch.npu.npugraph_ex.compile_fx  # type: ignore[attr-defined]

    def forward_compiler(graph_module: torch.fx.GraphModule, inputs):
        _run_passes_torchair(manager, graph_module)
        return compile_fx(graph_module, inputs)

    logger.info("compiling for the NPU with npugraph_ex")
    return aot_autograd(fw_compiler=forward_compiler,
                        keep_inference_input_mutations=True)(gm, example_inputs)


def _import_or_explain(module: str, needed_for: str):
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise RuntimeError(f"{needed_for} needs the '{module}' package (Ascend NPU with CANN): "
                           f"{error}") from error


# --------------------------------------------------------------------------- GE convertibility

@functools.lru_cache(maxsize=None)
def ge_convertible_ops() -> frozenset[str]:
    """Names of the ops torchair's GE graph mode converts (``torch.ops.aten.add.Tensor``...)."""
    text = importlib.resources.files("dspark_compile").joinpath(
        "data/torchair_ge_converters.txt").read_text()
    return frozenset(line.strip() for line in text.splitlines()
                     if line.strip() and not line.startswith("#"))


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
            return (f"every op of {self.num_graphs} graph(s) ({self.num_nodes} nodes) is "
                    "convertible by torchair's GE graph mode")
        lines = [f"{len(self.unsupported)} op(s) torchair's GE graph mode cannot convert "
                 f"({self.num_graphs} graph(s), {self.num_nodes} nodes):"]
        for name, nodes in sorted(self.unsupported.items()):
            shown = ", ".join(nodes[:5]) + (", ..." if len(nodes) > 5 else "")
            lines.append(f"  {name}  ({len(nodes)} node(s): {shown})")
        return "\n".join(lines)


GraphLike = Union[torch.fx.GraphModule, torch.fx.Graph]


def check_ascend(fn_or_graph: Union[GraphLike, Callable[..., Any]], *example_inputs: Any,
                 options: Optional[Mapping[str, Any]] = None) -> AscendCheck:
    """List the ops torchair's GE graph mode cannot convert, before you reach the NPU.

    ``fn_or_graph``: an ATen ``torch.fx.GraphModule``/``Graph`` (checked as is),
    or a function / ``nn.Module`` that is traced with ``backend="dspark"``
    (``options`` as for ``torch.compile``; eager lowering, so it runs once on
    ``example_inputs``) and whose post-pass ATen graphs are checked - what the
    NPU route hands to torchair.
    """
    if isinstance(fn_or_graph, (torch.fx.GraphModule, torch.fx.Graph)):
        graphs = [fn_or_graph.graph if isinstance(fn_or_graph, torch.fx.GraphModule)
                  else fn_or_graph]
    elif callable(fn_or_graph):
        graphs = trace_post_pass_graphs(fn_or_graph, example_inputs, options)
    else:
        raise TypeError(f"fn_or_graph={fn_or_graph!r} is invalid: expected a torch.fx.GraphModule, "
                        "a torch.fx.Graph, a function or an nn.Module")
    unsupported: dict[str, list[str]] = {}
    for graph in graphs:
        for name, nodes in unconvertible_ops(graph.nodes).items():
            unsupported.setdefault(name, []).extend(nodes)
    return AscendCheck(unsupported, len(graphs), sum(len(g.nodes) for g in graphs))


def trace_post_pass_graphs(fn: Callable[..., Any], example_inputs: Sequence[Any],
                           options: Optional[Mapping[str, Any]] = None) -> list[torch.fx.Graph]:
    """ATen graphs of ``fn`` after our passes (``lowering="aot_eager"``, decompositions "none")."""
    from dspark_compile.backend import dspark_backend, graph_hook

    options = dict(options or {})
    options["lowering"] = "aot_eager"
    graphs: dict[int, torch.fx.Graph] = {}

    def remember(stage: str, graph: torch.fx.Graph) -> None:
        graphs.setdefault(id(graph), graph)

    backend = functools.partial(dspark_backend, options=options)
    with graph_hook(remember), torch.no_grad():
        torch.compile(fn, backend=backend, dynamic=False)(*example_inputs)
    return list(graphs.values())
