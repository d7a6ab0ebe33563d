"""Which vLLM model is being compiled, and with which ``VllmConfig``.

vLLM hands a ``post_grad_custom_post_pass`` no config: it constructs the
pass from a qualname and calls it on graphs. Every real compile, however, is
triggered from the ``forward`` of a ``@support_torch_compile`` module (the
target model, or the draft model the proposer built), and that module keeps
the ``VllmConfig`` it was constructed with (``vllm_config``) and the model
tag it was built under (``_compile_tag``: ``backbone`` for the target,
``draft_model`` / ``eagle_head`` / ``dflash_head`` / ``dspark_head`` for
drafts; vLLM 0.32 and 0.33 alike). ``find_compile_context`` finds that module
on the call stack (``seam.compiling_model_on_stack``). This holds on both of vLLM's
compile routes: the CPU platform's plain Inductor (``DYNAMO_TRACE_ONCE``) and the CUDA
``VllmBackend`` / ``PiecewiseBackend`` (which also compiles lazily inside the
model's forward).

``resolve_compile_context`` is the one function the pass asks: it returns the context
set by ``override_compile_context`` (tests, runner integrations that know their
config), else resolves it once per compile (per Dynamo compile: the pass's ``uuid()``
and every graph of that compile share one resolution) and walks the stack again only
for compiles outside Dynamo (vLLM's lazy piecewise compiles).
"""

from __future__ import annotations

import contextlib
import dataclasses
import threading
from typing import Any, Iterator, Optional

from torch._guards import CompileContext as _DynamoCompileContext

from dspark_compile.integrations.vllm import seam

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


def find_compile_context(max_depth: int = 400) -> Optional[CompileContext]:
    """The innermost compiling vLLM model on the stack, else vLLM's current config.

    Returns None when neither exists (the pass was called outside vLLM).
    """
    found = seam.compiling_model_on_stack(max_depth)
    if found is not None:
        return CompileContext(*found)
    config = seam.current_vllm_config()
    if config is None:
        return None
    return CompileContext(config, None, "get_current_vllm_config")


_UNSET = object()
_STATE = threading.local()


def _override() -> Any:
    return getattr(_STATE, "override", _UNSET)


@contextlib.contextmanager
def override_compile_context(context: Optional[CompileContext]) -> Iterator[None]:
    """Within the block (this thread), ``resolve_compile_context()`` returns ``context``
    (None: "not compiled by vLLM") without looking at the stack."""
    previous = _override()
    _STATE.override = context
    try:
        yield
    finally:
        if previous is _UNSET:
            del _STATE.override
        else:
            _STATE.override = previous


def resolve_compile_context() -> Optional[CompileContext]:
    """The compile context of the model being compiled (``find_compile_context``), or the
    one set by ``override_compile_context``; resolved once per Dynamo compile (keyed by
    the identity of Dynamo's own per-compile context object, which a new compile, also
    after ``torch._dynamo.reset()``, replaces)."""
    override = _override()
    if override is not _UNSET:
        return override
    dynamo = _DynamoCompileContext.try_get()
    memo = getattr(_STATE, "memo", None)
    if dynamo is not None and memo is not None and memo[0] is dynamo:
        return memo[1]
    context = find_compile_context()
    _STATE.memo = (dynamo, context) if dynamo is not None else None
    return context
