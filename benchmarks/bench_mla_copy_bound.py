"""How fast can a Hopper program gather the sparse MLA op's KV tiles, with no arithmetic?

    python benchmarks/bench_mla_copy_bound.py [--out DIR]

Times (CUDA graph replay, ``do_bench`` median, L2 flushed) a Gluon kernel that does
only the Gluon attention kernel's KV copies: per tile of 64 slots, the ``[64, 512]``
and ``[64, 64]`` pieces of each row gathered with ``cp.async`` through the index row
into a ring of shared-memory stages (``sparse_mla_gluon._issue_kv_tile``, the op's own
copy), the slots loaded one tile ahead, nothing computed. The column sums of the
last tile's latent part are stored per program, so the copies have a consumer, and
are checked against torch. Program mappings:

- ``op``: as the attention kernel, one program per 4 tokens, i.e. each request's row
  is gathered by 2 programs (128 programs at the benchmark size);
- ``once``: each row gathered once, by 2 programs that split its tiles (128 programs);
- ``request``: one program per request, whole row (64 programs).

Beside it: the same walk with TMA instead (tile t = 64 consecutive rows from the slot of
its first listed column, nine ``[64, 64]`` boxes on one mbarrier per stage: whole
tiles, so 2112 rows per request where 2056 are listed (2.7% more bytes than counted),
some of them the wrong rows where a tile crosses a block: a bound, not a gather); a
plain Triton kernel with the ``op`` mapping that loads the tiles into registers
(``tl.load``, 1-3 pipeline stages) and keeps an elementwise running maximum;
and the read ceiling's own kernel on a contiguous buffer of the op's distinct KV bytes
(what a plain stream of 151.6 MB takes, launch, ramp-up and tail included).

Inputs: ``bench_dspark_kernels.mla_inputs`` (64 requests x 8 tokens, 32k context, W
2048, bf16 512+64 latent), the non-causal rows; and the same rows with every request
pointing at request 0's slots (2.4 MB of KV, L2-resident: the gather rate from L2).
First in each case, the attention kernel itself and its no-copies diagnostic, in the
same process; every row but the diagnostic is checked against torch first. Bandwidth:
from HBM, distinct KV bytes (each row once); from L2, the bytes the programs move out
of L2 (twice per row for the ``op`` mapping). Writes ``mla_copy_bound.json``. Needs an
sm_90 GPU and Gluon.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from types import SimpleNamespace

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from bench_dspark_kernels import (
    _read_kernel,
    bench_ms,
    graph_of,
    log,  # noqa: E402
    mla_inputs,
    rel_err,
    section_ceiling,
)

from dspark_compile.kernels import (
    sparse_mla as ref,  # noqa: E402
    sparse_mla_gluon as glu,  # noqa: E402
)

if glu.HAVE_GLUON:
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import async_copy, mbarrier, tma
    from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

    _cta_barrier = glu._cta_barrier

    @gluon.jit
    def _kv_copies_only_kernel(
        kv_ptr,
        kv_stride,
        idx_ptr,
        idx_stride,
        out_ptr,
        width,
        ROW_STEP: gl.constexpr,
        SPLIT: gl.constexpr,
        LORA: gl.constexpr,
        ROPE: gl.constexpr,
        BLOCK_N: gl.constexpr,
        STAGES: gl.constexpr,
    ):
        # program p gathers part p % SPLIT of the tiles of token (p // SPLIT) * ROW_STEP's row
        NW: gl.constexpr = gl.num_warps()
        dtype: gl.constexpr = kv_ptr.dtype.element_ty
        pid = gl.program_id(0)
        lat_l: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [NW, 1], [1, 0])
        rope_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
        sl_lat: gl.constexpr = gl.SliceLayout(1, lat_l)
        sl_rope: gl.constexpr = gl.SliceLayout(1, rope_l)
        kl_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, LORA], dtype)
        kr_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, ROPE], dtype)
        kl_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, LORA], kl_sl)
        kr_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, ROPE], kr_sl)
        row = idx_ptr + ((pid // SPLIT) * ROW_STEP).to(gl.int64) * idx_stride
        n_tiles = gl.cdiv(width, BLOCK_N)
        per_part = gl.cdiv(n_tiles, SPLIT)
        first = (pid % SPLIT) * per_part
        last = gl.minimum(first + per_part, n_tiles)
        end = gl.minimum(last * BLOCK_N, width)  # slots past this are not this part's
        for t in gl.static_range(STAGES - 1):
            glu._issue_kv_tile(
                kv_ptr,
                kv_stride,
                glu._load_slots(row, (first + t) * BLOCK_N, end, BLOCK_N, sl_lat),
                glu._load_slots(row, (first + t) * BLOCK_N, end, BLOCK_N, sl_rope),
                kl_s.index(t),
                kr_s.index(t),
                lat_l,
                rope_l,
                LORA,
                ROPE,
            )
            async_copy.commit_group()
        nxt_l = glu._load_slots(row, (first + STAGES - 1) * BLOCK_N, end, BLOCK_N, sl_lat)
        nxt_r = glu._load_slots(row, (first + STAGES - 1) * BLOCK_N, end, BLOCK_N, sl_rope)
        for j in range(first, last):
            stage = (j - first + STAGES - 1) % STAGES
            glu._issue_kv_tile(
                kv_ptr,
                kv_stride,
                nxt_l,
                nxt_r,
                kl_s.index(stage),
                kr_s.index(stage),
                lat_l,
                rope_l,
                LORA,
                ROPE,
            )
            async_copy.commit_group()
            nxt_l = glu._load_slots(row, (j + STAGES) * BLOCK_N, end, BLOCK_N, sl_lat)
            nxt_r = glu._load_slots(row, (j + STAGES) * BLOCK_N, end, BLOCK_N, sl_rope)
            async_copy.wait_group(STAGES - 1)  # tile j landed
            _cta_barrier()
        async_copy.wait_group(0)
        _cta_barrier()
        tile = kl_s.index((last - 1 - first) % STAGES).load(lat_l)
        col = gl.sum(tile.to(gl.float32), axis=0)
        lat = gl.arange(0, LORA, layout=gl.SliceLayout(0, lat_l))
        gl.store(out_ptr + pid.to(gl.int64) * LORA + lat, col)


@triton.jit
def _kv_loads_only_kernel(
    kv_ptr,
    kv_stride,
    idx_ptr,
    idx_stride,
    out_ptr,
    width,
    ROW_STEP: tl.constexpr,
    LORA: tl.constexpr,
    ROPE: tl.constexpr,
    BLOCK_N: tl.constexpr,
):
    # plain Triton: program p loads token p * ROW_STEP's row tile by tile into registers
    # and keeps an elementwise running maximum (no reduction inside the loop)
    pid = tl.program_id(0)
    row = idx_ptr + (pid * ROW_STEP).to(tl.int64) * idx_stride
    lat = tl.arange(0, LORA)
    rope = tl.arange(0, ROPE)
    top = tl.full([BLOCK_N, LORA], float("-inf"), kv_ptr.dtype.element_ty)
    top_r = tl.full([BLOCK_N, ROPE], float("-inf"), kv_ptr.dtype.element_ty)
    for start in range(0, width, BLOCK_N):
        col = start + tl.arange(0, BLOCK_N)
        slot = tl.load(row + col, mask=col < width, other=-1)
        base = kv_ptr + tl.where(slot >= 0, slot, 0).to(tl.int64)[:, None] * kv_stride
        live = (slot >= 0)[:, None]
        # (the maximum of two bf16 values is one of them: the cast back is exact)
        top = tl.maximum(top, tl.load(base + lat[None, :], mask=live, other=float("-inf"))).to(
            top.dtype
        )
        top_r = tl.maximum(
            top_r, tl.load(base + LORA + rope[None, :], mask=live, other=float("-inf"))
        ).to(top_r.dtype)
    out = out_ptr + pid.to(tl.int64) * (LORA + ROPE)
    tl.store(out + lat, tl.max(top, 0).to(tl.float32))
    tl.store(out + LORA + rope, tl.max(top_r, 0).to(tl.float32))


def loads_only(kv_cache, indices, stages: int):
    """Launch the plain-Triton loads-only kernel with the op's mapping; returns each
    program's row's column maxima ``[P, 576]`` (fp32; ``-inf`` for an empty row)."""
    kv = kv_cache.reshape(-1, kv_cache.shape[-1])
    programs = indices.shape[0] // glu.GROUP
    out = torch.empty((programs, glu.LORA + glu.ROPE), dtype=torch.float32, device=kv.device)
    _kv_loads_only_kernel[(programs,)](
        kv,
        kv.stride(0),
        indices,
        indices.stride(0),
        out,
        indices.shape[1],
        ROW_STEP=glu.GROUP,
        LORA=glu.LORA,
        ROPE=glu.ROPE,
        BLOCK_N=glu.BLOCK_N,
        num_warps=glu.NUM_WARPS,
        num_stages=stages,
    )
    return out


if glu.HAVE_GLUON:

    @gluon.jit
    def _kv_tma_copies_kernel(
        desc,
        idx_ptr,
        idx_stride,
        out_ptr,
        listed,
        ROW_STEP: gl.constexpr,
        SPLIT: gl.constexpr,
        BLOCK_N: gl.constexpr,
        CHUNKS: gl.constexpr,
        STAGES: gl.constexpr,
    ):
        # As _kv_copies_only_kernel, but tile t is 64 CONSECUTIVE rows from the slot of
        # its first listed column, as CHUNKS TMA boxes [64, 64] on one mbarrier per stage
        # (a bound: rows past a block boundary are the wrong rows, read as fast)
        NW: gl.constexpr = gl.num_warps()
        dtype: gl.constexpr = desc.dtype
        pid = gl.program_id(0)
        row = idx_ptr + ((pid // SPLIT) * ROW_STEP).to(gl.int64) * idx_stride
        n_tiles = gl.cdiv(listed, BLOCK_N)
        per_part = gl.cdiv(n_tiles, SPLIT)
        first = (pid % SPLIT) * per_part
        last = gl.minimum(first + per_part, n_tiles)
        buf = gl.allocate_shared_memory(dtype, [STAGES * CHUNKS, BLOCK_N, 64], desc.layout)
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for s in gl.static_range(STAGES):
            mbarrier.init(bars.index(s), count=1)
        for t in gl.static_range(STAGES - 1):
            if first + t < last:
                start = gl.load(row + (first + t) * BLOCK_N)
                mbarrier.expect(bars.index(t), CHUNKS * BLOCK_N * 64 * 2)
                for c in gl.static_range(CHUNKS):
                    tma.async_copy_global_to_shared(
                        desc, [start, c * 64], bars.index(t), buf.index(t * CHUNKS + c)
                    )
        for j in range(first, last):
            nxt = j + STAGES - 1
            if nxt < last:
                stage = (nxt - first) % STAGES
                start = gl.load(row + nxt * BLOCK_N)
                mbarrier.expect(bars.index(stage), CHUNKS * BLOCK_N * 64 * 2)
                for c in gl.static_range(CHUNKS):
                    tma.async_copy_global_to_shared(
                        desc, [start, c * 64], bars.index(stage), buf.index(stage * CHUNKS + c)
                    )
            mbarrier.wait(bars.index((j - first) % STAGES), ((j - first) // STAGES) & 1)
        sum_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
        cols = gl.arange(0, 64, layout=gl.SliceLayout(0, sum_l))
        lstage = (last - 1 - first) % STAGES
        for c in gl.static_range(CHUNKS):
            chunk = buf.index(lstage * CHUNKS + c).load(sum_l).to(gl.float32)
            gl.store(
                out_ptr + pid.to(gl.int64) * (CHUNKS * 64) + c * 64 + cols, gl.sum(chunk, axis=0)
            )
        for s in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(s))


def tma_copies(kv_cache, indices, listed: int, mapping: str, q_len: int, stages: int = 2):
    """Launch the TMA copies-only kernel (``listed`` slots per row); returns the column
    sums ``[P, 576]`` of each program's last tile (64 consecutive rows, fp32)."""
    kv = kv_cache.reshape(-1, kv_cache.shape[-1])
    layout = gl.NVMMASharedLayout.get_default_for([glu.BLOCK_N, 64], gl.bfloat16)
    desc = TensorDescriptor.from_tensor(kv, [glu.BLOCK_N, 64], layout)
    row_step, split = _mapping(mapping, q_len)
    programs = indices.shape[0] // row_step * split
    out = torch.empty((programs, kv.shape[1]), dtype=torch.float32, device=kv.device)
    _kv_tma_copies_kernel[(programs,)](
        desc,
        indices,
        indices.stride(0),
        out,
        listed,
        ROW_STEP=row_step,
        SPLIT=split,
        BLOCK_N=glu.BLOCK_N,
        CHUNKS=kv.shape[1] // 64,
        STAGES=stages,
        num_warps=glu.NUM_WARPS,
    )
    return out


