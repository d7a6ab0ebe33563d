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

GE convertibility of a graph: ``routes.ge_converters``; ``check_ascend``:
``tools.ascend_check``. Constraints: docs/design.md, "Ascend route".
"""

from __future__ import annotations

import functools
import importlib
import logging
from typing import Any, Sequence

import torch
import torch.fx

from dspark_compile.passes.manager import PassManager
from dspark_compile.validation import check_choice

logger = logging.getLogger(__name__)

TORCHAIR_MODES = ("max-autotune", "reduce-overhead", "npugraph_ex")


def on_npu(example_inputs: Sequence[Any]) -> bool:
    """True when any example input tensor lives on an Ascend ``npu`` device."""
    return any(isinstance(x, torch.Tensor) and x.device.type == "npu" for x in example_inputs)


def compile_with_torchair(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    manager: PassManager,
    torchair_mode: str = "max-autotune",
):
    """Compile ``gm`` (a Dynamo graph) for the NPU with ``manager``'s passes on its ATen graph."""
    check_choice("torchair_mode", torchair_mode, TORCHAIR_MODES)
    if torchair_mode == "npugraph_ex":
        return _compile_with_npugraph_ex(gm, example_inputs, manager)
    torchair = _import_or_explain("torchair", "torchair_mode=" + repr(torchair_mode))
    config = torchair.CompilerConfig()
    if not hasattr(config, "post_grad_custom_post_pass"):
        raise RuntimeError(
            "this torchair's CompilerConfig has no post_grad_custom_post_pass: "
            "upgrade torchair, or use torchair_mode='npugraph_ex'"
        )
    config.mode = torchair_mode
    config.post_grad_custom_post_pass = functools.partial(_run_passes_torchair, manager)
    logger.debug("compiling for the NPU with torchair (mode %s)", torchair_mode)
    return torchair.get_npu_backend(compiler_config=config)(gm, example_inputs)


def _run_passes_torchair(
    manager: PassManager,
    graph_module: torch.fx.GraphModule,
    example_inputs: Any = None,
    config: Any = None,
) -> torch.fx.GraphModule:
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

    logger.debug("compiling for the NPU with npugraph_ex")
    return aot_autograd(fw_compiler=forward_compiler, keep_inference_input_mutations=True)(
        gm, example_inputs
    )


def _import_or_explain(module: str, needed_for: str):
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise RuntimeError(
            f"{needed_for} needs the '{module}' package (Ascend NPU with CANN): {error}"
        ) from error
