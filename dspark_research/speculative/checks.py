"""The study's verdicts, computed from its result rows (``results`` in the study JSON)."""

from __future__ import annotations

FAMILIES = ("draft_model", "eagle")


def goal_check(results: list[dict], contexts: tuple[int, ...], draft_context: int) -> dict:
    """Per family, the issue's goal: at the longest context, tau without a window
    <= 60% and with the best window >= 95% of the short-context tau.

    The short-context tau is the one with a window of exactly the draft's training
    context at the shortest context: the only cell where the draft never reads more
    than its training length (decoding extends the context past the prompt, so
    without a window the draft leaves its training length even there; that value
    is reported too, as ``tau_short_no_window``).
    """
    out = {}
    short, long = min(contexts), max(contexts)

    def find(rows, window, context):
        match = [r for r in rows if r["window"] == window and r["context"] == context]
        return match[0] if match else None

    for family in FAMILIES:
        # the window alone (rows with attention sinks are compared in sink_check)
        rows = [r for r in results if r["family"] == family and not r.get("sink_size")]
        base, none_short = find(rows, draft_context, short), find(rows, None, short)
        none_long = find(rows, None, long)
        windowed_long = [r for r in rows if r["window"] is not None and r["context"] == long]
        if not (base and none_short and none_long and windowed_long):
            continue
        best = max(windowed_long, key=lambda r: r["tau"])
        tau0 = base["tau"]
        out[family] = {
            "tau_short": tau0,
            "tau_short_no_window": none_short["tau"],
            "tau_long_no_window": none_long["tau"],
            "tau_long_best_window": best["tau"],
            "best_window": best["window"],
            "no_window_ratio": none_long["tau"] / tau0,
            "best_window_ratio": best["tau"] / tau0,
            "collapse_goal_met": none_long["tau"] / tau0 <= 0.60,
            "recovery_goal_met": best["tau"] / tau0 >= 0.95,
        }
    return out


def sink_check(results: list[dict]) -> dict:
    """Per family and sink setting: tau with sinks minus tau with the same window
    alone, per context (``{family: {setting: {context: (tau_w, tau_ws, delta)}}}``)."""
    out: dict = {}
    window_only = {
        (r["family"], r["window"], r["context"]): r["tau"]
        for r in results
        if r["window"] is not None and not r.get("sink_size")
    }
    for r in results:
        if not r.get("sink_size"):
            continue
        base = window_only.get((r["family"], r["window"], r["context"]))
        if base is None:
            continue
        out.setdefault(r["family"], {}).setdefault(r["setting"], {})[r["context"]] = (
            base,
            r["tau"],
            r["tau"] - base,
        )
    return out
