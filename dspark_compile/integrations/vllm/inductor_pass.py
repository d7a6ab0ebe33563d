"""vLLM ``InductorPass`` that routes draft attention calls through the draft window.

It rewrites ``vllm::unified_attention_with_output`` calls of DRAFT layers
(functionalized v1/v2 or direct) into
``dspark::unified_attention_with_output_windowed`` with the same arguments
plus ``window_size``, ``future_offset`` and ``max_num_seqs`` (and, with
attention sinks, ``sink_size`` and ``max_num_tokens``); target-layer calls,
the KV-cache update op and slot_mapping are untouched.

Settings come from the ``VllmConfig`` of the model being compiled
(``compile_context.resolve_compile_context``: the ``@support_torch_compile``
module on the call stack, resolved once per compile; tests inject it with
``override_compile_context``), never from whatever config happens to be current.
A layer is a draft layer when vLLM 0.33's proposer marked it
``is_draft_layer`` or when the graph belongs to a model vLLM built under a
draft model tag (``draft_model``, ``eagle_head``, ``dflash_head``,
``dspark_head``; vLLM 0.32 sets no ``is_draft_layer``). Layer names are read
from the call (a string, a ``LayerName``, or a hoisted ``LayerName`` graph
input whose fake value keeps the real object) and looked up in
``compilation_config.static_forward_context``.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch
import torch.fx
from torch._higher_order_ops.auto_functionalize import auto_functionalized, auto_functionalized_v2

from dspark_compile.config import DraftWindowConfig
from dspark_compile.integrations.vllm import attention_op, seam
from dspark_compile.integrations.vllm.backends import SUPPORTED_BACKENDS
from dspark_compile.integrations.vllm.compile_context import (
    CompileContext,
    resolve_compile_context,
)
from dspark_compile.integrations.vllm.config import (
    ADDITIONAL_CONFIG_KEY,
    WindowOverrides,
    attention_is_split_out,
    resolve_window_config,
)
from dspark_compile.passes import stats as keys
from dspark_compile.passes.graph_utils import sync_eager_input_vals
from dspark_compile.passes.manager import new_graph_id, record_pass
from dspark_compile.passes.source_hash import PASS_SOURCES, source_hash
from dspark_compile.validation import log_once, warn_once

logger = logging.getLogger(__name__)

_FUNCTIONALIZED = (auto_functionalized, auto_functionalized_v2)

#: ``PASS_SOURCES`` plus the vLLM integration.
VLLM_PASS_SOURCES = PASS_SOURCES + ("integrations/vllm",)


class DraftWindowInductorPass(seam.InductorPass):
    """Draft KV sliding window as a vLLM post-grad custom pass.

    Arguments override what the ``VllmConfig`` says
    (``additional_config["draft_window_size"]`` and ``["draft_sink_size"]``,
    ``speculative_config.method`` and ``.num_speculative_tokens``); ``None``
    reads it. The config is that
    of the vLLM model being compiled, so one module-level instance serves
    every engine. ``uuid()`` covers the resolved config (two window sizes
    never share a compile-cache entry), the source files of the layers the
    pass draws on (``VLLM_PASS_SOURCES``) and the installed vLLM version.
    """

    def __init__(
        self,
        draft_window_size: Optional[int] = None,
        method: Optional[str] = None,
        num_speculative_tokens: Optional[int] = None,
        future_offset: Optional[int] = None,
        draft_sink_size: Optional[int] = None,
    ) -> None:
        self.overrides = WindowOverrides(
            draft_window_size, method, num_speculative_tokens, future_offset, draft_sink_size
        )

    def window_config(self, vllm_config: Any = None) -> DraftWindowConfig:
        """Resolved config for ``vllm_config`` (default: that of the model being compiled)."""
        if vllm_config is None:
            context = resolve_compile_context()
            vllm_config = context.vllm_config if context is not None else None
        return resolve_window_config(vllm_config, self.overrides)

    def uuid(self) -> str:
        return seam.InductorPass.hash_dict(
            {
                "source": seam.InductorPass.hash_source(
                    self, attention_op.unified_attention_with_output_windowed
                ),
                "files": source_hash(VLLM_PASS_SOURCES),
                "vllm": seam.vllm_version(),
                "window": self.window_config().as_dict(),
            }
        )

    name = keys.VLLM_DRAFT_WINDOW_PASS

    def __call__(self, graph: torch.fx.Graph) -> None:
        stats, details = self.rewrite(graph)
        record_pass(new_graph_id(), self.name, stats, details)

    def apply(
        self, graph: torch.fx.Graph, vllm_config: Any = None, model_tag: Optional[str] = None
    ) -> dict[str, int]:
        """Rewrite ``graph`` in place; returns counters of what was found and done
        (``rewrite``'s counters; recording is ``__call__``'s job)."""
        return self.rewrite(graph, vllm_config, model_tag)[0]

    def rewrite(
        self, graph: torch.fx.Graph, vllm_config: Any = None, model_tag: Optional[str] = None
    ) -> tuple[dict[str, int], dict[str, Any]]:
        """Rewrite ``graph`` in place; returns the counters of what was found and done,
        and, with the window on, the record's details: ``model_tag``,
        ``rewritten_layers`` (layer names, in graph order) and ``window`` (the resolved
        config's ``as_dict()``); ``{}`` with the window off.

        ``vllm_config``/``model_tag`` default to the compiling model's
        (``resolve_compile_context``). Raises ``RuntimeError`` when a window is
        configured but no vLLM config can be found, ``ValueError`` for a draft
        layer on an unsupported backend; warns when a draft graph reaches the
        pass without any attention call (attention split out of the graph).
        """
        context = None
        if vllm_config is None:
            context = resolve_compile_context()
            if context is not None:
                vllm_config, model_tag = context.vllm_config, context.model_tag
        config = resolve_window_config(vllm_config, self.overrides)
        stats = keys.new_stats(
            keys.ATTENTION_CALLS,
            keys.REWRITTEN,
            keys.TARGET_UNTOUCHED,
            keys.UNKNOWN_UNTOUCHED,
            keys.DRAFT_MLA_UNWINDOWED,
        )
        rewritten: list[str] = []
        if not config.enabled:
            _log_window_off_once(config)
            return stats, {}
        if vllm_config is None:
            raise RuntimeError(
                f"dspark draft window: draft_window_size={config.draft_window_size} is set but "
                "this graph is not compiled by vLLM (no VllmConfig on the call stack and none "
                "current): cannot tell draft layers from target layers"
            )
        _warn_if_attention_split_out(vllm_config)
        draft_graph = CompileContext(vllm_config, model_tag, "").is_draft_model
        if draft_graph:
            _warn_if_kv_spec_hook_missed(config)
        layers = _static_layers(vllm_config)
        max_num_seqs = _max_num_seqs(vllm_config)
        # Attention sinks: two more arguments, only when S > 0 (S = 0 emits the
        # call without sinks exactly as before).
        sinks = (
            {"sink_size": config.draft_sink_size, "max_num_tokens": _max_num_tokens(vllm_config)}
            if config.draft_sink_size
            else {}
        )
        seam.require("unified_attention_with_output")
        op = seam.attention_op()
        new_op = attention_op.windowed_attention_op()
        mla_op = seam.mla_attention_op()
        for node in list(graph.nodes):
            functionalized = node.op == "call_function" and node.target in _FUNCTIONALIZED
            target = node.args[0] if functionalized else node.target
            if target is mla_op and mla_op is not None:
                _warn_if_draft_mla(node, functionalized, layers, draft_graph, stats)
            if target is not op:
                continue
            stats[keys.ATTENTION_CALLS] += 1
            name = _layer_name(node, functionalized)
            layer = layers.get(name) if name is not None else None
            if layer is None:
                stats[keys.UNKNOWN_UNTOUCHED] += 1
                logger.warning(
                    "dspark draft window: cannot tell whether attention call %s "
                    "(layer %r) belongs to the draft: no such layer in "
                    "static_forward_context; left unwindowed",
                    node.name,
                    name,
                )
                continue
            if not (draft_graph or getattr(layer, "is_draft_layer", False)):
                stats[keys.TARGET_UNTOUCHED] += 1
                continue
            _check_backend(name, layer)
            extra = {
                "window_size": config.draft_window_size,
                "future_offset": config.resolved_future_offset,
                "max_num_seqs": max_num_seqs,
                **sinks,
            }
            _retarget(node, functionalized, new_op, extra)
            stats[keys.REWRITTEN] += 1
            rewritten.append(name)
        if draft_graph and stats[keys.REWRITTEN] == 0 and not attention_is_split_out(vllm_config):
            logger.warning(
                "dspark draft window is ON (draft_window_size=%d) but the draft model's graph "
                "(model tag %r) reached the pass with no attention call to window: its attention "
                "layers are not vllm::unified_attention_with_output calls; the draft runs "
                "unwindowed",
                config.draft_window_size,
                model_tag,
            )
        graph.lint()
        details = {
            "model_tag": model_tag,
            "rewritten_layers": rewritten,
            "window": config.as_dict(),
        }
        return stats, details


def _max_num_seqs(vllm_config: Any) -> int:
    scheduler = getattr(vllm_config, "scheduler_config", None)
    value = getattr(scheduler, "max_num_seqs", None)
    return int(value) if value else 1


def _max_num_tokens(vllm_config: Any) -> int:
    """Most tokens of a step (``scheduler_config.max_num_batched_tokens``; vLLM's
    proposers size their input buffers with it): rows of the per-token sink buffers."""
    scheduler = getattr(vllm_config, "scheduler_config", None)
    value = getattr(scheduler, "max_num_batched_tokens", None)
    return int(value) if value else 0


def _retarget(
    node: torch.fx.Node, functionalized: bool, new_op: Any, extra: dict[str, int]
) -> None:
    """Point a call at ``new_op`` with ``extra`` kwargs, keeping its meta consistent.

    Inductor re-traces ``auto_functionalized`` nodes from
    ``meta["eager_input_vals"]`` (same structure as args/kwargs), so it is
    updated alongside.
    """
    if functionalized:
        node.args = (new_op,) + tuple(node.args[1:])
    else:
        node.target = new_op
    node.kwargs = {**node.kwargs, **extra}
    sync_eager_input_vals(node, positions=(0,) if functionalized else (), names=tuple(extra))


def _warn_if_draft_mla(
    node: torch.fx.Node,
    functionalized: bool,
    layers: dict[str, Any],
    draft_graph: bool,
    stats: dict[str, int],
) -> None:
    name = _layer_name(node, functionalized)
    if not (draft_graph or getattr(layers.get(name), "is_draft_layer", False)):
        return
    stats[keys.DRAFT_MLA_UNWINDOWED] += 1
    logger.warning(
        "dspark draft window: draft layer %s uses MLA attention "
        "(vllm::unified_mla_attention_with_output), which the window does not "
        "support yet; its attention is left unwindowed",
        name,
    )


def _layer_name(node: torch.fx.Node, functionalized: bool) -> Optional[str]:
    """The layer name a call reads: constant str/LayerName or hoisted LayerName input."""
    value = seam.layer_name_value(node, functionalized)
    if isinstance(value, torch.fx.Node):
        value = value.meta.get("val")
        value = getattr(value, "real_obj", value)  # FakeScriptObject of a hoisted input
    return seam.layer_name_str(value)


def _static_layers(vllm_config: Any) -> dict[str, Any]:
    compilation = getattr(vllm_config, "compilation_config", None)
    return getattr(compilation, "static_forward_context", None) or {}


def _check_backend(name: str, layer: Any) -> None:
    backend = getattr(layer, "attn_backend", None)
    backend_name = backend.get_name() if backend is not None else None
    if backend_name not in SUPPORTED_BACKENDS:
        raise ValueError(
            f"draft layer {name} uses attention backend {backend_name!r}: the draft window "
            f"supports {', '.join(SUPPORTED_BACKENDS)} (set speculative_config's "
            "attention_backend to one of them)"
        )


def _warn_if_kv_spec_hook_missed(config: DraftWindowConfig) -> None:
    """The draft's KV-cache spec is decided before compilation (``kv_memory``); when
    that hook never ran in this process (a model runner other than vLLM's V1 and V2
    GPU runners), say that the memory is not bounded."""
    from dspark_compile.integrations.vllm import kv_memory

    if kv_memory.LAST_DECISION:
        return
    warn_once(
        logger,
        "kv_spec_hook_missed",
        f"dspark draft window (draft_window_size={config.draft_window_size}): the draft's KV "
        "memory is NOT bounded by the window: the KV-cache spec hook "
        "(kv_memory, on the V1 and V2 GPU model runners' get_kv_cache_spec) did not run "
        "in this process (a model runner it does not cover); "
        "vLLM keeps the draft's full KV cache (the output is unaffected)",
    )


def _warn_if_attention_split_out(vllm_config: Any) -> None:
    if not attention_is_split_out(vllm_config):
        return
    warn_once(
        logger,
        "attention_split_out",
        "dspark draft window is ON but does nothing: vLLM splits the graph at attention "
        "(compilation_config.splitting_ops contains vllm::unified_attention_with_output), "
        "so post-grad passes never see attention calls. Set compilation_config "
        '"splitting_ops": [] or "use_inductor_graph_partition": true',
    )


def _log_window_off_once(config: DraftWindowConfig) -> None:
    reason = (
        "method='mtp' (the window would window the target's own layers)"
        if config.method == "mtp"
        else f"no {ADDITIONAL_CONFIG_KEY!r} in vllm_config.additional_config and none "
        "passed to the pass"
    )
    log_once(
        logger,
        logging.INFO,
        "window_off",
        "dspark draft window off: %s; graphs left unchanged",
        reason,
    )
