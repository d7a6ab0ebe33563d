"""Is vLLM's FlashAttention (FA3) run to run identical with a local window and split-KV?

    python benchmarks/fa_window_determinism.py [--repeats 40] [--out DIR]

Calls vLLM's ``flash_attn_varlen_func`` (FA3, paged KV, block 16) the way a draft's
windowed attention reaches it: causal, ``window_size = (W - K - 1, 0)`` or none,
``scheduler_metadata=None`` (the window's metadata copy drops vLLM's plan) and
``num_splits`` 32 (vLLM's setting for CUDA-graph-sized batches), 0 (FA3's heuristic) or 1
(the window's setting, ``token_window._flash_attention_window``). The draft of the
SmolLM2 pair's shapes: 9 query heads, 3 KV heads, head size 64, bf16.

For each case, ``--repeats`` calls on the same inputs with the caching allocator's free
memory refilled with random values before each call (so buffers FA3 allocates start
with other contents): the number of distinct outputs (bitwise), the largest error
against an fp32 reference of the same window (``max|out - ref|``), and the median GPU
time of one call (CUDA events, 200 calls). Prints a table; ``--out`` also writes
``fa_window_determinism.json``. Needs a GPU and vLLM.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import sys
from pathlib import Path

import torch

HQ, HKV, HEAD, BLOCK = 9, 3, 64, 16


def paged_inputs(batch: int, seq_len: int, q_len: int, device: str = "cuda", seed: int = 0):
    """Random bf16 queries ``[batch * q_len, HQ, HEAD]`` and a paged KV cache whose
    blocks are scattered (a random permutation) over ``[num_blocks, BLOCK, HKV, HEAD]``;
    the block table ``[batch, ceil(seq_len / BLOCK)]``, ``cu_seqlens_q`` and ``seqused_k``
    (int32)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    blocks_per_seq = -(-seq_len // BLOCK)
    num_blocks = batch * blocks_per_seq + 7

    def randn(*shape):
        return torch.randn(*shape, generator=gen, device=device).to(torch.bfloat16)

    q = randn(batch * q_len, HQ, HEAD)
    k_cache, v_cache = randn(num_blocks, BLOCK, HKV, HEAD), randn(num_blocks, BLOCK, HKV, HEAD)
    perm = torch.randperm(num_blocks, generator=gen, device=device)[: batch * blocks_per_seq]
    table = perm.view(batch, blocks_per_seq).to(torch.int32)
    cu_q = torch.arange(0, (batch + 1) * q_len, q_len, device=device, dtype=torch.int32)
    seqused = torch.full((batch,), seq_len, device=device, dtype=torch.int32)
    return q, k_cache, v_cache, table, cu_q, seqused


def reference(q, k_cache, v_cache, table, seq_len, q_len, left):
    """fp32 causal attention over each request's keys; query p sees ``[p - left, p]``
    (``left < 0``: all of ``[0, p]``)."""
    batch = table.shape[0]
    out = torch.empty(q.shape, dtype=torch.float32, device=q.device)
    group = HQ // HKV
    for b in range(batch):
        k = k_cache[table[b].long()].reshape(-1, HKV, HEAD)[:seq_len].float()
        v = v_cache[table[b].long()].reshape(-1, HKV, HEAD)[:seq_len].float()
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
        qb = q[b * q_len : (b + 1) * q_len].float()
        pos = torch.arange(seq_len - q_len, seq_len, device=q.device)[:, None]
        key = torch.arange(seq_len, device=q.device)[None, :]
        visible = key <= pos
        if left >= 0:
            visible &= key >= pos - left
        scores = torch.einsum("qhd,khd->hqk", qb, k) * HEAD**-0.5
        scores = scores.masked_fill(~visible[None], float("-inf"))
        out[b * q_len : (b + 1) * q_len] = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v)
    return out


def refill_free_memory(megabytes: int = 256) -> None:
    """Allocate, fill with random values and free ``megabytes``: the caching allocator
    hands these blocks to the next allocations."""
    junk = torch.empty(megabytes << 18, device="cuda", dtype=torch.float32)
    junk.normal_()
    del junk


def run_case(fa, batch, seq_len, q_len, left, splits, repeats):
    q, k_cache, v_cache, table, cu_q, seqused = paged_inputs(batch, seq_len, q_len)

    def call():
        return fa(
            q,
            k_cache,
            v_cache,
            max_seqlen_q=q_len,
            cu_seqlens_q=cu_q,
            max_seqlen_k=seq_len,
            seqused_k=seqused,
            softmax_scale=HEAD**-0.5,
            causal=True,
            window_size=[left, 0] if left >= 0 else [-1, -1],
            block_table=table,
            scheduler_metadata=None,
            num_splits=splits,
            fa_version=3,
        )

    ref = reference(q, k_cache, v_cache, table, seq_len, q_len, left)
    outputs = []
    for _ in range(repeats):
        refill_free_memory()
        outputs.append(call())
    torch.cuda.synchronize()
    distinct = len({o.view(torch.int16).cpu().numpy().tobytes() for o in outputs})
    max_err = max(float((o.float() - ref).abs().max()) for o in outputs)
    for _ in range(20):
        call()
    times = []
    for _ in range(200):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return {
        "batch": batch,
        "seq_len": seq_len,
        "q_len": q_len,
        "window_left": left,
        "num_splits": splits,
        "repeats": repeats,
        "distinct_outputs": distinct,
        "max_abs_err_vs_fp32": max_err,
        "median_us": statistics.median(times),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--repeats", type=int, default=40)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)
    if args.repeats < 2:
        parser.error(f"--repeats: {args.repeats}: expected an int >= 2 (outputs are compared)")
    if not torch.cuda.is_available():
        print("fa_window_determinism: needs a CUDA GPU", file=sys.stderr)
        return 2
    from vllm.vllm_flash_attn import flash_attn_varlen_func

    rows = []
    cases = itertools.product((1, 4), (640, 8256), (1, 6), (506, -1), (32, 0, 1))
    print("| batch | seq_len | q_len | window left | num_splits | distinct of N | max err | us |")
    print("|---:|---:|---:|---:|---:|---:|---:|---:|")
    for batch, seq_len, q_len, left, splits in cases:
        row = run_case(flash_attn_varlen_func, batch, seq_len, q_len, left, splits, args.repeats)
        rows.append(row)
        print(
            f"| {batch} | {seq_len} | {q_len} | {left} | {splits} | "
            f"{row['distinct_outputs']} of {row['repeats']} | "
            f"{row['max_abs_err_vs_fp32']:.2e} | {row['median_us']:.1f} |",
            flush=True,
        )
    report = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "vllm": __import__("vllm").__version__,
        "rows": rows,
    }
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "fa_window_determinism.json").write_text(json.dumps(report, indent=1))
    nondeterministic = [r for r in rows if r["distinct_outputs"] > 1]
    print(f"cases with more than one distinct output: {len(nondeterministic)} of {len(rows)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
