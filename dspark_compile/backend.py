"""The ``dspark`` torch.compile backend.

``torch.compile(fn, backend="dspark", options={...})``: options are the
``DraftWindowConfig`` fields plus ``BACKEND_OPTIONS``, validated by
``dspark_compile.options`` (when each is checked: see there). The graph is lowered by
Inductor (``compile_fx`` with our ``PassManager`` as
``post_grad_custom_post_pass``, chained with any pass already set there), or
with ``lowering="aot_eager"`` run eagerly after our passes (debugging, fast
tests). When the example inputs live on an Ascend ``npu`` device the graph goes
to torchair instead (``dspark_compile.routes.torchair``; untested on hardware).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
from typing import Any, Callable, Mapping, Optional, Sequence

import torch

from dspark_compile.config import DraftWindowConfig
from dspark_compile.options import parse_options
from dspark_compile.passes.base import GraphPass
from dspark_compile.passes.draft_window import DraftWindowPass
from dspark_compile.passes.dspark_noncausal import DSparkNonCausalIndexPass
from dspark_compile.passes.manager import GraphHook, PassManager
from dspark_compile.routes.torchair import compile_with_torchair, on_npu

logger = logging.getLogger(__name__)

_GRAPH_HOOK: contextvars.ContextVar[Optional[GraphHook]] = contextvars.ContextVar(
    "dspark_graph_hook", default=None
)


@contextlib.contextmanager
def graph_hook(hook: GraphHook):
    """Within the block, every ``PassManager`` the backend builds calls ``hook(stage, graph)``
    before and after each pass (``dspark_compile.inspect`` uses it)."""
    token = _GRAPH_HOOK.set(hook)
    try:
        yield
    finally:
        _GRAPH_HOOK.reset(token)


@contextlib.contextmanager
def compile_caches_off():
    """Within the block, Inductor's FX graph cache and AOTAutograd's cache are off: a
    cache hit reuses the rewritten graph without running our passes, so nothing would
    be recorded (``pass_records``, ``graph_hook``)."""
    with contextlib.ExitStack() as stack:
        for config, key in (
            (torch._inductor.config, "fx_graph_cache"),
            (torch._functorch.config, "enable_autograd_cache"),
        ):
            if hasattr(config, key):
                stack.enter_context(config.patch({key: False}))
        yield


def build_passes(config: DraftWindowConfig, decompositions: str) -> list[GraphPass]:
    """Our passes for ``config``, in the order they run."""
    passes: list[GraphPass] = [DraftWindowPass(config, decompositions=decompositions)]
    if config.method == "dspark":
        passes.append(DSparkNonCausalIndexPass(config))
    return passes


def dspark_backend(
    gm: torch.fx.GraphModule,
    example_inputs: Sequence[Any],
    options: Optional[Mapping[str, Any]] = None,
    mode: Optional[str] = None,
):
    """torch.compile backend: our passes, then Inductor (or eager, or torchair) lowering."""
    config, settings = parse_options(options, mode)
    npu = on_npu(example_inputs)
    settings.check_route(npu)
    if npu:
        return compile_with_torchair(
            gm,
            example_inputs,
            PassManager(build_passes(config, "none"), graph_hook=_GRAPH_HOOK.get()),
            settings.resolved_torchair_mode,
        )
    if settings.lowering == "aot_eager":
        return _compile_aot_eager(gm, example_inputs, config)
    return _compile_inductor(gm, example_inputs, config, settings.mode, settings.inductor_config)


def configured_backend(
    options: Optional[Mapping[str, Any]] = None, mode: Optional[str] = None
) -> Callable[..., Any]:
    """``dspark_backend`` with ``options`` validated NOW (``torch.compile`` validates a
    string backend's options only at the first call)::

        torch.compile(draft, backend=configured_backend({"draft_window_size": 2048}))
    """
    parse_options(options, mode)
    options = dict(options or {})

    def dspark(gm: torch.fx.GraphModule, example_inputs: Sequence[Any]):
        return dspark_backend(gm, example_inputs, options=options, mode=mode)

    return dspark


def _compile_inductor(
    gm,
    example_inputs,
    config: DraftWindowConfig,
    mode: Optional[str],
    inductor_config: Mapping[str, Any],
):
    from torch._inductor import config as inductor_cfg
    from torch._inductor.compile_fx import compile_fx

    patches: dict[str, Any] = {}
    if mode is not None:
        patches.update(torch._inductor.list_mode_options(mode))
    patches.update(inductor_config)
    chained = patches.get("post_grad_custom_post_pass", inductor_cfg.post_grad_custom_post_pass)
    patches["post_grad_custom_post_pass"] = PassManager(
        build_passes(config, "inductor"), chained=chained, graph_hook=_GRAPH_HOOK.get()
    )
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

    return aot_autograd(
        fw_compiler=forward_compiler,
        bw_compiler=backward_compiler,
        keep_inference_input_mutations=True,
    )(gm, example_inputs)


def register_backend_name() -> None:
    """Make ``backend="dspark"`` resolve when the package was never pip-installed
    (a source checkout on ``PYTHONPATH`` has no ``torch_dynamo_backends`` entry
    point); an installed package's entry point is left to torch. Runs on import;
    reads only the entry-point metadata (torch's ``list_backends`` would import
    every Dynamo backend, ~0.7 s)."""
    from importlib.metadata import entry_points

    if any(ep.name == "dspark" for ep in entry_points(group="torch_dynamo_backends")):
        return
    from torch._dynamo.backends.registry import register_backend

    try:
        register_backend(name="dspark")(dspark_backend)
    except AssertionError:  # torch: "duplicate name": someone registered it already
        pass


register_backend_name()
