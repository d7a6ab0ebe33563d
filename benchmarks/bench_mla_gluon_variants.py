"""The Gluon sparse MLA kernel's launch variants side by side, on one H200-size batch.

    python benchmarks/bench_mla_gluon_variants.py [--baseline OLD_MODULE.py] [--out DIR]

Inputs: ``bench_dspark_kernels.mla_inputs`` (64 requests x 8 tokens, 32k context,
W 2048, 16 heads, bf16 512+64), non-causal and causal index rows. Rows timed (CUDA
graph replay, ``do_bench`` median, L2 flushed): the op's launch (mixed groups folded
into the kernel), the flag + per-token-kernel launch, the per-token Triton kernel alone
(the ratio's denominator in issue 12), the kernel without its KV copies
(``diag_no_loads``: a wrong result, timed to price the copies), and, with
``--baseline``, the same launch of another version of ``sparse_mla_gluon.py`` (e.g.
``git show REV:dspark_compile/kernels/sparse_mla_gluon.py``). Every row but the
diagnostic is checked against the torch reference first. Writes ``gluon_variants.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_dspark_kernels import (
    bench_ms,
    graph_of,
    load_module_file,
    log,  # noqa: E402
    mla_inputs,
    rel_err,
)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--baseline", help="another sparse_mla_gluon.py to time beside")
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_mla_gluon_variants.py needs a CUDA GPU", file=sys.stderr)
        return 2
    import triton

    from dspark_compile.kernels import (
        sparse_mla as ref,
        sparse_mla_gluon as glu,
        sparse_mla_triton as per_token,
    )

    if not glu.HAVE_GLUON:
        print(f"triton {triton.__version__} has no Gluon", file=sys.stderr)
        return 2
    size = SimpleNamespace(
        requests=64, q_len=8, context=32768, window=2048, block_size=64, heads=16
    )
    query, kv_cache, index_sets, lora = mla_inputs(size)
    scale = (lora + 64) ** -0.5
    variants = {
        "op launch (mixed groups folded in)": lambda idx: glu._launch(
            query, kv_cache, idx, scale, fold_mixed=True
        ),
        "flag + per-token kernel": lambda idx: glu._launch(
            query, kv_cache, idx, scale, fold_mixed=False
        ),
        "per-token Triton kernel (issue 12's 'today's kernel')": lambda idx: (
            per_token.sparse_mla_attention_triton(query, kv_cache, idx, scale, lora)
        ),
        "kernel alone, no KV copies (diagnostic, wrong result)": lambda idx: glu._launch(
            query, kv_cache, idx, scale, fold_mixed=False, mixed_pass=False, diag_no_loads=True
        ),
    }
    if args.baseline:
        old = load_module_file(args.baseline, "gluon_baseline")
        variants["baseline file, its default launch"] = lambda idx: old._launch(
            query, kv_cache, idx, scale
        )
    # dspark_research lives in the checkout, beside benchmarks/ (not in the wheel)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from dspark_research.provenance import provenance

    results = {**provenance(), "baseline": args.baseline, "rows": []}
    for rows, idx in index_sets.items():
        want = ref.sparse_mla_attention_ref(query, kv_cache, idx, scale, lora)
        for name, fn in variants.items():
            got = fn(idx)
            err = rel_err(got, want)
            ok = "diagnostic" in name or err < 1e-2
            graph = graph_of(lambda: fn(idx))
            us = 1e3 * bench_ms(graph.replay)
            log(f"{rows:10s} {name:55s} {us:8.1f} us  rel err {err:.2e}  ok={ok}")
            results["rows"].append(
                {"rows": rows, "variant": name, "us": us, "rel_err": err, "ok": ok}
            )
            if not ok:
                print(f"FAILED: {rows} {name} rel err {err}", file=sys.stderr)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "gluon_variants.json"), "w") as f:
        json.dump(results, f, indent=1)
    return 0 if all(r["ok"] for r in results["rows"]) else 1


if __name__ == "__main__":
    sys.exit(main())
