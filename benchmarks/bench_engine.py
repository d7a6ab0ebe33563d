"""End-to-end vLLM benchmark of the draft window on a trained pair (issue 31, item 2).

``python benchmarks/bench_engine.py --pair DIR --out RESULT.json`` with ``DIR`` written by
``benchmarks/train_engine_pair.py`` (``target``, ``draft``, ``eagle``, ``eagle3``,
``prompts.json``). Families: ``draft_model`` (``DIR/draft``), ``eagle`` (EAGLE-1,
``DIR/eagle``), ``eagle3`` (``DIR/eagle3``, method ``eagle3``; its engines run vLLM's V1
model runner, ``VLLM_USE_V2_MODEL_RUNNER=0``, since vLLM 0.26 runs EAGLE drafts on its V2
runner by default and the KV-memory bound hooks the V1 runner; recorded as
``model_runner``).

One ``vllm.LLM`` per (family, setting), configured as the README tells users (the pass
by qualname, ``"splitting_ops": []``, ``additional_config={"draft_window_size": W}``),
each in its own subprocess, one after another, reused across every cell: context
(prompt length, from the drafts' training length to >= 16x it) x batch (1 and e.g. 32
concurrent requests) x temperature (0: greedy, 1: sampling, seeded per request) x
repeat. Settings: ``nospec`` (no speculation; shared by both families), ``off`` (the
draft, no window), ``w1x`` (W = the draft's training context), ``w2x`` (W = 2x),
``w1x-fullkv`` / ``w2x-fullkv`` (the same windows with the draft's full KV cache,
``additional_config["draft_window_kv_memory"] = False``: the window's attention route
without its KV-memory bound, to tell the two costs apart; only when ``--settings``
names them), ``native`` (no window of ours: the draft's own ``config.json`` declares its layers
sliding-window, ``sliding_window = W - K`` for W = the training context, the route of
``benchmarks/repro_native_swa_draft.py``; its greedy cells show whether the target's
output survives; `draft_model` and `eagle3`, whose one layer vLLM indexes draft-relative;
not `eagle`: an EAGLE-1 draft has no such config vLLM loads).

Per cell: output tokens/s (all requests' output tokens / wall time of ``generate``),
per-request decode tokens/s (vLLM's ``request_decode_time_seconds``), mean acceptance
length (1 + accepted / drafts) and per-position acceptance (differences of vLLM's
``spec_decode`` counters before/after the cell), TTFT and ITL (differences of vLLM's
histograms), peak GPU memory of the engine process and vLLM's KV cache capacity;
mean and standard deviation over ``--repeats`` runs. Batch 1: repeat r runs prompt r;
batch B: prompts 0..B-1 every repeat. Greedy cells check losslessness: the first
repeat's tokens against ``nospec``'s.

``--families draft_model`` / ``--families eagle`` / ``--families eagle3`` split the sweep
(later calls can reuse the first call's ``nospec`` cells with ``--baseline FIRST.json``);
``--max-seconds`` stops cleanly (no new engine or cell past it; results so far written).
``--side-by-side`` starts every engine at once and runs each cell on all of them in turn
(``benchmarks/engine_schedule.py``): the engines' starts overlap and each ratio's cells are
timed seconds apart; ``--kv-cache-gib`` then gives every engine the same KV cache
(vLLM's ``kv_cache_memory_bytes``) however many share the GPU.
``--our-loop`` also runs the project's own loop (``dspark_research.speculative``) on
the same weights and prompts (greedy, batch 1) and reports its tau beside vLLM's; its
window reads exactly what vLLM's route reads (block 1, future offset K; see
``--our-loop-block-size``).
``--plot-only RESULT.json`` rewrites the markdown table and the PNG (needs matplotlib).

This file holds the engine workers and the sweep; the tables, ratios and plot made from
the recorded cells are ``benchmarks/bench_engine_report.py`` (no engine, no vLLM).
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

# The tables, ratios and plot from the cells (no engine): bench_engine_report.py.
from bench_engine_report import (  # noqa: E402
    DEFAULT_SETTINGS,
    SETTINGS,
    _fmt,
    base_setting,
    cell_stats,
    check_lossless,
    delta,
    markdown,
    plot,
    setting_kv_memory,
    setting_window,
    snapshot,
    summarize,
)
from engine_schedule import run_side_by_side  # noqa: E402

FAMILIES = ("draft_model", "eagle", "eagle3")
#: family -> (the pair's checkpoint directory, vLLM speculative method)
FAMILY_DRAFTS = {
    "draft_model": ("draft", "draft_model"),
    "eagle": ("eagle", "eagle"),
    "eagle3": ("eagle3", "eagle3"),
}
#: families whose engines run vLLM's V1 model runner (VLLM_USE_V2_MODEL_RUNNER=0)
V1_RUNNER_FAMILIES = ("eagle3",)
OUR_LOOP_FAMILIES = ("draft_model", "eagle", "eagle3")
ENGINE_START_ESTIMATE_S = 60.0
OUR_LOOP_RESERVE_S = 100.0
#: GPU memory fraction all side-by-side engines share (each gets it / engines)
SIDE_BY_SIDE_MEMORY = 0.85
#: seconds a side-by-side engine may take to answer one cell
REPLY_TIMEOUT_S = 240.0


def log(msg: str) -> None:
    print(f"[bench_engine {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- engine worker
def native_draft(src: Path, dst: Path, sliding_window: int) -> Path:
    """``src``'s checkpoint with every layer declared sliding-window in ``config.json``
    (weights linked, not copied): the user's do-it-yourself route for a ``draft_model``
    or ``eagle3`` draft (vLLM's EAGLE3 Llama indexes ``layer_types`` draft-relative, by
    ``target_layer_count``, as ``benchmarks/kv_capacity.py``'s ``eagle3_swa`` does). Not
    for EAGLE-1 (``LlamaForCausalLMEagle``): vLLM indexes its ``layer_types`` by
    the absolute layer (target layers + i; no ``target_layer_count``) while transformers
    requires ``len(layer_types) == num_hidden_layers``, so no such config loads
    (``NATIVE_EAGLE_NOTE``)."""
    config = json.loads((src / "config.json").read_text())
    config["layer_types"] = ["sliding_attention"] * int(config["num_hidden_layers"])
    config["sliding_window"] = sliding_window
    dst.mkdir(parents=True, exist_ok=True)
    for f in src.iterdir():
        link = dst / f.name
        if f.name != "config.json" and not link.exists():
            link.symlink_to(f.resolve())
    (dst / "config.json").write_text(json.dumps(config, indent=1))
    return dst


def native_sliding_window(window_size: int, num_speculative_tokens: int) -> int:
    """The native route's ``sliding_window`` for a window of ``window_size``: ``W - K``,
    the smallest vLLM sliding window that keeps every key our window reads
    (``kv_spec.draft_sliding_window``, not imported: the vLLM integration needs vLLM and
    ``--our-loop-only`` runs without it)."""
    return window_size - num_speculative_tokens


NATIVE_EAGLE_NOTE = (
    "eagle/native: not run: an EAGLE draft cannot declare sliding-window layers that vLLM "
    "loads (vLLM's LlamaForCausalLMEagle reads layer_types[target_layers + i] and asserts it "
    "exists; transformers rejects a layer_types list longer than num_hidden_layers)"
)


def replica_label(setting: str, replica: int) -> str:
    """How replica ``replica`` (1-based) of a setting's engine is recorded: the setting
    itself for the first, ``SETTING#r`` for the others."""
    return setting if replica == 1 else f"{setting}#{replica}"


def engine_plan(families: list[str], settings: list[str], replicas: int = 1) -> list[tuple]:
    """``(family, setting, label)`` of every engine, in start order: one ``nospec``
    engine shared by the families (family ``-``), then each family's other settings;
    ``replicas`` engines of each, side by side in the plan (twins)."""
    plan = [("-", "nospec")] if "nospec" in settings else []
    plan += [(f, s) for f in families for s in settings if s != "nospec"]
    return [(f, s, replica_label(s, r)) for f, s in plan for r in range(1, replicas + 1)]


def engine_name(family: str, label: str) -> str:
    """The engine's name (logs, spec files; ``#r`` written ``-rR``): ``nospec`` engines
    are shared by families."""
    name = label if base_setting(label) == "nospec" else f"{family}-{label}"
    return name.replace("#", "-r")


def stop_cells(now: float, cells_until: float, hard_deadline: float, cells_done: int) -> bool:
    """Whether an engine stops before its next cell: past the hard limit always; past its
    share of cell time (counted from the engine being up) only once a cell has run, so
    every engine that starts times at least its first cell (greedy, batch 1)."""
    return now > hard_deadline or (cells_done > 0 and now > cells_until)


def batch_contexts(spec: dict, batch: int) -> list[int]:
    """The contexts a batch's cells run at: every context for batch 1; for larger batches
    ``spec["batched_contexts"]`` where given (a subset, to spend a device call's minutes
    on the batch-1 cells), else every context."""
    contexts = list(spec["contexts"])
    chosen = spec.get("batched_contexts")
    if batch == 1 or not chosen:
        return contexts
    return [c for c in contexts if c in set(chosen)]


def engine_kwargs(spec: dict) -> dict:
    """``vllm.LLM`` arguments of one engine: the README's configuration."""
    kwargs = dict(
        model=spec["target"],
        skip_tokenizer_init=True,
        dtype=spec["dtype"],
        max_model_len=spec["max_model_len"],
        max_num_seqs=spec["max_num_seqs"],
        seed=0,
        disable_log_stats=False,
        gpu_memory_utilization=spec.get("gpu_memory_utilization", 0.9),
        compilation_config={
            "inductor_passes": {
                "post_grad_custom_post_pass": "dspark_compile_vllm.draft_window_pass"
            },
            "splitting_ops": [],
        },
    )
    if spec.get("block_size"):
        kwargs["block_size"] = spec["block_size"]
    if spec.get("kv_cache_memory_bytes"):
        kwargs["kv_cache_memory_bytes"] = spec["kv_cache_memory_bytes"]
    if spec["setting"] != "nospec":
        speculative = {
            "method": spec["method"],
            "model": spec["draft"],
            "num_speculative_tokens": spec["num_speculative_tokens"],
        }
        if spec.get("draft_attention_backend"):
            speculative["attention_backend"] = spec["draft_attention_backend"]
        kwargs["speculative_config"] = speculative
    if spec.get("window"):
        kwargs["additional_config"] = {"draft_window_size": spec["window"]}
        if spec.get("kv_memory") is False:
            kwargs["additional_config"]["draft_window_kv_memory"] = False
    return kwargs


#: substrings of a draft's path from which vLLM picks the speculative method itself, even
#: over ``method="draft_model"`` (vllm/config/speculative.py, SpeculativeConfig, 0.32/0.33)
METHOD_FROM_PATH = ("eagle-", "eagle3", "dflash", "dspark")


def method_from_path(path: str) -> Optional[str]:
    """The substring of ``path`` (lower-cased) that makes vLLM switch a ``draft_model``
    draft to another method, or None."""
    low = str(path).lower()
    return next((m for m in METHOD_FROM_PATH if m in low), None)


def neutral_draft_path(spec: dict) -> Optional[str]:
    """For a ``draft_model`` draft whose path vLLM would read as another method (e.g. a
    checkout named ``wt-eagle3``): a symlink to it under a fresh temp dir, else None."""
    if spec.get("method") != "draft_model" or not method_from_path(spec["draft"]):
        return None
    import tempfile

    for _ in range(10):
        root = tempfile.mkdtemp(prefix="spec-draft-")
        if not method_from_path(root):
            link = Path(root) / "draft"
            link.symlink_to(Path(spec["draft"]).resolve(), target_is_directory=True)
            return str(link)
    raise RuntimeError(f"no neutral temp path for the draft {spec['draft']}")


def worker_env(spec: dict) -> dict:
    """Environment an engine of ``spec`` needs before vLLM is imported: the V1 model
    runner (``VLLM_USE_V2_MODEL_RUNNER=0``) where ``spec["model_runner"] == "v1"``."""
    return {"VLLM_USE_V2_MODEL_RUNNER": "0"} if spec.get("model_runner") == "v1" else {}


def start_engine(spec: dict):
    """``(llm, engine)``: the ``vllm.LLM`` of ``spec`` (this process's environment set
    first) and its record (start time, KV cache size and groups, runner)."""
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # engine core in this process
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.update(worker_env(spec))
    linked = neutral_draft_path(spec)
    if linked:
        log(
            f"draft path {spec['draft']} contains {method_from_path(spec['draft'])!r}, "
            f"which vLLM reads as a method: using the link {linked}"
        )
        spec["draft"] = linked
    from vllm import LLM

    started = time.time()
    llm = LLM(**engine_kwargs(spec))
    init_s = time.time() - started
    kv_tokens, groups = None, None
    try:
        cache = llm.llm_engine.vllm_config.cache_config
        kv_tokens = int(cache.num_gpu_blocks) * int(cache.block_size)
    except Exception:  # noqa: BLE001  (not exposed by this vLLM)
        pass
    try:  # the engine core runs in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0)
        kv_config = llm.llm_engine.engine_core.engine_core.scheduler.kv_cache_config
        groups = [
            f"{type(g.kv_cache_spec).__name__}"
            f"(sw={getattr(g.kv_cache_spec, 'sliding_window', None)}, "
            f"{len(g.layer_names)} layers)"
            for g in kv_config.kv_cache_groups
        ]
    except AttributeError:
        pass
    engine = {
        "family": spec["family"],
        "setting": spec.get("label", spec["setting"]),
        "window": spec.get("window"),
        "sliding_window": spec.get("sliding_window"),
        "init_s": init_s,
        "kv_cache_tokens": kv_tokens,
        "kv_cache_groups": groups,
        "model_runner": spec.get("model_runner") or "default",
        "draft_path": spec.get("draft"),
    }
    log(
        f"{spec['family']}/{spec['setting']}: engine up in {init_s:.0f} s "
        f"(KV cache {kv_tokens} tokens)"
    )
    return llm, engine


def warm_up(llm, spec: dict) -> None:
    """One short greedy request (not recorded) on the first prompt reversed: no measured
    request shares a cached prefix with it."""
    from vllm import SamplingParams

    llm.generate(
        [{"prompt_token_ids": spec["prompts"][str(spec["contexts"][0])][0][::-1]}],
        SamplingParams(temperature=0, max_tokens=8, ignore_eos=True, detokenize=False),
        use_tqdm=False,
    )


def cell_plan(spec: dict) -> list[tuple[float, int, int, int]]:
    """The cells of an engine, in the order they run: ``(temperature, batch, context,
    repeat)``, temperature-major, then batch, then repeat, then context (a sweep cut
    short keeps every context at the same number of repeats)."""
    return [
        (float(temperature), batch, context, repeat)
        for temperature in spec["temperatures"]
        for batch in spec["batches"]
        for repeat in range(spec["repeats"])
        for context in batch_contexts(spec, batch)
    ]


def run_cell(llm, spec: dict, temperature: float, batch: int, context: int, repeat: int):
    """One timed cell: ``generate`` on ``batch`` requests of ``context`` prompt tokens.
    Batch 1: repeat r runs prompt r; batch B: prompts 0..B-1 (seeded per request when
    sampling). Returns the cell's record; raises what ``generate`` raised."""
    from vllm import SamplingParams

    pool = spec["prompts"][str(context)]
    k = spec["num_speculative_tokens"]
    if batch == 1:
        ids, first = [pool[repeat % len(pool)]], repeat % len(pool)
    else:
        ids, first = [pool[i % len(pool)] for i in range(batch)], 0
    params = [
        SamplingParams(
            temperature=temperature,
            max_tokens=spec["new_tokens"],
            ignore_eos=True,
            detokenize=False,
            seed=(1000 * repeat + first + i) if temperature else None,
        )
        for i in range(len(ids))
    ]
    before = snapshot(llm.get_metrics())
    t0 = time.perf_counter()
    outputs = llm.generate([{"prompt_token_ids": p} for p in ids], params, use_tqdm=False)
    wall = time.perf_counter() - t0
    d = delta(before, snapshot(llm.get_metrics()))
    tokens = [list(o.outputs[0].token_ids) for o in outputs]
    n_out = sum(len(t) for t in tokens)
    stats = cell_stats(d, k)
    cell = {
        "family": spec["family"],
        "setting": spec.get("label", spec["setting"]),
        "window": spec.get("window"),
        "context": context,
        "batch": batch,
        "temperature": temperature,
        "repeat": repeat,
        "model_runner": spec.get("model_runner") or "default",
        "wall_s": wall,
        "output_tokens": n_out,
        "tokens_per_s": n_out / wall,
        **stats,
        "decode_tokens_per_s": (
            (spec["new_tokens"] - 1) / stats["decode_s"] if stats["decode_s"] else None
        ),
    }
    # tokens for the losslessness check: greedy, batch 1 every repeat (different
    # prompts), batch B the first repeat
    if temperature == 0 and (batch == 1 or repeat == 0):
        cell["tokens"] = tokens
    log(
        f"{spec['family']}/{spec['setting']} T={temperature} B={batch} ctx={context} "
        f"r{repeat}: {cell['tokens_per_s']:.0f} tok/s, "
        f"acceptance length {_fmt(stats['acceptance_length'])}"
    )
    return cell


def run_worker(spec_path: Path, out_path: Path) -> None:
    """One engine, its cells one after another (``cell_plan``), within its time share."""
    spec = json.loads(spec_path.read_text())
    llm, engine = start_engine(spec)

    def write(cells, done):
        engine["peak_memory_bytes"] = _peak_memory()
        engine["cells"] = len(cells)
        engine["complete"] = done
        out_path.write_text(json.dumps({"engine": engine, "cells": cells}))

    cells: list[dict] = []
    write(cells, False)
    # the engine's share of cell time counts from here, not from its launch
    cells_until = time.time() + spec["cell_seconds"]
    warm_up(llm, spec)
    failed = set()  # (temperature, batch, context): a failed cell skips its repeats
    for temperature, batch, context, repeat in cell_plan(spec):
        if (temperature, batch, context) in failed:
            continue
        if stop_cells(time.time(), cells_until, spec["hard_deadline"], len(cells)):
            log("time share used: stopping this engine")
            write(cells, False)
            return
        try:
            cells.append(run_cell(llm, spec, temperature, batch, context, repeat))
        except Exception as error:  # noqa: BLE001  (recorded; next cell)
            engine.setdefault("errors", []).append(
                f"T={temperature} B={batch} ctx={context}: {error!r}"
            )
            log(f"cell failed: {engine['errors'][-1]}")
            failed.add((temperature, batch, context))
        write(cells, False)
    write(cells, True)


def serve_worker(spec_path: Path, out_path: Path) -> None:
    """One engine serving cells on request (the side-by-side schedule): one JSON line
    per message on the original stdout (``{"ready": engine}`` once up and warm, then
    ``{"cell": ...}`` or ``{"error": ...}`` per request, ``{"done": engine}`` at the
    end); requests are JSON lines on stdin (``{"cell": [T, batch, context, repeat]}``
    or ``{"quit": true}``). vLLM's own output goes to stderr (the engine's log)."""
    reply = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    spec = json.loads(spec_path.read_text())
    llm, engine = start_engine(spec)
    warm_up(llm, spec)
    reply.write(json.dumps({"ready": engine}) + "\n")
    for line in sys.stdin:
        request = json.loads(line)
        if request.get("quit"):
            break
        temperature, batch, context, repeat = request["cell"]
        try:
            message = {"cell": run_cell(llm, spec, temperature, batch, context, repeat)}
        except Exception as error:  # noqa: BLE001  (reported; the orchestrator goes on)
            message = {"error": f"T={temperature} B={batch} ctx={context}: {error!r}"}
        reply.write(json.dumps(message) + "\n")
    engine["peak_memory_bytes"] = _peak_memory()
    reply.write(json.dumps({"done": engine}) + "\n")
    out_path.write_text(json.dumps(engine))


def _peak_memory() -> Optional[int]:
    try:
        import torch

        if torch.cuda.is_available():
            return int(torch.cuda.max_memory_reserved())
    except Exception:  # noqa: BLE001
        pass
    return None


# ---------------------------------------------------------------- our own loop (item 5)
def run_our_loop(spec_path: Path, out_path: Path) -> None:
    """Greedy tau of ``dspark_research.speculative``'s loop on the exported weights: KV
    block size ``spec["block_size"]`` (default 1) and future offset K, so with block 1
    each windowed draft query reads exactly the W - K keys vLLM's route gives it."""
    import torch

    from dspark_research.speculative import eagle3, hf_export
    from dspark_research.speculative.loop import SpeculativeDecoder, compile_draft

    spec = json.loads(spec_path.read_text())
    device = torch.device(spec["device"])
    pair = Path(spec["pair"])
    target = hf_export.load_llama(pair / "target").to(device)
    drafts = {
        "draft_model": lambda: hf_export.load_llama(pair / "draft").to(device),
        "eagle": lambda: hf_export.load_eagle(pair / "eagle", target.cpu()).to(device),
        "eagle3": lambda: eagle3.load_eagle3(pair / "eagle3", target.cpu()).to(device),
    }
    target = target.to(device)
    rows = []
    k = spec["num_speculative_tokens"]
    lowering = "inductor" if device.type == "cuda" else "aot_eager"
    for family in spec["families"]:
        draft = drafts[family]()
        for setting, window in spec["settings"]:
            if time.time() > spec["deadline"]:
                break
            torch._dynamo.reset()
            # future offset K: each draft query keeps W - K keys, as vLLM's route does
            fn = compile_draft(draft, window, None, lowering, {"future_offset": k})
            decoder = SpeculativeDecoder(
                target,
                draft,
                num_speculative_tokens=k,
                draft_fn=fn,
                block_size=spec.get("block_size", 1),
                max_len=spec["max_len"],
            )
            for context in spec["contexts"]:
                if time.time() > spec["deadline"]:
                    break
                accepted = []
                for p in spec["prompts"][str(context)][: spec["repeats"]]:
                    r = decoder.generate(torch.tensor(p, device=device), spec["new_tokens"])
                    accepted += r.accepted
                tau = 1.0 + sum(accepted) / max(len(accepted), 1)
                rows.append(
                    {
                        "family": family,
                        "setting": setting,
                        "window": window,
                        "context": context,
                        "tau": tau,
                        "rounds": len(accepted),
                        "acceptance_per_pos": [
                            sum(a >= j for a in accepted) / max(len(accepted), 1)
                            for j in range(1, k + 1)
                        ],
                    }
                )
                log(f"our loop {family}/{setting} ctx={context}: tau {tau:.2f}")
                out_path.write_text(json.dumps(rows))
    out_path.write_text(json.dumps(rows))


# ---------------------------------------------------------------- orchestrator
def _versions_commit() -> tuple[dict, str]:
    sys.path.insert(0, str(HERE))
    from train_engine_pair import git_commit, versions

    return versions(), git_commit()


def _device() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
        )
        if out.returncode == 0 and out.stdout.strip():
            return out.stdout.strip().splitlines()[0]
    except (OSError, subprocess.SubprocessError):
        pass
    return f"cpu ({platform.machine()}, {os.cpu_count()} cores)"


