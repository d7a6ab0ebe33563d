"""``torch.ops.dspark.unified_attention_with_output_windowed``: vLLM attention, windowed.

Same arguments and in-place semantics as ``vllm::unified_attention_with_output``
(writes ``output``; ``output_block_scale`` is in the mutation set too) plus
``window_size`` (W), ``future_offset`` (K) and ``max_num_seqs`` (capacity of
the persistent window buffers), and, with attention sinks only, ``sink_size``
(S > 0) and ``max_num_tokens`` (row capacity of the per-token buffers). The
pass emits it only for draft layers. At run time, without sinks, it gives the
layer's attention implementation the backend's native per-token window of
``W - K`` tokens (in the windowed metadata instead where the forward reads the window
from there: ``backends.apply_native_window``), windows the layer's metadata from
vLLM's forward context (``metadata.StepWindows``: once per metadata object per step)
and calls the implementation with it; with sinks the layer keeps no native window
and gets the per-token expanded metadata instead (``metadata.sink_window_metadata``).
slot_mapping and the KV-cache update op are untouched.

The op is registered with ``torch.Tag.cudagraph_unsafe``: under
``use_inductor_graph_partition`` Inductor leaves it outside the captured
partitions, like vLLM's own attention ops (PIECEWISE graphs run it eagerly).
Under FULL CUDA graphs it is captured with the rest of the draft forward (its
buffers are persistent and it reads no host value that changes between
replays other than those vLLM itself freezes: see README, "CUDA graphs").

Importing this module registers the op (vLLM's ``direct_register_custom_op``,
so the schema matches vLLM's op; vLLM reached through ``seam``). No
``from __future__ import annotations`` here: the schema is inferred from the
signature's real types.
"""

import logging

import torch
from torch.library import Library

from dspark_compile.config import WindowSpec
from dspark_compile.integrations.vllm.backends import (
    apply_native_window,
    check_no_native_window,
    kernel_block_size,
    metadata_backend,
)
from dspark_compile.integrations.vllm.seam import (
    LayerNameType,
    direct_register_custom_op,
    eager_break_during_capture,
    get_attention_context,
    get_forward_context,
    maybe_transfer_kv_layer,
    resolve_layer_name,
)
from dspark_compile.integrations.vllm.step_windows import StepWindows

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
    max_num_seqs: int,
    output_scale: torch.Tensor | None = None,
    output_block_scale: torch.Tensor | None = None,
    kv_cache_dummy_dep: torch.Tensor | None = None,
    sink_size: int = 0,
    max_num_tokens: int = 0,
) -> None:
    del kv_cache_dummy_dep  # ordering dependency on the KV-cache update only
    name = resolve_layer_name(layer_name)
    attn_metadata, layer, kv_cache, _ = get_attention_context(name)
    if attn_metadata is not None:
        if sink_size:
            check_no_native_window(layer, metadata_backend(attn_metadata))
            attn_metadata = STEP_WINDOWS.windowed(
                get_forward_context(),
                name,
                layer,
                attn_metadata,
                kv_cache,
                window_size,
                future_offset,
                max_num_seqs,
                query.dtype,
                sink_size=sink_size,
                max_num_tokens=max_num_tokens,
            )
        else:
            apply_native_window(
                layer,
                attn_metadata,
                WindowSpec.cached(window_size, future_offset, kernel_block_size(kv_cache)).tokens,
            )
            attn_metadata = STEP_WINDOWS.windowed(
                get_forward_context(),
                name,
                layer,
                attn_metadata,
                kv_cache,
                window_size,
                future_offset,
                max_num_seqs,
                query.dtype,
            )
    layer.impl.forward(
        layer,
        query,
        key,
        value,
        kv_cache,
        attn_metadata,
        output=output,
        output_scale=output_scale,
        output_block_scale=output_block_scale,
    )


_LIB = Library("dspark", "FRAGMENT")  # keeps the op alive with the module
direct_register_custom_op(
    op_name=OP_NAME,
    op_func=unified_attention_with_output_windowed,
    mutates_args=["output", "output_block_scale"],
    target_lib=_LIB,
    tags=(torch.Tag.cudagraph_unsafe,),
)


def windowed_attention_op() -> torch._ops.OpOverload:
    return getattr(torch.ops.dspark, OP_NAME).default
