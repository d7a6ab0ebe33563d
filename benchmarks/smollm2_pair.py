"""SmolLM2-135M as the target, and drafts for it distilled on its own outputs at 512 tokens.

Three steps, each a subcommand (``python benchmarks/smollm2_pair.py STEP --pair DIR``):

- ``prepare [--gguf FILE] [--prompts FILE]``: ``DIR/target`` (the HF checkpoint of
  ``benchmarks/smollm2.py``), the corpus (``dspark_research.speculative.corpus``: this
  Python's stdlib source) tokenized with SmolLM2's tokenizer, files joined by its EOS id
  (``DIR/tokens.pt``: ``train`` / ``eval`` int64 ids), and ``DIR/prompts.json``: held-out
  windows of ``CONTEXTS`` tokens (``--prompts`` reuses another machine's file, so every
  machine decodes the same prompts: the corpus is the running Python's stdlib).
- ``train [--device cuda] [--time-budget S]``: ``DIR/draft``, a 2-layer Llama
  ``draft_model`` draft (SmolLM2's width and heads; its embedding and ``lm_head`` are the
  target's, frozen; random layers), and
  ``DIR/eagle3``, an EAGLE3 draft on the target's aux states (embedding and ``lm_head``
  the target's, frozen), both trained at ``DRAFT_CONTEXT`` tokens on the soft cross
  entropy against the target's next-token distributions (distillation); then their
  trained tensors rounded to bf16 (the checkpoints hold exactly those values, in fp32),
  ``DIR/weights/{draft,eagle3}.safetensors`` (those tensors alone, bf16: small enough to
  bring back from a lent GPU), and ``DIR/train_report.json`` (the fields
  ``benchmarks/bench_engine.py`` reads, losses per context, git commit, versions).
  ``--only NAME --weights WDIR`` trains one draft (``draft_model`` or ``eagle3``) and loads
  the other from ``WDIR/{draft,eagle3}.safetensors``, unchanged (the report says which).
- ``assemble --weights WDIR``: ``DIR/draft`` and ``DIR/eagle3`` rebuilt from
  ``DIR/target`` and the tensors ``train`` saved: the same checkpoints on another machine.

Then ``benchmarks/bench_engine.py --pair DIR`` runs vLLM on it, as on the trained pair.
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import os
import shutil
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

import smollm2  # noqa: E402
import torch  # noqa: E402
from train_engine_pair import git_commit, held_out_prompts, log, versions  # noqa: E402

from dspark_research.speculative import eagle3 as eagle3_lib, hf_export  # noqa: E402
from dspark_research.speculative.corpus import SEPARATOR, load_corpus  # noqa: E402
from dspark_research.speculative.lm import TransformerLM  # noqa: E402
from dspark_research.speculative.training import TrainSpec, eval_loss, train_lm  # noqa: E402

DRAFT_CONTEXT = 512
CONTEXTS = (512, 1024, 2048, 4096, 8192)
PROMPTS_PER_CONTEXT = 32
MAX_MODEL_LEN = smollm2.MAX_POSITIONS
DRAFT_LAYERS = 2
DRAFT_TRAIN = TrainSpec(steps=3000, batch=16, context=DRAFT_CONTEXT, lr=1e-3, warmup=100, seed=1)
EAGLE3_TRAIN = TrainSpec(steps=3000, batch=16, context=DRAFT_CONTEXT, lr=1e-3, warmup=100, seed=4)
EAGLE3_INTERMEDIATE = 1536
BUDGET_SHARES = {"draft_model": 0.45, "eagle3": 0.55}
EVAL_CONTEXTS = (512, 2048, 8192)


# ---------------------------------------------------------------- prepare
def tokenize_corpus(tokenizer, blob: torch.Tensor) -> torch.Tensor:
    """The corpus's files (``blob``: uint8, joined by ``SEPARATOR``) tokenized one by one
    and joined by the tokenizer's EOS id -> int64 ids."""
    texts = bytes(blob.tolist()).split(bytes([SEPARATOR]))
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for chunk in range(0, len(texts), 256):
        batch = [t.decode("utf-8", errors="replace") for t in texts[chunk : chunk + 256]]
        for row in tokenizer(batch, add_special_tokens=False)["input_ids"]:
            ids.extend(row)
            ids.append(eos)
    return torch.tensor(ids, dtype=torch.int64)


