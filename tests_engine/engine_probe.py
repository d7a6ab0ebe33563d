"""Worker-side probes, run in every vLLM worker through ``LLM.collective_rpc``.

``install`` wraps the attention implementation of every attention layer so
each call with metadata is counted, with whether the metadata it received is
the draft window's (``dspark_window`` set by ``StepWindows``), the largest
query length and the layer's sliding window. ``report`` returns those counts
with the pass records and window stats of the worker's process.
"""

from __future__ import annotations

import dataclasses
from typing import Any

CALLS: dict[str, dict[str, Any]] = {}


def _static_layers(worker: Any) -> dict[str, Any]:
    config = getattr(worker, "vllm_config", None) or worker.model_runner.vllm_config
    return config.compilation_config.static_forward_context


def install(worker: Any) -> int:
    from vllm.model_executor.layers.attention.attention import Attention

    count = 0
    for name, layer in _static_layers(worker).items():
        if not isinstance(layer, Attention) or getattr(layer.impl, "_dspark_probe", False):
            continue
        impl = layer.impl
        original = impl.forward

        def forward(layer_, query, key, value, kv_cache, attn_metadata, *args,
                    _original=original, _name=name, _impl=impl, **kwargs):
            if attn_metadata is not None:
                record = CALLS.setdefault(_name, {"calls": 0, "windowed": 0, "max_query_len": 0,
                                                  "sliding_window": None})
                record["calls"] += 1
                if getattr(attn_metadata, "dspark_window", None) is not None:
                    record["windowed"] += 1
                record["max_query_len"] = max(record["max_query_len"],
                                              int(attn_metadata.max_query_len))
                record["sliding_window"] = repr(_impl.sliding_window)
            return _original(layer_, query, key, value, kv_cache, attn_metadata, *args, **kwargs)

        impl.forward = forward
        impl._dspark_probe = True
        count += 1
    return count


def report(worker: Any) -> dict[str, Any]:
    from dspark_compile.integrations.vllm.attention_op import STEP_WINDOWS
    from dspark_compile.integrations.vllm.inductor_pass import PASS_RECORDS

    return {"calls": CALLS, "pass_records": PASS_RECORDS,
            "stats": dataclasses.asdict(STEP_WINDOWS.stats),
            "layers": sorted(_static_layers(worker))}
