"""The draft window's config as read from a vLLM ``VllmConfig``.

``draft_window_size`` comes from ``vllm_config.additional_config`` (the key
vllm-ascend uses), with ``draft_sink_size`` (attention sinks, default 0)
beside it; ``method`` and ``num_speculative_tokens`` from
``vllm_config.speculative_config``; explicit values override both.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from dspark_compile.config import METHODS, DraftWindowConfig
from dspark_compile.validation import check_int

ADDITIONAL_CONFIG_KEY = "draft_window_size"
SINK_CONFIG_KEY = "draft_sink_size"
# vLLM speculative methods the window knows the future offset of: the config's
# METHODS (docs/design.md, "Window arithmetic"). The old name, kept.
SUPPORTED_METHODS = METHODS
ATTENTION_OP = "vllm::unified_attention_with_output"


@dataclasses.dataclass(frozen=True)
class WindowOverrides:
    """Explicit settings that win over what the ``VllmConfig`` says (``None``: read it)."""

    draft_window_size: Optional[int] = None
    method: Optional[str] = None
    num_speculative_tokens: Optional[int] = None
    future_offset: Optional[int] = None
    draft_sink_size: Optional[int] = None

    def __post_init__(self) -> None:
        # Validate now, not at the first compile: the foundation's rules and
        # messages (future_offset < W is checked once W is known; sinks
        # without a window once it is known whether additional_config has one).
        given = {k: v for k, v in dataclasses.asdict(self).items() if v is not None}
        sinks = given.pop("draft_sink_size", None)
        if sinks is not None:
            check_int("draft_sink_size", sinks, 0, "a non-negative int (0: no attention sinks)")
            if "draft_window_size" in given:
                given["draft_sink_size"] = sinks
        if given:
            DraftWindowConfig(**given)


def _additional(vllm_config: Any, key: str) -> Optional[Any]:
    extra = getattr(vllm_config, "additional_config", None)
    if extra is None:
        return None
    if isinstance(extra, dict):
        return extra.get(key)
    return getattr(extra, key, None)


def additional_window_size(vllm_config: Any) -> Optional[Any]:
    """``additional_config["draft_window_size"]`` (dict or attribute), or None."""
    return _additional(vllm_config, ADDITIONAL_CONFIG_KEY)


def additional_sink_size(vllm_config: Any) -> Optional[Any]:
    """``additional_config["draft_sink_size"]`` (dict or attribute), or None."""
    return _additional(vllm_config, SINK_CONFIG_KEY)


def resolve_window_config(
    vllm_config: Any,
    overrides: WindowOverrides = WindowOverrides(),
) -> DraftWindowConfig:
    """The window config for ``vllm_config`` (may be None: overrides only).

    Returns a disabled config when no window size is set anywhere. Raises ``ValueError``
    naming the setting, its value and what is allowed for a bad window size, an
    unsupported speculative method, or a window without a speculative config.
    """
    window = overrides.draft_window_size
    if window is None and vllm_config is not None:
        window = additional_window_size(vllm_config)
    sinks = overrides.draft_sink_size
    if sinks is None and vllm_config is not None:
        sinks = additional_sink_size(vllm_config)
    if sinks is None:
        sinks = 0
    if window is None:
        # sinks without a window: DraftWindowConfig's error names draft_sink_size
        return DraftWindowConfig(draft_sink_size=sinks)
    spec = getattr(vllm_config, "speculative_config", None)
    method = overrides.method
    if method is None:
        if spec is None:
            raise ValueError(
                f"draft_window_size={window!r} is set but vllm_config.speculative_config is "
                "None: the window applies to a speculative-decoding draft model; set "
                "speculative_config (method eagle3, dflash or dspark) or pass method= to the pass"
            )
        method = spec.method
        if method not in SUPPORTED_METHODS:
            raise ValueError(
                f"speculative_config.method={method!r} is not supported by the draft window: "
                f"expected one of {', '.join(SUPPORTED_METHODS)} (or pass method= to the pass "
                "to state which future offset the draft uses)"
            )
    num_tokens = overrides.num_speculative_tokens
    if num_tokens is None:
        num_tokens = getattr(spec, "num_speculative_tokens", None) or 1
    return DraftWindowConfig(
        draft_window_size=window,
        method=method,
        num_speculative_tokens=num_tokens,
        future_offset=overrides.future_offset,
        draft_sink_size=sinks,
    )


def attention_is_split_out(vllm_config: Any) -> bool:
    """True when vLLM splits the graph at attention, so post-grad passes never see it."""
    compilation = getattr(vllm_config, "compilation_config", None)
    if compilation is None or compilation.use_inductor_graph_partition:
        return False
    return ATTENTION_OP in (compilation.splitting_ops or ())