def prepare(args) -> int:
    out: Path = args.pair
    out.mkdir(parents=True, exist_ok=True)
    source = smollm2.checkpoint(gguf=args.gguf)
    if not (out / "target").exists():
        shutil.copytree(source, out / "target")
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(out / "target"))
    corpus = load_corpus(0.05)
    started = time.time()
    tokens = {"train": tokenize_corpus(tokenizer, corpus.train)}
    tokens["eval"] = tokenize_corpus(tokenizer, corpus.eval)
    log(
        f"tokenized the corpus in {time.time() - started:.0f} s: {tokens['train'].numel()} "
        f"training tokens ({corpus.train.numel()} bytes), {tokens['eval'].numel()} held out"
    )
    torch.save({**tokens, "python": corpus.python_version}, out / "tokens.pt")
    if args.prompts:
        shutil.copyfile(args.prompts, out / "prompts.json")
    else:
        prompts = held_out_prompts(tokens["eval"], CONTEXTS, PROMPTS_PER_CONTEXT)
        (out / "prompts.json").write_text(
            json.dumps(
                {
                    "seed": 7,
                    "source": "held-out split of dspark_research.speculative.corpus "
                    f"(eval_fraction 0.05), SmolLM2 tokens ({smollm2.GGUF_NAME})",
                    "python": corpus.python_version,
                    "prompts": {str(k): v for k, v in prompts.items()},
                }
            )
        )
    log(f"wrote {out}/target, tokens.pt, prompts.json")
    return 0


# ---------------------------------------------------------------- the drafts
def draft_config(target: TransformerLM):
    return dataclasses.replace(target.cfg, num_layers=DRAFT_LAYERS)


def eagle3_config(target: TransformerLM):
    return dataclasses.replace(target.cfg, num_layers=1, intermediate_size=EAGLE3_INTERMEDIATE)


def eagle3_aux_ids(target: TransformerLM) -> tuple[int, ...]:
    return eagle3_lib.default_aux_layer_ids(target.cfg.num_layers)


@torch.no_grad()
def new_draft(target: TransformerLM) -> TransformerLM:
    """The draft: random layers (seed 1), the target's final norm as a start, the
    target's embedding and ``lm_head`` (frozen)."""
    draft = TransformerLM(draft_config(target), seed=1).to(target.embed.weight.device)
    draft.embed.weight.copy_(target.embed.weight)
    draft.lm_head.weight.copy_(target.lm_head.weight)
    draft.norm.weight.copy_(target.norm.weight)
    draft.embed.weight.requires_grad_(False)
    draft.lm_head.weight.requires_grad_(False)
    return draft


def new_eagle3(target: TransformerLM) -> eagle3_lib.Eagle3Draft:
    draft = eagle3_lib.Eagle3Draft(
        eagle3_config(target), eagle3_aux_ids(target), target.cfg.hidden_size, seed=4
    ).to(target.embed.weight.device)
    eagle3_lib.tie_eagle3_to_target(draft, target)
    draft.lm_head.weight.requires_grad_(False)
    return draft