def expected_tma_copies(kv_cache, indices, listed: int, mapping: str, q_len: int):
    """What ``tma_copies`` stores: per program, the column sums ``[576]`` of the 64 rows
    from its last tile's first slot (rows past the cache's end count as 0)."""
    kv = kv_cache.reshape(-1, kv_cache.shape[-1])
    sums = []
    for token, last in _last_tiles(indices.shape[0], listed, mapping, q_len):
        start = int(indices[token, (last - 1) * glu.BLOCK_N])
        sums.append(kv[start : start + glu.BLOCK_N].float().sum(dim=0))
    return torch.stack(sums)


def _mapping(mapping: str, q_len: int) -> tuple:
    """``(row_step, split)`` of a program mapping (module docstring)."""
    return {"op": (glu.GROUP, 1), "once": (q_len, 2), "request": (q_len, 1)}[mapping]


def _last_tiles(tokens: int, columns: int, mapping: str, q_len: int) -> list:
    """Per program of ``mapping``, ``(token whose row it walks, one past its last tile)``
    over ``columns`` index columns, as the copy kernels split them."""
    row_step, split = _mapping(mapping, q_len)
    n_tiles = -(-columns // glu.BLOCK_N)
    per_part = -(-n_tiles // split)
    return [
        ((p // split) * row_step, min((p % split) * per_part + per_part, n_tiles))
        for p in range(tokens // row_step * split)
    ]


def expected_copies(kv_cache, indices, mapping: str, q_len: int) -> torch.Tensor:
    """What ``copies_only`` stores: per program, the column sums ``[512]`` (fp32) of the
    latent part of its last tile's rows (holes and slots past its part count as 0)."""
    kv = kv_cache.reshape(-1, kv_cache.shape[-1])
    tokens, width = indices.shape
    sums = []
    for token, last in _last_tiles(tokens, width, mapping, q_len):
        slots = indices[token, (last - 1) * glu.BLOCK_N : min(last * glu.BLOCK_N, width)]
        rows = kv[slots[slots >= 0].long(), : glu.LORA].float()
        sums.append(rows.sum(dim=0))
    return torch.stack(sums)


def copies_only(kv_cache, indices, mapping: str, q_len: int, stages: int = 2):
    """Launch the copies-only kernel; returns the per-program column sums [P, 512]."""
    kv = kv_cache.reshape(-1, kv_cache.shape[-1])
    tokens, width = indices.shape
    row_step, split = _mapping(mapping, q_len)
    programs = tokens // row_step * split
    out = torch.empty((programs, glu.LORA), dtype=torch.float32, device=kv.device)
    _kv_copies_only_kernel[(programs,)](
        kv,
        kv.stride(0),
        indices,
        indices.stride(0),
        out,
        width,
        ROW_STEP=row_step,
        SPLIT=split,
        LORA=glu.LORA,
        ROPE=glu.ROPE,
        BLOCK_N=glu.BLOCK_N,
        STAGES=stages,
        num_warps=glu.NUM_WARPS,
    )
    return out


def _timed(results, data, name, run, want, moved_bytes, ceiling, tol=1e-6, **extra) -> None:
    """Check ``run()`` against ``want`` (``rel_err`` within ``tol``), time its graph
    replay, log and record it with ``moved_bytes / time`` against the read ceiling."""
    got = run()
    err = rel_err(got, want)
    us = 1e3 * bench_ms(graph_of(run).replay)
    gbps = moved_bytes / us / 1e3
    log(
        f"{data:10s} {name:44s} {us:8.1f} us  {gbps:6.0f} GB/s "
        f"({100 * gbps / ceiling:3.0f}% of the read ceiling)  rel err {err:.1e}"
    )
    results["rows"].append(
        dict(kv=data, variant=name, us=us, GBps=gbps, rel_err=err, ok=err <= tol, **extra)
    )


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=os.environ.get("OUT", "."))
    args = parser.parse_args(argv)
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("bench_mla_copy_bound.py needs a CUDA GPU (sm_90)", file=sys.stderr)
        return 2
    if not glu.HAVE_GLUON:
        print("this triton has no Gluon", file=sys.stderr)
        return 2
    ceiling = section_ceiling()
    size = SimpleNamespace(
        requests=64, q_len=8, context=32768, window=2048, block_size=64, heads=16
    )
    query, kv_cache, index_sets, lora = mla_inputs(size)
    scale = (lora + 64) ** -0.5
    rows = index_sets["non-causal"]
    # every request's rows point at request 0's slots: 2056 rows, 2.4 MB, stays in L2
    resident = rows[: size.q_len].repeat(size.requests, 1)
    row_bytes = (lora + 64) * kv_cache.element_size()
    # dspark_research lives in the checkout, beside benchmarks/ (not in the wheel)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from dspark_research.provenance import provenance

    results = {**provenance(), "read_ceiling_GBps": ceiling, "rows": []}
    kv = kv_cache.reshape(-1, kv_cache.shape[-1])
    # the read ceiling's kernel on a contiguous buffer of the op's distinct KV bytes: what a
    # plain stream of this size takes (launch, ramp-up and tail included)
    distinct = int((rows[:: size.q_len] >= 0).sum()) * row_bytes
    stream = torch.randn(distinct // 2, device="cuda", dtype=torch.bfloat16)
    block, iters = 4096, 8
    sums = torch.empty(triton.cdiv(stream.numel(), block * iters), device="cuda")

    def read_stream():
        _read_kernel[(sums.numel(),)](
            stream, sums, stream.numel(), BLOCK=block, ITERS=iters, num_warps=8
        )
        return sums

    padded = torch.nn.functional.pad(
        stream.float(), (0, sums.numel() * block * iters - stream.numel())
    )
    _timed(
        results,
        "KV in HBM",
        "contiguous read of the same bytes (ceiling's kernel)",
        read_stream,
        padded.view(sums.numel(), -1).sum(dim=1),
        distinct,
        ceiling,
        tol=1e-4,
    )
    for data, idx in (("KV in HBM", rows), ("KV in L2", resident)):
        per_request = int((idx >= 0).sum()) // size.q_len * row_bytes  # all requests

        def moved(reads: int, data=data, per_request=per_request) -> int:
            """HBM: distinct bytes (each row once); L2: bytes the programs move out of L2."""
            return per_request * (1 if data == "KV in HBM" else reads)

        want = ref.sparse_mla_attention_ref(query, kv_cache, idx, scale, lora)
        for name, kwargs in (
            ("attention kernel (op launch)", {}),
            (
                "attention kernel, no KV copies (diagnostic)",
                {"fold_mixed": False, "mixed_pass": False, "diag_no_loads": True},
            ),
        ):
            _timed(
                results,
                data,
                name,
                lambda k=kwargs, i=idx: glu._launch(query, kv_cache, i, scale, **k).float(),
                want.float(),
                moved(2),
                ceiling,
                tol=1e-2,
            )
            if "diagnostic" in name:
                results["rows"][-1]["ok"] = None  # wrong by design
        for mapping, stages in (("op", 2), ("op", 3), ("once", 2), ("once", 3), ("request", 2)):
            want_copies = expected_copies(kv_cache, idx, mapping, size.q_len)
            _timed(
                results,
                data,
                f"copies only, {mapping}, {stages} stages",
                lambda m=mapping, s=stages, i=idx: copies_only(kv_cache, i, m, size.q_len, s),
                want_copies,
                moved(2 if mapping == "op" else 1),
                ceiling,
                programs=len(want_copies),
            )
        listed = int((idx[0] >= 0).sum())
        for mapping, stages in (("op", 2), ("op", 3), ("once", 2)):
            want_tma = expected_tma_copies(kv_cache, idx, listed, mapping, size.q_len)
            _timed(
                results,
                data,
                f"TMA boxes of 64 rows, {mapping}, {stages} stages",
                lambda m=mapping, s=stages, i=idx: tma_copies(
                    kv_cache, i, listed, m, size.q_len, s
                ),
                want_tma,
                moved(2 if mapping == "op" else 1),
                ceiling,
                programs=len(want_tma),
            )
        whole = torch.stack([kv[r[r >= 0].long()].float().amax(0) for r in idx[:: glu.GROUP]])
        for stages in (1, 2, 3):
            _timed(
                results,
                data,
                f"plain Triton loads, op, num_stages={stages}",
                lambda s=stages, i=idx: loads_only(kv_cache, i, s),
                whole,
                moved(2),
                ceiling,
            )
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "mla_copy_bound.json"), "w") as f:
        json.dump(results, f, indent=1)
    bad = [r["variant"] for r in results["rows"] if r["ok"] is False]
    if bad:
        print(f"FAILED checks: {bad}", file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
