"""Paged draft attention against what a user would pick instead, on one GPU, same run.

    python benchmarks/bench_peer_attention.py \
        [--cases 32x32768x1,32x131072x1,1x32768x1,32x131072x16]
        [--window 2048] [--out DIR] [--configs "default;ppsm=4;bn=32,stages=4;..."]
        [--flush write|read] [--layers 4]

Per case (batch x context x query tokens; Hq 32 / Hkv 8, D 128, bf16, b=16,
all requests at the same length; decode is q_len 1, a 16-token block is a
non-causal DFlash/DSpark block):

- ours, full: ``dspark.paged_attention`` over the whole paged cache;
- SDPA dense, full: ``F.scaled_dot_product_attention`` on a dense contiguous
  ``[B, Hkv, S, D]`` copy of the same KV, GQA packed as ``[B, Hkv, G*q_len, D]``
  queries (the read-bandwidth ceiling for this data);
- ours, windowed: fused window metadata + ``dspark.paged_attention`` on the
  windowed table (the draft KV window, W tokens + block alignment): two
  launches, the form the window pass emits;
- ours, windowed in-kernel: ``dspark.paged_attention(..., window_size=W)`` on
  the FULL table, the kernel applying the same window itself (one launch);
- FlexAttention, windowed: ``flex_attention`` (compiled) on the dense copy with
  a block mask that keeps the same ``[start, S)`` range;
- ours, windowed, per layer of an N-layer draft step (``--layers N``, default 4,
  0 or 1: off): one graph holding what a draft step with N attention layers
  launches (each layer has its own KV cache, all share the block table): the
  two-launch form (window metadata once, then N attentions) and the in-kernel
  form (N attentions); time / N. A one-call replay above also times the graph
  launch itself (an empty replay's ~4.5 us); a draft step pays that once, not
  per layer.

Each is checked against its partner (ours full vs SDPA, ours windowed vs Flex)
before timing. Times: CUDA-graph replays, median of ``triton.testing.do_bench``
(L2 flushed before every repetition by writing 256 MB; ``--flush read`` clears it
by reading instead, see ``graph_ms``; the run also reports an empty graph
replay's time, the fixed cost inside every figure). GB/s count each distinct KV byte once
(K and V of the tokens read); the windowed bound is those bytes at the SDPA-dense
rate of the largest case.

``--configs``: a launch sweep of our kernel, measured in the same run beside the
peers. Candidates are separated by ``;``; each is ``default`` (the heuristics,
as the op runs) or comma-separated ``key=value`` overrides of
``paged_attention_triton``'s launch knobs (``CONFIG_KEYS``: splits, bn, warps,
stages, ppsm = the earlier split rule's programs per SM, res = resident programs
per SM for the wave-filling split rule, min_tokens = least tokens per split,
exact = one tile per decode token, heads = KV head as the fastest grid axis). Every
candidate is first checked against the torch reference (``paged_attention_ref``, fp32)
on the full table, the windowed table and the full table with the in-kernel window; one
that misses (rel. err > 1e-2) or fails is reported and not timed. List ``default`` twice
to see the run's spread.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import torch

HQ, HKV, D, BLOCK = 32, 8, 128, 16
CONFIG_KEYS = {
    "splits": "num_splits",
    "bn": "block_n",
    "warps": "num_warps",
    "stages": "num_stages",
    "ppsm": "programs_per_sm",
    "res": "resident_per_sm",
    "min_tokens": "min_split_tokens",
    "exact": "exact_tiles",
    "heads": "heads_first",
}
BOOL_KNOBS = ("exact_tiles", "heads_first")
MAX_REL_ERR = 1e-2


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


FLUSH = {"mode": "write"}  # set from --flush in main()
_READ_FLUSH: list = []  # the read-flush scratch buffer, allocated once


def graph_ms(fn) -> float:
    """Median ms of one CUDA-graph replay of ``fn`` with L2 flushed before each.

    ``--flush write`` (default): ``triton.testing.do_bench``, which flushes by
    zeroing 256 MB, so L2 starts full of dirty lines that the timed kernel's
    reads evict (written back to HBM inside the timed region). ``--flush read``:
    events queued as do_bench queues them (10 warm-up replays, 60 timed), the L2
    cleared by summing a 512 MB buffer instead (clean lines, nothing to write back).
    """
    from triton.testing import do_bench

    from dspark_compile.tools.cuda_graphs import capture_cuda_graph

    graph, _ = capture_cuda_graph(fn)
    if FLUSH["mode"] == "write":
        return float(do_bench(graph.replay, warmup=10, rep=60, return_mode="median"))
    if not _READ_FLUSH:
        _READ_FLUSH.append(torch.randn(128 * 2**20, device="cuda"))  # 512 MB
    scratch = _READ_FLUSH[0]
    for _ in range(10):  # warm-up
        graph.replay()
    events = [
        (torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
        for _ in range(60)
    ]
    for start, end in events:  # queued like do_bench's reps
        scratch.sum()
        start.record()
        graph.replay()
        end.record()
    torch.cuda.synchronize()
    times = sorted(start.elapsed_time(end) for start, end in events)
    return float(times[len(times) // 2])


def empty_graph_us() -> float:
    """One replay of a graph holding a single 1-element kernel: the fixed cost
    (graph launch, events, flush aftermath) inside every time of this run."""
    x = torch.zeros(1, device="cuda")
    return graph_ms(lambda: x.add_(1.0)) * 1e3


def parse_configs(text: str) -> list[tuple[str, dict]]:
    """``"default;ppsm=4,bn=32"`` -> ``[("default", {}), ("ppsm=4,bn=32",
    {"programs_per_sm": 4, "block_n": 32})]`` (``CONFIG_KEYS``; ints, ``BOOL_KNOBS``
    as 0/1)."""
    configs = []
    for item in (part.strip() for part in text.split(";")):
        if not item:
            continue
        if item == "default":
            configs.append((item, {}))
            continue
        kwargs = {}
        for pair in item.split(","):
            key, sep, value = pair.partition("=")
            if not sep or key.strip() not in CONFIG_KEYS or not value.strip().isdigit():
                raise ValueError(
                    f"--configs entry {pair!r} is invalid: expected key=int with "
                    f"key one of {sorted(CONFIG_KEYS)}"
                )
            knob = CONFIG_KEYS[key.strip()]
            number = int(value)
            kwargs[knob] = bool(number) if knob in BOOL_KNOBS else number
        configs.append((item, kwargs))
    return configs


def rel_err(got, want) -> float:
    got, want = got.double(), want.double()
    return float((got - want).norm() / want.norm())


def run_case(
    batch: int,
    context: int,
    q_len: int,
    window: int,
    configs: list[tuple[str, dict]] = (),
    layers: int = 0,
) -> dict:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention

    from dspark_compile.kernels.window_metadata import window_metadata_triton

    gen = torch.Generator(device="cuda").manual_seed(context + batch + q_len)
    blocks = context // BLOCK
    num_blocks = batch * blocks + 8
    key_cache = torch.randn(
        num_blocks, BLOCK, HKV, D, device="cuda", dtype=torch.bfloat16, generator=gen
    )
    value_cache = torch.randn_like(key_cache)
    perm = torch.randperm(num_blocks, device="cuda", generator=gen)[: batch * blocks]
    table = perm.view(batch, blocks).to(torch.int32)
    seq_lens = torch.full((batch,), context, dtype=torch.int32, device="cuda")
    qsl = torch.arange(batch + 1, dtype=torch.int32, device="cuda") * q_len
    query = torch.randn(batch * q_len, HQ, D, device="cuda", dtype=torch.bfloat16, generator=gen)
    scale = D**-0.5
    causal = q_len == 1  # blocks are non-causal

    def dense(cache):  # [B, Hkv, S, D], contiguous
        return cache[table.long()].view(batch, context, HKV, D).permute(0, 2, 1, 3).contiguous()

    k_dense, v_dense = dense(key_cache), dense(value_cache)
    group = HQ // HKV
    q_packed = (
        query.view(batch, q_len, HKV, group, D)
        .permute(0, 2, 1, 3, 4)
        .reshape(batch, HKV, q_len * group, D)
    )
    q_flex = query.view(batch, q_len, HQ, D).transpose(1, 2)  # [B, Hq, q_len, D]
    start = max(context - window, 0) // BLOCK * BLOCK  # the window pass's start (K=0)

    def ours_full():
        return torch.ops.dspark.paged_attention(
            query, key_cache, value_cache, table, seq_lens, qsl, scale, causal
        )

    def ours_windowed():
        lens, _, win_table = window_metadata_triton(seq_lens, table, window, BLOCK)
        return torch.ops.dspark.paged_attention(
            query, key_cache, value_cache, win_table, lens, qsl, scale, causal
        )

    def ours_in_kernel():
        return torch.ops.dspark.paged_attention(
            query, key_cache, value_cache, table, seq_lens, qsl, scale, causal, window_size=window
        )

    def sdpa_full():
        return torch.nn.functional.scaled_dot_product_attention(
            q_packed, k_dense, v_dense, scale=scale
        )

    def unpack(out):  # SDPA layout -> [T, Hq, D]
        return (
            out.view(batch, HKV, q_len, group, D)
            .permute(0, 2, 1, 3, 4)
            .reshape(batch * q_len, HQ, D)
        )

    full_bytes = 2 * batch * context * HKV * D * 2
    win_bytes = 2 * batch * (context - start) * HKV * D * 2
    res = {
        "batch": batch,
        "context": context,
        "q_len": q_len,
        "window": window,
        "window_start": start,
        "full_MB": full_bytes / 1e6,
        "windowed_MB": win_bytes / 1e6,
    }
    res["err_full_vs_sdpa"] = rel_err(ours_full(), unpack(sdpa_full()))
    res["ours_full_us"] = graph_ms(ours_full) * 1e3
    res["sdpa_full_us"] = graph_ms(sdpa_full) * 1e3
    res["ours_windowed_us"] = graph_ms(ours_windowed) * 1e3
    res["err_in_kernel_vs_windowed"] = rel_err(ours_in_kernel(), ours_windowed())
    if not res["err_in_kernel_vs_windowed"] <= MAX_REL_ERR:
        raise AssertionError(f"in-kernel window: rel. err {res['err_in_kernel_vs_windowed']:.1e}")
    res["ours_in_kernel_us"] = graph_ms(ours_in_kernel) * 1e3
    log(
        f"  ours windowed in-kernel (one launch) {res['ours_in_kernel_us']:.1f} us "
        f"(err vs two-launch {res['err_in_kernel_vs_windowed']:.1e})"
    )
    log(
        f"case {batch}x{context}x{q_len}: ours full {res['ours_full_us']:.1f} us, SDPA dense "
        f"{res['sdpa_full_us']:.1f} us (err {res['err_full_vs_sdpa']:.1e}), ours windowed "
        f"{res['ours_windowed_us']:.1f} us"
    )
    if layers > 1:
        res.update(
            time_layers(
                layers,
                query,
                key_cache,
                value_cache,
                table,
                seq_lens,
                qsl,
                scale,
                causal,
                window,
                ours_windowed(),
                ours_in_kernel(),
            )
        )
    if configs:
        res["sweep"] = sweep_case(
            configs,
            query,
            key_cache,
            value_cache,
            table,
            seq_lens,
            qsl,
            scale,
            causal,
            window,
            start,
        )
    try:
        mask = create_block_mask(
            lambda b, h, q, kv: kv >= start, None, None, q_len, context, device="cuda"
        )
        flex = torch.compile(flex_attention, dynamic=False)

        def flex_windowed():
            return flex(q_flex, k_dense, v_dense, block_mask=mask, scale=scale, enable_gqa=True)

        got = flex_windowed().transpose(1, 2).reshape(batch * q_len, HQ, D)
        res["err_windowed_vs_flex"] = rel_err(ours_windowed(), got)
        res["flex_windowed_us"] = graph_ms(flex_windowed) * 1e3
        log(
            f"  flex windowed {res['flex_windowed_us']:.1f} us "
            f"(err {res['err_windowed_vs_flex']:.1e})"
        )
    except Exception as exc:  # report, as the reference run did on torch 2.11 at 128k
        res["flex_windowed_us"] = None
        res["flex_error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        log(f"  flex failed: {res['flex_error']}")
    del key_cache, value_cache, k_dense, v_dense
    torch.cuda.empty_cache()
    return res


def time_layers(
    layers,
    query,
    key_cache,
    value_cache,
    table_,
    seq_lens,
    qsl,
    scale,
    causal,
    window,
    want_windowed,
    want_in_kernel,
) -> dict:
    """Per-layer times of the windowed forms inside one N-layer graph (module
    docstring): layer 0 reads the case's caches, layers 1.. fresh random ones;
    layer 0's output must equal the one-call output bit for bit."""
    from dspark_compile.kernels.window_metadata import window_metadata_triton

    caches = [(key_cache, value_cache)] + [
        (torch.randn_like(key_cache), torch.randn_like(value_cache)) for _ in range(layers - 1)
    ]

    def attention(k, v, tbl, lens, **kw):
        return torch.ops.dspark.paged_attention(query, k, v, tbl, lens, qsl, scale, causal, **kw)

    def windowed_step():
        lens, _, win_table = window_metadata_triton(seq_lens, table_, window, BLOCK)
        return [attention(k, v, win_table, lens) for k, v in caches]

    def in_kernel_step():
        return [attention(k, v, table_, seq_lens, window_size=window) for k, v in caches]

    for name, step, want in (
        ("windowed", windowed_step, want_windowed),
        ("in_kernel", in_kernel_step, want_in_kernel),
    ):
        if not torch.equal(step()[0], want):
            raise AssertionError(
                f"{name}: layer 0 of the {layers}-layer step differs from the one-call output"
            )
    res = {
        "layers": layers,
        "windowed_per_layer_us": graph_ms(windowed_step) * 1e3 / layers,
        "in_kernel_per_layer_us": graph_ms(in_kernel_step) * 1e3 / layers,
    }
    log(
        f"  {layers}-layer step, per layer: windowed {res['windowed_per_layer_us']:.1f} us, "
        f"in-kernel {res['in_kernel_per_layer_us']:.1f} us"
    )
    del caches
    return res


