"""vLLM integration: the draft KV window as a vLLM post-grad custom pass.

Importing this package imports vLLM (an optional dependency) and registers
``torch.ops.dspark.unified_attention_with_output_windowed``. vLLM users hand
``DraftWindowInductorPass`` to ``compilation_config`` (see README, "vLLM"),
most simply by the qualname ``"dspark_compile_vllm.draft_window_pass"``.
"""

import logging

from dspark_compile.integrations.vllm.attention_op import (
    OP_NAME,
    unified_attention_with_output_windowed,
    windowed_attention_op,
)
from dspark_compile.integrations.vllm.compile_context import (
    DRAFT_MODEL_TAGS,
    CompileContext,
    find_compile_context,
)
from dspark_compile.integrations.vllm.config import (
    ADDITIONAL_CONFIG_KEY,
    SINK_CONFIG_KEY,
    SUPPORTED_METHODS,
    WindowOverrides,
    attention_is_split_out,
    resolve_window_config,
)
from dspark_compile.integrations.vllm.inductor_pass import DraftWindowInductorPass
from dspark_compile.integrations.vllm.metadata import (
    SUPPORTED_BACKENDS,
    SinkWindowBuffers,
    StepWindows,
    WindowBuffers,
    WindowSpec,
    check_no_native_window,
    kernel_block_size,
    set_native_window,
    sink_window_metadata,
    window_attention_metadata,
)

logger = logging.getLogger(__name__)


def register_plugin() -> None:
    """``vllm.general_plugins`` entry point: registers the dspark ops in this process
    and the draft KV-memory hook (``kv_memory.install``: the draft layers' KV-cache
    spec when the window is on; nothing changes without a window).

    vLLM calls it in every process (engine core, workers) before models are
    built; calling it twice is fine.
    """
    from dspark_compile.integrations.vllm import kv_memory

    kv_memory.install()
    logger.debug("dspark vLLM plugin loaded: torch.ops.dspark.%s registered", OP_NAME)


__all__ = [
    "ADDITIONAL_CONFIG_KEY",
    "CompileContext",
    "DRAFT_MODEL_TAGS",
    "DraftWindowInductorPass",
    "OP_NAME",
    "SINK_CONFIG_KEY",
    "SUPPORTED_BACKENDS",
    "SinkWindowBuffers",
    "check_no_native_window",
    "sink_window_metadata",
    "SUPPORTED_METHODS",
    "StepWindows",
    "WindowBuffers",
    "WindowOverrides",
    "WindowSpec",
    "attention_is_split_out",
    "find_compile_context",
    "kernel_block_size",
    "register_plugin",
    "resolve_window_config",
    "set_native_window",
    "unified_attention_with_output_windowed",
    "window_attention_metadata",
    "windowed_attention_op",
]
