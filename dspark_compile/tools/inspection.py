"""``dspark_compile.inspect``: compile a draft under depyf and explain what our passes did.

The dump directory receives depyf's decompiled Dynamo code
(``full_code_for_*.py``, ``__transformed_code_*.py``), the post-grad graph
before and after each of our passes (``__compiled_fn_<n>.dspark_before_<pass>.<i>.py``
/ ``...dspark_after_<pass>...``), Inductor's output code
(``__compiled_fn_<n>.kernel_<i>.py``) and ``summary.md``: the attention calls
found and rewritten, the window config, the window computations inserted,
the inserted ops' torchair-GE convertibility and the generated kernels' names.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import logging
import os
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Optional, Sequence

import torch
import torch.fx

from dspark_compile.config import DraftWindowConfig
from dspark_compile.passes.attention_registry import attention_op_specs
from dspark_compile.passes.manager import pass_records
from dspark_compile.routes.ge_converters import op_name, unconvertible_ops
from dspark_compile.validation import check_int

logger = logging.getLogger(__name__)

DEFAULT_OPTIONS = {"draft_window_size": 64, "method": "dflash"}
_DUMP_PATTERNS = ("__compiled_fn_*", "__transformed_code_*", "full_code_for_*", "summary.md")
_KERNEL_DEF = re.compile(r"^(\w+) = async_compile\.(\w+)\(", re.MULTILINE)


@dataclasses.dataclass
class AttentionCall:
    """One attention call of a graph; ``*_after`` are the node names after the pass."""

    node: str
    op: str
    seq_lens_before: str
    block_table_before: str
    seq_lens_after: str = ""
    block_table_after: str = ""
    block_size: Optional[int] = None  # the KV cache's static dim 1 (None: unknown)
    table_width_before: str = "?"  # block-table columns (str: may be symbolic)
    table_width_after: str = "?"

    @property
    def rewritten(self) -> bool:
        return (self.seq_lens_after, self.block_table_after) != (
            self.seq_lens_before,
            self.block_table_before,
        )


@dataclasses.dataclass
class PassInspection:
    """What one pass did to one graph: its recorded stats and the graph diff."""

    compiled_fn: str
    pass_name: str
    stats: dict[str, int]
    attention_calls: list[AttentionCall]
    inserted_ops: dict[str, int]
    inserted_unconvertible: dict[str, list[str]]
    before_file: Optional[str] = None
    after_file: Optional[str] = None


@dataclasses.dataclass
class InspectionReport:
    dump_dir: Path
    summary_path: Path
    options: dict[str, Any]
    passes: list[PassInspection]
    kernels: dict[str, list[str]]  # output-code file -> kernel names
    files: list[str]


def reference_draft_example(
    context_len: int = 256,
    num_requests: int = 2,
    block_q_len: int = 4,
    num_layers: int = 2,
    block_size: int = 16,
    seed: int = 0,
    device: str = "cpu",
) -> tuple[torch.nn.Module, tuple]:
    """The built-in DFlash reference draft and one draft step's inputs (random weights/KV)."""
    from dspark_compile.models import DraftModelConfig
    from dspark_compile.testing import make_draft_case

    for name, value in (
        ("context_len", context_len),
        ("num_requests", num_requests),
        ("block_q_len", block_q_len),
        ("num_layers", num_layers),
        ("block_size", block_size),
    ):
        check_int(name, value)
    if block_q_len > context_len:
        raise ValueError(
            f"block_q_len={block_q_len} is invalid: expected <= context_len ({context_len})"
        )
    cfg = DraftModelConfig(
        hidden_size=128,
        num_layers=num_layers,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=256,
        causal=False,
    )
    seq_lens = [max(context_len - 13 * i, block_q_len) for i in range(num_requests)]
    case = make_draft_case(
        seq_lens,
        [block_q_len] * num_requests,
        config=cfg,
        block_size=block_size,
        seed=seed,
        device=device,
    )
    return case.model, case.args()


