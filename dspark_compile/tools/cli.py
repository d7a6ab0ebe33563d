"""``dspark-compile``: the command line (demo, inspect, check-ascend).

Every command runs on the built-in reference draft by default (CPU). Bad
input exits with status 2 and one message; a failed check exits with 1. The research
commands (study, bench, the demo's acceptance part) live in the source checkout's
``dspark_research`` package, which builds its command line from the pieces here.
"""

from __future__ import annotations

import argparse
import sys
import time
from typing import Callable, Mapping, Optional, Sequence, TextIO

PROG = "dspark-compile"


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


def positive_int(text: str) -> int:
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

    add_demo_parser(commands)

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
        type=positive_int,
        default=256,
        help="context length of the example batch (default: 256)",
    )
    inspect.add_argument("--layers", type=positive_int, default=2, help="draft layers (default: 2)")

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

    return parser


def add_demo_parser(commands) -> argparse.ArgumentParser:
    """Add the ``demo`` command to ``commands`` (a subparsers action); returns its parser."""
    demo = commands.add_parser(
        "demo",
        help="window the reference DFlash draft, check it and time it",
        description="Compile the built-in 4-layer DFlash reference draft with and without the "
        "draft KV window, check both against eager references and time a draft step.",
    )
    demo.add_argument(
        "--contexts",
        type=positive_int,
        nargs="+",
        default=[1024, 4096, 16384],
        help="context lengths to run, in tokens (default: 1024 4096 16384)",
    )
    demo.add_argument(
        "--window", type=positive_int, default=512, help="draft_window_size W (default: 512)"
    )
    _add_sink_arg(demo)
    demo.add_argument(
        "--requests", type=positive_int, default=4, help="requests per batch (default: 4)"
    )
    demo.add_argument("--lowering", choices=["inductor", "aot_eager"], default="inductor")
    demo.add_argument("--device", default="cpu", help="torch device (default: cpu)")
    demo.add_argument(
        "--draft",
        choices=["dflash", "dspark"],
        default="dflash",
        help="dspark: the sparse-MLA DSpark draft compiled with method='dspark' "
        "(non-causal block indices, Markov head) (default: dflash)",
    )
    return demo


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
        type=positive_int,
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
    return print_demo_table(
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


def run_dspark_demo_command(args: argparse.Namespace) -> int:
    from dspark_compile.tools.dspark_demo import run_dspark_demo

    return print_demo_table(
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


def print_demo_table(
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


def run(
    parser: argparse.ArgumentParser,
    commands: Mapping[str, Callable[[argparse.Namespace], int]],
    argv: Sequence[str],
    prog: str = PROG,
    passthrough: Optional[Mapping[str, Callable[[Sequence[str]], int]]] = None,
) -> int:
    """Parse ``argv`` and run its command; returns the exit status. ``passthrough``
    commands get the unparsed arguments after their name (a leading ``--`` dropped)."""
    passthrough = passthrough or {}
    args, extra = parser.parse_known_args(list(argv))
    if args.command not in passthrough and extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        if args.command in passthrough:
            return passthrough[args.command](extra[1:] if extra[:1] == ["--"] else extra)
        return commands[args.command](args)
    except (UsageError, ValueError) as error:
        print(f"{prog} {args.command}: error: {error}", file=sys.stderr)
        return 2


COMMANDS = {
    "demo": run_demo_command,
    "inspect": run_inspect_command,
    "check-ascend": run_check_ascend_command,
}


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI; returns the exit status."""
    return run(build_parser(), COMMANDS, sys.argv[1:] if argv is None else argv)
