"""Report half of ``benchmarks/bench_engine.py``: from the cells its engine workers
record to the summary rows, tables, ratios and plot (no engine, no vLLM; unit-tested in
tests/test_engine_pair.py).

Metrics: :func:`snapshot` of ``llm.get_metrics()`` before and after a cell, their
:func:`delta`, :func:`cell_stats` (acceptance, per-position acceptance, TTFT, ITL).
Cells: :func:`check_lossless` (greedy tokens against ``nospec``'s), :func:`summarize`
(mean and std over repeats), :func:`markdown` (with :func:`ratio_lines` and
:func:`round_time_lines`) and :func:`plot`. A setting recorded as ``SETTING#r`` is the r-th
engine of SETTING (``bench_engine.py --replicas``).
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Iterable, Optional

SETTINGS = ("nospec", "off", "w1x", "w2x", "w1x-fullkv", "w2x-fullkv", "native")
#: What ``bench_engine.py`` runs unless ``--settings`` says otherwise.
DEFAULT_SETTINGS = ("nospec", "off", "w1x", "w2x", "native")
#: Settings that keep the draft's full KV cache (``additional_config
#: ["draft_window_kv_memory"] = False``): the window's attention without its KV-memory bound.
FULL_KV_SUFFIX = "-fullkv"
SPEC_PREFIX = "vllm:spec_decode"
HISTOGRAMS = {
    "ttft": "vllm:time_to_first_token_seconds",
    "itl": ("vllm:inter_token_latency_seconds", "vllm:time_per_output_token_seconds"),
    "decode": "vllm:request_decode_time_seconds",
    "e2e": "vllm:e2e_request_latency_seconds",
}


def snapshot(metrics: Iterable) -> dict:
    """vLLM ``llm.get_metrics()`` -> ``{name: int | list[int] | {"count", "sum"}}``
    (counters summed over label sets; vectors element-wise; histograms count and sum)."""
    out: dict = {}
    for m in metrics:
        name = m.name
        if hasattr(m, "values"):  # Vector
            prev = out.get(name, [0] * len(m.values))
            out[name] = [a + b for a, b in zip(prev, m.values)] if prev else list(m.values)
        elif hasattr(m, "buckets"):  # Histogram
            prev = out.get(name, {"count": 0, "sum": 0.0})
            out[name] = {"count": prev["count"] + m.count, "sum": prev["sum"] + m.sum}
        elif hasattr(m, "value"):  # Counter / Gauge
            out[name] = out.get(name, 0) + m.value
    return out


def delta(before: dict, after: dict) -> dict:
    """``after - before`` of two :func:`snapshot` dicts (names in ``after``)."""
    out: dict = {}
    for name, value in after.items():
        old = before.get(name)
        if isinstance(value, list):
            old = old or [0] * len(value)
            old = old + [0] * (len(value) - len(old))
            out[name] = [a - b for a, b in zip(value, old)]
        elif isinstance(value, dict):
            old = old or {"count": 0, "sum": 0.0}
            out[name] = {"count": value["count"] - old["count"], "sum": value["sum"] - old["sum"]}
        else:
            out[name] = value - (old or 0)
    return out


def _hist_mean(d: dict, names) -> Optional[float]:
    for name in (names,) if isinstance(names, str) else names:
        h = d.get(name)
        if h and h["count"] > 0:
            return h["sum"] / h["count"]
    return None


def cell_stats(d: dict, num_spec: int) -> dict:
    """Speculative and latency statistics of one cell from its metric :func:`delta`."""
    drafts = d.get(f"{SPEC_PREFIX}_num_drafts", 0)
    accepted = d.get(f"{SPEC_PREFIX}_num_accepted_tokens", 0)
    per_pos = d.get(f"{SPEC_PREFIX}_num_accepted_tokens_per_pos") or [0] * num_spec
    return {
        "drafts": drafts,
        "accepted": accepted,
        "draft_tokens": d.get(f"{SPEC_PREFIX}_num_draft_tokens", 0),
        "accepted_per_pos": per_pos,
        "acceptance_length": 1.0 + accepted / drafts if drafts else None,
        "acceptance_per_pos": [a / drafts for a in per_pos] if drafts else None,
        "ttft_s": _hist_mean(d, HISTOGRAMS["ttft"]),
        "itl_s": _hist_mean(d, HISTOGRAMS["itl"]),
        "decode_s": _hist_mean(d, HISTOGRAMS["decode"]),
        "e2e_s": _hist_mean(d, HISTOGRAMS["e2e"]),
    }


def _mean_std(values: list) -> tuple[Optional[float], Optional[float]]:
    values = [v for v in values if v is not None]
    if not values:
        return None, None
    return statistics.fmean(values), (statistics.stdev(values) if len(values) > 1 else 0.0)


CELL_KEYS = ("family", "setting", "context", "batch", "temperature")


def setting_window(setting: str, draft_context: int) -> Optional[int]:
    """W of a setting: ``w1x`` / ``w1x-fullkv`` the draft's training context, ``w2x`` /
    ``w2x-fullkv`` twice it, None for ``nospec``, ``off`` and ``native``."""
    if setting not in SETTINGS:
        raise ValueError(f"setting={setting!r} is not one of {SETTINGS}")
    multiple = {"w1x": 1, "w2x": 2}.get(setting.removesuffix(FULL_KV_SUFFIX))
    return None if multiple is None else multiple * draft_context


def setting_kv_memory(setting: str) -> bool:
    """Whether a windowed setting keeps the window's draft KV-memory bound (the default);
    False for the ``-fullkv`` settings."""
    return not setting.endswith(FULL_KV_SUFFIX)


def base_setting(label: str) -> str:
    """The setting of a recorded label (``off#2``, a second engine of ``off``: ``off``)."""
    return label.split("#")[0]


def setting_order(label: str) -> tuple:
    """Sort key of a recorded setting: ``SETTINGS`` order, then replica."""
    base, _, replica = label.partition("#")
    return (SETTINGS.index(base) if base in SETTINGS else len(SETTINGS), int(replica or 1))


def summarize(cells: list[dict]) -> list[dict]:
    """One row per (family, setting, context, batch, temperature): mean and std over
    repeats of tokens/s, TTFT, ITL; acceptance pooled over the repeats' drafts."""
    groups: dict = {}
    for c in cells:
        groups.setdefault(tuple(c[k] for k in CELL_KEYS), []).append(c)
    rows = []
    for key, group in groups.items():
        row = dict(zip(CELL_KEYS, key))
        row["window"] = group[0].get("window")
        row["repeats"] = len(group)
        for name in ("tokens_per_s", "decode_tokens_per_s", "ttft_s", "itl_s"):
            row[name], row[name + "_std"] = _mean_std([c.get(name) for c in group])
        drafts = sum(c.get("drafts") or 0 for c in group)
        accepted = sum(c.get("accepted") or 0 for c in group)
        row["acceptance_length"] = 1.0 + accepted / drafts if drafts else None
        row["acceptance_length_std"] = _mean_std([c.get("acceptance_length") for c in group])[1]
        if drafts:
            width = max(len(c.get("accepted_per_pos") or []) for c in group)
            pos = [
                sum((c.get("accepted_per_pos") or [0] * width)[i] for c in group)
                for i in range(width)
            ]
            row["acceptance_per_pos"] = [p / drafts for p in pos]
        else:
            row["acceptance_per_pos"] = None
        checked = [c["lossless"] for c in group if c.get("lossless") is not None]
        row["lossless"] = all(checked) if checked else None
        rows.append(row)
    rows.sort(
        key=lambda r: (
            r["family"],
            r["batch"],
            r["temperature"],
            setting_order(r["setting"]),
            r["context"],
        )
    )
    return rows


def check_lossless(cells: list[dict]) -> None:
    """Mark greedy speculative cells that kept tokens ``lossless``: their tokens equal the
    ``nospec`` cell of the same context, batch and repeat (batch 1: repeat r runs prompt r;
    batch B: only repeat 0 keeps tokens)."""
    ref = {
        (c["context"], c["batch"], c["repeat"]): c["tokens"]
        for c in cells
        if c["setting"] == "nospec" and c["temperature"] == 0 and c.get("tokens") is not None
    }
    for c in cells:
        if c["setting"] == "nospec" or c["temperature"] != 0 or c.get("tokens") is None:
            continue
        base = ref.get((c["context"], c["batch"], c["repeat"]))
        if base is None:
            continue
        same = [a == b for a, b in zip(c["tokens"], base)]
        c["lossless"] = all(same) and len(c["tokens"]) == len(base)
        c["lossless_requests"] = f"{sum(same)}/{len(base)}"


def _fmt(value, std=None, digits=2) -> str:
    if value is None:
        return "-"
    text = f"{value:.{digits}f}"
    return text + (f" +- {std:.{digits}f}" if std else "")


def ratio_lines(rows: list[dict], contexts: list[int]) -> list[str]:
    """Markdown: each setting's output tokens/s over the same draft without the window
    (``off``) and over no speculation, per family / batch / temperature and context."""
    by = {(r["family"], r["batch"], r["temperature"], r["setting"], r["context"]): r for r in rows}
    nospec = {
        (r["batch"], r["temperature"], r["context"]): r for r in rows if r["setting"] == "nospec"
    }
    lines = [
        "## Output tokens/s ratios (x: over `off`, the same draft without the window; "
        "vs nospec: over no speculation)",
        "",
        "| family | batch | T | setting | " + " | ".join(map(str, contexts)) + " |",
        "|---|---:|---:|---|" + "---:|" * len(contexts),
    ]
    keys = sorted(
        {k[:4] for k in by if k[3] not in ("nospec", "off")},
        key=lambda k: (k[0], k[1], k[2], setting_order(k[3])),
    )
    for family, batch, temperature, setting in keys:
        cells = []
        for c in contexts:
            r = by.get((family, batch, temperature, setting, c))
            off = by.get((family, batch, temperature, "off", c))
            base = nospec.get((batch, temperature, c))
            if not r or not r.get("tokens_per_s"):
                cells.append("")
                continue
            parts = []
            if off and off.get("tokens_per_s"):
                parts.append(f"{r['tokens_per_s'] / off['tokens_per_s']:.2f}x")
            if base and base.get("tokens_per_s"):
                parts.append(f"vs nospec {r['tokens_per_s'] / base['tokens_per_s']:.2f}")
            cells.append(", ".join(parts))
        lines.append(
            f"| {family} | {batch} | {temperature} | {setting} | " + " | ".join(cells) + " |"
        )
    return lines + [""]


def round_time_ratios(cells: list[dict]) -> dict:
    """``{(family, batch, T, setting, context): [ITL ratio per repeat]}``: each cell's ITL
    (one engine step: a speculative round) over the ``off`` cell of the same family, batch,
    temperature, context and repeat (the same prompt). Where acceptance is unchanged
    (e.g. W >= the context), the ratio is the setting's whole cost in tokens/s."""

    def key(c: dict) -> tuple:
        return (c["family"], c["batch"], c["temperature"], c["context"], c["repeat"])

    off = {key(c): c for c in cells if c["setting"] == "off" and c.get("itl_s")}
    out: dict = {}
    for c in cells:
        base = off.get(key(c))
        if c["setting"] in ("off", "nospec") or not base or not c.get("itl_s"):
            continue
        k = (c["family"], c["batch"], c["temperature"], c["setting"], c["context"])
        out.setdefault(k, []).append(c["itl_s"] / base["itl_s"])
    return out


def round_time_lines(cells: list[dict], contexts: list[int]) -> list[str]:
    """Markdown: ``round_time_ratios`` per setting and context, geometric mean over the
    repeats (their count in brackets)."""
    ratios = round_time_ratios(cells)
    if not ratios:
        return []
    lines = [
        "## Round time over `off` (ITL of the same prompt; geometric mean over repeats)",
        "",
        "| family | batch | T | setting | " + " | ".join(map(str, contexts)) + " |",
        "|---|---:|---:|---|" + "---:|" * len(contexts),
    ]
    keys = sorted({k[:4] for k in ratios}, key=lambda k: (k[0], k[1], k[2], setting_order(k[3])))
    for family, batch, temperature, setting in keys:
        cells_md = []
        for c in contexts:
            values = ratios.get((family, batch, temperature, setting, c))
            if values:
                geo = math.exp(sum(math.log(v) for v in values) / len(values))
                cells_md.append(f"{geo:.2f} ({len(values)})")
            else:
                cells_md.append("")
        lines.append(
            f"| {family} | {batch} | {temperature} | {setting} | " + " | ".join(cells_md) + " |"
        )
    return lines + [""]


def markdown(result: dict) -> str:
    """The result's tables: tokens/s and acceptance length per context, per family/batch/T."""
    meta = result["meta"]
    rows = result["summary"]
    contexts = sorted({r["context"] for r in rows})
    lines = [
        f"# vLLM engine benchmark of the draft window ({meta.get('device', '?')})",
        "",
        f"{meta.get('date_utc')}; git {meta.get('git_commit')}; "
        + ", ".join(f"{k} {v}" for k, v in sorted(meta.get("versions", {}).items()))
        + ".",
        f"Pair: {meta.get('pair')}; drafts trained at {meta.get('draft_context')} tokens, "
        f"target at {meta.get('target_context')}; K={meta.get('num_speculative_tokens')}, "
        f"{meta.get('new_tokens')} new tokens per request, dtype {meta.get('dtype')}, "
        f"max_model_len {meta.get('max_model_len')}; mean +- std over "
        f"{meta.get('repeats')} repeats.",
        "",
    ]
    for title, key, digits in (
        ("Output tokens/s (all requests, wall time of generate)", "tokens_per_s", 0),
        ("Mean acceptance length (1 + accepted / drafts)", "acceptance_length", 2),
        ("TTFT (s)", "ttft_s", 3),
        ("ITL (ms)", "itl_ms", 2),
    ):
        lines += [
            f"## {title}",
            "",
            "| family | batch | T | setting | " + " | ".join(map(str, contexts)) + " |",
            "|---|---:|---:|---|" + "---:|" * len(contexts),
        ]
        seen = []
        for r in rows:
            k = (r["family"], r["batch"], r["temperature"], r["setting"])
            if k not in seen:
                seen.append(k)
        for k in seen:
            cells = []
            for c in contexts:
                match = [
                    r
                    for r in rows
                    if (r["family"], r["batch"], r["temperature"], r["setting"]) == k
                    and r["context"] == c
                ]
                if not match:
                    cells.append("")
                    continue
                r = match[0]
                if key == "itl_ms":
                    v = r["itl_s"] * 1e3 if r["itl_s"] is not None else None
                    s = r["itl_s_std"] * 1e3 if r["itl_s_std"] else None
                else:
                    v, s = r.get(key), r.get(key + "_std")
                text = _fmt(v, s, digits)
                if key == "acceptance_length" and r.get("lossless") is False:
                    text += " (not lossless)"
                cells.append(text)
            lines.append(f"| {k[0]} | {k[1]} | {k[2]} | {k[3]} | " + " | ".join(cells) + " |")
        lines.append("")
    lines += ratio_lines(rows, contexts)
    lines += round_time_lines(result.get("cells", []), contexts)
    lines += [
        "## Engines",
        "",
        "| family | setting | window | start s | KV cache tokens | KV cache groups "
        "| peak GPU memory GiB | cells |",
        "|---|---|---:|---:|---:|---|---:|---:|",
    ]
    for e in result.get("engines", []):
        mem = e.get("peak_memory_bytes")
        window = e.get("window") or (
            f"sliding_window {e['sliding_window']}" if e.get("sliding_window") else "-"
        )
        lines.append(
            f"| {e['family']} | {e['setting']} | {window} | "
            f"{_fmt(e.get('init_s'), None, 0)} | {e.get('kv_cache_tokens') or '-'} | "
            f"{', '.join(e.get('kv_cache_groups') or []) or '-'} | "
            f"{_fmt(mem / 2**30 if mem else None)} | {e.get('cells', 0)} |"
        )
    loop = result.get("our_loop")
    if loop:
        lines += [
            "",
            "## Our loop vs vLLM (greedy, batch 1, same weights and prompts)",
            "",
            "| family | setting | context | tau (our loop) | acceptance length (vLLM) |",
            "|---|---|---:|---:|---:|",
        ]
        vllm_rows = {
            (r["family"], r["setting"], r["context"]): r
            for r in rows
            if r["batch"] == 1 and r["temperature"] == 0
        }
        for r in loop:
            v = vllm_rows.get((r["family"], r["setting"], r["context"]))
            lines.append(
                f"| {r['family']} | {r['setting']} | {r['context']} | "
                f"{_fmt(r['tau'])} | {_fmt(v['acceptance_length'] if v else None)} |"
            )
    if result.get("notes"):
        lines += ["", "## Notes", ""] + [f"- {n}" for n in result["notes"]]
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in result["summary"] if r["temperature"] == 0]
    if not rows:
        return
    families = sorted({r["family"] for r in rows if base_setting(r["setting"]) != "nospec"}) or [
        "draft_model"
    ]
    batches = sorted({r["batch"] for r in rows})
    fig, axes = plt.subplots(
        2,
        max(1, len(families) * len(batches)),
        squeeze=False,
        figsize=(5 * len(families) * len(batches), 8),
    )
    for col, (family, batch) in enumerate((f, b) for f in families for b in batches):
        for setting in sorted({r["setting"] for r in rows}, key=setting_order):
            sel = sorted(
                (
                    r
                    for r in rows
                    if r["batch"] == batch
                    and r["setting"] == setting
                    and (r["family"] == family or base_setting(setting) == "nospec")
                ),
                key=lambda r: r["context"],
            )
            if not sel:
                continue
            xs = [r["context"] for r in sel]
            axes[0][col].errorbar(
                xs,
                [r["tokens_per_s"] or 0 for r in sel],
                yerr=[r["tokens_per_s_std"] or 0 for r in sel],
                marker="o",
                label=setting,
                capsize=3,
            )
            if setting != "nospec":
                axes[1][col].plot(
                    xs, [r["acceptance_length"] or 0 for r in sel], marker="o", label=setting
                )
        for ax, ylabel in (
            (axes[0][col], "output tokens/s"),
            (axes[1][col], "mean acceptance length"),
        ):
            ax.set_xscale("log", base=2)
            ax.set_xlabel("context (prompt tokens)")
            ax.set_ylabel(ylabel)
            ax.set_title(f"{family}, batch {batch}, greedy")
            ax.grid(alpha=0.3)
            ax.legend()
    fig.suptitle(
        f"draft window in vLLM: {result['meta'].get('device')}, {result['meta'].get('date_utc')}"
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