def inspect(
    fn: Optional[Callable[..., Any]] = None,
    *example_inputs: Any,
    dump_dir: str | os.PathLike = "dspark_inspect",
    options: Optional[Mapping[str, Any]] = None,
    overwrite: bool = False,
) -> InspectionReport:
    """Compile ``fn`` with ``backend="dspark"`` under depyf; write the dump and ``summary.md``.

    ``fn=None`` inspects the built-in reference draft (``reference_draft_example``).
    ``options`` are the backend's (default ``DEFAULT_OPTIONS``). ``fn`` runs once
    on ``example_inputs``. ``dump_dir`` must be new or empty unless ``overwrite``,
    which first deletes earlier dump files there (only depyf's and ours).
    """
    from dspark_compile.backend import compile_caches_off, dspark_backend, graph_hook, parse_options
    from dspark_compile.integrations.depyf_dump import depyf_debug

    if fn is None:
        if example_inputs:
            raise ValueError("example_inputs given without fn: pass the function they belong to")
        fn, example_inputs = reference_draft_example()
    elif not callable(fn):
        raise TypeError(f"fn={fn!r} is invalid: expected a function or an nn.Module")
    options = dict(DEFAULT_OPTIONS if options is None else options)
    window, _ = parse_options(options)  # bad options fail before anything is written
    dump = _prepare_dump_dir(Path(dump_dir), overwrite)

    recorder = _PassRecorder()
    backend = functools.partial(dspark_backend, options=options)
    with compile_caches_off(), depyf_debug(str(dump)), graph_hook(recorder), torch.no_grad():
        compiled = torch.compile(fn, backend=backend, dynamic=False)
        compiled(*example_inputs)

    files = sorted(p.name for p in dump.iterdir())
    _attach_graph_files(recorder.passes, files)
    kernels = {
        name: _kernel_names(dump / name) for name in files if re.search(r"\.kernel_\d+\.py$", name)
    }
    report = InspectionReport(
        dump, dump / "summary.md", options, recorder.passes, kernels, files + ["summary.md"]
    )
    report.summary_path.write_text(render_summary(report, window))
    logger.info("inspection of %s written to %s", getattr(fn, "__name__", type(fn).__name__), dump)
    return report


def _prepare_dump_dir(dump: Path, overwrite: bool) -> Path:
    if dump.exists() and not dump.is_dir():
        raise ValueError(f"dump_dir={str(dump)!r} is invalid: it exists and is not a directory")
    dump.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for pattern in _DUMP_PATTERNS:
            for old in dump.glob(pattern):
                if old.is_file():
                    old.unlink()
    leftovers = sorted(p.name for p in dump.iterdir())
    if leftovers:
        raise ValueError(
            f"dump_dir={str(dump)!r} is invalid: it is not empty ({len(leftovers)} "
            f"entries, e.g. {leftovers[0]!r}); pass a new or empty directory"
            + ("" if overwrite else ", or overwrite=True to replace an old dump")
        )
    return dump.resolve()


class _PassRecorder:
    """Graph hook: logs each graph for depyf and diffs it across each pass."""

    def __init__(self) -> None:
        self.passes: list[PassInspection] = []
        self._before: dict[int, tuple[set, list[AttentionCall]]] = {}

    def __call__(self, stage: str, graph: torch.fx.Graph) -> None:
        from dspark_compile.integrations.depyf_dump import log_graph

        log_graph(f"dspark_{stage}", graph)
        when, pass_name = stage.split("_", 1)
        if when == "before":
            self._before[id(graph)] = (set(graph.nodes), _attention_calls(graph))
            return
        nodes_before, calls = self._before.pop(id(graph))
        after = {c.node: c for c in _attention_calls(graph)}
        for call in calls:
            if call.node in after:
                call.seq_lens_after = after[call.node].seq_lens_before
                call.block_table_after = after[call.node].block_table_before
                call.table_width_after = after[call.node].table_width_before
        inserted = [n for n in graph.nodes if n not in nodes_before]
        ops = collections.Counter(op_name(n.target) for n in inserted if n.op == "call_function")
        record = pass_records()[-1]  # the manager records a pass before its "after" hook
        self.passes.append(
            PassInspection(
                compiled_fn=_current_compiled_fn(),
                pass_name=pass_name,
                stats=dict(record.stats),
                attention_calls=calls,
                inserted_ops=dict(sorted(ops.items())),
                inserted_unconvertible=unconvertible_ops(inserted),
            )
        )


