"""Run one vLLM engine for the draft KV-memory tier and write a JSON report.

``python kv_engine_run.py SPEC.json REPORT.json``. SPEC: ``target``, ``draft``
(null: no speculation), ``method`` (default ``draft_model``), ``tp`` (default 1),
``window`` (null: none), ``bound`` (false: the window
with ``draft_window_kv_memory=False``), ``prefix_caching``,
``max_num_batched_tokens``, ``max_model_len``, ``num_gpu_blocks_override``
(null: from VLLM_CPU_KVCACHE_SPACE), ``prompt_lens``, ``max_tokens``,
``rounds`` (the prompts are generated that many times: round 2 reads the
prefix cache), ``extra`` (optional ``{prompt_lens, max_tokens}`` generated
once after the rounds). The engine core and the worker run in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``, one rank). The report holds the greedy
token ids per round, vLLM's reported KV capacity (``kv_cache_size_tokens``, as
logged "CPU KV cache size: N tokens"), the KV-cache groups, the number of blocks,
speculative-decoding / preemption / prefix-cache counters, and what
``kv_memory`` decided.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from engine_run import prompts  # noqa: E402

NUM_SPEC = 3


def build_target(path, max_positions: int = 4096) -> str:
    """``tiny_models.build_llama(path, 2 layers, seed 0)`` with ``max_position_embeddings``
    raised to ``max_positions`` (the tier runs at max_model_len 4096)."""
    from pathlib import Path

    import tiny_models
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    path = Path(path)
    if not (path / "config.json").exists():
        config = dict(tiny_models.llama_config(2), max_position_embeddings=max_positions)
        torch.manual_seed(0)
        LlamaForCausalLM(LlamaConfig(**config)).save_pretrained(path, safe_serialization=True)
    return str(path)


def kv_decision(worker=None) -> dict:
    """What ``kv_memory`` decided in this process (a worker, through collective_rpc)."""
    from dspark_compile.integrations.vllm import kv_memory

    return dict(kv_memory.LAST_DECISION)


def main(spec_path: str, report_path: str) -> None:
    from vllm import LLM, SamplingParams

    spec = json.loads(open(spec_path).read())
    started = time.time()
    kwargs = dict(
        model=spec["target"],
        skip_tokenizer_init=True,
        dtype="float32",
        max_model_len=spec["max_model_len"],
        max_num_seqs=4,
        block_size=32,
        seed=0,
        disable_log_stats=False,
        enable_prefix_caching=spec["prefix_caching"],
        max_num_batched_tokens=spec["max_num_batched_tokens"],
        compilation_config={
            "inductor_passes": {
                "post_grad_custom_post_pass": "dspark_compile_vllm.draft_window_pass"
            },
            "splitting_ops": [],
        },
    )
    if spec.get("num_gpu_blocks_override"):
        kwargs["num_gpu_blocks_override"] = spec["num_gpu_blocks_override"]
    if spec.get("draft"):
        kwargs["speculative_config"] = {
            "method": spec.get("method", "draft_model"),
            "model": spec["draft"],
            "num_speculative_tokens": NUM_SPEC,
        }
    if spec.get("tp", 1) > 1:
        kwargs["tensor_parallel_size"] = spec["tp"]
        kwargs["distributed_executor_backend"] = "mp"
    if spec.get("window") is not None:
        kwargs["additional_config"] = {"draft_window_size": spec["window"]}
        if spec.get("bound") is False:
            kwargs["additional_config"]["draft_window_kv_memory"] = False
    llm = LLM(**kwargs)
    init_s = time.time() - started
    params = SamplingParams(temperature=0, max_tokens=spec["max_tokens"], detokenize=False)
    rounds = []
    for _ in range(spec.get("rounds", 1)):
        outputs = llm.generate(prompts(spec["prompt_lens"]), params)
        rounds.append([list(o.outputs[0].token_ids) for o in outputs])
    extra = None
    if spec.get("extra"):  # more prompts, generated after the rounds
        outputs = llm.generate(
            prompts(spec["extra"]["prompt_lens"]),
            SamplingParams(temperature=0, detokenize=False, max_tokens=spec["extra"]["max_tokens"]),
        )
        extra = [list(o.outputs[0].token_ids) for o in outputs]
    metrics = {}
    for metric in llm.get_metrics():
        if metric.name.startswith(
            ("vllm:spec_decode", "vllm:num_preemptions", "vllm:prefix_cache")
        ):
            metrics[metric.name] = getattr(metric, "value", None)
            if hasattr(metric, "values"):
                metrics[metric.name] = list(metric.values)
    cache = llm.llm_engine.vllm_config.cache_config
    core = llm.llm_engine.engine_core.engine_core
    config = core.scheduler.kv_cache_config

    decisions = llm.collective_rpc(kv_decision) if spec.get("tp", 1) > 1 else [kv_decision()]

    report = {
        "spec": spec,
        "init_s": init_s,
        "total_s": time.time() - started,
        "rounds": rounds,
        "extra": extra,
        "kv_cache_tokens": cache.kv_cache_size_tokens,
        "max_concurrency": getattr(cache, "kv_cache_max_concurrency", None),
        "num_blocks": config.num_blocks,
        "kv_cache_groups": [
            {
                "type": type(g.kv_cache_spec).__name__,
                "layers": list(g.layer_names),
                "block_size": g.kv_cache_spec.block_size,
                "sliding_window": getattr(g.kv_cache_spec, "sliding_window", None),
            }
            for g in config.kv_cache_groups
        ],
        "metrics": metrics,
        "kv_memory": decisions[0],
        "kv_memory_per_rank": decisions,
        "max_num_batched_tokens": (
            llm.llm_engine.vllm_config.scheduler_config.max_num_batched_tokens
        ),
    }
    with open(report_path, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
