"""``dspark-compile``: the command line (demo, inspect, check-ascend, bench, study).

Every command runs on the built-in reference draft by default (CPU). Bad
input exits with status 2 and one message; a failed check exits with 1.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path
from typing import Optional, Sequence, TextIO

PROG = "dspark-compile"
BENCH_SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_draft_window.py"


class UsageError(Exception):
    """Bad input from the command line: reported as one line, exit status 2."""


class TextProgress:
    """A one-line text progress bar on ``stream`` (redrawn in place on a terminal)."""

    def __init__(
        self, total: int, label: str, stream: Optional[TextIO] = None, width: int = 20
    ) -> None:
        self.total, self.label, self.width = max(total, 1), label, width
        self.stream = stream if stream is not None else sys.stderr
        self.interactive = getattr(self.stream, "isatty", lambda: False)()
        self.start = time.perf_counter()

    def show(self, done: int, note: str = "") -> None:
        filled = self.width * done // self.total
        bar = "#" * filled + "." * (self.width - filled)
        line = (
            f"{self.label} [{bar}] {done}/{self.total} {note} "
            f"({time.perf_counter() - self.start:.0f}s)"
        )
        if self.interactive:
            self.stream.write("\r\033[K" + line)
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def clear(self) -> None:
        if self.interactive:
            self.stream.write("\r\033[K")
            self.stream.flush()


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an int") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} is invalid: expected a positive int")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="torch.compile passes for speculative-decoding draft models: "
        "draft KV sliding window (backend='dspark').",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    demo = commands.add_parser(
        "demo",
        help="window the reference DFlash draft, check it and time it",
        description="Compile the built-in 4-layer DFlash reference draft with and without the "
        "draft KV window, check both against eager references and time a draft step.",
    )
    demo.add_argument(
        "--contexts",
        type=_positive_int,
        nargs="+",
        default=[1024, 4096, 16384],
        help="context lengths to run, in tokens (default: 1024 4096 16384)",
    )
    demo.add_argument(
        "--window", type=_positive_int, default=512, help="draft_window_size W (default: 512)"
    )
    _add_sink_arg(demo)
    demo.add_argument(
        "--requests", type=_positive_int, default=4, help="requests per batch (default: 4)"
    )
    demo.add_argument("--lowering", choices=["inductor", "aot_eager"], default="inductor")
    demo.add_argument("--device", default="cpu", help="torch device (default: cpu)")
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
    demo.add_argument(
        "--draft",
        choices=["dflash", "dspark"],
        default="dflash",
        help="dspark: the sparse-MLA DSpark draft compiled with method='dspark' "
        "(non-causal block indices, Markov head) (default: dflash)",
    )

    inspect = commands.add_parser(
        "inspect",
        help="compile under depyf and write graphs, kernels and summary.md",
        description="Compile the built-in reference draft with backend='dspark' under "
        "depyf.prepare_debug and write to DUMP_DIR: depyf's decompiled code, the post-grad "
        "graph before/after each dspark pass, Inductor's output code and summary.md.",
    )
    inspect.add_argument(
        "--dump-dir",
        default="dspark_inspect",
        help="output directory, new or empty (default: ./dspark_inspect)",
    )
    inspect.add_argument(
        "--overwrite", action="store_true", help="replace an earlier dump in DUMP_DIR"
    )
    _add_window_args(inspect, default_window=64)
    inspect.add_argument("--lowering", choices=["inductor", "aot_eager"], default="inductor")
    inspect.add_argument(
        "--context",
        type=_positive_int,
        default=256,
        help="context length of the example batch (default: 256)",
    )
    inspect.add_argument(
        "--layers", type=_positive_int, default=2, help="draft layers (default: 2)"
    )

    ascend = commands.add_parser(
        "check-ascend",
        help="list ops torchair's GE graph mode cannot convert",
        description="Trace the built-in reference draft with backend='dspark' (eager lowering) "
        "and list every op of the post-pass ATen graph that torchair's GE graph mode cannot "
        "convert. Exit status 1 when there is one.",
    )
    _add_window_args(ascend, default_window=64)
    ascend.add_argument(
        "--inserted-only", action="store_true", help="check only the nodes our passes insert"
    )

    _add_study_parsers(commands)

    commands.add_parser(
        "bench",
        help="run benchmarks/bench_draft_window.py (needs a CUDA GPU)",
        description="Run benchmarks/bench_draft_window.py from a source checkout; arguments "
        "after 'bench' (or after '--') go to the script. Needs a CUDA device.",
    )
    return parser


def _add_study_parsers(commands) -> None:
    from dspark_compile.speculative.checks import FAMILIES
    from dspark_compile.speculative.scales import SCALES

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
        type=_positive_int,
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

    from dspark_compile.speculative.scales import SCALES
    from dspark_compile.speculative.study import run_study

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

    from dspark_compile.speculative.report import write_reports

    path = Path(args.study_json)
    if not path.is_file():
        raise UsageError(f"study_json={str(path)!r} is invalid: no such file")
    from dspark_compile.speculative.checks import goal_check

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


def _add_window_args(parser: argparse.ArgumentParser, default_window: int) -> None:
    from dspark_compile.config import METHODS

    parser.add_argument(
        "--window",
        type=int,
        default=default_window,
        help=f"draft_window_size W; 0 turns the window off (default: {default_window})",
    )
    parser.add_argument("--method", choices=METHODS, default="dflash")
    parser.add_argument(
        "--num-speculative-tokens",
        type=_positive_int,
        default=1,
        help="draft tokens per step (EAGLE3's future offset; default: 1)",
    )
    _add_sink_arg(parser)


def _add_sink_arg(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--draft-sink-size",
        type=int,
        default=0,
        metavar="S",
        help="draft_sink_size S: attention-sink tokens kept visible beside the "
        "window, rounded up to whole KV blocks; needs the window (default: 0)",
    )


def _check_sink_size(args: argparse.Namespace) -> int:
    if args.draft_sink_size < 0:
        raise UsageError(
            f"--draft-sink-size={args.draft_sink_size} is invalid: expected an "
            "int >= 0 (0: no attention sinks)"
        )
    if args.draft_sink_size and not args.window:
        raise UsageError(
            f"--draft-sink-size={args.draft_sink_size} is invalid with --window=0: "
            "attention sinks are kept beside the draft window"
        )
    return args.draft_sink_size


def _window_options(args: argparse.Namespace) -> dict:
    if args.window < 0:
        raise UsageError(
            f"--window={args.window} is invalid: expected a positive int, "
            "or 0 to turn the window off"
        )
    return {
        "draft_window_size": args.window or None,
        "method": args.method,
        "num_speculative_tokens": args.num_speculative_tokens,
        "draft_sink_size": _check_sink_size(args),
    }


def run_demo_command(args: argparse.Namespace) -> int:
    import torch

    from dspark_compile.tools.demo import run_demo

    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise UsageError(
            f"--device={args.device!r} is invalid: expected a torch device such as cpu or cuda"
        ) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device={args.device!r} is invalid: no CUDA device is available")
    sink_size = _check_sink_size(args)
    if args.draft == "dspark":
        if sink_size:
            raise UsageError(
                f"--draft-sink-size={sink_size} is invalid with --draft dspark: "
                "the DSpark demo has no sink option (use --draft dflash)"
            )
        return run_dspark_demo_command(args)
    sinks = f", S={sink_size} sink tokens" if sink_size else ""
    status = _print_demo_table(
        title=(
            f"dspark-compile demo: DFlash reference draft (4 layers, GQA 8/2, head_dim 64, "
            f"block 16, q_len 8, non-causal), W={args.window}{sinks}, {args.requests} "
            f"requests, lowering={args.lowering}, device={args.device}"
        ),
        columns=[
            ("context", 8, "{:>8}", "context_len"),
            ("windowed err", 12, "{:>12.2e}", "windowed_max_err"),
            ("full err", 9, "{:>9.2e}", "full_max_err"),
            ("window effect", 13, "{:>13.2e}", "window_effect"),
            ("rewritten", 9, "{:>9}", "rewritten_calls"),
            ("windows", 7, "{:>7}", "window_computations"),
            ("full ms", 8, "{:>8.2f}", "full_ms"),
            ("windowed ms", 11, "{:>11.2f}", "windowed_ms"),
            ("speedup", 7, "{:>6.2f}x", "speedup"),
        ],
        rows=run_demo(
            args.contexts,
            args.window,
            num_requests=args.requests,
            lowering=args.lowering,
            device=args.device,
            sink_size=sink_size,
        ),
        contexts=args.contexts,
        row_ok=lambda row: row.windowed_max_err < 1e-3 and row.full_max_err < 1e-3,
        legend=(
            "err: max |compiled - eager reference|; window effect: max |windowed - full| "
            "(0 when W covers the whole context)"
        ),
        ok_message="OK: compiled outputs match the eager references",
        bad_message="MISMATCH: compiled outputs differ from the eager references",
    )
    if args.skip_pair:
        return status
    print()
    return max(status, run_pair_demo_command(args.pair_dir))


def run_pair_demo_command(pair_dir: Optional[Path], lowering: str = "aot_eager") -> int:
    """The demo's acceptance part (``tools/pair_demo.py``); skipped with a note when the
    default pair is absent (an installed wheel carries no checkpoints). ``aot_eager``:
    the window's arithmetic is the same under every lowering, and it compiles fastest."""
    from dspark_compile.tools.pair_demo import PAIR_DIR, pair_contexts, run_pair_demo

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
    from dspark_compile.speculative.hf_export import training_context

    contexts = pair_contexts(pair_dir)
    trained = training_context(pair_dir / "draft")
    rows: list = []

    def collect():
        for row in run_pair_demo(pair_dir, contexts, lowering=lowering):
            rows.append(row)
            yield row

    status = _print_demo_table(
        title=(
            f"acceptance on a trained pair ({pair_dir.name}: draft_model draft trained at "
            f"{trained} tokens), greedy, K=5, 4 held-out prompts x 32 tokens per length, "
            f"our speculative loop (dspark_compile.speculative), lowering={lowering}"
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


def run_dspark_demo_command(args: argparse.Namespace) -> int:
    from dspark_compile.tools.dspark_demo import run_dspark_demo

    return _print_demo_table(
        title=(
            f"dspark-compile demo: DSpark reference draft (2 sparse-MLA layers, 8 heads, "
            f"kv_lora_rank 64 + rope 32, block 16, q_len 8, Markov head), method=dspark, "
            f"W={args.window}, {args.requests} requests, lowering={args.lowering}, "
            f"device={args.device}"
        ),
        columns=[
            ("context", 8, "{:>8}", "context_len"),
            ("max err", 9, "{:>9.2e}", "max_err"),
            ("non-causal effect", 17, "{:>17.2e}", "noncausal_effect"),
            ("rewritten", 9, "{:>9}", "rewritten_calls"),
            ("tokens equal", 12, "{!s:>12}", "tokens_equal"),
            ("eager ms", 8, "{:>8.2f}", "eager_ms"),
            ("compiled ms", 11, "{:>11.2f}", "compiled_ms"),
        ],
        rows=run_dspark_demo(
            args.contexts,
            args.window,
            num_requests=args.requests,
            lowering=args.lowering,
            device=args.device,
        ),
        contexts=args.contexts,
        row_ok=lambda row: row.max_err < 1e-3 and row.tokens_equal and row.rewritten_calls == 1,
        legend=(
            "max err: |compiled - eager non-causal reference|; non-causal effect: "
            "|non-causal - causal| (the block's queries see later block tokens)"
        ),
        ok_message="OK: the compiled DSpark draft matches the eager non-causal reference",
        bad_message="MISMATCH: the compiled DSpark draft differs from the eager reference",
    )


def _print_demo_table(
    title,
    columns,
    rows,
    contexts,
    row_ok,
    legend,
    ok_message,
    bad_message,
    step="compiling, checking, timing",
) -> int:
    """Print one table row per context as the demo yields it; exit status 0 iff all rows pass.

    ``columns``: (header, width, format, row attribute).
    """
    print(title)
    header = " | ".join(f"{name:>{width}}" for name, width, _, _ in columns)
    print(header)
    print("-" * len(header), flush=True)
    ok = True
    progress = TextProgress(len(contexts), "demo")
    for i, context in enumerate(contexts):
        progress.show(i, f"context {context}: {step}")
        row = next(rows)
        progress.clear()
        cells = " | ".join(fmt.format(getattr(row, attr)) for _, _, fmt, attr in columns)
        print(f"{cells}   [{i + 1}/{len(contexts)}]", flush=True)
        ok &= bool(row_ok(row))
    print(legend)
    print(ok_message if ok else bad_message)
    return 0 if ok else 1


def run_inspect_command(args: argparse.Namespace) -> int:
    from dspark_compile.options import parse_options
    from dspark_compile.tools.inspection import inspect, reference_draft_example

    options = {**_window_options(args), "lowering": args.lowering}
    parse_options(options)  # bad options fail before any work
    progress = TextProgress(2, "inspect")
    progress.show(0, "building the reference draft")
    model, inputs = reference_draft_example(context_len=args.context, num_layers=args.layers)
    progress.show(1, "compiling with backend='dspark' under depyf")
    report = inspect(
        model, *inputs, dump_dir=args.dump_dir, options=options, overwrite=args.overwrite
    )
    progress.show(2, "done")
    progress.clear()
    totals = {
        key: sum(p.stats.get(key, 0) for p in report.passes)
        for key in ("attention_calls", "rewritten", "window_computations")
    }
    kernels = sum(len(names) for names in report.kernels.values())
    print(f"wrote {len(report.files)} files to {report.dump_dir}")
    print(
        f"attention calls found {totals['attention_calls']}, rewritten {totals['rewritten']}, "
        f"window computations inserted {totals['window_computations']}, "
        f"generated kernels {kernels}"
    )
    if options["draft_sink_size"]:
        with_sinks = sum(
            p.stats.get("with_sinks", 0) for p in report.passes if p.pass_name == "draft_window"
        )
        widths = sorted(
            {
                f"{c.table_width_before} -> {c.table_width_after}"
                for p in report.passes
                for c in p.attention_calls
                if c.rewritten
            }
        )
        print(
            f"attention sinks: S={options['draft_sink_size']} tokens on {with_sinks} "
            f"call(s); block table columns {', '.join(widths)}"
        )
    print(f"read first: {report.summary_path}")
    return 0


def run_check_ascend_command(args: argparse.Namespace) -> int:
    from dspark_compile.tools.ascend_check import check_ascend
    from dspark_compile.tools.inspection import reference_draft_example

    options = _window_options(args)
    progress = TextProgress(1, "check-ascend")
    progress.show(0, "tracing the reference draft with backend='dspark'")
    model, inputs = reference_draft_example()
    result = check_ascend(model, *inputs, options=options, inserted_only=args.inserted_only)
    progress.show(1, "done")
    progress.clear()
    print(result)
    if not result.ok:
        print(
            "note: the reference draft's dspark.* custom ops stand in for NPU attention "
            "kernels; on Ascend use torch_npu's attention ops (register them with "
            "register_attention_op)"
        )
    return 0 if result.ok else 1


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


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI; returns the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if args.command != "bench" and extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if args.command == "demo":
            return run_demo_command(args)
        if args.command == "inspect":
            return run_inspect_command(args)
        if args.command == "check-ascend":
            return run_check_ascend_command(args)
        if args.command == "study":
            return run_study_command(args)
        if args.command == "study-report":
            return run_study_report_command(args)
        return run_bench_command(extra[1:] if extra[:1] == ["--"] else extra)
    except (UsageError, ValueError) as error:
        print(f"{PROG} {args.command}: error: {error}", file=sys.stderr)
        return 2