def _attention_calls(graph: torch.fx.Graph) -> list[AttentionCall]:
    specs = attention_op_specs()
    calls = []
    for node in graph.nodes:
        if node.op != "call_function" or node.target not in specs:
            continue
        spec = specs[node.target]
        calls.append(
            AttentionCall(
                node.name,
                str(node.target),
                _arg_name(node, spec.arg_index(spec.seq_lens), spec.seq_lens),
                _arg_name(node, spec.arg_index(spec.block_table), spec.block_table),
                block_size=_static_dim(node, spec, spec.kv_cache, 1),
                table_width_before=str(_static_dim(node, spec, spec.block_table, 1, static=False)),
            )
        )
    return calls


def _static_dim(
    node: torch.fx.Node, spec, name: Optional[str], dim: int, static: bool = True
) -> Any:
    """Dim ``dim`` of tensor argument ``name`` of ``node`` (None if unknown; with
    ``static`` also None when symbolic)."""
    from dspark_compile.passes.graph_utils import get_arg

    if name is None:
        return None
    value = get_arg(node, spec.arg_index(name), name)
    val = value.meta.get("val") if isinstance(value, torch.fx.Node) else None
    if not isinstance(val, torch.Tensor) or val.dim() <= dim:
        return None
    size = val.shape[dim]
    return size if isinstance(size, int) or not static else None


def _arg_name(node: torch.fx.Node, index: int, name: str) -> str:
    from dspark_compile.passes.graph_utils import get_arg

    value = get_arg(node, index, name)
    return value.name if isinstance(value, torch.fx.Node) else repr(value)


def _current_compiled_fn() -> str:
    try:
        from depyf.explain.utils import get_current_compiled_fn_name
    except ImportError:
        return "?"
    return get_current_compiled_fn_name()


def _attach_graph_files(passes: list[PassInspection], files: Sequence[str]) -> None:
    """Match each pass run to depyf's before/after files (in the order they were written)."""
    seen: collections.Counter = collections.Counter()
    for record in passes:
        key = (record.compiled_fn, record.pass_name)
        index = seen[key]
        seen[key] += 1
        for when in ("before", "after"):
            name = f"{record.compiled_fn}.dspark_{when}_{record.pass_name}.{index}.py"
            if name in files:
                setattr(record, f"{when}_file", name)


def _kernel_names(path: Path) -> list[str]:
    return [name for name, _ in _KERNEL_DEF.findall(path.read_text())]


def _sink_lines(report: InspectionReport, window: DraftWindowConfig) -> list[str]:
    """Attention sinks: S in tokens and blocks (per KV block size seen) and what
    they add to the windowed table (docs/design.md, "Attention sinks")."""
    from dspark_compile.arithmetic.window import sink_blocks

    sink = window.draft_sink_size
    if not sink:
        return ["- draft_sink_size (S): 0 (no attention sinks)"]
    sizes = sorted(
        {window.block_size}
        if window.block_size
        else {c.block_size for p in report.passes for c in p.attention_calls if c.block_size}
    )
    if not sizes:
        return [
            f"- draft_sink_size (S): {sink} tokens, ceil(S / b) blocks (KV block size b unknown)"
        ]
    return [
        f"- draft_sink_size (S): {sink} tokens = {sink_blocks(sink, b)} block(s) of b={b} "
        f"(S_b = {sink_blocks(sink, b) * b} sink tokens stay visible); the windowed "
        f"table is {sink_blocks(sink, b)} column(s) wider and holds "
        "kept = min(ceil(S / b), start_block) sink blocks before the window's"
        for b in sizes
    ]


