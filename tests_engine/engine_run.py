"""Run one vLLM engine as the README configures it and write a JSON report.

``python engine_run.py SPEC.json REPORT.json``. SPEC: ``target``, ``method``,
``draft``, ``num_speculative_tokens`` (``method`` null: no speculation), ``window``
(null: no window), ``sinks`` (optional ``draft_sink_size``), ``tp``, ``prompt_lens``
(or ``prompt_token_ids``: the prompts themselves), ``max_tokens``,
``max_model_len``, ``device`` (``cpu``/``cuda``), ``dtype``, ``backend`` (the
attention backend, GPU only), ``graphs`` (GPU: ``full`` = FULL CUDA graphs with
``splitting_ops: []``, which vLLM turns into FULL graphs; ``piecewise`` =
``use_inductor_graph_partition: true`` with vLLM's default splitting ops and
graph mode; the mode vLLM chose is reported). The engine core runs in this process
(``VLLM_ENABLE_V1_MULTIPROCESSING=0``); with ``tp > 1`` the workers are
processes of vLLM's ``mp`` executor. The report holds the greedy token ids,
vLLM's speculative-decoding counters and ``engine_probe.report`` of each worker.
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


def prompts(lens: list[int]) -> list[dict]:
    """Deterministic token-id prompts (no tokenizer)."""
    return [
        {"prompt_token_ids": [(7 * i * i + 3 * i + 11 * n) % 500 + 3 for i in range(n)]}
        for n in lens
    ]


def main(spec_path: str, report_path: str) -> None:
    import engine_probe
    from vllm import LLM, SamplingParams

    spec = json.loads(open(spec_path).read())
    started = time.time()
    # The README's configuration: the pass by qualname, attention kept in the
    # graph, the window in additional_config.
    kwargs = dict(
        model=spec["target"],
        skip_tokenizer_init=True,
        dtype=spec.get("dtype", "float32"),
        max_model_len=spec.get("max_model_len", 1024),
        max_num_seqs=4,
        block_size=32,
        seed=0,
        disable_log_stats=False,
        tensor_parallel_size=spec.get("tp", 1),
        speculative_config={
            "method": spec["method"],
            "model": spec["draft"],
            "num_speculative_tokens": spec["num_speculative_tokens"],
        },
        compilation_config={
            "inductor_passes": {
                "post_grad_custom_post_pass": "dspark_compile_vllm.draft_window_pass"
            },
            "splitting_ops": [],
        },
    )
    if spec["method"] is None:
        del kwargs["speculative_config"]
    if spec.get("device") == "cuda":
        kwargs.update(
            gpu_memory_utilization=0.12,
            kv_cache_memory_bytes=1 << 30,
            attention_config={"backend": spec["backend"]},
        )
        if "speculative_config" in kwargs:
            kwargs["speculative_config"]["attention_backend"] = spec["backend"]
        if spec.get("graphs") == "piecewise":  # the README's alternative to splitting_ops: []
            kwargs["compilation_config"] = {
                "inductor_passes": kwargs["compilation_config"]["inductor_passes"],
                "use_inductor_graph_partition": True,
            }
    if spec.get("window") is not None:
        kwargs["additional_config"] = {"draft_window_size": spec["window"]}
        if spec.get("sinks"):
            kwargs["additional_config"]["draft_sink_size"] = spec["sinks"]
    if spec.get("tp", 1) > 1:
        kwargs["distributed_executor_backend"] = "mp"
    engine_probe.install_class_probes()  # this process's workers (TP 1): capture included
    llm = LLM(**kwargs)
    init_s = time.time() - started
    llm.collective_rpc(engine_probe.install)
    outputs = llm.generate(
        [{"prompt_token_ids": p} for p in spec["prompt_token_ids"]]
        if spec.get("prompt_token_ids")
        else prompts(spec["prompt_lens"]),
        SamplingParams(
            temperature=0,
            max_tokens=spec["max_tokens"],
            ignore_eos=spec.get("ignore_eos", False),
            detokenize=False,
        ),
    )
    metrics = {}
    for metric in llm.get_metrics():
        if metric.name.startswith("vllm:spec_decode"):
            metrics[metric.name] = getattr(metric, "value", None)
            if hasattr(metric, "values"):
                metrics[metric.name] = list(metric.values)
    report = {
        "spec": spec,
        "init_s": init_s,
        "total_s": time.time() - started,
        "vllm_version": __import__("vllm").__version__,
        "cudagraph_mode": str(llm.llm_engine.vllm_config.compilation_config.cudagraph_mode),
        "kv_cache_blocks": llm.llm_engine.vllm_config.cache_config.num_gpu_blocks,
        "tokens": [list(o.outputs[0].token_ids) for o in outputs],
        "metrics": metrics,
        "workers": llm.collective_rpc(engine_probe.report),
    }
    with open(report_path, "w") as f:
        json.dump(report, f)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
