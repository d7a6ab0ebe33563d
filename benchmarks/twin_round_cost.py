"""The window's per-round cost from a twin run of ``bench_engine.py --replicas 2``.

    python benchmarks/twin_round_cost.py RUN.json[.xz] [...] [--setting w2x] [--base off]

A twin run starts two engines of each setting (``SETTING`` and ``SETTING#2``) side by
side. Per repeat (one prompt, run on every engine seconds apart), the round time of an
engine is ``decode_s / drafts`` (ms per speculative round: draft K tokens, verify). This
prints, per run and cell (family, context, batch, temperature):

- each engine's median round time and output tokens per round;
- ``base#2 / base`` and ``setting#2 / setting``: how far two processes of the SAME
  configuration differ (the per-process offset a one-engine comparison cannot separate);
- the pooled ratio ``sqrt(setting * setting#2) / sqrt(base * base#2)``, geometric mean
  over repeats, with a 95% bootstrap interval over repeats (it does not cover the
  process-to-process spread: two processes per side are too few to estimate it).

Only cells whose engines all completed every compared repeat are used.
"""

from __future__ import annotations

import argparse
import json
import lzma
import math
import random
import statistics
from pathlib import Path


def load(path: Path) -> dict:
    opener = lzma.open if path.suffix == ".xz" else open
    with opener(path, "rt") as f:
        return json.load(f)


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))


def round_ms(cell: dict) -> float:
    return cell["decode_s"] / cell["drafts"] * 1e3


def cell_groups(run: dict) -> dict[tuple, dict[tuple[str, int], dict]]:
    """(family, context, batch, temperature) -> {(setting, repeat): cell}."""
    groups: dict[tuple, dict] = {}
    for cell in run["cells"]:
        if not cell.get("drafts"):
            continue
        key = (cell["family"], cell["context"], cell["batch"], cell["temperature"])
        groups.setdefault(key, {})[(cell["setting"], cell["repeat"])] = cell
    return groups


def report(path: Path, setting: str, base: str, resamples: int) -> list[str]:
    lines = [f"{path.name}"]
    engines = (base, f"{base}#2", setting, f"{setting}#2")
    for key, cells in sorted(cell_groups(load(path)).items()):
        repeats = sorted({r for (_, r) in cells if all((e, r) in cells for e in engines)})
        if not repeats:
            continue
        family, context, batch, temperature = key
        lines.append(
            f"  {family}, context {context}, batch {batch}, T={temperature}: {len(repeats)} repeats"
        )
        t = {(e, r): round_ms(cells[(e, r)]) for e in engines for r in repeats}
        for e in engines:
            per_round = statistics.mean(
                cells[(e, r)]["output_tokens"] / cells[(e, r)]["drafts"] for r in repeats
            )
            median = statistics.median(t[(e, r)] for r in repeats)
            lines.append(
                f"    {e:10s} round {median:6.2f} ms (median), {per_round:.2f} tokens/round"
            )

        def pooled(rs: list[int]) -> float:
            return geomean(
                [
                    math.sqrt(t[(setting, r)] * t[(f"{setting}#2", r)])
                    / math.sqrt(t[(base, r)] * t[(f"{base}#2", r)])
                    for r in rs
                ]
            )

        rng = random.Random(0)
        boot = sorted(pooled([rng.choice(repeats) for _ in repeats]) for _ in range(resamples))
        lo, hi = boot[int(0.025 * resamples)], boot[int(0.975 * resamples) - 1]
        twin_base = geomean([t[(f"{base}#2", r)] / t[(base, r)] for r in repeats])
        twin_setting = geomean([t[(f"{setting}#2", r)] / t[(setting, r)] for r in repeats])
        lines.append(
            f"    twins: {base}#2/{base} {twin_base:.3f}, {setting}#2/{setting} {twin_setting:.3f}"
        )
        lines.append(
            f"    {setting} over {base}, twins pooled: {pooled(repeats):.3f} "
            f"(95% bootstrap over repeats [{lo:.3f}, {hi:.3f}])"
        )
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "runs", type=Path, nargs="+", help="bench_engine.py JSON (.json or .json.xz)"
    )
    parser.add_argument("--setting", default="w2x", help="the windowed setting (default w2x)")
    parser.add_argument("--base", default="off", help="the unwindowed setting (default off)")
    parser.add_argument("--resamples", type=int, default=4000)
    args = parser.parse_args()
    if args.resamples < 100:
        parser.error(f"--resamples: {args.resamples}: expected an int >= 100")
    for path in args.runs:
        if not path.exists():
            parser.error(f"runs: {str(path)!r} does not exist")
        print("\n".join(report(path, args.setting, args.base, args.resamples)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
