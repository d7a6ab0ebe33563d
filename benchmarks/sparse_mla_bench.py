"""Time the DSpark sparse-MLA pieces on a GPU: Triton kernels vs torch references.

    python benchmarks/sparse_mla_bench.py [--requests 64] [--q-len 8] [--context 32768]
        [--window 2048] [--heads 16] [--json out.json]

Rows: non-causal index generation, sparse MLA attention (bf16, kv_lora_rank 512
+ rope 64), and Markov sequential sampling eager vs CUDA-graph replay. Each
time is the median of ``triton.testing.do_bench`` (ms). Also reports the max
error of each Triton kernel against its reference on the benchmark inputs.
"""

from __future__ import annotations

import argparse
import json
import sys

import torch


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--q-len", type=int, default=8, help="draft block length per request")
    parser.add_argument("--context", type=int, default=32768, help="context tokens per request")
    parser.add_argument("--window", type=int, default=2048, help="draft_window_size W")
    parser.add_argument("--block-size", type=int, default=64)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=129280)
    parser.add_argument("--markov-rank", type=int, default=256)
    parser.add_argument("--json", help="also write the results here")
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2

    from triton.testing import do_bench

    import dspark_compile  # noqa: F401
    from dspark_compile.kernels import sparse_mla as ref
    from dspark_compile.kernels import sparse_mla_triton as tri
    from dspark_compile.models import DSparkMarkovHead, make_paged_batch, sample_sequential

    torch.manual_seed(0)
    seq_lens = [args.context + args.q_len - 13 * i for i in range(args.requests)]
    batch = make_paged_batch(seq_lens, [args.q_len] * args.requests, args.block_size,
                             device="cuda")
    width = ref.noncausal_width(args.window, args.q_len)
    index_args = (batch.seq_lens, batch.query_start_loc, batch.block_table, batch.slot_mapping,
                  args.block_size, args.window, width)
    results = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
               "config": vars(args), "width": width, "tokens": batch.num_tokens}

    want_idx = ref.noncausal_swa_indices_ref(*index_args)
    got_idx = tri.noncausal_swa_indices_triton(*index_args)
    results["index_equal"] = bool((want_idx == got_idx).all())
    results["index_ms"] = {"torch_ref": do_bench(lambda: ref.noncausal_swa_indices_ref(*index_args)),
                           "triton": do_bench(lambda: tri.noncausal_swa_indices_triton(*index_args))}

    lora, rope = 512, 64
    query = torch.randn(batch.num_tokens, args.heads, lora + rope, device="cuda",
                        dtype=torch.bfloat16)
    kv_cache = torch.randn(batch.num_blocks, args.block_size, lora + rope, device="cuda",
                           dtype=torch.bfloat16)
    scale = (lora + rope) ** -0.5
    want = ref.sparse_mla_attention_ref(query, kv_cache, got_idx, scale, lora)
    got = tri.sparse_mla_attention_triton(query, kv_cache, got_idx, scale, lora)
    results["mla_max_abs_err"] = (got.float() - want.float()).abs().max().item()
    results["mla_ms"] = {
        "torch_ref": do_bench(lambda: ref.sparse_mla_attention_ref(query, kv_cache, got_idx,
                                                                    scale, lora)),
        "triton": do_bench(lambda: tri.sparse_mla_attention_triton(query, kv_cache, got_idx,
                                                                    scale, lora))}
    read_bytes = int((got_idx >= 0).sum()) * (lora + rope) * 2
    results["mla_triton_gbps"] = read_bytes / results["mla_ms"]["triton"] / 1e6

    head = DSparkMarkovHead(args.vocab, args.markov_rank).cuda().to(torch.bfloat16)
    base = torch.randn(args.requests, args.q_len, args.vocab, device="cuda", dtype=torch.bfloat16)
    anchors = torch.randint(0, args.vocab, (args.requests,), device="cuda")
    seeds = torch.arange(args.requests, device="cuda")
    temps = torch.ones(args.requests, device="cuda")
    with torch.no_grad():
        def step():
            return sample_sequential(base, anchors, head, temps, seeds)

        eager = step()
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            step()
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured = step()
        graph.replay()
        torch.cuda.synchronize()
        results["sampling_graph_equal"] = bool(torch.equal(eager, captured))
        results["sampling_ms"] = {"eager": do_bench(step), "cuda_graph": do_bench(graph.replay)}
        compiled_step = torch.compile(step, mode="reduce-overhead")
        for _ in range(3):
            compiled_out = compiled_step()
        results["sampling_compiled_equal"] = bool(torch.equal(compiled_out, eager))
        results["sampling_ms"]["compiled_reduce_overhead"] = do_bench(compiled_step)

    print(f"{results['device']}, torch {results['torch']}: {args.requests} requests x "
          f"{args.q_len} draft tokens, context {args.context}, W={args.window}, width={width}, "
          f"b={args.block_size}, heads={args.heads}")
    print(f"{'piece':<28} | {'torch ref ms':>12} | {'triton/graph ms':>15} | speedup")
    for name, key, fast in (("non-causal indices", "index_ms", "triton"),
                            ("sparse MLA attention bf16", "mla_ms", "triton"),
                            ("Markov sampling (8 steps)", "sampling_ms", "cuda_graph")):
        slow_key = "eager" if key == "sampling_ms" else "torch_ref"
        slow, quick = results[key][slow_key], results[key][fast]
        print(f"{name:<28} | {slow:>12.4f} | {quick:>15.4f} | {slow / quick:6.1f}x")
    print(f"Markov sampling, torch.compile(mode='reduce-overhead'): "
          f"{results['sampling_ms']['compiled_reduce_overhead']:.4f} ms "
          f"(equal to eager: {results['sampling_compiled_equal']})")
    print(f"index equal: {results['index_equal']}; MLA max abs err (bf16): "
          f"{results['mla_max_abs_err']:.2e}; MLA Triton reads {results['mla_triton_gbps']:.0f} GB/s; "
          f"sampling graph == eager: {results['sampling_graph_equal']}")
    if args.json:
        with open(args.json, "w") as handle:
            json.dump(results, handle, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
