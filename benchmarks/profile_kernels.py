"""Run one of our CUDA kernels a few times at benchmark size, for a profiler to attach.

    ncu --set full -k regex:_paged_attention_kernel --launch-skip 2 --launch-count 1 \\
        python benchmarks/profile_kernels.py decode-window

Cases (the sizes of ``bench_peer_attention.py`` / ``bench_dspark_kernels.py``):

decode-window  paged attention, batch 32 x 32k decode, window 2048 applied in-kernel
decode-full    paged attention, batch 32 x 32k decode, full table
block16        paged attention, batch 32 x 16-token non-causal blocks at 128k
mla            grouped sparse MLA, 64 requests x 8 tokens, 32k, W 2048, non-causal rows
mla-gluon      the Gluon sparse MLA kernel (Hopper) at the same size, no per-token pass
mla-gluon-noloads  the same without its KV copies after the first tiles (wrong result;
               the difference to mla-gluon is what the copies cost)
markov         Markov sampling, 64 requests x 8 steps, V 129280 (8 step kernels a call), T=1
markov-greedy  the same at T=0 (no noise: what a step costs for its bytes alone)

Each case calls its op ``--calls`` times (default 3: the first compiles), then
synchronises. It times nothing: the profiler's report is the output.
"""

from __future__ import annotations

import argparse
import os
import sys
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

CASES = (
    "decode-window",
    "decode-full",
    "block16",
    "mla",
    "mla-gluon",
    "mla-gluon-noloads",
    "markov",
    "markov-greedy",
)


def paged_case(batch: int, context: int, q_len: int, window):
    from bench_peer_attention import BLOCK, HKV, HQ, D

    gen = torch.Generator(device="cuda").manual_seed(0)
    blocks = context // BLOCK
    num_blocks = batch * blocks + 8
    key_cache = torch.randn(
        num_blocks, BLOCK, HKV, D, device="cuda", dtype=torch.bfloat16, generator=gen
    )
    value_cache = torch.randn_like(key_cache)
    table = (
        torch.randperm(num_blocks, device="cuda", generator=gen)[: batch * blocks]
        .view(batch, blocks)
        .to(torch.int32)
    )
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    qsl = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * q_len
    query = torch.randn(batch * q_len, HQ, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    return lambda: torch.ops.dspark.paged_attention(
        query, key_cache, value_cache, table, seq_lens, qsl, D**-0.5, q_len == 1, window_size=window
    )


def mla_case(kernel: str = "grouped"):
    from bench_dspark_kernels import mla_inputs

    from dspark_compile.kernels import (
        sparse_mla_gluon as gluon,
        sparse_mla_grouped_triton as grouped,
    )

    args = SimpleNamespace(
        requests=64, q_len=8, context=32768, window=2048, block_size=64, heads=16
    )
    query, kv_cache, index_sets, lora = mla_inputs(args)
    indices = index_sets["non-causal"]
    scale = (lora + 64) ** -0.5
    if kernel == "grouped":
        return lambda: grouped.grouped_sparse_mla_attention_triton(
            query, kv_cache, indices, scale, lora
        )
    if not gluon.HAVE_GLUON:
        raise SystemExit("this triton has no Gluon")
    return lambda: gluon._launch(
        query, kv_cache, indices, scale, mixed_pass=False, diag_no_loads=kernel == "gluon-noloads"
    )


def markov_case(temperature: float = 1.0):
    from dspark_compile.kernels.markov_sampling_triton import sample_sequential_triton
    from dspark_compile.models import DSparkMarkovHead

    torch.manual_seed(0)
    reqs, steps, vocab = 64, 8, 129280
    head = DSparkMarkovHead(vocab, 256).cuda().to(torch.bfloat16)
    base = torch.randn(reqs, steps, vocab, device="cuda", dtype=torch.bfloat16)
    anchors = torch.randint(0, vocab, (reqs,), device="cuda")
    seeds = torch.randint(-(2**62), 2**62, (reqs,), device="cuda")
    temps = torch.full((reqs,), temperature, device="cuda")
    return lambda: sample_sequential_triton(base, anchors, head, temps, seeds)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case", choices=CASES)
    parser.add_argument("--calls", type=int, default=3)
    args = parser.parse_args(argv)
    if args.calls < 1:
        parser.error(f"--calls {args.calls} is invalid: expected >= 1")
    if not torch.cuda.is_available():
        print("profile_kernels.py needs a CUDA GPU", file=sys.stderr)
        return 2
    import dspark_compile  # noqa: F401  (registers torch.ops.dspark)

    fn = {
        "decode-window": lambda: paged_case(32, 32768, 1, 2048),
        "decode-full": lambda: paged_case(32, 32768, 1, None),
        "block16": lambda: paged_case(32, 131072, 16, None),
        "mla": mla_case,
        "mla-gluon": lambda: mla_case("gluon"),
        "mla-gluon-noloads": lambda: mla_case("gluon-noloads"),
        "markov": markov_case,
        "markov-greedy": lambda: markov_case(0.0),
    }[args.case]()
    with torch.no_grad():
        for _ in range(args.calls):
            fn()
    torch.cuda.synchronize()
    print(f"{args.case}: {args.calls} calls done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
