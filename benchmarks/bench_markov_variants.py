"""The fused Markov sampler's launches side by side, and its sampling kernels apart from the head.

    python benchmarks/bench_markov_variants.py [--baseline OLD_MODULE.py ...]
        [--launches "BLOCK_V,warps[,blocks_per_program];..."]
        [--head-launches "BLOCK_V,warps,tiles_per_program,stages;..."] [--out DIR]

Size: 64 requests x 8 steps, V = 129280, head rank 256, bf16, ``torch.randn`` logits
(``bench_dspark_kernels.py``'s Markov section). Rows, all CUDA-graph replays, ``do_bench``
median with L2 flushed: the reference under ``torch.compile(mode="reduce-overhead")``;
the Markov head alone (8 x embedding + GEMM); then, for each launch of this checkout's
``markov_sampling_triton.py`` and, for each ``--baseline`` (repeatable), the default
launch of another version of it
(e.g. ``git show REV:dspark_compile/kernels/markov_sampling_triton.py``):
the fused sampler (head included), its sampling kernels alone at T=1 (a head that returns
a fixed bias) and greedy alone (T=0). Every fused row's tokens are first compared with
``sample_sequential`` for bit equality (T=1 and mixed temperatures). Then each
``--head-launches`` launch of ``sample_sequential_head_triton`` (the head's bias computed
in the kernel), fused at T=1 and greedy, after its tokens are compared the same way and
its bias with ``markov_head(prev)`` bit for bit (the anchors and 16 random ``prev``).
Writes ``markov_variants.json``; exits 1 if any tokens differ.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from bench_dspark_kernels import (
    bench_ms,
    graph_of,
    load_module_file,
    log,  # noqa: E402
    parse_markov_launches,
)


class FixedBias(nn.Module):
    """A head that returns one stored ``[R, V]`` bias whatever ``prev`` is."""

    def __init__(self, bias: torch.Tensor) -> None:
        super().__init__()
        self.value = bias

    def forward(self, prev: torch.Tensor) -> torch.Tensor:
        return self.value


def parse_head_launches(text: str) -> list[dict]:
    """``'BLOCK_V,warps,tiles_per_program,stages[,filter];...'`` -> keyword dicts for
    ``sample_sequential_head_triton`` (a 0 field: the default; filter 0 or 1)."""
    names = ("block_v", "num_warps", "tiles_per_program", "num_stages", "filter_upper")
    launches = []
    for item in filter(None, text.split(";")):
        fields = item.split(",")
        if len(fields) not in (4, 5) or not all(f.strip().isdigit() for f in fields):
            raise ValueError(
                f"--head-launches entry {item!r} is invalid: expected "
                f"BLOCK_V,warps,tiles_per_program,stages[,filter]"
            )
        launch = {name: int(f) for name, f in zip(names[:4], fields) if int(f)}
        if len(fields) == 5:
            launch["filter_upper"] = bool(int(fields[4]))
        launches.append(launch)
    return launches


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--baseline",
        action="append",
        default=[],
        help="another markov_sampling_triton.py to time beside (repeatable)",
    )
    parser.add_argument(
        "--launches",
        default="2048,8",
        help="BLOCK_V,warps[,blocks_per_program[,stages]];... of this "
        "checkout's kernel (0: the default)",
    )
    parser.add_argument(
        "--head-launches",
        default="",
        help="BLOCK_V,warps,tiles_per_program,stages[,filter];... of "
        "sample_sequential_head_triton (0: the default)",
    )
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_markov_variants.py needs a CUDA GPU", file=sys.stderr)
        return 2

    from dspark_compile.kernels import (
        markov_head_sampling_triton as in_kernel,
        markov_sampling_triton as current,
    )
    from dspark_compile.models import DSparkMarkovHead, sample_sequential

    launches = parse_markov_launches(args.launches)
    torch.manual_seed(0)
    reqs, steps, vocab, rank = 64, 8, 129280, 256
    head = DSparkMarkovHead(vocab, rank).cuda().to(torch.bfloat16)
    base = torch.randn(reqs, steps, vocab, device="cuda", dtype=torch.bfloat16)
    anchors = torch.randint(0, vocab, (reqs,), device="cuda")
    seeds = torch.randint(-(2**62), 2**62, (reqs,), device="cuda")
    positions = torch.randint(0, 2**20, (reqs,), device="cuda")
    ones = torch.ones(reqs, device="cuda")
    mixed = torch.where(torch.arange(reqs, device="cuda") % 3 == 0, 0.0, 0.8)
    fixed = FixedBias(head(anchors).detach())
    # dspark_research lives in the checkout, beside benchmarks/ (not in the wheel)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from dspark_research.provenance import provenance

    results = {**provenance(), "baseline": args.baseline, "rows": []}

    def record(name: str, us: float, **extra) -> None:
        log(f"{name:72s} {us:8.1f} us {extra or ''}")
        results["rows"].append({"variant": name, "us": us, **extra})

    kernels = [
        (
            f"this checkout, BLOCK_V={b} warps={w} blocks/program={p or 'default'} "
            f"stages={st or 'default'}",
            lambda *a, b=b, w=w, p=p, st=st, **k: current.sample_sequential_triton(
                *a,
                block_v=b,
                num_warps=w,
                blocks_per_program=p,
                **({} if st is None else {"num_stages": st}),
                **k,
            ),
        )
        for b, w, p, st in launches
    ]
    for index, path in enumerate(args.baseline):
        old = load_module_file(path, f"markov_baseline_{index}")
        kernels.append(
            (f"{os.path.basename(path)}, its default launch", old.sample_sequential_triton)
        )
    with torch.no_grad():
        compiled = torch.compile(
            lambda: sample_sequential(base, anchors, head, ones, seeds, positions),
            mode="reduce-overhead",
        )
        for _ in range(3):
            compiled()
        record("reference, torch.compile reduce-overhead", 1e3 * bench_ms(compiled))
        record(
            "Markov head alone (8 x embedding + GEMM)",
            1e3 * bench_ms(graph_of(lambda: [head(anchors) for _ in range(steps)]).replay),
        )
        differ = 0
        for name, fn in kernels:
            mismatches = {}
            for label, temp in (("T=1", ones), ("mixed", mixed)):
                want = sample_sequential(base, anchors, head, temp, seeds, positions)
                got = fn(base, anchors, head, temp, seeds, positions)
                mismatches[label] = int((got != want).sum())
            differ += sum(mismatches.values())
            fused = 1e3 * bench_ms(
                graph_of(lambda: fn(base, anchors, head, ones, seeds, positions)).replay
            )
            sampled = 1e3 * bench_ms(
                graph_of(lambda: fn(base, anchors, fixed, ones, seeds, positions)).replay
            )
            greedy = 1e3 * bench_ms(
                graph_of(lambda: fn(base, anchors, fixed, 0.0, seeds, positions)).replay
            )
            record(f"{name}: fused", fused, token_mismatches=mismatches)
            record(f"{name}: sampling kernels alone, T=1", sampled)
            record(f"{name}: greedy kernels alone", greedy)
        prevs = [anchors] + [torch.randint(0, vocab, (reqs,), device="cuda") for _ in range(16)]
        for knobs in parse_head_launches(args.head_launches):
            name = f"head in kernel, {knobs or 'default launch'}"
            try:
                bias_differ = sum(
                    int(
                        (
                            in_kernel.markov_head_bias_triton(
                                head, prev, **{k: v for k, v in knobs.items() if k == "block_v"}
                            )
                            != head(prev)
                        ).sum()
                    )
                    for prev in prevs
                )
                mismatches = {}
                for label, temp in (("greedy", 0.0), ("T=1", ones), ("mixed", mixed)):
                    want = sample_sequential(base, anchors, head, temp, seeds, positions)
                    got = in_kernel.sample_sequential_head_triton(
                        base, anchors, head, temp, seeds, positions, **knobs
                    )
                    mismatches[label] = int((got != want).sum())
                differ += sum(mismatches.values())
                rescans = torch.zeros(1, dtype=torch.int32, device="cuda")
                in_kernel.sample_sequential_head_triton(
                    base, anchors, head, ones, seeds, positions, rescans=rescans, **knobs
                )
                record(
                    f"{name}: fused, T=1",
                    1e3
                    * bench_ms(
                        graph_of(
                            lambda: in_kernel.sample_sequential_head_triton(
                                base, anchors, head, ones, seeds, positions, **knobs
                            )
                        ).replay
                    ),
                    token_mismatches=mismatches,
                    bias_elements_differ=bias_differ,
                    bias_elements_compared=len(prevs) * reqs * vocab,
                    rescanned_row_programs_T1=int(rescans),
                )
                record(
                    f"{name}: fused, greedy",
                    1e3
                    * bench_ms(
                        graph_of(
                            lambda: in_kernel.sample_sequential_head_triton(
                                base, anchors, head, 0.0, seeds, positions, **knobs
                            )
                        ).replay
                    ),
                )
            except Exception as error:  # e.g. a launch past the SM's shared memory
                record(f"{name}: FAILED {type(error).__name__}: {str(error)[:200]}", float("nan"))
                differ += 1
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "markov_variants.json"), "w") as f:
        json.dump(results, f, indent=1)
    if differ:
        print(f"FAILED: {differ} tokens differ from sample_sequential", file=sys.stderr)
    return 1 if differ else 0


if __name__ == "__main__":
    sys.exit(main())
