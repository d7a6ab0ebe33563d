"""Where a speculative step's time goes, and where greedy output leaves the target's.

``python benchmarks/diagnose_engine.py --pair DIR --out OUTDIR`` (``DIR`` from
``benchmarks/train_engine_pair.py``) starts one ``vllm.LLM`` per ``--settings`` entry
(``benchmarks/bench_engine.py``'s ``engine_kwargs``: the README's configuration; family
``--family``), each in its own subprocess, and records:

1. **A profile** of one batch-1 request of ``--profile-context`` prompt tokens and
   ``--new-tokens`` output tokens, after two warm-up requests of the same shape: the
   unprofiled wall time (mean of 3), then one run under ``torch.profiler`` (CPU and, on a
   GPU, CUDA activity): the GPU kernels by self time, the CPU ops by self time, the count
   and time of CUDA-graph launches, kernel launches and synchronizations, and the GPU busy
   time (sum of kernel times) against the wall time; then one run under ``cProfile``
   (Python functions by own time). All per output token, so settings compare directly.
2. **Greedy tokens** of ``--prompts`` prompts per context in ``--contexts`` (batch 1);
   ``nospec`` also keeps the target's top ``--logprobs`` log-probabilities at every
   position. For every request whose tokens differ from ``nospec``'s, the report gives
   the first differing position and the target's log-probability margin there
   (``nospec``'s token against the setting's token, given the same prefix) beside the
   distribution of top-1/top-2 margins over all positions: a flip at a margin far below
   the typical one is a near-tie decided by rounding, not a wrong draft being accepted.

Writes ``OUTDIR/diagnose.json`` and ``OUTDIR/diagnose.md``; per engine a log and the
profiler's tables (``OUTDIR/<setting>.profile.txt``).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time
from pathlib import Path
from typing import Optional

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from bench_engine import (  # noqa: E402
    _child,
    _device,
    engine_kwargs,
    native_draft,
    native_sliding_window,
)
from bench_engine_report import SETTINGS, setting_kv_memory, setting_window  # noqa: E402

LAUNCH_EVENTS = {
    "graph_launches": ("cudaGraphLaunch",),
    "kernel_launches": ("cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernelExC"),
    "synchronizations": ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize"),
    "memcpy": ("cudaMemcpyAsync", "cudaMemcpy"),
}


def log(msg: str) -> None:
    print(f"[diagnose_engine {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---------------------------------------------------------------- pure parts (unit-tested)
def first_difference(a: list[int], b: list[int]) -> Optional[int]:
    """The first index where ``a`` and ``b`` differ (a length difference counts at the
    shorter one's end); ``None`` when they are equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def flip_margin(logprobs: list[dict], reference: list[int], other: list[int]) -> Optional[dict]:
    """Where ``other`` first leaves ``reference`` (the target's greedy tokens, whose
    position ``p`` has ``logprobs[p]``: ``{token: logprob}`` of the target's top tokens),
    the target's margin ``logprob[reference[p]] - logprob[other[p]]`` there (``None``
    if ``other[p]`` is not among the top tokens: then ``margin_at_least`` bounds it)."""
    p = first_difference(reference, other)
    if p is None or p >= len(reference) or p >= len(other) or p >= len(logprobs):
        return None if p is None else {"position": p, "margin": None}
    top = logprobs[p]
    ref_lp = top.get(reference[p])
    other_lp = top.get(other[p])
    row = {
        "position": p,
        "reference_token": reference[p],
        "token": other[p],
        "reference_logprob": ref_lp,
        "logprob": other_lp,
        "margin": (ref_lp - other_lp) if ref_lp is not None and other_lp is not None else None,
    }
    if row["margin"] is None and ref_lp is not None and top:
        row["margin_at_least"] = ref_lp - min(top.values())
    return row


def top_margins(logprobs: list[dict]) -> list[float]:
    """Top-1 minus top-2 log-probability at every position that has two."""
    out = []
    for top in logprobs:
        values = sorted(top.values(), reverse=True)
        if len(values) >= 2:
            out.append(values[0] - values[1])
    return out


def quantiles(values: list[float], qs=(0.01, 0.1, 0.5)) -> dict:
    if not values:
        return {}
    s = sorted(values)
    return {f"p{round(q * 100)}": s[min(len(s) - 1, int(q * len(s)))] for q in qs}


def launch_counts(events) -> dict:
    """``torch.profiler`` key averages -> ``{kind: {"count", "cpu_ms"}}`` for the
    runtime calls of ``LAUNCH_EVENTS``."""
    out = {k: {"count": 0, "cpu_ms": 0.0} for k in LAUNCH_EVENTS}
    for e in events:
        for kind, names in LAUNCH_EVENTS.items():
            if e.key in names:
                out[kind]["count"] += int(e.count)
                out[kind]["cpu_ms"] += e.self_cpu_time_total / 1e3
    return out


# ---------------------------------------------------------------- engine worker
def _device_self_us(e) -> float:
    for attr in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(e, attr):
            return float(getattr(e, attr))
    return 0.0


def _is_gpu_event(e) -> bool:
    device_type = getattr(e, "device_type", None)
    return device_type is not None and "CUDA" in str(device_type)


def profile_request(llm, prompt: list[int], new_tokens: int, table_path: Path) -> dict:
    import torch
    from vllm import SamplingParams

    params = SamplingParams(temperature=0, max_tokens=new_tokens, ignore_eos=True, detokenize=False)

    def run():
        t0 = time.perf_counter()
        out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)
        return time.perf_counter() - t0, len(out[0].outputs[0].token_ids)

    for _ in range(2):
        run()
    walls = []
    for _ in range(3):
        wall, n = run()
        walls.append(wall)
    n = max(n, 1)
    activities = [torch.profiler.ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        prof_wall, _ = run()
    events = prof.key_averages()
    gpu = sorted((e for e in events if _is_gpu_event(e)), key=_device_self_us, reverse=True)
    if not gpu:  # older profilers tag kernels on CPU-side keys: take device time > 0
        gpu = sorted(
            (e for e in events if _device_self_us(e) > 0), key=_device_self_us, reverse=True
        )
    gpu_busy_ms = sum(_device_self_us(e) for e in gpu) / 1e3
    cpu = sorted(events, key=lambda e: e.self_cpu_time_total, reverse=True)
    profiler = cProfile.Profile()
    profiler.enable()
    py_wall, _ = run()
    profiler.disable()
    stream = io.StringIO()
    pstats.Stats(profiler, stream=stream).sort_stats("tottime").print_stats(30)
    row = {
        "output_tokens": n,
        "wall_s": walls,
        "ms_per_token": statistics.mean(walls) / n * 1e3,
        "profiled_ms_per_token": prof_wall / n * 1e3,
        "gpu_busy_ms_per_token": gpu_busy_ms / n,
        "launches_per_token": {
            k: {"count": v["count"] / n, "cpu_ms": v["cpu_ms"] / n}
            for k, v in launch_counts(events).items()
        },
        "top_gpu_kernels": [
            {
                "name": e.key[:120],
                "count": int(e.count),
                "ms_per_token": _device_self_us(e) / 1e3 / n,
            }
            for e in gpu[:25]
        ],
        "top_cpu_ops": [
            {
                "name": e.key[:120],
                "count": int(e.count),
                "ms_per_token": e.self_cpu_time_total / 1e3 / n,
            }
            for e in cpu[:25]
        ],
        "cprofile_ms_per_token": py_wall / n * 1e3,
    }
    sort_key = "self_cuda_time_total" if torch.cuda.is_available() else "self_cpu_time_total"
    table_path.write_text(
        f"# wall {statistics.mean(walls) * 1e3:.1f} ms for {n} tokens (unprofiled, mean of 3)\n\n"
        + prof.key_averages().table(sort_by=sort_key, row_limit=40)
        + "\n\n# cProfile (one more run), by own time\n\n"
        + stream.getvalue()
    )
    return row


def run_worker(spec_path: Path, out_path: Path) -> None:
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    spec = json.loads(spec_path.read_text())
    from vllm import LLM, SamplingParams

    t0 = time.time()
    llm = LLM(**engine_kwargs(spec))
    result: dict = {"setting": spec["setting"], "init_s": time.time() - t0}
    log(f"{spec['setting']}: engine up in {result['init_s']:.0f} s")
    prompts = spec["prompts"]
    # greedy tokens first (cheap, and what the margins need), then the profile
    logprobs_k = spec["logprobs"] if spec["setting"] == "nospec" else None
    result["greedy"] = {}
    for context in spec["contexts"]:
        rows = []
        for prompt in prompts[str(context)][: spec["num_prompts"]]:
            params = SamplingParams(
                temperature=0,
                max_tokens=spec["new_tokens"],
                ignore_eos=True,
                detokenize=False,
                logprobs=logprobs_k,
            )
            out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0].outputs[0]
            row = {"tokens": list(out.token_ids)}
            if logprobs_k:
                row["logprobs"] = [
                    {int(t): float(lp.logprob) for t, lp in pos.items()} for pos in out.logprobs
                ]
            rows.append(row)
        result["greedy"][str(context)] = rows
        out_path.write_text(json.dumps(result))
    log(f"{spec['setting']}: greedy tokens recorded")
    result["profile"] = profile_request(
        llm,
        prompts[str(spec["profile_context"])][0],
        spec["new_tokens"],
        Path(spec["table_path"]),
    )
    log(
        f"{spec['setting']}: {result['profile']['ms_per_token']:.2f} ms/token, GPU busy "
        f"{result['profile']['gpu_busy_ms_per_token']:.2f} ms/token"
    )
    out_path.write_text(json.dumps(result))


