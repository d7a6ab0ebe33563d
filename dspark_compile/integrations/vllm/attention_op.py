"""``torch.ops.dspark.unified_attention_with_output_windowed``: vLLM attention, windowed.

Same arguments and in-place semantics as ``vllm::unified_attention_with_output``
(writes ``output``; ``output_block_scale`` is in the mutation set too) plus
``window_size`` (W) and ``future_offset`` (K). At run time it reads the layer's
metadata from vLLM's forward context, windows it (``metadata.StepWindows``:
once per metadata object per step) and calls the layer's attention
implementation with it. slot_mapping and the KV-cache update op are untouched.
A layer that vLLM has not marked ``is_draft_layer`` is never windowed (it runs
with its own metadata, with one warning).

Importing this module registers the op (vLLM's ``direct_register_custom_op``,
so the schema matches vLLM's op). No ``from __future__ import annotations``
here: the schema is inferred from the signature's real types.
"""

import logging

import torch
from torch.library import Library

from vllm.compilation.breakable_cudagraph import eager_break_during_capture
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.attention.attention import get_attention_context
from vllm.model_executor.layers.attention.kv_transfer_utils import maybe_transfer_kv_layer
from vllm.utils.torch_utils import LayerNameType, _resolve_layer_name, direct_register_custom_op

from dspark_compile.integrations.vllm.metadata import StepWindows
from dspark_compile.validation import warn_once

logger = logging.getLogger(__name__)

OP_NAME = "unified_attention_with_output_windowed"
STEP_WINDOWS = StepWindows()


@eager_break_during_capture
@maybe_transfer_kv_layer
def unified_attention_with_output_windowed(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    output: torch.Tensor,
    layer_name: LayerNameType,
    window_size: int,
    future_offset: int,
    output_scale: torch.Tensor | None = None,
    output_block_scale: torch.Tensor | None = None,
    kv_cache_dummy_dep: torch.Tensor | None = None,
) -> None:
    del kv_cache_dummy_dep  # ordering dependency on the KV-cache update only
    name = _resolve_layer_name(layer_name)
    attn_metadata, layer, kv_cache, _ = get_attention_context(name)
    if attn_metadata is not None:
        if getattr(layer, "is_draft_layer", False):
            attn_metadata = STEP_WINDOWS.windowed(get_forward_context(), name, attn_metadata,
                                                  kv_cache, window_size, future_offset)
        else:
            warn_once(logger, f"not_draft:{name}",
                      "layer %s is not a draft layer (is_draft_layer is False): "
                      "its attention runs unwindowed", name)
    layer.impl.forward(layer, query, key, value, kv_cache, attn_metadata, output=output,
                       output_scale=output_scale, output_block_scale=output_block_scale)


_LIB = Library("dspark", "FRAGMENT")  # noqa: keeps the op alive with the module
direct_register_custom_op(
    op_name=OP_NAME,
    op_func=unified_attention_with_output_windowed,
    mutates_args=["output", "output_block_scale"],
    target_lib=_LIB,
)


def windowed_attention_op() -> torch._ops.OpOverload:
    return getattr(torch.ops.dspark, OP_NAME).default
