"""Draft KV memory bounded by the window: the draft layers' vLLM KV-cache spec.

**When vLLM decides.** ``EngineCore._initialize_kv_caches``
(``vllm/v1/engine/core.py``) takes the KV-cache specs
(``model_executor.get_kv_cache_specs()`` -> worker -> model runner
``get_kv_cache_spec``: V1's ``GPUModelRunner`` (0.26 to 0.33; their CPU runner
inherits it), or the V2 runner of ``vllm/v1/worker/gpu/model_runner.py`` (the only
runner in 0.34, whose CPU runner inherits it)) right
after the model and the drafter are loaded and BEFORE it profiles
(``determine_available_memory``: the profile run, where ``torch.compile`` and
our Inductor pass run). The pass is therefore too late: the spec is decided
here, in the runner's ``get_kv_cache_spec``, from the runner's ``VllmConfig``
(``additional_config["draft_window_size"]`` / ``["draft_sink_size"]``, the
speculative config's method and K) and the drafter's own list of its
attention layers (V1: ``SpecDecodeBaseProposer._draft_attn_layer_names``; V2:
the speculator's ``draft_attn_layer_names``; both set in ``load_model``).

**What.** Each draft attention layer's ``FullAttentionSpec`` becomes a
``SlidingWindowSpec`` with ``sliding_window = W - K`` (``kv_spec.py``: the
smallest length for which vLLM never frees a block the window still reads),
same block size, heads, head size and dtype. vLLM's hybrid KV-cache manager
then puts the draft's layers in their own group, keeps per request only the
blocks that window can still read (``SlidingWindowManager``), and reports the
larger capacity ("KV cache size: N tokens", ``kv_cache_config``).

**The draft's group goes first (V1 runner, 0.26 to 0.33).** vLLM's V1 runner gives
every proposer that is not an ``EagleProposer`` / ``DFlashProposer`` / ``Gemma4Proposer`` /
``ExtractHiddenStatesProposer`` -- ``DraftModelProposer`` among them -- the
block table and slot mapping of KV-cache group 0
(``gpu_model_runner.py``, ``_build_attention_metadata``; the bug of
``benchmarks/repro_native_swa_draft.py``), and groups share KV tensors: a
draft outside group 0 would overwrite the target's KV cache. The draft's
layers are therefore returned FIRST, so that ``_get_kv_cache_groups_uniform_page_size``
(groups by first appearance) makes the draft's sliding-window group group 0,
the layout of Gemma-style models whose first layer is sliding; the target's
layers keep their own group and metadata. The V2 runner builds every draft
layer's metadata from its own group's block table, so there the layers keep
vLLM's order (the layout of a draft whose config declares sliding layers).

**Where it cannot.** Nothing is changed, with a warning saying that the draft's
KV memory is not bounded, when: attention sinks are on (``draft_sink_size`` >
0: the sinks stay read forever, no sliding-window spec keeps them); the hybrid
KV-cache manager is disabled (vLLM turns sliding-window specs back into full
ones); decode context parallel is on (vLLM's sliding window does not support
it); a draft layer's spec is not a plain ``FullAttentionSpec`` (MLA, its own
sliding window, chunked local attention); the drafter's layers cannot be told
(no ``_draft_attn_layer_names``); the method's draft queries are not known to
stay at or after the target's computed tokens (only ``draft_model``,
``eagle``, ``eagle3`` are bounded); the vLLM version is untested
(``versions.is_tested_series``). Nothing is changed either (logged, no warning) when the
sliding-window group would reserve no fewer blocks per request than full
attention (``W - K`` plus vLLM's in-flight tokens >= ``max_model_len``).
``additional_config["draft_window_kv_memory"] = False`` turns it off.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional

from dspark_compile.integrations.vllm import kv_spec, seam, versions
from dspark_compile.integrations.vllm.config import _additional, resolve_window_config

logger = logging.getLogger(__name__)

OPT_OUT_KEY = "draft_window_kv_memory"
BOUNDED_METHODS = ("draft_model", "eagle", "eagle3")
_MARK = seam.KV_SPEC_HOOK_MARK

#: What the last ``bound_draft_kv_specs`` call did in this process (tests, logs).
LAST_DECISION: dict[str, Any] = {}


def _warn(reason: str, config: Any) -> None:
    message = (
        f"dspark draft window (draft_window_size={config.draft_window_size}): the draft's "
        f"KV memory is NOT bounded by the window: {reason}; vLLM keeps the draft's full "
        "KV cache (the output is unaffected)"
    )
    logger.warning(message)
    LAST_DECISION.clear()
    LAST_DECISION.update(bounded=False, reason=reason)


def _scheduler(vllm_config: Any) -> Any:
    return getattr(vllm_config, "scheduler_config", None)


def _max_in_flight_tokens(vllm_config: Any) -> Optional[int]:
    """vLLM's ``VllmConfig.max_in_flight_tokens`` (0.26+), else max_num_batched_tokens."""
    value = getattr(vllm_config, "max_in_flight_tokens", None)
    if isinstance(value, int):
        return value
    value = getattr(_scheduler(vllm_config), "max_num_batched_tokens", None)
    return value if isinstance(value, int) else None


