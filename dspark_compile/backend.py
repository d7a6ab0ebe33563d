"""The ``dspark`` torch.compile backend.

``torch.compile(fn, backend="dspark", options={...})``: options are the
``DraftWindowConfig`` fields plus ``BACKEND_OPTIONS``. The graph is lowered by
Inductor (``compile_fx`` with our ``PassManager`` as
``post_grad_custom_post_pass``, chained with any pass already set there), or
with ``lowering="aot_eager"`` run eagerly after our passes (debugging, fast
tests). When the example inputs live on an Ascend ``npu`` device the graph goes
to torchair instead (``dspark_compile.ascend``; untested on hardware).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from typing import Any, Mapping, Optional, Sequence

import torch

from dspark_compile.ascend import TORCHAIR_MODES, compile_with_torchair, on_npu
from dspark_compile.config import DraftWindowConfig
from dspark_compile.passes import DraftWindowPass, PassManager
from dspark_compile.passes.base import DSparkPass
from dspark_compile.passes.manager import GraphHook
from dspark_compile.passes.dspark_noncausal import DSparkNonCausalIndexPass

logger = logging.getLogger(__name__)

LOWERINGS = ("inductor", "aot_eager")
BACKEND_OPTIONS = ("lowering", "mode", "inductor_config", "torchair_mode")

_GRAPH_HOOK: contextvars.ContextVar[Optional[GraphHook]] = contextvars.ContextVar(
    "dspark_graph_hook", default=None)


@contextlib.contextmanager
def graph_hook(hook: GraphHook):
    """Within the block, every ``PassManager`` the backend builds calls ``hook(stage, graph)``
    before and after each pass (``dspark_compile.inspect`` uses it)."""
    token = _GRAPH_HOOK.set(hook)
    try:
        yield
    finally:
        _GRAPH_HOOK.reset(token)


def valid_options() -> tuple[str, ...]:
    """Every key ``options=`` accepts."""
    return DraftWindowConfig.field_names() + BACKEND_OPTIONS


def build_passes(config: DraftWindowConfig, decompositions: str) -> list[DSparkPass]:
    """The dspark passes for ``config``, in the order they run."""
    passes: list[DSparkPass] = [DraftWindowPass(config, decompositions=decompositions)]
    if config.method == "dspark":
        passes.append(DSparkNonCausalIndexPass(config))
    return passes


def parse_options(options: Optional[Mapping[str, Any]]) -> tuple[DraftWindowConfig, dict]:
    """Split ``options`` into the window config and backend settings; validate both."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(valid_options()))
    if unknown:
        raise ValueError(f"unknown dspark option(s) {unknown}: valid options are "
                         f"{', '.join(valid_options())}")
    backend = {key: options.pop(key) for key in BACKEND_OPTIONS if key in options}
    lowering = backend.setdefault("lowering", "inductor")
    if lowering not in LOWERINGS:
        raise ValueError(f"lowering={lowering!r} is invalid: expected one of {', '.join(LOWERINGS)}")
    inductor_config = backend.setdefault("inductor_config", {})
    if not isinstance(inductor_config, Mapping):
        raise ValueError(f"inductor_config={inductor_config!r} is invalid: expected a dict of "
                         "torch._inductor.config settings")
    torchair_mode = backend.setdefault("torchair_mode", "max-autotune")
    if torchair_mode not in TORCHAIR_MODES:
        raise ValueError(f"torchair_mode={torchair_mode!r} is invalid: expected one of "
                         f"{', '.join(TORCHAIR_MODES)}")
    return DraftWindowConfig.from_mapping(options), backend


def dspark_backend(gm: torch.fx.GraphModule, example_inputs: Sequence[Any],
                   options: Optional[Mapping[str, Any]] = None, mode: Optional[str] = None):
    """torch.compile backend: our passes, then Inductor (or eager) lowering."""
    config, backend = parse_options(options)
    mode = backend.get("mode", mode)
    if on_npu(example_inputs):
        return compile_with_torchair(gm, example_inputs, PassManager(
            build_passes(config, "none"), graph_hook=_GRAPH_HOOK.get()), backend["torchair_mode"])
    if backend["lowering"] == "aot_eager":
        return _compile_aot_eager(gm, example_inputs, config)
    return _compile_inductor(gm, example_inputs, config, mode, backend["inductor_config"])


def _compile_inductor(gm, example_inputs, config: DraftWindowConfig, mode: Optional[str],
                      inductor_config: Mapping[str, Any]):
    from torch._inductor import config as inductor_cfg
    from torch._inductor.compile_fx import compile_fx

    patches: dict[str, Any] = {}
    if mode is not None:
        patches.update(torch._inductor.list_mode_options(mode))
    patches.update(inductor_config)
    chained = patches.get("post_grad_custom_post_pass", inductor_cfg.post_grad_custom_post_pass)
    patches["post_grad_custom_post_pass"] = PassManager(
        build_passes(config, "inductor"), chained=chained, graph_hook=_GRAPH_HOOK.get())
    return compile_fx(gm, example_inputs, config_patches=patches)


def _compile_aot_eager(gm, example_inputs, config: DraftWindowConfig):
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    manager = PassManager(build_passes(config, "none"), graph_hook=_GRAPH_HOOK.get())

    def forward_compiler(graph_module: torch.fx.GraphModule, inputs):
        manager(graph_module.graph)
        graph_module.recompile()
        return make_boxed_func(graph_module)

    def backward_compiler(graph_module: torch.fx.GraphModule, inputs):
        return make_boxed_func(graph_module)

    return aot_autograd(fw_compiler=forward_compiler, bw_compiler=backward_compiler,
                        keep_inference_input_mutations=True)(gm, example_inputs)