def _child(
    mode: str,
    spec: dict,
    workdir: Path,
    name: str,
    timeout: float,
    script: Optional[Path] = None,
) -> Optional[dict | list]:
    """Run ``script`` (default: this file) as ``script mode spec.json out.json`` in its own
    process group, its output in ``workdir/name.log``; stop it after ``timeout`` s. Returns
    the JSON it wrote, or None (its log's tail printed when it failed)."""
    spec_path, out_path = workdir / f"{name}.spec.json", workdir / f"{name}.out.json"
    spec_path.write_text(json.dumps(spec))
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p),
        **worker_env(spec),
    )
    log_path = workdir / f"{name}.log"
    t0 = time.time()
    with open(log_path, "w") as f:
        proc = subprocess.Popen(
            [
                sys.executable,
                str(Path(script or __file__).resolve()),
                mode,
                str(spec_path),
                str(out_path),
            ],
            stdout=f,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            rc = proc.wait(timeout=max(timeout, 1))
        except subprocess.TimeoutExpired:
            log(f"{name}: past its time limit, stopping it")
            os.killpg(proc.pid, 15)
            try:
                rc = proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, 9)
                rc = proc.wait()
    log(f"{name}: exit {rc} after {time.time() - t0:.0f} s (log {log_path})")
    if rc != 0:
        tail = log_path.read_text()[-3000:]
        print(tail, flush=True)
    if out_path.exists():
        try:
            return json.loads(out_path.read_text())
        except json.JSONDecodeError:
            return None
    return None


