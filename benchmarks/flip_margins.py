"""Where greedy speculative output left the target's own, and how close the target's call was.

``python benchmarks/flip_margins.py --pair DIR --result BENCH.json [--baseline NOSPEC.json]
--out OUT.md`` reads ``benchmarks/bench_engine.py`` results (the cells keep every request's
tokens): for every batch-1 greedy cell and every repeat, the first position where the
tokens differ from ``nospec``'s on the same prompt. For each differing request it runs the
pair's target (``DIR/target``, Hugging Face transformers, on CPU) once over the prompt plus
``nospec``'s tokens, in float32 and in bfloat16, and reports at that position the target's
log-probability margin ``logprob[nospec token] - logprob[speculative token]`` beside the
request's typical top-1/top-2 margins (the 1st / 10th / 50th percentile over its output
positions, float32). A flip whose margin is a small fraction of the typical one is a
near-tie decided by rounding (the engine's bf16 kernels at a different batch shape), not a
wrong draft token being accepted; the same flip with and without the window shows the
window is not its cause.

Writes ``OUT.md`` and ``OUT.json`` (the rows).
"""

from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from diagnose_engine import first_difference, quantiles  # noqa: E402


def greedy_batch1(cells: list[dict]) -> list[dict]:
    return [c for c in cells if c["batch"] == 1 and c["temperature"] == 0.0 and c.get("tokens")]


def differences(result: dict, baseline: dict) -> tuple[list[dict], int]:
    """``(rows, requests compared)``: one row per speculative batch-1 greedy request whose
    tokens differ from ``nospec``'s for the same context and repeat."""
    base = {
        (c["context"], c["repeat"]): c["tokens"][0]
        for c in greedy_batch1(baseline["cells"])
        if c["setting"] == "nospec"
    }
    rows, compared = [], 0
    for c in greedy_batch1(result["cells"]):
        ref = base.get((c["context"], c["repeat"]))
        if c["setting"] == "nospec" or ref is None:
            continue
        compared += 1
        p = first_difference(ref, c["tokens"][0])
        if p is not None:
            rows.append(
                {
                    "family": c["family"],
                    "setting": c["setting"],
                    "context": c["context"],
                    "repeat": c["repeat"],
                    "position": p,
                    "nospec_token": ref[p] if p < len(ref) else None,
                    "token": c["tokens"][0][p] if p < len(c["tokens"][0]) else None,
                    "reference": ref,
                    "tokens": c["tokens"][0],
                }
            )
    return rows, compared


def target_logprobs(model, prompt: list[int], output: list[int]):
    """``[len(output), vocab]`` float32 log-probabilities of ``model`` (in its own dtype)
    for each output position (teacher-forced on ``output``)."""
    import torch

    ids = torch.tensor([prompt + output])
    with torch.no_grad():
        logits = model(ids).logits[0, len(prompt) - 1 : len(prompt) + len(output) - 1]
    return torch.log_softmax(logits.float(), dim=-1)


def off_argmax(logprobs, tokens: list[int]) -> list[list]:
    """``[[position, margin], ...]`` where ``tokens`` is not the target's argmax, with the
    argmax's lead over it (nats)."""
    best = logprobs.argmax(-1).tolist()
    return [
        [i, round(float(logprobs[i, best[i]] - logprobs[i, t]), 4)]
        for i, t in enumerate(tokens[: logprobs.shape[0]])
        if best[i] != t
    ]


