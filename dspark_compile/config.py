"""Draft-window configuration: which draft family, how wide a window, validation.

``DraftWindowConfig`` is the single source of truth for the window's
parameters. It is immutable and hashable so passes can put it in ``uuid()``.
``WindowSpec`` is the resolved window one attention call runs with (W, K, b, S):
the one place where ``future_offset < window_size`` is checked for it and where
``W - K`` is computed; the run-time code takes a ``WindowSpec`` and does not check
again.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Any, Mapping, Optional

from dspark_compile.validation import check_choice, check_int, did_you_mean, is_int

logger = logging.getLogger(__name__)

# Autoregressive drafts (one token per draft step; K = num_speculative_tokens)
# and block drafts (the query expansion is inside seq_lens; K = 0).
AUTOREGRESSIVE_METHODS = ("eagle3", "eagle", "draft_model")
METHODS = AUTOREGRESSIVE_METHODS + ("dflash", "dspark", "mtp")


@dataclasses.dataclass(frozen=True)
class DraftWindowConfig:
    """Parameters of the draft KV sliding window.

    Attributes:
        draft_window_size: W, the number of most recent KV tokens the draft
            attends to; ``None`` turns the window off.
        method: draft family, one of ``METHODS``; decides ``future_offset``.
        num_speculative_tokens: draft tokens per step (EAGLE3's future offset).
        future_offset: K, draft query positions beyond ``seq_lens``; ``None``
            derives it from ``method`` (eagle3, eagle, draft_model:
            num_speculative_tokens; dflash/dspark: 0).
        block_size: kernel KV block size b; ``None`` reads it from the KV
            cache shape of each attention call.
        deepseek_v4_target: the DSpark draft was trained natively with a
            DeepSeek-V4 target (already long-context stable): warns.
        draft_sink_size: S, attention-sink tokens: the first ``ceil(S / b)``
            KV blocks stay visible beside the window (StreamingLLM style);
            0 (default) is the window alone. Needs the window on.
    """

    draft_window_size: Optional[int] = None
    method: str = "dflash"
    num_speculative_tokens: int = 1
    future_offset: Optional[int] = None
    block_size: Optional[int] = None
    deepseek_v4_target: bool = False
    draft_sink_size: int = 0

    def __post_init__(self) -> None:
        check_choice("method", self.method, METHODS)
        if self.draft_window_size is not None:
            check_int(
                "draft_window_size",
                self.draft_window_size,
                1,
                "a positive int, or None to turn the window off",
            )
        check_int("num_speculative_tokens", self.num_speculative_tokens, 1, "a positive int")
        if self.future_offset is not None:
            check_int(
                "future_offset",
                self.future_offset,
                0,
                "a non-negative int, or None to derive it from method",
            )
        if self.block_size is not None:
            check_int(
                "block_size",
                self.block_size,
                1,
                "a positive int, or None to read it from the KV cache",
            )
        if not isinstance(self.deepseek_v4_target, bool):
            raise ValueError(
                f"deepseek_v4_target={self.deepseek_v4_target!r} is invalid: expected a bool"
            )
        check_int(
            "draft_sink_size", self.draft_sink_size, 0, "a non-negative int (0: no attention sinks)"
        )
        if self.draft_sink_size and self.draft_window_size is None and self.method != "mtp":
            raise ValueError(
                f"draft_sink_size={self.draft_sink_size} is invalid without a window: "
                "attention sinks are kept beside the draft window; set draft_window_size "
                "too, or draft_sink_size=0"
            )
        if self.method == "mtp" and self.draft_window_size is not None:
            logger.warning(
                "draft_window_size=%d ignored: method='mtp' reuses the target's own "
                "layers, so windowing the draft would window the target; window disabled",
                self.draft_window_size,
            )
            object.__setattr__(self, "draft_window_size", None)
            object.__setattr__(self, "draft_sink_size", 0)
        if self.enabled and self.method == "dspark" and self.deepseek_v4_target:
            logger.warning(
                "draft_window_size=%d with a DSpark draft trained natively with a "
                "DeepSeek-V4 target: such drafts are long-context stable and windowing "
                "usually lowers their acceptance; keep W >= the draft's native window",
                self.draft_window_size,
            )
        if self.enabled and self.resolved_future_offset >= self.draft_window_size:
            raise ValueError(
                f"future_offset={self.resolved_future_offset} is invalid for "
                f"draft_window_size={self.draft_window_size}: the window must be wider "
                "than the draft positions beyond seq_lens (future_offset < draft_window_size)"
            )

    @property
    def enabled(self) -> bool:
        """True when the window is on."""
        return self.draft_window_size is not None

    @property
    def resolved_future_offset(self) -> int:
        """K: explicit ``future_offset``, else derived from ``method``."""
        if self.future_offset is not None:
            return self.future_offset
        return self.num_speculative_tokens if self.method in AUTOREGRESSIVE_METHODS else 0

    @classmethod
    def field_names(cls) -> tuple[str, ...]:
        """The option names this config takes."""
        return tuple(f.name for f in dataclasses.fields(cls))

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any]) -> DraftWindowConfig:
        """Build from a dict; unknown keys raise ``ValueError`` listing the valid ones."""
        unknown = sorted(set(options) - set(cls.field_names()), key=str)
        if unknown:
            raise ValueError(
                f"unknown draft-window option(s) {unknown}: valid options are "
                f"{', '.join(cls.field_names())}{did_you_mean(unknown[0], cls.field_names())}"
            )
        return cls(**dict(options))

    def as_dict(self) -> dict[str, Any]:
        """The fields as a dict (JSON-able; what a pass's ``uuid()`` hashes)."""
        return dataclasses.asdict(self)


@dataclasses.dataclass(frozen=True)
class WindowSpec:
    """The resolved window of one attention call: W (``window_size``), K
    (``future_offset``), b (``block_size``, the kernel's KV block) and S (``sink_size``,
    attention-sink tokens, 0: none).

    Validated on construction: W a positive int, K an int with ``0 <= K < W``, b a
    positive int, S a non-negative int; ``ValueError`` naming the argument, its value
    and what is allowed. ``tokens = W - K``: the keys a query's token-exact window holds.
    """

    window_size: int
    future_offset: int
    block_size: int
    sink_size: int = 0

    def __post_init__(self) -> None:
        check_int("window_size", self.window_size, 1)
        check_int("future_offset", self.future_offset, 0)
        if self.future_offset >= self.window_size:
            raise ValueError(
                f"future_offset={self.future_offset} must be < window_size={self.window_size}"
            )
        if not is_int(self.block_size) or self.block_size < 1:
            raise ValueError(f"block_size={self.block_size} must be positive")
        if not is_int(self.sink_size) or self.sink_size < 0:
            raise ValueError(
                f"sink_size={self.sink_size!r} is invalid: expected a "
                "non-negative int (0: no attention sinks)"
            )

    @property
    def tokens(self) -> int:
        """``W - K``."""
        return self.window_size - self.future_offset

    @staticmethod
    @functools.lru_cache(maxsize=256, typed=True)
    def cached(
        window_size: int, future_offset: int, block_size: int, sink_size: int = 0
    ) -> WindowSpec:
        """``WindowSpec(window_size, future_offset, block_size, sink_size)``, built and
        validated once per distinct arguments (``typed``: ``True`` is not ``1``); the
        vLLM route asks for one on every draft-layer call."""
        return WindowSpec(window_size, future_offset, block_size, sink_size)

    @classmethod
    def from_config(cls, config: DraftWindowConfig, block_size: Optional[int] = None) -> WindowSpec:
        """The spec of an enabled ``config``: W, K (``resolved_future_offset``), S; b from
        ``config.block_size``, else ``block_size``."""
        if not config.enabled:
            raise ValueError(
                "config has draft_window_size=None: the window is off, there is nothing to adapt"
            )
        b = config.block_size if config.block_size is not None else block_size
        if b is None:
            raise ValueError(
                "block_size=None is invalid: config.block_size is None too; "
                "pass the kernel block size"
            )
        return cls(
            config.draft_window_size, config.resolved_future_offset, b, config.draft_sink_size
        )
