"""Which vLLM model is being compiled, and with which ``VllmConfig``.

vLLM hands a ``post_grad_custom_post_pass`` no config: it constructs the
pass from a qualname and calls it on graphs. Every real compile, however, is
triggered from the ``forward`` of a ``@support_torch_compile`` module (the
target model, or the draft model the proposer built), and that module keeps
the ``VllmConfig`` it was constructed with (``vllm_config``) and the model
tag it was built under (``_compile_tag``: ``backbone`` for the target,
``draft_model`` / ``eagle_head`` / ``dflash_head`` / ``dspark_head`` for
drafts; vLLM 0.32 and 0.33 alike). ``find_compile_context`` finds that module
on the call stack. This holds on both of vLLM's compile routes: the CPU
platform's plain Inductor (``DYNAMO_TRACE_ONCE``) and the CUDA
``VllmBackend`` / ``PiecewiseBackend`` (which also compiles lazily inside the
model's forward).
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any, Optional

# Model tags vLLM's proposers build draft models under (``set_model_tag``).
DRAFT_MODEL_TAGS = frozenset({"draft_model", "eagle_head", "dflash_head", "dspark_head"})


@dataclasses.dataclass(frozen=True)
class CompileContext:
    """The vLLM config of the model being compiled and its model tag (None: unknown)."""

    vllm_config: Any
    model_tag: Optional[str]
    source: str

    @property
    def is_draft_model(self) -> bool:
        return self.model_tag in DRAFT_MODEL_TAGS


def _is_vllm_config(value: Any) -> bool:
    from vllm.config import VllmConfig

    return isinstance(value, VllmConfig)


def find_compile_context(max_depth: int = 400) -> Optional[CompileContext]:
    """The innermost compiling vLLM model on the stack, else vLLM's current config.

    Returns None when neither exists (the pass was called outside vLLM).
    """
    frame = sys._getframe(1)
    fallback: Optional[CompileContext] = None
    depth = 0
    while frame is not None and depth < max_depth:
        owner = frame.f_locals.get("self")
        config = getattr(owner, "vllm_config", None) if owner is not None else None
        if config is not None and _is_vllm_config(config):
            tag = getattr(owner, "_compile_tag", None)
            if isinstance(tag, str) and tag:
                return CompileContext(config, tag, type(owner).__name__)
            if fallback is None:
                tag = getattr(owner, "prefix", None)  # VllmBackend
                if not tag:
                    tag = getattr(getattr(owner, "vllm_backend", None), "prefix", None)
                fallback = CompileContext(
                    config, tag if isinstance(tag, str) and tag else None, type(owner).__name__
                )
        frame = frame.f_back
        depth += 1
    if fallback is not None:
        return fallback
    from vllm.config import get_current_vllm_config_or_none

    config = get_current_vllm_config_or_none()
    if config is None:
        return None
    return CompileContext(config, None, "get_current_vllm_config")
