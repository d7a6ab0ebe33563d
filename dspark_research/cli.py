"""``python -m dspark_research``: the research commands, run from a source checkout.

``demo`` is ``dspark-compile demo`` followed by its acceptance part (tau with and without
the window on the committed trained pair, :mod:`dspark_research.pair_demo`); ``study``
and ``study-report`` run and report the acceptance study (:mod:`dspark_research.speculative`);
``bench`` runs ``benchmarks/bench_draft_window.py``. Exit statuses as ``dspark-compile``'s:
2 for bad input (one message), 1 for a failed check.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path
from typing import Optional, Sequence

from dspark_compile.tools import cli as library_cli
from dspark_compile.tools.cli import (
    TextProgress,
    UsageError,
    positive_int,
    print_demo_table,
)

PROG = "python -m dspark_research"
CHECKOUT = Path(__file__).resolve().parents[1]
BENCH_SCRIPT = CHECKOUT / "benchmarks" / "bench_draft_window.py"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="dspark-compile's research commands (source checkout): the demo with "
        "its acceptance part, the acceptance study, the GPU benchmark.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    demo = library_cli.add_demo_parser(commands)
    demo.description += (
        " Then decode the trained pair with the speculative loop, without and with the "
        "window, and print the mean acceptance length both ways."
    )
    demo.add_argument(
        "--pair-dir",
        type=Path,
        default=None,
        help="trained draft/target pair whose acceptance the demo measures after the "
        "compile table (default: the committed tiny pair, tests_engine/data/trained_pair)",
    )
    demo.add_argument(
        "--skip-pair",
        action="store_true",
        help="skip the acceptance part (tau with and without the window on the trained pair)",
    )
    _add_study_parsers(commands)
    commands.add_parser(
        "bench",
        help="run benchmarks/bench_draft_window.py (needs a CUDA GPU)",
        description="Run benchmarks/bench_draft_window.py from the source checkout; arguments "
        "after 'bench' (or after '--') go to the script. Needs a CUDA device.",
    )
    return parser


def run_demo_command(args: argparse.Namespace) -> int:
    """``dspark-compile demo``, then (DFlash draft, no ``--skip-pair``) the acceptance part."""
    status = library_cli.run_demo_command(args)
    if args.draft == "dspark" or args.skip_pair:
        return status
    print()
    return max(status, run_pair_demo_command(args.pair_dir))


def _add_study_parsers(commands) -> None:
    from dspark_research.speculative.checks import FAMILIES
    from dspark_research.speculative.scales import SCALES

    study = commands.add_parser(
        "study",
        help="acceptance (tau) and tokens/s vs context, with and without the window",
        description="Train a byte-level target and two drafts (token-only draft_model; "
        "EAGLE-style, fed the target's hidden states) on the Python standard library's source, "
        "or load them from --checkpoint, then run greedy speculative decoding on held-out "
        "prompts at contexts from the drafts' training length to 16x it, without a window, "
        "with windows of 1x, 2x, 4x that length, and with the 1x window plus attention sinks "
        "of 1 and 4 KV blocks. Writes study.json (after every cell), "
        "study.md and study.png to OUT_DIR.",
    )
    study.add_argument(
        "--scale",
        choices=sorted(SCALES),
        default="quick",
        help="h200: a few GPU minutes; quick: the CPU scale (8 min on 2 idle "
        "cores, measured 2026-11-30); smoke: toy sizes, for tests (default: quick)",
    )
    study.add_argument("--out-dir", default="dspark_study", help="default: ./dspark_study")
    study.add_argument(
        "--device", default=None, help="torch device (default: cuda if available, else cpu)"
    )
    study.add_argument(
        "--lowering",
        choices=["inductor", "aot_eager"],
        default=None,
        help="draft compile lowering (default: inductor on CUDA, aot_eager on CPU)",
    )
    study.add_argument(
        "--checkpoint",
        default=None,
        help="load the trained models from this file if it holds this scale; "
        "else train and save them there",
    )
    study.add_argument(
        "--draft-prefill-chunk",
        type=positive_int,
        default=None,
        help="tokens per draft prefill forward (default: the whole prompt)",
    )
    study.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    study.add_argument(
        "--train-time-budget",
        type=float,
        default=None,
        help="stop each model's training after this many seconds (recorded)",
    )
    keys = [s.key for s in SCALES["quick"].settings()]
    study.add_argument(
        "--settings",
        nargs="+",
        default=None,
        metavar="KEY",
        help="run only these settings: none (no window), w<m>x (window of m "
        "times the drafts' training context), w1x+s<n>b (that 1x window with "
        f"attention sinks of n KV blocks); at the quick scale: {' '.join(keys)} "
        "(default: all)",
    )

    report = commands.add_parser(
        "study-report",
        help="study.md and study.png from a study.json",
        description="Rewrite study.md and study.png from STUDY_JSON (e.g. a JSON made on a "
        "machine without matplotlib), next to it or in --out-dir; recomputes the JSON's derived "
        "'goal' entry from its results.",
    )
    report.add_argument("study_json")
    report.add_argument("--out-dir", default=None)


def run_study_command(args: argparse.Namespace) -> int:
    import logging

    import torch

    from dspark_research.speculative.scales import SCALES
    from dspark_research.speculative.study import run_study

    device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if torch.device(device).type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device={device!r} is invalid: no CUDA device is available")
    settings = tuple(args.settings) if args.settings else None
    if settings:
        try:
            SCALES[args.scale].select_settings(settings)
        except ValueError as error:
            raise UsageError(f"--settings: {error}") from None
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s: %(message)s")
    bars: dict = {}

    def progress(phase, done, total, note):
        bar = bars.setdefault(phase, TextProgress(total, phase))
        bar.show(done, note)
        if done >= total:
            bar.clear()

    study = run_study(
        SCALES[args.scale],
        Path(args.out_dir),
        device=device,
        lowering=args.lowering,
        checkpoint=Path(args.checkpoint) if args.checkpoint else None,
        draft_prefill_chunk=args.draft_prefill_chunk,
        families=tuple(args.families),
        progress=progress,
        train_time_budget_s=args.train_time_budget,
        setting_keys=settings,
    )
    print((Path(args.out_dir) / "study.md").read_text())
    print(
        f"wrote {args.out_dir}/study.json, study.md"
        + (", study.png" if (Path(args.out_dir) / "study.png").is_file() else "")
    )
    return 0 if study["results"] else 1


def run_study_report_command(args: argparse.Namespace) -> int:
    import json

    from dspark_research.speculative.report import write_reports

    path = Path(args.study_json)
    if not path.is_file():
        raise UsageError(f"study_json={str(path)!r} is invalid: no such file")
    from dspark_research.speculative.checks import goal_check

    out_dir = Path(args.out_dir) if args.out_dir else path.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    study = json.loads(path.read_text())
    scale = study["meta"]["scale"]
    goal = goal_check(study["results"], tuple(scale["contexts"]), scale["draft_train"]["context"])
    if study.get("goal") != goal:
        study["goal"] = goal
        path.write_text(json.dumps(study, indent=1))
        print(f"updated the derived 'goal' entry of {path}")
    for written in write_reports(study, out_dir):
        print(f"wrote {written}")
    return 0


def run_pair_demo_command(pair_dir: Optional[Path], lowering: str = "aot_eager") -> int:
    """The demo's acceptance part (``dspark_research/pair_demo.py``); skipped with a note
    when the default pair (``tests_engine/data/trained_pair``) is absent. ``aot_eager``:
    the window's arithmetic is the same under every lowering, and it compiles fastest."""
    from dspark_research.pair_demo import PAIR_DIR, pair_contexts, run_pair_demo

    if pair_dir is None:
        if not (PAIR_DIR / "prompts.json").exists():
            print(f"acceptance part skipped: no trained pair at {PAIR_DIR} (use --pair-dir)")
            return 0
        pair_dir = PAIR_DIR
    elif not (pair_dir / "prompts.json").exists():
        raise UsageError(
            f"--pair-dir={str(pair_dir)!r} is invalid: expected a directory written by "
            "benchmarks/train_engine_pair.py (prompts.json, target/, draft/)"
        )
    from dspark_research.speculative.hf_export import training_context

    contexts = pair_contexts(pair_dir)
    trained = training_context(pair_dir / "draft")
    rows: list = []

    def collect():
        for row in run_pair_demo(pair_dir, contexts, lowering=lowering):
            rows.append(row)
            yield row

    status = print_demo_table(
        title=(
            f"acceptance on a trained pair ({pair_dir.name}: draft_model draft trained at "
            f"{trained} tokens), greedy, K=5, 4 held-out prompts x 32 tokens per length, "
            f"our speculative loop (dspark_research.speculative), lowering={lowering}"
        ),
        columns=[
            ("prompt tokens", 13, "{:>13}", "context"),
            ("tau, no window", 14, "{:>14.2f}", "tau_off"),
            ("tau, window W", 14, "{:>14.2f}", "tau_window"),
            ("W", 5, "{:>5}", "window"),
            ("tokens equal", 12, "{!s:>12}", "tokens_equal"),
        ],
        rows=collect(),
        contexts=contexts,
        row_ok=lambda row: row.tokens_equal,
        legend=(
            "tau: mean acceptance length, 1 + accepted draft tokens per round; tokens equal: "
            "both runs (no window, window W) generated the target's own greedy tokens"
        ),
        ok_message="OK: the window changes no token, only how many draft tokens are accepted",
        bad_message="MISMATCH: the generated tokens differ from the target's own greedy decode",
        step="decoding without and with the window",
    )
    if rows and trained:
        last = rows[-1]
        print(
            f"at {last.context} tokens ({last.context / trained:.0f}x the draft's training "
            f"context) tau is {last.tau_off:.2f} without the window and {last.tau_window:.2f} "
            f"with W={last.window}"
        )
    return status


def run_bench_command(argv: Sequence[str]) -> int:
    import torch

    if not torch.cuda.is_available():
        raise UsageError(
            "no CUDA device: the benchmarks time GPU kernels (torch.cuda.is_available() is False)"
        )
    if not BENCH_SCRIPT.is_file():
        raise UsageError(
            f"benchmark script not found at {BENCH_SCRIPT}: "
            "'bench' runs from a source checkout (git clone)"
        )
    spec = importlib.util.spec_from_file_location("bench_draft_window", BENCH_SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    result = module.main(list(argv))
    return int(result or 0)


COMMANDS = {
    "demo": run_demo_command,
    "study": run_study_command,
    "study-report": run_study_report_command,
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the research CLI; returns the exit status."""
    return library_cli.run(
        build_parser(),
        COMMANDS,
        sys.argv[1:] if argv is None else argv,
        prog=PROG,
        passthrough={"bench": run_bench_command},
    )
