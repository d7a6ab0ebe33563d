"""The acceptance study: tau and tokens/s against context, with and without the window.

:func:`run_study` trains (or loads) the target and both draft families at a
:class:`StudyScale`, then for every family x setting x context runs
:class:`SpeculativeDecoder` (greedy) on held-out prompts and pools the rounds.
It writes ``study.json`` after every cell (partial results survive an
interruption), then ``study.md`` and, when matplotlib is importable,
``study.png`` (``python -m dspark_research study-report`` makes both from the JSON later).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import platform
import time
from pathlib import Path
from typing import Callable, Optional

import torch

from dspark_research.provenance import git_state
from dspark_research.speculative.checks import FAMILIES, goal_check
from dspark_research.speculative.corpus import Corpus, load_corpus, random_windows
from dspark_research.speculative.lm import TransformerLM
from dspark_research.speculative.loop import (
    SpecResult,
    SpeculativeDecoder,
    compile_draft,
    target_greedy_decode,
)
from dspark_research.speculative.report import write_reports
from dspark_research.speculative.scales import StudyScale
from dspark_research.speculative.training import eval_loss, tie_eagle_to_target, train_lm

logger = logging.getLogger(__name__)

ProgressFn = Callable[[str, int, int, str], None]  # (phase, done, total, note)


@dataclasses.dataclass
class TrainedPair:
    target: TransformerLM
    drafts: dict[str, TransformerLM]
    record: dict


def _versions() -> dict:
    versions = {"torch": torch.__version__, "python": platform.python_version()}
    try:
        import triton

        versions["triton"] = triton.__version__
    except ImportError:
        pass
    return versions


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return f"cpu ({platform.processor() or platform.machine()}, {torch.get_num_threads()} threads)"


def train_pair(
    scale: StudyScale,
    corpus: Corpus,
    device: torch.device,
    progress: Optional[ProgressFn] = None,
    time_budget_s: Optional[float] = None,
) -> TrainedPair:
    """Train the target, then the token-only draft and the EAGLE-style draft."""

    def bar(phase):
        return (
            (lambda done, total, loss: progress(phase, done, total, f"loss {loss:.3f}"))
            if progress
            else None
        )

    record = {}
    target = TransformerLM(scale.target, seed=0).to(device)
    record["target"] = train_lm(
        target,
        corpus.train,
        scale.target_train,
        progress=bar("train target"),
        time_budget_s=time_budget_s,
    )
    target.requires_grad_(False)
    draft = TransformerLM(scale.draft, seed=1).to(device)
    record["draft_model"] = train_lm(
        draft,
        corpus.train,
        scale.draft_train,
        progress=bar("train draft_model"),
        time_budget_s=time_budget_s,
    )
    eagle = TransformerLM(scale.eagle, seed=2).to(device)
    tie_eagle_to_target(eagle, target)
    record["eagle"] = train_lm(
        eagle,
        corpus.train,
        scale.eagle_train,
        target=target,
        progress=bar("train eagle"),
        time_budget_s=time_budget_s,
    )
    for model in (draft, eagle):
        model.requires_grad_(False)
    record["heldout_nats_per_byte"] = {
        "target": eval_loss(target, corpus.eval, scale.target_train.context),
        "target_at_draft_context": eval_loss(target, corpus.eval, scale.draft_context),
        "draft_model": eval_loss(draft, corpus.eval, scale.draft_context),
        "eagle": eval_loss(eagle, corpus.eval, scale.draft_context, target=target),
    }
    return TrainedPair(target, {"draft_model": draft, "eagle": eagle}, record)


def save_pair(pair: TrainedPair, scale: StudyScale, path: Path) -> None:
    torch.save(
        {
            "scale": scale.as_dict(),
            "record": pair.record,
            "target": pair.target.state_dict(),
            "drafts": {k: m.state_dict() for k, m in pair.drafts.items()},
        },
        path,
    )


def load_pair(scale: StudyScale, path: Path, device: torch.device) -> Optional[TrainedPair]:
    """The pair saved at ``path`` if it was trained at exactly this scale, else None."""
    if not path.is_file():
        return None
    state = torch.load(path, map_location=device, weights_only=False)
    if state["scale"] != scale.as_dict():
        logger.info("checkpoint %s was trained at another scale: retraining", path)
        return None
    target = TransformerLM(scale.target).to(device)
    target.load_state_dict(state["target"])
    drafts = {}
    for name, cfg in (("draft_model", scale.draft), ("eagle", scale.eagle)):
        drafts[name] = TransformerLM(cfg).to(device)
        drafts[name].load_state_dict(state["drafts"][name])
    for model in (target, *drafts.values()):
        model.eval().requires_grad_(False)
    return TrainedPair(target, drafts, state["record"])


def _pool(results: list[SpecResult], k: int) -> dict:
    accepted = [a for r in results for a in r.accepted]
    rounds = len(accepted)
    decode_s = sum(r.decode_s for r in results)
    draft_s = sum(r.draft_s for r in results)
    target_s = sum(r.target_s for r in results)
    nlls = [r.draft_nll for r in results if r.draft_nll is not None]
    taus = [r.tau for r in results]
    return {
        "tau": sum(accepted) / max(rounds, 1) + 1.0,
        "tau_per_prompt": taus,
        "rounds": rounds,
        "acceptance_per_position": [
            sum(a >= j for a in accepted) / max(rounds, 1) for j in range(1, k + 1)
        ],
        "tokens_per_s": sum(r.committed_tokens for r in results) / decode_s if decode_s else 0.0,
        "draft_tokens_per_s": rounds * k / draft_s if draft_s else 0.0,
        "target_tokens_per_s": rounds * (k + 1) / target_s if target_s else 0.0,
        "target_prefill_s": sum(r.target_prefill_s for r in results) / len(results),
        "draft_prefill_s": sum(r.draft_prefill_s for r in results) / len(results),
        "draft_nll_nats_per_byte": sum(nlls) / len(nlls) if nlls else None,
    }


def _prompts(corpus: Corpus, scale: StudyScale, seed: int = 7) -> dict[int, list[torch.Tensor]]:
    generator = torch.Generator().manual_seed(seed)
    return {
        c: list(random_windows(corpus.eval, scale.prompts, c - 1, generator))
        for c in scale.contexts
    }


def _graph_count() -> int:
    return int(torch._dynamo.utils.counters["stats"]["unique_graphs"])


def run_study(
    scale: StudyScale,
    out_dir: Path,
    device: str | torch.device = "cpu",
    lowering: Optional[str] = None,
    checkpoint: Optional[Path] = None,
    draft_prefill_chunk: Optional[int] = None,
    families: tuple[str, ...] = FAMILIES,
    progress: Optional[ProgressFn] = None,
    train_time_budget_s: Optional[float] = None,
    setting_keys: Optional[tuple[str, ...]] = None,
) -> dict:
    """Run the study; returns the results dict (also written to ``out_dir/study.json``).

    ``lowering``: the dspark backend's lowering (default: ``inductor`` on CUDA,
    ``aot_eager`` on the CPU, where Inductor's C++ compiles dominate a short run).
    ``draft_prefill_chunk``: tokens per draft prefill forward (default: the whole
    prompt at once; a causal block longer than ``W`` needs the per-token window of
    ``dspark.paged_attention``).
    ``setting_keys``: run only these settings (``Setting.key``; default: all).
    """
    device = torch.device(device)
    settings = scale.select_settings(setting_keys)
    for family in families:
        if family not in FAMILIES:
            raise ValueError(f"families={families!r} is invalid: expected names from {FAMILIES}")
    lowering = lowering or ("inductor" if device.type == "cuda" else "aot_eager")
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path = out_dir / "study.json"
    torch.manual_seed(0)

    corpus = load_corpus(scale.eval_fraction, scale.max_train_bytes)
    logger.info(
        "corpus: %d training bytes in %d files, %d held-out bytes in %d files (%s)",
        corpus.train.numel(),
        len(corpus.train_files),
        corpus.eval.numel(),
        len(corpus.eval_files),
        corpus.root,
    )
    pair = load_pair(scale, checkpoint, device) if checkpoint else None
    if pair is None:
        pair = train_pair(scale, corpus, device, progress, train_time_budget_s)
        if checkpoint:
            save_pair(pair, scale, checkpoint)
    k = scale.num_speculative_tokens
    study = {
        "meta": {
            "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": _device_name(device),
            "versions": _versions(),
            "git": git_state(),
            "scale": scale.as_dict(),
            "lowering": lowering,
            "compile": "torch.compile(draft, backend='dspark'), token dim marked dynamic, "
            "fixed cache shapes: one graph for 1 token, one for 2+ tokens",
            "draft_prefill_chunk": draft_prefill_chunk,
            "num_speculative_tokens": k,
            "greedy": True,
            "dtype": "float32",
            "corpus": corpus.manifest(),
            "training": pair.record,
        },
        "settings": [dataclasses.asdict(s) for s in settings],
        "baseline": [],
        "compile": [],
        "results": [],
    }

    def save():
        study["goal"] = goal_check(study["results"], scale.contexts, scale.draft_context)
        json_path.write_text(json.dumps(study, indent=1))

    prompts = _prompts(corpus, scale)
    reference: dict[int, list[list[int]]] = {}
    for c in scale.contexts:
        outs, rates = [], []
        for prompt in prompts[c]:
            tokens, rate = target_greedy_decode(
                pair.target, prompt.to(device), scale.new_tokens, scale.block_size
            )
            outs.append(tokens)
            rates.append(rate)
        reference[c] = outs
        study["baseline"].append(
            {"context": c, "target_only_tokens_per_s": sum(rates) / len(rates)}
        )
    save()

    max_len = max(scale.contexts) + scale.new_tokens + 2 * k + 2
    total = len(families) * len(settings) * len(scale.contexts)
    done = 0
    for family in families:
        draft = pair.drafts[family]
        for setting in settings:
            torch._dynamo.reset()
            draft_fn = compile_draft(
                draft,
                setting.window,
                None,
                lowering,
                {k2: v for k2, v in setting.options.items() if k2 != "draft_window_size"},
            )
            decoder = SpeculativeDecoder(
                pair.target,
                draft,
                num_speculative_tokens=k,
                draft_fn=draft_fn,
                block_size=scale.block_size,
                draft_prefill_chunk=draft_prefill_chunk,
                max_len=max_len,
            )
            graphs = _graph_count()
            start = time.perf_counter()
            decoder.generate(prompts[scale.contexts[0]][0].to(device), 2 * k + 2)  # compiles
            study["compile"].append(
                {
                    "family": family,
                    "setting": setting.name,
                    "first_run_s": time.perf_counter() - start,
                    "graphs": _graph_count() - graphs,
                }
            )
            for c in scale.contexts:
                if progress:
                    progress("study", done, total, f"{family}, {setting.name}, context {c}")
                results = [
                    decoder.generate(
                        p.to(device),
                        scale.new_tokens,
                        seed=i,
                        nll_tail=min(c - 1, scale.draft_context),
                    )
                    for i, p in enumerate(prompts[c])
                ]
                row = {
                    "family": family,
                    "setting": setting.name,
                    "window": setting.window,
                    "sink_size": setting.sink_size,
                    "context": c,
                    **_pool(results, k),
                    "matches_target_greedy": sum(
                        r.tokens == ref for r, ref in zip(results, reference[c])
                    )
                    / len(results),
                }
                study["results"].append(row)
                done += 1
                logger.info(
                    "%s %s context %d: tau %.2f, %.0f tok/s",
                    family,
                    setting.name,
                    c,
                    row["tau"],
                    row["tokens_per_s"],
                )
                save()
            study["compile"][-1]["graphs_after_study"] = _graph_count() - graphs
            save()
    if progress:
        progress("study", total, total, "done")
    write_reports(study, out_dir)
    return study
