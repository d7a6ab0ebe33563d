"""Markdown table and PNG plot of a study's results JSON (see :mod:`.study`)."""

from __future__ import annotations

import logging
from pathlib import Path

from dspark_research.speculative.checks import goal_check, sink_check

logger = logging.getLogger(__name__)


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _stderr(values: list[float]) -> float:
    """Standard error of the mean (0 for fewer than 2 values)."""
    if len(values) < 2:
        return 0.0
    mean = sum(values) / len(values)
    return (sum((v - mean) ** 2 for v in values) / (len(values) - 1) / len(values)) ** 0.5


def _tau(row) -> str:
    if row is None:
        return "-"
    taus = row.get("tau_per_prompt") or []
    if len(taus) < 2:
        return f"{row['tau']:.2f}"
    return f"{row['tau']:.2f} +- {_stderr(taus):.2f}"


def markdown(study: dict) -> str:
    """The study as markdown: setup, a tau table, a tokens/s table, the goal check."""
    meta, results = study["meta"], study["results"]
    scale = meta["scale"]
    contexts = scale["contexts"]
    settings = [s["name"] for s in study["settings"]]
    families = sorted({r["family"] for r in results}, key=["draft_model", "eagle"].index)
    cell = {(r["family"], r["setting"], r["context"]): r for r in results}
    goal = goal_check(results, tuple(contexts), scale["draft_train"]["context"])
    lines = [
        f"# Acceptance vs context: {scale['name']} scale, {meta['device']}",
        "",
        f"{meta['date_utc']}; {', '.join(f'{k} {v}' for k, v in meta['versions'].items())}; "
        f"lowering={meta['lowering']}; K={meta['num_speculative_tokens']} greedy; "
        f"draft prefill chunk={meta['draft_prefill_chunk'] or 'whole prompt'}.",
        f"Target: {scale['target']['num_layers']} layers, d={scale['target']['hidden_size']}, "
        f"trained at {scale['target_train']['context']} bytes. "
        f"draft_model: {scale['draft']['num_layers']} layers, d={scale['draft']['hidden_size']}; "
        f"eagle: 1 layer, d={scale['eagle']['hidden_size']}, fed the target's hidden states; "
        f"both trained at {scale['draft_train']['context']} bytes. "
        f"{scale['prompts']} held-out prompts x {scale['new_tokens']} new tokens per cell; "
        "context = prompt length (decoding then extends it by the new tokens).",
        "",
        "## tau (mean accepted draft tokens per round + 1; +- standard error over prompts)",
        "",
        "| family | setting | " + " | ".join(str(c) for c in contexts) + " |",
        "|---|---|" + "---:|" * len(contexts),
    ]
    for family in families:
        for name in settings:
            row = [_tau(cell.get((family, name, c))) for c in contexts]
            lines.append(f"| {family} | {name} | " + " | ".join(row) + " |")
    lines += [
        "",
        "## End-to-end tokens/s (decode, prefill excluded)",
        "",
        "| family | setting | " + " | ".join(str(c) for c in contexts) + " |",
        "|---|---|" + "---:|" * len(contexts),
    ]
    base = {b["context"]: b["target_only_tokens_per_s"] for b in study.get("baseline", [])}
    lines.append(
        "| target alone | - | " + " | ".join(_fmt(base.get(c), ".0f") for c in contexts) + " |"
    )
    for family in families:
        for name in settings:
            row = [
                _fmt(cell.get((family, name, c), {}).get("tokens_per_s"), ".0f") for c in contexts
            ]
            lines.append(f"| {family} | {name} | " + " | ".join(row) + " |")
    lines += [
        "",
        "## Draft NLL on the prompt's last positions (nats/byte)",
        "",
        "| family | setting | " + " | ".join(str(c) for c in contexts) + " |",
        "|---|---|" + "---:|" * len(contexts),
    ]
    for family in families:
        for name in settings:
            row = [
                _fmt(cell.get((family, name, c), {}).get("draft_nll_nats_per_byte"), ".2f")
                for c in contexts
            ]
            lines.append(f"| {family} | {name} | " + " | ".join(row) + " |")
    if study.get("compile"):
        lines += [
            "",
            "## Compile (first call: compile + a short run)",
            "",
            "| family | setting | seconds | graphs |",
            "|---|---|---:|---:|",
        ]
        for c in study["compile"]:
            lines.append(
                f"| {c['family']} | {c['setting']} | {c['first_run_s']:.1f} | "
                f"{c.get('graphs_after_study', c['graphs'])} |"
            )
    if goal:
        lines += [
            "",
            "## Goal: at the longest context, tau without window <= 60% and with the "
            "best window >= 95% of the short-context tau",
            "",
            "Short-context tau: shortest context with W = the draft's training context "
            "(the draft never reads more than its training length); in brackets the "
            "same context without a window.",
            "",
            "| family | tau short | tau long, no window | ratio | tau long, best window "
            "| ratio | collapse | recovery |",
            "|---|---:|---:|---:|---:|---:|---|---|",
        ]
        for family, g in goal.items():
            lines.append(
                f"| {family} | {g['tau_short']:.2f} ({g['tau_short_no_window']:.2f}) | "
                f"{g['tau_long_no_window']:.2f} | "
                f"{g['no_window_ratio']:.0%} | {g['tau_long_best_window']:.2f} "
                f"(W={g['best_window']}) | {g['best_window_ratio']:.0%} | "
                f"{'met' if g['collapse_goal_met'] else 'NOT met'} | "
                f"{'met' if g['recovery_goal_met'] else 'NOT met'} |"
            )
    sinks = sink_check(results)
    if sinks:
        lines += [
            "",
            "## Attention sinks: tau with sinks - tau with the same window alone",
            "",
            "Sinks: the first S tokens (whole KV blocks) stay visible beside the window "
            "(draft_sink_size). Positive: the sinks help acceptance.",
            "",
            "| family | setting | " + " | ".join(str(c) for c in contexts) + " |",
            "|---|---|" + "---:|" * len(contexts),
        ]
        for family, by_setting in sinks.items():
            for name, by_context in by_setting.items():
                row = [f"{by_context[c][2]:+.2f}" if c in by_context else "-" for c in contexts]
                lines.append(f"| {family} | {name} | " + " | ".join(row) + " |")
    matches = [r.get("matches_target_greedy") for r in results]
    if matches:
        lines += [
            "",
            f"Outputs equal to the target's own greedy decode: "
            f"{sum(m for m in matches if m is not None) / len(matches):.0%} of prompts "
            "(greedy speculative decoding is exact; float round-off between a K+1-token "
            "and a 1-token target forward can flip a near-tie).",
        ]
    return "\n".join(lines) + "\n"