# ---------------------------------------------------------------- report
def analyse(engines: dict) -> dict:
    """Per setting: the profile summary and, against ``nospec``, the flips."""
    ref = engines.get("nospec")
    out: dict = {"settings": {}}
    if ref:
        margins = [
            m for rows in ref["greedy"].values() for r in rows for m in top_margins(r["logprobs"])
        ]
        out["typical_top_margin"] = quantiles(margins)
        out["positions"] = len(margins)
    for setting, eng in engines.items():
        row: dict = {"profile": eng.get("profile")}
        if ref and setting != "nospec":
            flips, total = [], 0
            for context, rows in eng.get("greedy", {}).items():
                for i, r in enumerate(rows):
                    base = ref["greedy"].get(context, [])
                    if i >= len(base):
                        continue
                    total += 1
                    m = flip_margin(base[i]["logprobs"], base[i]["tokens"], r["tokens"])
                    if m is not None:
                        flips.append({"context": int(context), "prompt": i, **m})
            row["requests"] = total
            row["identical"] = total - len(flips)
            row["flips"] = flips
        out["settings"][setting] = row
    return out


def _f(v, d=2) -> str:
    return "-" if v is None else f"{v:.{d}f}"


def markdown(meta: dict, analysis: dict) -> str:
    lines = [
        f"# Engine diagnosis: {meta['device']}, {meta['date_utc']}",
        "",
        f"git {meta['git_commit']}; {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}.",
        f"Family {meta['family']}, K={meta['num_speculative_tokens']}, dtype {meta['dtype']}; "
        f"profile: one batch-1 request of {meta['profile_context']} prompt tokens, "
        f"{meta['new_tokens']} new tokens.",
        "",
        "## Profile (per output token)",
        "",
        "| setting | wall ms | GPU busy ms | graph launches | kernel launches | syncs "
        "| launch+sync CPU ms |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for s, row in analysis["settings"].items():
        p = row.get("profile")
        if not p:
            continue
        lp = p["launches_per_token"]
        cpu_ms = sum(v["cpu_ms"] for v in lp.values())
        lines.append(
            f"| {s} | {_f(p['ms_per_token'])} | {_f(p['gpu_busy_ms_per_token'])} "
            f"| {_f(lp['graph_launches']['count'], 1)} | {_f(lp['kernel_launches']['count'], 1)} "
            f"| {_f(lp['synchronizations']['count'], 1)} | {_f(cpu_ms)} |"
        )
    for s, row in analysis["settings"].items():
        p = row.get("profile")
        if not p:
            continue
        lines += ["", f"### {s}: top GPU kernels (ms per output token)", ""]
        lines += [
            f"- {_f(k['ms_per_token'], 3)} ({k['count']}x) `{k['name']}`"
            for k in p["top_gpu_kernels"][:12]
        ]
        lines += ["", f"### {s}: top CPU ops (self ms per output token)", ""]
        lines += [
            f"- {_f(k['ms_per_token'], 3)} ({k['count']}x) `{k['name']}`"
            for k in p["top_cpu_ops"][:12]
        ]
    if "typical_top_margin" in analysis:
        tm = analysis["typical_top_margin"]
        lines += [
            "",
            "## Greedy output against the target's own",
            "",
            f"The target's top-1 minus top-2 log-probability over {analysis['positions']} "
            f"positions: p1 {_f(tm.get('p1'), 4)}, p10 {_f(tm.get('p10'), 4)}, "
            f"median {_f(tm.get('p50'), 3)} nats.",
            "",
            "| setting | identical | first differing position: margin (nats) |",
            "|---|---:|---|",
        ]
        for s, row in analysis["settings"].items():
            if "flips" not in row:
                continue
            flips = ", ".join(
                f"ctx {f['context']} #{f['prompt']} @{f['position']}: "
                + (
                    _f(f.get("margin"), 4)
                    if f.get("margin") is not None
                    else f">= {_f(f.get('margin_at_least'), 3)} (not in top-k)"
                )
                for f in row["flips"]
            )
            lines.append(f"| {s} | {row['identical']}/{row['requests']} | {flips or '-'} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pair", type=Path, required=True)
    parser.add_argument("--out", type=Path, required=True, help="output directory")
    parser.add_argument("--family", default="draft_model", choices=("draft_model", "eagle"))
    parser.add_argument("--settings", default="nospec,off,w1x")
    parser.add_argument("--contexts", default=None, help="greedy contexts (default: the pair's)")
    parser.add_argument("--prompts", type=int, default=3, help="prompts per context")
    parser.add_argument("--profile-context", type=int, default=None, help="default: the smallest")
    parser.add_argument("--new-tokens", type=int, default=128)
    parser.add_argument("--logprobs", type=int, default=5)
    parser.add_argument("--num-speculative-tokens", type=int, default=5)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--block-size", type=int, default=None)
    parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
    parser.add_argument("--max-seconds", type=float, default=560.0)
    args = parser.parse_args(argv)
    settings = [s for s in args.settings.split(",") if s]
    for s in settings:
        if s not in SETTINGS:
            parser.error(f"--settings: {s!r} is not one of {SETTINGS}")
    for name in ("prompts", "new_tokens", "logprobs", "num_speculative_tokens"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}={getattr(args, name)}: must be >= 1")
    pair = args.pair.resolve()
    report = json.loads((pair / "train_report.json").read_text())
    prompts = json.loads((pair / "prompts.json").read_text())["prompts"]
    contexts = (
        [int(c) for c in args.contexts.split(",")]
        if args.contexts
        else sorted(int(c) for c in prompts)
    )
    profile_context = args.profile_context or min(contexts)
    for c in {*contexts, profile_context}:
        if str(c) not in prompts:
            parser.error(f"context {c}: the pair has prompts for {sorted(prompts, key=int)} only")
    c0 = report["draft_context"]
    windows = {s: setting_window(s, c0) for s in SETTINGS}
    native_sw = native_sliding_window(c0, args.num_speculative_tokens)
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    from train_engine_pair import git_commit, versions

    meta = {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "device": _device(),
        "versions": versions(),
        "git_commit": git_commit(),
        "command": " ".join([os.path.basename(sys.executable), *sys.argv]),
        "family": args.family,
        "draft_context": c0,
        "num_speculative_tokens": args.num_speculative_tokens,
        "dtype": args.dtype,
        "profile_context": profile_context,
        "new_tokens": args.new_tokens,
        "contexts": contexts,
        "windows": {s: windows[s] for s in settings},
    }
    deadline = time.time() + args.max_seconds
    engines: dict = {}
    for index, setting in enumerate(settings):
        share = (deadline - time.time()) / (len(settings) - index)
        draft = pair / ("eagle" if args.family == "eagle" else "draft")
        if setting == "native":
            draft = native_draft(draft, out / f"{draft.name}-native", native_sw)
        spec = {
            "family": args.family,
            "setting": setting,
            "window": windows[setting],
            "kv_memory": setting_kv_memory(setting),
            "target": str(pair / "target"),
            "draft": str(draft),
            "method": "eagle" if args.family == "eagle" else "draft_model",
            "num_speculative_tokens": args.num_speculative_tokens,
            "dtype": args.dtype,
            "block_size": args.block_size,
            "max_model_len": report["max_model_len"],
            "max_num_seqs": 8,
            "gpu_memory_utilization": args.gpu_memory_utilization,
            "contexts": contexts,
            "num_prompts": args.prompts,
            "profile_context": profile_context,
            "new_tokens": args.new_tokens,
            "logprobs": args.logprobs,
            "prompts": {str(c): prompts[str(c)] for c in {*contexts, profile_context}},
            "table_path": str(out / f"{setting}.profile.txt"),
        }
        log(f"engine {setting} (window {windows[setting]}), {share:.0f} s")
        got = _child("--worker", spec, out, setting, share, script=Path(__file__))
        if got:
            engines[setting] = got
        analysis = analyse(engines)
        (out / "diagnose.json").write_text(
            json.dumps({"meta": meta, "engines": engines, "analysis": analysis})
        )
        (out / "diagnose.md").write_text(markdown(meta, analysis))
    log(f"wrote {out}/diagnose.json and diagnose.md")
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--worker":
        run_worker(Path(sys.argv[2]), Path(sys.argv[3]))
    else:
        sys.exit(main())
