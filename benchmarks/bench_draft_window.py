"""Draft KV sliding window on a CUDA GPU: correctness at real sizes, fused code, speed.

    python benchmarks/bench_draft_window.py
        [--sections copy,correct,inductor,attn,bw,meta,e2e,sinks]
        [--out DIR] [--quick] [--sink-size 16,64]

Sections (each prints progress, then a table; results go to ``--out`` or
``$OUT`` as ``results.md`` + ``results.json`` + the captured Inductor code):

copy      H200 copy bandwidth (device-to-device, bytes read + written)
correct   every kernel vs its torch reference at real sizes (b=16, batch 1-64,
          context 1k-128k, W in {512, 2048, 2000}, q_len 1 and 8/16 blocks)
inductor  Inductor's code for a compiled draft step (backend dspark): the window
          arithmetic + gather as ONE Triton kernel shared by every layer
attn      draft attention time vs context (1k..128k), batch 1 and 32, W=2048:
          full vs windowed (fused window metadata + attention), same run
bw        achieved KV bandwidth of full decode vs the copy bandwidth, plus a
          small launch-config sweep
meta      fused window-metadata kernel vs the eager torch reference,
          256 requests x 8192-block tables
e2e       whole compiled DFlash reference draft step, mode="reduce-overhead"
          (CUDA graphs): correct while seq_lens change, no host sync inside
          the step, full vs windowed step time at 32k and 128k
sinks     windowed decode with attention sinks (``--sink-size``, tokens; default
          16,64 = 1 and 4 blocks), batch 32, W=2048, 32k and 128k: checked
          against the reference on the full table, then timed beside S = 0
          (decode form: fused metadata + attention; per-token causal form:
          ``causal_window_metadata`` + attention with ``kv_offset``/``sink_size``)

``main(argv)`` is the entry point (``python -m dspark_research bench`` calls it).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import sys
import time
from typing import Callable, Optional, Sequence

import torch

ALL_SECTIONS = ("copy", "correct", "inductor", "attn", "bw", "meta", "e2e", "sinks")
BLOCK = 16  # kernel block size b
HQ, HKV, HEAD_DIM = 32, 8, 128  # Llama-8B-like draft attention (GQA 4)
DTYPE = torch.bfloat16
DEV = "cuda"
SCALE, BATCH_CAP, SMOKE = 1, 1 << 30, False  # --smoke-cpu: tiny sizes, Triton interpreter


def C(n: int) -> int:
    """A context length (scaled down in --smoke-cpu)."""
    return max(1, n // SCALE)


def B(n: int) -> int:
    """A batch size (capped in --smoke-cpu)."""
    return min(n, BATCH_CAP)


def sync() -> None:
    if DEV == "cuda":
        torch.cuda.synchronize()


def free() -> None:
    if DEV == "cuda":
        torch.cuda.empty_cache()


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


class Results:
    """Collects rows per section and rewrites results.json / results.md after each."""

    def __init__(self, out_dir: Optional[str]) -> None:
        self.out_dir = out_dir
        self.data: dict = {"meta": _environment(), "sections": {}}
        self.md: list[str] = []

    def add(self, section: str, payload, markdown: str) -> None:
        self.data["sections"][section] = payload
        self.md.append(markdown)
        print(markdown, flush=True)
        self.flush()

    def write_file(self, name: str, text: str) -> None:
        if self.out_dir:
            with open(os.path.join(self.out_dir, name), "w") as f:
                f.write(text)

    def flush(self) -> None:
        if not self.out_dir:
            return
        self.write_file("results.json", json.dumps(self.data, indent=1, default=str))
        meta = self.data["meta"]
        head = (
            f"# Draft KV window on {meta['device']}\n\n"
            f"Date {meta['date']}; torch {meta['torch']}, triton {meta['triton']}, "
            f"CUDA {meta['cuda']}, Python {meta['python']}. Draft attention: Hq={HQ}, "
            f"Hkv={HKV}, D={HEAD_DIM}, {str(DTYPE).replace('torch.', '')}, b={BLOCK}.\n"
        )
        self.write_file("results.md", head + "\n" + "\n".join(self.md))


def _environment() -> dict:
    # dspark_research lives in the checkout, beside benchmarks/ (not in the wheel)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from dspark_research.provenance import provenance

    return {
        **provenance(),
        "sms": (
            torch.cuda.get_device_properties(0).multi_processor_count
            if torch.cuda.is_available()
            else None
        ),
    }


def md_table(headers: Sequence[str], rows: Sequence[Sequence]) -> str:
    def fmt(v):
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(fmt(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


# ----------------------------------------------------------------------------- data


class Paged:
    """A paged batch on the GPU: each request's blocks are a random slice of a
    random permutation of the pool; table columns past a request's blocks hold
    random (garbage) block ids, as in a real runner."""

    def __init__(
        self,
        seq_lens: Sequence[int],
        q_lens: Sequence[int],
        width: Optional[int] = None,
        pool_blocks: Optional[int] = None,
        seed: int = 0,
        device: Optional[str] = None,
    ) -> None:
        device = device or DEV
        gen = torch.Generator(device=device).manual_seed(seed)
        need = [-(-s // BLOCK) for s in seq_lens]
        self.width = width or max(need + [1])
        self.num_blocks = pool_blocks or (sum(need) + 8)
        assert sum(need) <= self.num_blocks and max(need + [0]) <= self.width
        perm = torch.randperm(self.num_blocks, generator=gen, device=device).to(torch.int32)
        table = torch.randint(
            0,
            self.num_blocks,
            (len(seq_lens), self.width),
            generator=gen,
            device=device,
            dtype=torch.int32,
        )
        offset = 0
        for i, n in enumerate(need):
            table[i, :n] = perm[offset : offset + n]
            offset += n
        self.block_table = table
        self.seq_lens = torch.tensor(list(seq_lens), dtype=torch.int32, device=device)
        locs = [0]
        for q in q_lens:
            locs.append(locs[-1] + q)
        self.query_start_loc = torch.tensor(locs, dtype=torch.int32, device=device)
        self.q_lens = list(q_lens)
        self.num_tokens = locs[-1]
        self.device = device

    def with_seq_lens(self, seq_lens: Sequence[int]) -> Paged:
        """Same table and query layout, new lengths (must fit the request's blocks)."""
        other = object.__new__(Paged)
        other.__dict__.update(self.__dict__)
        other.seq_lens = torch.tensor(list(seq_lens), dtype=torch.int32, device=self.device)
        return other

    def positions_and_slots(self) -> tuple[torch.Tensor, torch.Tensor]:
        q_lens = torch.tensor(self.q_lens, device=self.device)
        req = torch.repeat_interleave(torch.arange(len(self.q_lens), device=self.device), q_lens)
        within = torch.arange(self.num_tokens, device=self.device) - self.query_start_loc[req]
        pos = (self.seq_lens[req] - q_lens[req] + within).long()
        blocks = self.block_table[req, pos // BLOCK].long()
        return pos, blocks * BLOCK + pos % BLOCK


def kv_cache(num_blocks: int, dtype=DTYPE, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator(device=DEV).manual_seed(seed)
    shape = (num_blocks, BLOCK, HKV, HEAD_DIM)
    return (
        torch.randn(shape, generator=gen, device=DEV, dtype=dtype),
        torch.randn(shape, generator=gen, device=DEV, dtype=dtype),
    )


def bench_ms(fn: Callable[[], object], graph: bool) -> float:
    """Median ms: replays of a captured CUDA graph (GPU time) or back-to-back
    launches with events (includes host launch gaps)."""
    import triton.testing

    if DEV != "cuda":
        begin = time.perf_counter()
        fn()
        return (time.perf_counter() - begin) * 1e3
    if graph:
        return float(triton.testing.do_bench_cudagraph(fn, rep=50, return_mode="median"))
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def attention(q, kc, vc, table, lens, qsl, causal):
    return torch.ops.dspark.paged_attention(q, kc, vc, table, lens, qsl, HEAD_DIM**-0.5, causal)


def windowed_attention(q, kc, vc, batch: Paged, window: int, causal: bool):
    from dspark_compile.kernels.window_metadata import window_metadata_triton

    lens, _, table = window_metadata_triton(batch.seq_lens, batch.block_table, window, BLOCK)
    return attention(q, kc, vc, table, lens, batch.query_start_loc, causal)


# ----------------------------------------------------------------------------- sections


def section_copy(res: Results) -> float:
    log("copy bandwidth")
    n = C(2 * 1024**3 // 2)  # 2 GiB of bf16
    src = torch.randn(n, device=DEV, dtype=torch.bfloat16)
    dst = torch.empty_like(src)
    ms = bench_ms(lambda: dst.copy_(src), graph=False)
    gbps = 2 * src.numel() * src.element_size() / ms / 1e6
    del src, dst
    free()
    res.add(
        "copy",
        {"bytes_moved": 4 * n, "ms": ms, "GBps": gbps},
        f"## Copy bandwidth\n\n{2 * n / 2**30:.3g} GiB device-to-device copy: {ms:.3f} ms, "
        f"{gbps:.0f} GB/s (bytes read + written).\n",
    )
    return gbps


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> tuple[float, float, bool]:
    nan = bool(torch.isnan(got).any())
    diff = got.double() - want.double()
    rel = float(diff.norm() / want.double().norm().clamp_min(1e-30))
    return rel, float(diff.abs().max()), nan


def section_correct(res: Results, quick: bool) -> bool:
    from dspark_compile.arithmetic.window import (
        compute_window,
        gather_window_block_table,
        max_window_blocks,
    )
    from dspark_compile.kernels.paged_attention import paged_attention_ref
    from dspark_compile.kernels.paged_attention_triton import paged_attention_triton
    from dspark_compile.kernels.window_metadata import window_metadata_triton

    g = torch.Generator().manual_seed(1)

    def rand_lens(n, lo, hi):
        return torch.randint(C(lo), C(hi) + 1, (B(n),), generator=g).tolist()

    def lens(*values):
        return [C(v) for v in values]

    def qs(q, n):
        return [q] * B(n)

    cases = [  # name, seq_lens, q_lens, causal, windows, dtype
        (
            "decode b64 1k-8k",
            rand_lens(64, 1024, 8192),
            qs(1, 64),
            True,
            [None, 512, 2048, 2000],
            DTYPE,
        ),
        (
            "decode b4 to 128k",
            lens(131072, 100003, 65536) + [1],
            qs(1, 4),
            True,
            [None, 2048, 2000],
            DTYPE,
        ),
        (
            "dflash16 b16 8k-32k",
            rand_lens(16, 8192, 32768),
            qs(16, 16),
            False,
            [None, 2048, 512],
            DTYPE,
        ),
        (
            "causal8 b32 1k-16k",
            rand_lens(31, 1024, 16384) + lens(3000),
            qs(8, 31) + [0],
            True,
            [None, 2000],
            DTYPE,
        ),
        ("dflash16 b1 128k", lens(131072), [16], False, [None, 2000], DTYPE),
        ("decode fp16 b8 4k", rand_lens(8, 3000, 5000), qs(1, 8), True, [512], torch.float16),
    ]
    if quick:
        cases = [cases[0], cases[2]]
    rows, ok = [], True
    for ci, (name, seq_lens, q_lens, causal, windows, dtype) in enumerate(cases):
        log(f"correct: {name}")
        seq_lens, q_lens = seq_lens[:BATCH_CAP], q_lens[:BATCH_CAP]
        q_lens = [min(q, s) for q, s in zip(q_lens, seq_lens)]
        windows = [w if w is None else C(w) for w in windows]
        batch = Paged(seq_lens, q_lens, seed=ci)
        kc, vc = kv_cache(batch.num_blocks, dtype, seed=ci)
        q = torch.randn(batch.num_tokens, HQ, HEAD_DIM, device=DEV, dtype=dtype)
        q32, kc32, vc32 = q.float(), kc.float(), vc.float()
        for window in windows:
            if window is None:
                lens, table, kv_start, meta_ok = batch.seq_lens, batch.block_table, None, True
            else:
                cols = max_window_blocks(window, BLOCK)
                buf = torch.full((len(seq_lens) + 3, cols), -7, dtype=torch.int32, device=DEV)
                lens, start, table = window_metadata_triton(
                    batch.seq_lens, batch.block_table, window, BLOCK, out_table=buf[:-3]
                )
                bounds = compute_window(batch.seq_lens, window, BLOCK)
                want_table = gather_window_block_table(
                    batch.block_table, bounds.start_block, bounds.needed, cols
                )
                meta_ok = (
                    torch.equal(lens, bounds.windowed_len)
                    and torch.equal(start, bounds.start)
                    and torch.equal(table, want_table)
                    and bool((buf[-3:] == -7).all())
                )
                kv_start = bounds.start
            out = torch.full_like(q, float("nan"))
            got = paged_attention_triton(
                q, kc, vc, table, lens, batch.query_start_loc, HEAD_DIM**-0.5, causal, out=out
            )
            # reference: fp32 math on the FULL table, masked to [start, seq_len)
            want = paged_attention_ref(
                q32,
                kc32,
                vc32,
                batch.block_table,
                batch.seq_lens,
                batch.query_start_loc,
                HEAD_DIM**-0.5,
                causal,
                kv_start=kv_start,
            )
            rel, max_abs, nan = _relative_error(got, want)
            passed = meta_ok and not nan and rel < 1e-2
            ok &= passed
            rows.append(
                [
                    name,
                    "full" if window is None else window,
                    len(seq_lens),
                    max(seq_lens),
                    max(q_lens),
                    "causal" if causal else "non-causal",
                    str(dtype).replace("torch.", ""),
                    rel,
                    max_abs,
                    nan,
                    meta_ok,
                    "PASS" if passed else "FAIL",
                ]
            )
        del kc, vc, kc32, vc32, q, q32
        free()
    headers = [
        "case",
        "W",
        "batch",
        "max ctx",
        "q_len",
        "mask",
        "dtype",
        "rel err",
        "max abs err",
        "NaN",
        "window meta exact",
        "result",
    ]
    res.add(
        "correct",
        {"headers": headers, "rows": rows, "all_pass": ok},
        "## 1. Correctness at real sizes\n\nTriton kernels vs the torch references "
        "(attention: fp32 reference on the full table masked to the window; window "
        "metadata: exact equality, poisoned buffer rows untouched). Outputs poisoned "
        "with NaN before each run; pass = rel err (||out-ref||/||ref||) < 1e-2, "
        "no NaN.\n\n" + md_table(headers, rows),
    )
    return ok


def _draft(cfg_kwargs: dict, seed: int = 0):
    from dspark_compile.models import DFlashReferenceDraft, DraftModelConfig

    cfg = DraftModelConfig(**cfg_kwargs)
    with torch.device(DEV):
        model = DFlashReferenceDraft(cfg, seed=seed)
    return model.to(DTYPE).eval(), cfg


def _compile(model, **options):
    import dspark_compile

    backend = functools.partial(dspark_compile.dspark_backend, options=options)
    return torch.compile(model, backend=backend, dynamic=False)


def _draft_args(model, cfg, batch: Paged, caches, seed=0):
    gen = torch.Generator(device=DEV).manual_seed(seed)
    hidden = torch.randn(batch.num_tokens, cfg.hidden_size, generator=gen, device=DEV, dtype=DTYPE)
    pos, slots = batch.positions_and_slots()
    return (
        hidden,
        pos,
        [k for k, _ in caches],
        [v for _, v in caches],
        batch.block_table,
        batch.seq_lens,
        batch.query_start_loc,
        slots,
    )


def _split_args(text: str) -> list[str]:
    """Top-level comma split of a call's argument text."""
    args, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
        else:
            cur += ch
    return args + ([cur.strip()] if cur.strip() else [])


def _buffer_name(arg: str) -> str:
    """``reinterpret_tensor(buf3, ...)`` / ``buf3`` -> ``buf3``."""
    m = re.match(r"(?:reinterpret_tensor\()?\s*(\w+)", arg)
    return m.group(1) if m else arg


def analyse_window_kernels(code: str) -> dict:
    """Which generated kernels produce the windowed (seq_lens, block_table) that the
    attention calls read, and how often each is launched."""
    call_body = code[code.index("def call(") :]
    attention = re.findall(r"torch\.ops\.dspark\.paged_attention\.default\((.*)\)", call_body)
    tables = {_buffer_name(_split_args(c)[3]) for c in attention}
    lens = {_buffer_name(_split_args(c)[4]) for c in attention}
    launches = re.findall(r"^\s*(\w+)\.run\((.*)\)$", call_body, re.M)
    producers = {}
    for kernel, args in launches:
        names = {_buffer_name(a) for a in _split_args(args)}
        hit = names & (tables | lens)
        if hit:
            producers.setdefault(kernel, {"launches": 0, "outputs": set()})
            producers[kernel]["launches"] += 1
            producers[kernel]["outputs"] |= hit
    sources = {}
    for kernel in producers:
        m = re.search(rf"{kernel} = async_compile\.triton\('{kernel}', '''(.*?)'''", code, re.S)
        sources[kernel] = m.group(1) if m else "(source not found)"
    one = (
        len(producers) == 1
        and next(iter(producers.values()))["launches"] == 1
        and next(iter(producers.values()))["outputs"] == tables | lens
    )
    return {
        "attention_calls": len(attention),
        "distinct_tables": len(tables),
        "distinct_lens": len(lens),
        "producers": {
            k: {"launches": v["launches"], "outputs": sorted(v["outputs"])}
            for k, v in producers.items()
        },
        "one_kernel_for_all_layers": one,
        "sources": sources,
        "call_lines": [
            ln
            for ln in call_body.splitlines()
            if any(k in ln for k in producers) or "paged_attention" in ln
        ],
    }


def section_inductor(res: Results) -> bool:
    from torch._inductor.utils import run_and_get_code

    log("inductor: compiling a 3-layer draft with backend dspark (W=2048)")
    model, cfg = _draft(
        dict(
            hidden_size=1024,
            num_layers=3,
            num_heads=HQ,
            num_kv_heads=HKV,
            head_dim=HEAD_DIM,
            intermediate_size=2048,
            causal=False,
        )
    )
    batch = Paged([C(v) for v in (5000, 3000, 9000, 2100)], [16] * 4)
    caches = [kv_cache(batch.num_blocks, seed=i) for i in range(3)]
    args = _draft_args(model, cfg, batch, caches)
    variants = {"default": {}, "combo_kernels": {"combo_kernels": True}}
    summary, ok_any, excerpt = {}, False, []
    for name, inductor_config in variants.items():
        torch._dynamo.reset()
        compiled = _compile(
            model, draft_window_size=C(2048), method="dflash", inductor_config=inductor_config
        )
        with torch.no_grad():
            _, codes = run_and_get_code(compiled, *args)
        info = analyse_window_kernels(codes[0])
        summary[name] = {k: v for k, v in info.items() if k != "sources"}
        ok_any |= info["one_kernel_for_all_layers"]
        excerpt.append(
            f"#### inductor_config={inductor_config} -> "
            f"one_kernel_for_all_layers={info['one_kernel_for_all_layers']}\n"
        )
        excerpt.append("# launches in call():\n" + "\n".join(info["call_lines"]) + "\n")
        for kernel, src in info["sources"].items():
            excerpt.append(f"# ---- {kernel}\n{src}\n")
        if name == "default" and info["one_kernel_for_all_layers"]:
            break
    res.write_file("inductor_window_kernel.txt", "\n".join(excerpt))
    rows = [
        [
            name,
            s["attention_calls"],
            s["distinct_tables"],
            s["distinct_lens"],
            ", ".join(f"{k} x{v['launches']}" for k, v in s["producers"].items()),
            s["one_kernel_for_all_layers"],
        ]
        for name, s in summary.items()
    ]
    headers = [
        "inductor config",
        "attention calls",
        "distinct tables read",
        "distinct seq_lens read",
        "kernels producing them (launches)",
        "ONE kernel",
    ]
    res.add(
        "inductor",
        {"variants": summary},
        "## 2. Inductor code for a compiled draft step (backend dspark, W=2048)\n\n"
        "3-layer DFlash reference draft, bf16, CUDA. Kernels that write the windowed "
        "block table / seq_lens every attention call reads (source in "
        "`inductor_window_kernel.txt`).\n\n" + md_table(headers, rows),
    )
    return ok_any


def section_attn(res: Results, quick: bool) -> None:
    window = C(2048)
    contexts = [C(c) for c in ([1024, 8192, 32768, 131072] if not quick else [1024, 32768])]
    pool = Paged([C(131072)] * B(32), [1] * B(32))
    kc, vc = kv_cache(pool.num_blocks)
    rows = []
    for batch_size in (1, B(32)):
        for q_len, causal in ((1, True), (16, False)):
            for ctx in contexts:
                lens = [max(ctx - 7 * i, q_len) for i in range(batch_size)]
                batch = Paged(
                    lens, [q_len] * batch_size, pool_blocks=pool.num_blocks, seed=ctx + batch_size
                )
                q = torch.randn(batch.num_tokens, HQ, HEAD_DIM, device=DEV, dtype=DTYPE)
                full = functools.partial(
                    attention,
                    q,
                    kc,
                    vc,
                    batch.block_table,
                    batch.seq_lens,
                    batch.query_start_loc,
                    causal,
                )
                win = functools.partial(windowed_attention, q, kc, vc, batch, window, causal)
                full_ms, win_ms = bench_ms(full, graph=True), bench_ms(win, graph=True)
                rows.append([batch_size, q_len, ctx, full_ms * 1e3, win_ms * 1e3, full_ms / win_ms])
                log(
                    f"attn b={batch_size} q={q_len} ctx={ctx}: full {full_ms * 1e3:.1f} us, "
                    f"windowed {win_ms * 1e3:.1f} us"
                )
    del kc, vc
    free()
    headers = ["batch", "q_len", "context", "full us", "windowed us", "full / windowed"]
    res.add(
        "attn",
        {"window": window, "headers": headers, "rows": rows},
        f"## 3. Draft attention time vs context (one layer, W={window})\n\n"
        "CUDA-graph replay medians (GPU time). Windowed = fused window-metadata "
        "kernel + attention over the windowed table. q_len 1 = causal decode, "
        "q_len 16 = non-causal DFlash block. Same run, same KV pool (random "
        "block placement).\n\n" + md_table(headers, rows),
    )


def section_bw(res: Results, copy_gbps: Optional[float], quick: bool) -> None:
    from dspark_compile.kernels.paged_attention_triton import choose_launch, paged_attention_triton

    if copy_gbps is None:
        copy_gbps = section_copy(res)
    contexts = [C(c) for c in ([32768, 131072] if not quick else [32768])]
    rows, sweep = [], []
    for batch_size in (1, B(32)):
        for ctx in contexts:
            batch = Paged([ctx] * batch_size, [1] * batch_size, seed=ctx)
            kc, vc = kv_cache(batch.num_blocks)
            q = torch.randn(batch.num_tokens, HQ, HEAD_DIM, device=DEV, dtype=DTYPE)
            kv_bytes = 2 * batch_size * ctx * HKV * HEAD_DIM * kc.element_size()
            run = functools.partial(
                paged_attention_triton,
                q,
                kc,
                vc,
                batch.block_table,
                batch.seq_lens,
                batch.query_start_loc,
                HEAD_DIM**-0.5,
                True,
            )
            ms = bench_ms(run, graph=True)
            cfg = choose_launch(
                batch.num_tokens,
                batch_size,
                HKV,
                HQ // HKV,
                batch.block_table.shape[1],
                BLOCK,
                q.device,
            )
            gbps = kv_bytes / ms / 1e6
            rows.append(
                [
                    batch_size,
                    ctx,
                    kv_bytes / 2**30,
                    ms * 1e3,
                    gbps,
                    gbps / copy_gbps,
                    f"splits={cfg.num_splits} BLOCK_N={cfg.block_n} warps={cfg.num_warps} "
                    f"stages={cfg.num_stages}",
                ]
            )
            log(
                f"bw b={batch_size} ctx={ctx}: {ms * 1e3:.1f} us, {gbps:.0f} GB/s "
                f"({gbps / copy_gbps:.0%} of copy)"
            )
            if batch_size == B(32) and ctx == contexts[-1]:
                for block_n, warps, stages, split_mult in (
                    (32, 4, 3, 1),
                    (64, 4, 2, 1),
                    (64, 4, 4, 1),
                    (64, 8, 3, 1),
                    (128, 8, 3, 1),
                    (128, 4, 2, 1),
                    (64, 4, 3, 4),
                    (64, 4, 3, 0.25),
                ):
                    splits = max(1, int(cfg.num_splits * split_mult))
                    try:
                        t = bench_ms(
                            functools.partial(
                                run,
                                num_splits=splits,
                                block_n=block_n,
                                num_warps=warps,
                                num_stages=stages,
                            ),
                            graph=True,
                        )
                        g = kv_bytes / t / 1e6
                        sweep.append([block_n, warps, stages, splits, t * 1e3, g, g / copy_gbps])
                    except Exception as exc:  # a config that does not compile is reported
                        sweep.append([block_n, warps, stages, splits, "error", str(exc)[:60], ""])
                    log(f"sweep {sweep[-1]}")
            del kc, vc, q
            free()
    headers = ["batch", "context", "KV GiB", "us", "GB/s", "of copy BW", "launch"]
    sweep_headers = ["BLOCK_N", "warps", "stages", "splits", "us", "GB/s", "of copy BW"]
    res.add(
        "bw",
        {
            "copy_GBps": copy_gbps,
            "headers": headers,
            "rows": rows,
            "sweep_headers": sweep_headers,
            "sweep": sweep,
        },
        "## 4. Paged attention bandwidth (full decode, causal, q_len 1)\n\n"
        f"KV bytes read (K+V of every context token) / time, vs copy bandwidth "
        f"{copy_gbps:.0f} GB/s measured in this run. Default launch heuristic:\n\n"
        + md_table(headers, rows)
        + "\nLaunch sweep at batch 32, longest context:\n\n"
        + md_table(sweep_headers, sweep),
    )


def section_meta(res: Results) -> None:
    from dspark_compile.runtime.sliding_window import SlidingWindowAdapter

    num_reqs, width, window = B(256), C(8192), C(2048)
    gen = torch.Generator(device=DEV).manual_seed(5)
    seq_lens = torch.randint(
        1, width * BLOCK, (num_reqs,), generator=gen, device=DEV, dtype=torch.int32
    )
    table = torch.randint(0, 10**6, (num_reqs, width), generator=gen, device=DEV, dtype=torch.int32)
    fused = SlidingWindowAdapter(window, BLOCK, num_reqs, device=DEV, fused=True)
    eager = SlidingWindowAdapter(window, BLOCK, num_reqs, device=DEV, fused=False)
    a, b = fused.apply(seq_lens, table), eager.apply(seq_lens, table)
    exact = (
        torch.equal(a.block_table, b.block_table)
        and torch.equal(a.seq_lens, b.seq_lens)
        and torch.equal(a.start, b.start)
    )
    rows = []
    for graph in (False, True):
        f_ms = bench_ms(lambda: fused.apply(seq_lens, table), graph)
        e_ms = bench_ms(lambda: eager.apply(seq_lens, table), graph)
        rows.append(
            [
                "CUDA graph replay (GPU time)" if graph else "eager launches (host incl.)",
                e_ms * 1e3,
                f_ms * 1e3,
                e_ms / f_ms,
            ]
        )
    launches = (
        _count_kernels(lambda: fused.apply(seq_lens, table)),
        _count_kernels(lambda: eager.apply(seq_lens, table)),
    )
    headers = ["timing", "eager torch us", "fused Triton us", "eager / fused"]
    res.add(
        "meta",
        {
            "num_reqs": num_reqs,
            "width": width,
            "window": window,
            "exact": exact,
            "kernels_fused": launches[0],
            "kernels_eager": launches[1],
            "headers": headers,
            "rows": rows,
        },
        f"## 5. Window metadata: fused kernel vs eager torch reference\n\n"
        f"{num_reqs} requests x {width}-block tables, W={window}, b={BLOCK}; "
        f"`SlidingWindowAdapter.apply` with fused=True vs fused=False. Outputs identical: "
        f"{exact}. GPU kernels per apply: fused {launches[0]}, eager {launches[1]}.\n\n"
        + md_table(headers, rows),
    )


def section_sinks(res: Results, sink_sizes: Sequence[int]) -> bool:
    """Windowed decode with attention sinks beside S = 0 (see the module docstring)."""
    from dspark_compile.arithmetic.window import causal_window_metadata
    from dspark_compile.kernels.paged_attention import paged_attention_ref
    from dspark_compile.kernels.window_metadata import window_metadata_triton

    window, batch_size = C(2048), B(32)
    contexts = [C(32768), C(131072)]
    pool = Paged([contexts[-1]] * batch_size, [1] * batch_size)
    kc, vc = kv_cache(pool.num_blocks, seed=4)
    scale = HEAD_DIM**-0.5
    rows, ok = [], True
    for ctx in contexts:
        lens = [max(ctx - 7 * i, 1) for i in range(batch_size)]
        batch = Paged(lens, [1] * batch_size, pool_blocks=pool.num_blocks, seed=ctx + 1)
        q = torch.randn(batch.num_tokens, HQ, HEAD_DIM, device=DEV, dtype=DTYPE)
        qsl = batch.query_start_loc
        for sink in [0] + [s for s in sink_sizes if s]:

            def decode_form(sink=sink):
                wlens, _, table = window_metadata_triton(
                    batch.seq_lens, batch.block_table, window, BLOCK, sink_size=sink
                )
                return torch.ops.dspark.paged_attention(q, kc, vc, table, wlens, qsl, scale, True)

            def per_token_form(sink=sink):
                wlens, table, offset = causal_window_metadata(
                    batch.seq_lens,
                    batch.block_table,
                    qsl,
                    window,
                    BLOCK,
                    max_query_len=batch.num_tokens,
                    sink_size=sink,
                )
                return torch.ops.dspark.paged_attention(
                    q, kc, vc, table, wlens, qsl, scale, True, offset, window, 0, sink
                )

            want = paged_attention_ref(
                q,
                kc,
                vc,
                batch.block_table,
                batch.seq_lens,
                qsl,
                scale,
                True,
                window_size=window,
                sink_size=sink,
            ).float()
            errs = [_relative_error(form().float(), want) for form in (decode_form, per_token_form)]
            passed = all(not nan and rel < 1e-2 for rel, _, nan in errs)
            ok &= passed
            times = [bench_ms(form, graph=True) for form in (decode_form, per_token_form)]
            rows.append(
                [
                    ctx,
                    sink,
                    -(-sink // BLOCK),
                    errs[0][0],
                    errs[1][0],
                    times[0] * 1e3,
                    times[1] * 1e3,
                    "PASS" if passed else "FAIL",
                ]
            )
            log(
                f"sinks ctx={ctx} S={sink}: decode {times[0] * 1e3:.1f} us, per-token "
                f"{times[1] * 1e3:.1f} us, rel err {errs[0][0]:.1e}/{errs[1][0]:.1e}"
            )
        del q
    del kc, vc
    free()
    headers = [
        "context",
        "S tokens",
        "sink blocks",
        "rel err decode form",
        "rel err per-token form",
        "decode form us",
        "per-token form us",
        "result",
    ]
    res.add(
        "sinks",
        {
            "window": window,
            "batch": batch_size,
            "sink_sizes": list(sink_sizes),
            "headers": headers,
            "rows": rows,
            "all_pass": ok,
        },
        f"## 7. Windowed decode with attention sinks (batch {batch_size}, W={window}, "
        f"b={BLOCK})\n\nOne layer, causal decode (q_len 1). Decode form: fused "
        "window-metadata kernel (sink blocks in front of the window) + attention over "
        "the windowed table; per-token form (what the compiled causal path runs): "
        "`causal_window_metadata` + attention with `kv_offset`/`window_size`/"
        "`sink_size`. Both checked against `paged_attention_ref` on the FULL table "
        "with the same W and S (pass: rel err < 1e-2), then timed as CUDA-graph "
        "replay medians (GPU time).\n\n" + md_table(headers, rows),
    )
    return ok


def _count_kernels(fn) -> int:
    from torch.profiler import ProfilerActivity, profile

    if DEV != "cuda":
        return -1
    fn()
    sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        sync()
    return sum(1 for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA)


def section_e2e(res: Results, quick: bool) -> bool:
    from dspark_compile.testing.oracles import windowed_attention_ref

    window, num_reqs, q_len, layers = C(2048), B(8), 16, 4
    hidden, inter = (64, 96) if SMOKE else (4096, 11008)
    log(f"e2e: {layers}-layer DFlash draft, batch {num_reqs}, q_len {q_len}, bf16")
    model, cfg = _draft(
        dict(
            hidden_size=hidden,
            num_layers=layers,
            num_heads=HQ,
            num_kv_heads=HKV,
            head_dim=HEAD_DIM,
            intermediate_size=inter,
            causal=False,
        )
    )
    max_ctx = C(131072)
    contexts = {
        "32k": [C(32768) - 37 * i for i in range(num_reqs)],
        "128k": [max_ctx - 37 * i for i in range(num_reqs)],
        "32k+1": [C(32769) - 53 * i for i in range(num_reqs)],
        "100k": [C(100000) + 11 * i for i in range(num_reqs)],
    }
    base = Paged(contexts["128k"], [q_len] * num_reqs, width=max_ctx // BLOCK + 1, seed=3)
    caches = [kv_cache(base.num_blocks, seed=10 + i) for i in range(layers)]
    for k, v in caches:
        torch._dynamo.mark_static_address(k)
        torch._dynamo.mark_static_address(v)
    from torch._dynamo.utils import counters

    rows, timing, ok, full_out = [], [], True, {}
    for name, options in (
        ("full", {}),
        ("windowed", {"draft_window_size": window, "method": "dflash"}),
    ):
        torch._dynamo.reset()
        counters.clear()
        compiled = _compile(model, mode="reduce-overhead", **options)
        ref_fn = windowed_attention_ref(window if options else None)
        t0 = time.time()
        with torch.no_grad():
            for _ in range(3):  # warm up + record the CUDA graph
                torch.compiler.cudagraph_mark_step_begin()
                compiled(*_draft_args(model, cfg, base.with_seq_lens(contexts["32k"]), caches))
        sync()
        log(
            f"e2e {name}: compiled + recorded in {time.time() - t0:.1f} s; "
            f"cudagraph skips: {counters['inductor'].get('cudagraph_skips', 0)}"
        )
        for ctx_name in ("128k", "32k+1", "100k", "32k"):
            args = _draft_args(
                model, cfg, base.with_seq_lens(contexts[ctx_name]), caches, seed=len(ctx_name)
            )
            sync()
            sync_error = ""
            with torch.no_grad():
                torch.compiler.cudagraph_mark_step_begin()
                if DEV == "cuda":
                    torch.cuda.set_sync_debug_mode("error")
                try:
                    got = compiled(*args)
                except RuntimeError as exc:
                    sync_error = str(exc)[:120]
                    got = None
                finally:
                    if DEV == "cuda":
                        torch.cuda.set_sync_debug_mode("default")
                got = None if got is None else got.clone()
                model.attention_override = ref_fn
                try:
                    want = model(*args)
                finally:
                    model.attention_override = None
            if got is None:
                rel, nan, effect = float("nan"), True, float("nan")
            else:
                rel, _, nan = _relative_error(got.float(), want.float())
                if not options:
                    full_out[ctx_name] = got
                effect = (
                    _relative_error(got.float(), full_out[ctx_name].float())[0]
                    if options and ctx_name in full_out
                    else 0.0
                )
            passed = not sync_error and not nan and rel < 2e-2
            ok &= passed
            rows.append(
                [
                    name,
                    ctx_name,
                    max(contexts[ctx_name]),
                    rel,
                    effect,
                    nan,
                    sync_error or "none",
                    "PASS" if passed else "FAIL",
                ]
            )
            log(f"e2e {name} {ctx_name}: rel {rel:.2e} sync_error={sync_error!r}")
        for ctx_name in ("32k", "128k"):
            args = _draft_args(model, cfg, base.with_seq_lens(contexts[ctx_name]), caches)

            def step():
                torch.compiler.cudagraph_mark_step_begin()
                with torch.no_grad():
                    return compiled(*args)

            timing.append((name, ctx_name, bench_ms(step, graph=False)))
            log(f"e2e {name} {ctx_name}: {timing[-1][2]:.3f} ms")
        skips = counters["inductor"].get("cudagraph_skips", 0)
        ok &= skips == 0 or DEV != "cuda"
        rows.append([name, f"cudagraph skips: {skips}", "", "", "", "", "", ""])
        del compiled
        torch._dynamo.reset()
    by = {(n, c): ms for n, c, ms in timing}
    trows = [
        [c, by[("full", c)], by[("windowed", c)], by[("full", c)] / by[("windowed", c)]]
        for c in ("32k", "128k")
    ]
    headers = [
        "variant",
        "contexts",
        "max ctx",
        "rel err vs eager ref",
        "rel diff vs full output",
        "NaN",
        "host sync inside step",
        "result",
    ]
    theaders = ["context", "full step ms", "windowed step ms", "full / windowed"]
    res.add(
        "e2e",
        {
            "layers": layers,
            "batch": num_reqs,
            "q_len": q_len,
            "window": window,
            "headers": headers,
            "rows": rows,
            "timing_headers": theaders,
            "timing": trows,
            "all_pass": ok,
        },
        f'## 6. Whole compiled draft step, mode="reduce-overhead" (CUDA graphs)\n\n'
        f"{layers}-layer DFlash reference draft (hidden {hidden}, MLP {inter}, Hq={HQ}, "
        f"Hkv={HKV}, D={HEAD_DIM}, bf16), batch {num_reqs} x q_len {q_len} "
        f"(non-causal), W={window}, one compiled graph per variant (block table "
        f"{max_ctx // BLOCK + 1} columns wide, KV caches static addresses). Each "
        "step below replays the graph with NEW seq_lens/positions/slots under "
        "`torch.cuda.set_sync_debug_mode('error')`, compared with the eager model "
        "using the torch reference attention (masked on the full table).\n\n"
        + md_table(headers, rows)
        + "\nStep time (median of back-to-back replays, host "
        "included):\n\n" + md_table(theaders, trows),
    )
    return ok


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--sections",
        default=",".join(ALL_SECTIONS),
        help=f"comma-separated subset of {', '.join(ALL_SECTIONS)}",
    )
    parser.add_argument(
        "--out",
        default=os.environ.get("OUT"),
        help="directory for results.md/results.json (default: $OUT)",
    )
    parser.add_argument("--quick", action="store_true", help="fewer sizes (smoke test)")
    parser.add_argument(
        "--sink-size",
        default="16,64",
        help="comma-separated attention-sink sizes in tokens for the sinks "
        "section (default 16,64: 1 and 4 blocks of 16)",
    )
    parser.add_argument(
        "--smoke-cpu",
        action="store_true",
        help="tiny sizes on the CPU (Triton interpreter): checks the script only",
    )
    args = parser.parse_args(argv)
    global DEV, SCALE, BATCH_CAP, SMOKE, HQ, HKV, HEAD_DIM
    if args.smoke_cpu:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        DEV, SCALE, BATCH_CAP, SMOKE, HQ, HKV, HEAD_DIM = "cpu", 256, 3, True, 4, 2, 16
    sections = [s.strip() for s in args.sections.split(",") if s.strip()]
    try:
        sink_sizes = [int(s) for s in args.sink_size.split(",") if s.strip()]
    except ValueError:
        sink_sizes = [-1]
    if any(s < 0 for s in sink_sizes):
        parser.error(
            f"--sink-size {args.sink_size!r} is invalid: expected comma-separated "
            "non-negative ints (tokens)"
        )
    unknown = sorted(set(sections) - set(ALL_SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {unknown}: expected some of {', '.join(ALL_SECTIONS)}")
    if DEV == "cuda" and not torch.cuda.is_available():
        print("bench_draft_window needs a CUDA GPU (or --smoke-cpu)", file=sys.stderr)
        return 2
    import dspark_compile  # noqa: F401  (registers the ops and their CUDA kernels)

    if args.out:
        os.makedirs(args.out, exist_ok=True)
    res = Results(args.out)
    log(f"environment: {res.data['meta']}")
    status, copy_gbps = {}, None
    for section in sections:
        t0 = time.time()
        try:
            if section == "copy":
                copy_gbps = section_copy(res)
            elif section == "correct":
                status[section] = section_correct(res, args.quick)
            elif section == "inductor":
                status[section] = section_inductor(res)
            elif section == "attn":
                section_attn(res, args.quick)
            elif section == "bw":
                section_bw(res, copy_gbps, args.quick)
            elif section == "meta":
                section_meta(res)
            elif section == "e2e":
                status[section] = section_e2e(res, args.quick)
            elif section == "sinks":
                status[section] = section_sinks(res, sink_sizes)
        except Exception as exc:  # report and go on with the other sections
            import traceback

            traceback.print_exc()
            status[section] = False
            res.add(
                section + "_error",
                {"error": repr(exc)},
                f"## {section}: ERROR\n\n```\n{traceback.format_exc()[-3000:]}\n```\n",
            )
        log(f"section {section} done in {time.time() - t0:.1f} s")
    res.data["status"] = status
    res.flush()
    log(f"status: {status}")
    return 0 if all(status.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