def _number(kind, low: float, high: Optional[float] = None, low_open: bool = True):
    """An argparse type: ``kind(text)`` within (low, high] (``[low, ...`` if not low_open)."""
    what = f"{'an' if kind is int else 'a'} {kind.__name__}"
    allowed = f"{what} {'>' if low_open else '>='} {low:g}" + (
        f" and <= {high:g}" if high is not None else ""
    )

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None
        out_of_range = (value <= low if low_open else value < low) or (
            high is not None and value > high
        )
        if out_of_range or not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r}: expected {allowed}")
        return value

    parse.__name__ = kind.__name__
    return parse


def _number_list(item):
    """An argparse type: comma-separated ``item``s, at least one."""

    def parse(text: str) -> list:
        values = [item(t) for t in text.split(",") if t.strip()]
        if not values:
            raise argparse.ArgumentTypeError(f"{text!r}: expected a comma-separated list")
        return values

    parse.__name__ = "list"
    return parse


POSITIVE_INT = _number(int, 0)
POSITIVE_FLOAT = _number(float, 0.0)
POSITIVE_INTS = _number_list(POSITIVE_INT)
TEMPERATURES = _number_list(_number(float, 0.0, low_open=False))
MEMORY_FRACTION = _number(float, 0.0, 1.0)