def sweep_case(
    configs, query, key_cache, value_cache, table_, seq_lens, qsl, scale, causal, window, start
) -> list[dict]:
    """Each candidate launch on this case: checked against ``paged_attention_ref``
    (full table and windowed table), then timed like ``ours`` above."""
    import functools

    from dspark_compile.kernels.paged_attention import paged_attention_ref
    from dspark_compile.kernels.paged_attention_triton import choose_launch, paged_attention_triton
    from dspark_compile.kernels.window_metadata import window_metadata_triton

    batch = seq_lens.shape[0]
    kv_start = torch.full_like(seq_lens, start)
    ref_full = paged_attention_ref(
        query, key_cache, value_cache, table_, seq_lens, qsl, scale, causal
    )
    ref_win = paged_attention_ref(
        query, key_cache, value_cache, table_, seq_lens, qsl, scale, causal, kv_start=kv_start
    )
    win_lens, _, win_table = window_metadata_triton(seq_lens, table_, window, BLOCK)
    rows = []
    for label, kwargs in configs:
        row = {"config": label}
        full = functools.partial(
            paged_attention_triton,
            query,
            key_cache,
            value_cache,
            table_,
            seq_lens,
            qsl,
            scale,
            causal,
            **kwargs,
        )

        def windowed(kwargs=kwargs):
            lens, _, wtable = window_metadata_triton(seq_lens, table_, window, BLOCK)
            return paged_attention_triton(
                query, key_cache, value_cache, wtable, lens, qsl, scale, causal, **kwargs
            )

        in_kernel = functools.partial(full, window_size=window)
        try:
            for name, fn, width, ref, window_tokens in (
                ("full", full, table_.shape[1], ref_full, None),
                ("windowed", windowed, win_table.shape[1], ref_win, None),
                ("in_kernel", in_kernel, table_.shape[1], ref_win, window),
            ):
                cfg = choose_launch(
                    query.shape[0],
                    batch,
                    HKV,
                    HQ // HKV,
                    width,
                    BLOCK,
                    query.device,
                    window_tokens=window_tokens,
                    **kwargs,
                )
                row[f"{name}_launch"] = (
                    f"splits={cfg.num_splits} bn={cfg.block_n} "
                    f"warps={cfg.num_warps} stages={cfg.num_stages} "
                    f"exact={int(cfg.exact_tiles)} "
                    f"heads={int(cfg.heads_first)}"
                )
                err = rel_err(fn(), ref)
                row[f"err_{name}"] = err
                if not err <= MAX_REL_ERR:
                    raise AssertionError(f"{name}: rel. err {err:.1e} vs paged_attention_ref")
                row[f"{name}_us"] = graph_ms(fn) * 1e3
        except Exception as exc:  # a candidate that fails or is wrong is reported, not timed
            row["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
        log(
            f"  config {label}: full {row.get('full_us', float('nan')):.1f} us "
            f"[{row.get('full_launch')}], windowed {row.get('windowed_us', float('nan')):.1f} "
            f"us [{row.get('windowed_launch')}] {row.get('error', '')}"
        )
        rows.append(row)
        torch.cuda.empty_cache()
    return rows


def sweep_table(results: list[dict], ceiling: float) -> str:
    """Candidates x cases: full us (% of SDPA-dense bandwidth), windowed us (x bound)."""
    swept = [r for r in results if r.get("sweep")]
    if not swept:
        return ""
    headers = ["config"]
    for r in swept:
        case = f"{r['batch']}x{r['context'] // 1024}k q{r['q_len']}"
        headers += [
            f"{case} full us (of SDPA)",
            f"{case} windowed us (x bound)",
            f"{case} in-kernel us (x bound)",
        ]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for i, (label, _) in enumerate((row["config"], None) for row in swept[0]["sweep"]):
        cells = [f"{i}: {label}"]
        for r in swept:
            row = r["sweep"][i]
            if not all(f"{name}_us" in row for name in ("full", "windowed", "in_kernel")):
                cells += [row.get("error", "n/a"), "", ""]
                continue
            bound = r["windowed_MB"] / ceiling * 1e3
            cells += [
                f"{row['full_us']:.1f} ({r['sdpa_full_us'] / row['full_us']:.0%})",
                f"{row['windowed_us']:.1f} ({row['windowed_us'] / bound:.2f}x)",
                f"{row['in_kernel_us']:.1f} ({row['in_kernel_us'] / bound:.2f}x)",
            ]
        lines.append("| " + " | ".join(cells) + " |")
    launches = ["", "Launches chosen (full / windowed table):", ""]
    for r in swept:
        launches.append(
            f"- {r['batch']} x {r['context']}, q_len {r['q_len']}: "
            + "; ".join(
                f"{i}: {row.get('full_launch')} / {row.get('windowed_launch')}"
                for i, row in enumerate(r["sweep"])
            )
        )
    return (
        "\n## Launch sweep (ours; checked against paged_attention_ref first)\n\n"
        + "\n".join(lines + launches)
        + "\n"
    )


def log_compiled_kernels() -> None:
    """Registers, spills and shared memory of each compiled variant of our kernel
    (for the occupancy reading of a sweep); best effort across Triton versions."""
    from dspark_compile.kernels.paged_attention_triton import _paged_attention_kernel

    try:
        for caches in _paged_attention_kernel.device_caches.values():
            for key, kernel in caches[0].items():
                meta = kernel.metadata
                log(
                    f"compiled: regs {kernel.n_regs} spills {kernel.n_spills} shared "
                    f"{meta.shared} warps {meta.num_warps} stages {meta.num_stages} "
                    f"key {key}"
                )
    except Exception as exc:  # diagnostics only
        log(f"compiled-kernel listing unavailable: {exc!r}")


def table(results: list[dict]) -> str:
    ceiling = max(r["full_MB"] / r["sdpa_full_us"] for r in results) * 1e3  # GB/s
    headers = [
        "case",
        "ours full us (GB/s)",
        "SDPA dense full us (GB/s)",
        "ours / SDPA BW",
        "ours windowed us",
        "windowed bound us",
        "windowed / bound",
        "ours windowed in-kernel us (one launch)",
        "in-kernel / bound",
        "FlexAttention windowed us",
        "ours vs Flex",
        "per layer of an N-layer step: windowed / in-kernel us (x bound)",
    ]
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    for r in results:
        ours_bw = r["full_MB"] / r["ours_full_us"] * 1e3
        sdpa_bw = r["full_MB"] / r["sdpa_full_us"] * 1e3
        bound = r["windowed_MB"] / ceiling * 1e3
        flex = r.get("flex_windowed_us")
        lines.append(
            "| "
            + " | ".join(
                [
                    f"{r['batch']} x {r['context']}, q_len {r['q_len']}",
                    f"{r['ours_full_us']:.1f} ({ours_bw:.0f})",
                    f"{r['sdpa_full_us']:.1f} ({sdpa_bw:.0f})",
                    f"{ours_bw / sdpa_bw:.0%}",
                    f"{r['ours_windowed_us']:.1f}",
                    f"{bound:.1f}",
                    f"{r['ours_windowed_us'] / bound:.2f}x",
                    f"{r['ours_in_kernel_us']:.1f}" if "ours_in_kernel_us" in r else "n/a",
                    f"{r['ours_in_kernel_us'] / bound:.2f}x" if "ours_in_kernel_us" in r else "n/a",
                    f"{flex:.1f}" if flex else r.get("flex_error", "n/a"),
                    f"{flex / min(r['ours_windowed_us'], r.get('ours_in_kernel_us', 1e30)):.2f}x "
                    "faster (our best)"
                    if flex
                    else "n/a",
                    (
                        f"N={r['layers']}: {r['windowed_per_layer_us']:.1f} "
                        f"({r['windowed_per_layer_us'] / bound:.2f}x) / "
                        f"{r['in_kernel_per_layer_us']:.1f} "
                        f"({r['in_kernel_per_layer_us'] / bound:.2f}x)"
                    )
                    if "layers" in r
                    else "n/a",
                ]
            )
            + " |"
        )
    return (
        f"Read ceiling (SDPA dense, best case): {ceiling:.0f} GB/s.\n\n"
        + "\n".join(lines)
        + "\n"
        + sweep_table(results, ceiling)
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", default="32x32768x1,1x32768x1,32x131072x16,32x131072x1")
    parser.add_argument("--window", type=int, default=2048)
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    parser.add_argument(
        "--flush",
        choices=("write", "read"),
        default="write",
        help="L2 flush before each timed replay: 'write' = do_bench's 256 MB "
        "zeroing (dirty lines written back during the timed kernel), "
        "'read' = summing 512 MB (clean lines); see graph_ms",
    )
    parser.add_argument(
        "--configs",
        default="",
        help="launch candidates for our kernel, ';'-separated (see the module "
        "docstring); e.g. 'default;ppsm=4;bn=32,stages=4;default'",
    )
    parser.add_argument(
        "--layers",
        type=int,
        default=4,
        help="also time the windowed forms per layer of an N-layer draft step "
        "(one graph, one KV cache per layer; 0 or 1: off)",
    )
    args = parser.parse_args(argv)
    if args.layers < 0:
        parser.error(f"--layers={args.layers} is invalid: expected an int >= 0")
    configs = parse_configs(args.configs)
    FLUSH["mode"] = args.flush
    if not torch.cuda.is_available():
        print("needs a CUDA GPU", file=sys.stderr)
        return 2

    import dspark_compile  # noqa: F401

    # dspark_research lives in the checkout, beside benchmarks/ (not in the wheel)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from dspark_research.provenance import provenance

    env = provenance()
    env["flush"] = args.flush
    env["layers"] = args.layers
    env["empty_graph_us"] = empty_graph_us()
    log(f"L2 flush by {args.flush}; an empty graph replay measures {env['empty_graph_us']:.1f} us")
    results = []
    for case in args.cases.split(","):
        batch, context, q_len = (int(v) for v in case.split("x"))
        try:
            results.append(run_case(batch, context, q_len, args.window, configs, args.layers))
        except Exception as exc:
            log(f"case {case} failed: {exc!r}")
        text = (
            f"# Peer attention, {env['date']}, {env['device']}, torch {env['torch']}, "
            f"triton {env['triton']}\n\nHq {HQ} / Hkv {HKV}, D {D}, bf16, b={BLOCK}, "
            f"W={args.window}; CUDA-graph replay, L2 flushed by {args.flush} (an empty "
            f"graph replay: {env['empty_graph_us']:.1f} us), KV bytes counted once; "
            f"last column: one graph per {args.layers}-layer draft step (one KV cache "
            f"per layer), time / {args.layers}.\n\n"
            + (table(results) if results else "no case ran\n")
        )
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "peer_attention.md"), "w") as handle:
            handle.write(text)
        with open(os.path.join(args.out, "peer_attention.json"), "w") as handle:
            json.dump({"environment": env, "results": results}, handle, indent=2)
    if configs:
        log_compiled_kernels()
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