def margins(pair: Path, prompts: dict, rows: list[dict]) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(pair / "target", torch_dtype=torch.float32)
    model.eval()
    model_bf16 = copy.deepcopy(model).to(torch.bfloat16)
    cache: dict = {}
    out = []
    for r in rows:
        pool = prompts[str(r["context"])]
        prompt = pool[r["repeat"] % len(pool)]
        key = (r["context"], r["repeat"])
        if key not in cache:
            lp32 = target_logprobs(model, prompt, r["reference"])
            lp16 = target_logprobs(model_bf16, prompt, r["reference"])
            top2 = lp32.topk(2, dim=-1).values
            cache[key] = (lp32, lp16, quantiles((top2[:, 0] - top2[:, 1]).tolist()))
        lp32, lp16, typical = cache[key]
        p = r["position"]
        row = {k: v for k, v in r.items() if k not in ("reference", "tokens")}
        row["nospec_off_argmax_fp32"] = off_argmax(lp32, r["reference"])
        own = target_logprobs(model, prompt, r["tokens"])
        row["spec_off_argmax_fp32"] = off_argmax(own, r["tokens"])
        if r["token"] is not None and p < lp32.shape[0]:
            row["margin_fp32"] = float(lp32[p, r["nospec_token"]] - lp32[p, r["token"]])
            row["margin_bf16"] = float(lp16[p, r["nospec_token"]] - lp16[p, r["token"]])
            row["rank_fp32"] = int((lp32[p] > lp32[p, r["token"]]).sum()) + 1
        row["typical_top_margin_fp32"] = typical
        out.append(row)
    return out


def markdown(rows: list[dict], compared: int, sources: list[str]) -> str:
    lines = [
        "# Where greedy speculative output left the target's",
        "",
        f"Sources: {', '.join(sources)}. {compared} batch-1 greedy speculative requests "
        f"compared with no speculation on the same prompt; {len(rows)} differ.",
        "",
        "| family | setting | context | repeat | first differing position | nospec token | "
        "its token | rank (fp32) | margin fp32 (nats) | margin bf16 (nats) | "
        "typical top-1/top-2 margin p1 / p10 / p50 (fp32) | nospec: positions off the fp32 "
        "argmax (lead, nats) | this request: positions off the fp32 argmax |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---|",
    ]
    nan = float("nan")
    for r in rows:
        t = r.get("typical_top_margin_fp32", {})
        typical = " / ".join(f"{t[k]:.3f}" for k in ("p1", "p10", "p50") if k in t)
        lines.append(
            f"| {r['family']} | {r['setting']} | {r['context']} | {r['repeat']} | "
            f"{r['position']} | {r['nospec_token']} | {r['token']} | {r.get('rank_fp32', '-')} | "
            f"{r.get('margin_fp32', nan):.4f} | {r.get('margin_bf16', nan):.4f} | "
            f"{typical} | {_positions(r['nospec_off_argmax_fp32'])} | "
            f"{_positions(r['spec_off_argmax_fp32'])} |"
        )
    lines += [
        "",
        "Margin: the target's log-probability of nospec's token minus that of the speculative "
        "request's token, on the shared prefix (teacher-forced on nospec's tokens). Negative "
        "means the target prefers the speculative token; rank 1 means it is the target's argmax. "
        "The last two columns list every output position where that request's token is not the "
        "float32 target's argmax, with the argmax's lead.",
    ]
    return "\n".join(lines) + "\n"


def _positions(rows: list[list]) -> str:
    return ", ".join(f"{p} ({m:.3f})" for p, m in rows) or "none"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--pair", type=Path, required=True, help="the pair's directory (target, prompts.json)"
    )
    ap.add_argument(
        "--result",
        type=Path,
        required=True,
        action="append",
        help="bench_engine.py result JSON (repeatable)",
    )
    ap.add_argument(
        "--baseline",
        type=Path,
        default=None,
        help="the JSON holding the nospec cells (default: the first --result)",
    )
    ap.add_argument("--out", type=Path, required=True, help="OUT.md (OUT.json beside it)")
    args = ap.parse_args(argv)
    for path in [*args.result, args.baseline or args.result[0], args.pair / "prompts.json"]:
        if not path.is_file():
            ap.error(f"{path}: no such file")
    baseline = json.loads((args.baseline or args.result[0]).read_text())
    rows, compared = [], 0
    for path in args.result:
        r, n = differences(json.loads(path.read_text()), baseline)
        rows += r
        compared += n
    print(f"{compared} requests compared, {len(rows)} differ; scoring the flips on the target")
    prompts = json.loads((args.pair / "prompts.json").read_text())["prompts"]
    scored = margins(args.pair, prompts, rows)
    args.out.write_text(markdown(scored, compared, [p.name for p in args.result]))
    args.out.with_suffix(".json").write_text(
        json.dumps({"compared": compared, "rows": scored}, indent=1)
    )
    print(f"wrote {args.out} and {args.out.with_suffix('.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