def trained_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The trainable tensors of ``model``, bf16 (what ``weights/*.safetensors`` holds)."""
    return {
        k: p.detach().to(torch.bfloat16).cpu().contiguous()
        for k, p in model.named_parameters()
        if p.requires_grad
    }


@torch.no_grad()
def load_trained(model: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Set ``model``'s trainable tensors to ``tensors`` (bf16 values, kept in fp32)."""
    params = dict(model.named_parameters())
    want = {k for k, p in params.items() if p.requires_grad}
    if set(tensors) != want:
        raise ValueError(
            f"weights hold {sorted(set(tensors) ^ want)} beyond / short of the model's "
            "trainable tensors"
        )
    for k, v in tensors.items():
        params[k].copy_(v.float())


def export(draft, eagle3, out: Path) -> None:
    for write, model, name in (
        (hf_export.export_llama, draft, "draft"),
        (eagle3_lib.export_eagle3, eagle3, "eagle3"),
    ):
        write(
            model.cpu(),
            out / name,
            max_position_embeddings=MAX_MODEL_LEN,
            training_context=DRAFT_CONTEXT,
            extra={"dspark_target": smollm2.NAME},
        )


def train(args) -> int:
    from safetensors.torch import load_file, save_file

    out: Path = args.pair
    device = torch.device(args.device)
    started = time.time()
    torch.manual_seed(0)
    target = hf_export.load_llama(out / "target").to(device)
    tokens = torch.load(out / "tokens.pt")
    budget = {
        k: (args.time_budget * v if args.time_budget else None) for k, v in BUDGET_SHARES.items()
    }

    def progress(phase):
        def report(done, total, loss):
            if (done - 1) % 200 == 0 or done == total:
                log(
                    f"{phase}: step {done}/{total}, soft CE {loss:.3f}, "
                    f"{time.time() - started:.0f} s"
                )

        return report

    if args.only:  # the whole budget goes to the one draft trained
        budget = {k: (args.time_budget if k == args.only else None) for k in budget}
    record = {}
    draft, eagle3 = new_draft(target), new_eagle3(target)
    for name, model, file in (("draft_model", draft, "draft"), ("eagle3", eagle3, "eagle3")):
        if args.only and name != args.only:
            source = args.weights / f"{file}.safetensors"
            load_trained(model, load_file(str(source)))
            record[name] = {"loaded": str(source), "trained": False}
            log(f"{name}: loaded from {source}, not trained")
    if args.only in (None, "draft_model"):
        record["draft_model"] = train_lm(
            draft,
            tokens["train"],
            DRAFT_TRAIN,
            teacher=target,
            progress=progress("draft_model"),
            time_budget_s=budget["draft_model"],
        )
    if args.only in (None, "eagle3"):
        record["eagle3"] = eagle3_lib.train_eagle3(
            eagle3,
            target,
            tokens["train"],
            EAGLE3_TRAIN,
            distill=True,
            progress=progress("eagle3"),
            time_budget_s=budget["eagle3"],
        )
    train_s = time.time() - started
    weights = {"draft": trained_tensors(draft), "eagle3": trained_tensors(eagle3)}
    (out / "weights").mkdir(exist_ok=True)
    for name, tensors in weights.items():
        save_file(tensors, str(out / "weights" / f"{name}.safetensors"))
        load_trained(draft if name == "draft" else eagle3, tensors)  # bf16 values, as exported
    heldout: dict = {"draft_model": {}, "eagle3": {}, "eagle3_step2": {}}
    for c in args.eval_contexts:
        batch = max(1, min(8, 16384 // c))
        heldout["draft_model"][c] = eval_loss(draft, tokens["eval"], c, 2, batch, teacher=target)
        e3 = eagle3_lib.eval_eagle3(eagle3, target, tokens["eval"], c, 2, batch, distill=True)
        heldout["eagle3"][c], heldout["eagle3_step2"][c] = e3["step1"], e3["step2"]
        log(
            f"held-out soft CE against the target at {c}: draft_model "
            f"{heldout['draft_model'][c]:.3f}, eagle3 {e3['step1']:.3f} (step 2 {e3['step2']:.3f})"
        )
    export(draft, eagle3, out)
    report = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "git_commit": git_commit(),
        "versions": versions(),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
        "target": json.loads((out / "target" / "config.json").read_text())["dspark_source"],
        "drafts": {
            "draft_model": {
                "config": dataclasses.asdict(draft.cfg),
                "init": "random layers (seed 1), the target's final norm",
            },
            "eagle3": {
                "config": dataclasses.asdict(eagle3.cfg),
                "aux_layer_ids": list(eagle3_aux_ids(target)),
            },
            "loss": "soft cross entropy against the target's next-token distributions",
            "frozen": "embedding and lm_head (the target's)",
        },
        "training": record,
        "heldout_soft_ce_nats_per_token": heldout,
        "training_tokens": int(tokens["train"].numel()),
        "draft_context": DRAFT_CONTEXT,
        "target_context": 8192,
        "contexts": list(CONTEXTS),
        "max_model_len": MAX_MODEL_LEN,
        "durations_s": {"train": train_s, "total": time.time() - started},
    }
    (out / "train_report.json").write_text(json.dumps(report, indent=1) + "\n")
    log(f"wrote {out}/draft, eagle3, weights/, train_report.json in {time.time() - started:.0f} s")
    return 0


def assemble(args) -> int:
    from safetensors.torch import load_file

    out: Path = args.pair
    target = hf_export.load_llama(out / "target")
    draft, eagle3 = new_draft(target), new_eagle3(target)
    load_trained(draft, load_file(str(args.weights / "draft.safetensors")))
    load_trained(eagle3, load_file(str(args.weights / "eagle3.safetensors")))
    export(draft, eagle3, out)
    log(f"wrote {out}/draft and {out}/eagle3 from {args.weights}")
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("step", choices=("prepare", "train", "assemble"))
    parser.add_argument("--pair", type=Path, required=True)
    parser.add_argument("--gguf", type=Path, default=None)
    parser.add_argument("--prompts", type=Path, default=None)
    parser.add_argument("--weights", type=Path, default=None)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--time-budget", type=float, default=None, help="seconds of training")
    parser.add_argument(
        "--only",
        choices=("draft_model", "eagle3"),
        default=None,
        help="train: this draft alone, the other loaded from --weights (default: both)",
    )
    parser.add_argument(
        "--eval-contexts",
        type=lambda s: [int(c) for c in s.split(",")],
        default=list(EVAL_CONTEXTS),
        help="held-out losses at these lengths (default %(default)s)",
    )
    args = parser.parse_args(argv)
    if args.step == "assemble" and not args.weights:
        parser.error("assemble needs --weights (the folder train wrote weights/ to)")
    if args.only and (args.step != "train" or not args.weights):
        parser.error(
            f"--only {args.only} is a train option and needs --weights (the folder holding "
            "the other draft's safetensors)"
        )
    return {"prepare": prepare, "train": train, "assemble": assemble}[args.step](args)


if __name__ == "__main__":
    sys.exit(main())