def build_parser() -> argparse.ArgumentParser:
    """The command line (every numeric option checked by its type)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pair", type=Path, help="directory written by train_engine_pair.py")
    parser.add_argument("--out", type=Path, help="result JSON (markdown/PNG beside it)")
    parser.add_argument("--families", default="draft_model,eagle,eagle3")
    parser.add_argument(
        "--settings",
        default=",".join(DEFAULT_SETTINGS),
        help=f"comma-separated, of {', '.join(SETTINGS)} (default: %(default)s); "
        "the -fullkv settings run the window with the draft's full KV cache "
        "(additional_config draft_window_kv_memory=False)",
    )
    parser.add_argument(
        "--contexts", type=POSITIVE_INTS, default=None, help="default: the pair's contexts"
    )
    parser.add_argument("--batches", type=POSITIVE_INTS, default=[1, 32])
    parser.add_argument(
        "--batched-contexts",
        type=POSITIVE_INTS,
        default=None,
        help="contexts of the batch > 1 cells (a subset of --contexts; default: all)",
    )
    parser.add_argument("--temperatures", type=TEMPERATURES, default=[0.0, 1.0])
    parser.add_argument("--repeats", type=POSITIVE_INT, default=3)
    parser.add_argument("--new-tokens", type=POSITIVE_INT, default=128)
    parser.add_argument("--num-speculative-tokens", type=POSITIVE_INT, default=5)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--block-size", type=POSITIVE_INT, default=None)
    parser.add_argument(
        "--max-model-len", type=POSITIVE_INT, default=None, help="default: the pair's max_model_len"
    )
    parser.add_argument(
        "--gpu-memory-utilization",
        type=MEMORY_FRACTION,
        default=None,
        help=f"per engine (default 0.9; with --side-by-side {SIDE_BY_SIDE_MEMORY} / engines)",
    )
    parser.add_argument(
        "--kv-cache-gib",
        type=POSITIVE_FLOAT,
        default=None,
        help="each engine's KV cache size (vLLM's kv_cache_memory_bytes; GPU): the same "
        "capacity in every engine however many share the GPU",
    )
    parser.add_argument(
        "--side-by-side",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="start every engine at once and run each cell on all of them in turn "
        "(benchmarks/engine_schedule.py); --no-side-by-side (the default): one engine "
        "after another, each alone on the device",
    )
    parser.add_argument(
        "--max-start-seconds",
        type=POSITIVE_FLOAT,
        default=360.0,
        help="with --side-by-side: engines not up by then are stopped",
    )
    parser.add_argument(
        "--draft-attention-backend",
        default=None,
        help="speculative_config['attention_backend'] (e.g. FLASH_ATTN)",
    )
    parser.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="reuse the nospec cells of an earlier result JSON",
    )
    parser.add_argument("--max-seconds", type=POSITIVE_FLOAT, default=560.0)
    parser.add_argument(
        "--replicas",
        type=POSITIVE_INT,
        default=1,
        help="engine processes per setting (default 1); twins tell a per-process offset "
        "from the setting's effect. Replica r > 1 is recorded as setting SETTING#r",
    )
    parser.add_argument(
        "--our-loop",
        action="store_true",
        help="also run dspark_research.speculative's loop (greedy, batch 1)",
    )
    parser.add_argument(
        "--our-loop-only",
        action="store_true",
        help="run no engine, only our loop (then --baseline is ignored)",
    )
    parser.add_argument("--our-loop-device", default=None)
    parser.add_argument(
        "--our-loop-block-size",
        type=POSITIVE_INT,
        default=1,
        help="our loop's KV block size (default 1: with future offset K its window reads "
        "exactly the W - K keys vLLM's route does; 16: the loop's default, up to 15 more)",
    )
    parser.add_argument("--plot-only", type=Path, default=None)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.plot_only:
        result = json.loads(args.plot_only.read_text())
        args.plot_only.with_suffix(".md").write_text(markdown(result))
        plot(result, args.plot_only.with_suffix(".png"))
        log(f"wrote {args.plot_only.with_suffix('.md')} and .png")
        return 0
    if not args.pair or not args.out:
        parser.error("--pair and --out are required (or --plot-only)")
    started = time.time()
    deadline = started + args.max_seconds
    pair = args.pair.resolve()
    report = json.loads((pair / "train_report.json").read_text())
    prompts = json.loads((pair / "prompts.json").read_text())["prompts"]
    contexts = args.contexts or [int(c) for c in sorted(prompts, key=int)]
    missing = [c for c in contexts if str(c) not in prompts]
    if missing:
        parser.error(
            f"--contexts: {missing} not in the pair's prompts.json "
            f"(it has {sorted(prompts, key=int)})"
        )
    families = [f for f in args.families.split(",") if f]
    settings = [s for s in args.settings.split(",") if s]
    for f in families:
        if f not in FAMILIES:
            parser.error(f"--families: {f!r} is not one of {FAMILIES}")
    for s in settings:
        if s not in SETTINGS:
            parser.error(f"--settings: {s!r} is not one of {SETTINGS}")
    batches = args.batches
    batched_contexts = args.batched_contexts
    if batched_contexts and not set(batched_contexts) <= set(contexts):
        parser.error(
            f"--batched-contexts: {batched_contexts} is not a subset of the contexts {contexts}"
        )
    c0 = report["draft_context"]
    windows = {s: setting_window(s, c0) for s in SETTINGS}
    native_sw = native_sliding_window(c0, args.num_speculative_tokens)
    need = max(batches)
    for c in contexts:
        if len(prompts[str(c)]) < min(need, args.repeats):
            log(f"context {c}: {len(prompts[str(c)])} prompts (requests reuse them cyclically)")
    vers, commit = _versions_commit()
    result = {
        "meta": {
            "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": _device(),
            "versions": vers,
            "git_commit": commit,
            "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
            "pair": str(args.pair),
            "pair_git_commit": report.get("git_commit"),
            "draft_context": c0,
            "target_context": report.get("target_context"),
            "contexts": contexts,
            "batches": batches,
            "batched_contexts": batched_contexts,
            "repeats": args.repeats,
            "new_tokens": args.new_tokens,
            "num_speculative_tokens": args.num_speculative_tokens,
            "dtype": args.dtype,
            "max_model_len": args.max_model_len or report["max_model_len"],
            "windows": windows,
            "native_sliding_window": native_sw,
            "engine_config": "vllm.LLM(speculative_config=..., compilation_config="
            "{'inductor_passes': {'post_grad_custom_post_pass': "
            "'dspark_compile_vllm.draft_window_pass'},"
            " 'splitting_ops': []}, additional_config={'draft_window_size': W})",
        },
        "engines": [],
        "cells": [],
        "summary": [],
        "notes": [],
    }
    out = args.out
    out.parent.mkdir(parents=True, exist_ok=True)
    workdir = out.with_suffix(".work")
    workdir.mkdir(exist_ok=True)

    def save():
        check_lossless(result["cells"])
        result["summary"] = summarize(result["cells"])
        out.write_text(json.dumps(result, indent=1))
        out.with_suffix(".md").write_text(markdown(result))

    if args.baseline and "nospec" in settings:
        base = json.loads(args.baseline.read_text())
        result["cells"] += [c for c in base["cells"] if c["setting"] == "nospec"]
        result["engines"] += [e for e in base["engines"] if e["setting"] == "nospec"]
        result["notes"].append(f"nospec cells reused from {args.baseline}")
        settings = [s for s in settings if s != "nospec"]
    plan = engine_plan(families, settings, args.replicas)
    if args.our_loop_only:
        plan, args.our_loop = [], True
    loop_reserve = OUR_LOOP_RESERVE_S if args.our_loop else 0.0
    memory = args.gpu_memory_utilization or (
        round(SIDE_BY_SIDE_MEMORY / max(len(plan), 1), 3) if args.side_by_side else 0.9
    )
    kv_bytes = int(args.kv_cache_gib * 2**30) if args.kv_cache_gib else None
    result["meta"]["gpu_memory_utilization"] = memory
    result["meta"]["kv_cache_memory_bytes"] = kv_bytes

    def engine_spec(family: str, setting: str, label: str) -> Optional[dict]:
        """The worker spec of one engine (None: this setting does not exist for it);
        ``label``: the setting as recorded (``replica_label``)."""
        draft = pair / FAMILY_DRAFTS.get(family, ("draft", "draft_model"))[0]
        if setting == "native" and family == "eagle":
            log(NATIVE_EAGLE_NOTE)
            result["notes"].append(NATIVE_EAGLE_NOTE)
            return None
        if setting == "native":
            draft = native_draft(draft, workdir / f"{draft.name}-native", native_sw)
        return {
            "family": family,
            "setting": setting,
            "label": label,
            "window": windows[setting],
            "kv_memory": setting_kv_memory(setting),
            "sliding_window": native_sw if setting == "native" else None,
            "target": str(pair / "target"),
            "draft": str(draft),
            "method": FAMILY_DRAFTS.get(family, ("draft", "draft_model"))[1],
            "model_runner": "v1" if family in V1_RUNNER_FAMILIES else None,
            "num_speculative_tokens": args.num_speculative_tokens,
            "dtype": args.dtype,
            "block_size": args.block_size,
            "max_model_len": args.max_model_len or report["max_model_len"],
            "max_num_seqs": max(batches),
            "gpu_memory_utilization": memory,
            "kv_cache_memory_bytes": kv_bytes,
            "draft_attention_backend": args.draft_attention_backend,
            "contexts": contexts,
            "batches": batches,
            "batched_contexts": batched_contexts,
            "temperatures": args.temperatures,
            "repeats": args.repeats,
            "new_tokens": args.new_tokens,
            "prompts": {str(c): prompts[str(c)] for c in contexts},
        }

    if args.side_by_side and plan:
        specs = {}
        for family, setting, label in plan:
            spec = engine_spec(family, setting, label)
            if spec:
                specs[engine_name(family, label)] = spec
        commands = {}
        for name, spec in specs.items():
            spec_path = workdir / f"{name}.spec.json"
            spec_path.write_text(json.dumps(spec))
            commands[name] = (
                [
                    sys.executable,
                    str(Path(__file__).resolve()),
                    "--serve",
                    str(spec_path),
                    str(workdir / f"{name}.out.json"),
                ],
                dict(
                    os.environ,
                    PYTHONPATH=os.pathsep.join(
                        p for p in [str(ROOT), os.environ.get("PYTHONPATH", "")] if p
                    ),
                    **worker_env(spec),
                ),
            )
        cells = cell_plan(next(iter(specs.values()))) if specs else []
        result["meta"]["schedule"] = (
            "side by side: every engine started at once; each cell ran on every engine in "
            "turn (order rotated by one per cell) before the next cell"
        )
        log(f"side by side: starting {len(specs)} engines at once, {len(cells)} cells each")

        def progress(partial):
            result["cells"] = base_cells + partial.cells
            save()

        base_cells = list(result["cells"])
        got = run_side_by_side(
            commands,
            cells,
            workdir,
            start_deadline=min(started + args.max_start_seconds, deadline - loop_reserve),
            deadline=deadline - loop_reserve,
            reply_timeout=REPLY_TIMEOUT_S,
            log=log,
            on_progress=progress,
        )
        result["engines"] += list(got.engines.values())
        result["cells"] = base_cells + got.cells
        result["notes"] += got.notes
        counts = {}
        for c in got.cells:
            key = engine_name(c["family"], c["setting"])
            counts[key] = counts.get(key, 0) + 1
        for engine in got.engines.values():
            engine["cells"] = counts.get(engine_name(engine["family"], engine["setting"]), 0)
            engine["complete"] = engine["cells"] == len(cells)
        save()
        plan = []
    for index, (family, setting, label) in enumerate(plan):
        remaining = deadline - loop_reserve - time.time()
        # every engine left gets an equal share of the time left (cells run greedy
        # batch 1 first, so a cut drops the sampled / batched cells first)
        share = remaining / (len(plan) - index)
        if share < ENGINE_START_ESTIMATE_S:
            msg = f"not run (time): {family}/{label}"
            log(msg)
            result["notes"].append(msg)
            continue
        spec = engine_spec(family, setting, label)
        if spec is None:
            continue
        # cell time: the share less the engine's start; the first cell runs regardless
        # of the share, within the hard limit (the child is killed at share + 30 s)
        spec["cell_seconds"] = max(share - ENGINE_START_ESTIMATE_S, 0.0)
        spec["hard_deadline"] = time.time() + share + 15
        log(
            f"engine {family}/{label} (window {windows[setting]}), {remaining:.0f} s left, "
            f"{share:.0f} s for this engine"
        )
        name = engine_name(family, label)
        got = _child("--worker", spec, workdir, name, share + 30)
        if not got:
            result["notes"].append(
                f"{family}/{label}: engine produced no result (log {workdir}/{name}.log)"
            )
        else:
            result["engines"].append(got["engine"])
            result["cells"] += got["cells"]
            if not got["engine"].get("complete"):
                result["notes"].append(
                    f"{family}/{label}: stopped early ({got['engine']['cells']} cells)"
                )
        save()
    if args.our_loop and any(f not in OUR_LOOP_FAMILIES for f in families):
        result["notes"].append(
            "our loop: not run for "
            + ", ".join(f for f in families if f not in OUR_LOOP_FAMILIES)
            + " (dspark_research.speculative's loop runs draft_model, eagle and eagle3 drafts only)"
        )
    if args.our_loop:
        remaining = deadline - time.time()
        if remaining > 30:
            loop_spec = {
                "device": args.our_loop_device or ("cuda" if "cpu" not in _device() else "cpu"),
                "pair": str(pair),
                "families": [f for f in families if f in OUR_LOOP_FAMILIES],
                "settings": [
                    (s, windows[s])
                    for s in settings
                    if s not in ("nospec", "native") and setting_kv_memory(s)
                ],
                "contexts": contexts,
                "prompts": {str(c): prompts[str(c)] for c in contexts},
                "repeats": args.repeats,
                "new_tokens": args.new_tokens,
                "num_speculative_tokens": args.num_speculative_tokens,
                "max_len": max(contexts) + args.new_tokens + 2 * args.num_speculative_tokens + 2,
                "block_size": args.our_loop_block_size,
                "deadline": deadline - 10,
            }
            result["meta"]["our_loop_window"] = {
                "block_size": args.our_loop_block_size,
                "future_offset": args.num_speculative_tokens,
            }
            rows = _child("--our-loop-worker", loop_spec, workdir, "our-loop", remaining - 5)
            result["our_loop"] = rows or []
        else:
            result["notes"].append("our loop not run (time)")
    save()
    try:
        plot(result, out.with_suffix(".png"))
    except ImportError:
        log("matplotlib missing: run --plot-only on a machine that has it")
    log(f"wrote {out} (+ .md) in {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        run_worker(Path(sys.argv[2]), Path(sys.argv[3]))
    elif len(sys.argv) == 4 and sys.argv[1] == "--serve":
        serve_worker(Path(sys.argv[2]), Path(sys.argv[3]))
    elif len(sys.argv) == 4 and sys.argv[1] == "--our-loop-worker":
        run_our_loop(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(main())
