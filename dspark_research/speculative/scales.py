"""Study scales: model shapes, training budgets and evaluation grid.

``h200``: the GPU scale (a few minutes of training on one H200);
``quick``: the same experiment shrunk for 2 CPU cores (8 min on 2 idle
cores with every setting, measured 2026-11-30);
``smoke``: seconds, for CI (checks that everything runs, not the direction).
Every scale trains the drafts at a context 16x shorter than its longest
evaluated context.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from dspark_research.speculative.lm import LMConfig
from dspark_research.speculative.training import TrainSpec


@dataclasses.dataclass(frozen=True)
class Setting:
    """One draft configuration of the study: a name, the compile options it adds
    (``draft_window_size``, ``draft_sink_size``; any other backend option can be
    added) and a short ``key`` for ``python -m dspark_research study --settings``."""

    name: str
    options: dict
    key: str = ""

    @property
    def window(self):
        return self.options.get("draft_window_size")

    @property
    def sink_size(self) -> int:
        return self.options.get("draft_sink_size", 0)


@dataclasses.dataclass(frozen=True)
class StudyScale:
    name: str
    target: LMConfig
    target_train: TrainSpec
    draft: LMConfig
    draft_train: TrainSpec
    eagle: LMConfig
    eagle_train: TrainSpec
    contexts: tuple[int, ...]
    prompts: int
    new_tokens: int
    window_multiples: tuple[int, ...] = (1, 2, 4)
    # Attention sinks (issue 13), beside the main window W = the drafts' training
    # context only: S = each of these many KV blocks. A class constant, not a
    # field, so a checkpoint trained before it still matches its scale.
    SINK_BLOCKS: ClassVar[tuple[int, ...]] = (1, 4)
    num_speculative_tokens: int = 5
    block_size: int = 16
    eval_fraction: float = 0.05
    max_train_bytes: int | None = None

    def __post_init__(self) -> None:
        if self.draft_train.context != self.eagle_train.context:
            raise ValueError(
                f"eagle_train.context={self.eagle_train.context} is invalid: "
                f"expected the draft's training context {self.draft_train.context}"
            )
        if self.eagle.feature_size != self.target.hidden_size:
            raise ValueError(
                f"eagle.feature_size={self.eagle.feature_size} is invalid: "
                f"expected the target's hidden_size {self.target.hidden_size}"
            )
        if not self.contexts or min(self.contexts) <= 0:
            raise ValueError(f"contexts={self.contexts!r} is invalid: expected positive ints")

    @property
    def draft_context(self) -> int:
        return self.draft_train.context

    def settings(self) -> list[Setting]:
        """No window, a window of each multiple of the draft's training context, then
        that 1x window with attention sinks of ``SINK_BLOCKS`` KV blocks."""
        c = self.draft_context
        window_only = [
            Setting(f"W={m * c} ({m}x)", {"draft_window_size": m * c}, f"w{m}x")
            for m in self.window_multiples
        ]
        sinks = [
            Setting(
                f"W={c} (1x) + S={n * self.block_size} ({n} block{'s' * (n > 1)})",
                {"draft_window_size": c, "draft_sink_size": n * self.block_size},
                f"w1x+s{n}b",
            )
            for n in self.SINK_BLOCKS
        ]
        return [Setting("no window", {"draft_window_size": None}, "none"), *window_only, *sinks]

    def select_settings(self, keys=None) -> list[Setting]:
        """``settings()`` whose ``key`` is in ``keys`` (None: all), in study order;
        an unknown key is a ValueError listing the valid ones."""
        settings = self.settings()
        if keys is None:
            return settings
        valid = [s.key for s in settings]
        unknown = [k for k in keys if k not in valid]
        if unknown or not keys:
            raise ValueError(
                f"settings={list(keys)!r} is invalid: expected one or more of {', '.join(valid)}"
            )
        return [s for s in settings if s.key in keys]

    def as_dict(self) -> dict:
        return dataclasses.asdict(self)


def eagle_config(target: LMConfig, intermediate: int) -> LMConfig:
    """The one-layer EAGLE draft for ``target``: its width and heads, fed its hidden states."""
    return LMConfig(
        hidden_size=target.hidden_size,
        num_layers=1,
        num_heads=target.num_heads,
        num_kv_heads=target.num_kv_heads,
        head_dim=target.head_dim,
        intermediate_size=intermediate,
        feature_size=target.hidden_size,
    )


H200_TARGET = LMConfig(
    hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4, head_dim=64, intermediate_size=1536
)
_QUICK_TARGET = LMConfig(
    hidden_size=128, num_layers=4, num_heads=4, num_kv_heads=2, head_dim=32, intermediate_size=384
)
_SMOKE_TARGET = LMConfig(
    hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64
)

SCALES: dict[str, StudyScale] = {
    "h200": StudyScale(
        name="h200",
        target=H200_TARGET,
        target_train=TrainSpec(steps=1500, batch=8, context=4096, lr=1e-3, warmup=100),
        draft=LMConfig(
            hidden_size=256,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            head_dim=64,
            intermediate_size=768,
        ),
        draft_train=TrainSpec(steps=1500, batch=64, context=256, lr=2e-3, warmup=100, seed=1),
        eagle=eagle_config(H200_TARGET, 1536),
        eagle_train=TrainSpec(steps=1500, batch=32, context=256, lr=1e-3, warmup=100, seed=2),
        contexts=(256, 512, 1024, 2048, 4096),
        prompts=6,
        new_tokens=128,
    ),
    "quick": StudyScale(
        name="quick",
        target=_QUICK_TARGET,
        target_train=TrainSpec(steps=400, batch=8, context=512, lr=2e-3, warmup=40),
        draft=LMConfig(
            hidden_size=96,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            head_dim=24,
            intermediate_size=256,
        ),
        draft_train=TrainSpec(steps=400, batch=32, context=32, lr=3e-3, warmup=40, seed=1),
        eagle=eagle_config(_QUICK_TARGET, 384),
        eagle_train=TrainSpec(steps=400, batch=32, context=32, lr=2e-3, warmup=40, seed=2),
        contexts=(32, 64, 128, 256, 512),
        prompts=3,
        new_tokens=48,
    ),
    "smoke": StudyScale(
        name="smoke",
        target=_SMOKE_TARGET,
        target_train=TrainSpec(steps=4, batch=2, context=64, warmup=2),
        draft=LMConfig(
            hidden_size=32,
            num_layers=2,
            num_heads=2,
            num_kv_heads=1,
            head_dim=16,
            intermediate_size=64,
        ),
        draft_train=TrainSpec(steps=4, batch=2, context=16, warmup=2, seed=1),
        eagle=eagle_config(_SMOKE_TARGET, 64),
        eagle_train=TrainSpec(steps=4, batch=2, context=16, warmup=2, seed=2),
        contexts=(16, 256),
        prompts=1,
        new_tokens=8,
        window_multiples=(1, 2),
        num_speculative_tokens=3,
        max_train_bytes=200_000,
    ),
}