def plot(study: dict, path: Path) -> bool:
    """tau and tokens/s vs context, one line per setting, one column per family.
    Returns False (and logs) when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        logger.warning(
            "matplotlib is not installed: %s not written "
            "(run 'python -m dspark_research study-report' where it is)",
            path,
        )
        return False
    results = study["results"]
    families = sorted({r["family"] for r in results}, key=["draft_model", "eagle"].index)
    settings = [s["name"] for s in study["settings"]]
    fig, axes = plt.subplots(2, len(families), figsize=(5.5 * len(families), 7.5), squeeze=False)
    draft_ctx = study["meta"]["scale"]["draft_train"]["context"]
    for col, family in enumerate(families):
        for name in settings:
            rows = sorted(
                (r for r in results if r["family"] == family and r["setting"] == name),
                key=lambda r: r["context"],
            )
            if not rows:
                continue
            xs = [r["context"] for r in rows]
            style = "--" if name == "no window" else "-." if "+ S=" in name else "-"
            axes[0][col].errorbar(
                xs,
                [r["tau"] for r in rows],
                yerr=[_stderr(r.get("tau_per_prompt") or []) for r in rows],
                fmt=style,
                marker="o",
                capsize=3,
                label=name,
            )
            axes[1][col].plot(xs, [r["tokens_per_s"] for r in rows], style, marker="o", label=name)
        base = sorted(study.get("baseline", []), key=lambda b: b["context"])
        if base:
            axes[1][col].plot(
                [b["context"] for b in base],
                [b["target_only_tokens_per_s"] for b in base],
                ":",
                color="gray",
                label="target alone",
            )
        axes[0][col].set_title(f"{family} (draft trained at {draft_ctx} tokens)")
        axes[0][col].set_ylabel("tau (accepted + 1), +- s.e. over prompts")
        axes[1][col].set_ylabel("tokens/s (decode)")
        for ax in (axes[0][col], axes[1][col]):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("context (tokens)")
            ax.grid(True, alpha=0.3)
            ax.legend(fontsize=8)
    meta = study["meta"]
    fig.suptitle(
        f"Speculative decoding, K={meta['num_speculative_tokens']}, {meta['device']}", fontsize=10
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def write_reports(study: dict, out_dir: Path) -> list[Path]:
    """Write ``study.md`` and (with matplotlib) ``study.png`` beside the JSON."""
    out_dir = Path(out_dir)
    written = [out_dir / "study.md"]
    written[0].write_text(markdown(study))
    if plot(study, out_dir / "study.png"):
        written.append(out_dir / "study.png")
    return written