def render_summary(report: InspectionReport, window: DraftWindowConfig) -> str:
    """The markdown a person reads first."""
    lines = ["# dspark-compile inspection", ""]
    lines += ["## Window config", ""]
    if window.enabled:
        lines.append(f"- draft_window_size (W): {window.draft_window_size}")
        lines.append(
            f"- method: {window.method}; future_offset (K): {window.resolved_future_offset}"
        )
        lines.append(f"- block_size: {window.block_size or 'from the KV cache'}")
        lines += _sink_lines(report, window)
    else:
        lines.append(
            f"- window off (method: {window.method}): attention calls are left as they are"
        )
    backend_opts = {
        k: v for k, v in report.options.items() if k not in DraftWindowConfig.field_names()
    }
    lines.append(f"- backend options: {backend_opts or 'defaults'}")
    lines += ["", "## Passes", ""]
    if not report.passes:
        lines.append("No graph reached our passes (nothing compiled, or a cache hit).")
    totals: collections.Counter = collections.Counter()
    for record in report.passes:
        totals.update(record.stats)
        lines.append(f"### {record.compiled_fn}: {record.pass_name}")
        lines.append("")
        lines.append("| counter | value |")
        lines.append("|---|---|")
        lines += [f"| {key} | {value} |" for key, value in record.stats.items()]
        lines.append("")
        lines.append(f"- graph before: `{record.before_file}`; after: `{record.after_file}`")
        if record.attention_calls:
            lines.append("- attention calls (seq_lens, block_table inputs):")
            for call in record.attention_calls:
                change = (
                    f"rewritten: ({call.seq_lens_before}, {call.block_table_before}) -> "
                    f"({call.seq_lens_after}, {call.block_table_after})"
                    if call.rewritten
                    else f"unchanged: ({call.seq_lens_before}, {call.block_table_before})"
                )
                width = (
                    f"; block table {call.table_width_before} -> {call.table_width_after} columns"
                    if call.rewritten
                    else ""
                )
                lines.append(f"  - `{call.node}` ({call.op}): {change}{width}")
        else:
            lines.append("- attention calls: none found")
        if record.inserted_ops:
            ops = ", ".join(f"{name} x{count}" for name, count in record.inserted_ops.items())
            lines.append(f"- inserted ops: {ops}")
            scope = (
                "NPU-route graph"
                if report.options.get("lowering") == "aot_eager"
                else "Inductor-decomposed graph; the NPU route inserts plain ATen ops, "
                "see check_ascend"
            )
            if record.inserted_unconvertible:
                bad = ", ".join(sorted(record.inserted_unconvertible))
                lines.append(f"- torchair GE mode cannot convert inserted ({scope}): {bad}")
            else:
                lines.append(
                    f"- every inserted op is convertible by torchair's GE graph mode ({scope})"
                )
        lines.append("")
    lines += ["## Totals", ""]
    for key in ("attention_calls", "rewritten", "window_computations"):
        lines.append(f"- {key}: {totals.get(key, 0)}")
    lines += ["", "## Generated kernels", ""]
    if not report.kernels:
        lines.append("No Inductor output code (lowering='aot_eager', or nothing compiled).")
    for name, kernels in report.kernels.items():
        lines.append(f"- `{name}`: {len(kernels)} kernel(s)")
        lines += [f"  - `{kernel}`" for kernel in kernels]
    lines += ["", "## Files", ""]
    lines += [f"- `{name}`" for name in report.files]
    return "\n".join(lines) + "\n"