def draft_layer_names(runner: Any) -> Optional[set[str]]:
    """The drafter's attention layers (vLLM's own list), or None when unknown: the V1
    runner's ``drafter._draft_attn_layer_names``, the V2 runner's
    ``speculator.draft_attn_layer_names`` (both set when the drafter loads, before
    ``get_kv_cache_spec``)."""
    names = seam.drafter_attn_layer_names(runner)
    if names is None:
        return None
    return set(names)


def bound_draft_kv_specs(
    vllm_config: Any,
    specs: dict[str, Any],
    draft_layers: Optional[set[str]],
    draft_first: bool = True,
) -> dict[str, Any]:
    """``specs`` with the draft layers' full-attention specs made sliding-window
    (``W - K``), the draft's layers first when ``draft_first`` (the V1 runner, module
    doc) else in ``specs``' order; ``specs`` unchanged (with a warning) where the window
    cannot bound the draft's memory (module doc)."""
    config = resolve_window_config(vllm_config)
    if not config.enabled:
        return specs
    if _additional(vllm_config, OPT_OUT_KEY) is False:
        logger.info(
            "dspark draft window: %s=False: the draft's KV memory is not bounded", OPT_OUT_KEY
        )
        LAST_DECISION.clear()
        LAST_DECISION.update(bounded=False, reason=f"{OPT_OUT_KEY}=False")
        return specs
    FullAttentionSpec, SlidingWindowSpec = seam.kv_spec_classes()
    version = seam.vllm_version()
    if not versions.is_tested_series(version):
        _warn(
            f"vLLM {version} is untested (tested: {', '.join(versions.TESTED)})",
            config,
        )
        return specs
    if config.draft_sink_size:
        _warn(
            f"attention sinks (draft_sink_size={config.draft_sink_size}) stay readable "
            "forever and no vLLM sliding-window spec keeps them",
            config,
        )
        return specs
    if config.method not in BOUNDED_METHODS:
        _warn(
            f"method {config.method!r} is not one whose draft reads are known to stay at "
            f"or after the target's computed tokens ({', '.join(BOUNDED_METHODS)})",
            config,
        )
        return specs
    if getattr(_scheduler(vllm_config), "disable_hybrid_kv_cache_manager", False):
        _warn(
            "vLLM's hybrid KV-cache manager is disabled (it turns sliding-window specs "
            "back into full attention)",
            config,
        )
        return specs
    parallel = getattr(vllm_config, "parallel_config", None)
    if getattr(parallel, "decode_context_parallel_size", 1) > 1:
        _warn("decode context parallel is on (vLLM's sliding window does not support it)", config)
        return specs
    if not draft_layers:
        _warn("the drafter's attention layers are unknown (no _draft_attn_layer_names)", config)
        return specs
    present = [name for name in specs if name in draft_layers]
    unsupported = [
        f"{name} ({type(specs[name]).__name__})"
        for name in present
        if type(specs[name]) is not FullAttentionSpec
        or getattr(specs[name], "sliding_window", None) is not None
        or getattr(specs[name], "attention_chunk_size", None) is not None
    ]
    if not present or unsupported:
        _warn(
            "draft layers without a plain FullAttentionSpec: "
            f"{', '.join(unsupported) or 'none found'}",
            config,
        )
        return specs
    window = kv_spec.draft_sliding_window(config.draft_window_size, config.resolved_future_offset)
    block = specs[present[0]].block_size
    max_len = getattr(getattr(vllm_config, "model_config", None), "max_model_len", None)
    in_flight = _max_in_flight_tokens(vllm_config)
    if (
        max_len
        and in_flight is not None
        and kv_spec.sliding_blocks_per_request(window, block, in_flight, max_len)
        >= kv_spec.full_blocks_per_request(block, max_len)
    ):
        logger.info(
            "dspark draft window: the draft's KV memory is not bounded: a "
            "sliding window of %d tokens (W - K) plus vLLM's %d in-flight tokens "
            "reserves no fewer blocks per request than max_model_len=%d",
            window,
            in_flight,
            max_len,
        )
        LAST_DECISION.clear()
        LAST_DECISION.update(bounded=False, reason="no saving at this max_model_len")
        return specs
    names = {f.name for f in dataclasses.fields(SlidingWindowSpec)}
    sliding: dict[str, Any] = {}
    for name in present:
        full = specs[name]
        kwargs = {
            f.name: getattr(full, f.name)
            for f in dataclasses.fields(full)
            if f.name in names and f.init
        }
        kwargs["sliding_window"] = window
        sliding[name] = SlidingWindowSpec(**kwargs)
    if draft_first:
        out = dict(sliding)
        out.update((name, spec) for name, spec in specs.items() if name not in draft_layers)
    else:
        out = {name: sliding.get(name, spec) for name, spec in specs.items()}
    logger.info(
        "dspark draft window: draft KV memory bounded: %d draft layers get vLLM "
        "SlidingWindowSpec(sliding_window=%d = W - K, block_size=%d)",
        len(present),
        window,
        out[present[0]].block_size,
    )
    LAST_DECISION.clear()
    LAST_DECISION.update(bounded=True, sliding_window=window, layers=sorted(present))
    return out


