"""Host time the draft window's vLLM route adds to one draft forward.

    python benchmarks/bench_route_host.py [--layers 2] [--reqs 1] [--contexts 640,2048]
                                          [--device cpu|cuda]

Times, single-threaded, one draft forward's attention calls (``--layers`` layers, one
FlashAttention metadata object of ``--reqs`` decode requests at each of ``--contexts``
tokens, W=1024, K=5, block 16) through vLLM's own ``unified_attention_with_output`` and
through the window's ``unified_attention_with_output_windowed``, inside vLLM's forward
context, with the layers' attention implementation a no-op: what remains is the route's
host work per forward (the window spec, the native window, windowing the metadata once
per step, its copy). A context below W - K + b (1035) is a step the window cannot cut
(its metadata is kept: no launch); a longer one is windowed. On ``cuda`` the windowed
metadata is computed by the real Triton launch (``query_window_table_triton``); on
``cpu`` the table step is stubbed out
(``--device cpu`` measures the Python alone). Median of 7 x ``--iters`` forwards after a
warm-up; the variants alternate. Needs vLLM (the ``[vllm]`` extra, or the staged vLLM on
a GPU machine).
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

BLOCK, WINDOW, FUTURE_OFFSET, WIDTH = 16, 1024, 5, 128


def flash_metadata(num_reqs: int, context: int, device: str):
    """Decode metadata (one query per request) of vLLM's FlashAttention backend; fields
    that other vLLM versions require are off or none."""
    from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadata

    gen = torch.Generator().manual_seed(0)
    seq_lens = torch.full((num_reqs,), context, dtype=torch.int32)
    table = torch.randint(1, 10_000, (num_reqs, WIDTH), generator=gen, dtype=torch.int32)
    qsl = torch.arange(num_reqs + 1, dtype=torch.int32)
    given = dict(
        num_actual_tokens=num_reqs,
        max_query_len=1,
        query_start_loc=qsl.to(device),
        max_seq_len=context,
        seq_lens=seq_lens.to(device),
        block_table=table.to(device),
        slot_mapping=torch.arange(num_reqs, device=device),
    )
    for field in dataclasses.fields(FlashAttentionMetadata):
        required = field.default is dataclasses.MISSING
        if required and field.default_factory is dataclasses.MISSING and field.name not in given:
            given[field.name] = False if field.name.startswith("use_") else None
    if given.get("common_prefix_len", 0) is None:
        given["common_prefix_len"] = 0
    return FlashAttentionMetadata(**given)


class _NoOpImpl:
    """An attention implementation that computes nothing (the route's host work remains)."""

    sliding_window = (-1, -1)

    def forward(self, *args, **kwargs) -> None:
        return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=2, help="draft attention layers")
    parser.add_argument("--reqs", type=int, default=1, help="decode requests in the batch")
    parser.add_argument(
        "--contexts", default="640,2048", help="tokens per request, comma separated"
    )
    parser.add_argument("--iters", type=int, default=2000)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    for name in ("layers", "reqs", "iters"):
        if getattr(args, name) < 1:
            parser.error(f"--{name}: {getattr(args, name)}: expected an int >= 1")
    try:
        contexts = [int(c) for c in args.contexts.split(",")]
    except ValueError:
        parser.error(f"--contexts: {args.contexts!r}: expected comma-separated ints")
    for context in contexts:
        if not 1 <= context <= WIDTH * BLOCK:
            parser.error(f"--contexts: {context}: expected 1 to {WIDTH * BLOCK} (the table)")
    if args.device not in ("cpu", "cuda") or (
        args.device == "cuda" and not torch.cuda.is_available()
    ):
        parser.error(f"--device: {args.device!r}: expected cpu, or cuda on a machine with one")

    from vllm.config import CompilationConfig, DeviceConfig, VllmConfig

    from dspark_compile.integrations.vllm import token_window

    if args.device == "cpu":
        # the table step (the CPU route's NumPy path, or its torch reference), stubbed
        token_window._window_table_numpy = lambda *a, **k: None
        token_window._window_table_torch = lambda *a, **k: None
    # FlashAttention's cache layout [2, blocks, block, kv heads, head size]
    cache = torch.empty(2, 4, BLOCK, 1, 8, device=args.device)
    names = [f"draft.layers.{i}.attn" for i in range(args.layers)]
    config = VllmConfig(
        device_config=DeviceConfig(device=args.device), compilation_config=CompilationConfig()
    )
    for name in names:
        config.compilation_config.static_forward_context[name] = types.SimpleNamespace(
            impl=_NoOpImpl(), kv_cache=cache, layer_name=name
        )
    where = torch.cuda.get_device_name() if args.device == "cuda" else "host"
    print(
        f"device {args.device} ({where}), torch {torch.__version__}; {args.layers} layers, "
        f"{args.reqs} requests, W={WINDOW}, K={FUTURE_OFFSET}, block {BLOCK}"
    )
    for context in contexts:
        metadata = flash_metadata(args.reqs, context, args.device)
        times = _time_variants(metadata, names, config, args)
        cut = "windowed" if context >= WINDOW - FUTURE_OFFSET + BLOCK else "not cut: kept"
        print(f"context {context} ({cut}):")
        base = times["vLLM's op"]
        for label, us in times.items():
            extra = "" if label == "vLLM's op" else f"  (+{us - base:.1f})"
            print(f"  {label + ':':<24} {us:7.1f} us per draft forward{extra}")
    return 0


def _time_variants(metadata, names, config, args) -> dict[str, float]:
    """Median us per draft forward through vLLM's op and through the route, alternating."""
    from vllm.forward_context import set_forward_context
    from vllm.model_executor.layers.attention import attention as vllm_attention

    from dspark_compile.integrations.vllm import attention_op

    q = out = torch.empty(1, device=args.device)
    windowed = attention_op.unified_attention_with_output_windowed

    def forward(variant: str) -> None:
        with set_forward_context({n: metadata for n in names}, config):
            for n in names:
                if variant == "vLLM's op":
                    vllm_attention.unified_attention_with_output(q, q, q, out, n)
                else:
                    windowed(q, q, q, out, n, WINDOW, FUTURE_OFFSET, args.reqs)

    variants = ["vLLM's op", "route"]
    times: dict[str, list[float]] = {v: [] for v in variants}
    for _ in range(max(args.iters // 10, 20)):
        for variant in variants:
            forward(variant)
    for _ in range(7):
        for variant in variants:
            if args.device == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(args.iters):
                forward(variant)
            times[variant].append((time.perf_counter() - t0) / args.iters * 1e6)
    if args.device == "cuda":
        torch.cuda.synchronize()
    return {v: statistics.median(t) for v, t in times.items()}


if __name__ == "__main__":
    raise SystemExit(main())
