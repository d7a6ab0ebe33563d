"""Worker-side probes, run in every vLLM worker through ``LLM.collective_rpc``.

``install_class_probes`` (engine_run.py, before the engine is built, so calls
made during CUDA-graph capture count too) or ``install`` (per layer, in each
worker, after start) wraps the attention implementation so each call with
metadata is counted, with whether the metadata it received is
the draft window's (``dspark_window`` set by ``StepWindows``), whether it is
the per-token expansion of the window with sinks (one single-query row per
token), the largest query length and the sliding window the call applies
(``backends.applied_window``: the layer's, or the metadata's where the backend reads it
from there). ``report`` returns those counts with the pass records and window stats of
the worker's process, and each FlashAttention metadata builder's ahead-of-time plan.
"""

from __future__ import annotations

import dataclasses
from typing import Any

# ``repr`` of an applied window that windows nothing, on every backend: None (no window
# given), -1 (CPU_ATTN), (-1, -1) (FLASH_ATTN, TRITON_ATTN).
NO_WINDOW_REPRS = ("None", "-1", "(-1, -1)")

CALLS: dict[str, dict[str, Any]] = {}


def _static_layers(worker: Any) -> dict[str, Any]:
    config = getattr(worker, "vllm_config", None) or worker.model_runner.vllm_config
    return config.compilation_config.static_forward_context


def _impl_classes() -> list[type]:
    """The attention implementations of the backends the window supports, as installed."""
    import importlib

    classes = []
    for module, name in (
        ("vllm.v1.attention.backends.flash_attn", "FlashAttentionImpl"),
        ("vllm.v1.attention.backends.triton_attn", "TritonAttentionImpl"),
        ("vllm.v1.attention.backends.cpu_attn", "CPUAttentionBackendImpl"),
    ):
        try:
            classes.append(getattr(importlib.import_module(module), name))
        except (ImportError, AttributeError):
            pass
    return classes


def install_class_probes() -> int:
    """Wrap ``forward`` of every supported backend's attention implementation CLASS, in
    this process, before the engine is built: calls made while CUDA graphs are captured
    (and every eager call) are recorded, keyed by ``layer.layer_name``. Worker processes
    of other executors get ``install`` instead."""
    classes = _impl_classes()
    for cls in classes:
        if cls.__dict__.get("_dspark_probe"):
            continue
        original = cls.forward

        def forward(
            impl,
            layer_,
            query,
            key,
            value,
            kv_cache,
            attn_metadata,
            *args,
            _original=original,
            **kwargs,
        ):
            _record(layer_.layer_name, layer_, attn_metadata)
            return _original(
                impl, layer_, query, key, value, kv_cache, attn_metadata, *args, **kwargs
            )

        cls.forward = forward
        cls._dspark_probe = True
    return len(classes)


def install(worker: Any) -> int:
    """Wrap ``forward`` of each attention layer's implementation instance in ``worker``
    (not already probed by ``install_class_probes``); returns how many were wrapped."""
    from vllm.model_executor.layers.attention.attention import Attention

    count = 0
    for name, layer in _static_layers(worker).items():
        if not isinstance(layer, Attention) or getattr(layer.impl, "_dspark_probe", False):
            continue
        impl = layer.impl
        original = impl.forward

        def forward(
            layer_,
            query,
            key,
            value,
            kv_cache,
            attn_metadata,
            *args,
            _original=original,
            _name=name,
            **kwargs,
        ):
            _record(_name, layer_, attn_metadata)
            return _original(layer_, query, key, value, kv_cache, attn_metadata, *args, **kwargs)

        impl.forward = forward
        impl._dspark_probe = True
        count += 1
    return count


def _record(name: str, layer: Any, attn_metadata: Any) -> None:
    """Count one attention call of layer ``name`` (calls without metadata are not counted)."""
    from dspark_compile.integrations.vllm.backends import applied_window

    if attn_metadata is not None:
        record = CALLS.setdefault(
            name,
            {
                "calls": 0,
                "windowed": 0,
                "max_query_len": 0,
                "sliding_window": None,
                "applied_windows": {},
                "past_n": 0,
                "no_window_past_n": 0,
                "expanded": 0,
                "expanded_max_tokens": 0,
                "sink_size": 0,
            },
        )
        record["calls"] += 1
        spec = getattr(attn_metadata, "dspark_window", None)
        if spec is not None:
            record["windowed"] += 1
            record["sink_size"] = spec.sink_size
        if getattr(attn_metadata, "dspark_expanded", False):
            # one single-query row per token: rows == tokens, qsl == arange
            tokens = int(attn_metadata.num_actual_tokens)
            qsl = attn_metadata.query_start_loc
            if (
                attn_metadata.max_query_len == 1
                and attn_metadata.seq_lens.shape[0] == tokens
                and attn_metadata.block_table.shape[0] == tokens
                and qsl.tolist() == list(range(tokens + 1))
            ):
                record["expanded"] += 1
                record["expanded_max_tokens"] = max(record["expanded_max_tokens"], tokens)
        record["max_query_len"] = max(record["max_query_len"], int(attn_metadata.max_query_len))
        applied = repr(applied_window(layer, attn_metadata))
        record["sliding_window"] = applied
        record["applied_windows"][applied] = record["applied_windows"].get(applied, 0) + 1
        # windowed calls with a request longer than W - K; those that apply no window
        if spec is not None and not spec.sink_size and int(attn_metadata.max_seq_len) > spec.tokens:
            record["past_n"] += 1
            if applied in NO_WINDOW_REPRS:
                record["no_window_past_n"] += 1


def flash_attention_plans(worker: Any) -> list[dict[str, Any]]:
    """Every FlashAttention metadata builder of the worker's runner and of its drafter:
    its layers, whether it plans ahead of time (``aot_schedule``; vLLM switches it off for
    good at the first build when the layers' ``impl.sliding_window`` differ) and the
    window it plans for."""
    runner = worker.model_runner
    groups = [g for gs in getattr(runner, "attn_groups", []) for g in gs]
    groups += list(getattr(getattr(runner, "drafter", None), "draft_attn_groups", []))
    plans = []
    for group in groups:
        for builder in getattr(group, "metadata_builders", []):
            if hasattr(builder, "aot_schedule"):
                plans.append(
                    {
                        "layers": sorted(group.layer_names),
                        "aot_schedule": bool(builder.aot_schedule),
                        "aot_sliding_window": repr(getattr(builder, "aot_sliding_window", None)),
                    }
                )
    return plans


def report(worker: Any) -> dict[str, Any]:
    from dspark_compile.integrations.vllm.attention_op import STEP_WINDOWS
    from dspark_compile.passes import stats as keys
    from dspark_compile.passes.record import pass_records

    # The vLLM pass's records with the window on (details set): one per graph.
    records = [
        {**r.details, **r.stats}
        for r in pass_records()
        if r.pass_name == keys.VLLM_DRAFT_WINDOW_PASS and r.details
    ]
    return {
        "calls": CALLS,
        "pass_records": records,
        "stats": dataclasses.asdict(STEP_WINDOWS.stats),
        "layers": sorted(_static_layers(worker)),
        "flash_attention_plans": flash_attention_plans(worker),
    }