def _wrap(runner_class: Any, draft_first: bool) -> None:
    """Wrap ``runner_class.get_kv_cache_spec`` with :func:`bound_draft_kv_specs` (once;
    ``seam.wrap_get_kv_cache_spec``)."""

    def hook(runner: Any, specs: dict[str, Any]) -> dict[str, Any]:
        return bound_draft_kv_specs(
            runner.vllm_config, specs, draft_layer_names(runner), draft_first
        )

    seam.wrap_get_kv_cache_spec(runner_class, hook)


def install() -> bool:
    """Wrap the model runners' ``get_kv_cache_spec`` (idempotent): vLLM's V1
    ``GPUModelRunner`` (``vllm/v1/worker/gpu_model_runner.py``, 0.26 to 0.33; the CPU
    runner of those versions inherits it), draft layers first (module doc), and the V2
    runner (``vllm/v1/worker/gpu/model_runner.py``: the default on GPUs since 0.29, the
    only runner in 0.34, whose CPU runner inherits it), in vLLM's own layer order: V2
    builds every draft layer's metadata from its own KV-cache group's block table
    (``spec_decode/speculator.py``, ``set_attn`` / ``_build_draft_attn_metadata``).
    False when this vLLM has neither (then the window bounds no memory, and the pass
    says so)."""
    runners = seam.model_runner_classes()
    for hook, runner in runners:
        _wrap(runner, draft_first=hook == "v1_gpu_model_runner")
    if not runners:
        logger.debug("dspark: no V1 or V2 model runner: draft KV memory hook not installed")
    return bool(runners)
