"""Gluon (Hopper, sm_90) sparse MLA attention for groups of query tokens sharing one index row.

Semantics: ``sparse_mla.sparse_mla_attention_ref``; same signature and return as
``sparse_mla_grouped_triton.grouped_sparse_mla_attention_triton``.

Shapes and dtypes handled here (anything else falls back, see below):

- ``query [T, H, 576]`` bf16 (512 latent channels + 64 rope), ``H % 16 == 0``;
- ``kv_cache [num_blocks, block_size, 576]`` bf16 (slot ``s`` is row ``s`` of
  ``kv_cache.reshape(-1, 576)``), ``kv_lora_rank == 512``;
- ``indices [T, width]`` int32, ``-1`` = hole (never read), any ``width >= 1``;
- returns ``out [T, H, 512]`` in the query's dtype; fp32 softmax and accumulation.

A program (8 warps = two warpgroups) owns ``GROUP = 4`` consecutive tokens x 16 heads,
i.e. a ``[64, 576]`` query tile copied once into shared memory. It issues the copies of
the query and of the first KV tile of the lead token's row, and while they fly compares
the 4 tokens' index rows (index bytes only). If they are all equal (every token of a
DSpark non-causal block has the same row) it walks the row once, in tiles of
``BLOCK_N = 64`` slots: each KV tile ``[64, 576]`` is gathered through the indices with
``cp.async`` (16-byte pieces; holes and columns past ``width`` are zero-filled, never
read, and masked to ``-inf``) into a 2-stage shared-memory ring (query 72 KiB + 2 x 72
KiB + ``P`` 8 KiB = 224 KiB: no room for a third stage). Per tile ``j``, with
asynchronous ``wgmma``:

1. ``O += P_{j-1} V_{j-1}`` is issued (``P`` from shared memory, ``V`` = the first 512
   channels of tile ``j-1``; each warpgroup owns 256 of the 512 value columns) and runs
   while the program waits for tile ``j``'s copies;
2. ``S_j = Q K_j^T`` is issued (each warpgroup owns 32 of the 64 score columns);
3. once both warpgroups finished ``P_{j-1} V_{j-1}``, tile ``j+1`` is gathered into the
   freed stage, so its copy overlaps ``S_j``, the softmax and ``P_j V_j``; its slots were
   loaded a step earlier and parked in shared memory, so the copy never waits on them;
4. online softmax of ``S_j`` (fp32, ``exp2``; the row maximum is shared across the two
   warpgroups, the row sums stay per thread until the end), ``O`` rescaled, ``P_j``
   stored to shared memory as bf16 (as the Triton kernels' ``tl.dot`` does).

The output goes out through the idle first stage, as 16-byte pieces of whole rows.

A group whose rows differ (causal rows, a group straddling two requests) is walked once
per token, each pass against that token's row with the whole query tile, storing only
that token's 16 rows (rows are independent). ``_launch(..., fold_mixed=False)`` instead
flags such groups for the per-token Triton kernel (``launch_per_token``), as the
grouped Triton kernel does: a second launch, slower at every size measured. No host
synchronisation either way.

Measured on one H200 at the benchmark size (64 requests x 8 tokens, 16 heads, window
2048, width 2176 with 2056 listed slots; CUDA graph replay, ``do_bench`` median, L2
flushed, torch 2.11): 105.3 us with triton 3.6 (348 TFLOPS; the per-token kernel 532 us
in the same run, 5.05x) and 106.8 us with triton 3.8 (the per-token kernel 513.5 us,
4.81x); the grouped Triton kernel takes 194-210 us. Causal rows: 358 us (per-token
kernel 513 us). The kernel without its KV copies after the first tiles
(``_launch(..., diag_no_loads=True)``, wrong result) takes 91 us. Slower there:
``block_n=32, stages=4`` (145 us in an earlier version), L2 prefetch of tiles ahead
(removed), and filling both stages before the first scores (120 us).
(``benchmarks/results/2026-12-01/2026-12-01-h200-session9.md``.)

Falls back to ``grouped_sparse_mla_attention_triton`` (same result) when:
``DSPARK_MLA_GLUON=0``; triton is not a version in ``VERIFIED_TRITON`` (3.6 and 3.8,
whose GPU tests passed on an H200) unless ``DSPARK_MLA_GLUON=1``; the device is not
CUDA, or not compute capability 9.x; Gluon's Hopper API is not importable; the dtype is
not bf16 (fp16 would compile, but was never run on a GPU); the head dim is not 576 with
``kv_lora_rank`` 512; ``H`` is not a multiple of 16; ``width`` is 0; or the kernel's
launch raises (logged once per device and dtype, then that pair falls back). Nothing
here splits the index columns over programs, so a batch of few groups uses few SMs.
"""

from __future__ import annotations

import logging
import math
import os

import torch
import triton

from dspark_compile.kernels.sparse_mla import check_sparse_mla_args
from dspark_compile.kernels.sparse_mla_grouped_triton import grouped_sparse_mla_attention_triton
from dspark_compile.kernels.sparse_mla_triton import launch_per_token

logger = logging.getLogger(__name__)

try:  # Gluon's Hopper API (written against triton 3.6)
    from triton.experimental import gluon
    from triton.experimental.gluon import language as gl
    from triton.experimental.gluon.language.nvidia.hopper import (
        async_copy,
        fence_async_shared,
        warpgroup_mma,
        warpgroup_mma_wait,
    )

    # the CTA-wide barrier: ``thread_barrier`` in triton 3.6, ``barrier`` from 3.8
    _cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
    HAVE_GLUON = True
except Exception:  # noqa: BLE001 - any import problem means: use the Triton kernel
    HAVE_GLUON = False

LORA = 512
ROPE = 64
BLOCK_H = 16
GROUP = 4
BLOCK_N = 64
STAGES = 2
SCAN = 1024
NUM_WARPS = 8
FOLD_MIXED = True

# Gluon's API changes between triton releases (3.8 renamed the CTA barrier): the kernel
# runs by default only on the versions its GPU tests passed with (on an H200).
VERIFIED_TRITON = ("3.6.", "3.8.")

_failed: set = set()

if HAVE_GLUON:

    @gluon.jit
    def _issue_kv_tile(
        kv_ptr,
        kv_stride,
        slot_l,
        slot_r,
        kl_buf,
        kr_buf,
        LAT_L: gl.constexpr,
        ROPE_L: gl.constexpr,
        LORA: gl.constexpr,
        ROPE: gl.constexpr,
    ):
        # slot_l: [BLOCK_N] slots in SliceLayout(1, LAT_L); slot_r: same in SliceLayout(1, ROPE_L).
        # Holes / past-the-end columns carry -1: masked, so zero-filled and never read.
        lat = gl.arange(0, LORA, layout=gl.SliceLayout(0, LAT_L))
        rows_l = kv_ptr + gl.where(slot_l >= 0, slot_l, 0).to(gl.int64) * kv_stride
        ptr_l = gl.expand_dims(rows_l, 1) + gl.expand_dims(lat, 0)
        mask_l = gl.expand_dims(slot_l >= 0, 1) & gl.expand_dims(lat < LORA, 0)
        async_copy.async_copy_global_to_shared(kl_buf, ptr_l, mask=mask_l)
        rope = gl.arange(0, ROPE, layout=gl.SliceLayout(0, ROPE_L))
        rows_r = kv_ptr + LORA + gl.where(slot_r >= 0, slot_r, 0).to(gl.int64) * kv_stride
        ptr_r = gl.expand_dims(rows_r, 1) + gl.expand_dims(rope, 0)
        mask_r = gl.expand_dims(slot_r >= 0, 1) & gl.expand_dims(rope < ROPE, 0)
        async_copy.async_copy_global_to_shared(kr_buf, ptr_r, mask=mask_r)

    @gluon.jit
    def _load_slots(idx_row, start, width, BLOCK_N: gl.constexpr, layout: gl.constexpr):
        col = start + gl.arange(0, BLOCK_N, layout=layout)
        return gl.load(idx_row + col, mask=col < width, other=-1)

    @gluon.jit
    def _gluon_sparse_mla_kernel(
        q_ptr,
        q_stride_t,
        q_stride_h,
        kv_ptr,
        kv_stride,
        idx_ptr,
        idx_stride,
        out_ptr,
        out_stride_t,
        out_stride_h,
        mixed_ptr,
        num_tokens,
        width,
        qk_scale,
        LORA: gl.constexpr,
        ROPE: gl.constexpr,
        BLOCK_H: gl.constexpr,
        GROUP: gl.constexpr,
        BLOCK_N: gl.constexpr,
        STAGES: gl.constexpr,
        SCAN: gl.constexpr,
        FOLD_MIXED: gl.constexpr,
        DIAG_NO_LOADS: gl.constexpr,
    ):
        gl.static_assert(STAGES >= 2, "a ring of at least 2 stages")
        BLOCK_M: gl.constexpr = GROUP * BLOCK_H
        NW: gl.constexpr = gl.num_warps()
        dtype: gl.constexpr = q_ptr.dtype.element_ty
        pid_g = gl.program_id(0)
        pid_h = gl.program_id(1)
        t0 = pid_g * GROUP

        # ---- layouts and shared memory --------------------------------------------------
        lat_l: gl.constexpr = gl.BlockedLayout([1, 8], [1, 32], [NW, 1], [1, 0])
        rope_l: gl.constexpr = gl.BlockedLayout([1, 8], [4, 8], [NW, 1], [1, 0])
        # both warpgroups split the columns: S [64, 64] as 2 x [64, 32], O as 2 x [64, 256]
        s_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, NW // 4], instr_shape=[16, BLOCK_N // (NW // 4), 16]
        )
        o_l: gl.constexpr = gl.NVMMADistributedLayout(
            version=[3, 0], warps_per_cta=[4, NW // 4], instr_shape=[16, LORA // (NW // 4), 16]
        )
        big_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, LORA], dtype)
        small_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, ROPE], dtype)
        p_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_M, BLOCK_N], dtype)
        kl_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, LORA], dtype)
        kr_sl: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, ROPE], dtype)
        q_lat_s = gl.allocate_shared_memory(dtype, [BLOCK_M, LORA], big_sl)
        q_rope_s = gl.allocate_shared_memory(dtype, [BLOCK_M, ROPE], small_sl)
        kl_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, LORA], kl_sl)
        kr_s = gl.allocate_shared_memory(dtype, [STAGES, BLOCK_N, ROPE], kr_sl)
        p_s = gl.allocate_shared_memory(dtype, [BLOCK_M, BLOCK_N], p_sl)
        # slots of the next tiles to copy (ring of 2 by tile parity), see the main loop
        idx_s = gl.allocate_shared_memory(
            gl.int32, [2, BLOCK_N], gl.SwizzledSharedLayout(1, 1, 1, order=[0])
        )
        idx_l: gl.constexpr = gl.BlockedLayout([1], [32], [NW], [0])
        sl_lat: gl.constexpr = gl.SliceLayout(1, lat_l)
        sl_rope: gl.constexpr = gl.SliceLayout(1, rope_l)
        sl_col: gl.constexpr = gl.SliceLayout(0, s_l)
        n_tiles = gl.cdiv(width, BLOCK_N)
        # the epilogue's layout: 16-byte pieces of whole output rows
        st_l: gl.constexpr = gl.BlockedLayout([1, 8], [2, 16], [NW, 1], [1, 0])

        # ---- query tile (rows: token-major, head-minor), copied once for every pass, and
        # the first tiles of the lead token's row (the only row when the group is uniform,
        # pass 0's row otherwise), issued before the scan so that they overlap it
        lead_row = idx_ptr + t0.to(gl.int64) * idx_stride
        r_l = gl.arange(0, BLOCK_M, layout=sl_lat)
        tok_l = t0 + r_l // BLOCK_H
        lat = gl.arange(0, LORA, layout=gl.SliceLayout(0, lat_l))
        async_copy.async_copy_global_to_shared(
            q_lat_s,
            gl.expand_dims(
                q_ptr
                + tok_l.to(gl.int64) * q_stride_t
                + (pid_h * BLOCK_H + r_l % BLOCK_H).to(gl.int64) * q_stride_h,
                1,
            )
            + gl.expand_dims(lat, 0),
            mask=gl.expand_dims(tok_l < num_tokens, 1) & gl.expand_dims(lat < LORA, 0),
        )
        r_r = gl.arange(0, BLOCK_M, layout=sl_rope)
        tok_r = t0 + r_r // BLOCK_H
        rope = gl.arange(0, ROPE, layout=gl.SliceLayout(0, rope_l))
        async_copy.async_copy_global_to_shared(
            q_rope_s,
            gl.expand_dims(
                q_ptr
                + LORA
                + tok_r.to(gl.int64) * q_stride_t
                + (pid_h * BLOCK_H + r_r % BLOCK_H).to(gl.int64) * q_stride_h,
                1,
            )
            + gl.expand_dims(rope, 0),
            mask=gl.expand_dims(tok_r < num_tokens, 1) & gl.expand_dims(rope < ROPE, 0),
        )
        for t in gl.static_range(STAGES - 1):  # tiles 0 .. STAGES-2 into their stages
            _issue_kv_tile(
                kv_ptr,
                kv_stride,
                _load_slots(lead_row, t * BLOCK_N, width, BLOCK_N, sl_lat),
                _load_slots(lead_row, t * BLOCK_N, width, BLOCK_N, sl_rope),
                kl_s.index(t),
                kr_s.index(t),
                lat_l,
                rope_l,
                LORA,
                ROPE,
            )
            async_copy.commit_group()

        # ---- scan (while those copies fly): do the GROUP tokens list the same slots? ----
        scan_l: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [1, NW], [1, 0])
        g_tok = t0 + gl.arange(0, GROUP, layout=gl.SliceLayout(1, scan_l))
        g_valid = g_tok < num_tokens
        differ = gl.zeros([GROUP, SCAN], gl.int32, scan_l)
        for start in range(0, width, SCAN):
            col = start + gl.arange(0, SCAN, layout=gl.SliceLayout(0, scan_l))
            lead = gl.load(lead_row + col, mask=col < width, other=-1)
            tile_mask = gl.expand_dims(g_valid, 1) & gl.expand_dims(col < width, 0)
            tile = gl.load(
                idx_ptr
                + gl.expand_dims(g_tok.to(gl.int64) * idx_stride, 1)
                + gl.expand_dims(col, 0),
                mask=tile_mask,
                other=-1,
            )
            differ += ((tile != gl.expand_dims(lead, 0)) & tile_mask).to(gl.int32)
        uniform = (gl.sum(gl.sum(differ, axis=1), axis=0) == 0).to(gl.int32)
        # One pass over the shared row, or (mixed group) one pass per token, each storing
        # only its token's rows (rows are independent, so the others may hold anything).
        if FOLD_MIXED:
            n_pass = uniform + (1 - uniform) * GROUP
        else:
            if pid_h == 0:
                gl.store(mixed_ptr + pid_g, 1 - uniform)
            n_pass = uniform

        for g in range(n_pass):
            # this pass's tokens: [tok_lo, tok_hi); in a last group of fewer than GROUP
            # tokens the surplus passes redo its last token (the same values, rewritten)
            tok_lo = gl.minimum(t0 + g * (1 - uniform), num_tokens - 1)
            tok_hi = gl.minimum(tok_lo + 1 + uniform * (GROUP - 1), num_tokens)
            idx_row = idx_ptr + tok_lo.to(gl.int64) * idx_stride
            if g > 0:  # a mixed group's next token: its first tiles
                for t in gl.static_range(STAGES - 1):
                    _issue_kv_tile(
                        kv_ptr,
                        kv_stride,
                        _load_slots(idx_row, t * BLOCK_N, width, BLOCK_N, sl_lat),
                        _load_slots(idx_row, t * BLOCK_N, width, BLOCK_N, sl_rope),
                        kl_s.index(t),
                        kr_s.index(t),
                        lat_l,
                        rope_l,
                        LORA,
                        ROPE,
                    )
                    async_copy.commit_group()
            nxt_l = _load_slots(idx_row, (STAGES - 1) * BLOCK_N, width, BLOCK_N, sl_lat)
            nxt_r = _load_slots(idx_row, (STAGES - 1) * BLOCK_N, width, BLOCK_N, sl_rope)
            # The slots of tile t are loaded one step before its copy is issued and parked
            # in idx_s[t % 2] (a register each while in flight), so no step waits on them.
            idx_s.index(STAGES % 2).store(
                _load_slots(idx_row, STAGES * BLOCK_N, width, BLOCK_N, idx_l)
            )
            live = _load_slots(idx_row, 0, width, BLOCK_N, sl_col) >= 0
            async_copy.wait_group(STAGES - 2)
            fence_async_shared()
            _cta_barrier()

            # ---- tile 0: scores; tile STAGES-1 starts loading into the last stage ------
            s_zero = gl.zeros([BLOCK_M, BLOCK_N], gl.float32, s_l)
            s_tok = warpgroup_mma(
                q_lat_s, kl_s.index(0).permute((1, 0)), s_zero, use_acc=False, is_async=True
            )
            s_tok = warpgroup_mma(q_rope_s, kr_s.index(0).permute((1, 0)), s_tok, is_async=True)
            _issue_kv_tile(
                kv_ptr,
                kv_stride,
                nxt_l,
                nxt_r,
                kl_s.index(STAGES - 1),
                kr_s.index(STAGES - 1),
                lat_l,
                rope_l,
                LORA,
                ROPE,
            )
            async_copy.commit_group()
            s = warpgroup_mma_wait(0, deps=[s_tok])
            s = gl.where(gl.expand_dims(live, 0), s * qk_scale, float("-inf"))
            m_i = gl.max(s, axis=1)
            m_safe = gl.where(m_i == float("-inf"), 0.0, m_i)
            p = gl.exp2(s - gl.expand_dims(m_safe, 1))
            l_acc = p
            acc = gl.zeros([BLOCK_M, LORA], gl.float32, o_l)
            p_s.store(p.to(dtype))
            fence_async_shared()

            # ---- steady state, per tile j (stage of tile j is j % STAGES):
            # O += P_{j-1} V_{j-1} runs while tile j lands; S_j = Q K_j^T follows; once
            # both warpgroups are done with V_{j-1} its stage takes tile j+STAGES-1, whose
            # copy then overlaps S_j, the softmax and the next P V.
            for j in range(1, n_tiles):
                cur = j % STAGES
                prv = (j + STAGES - 1) % STAGES
                ahead = _load_slots(idx_row, (j + STAGES) * BLOCK_N, width, BLOCK_N, idx_l)
                live = _load_slots(idx_row, j * BLOCK_N, width, BLOCK_N, sl_col) >= 0
                _cta_barrier()  # P_{j-1} visible to both warpgroups
                o_tok = warpgroup_mma(p_s, kl_s.index(prv), acc, is_async=True)
                async_copy.wait_group(STAGES - 2)  # tile j landed (own copies)
                fence_async_shared()
                _cta_barrier()  # ... and everyone's
                s_tok = warpgroup_mma(
                    q_lat_s, kl_s.index(cur).permute((1, 0)), s_zero, use_acc=False, is_async=True
                )
                s_tok = warpgroup_mma(
                    q_rope_s, kr_s.index(cur).permute((1, 0)), s_tok, is_async=True
                )
                acc = warpgroup_mma_wait(2, deps=[o_tok])
                _cta_barrier()  # both warpgroups done with stage prv, P
                if not DIAG_NO_LOADS:  # diagnostic: reuse stale tiles (wrong result)
                    parked = idx_s.index((j + STAGES - 1) % 2)
                    _issue_kv_tile(
                        kv_ptr,
                        kv_stride,
                        parked.load(sl_lat),
                        parked.load(sl_rope),
                        kl_s.index(prv),
                        kr_s.index(prv),
                        lat_l,
                        rope_l,
                        LORA,
                        ROPE,
                    )
                async_copy.commit_group()
                s = warpgroup_mma_wait(0, deps=[s_tok])
                s = gl.where(gl.expand_dims(live, 0), s * qk_scale, float("-inf"))
                m_new = gl.maximum(m_i, gl.max(s, axis=1))
                m_safe = gl.where(m_new == float("-inf"), 0.0, m_new)
                p = gl.exp2(s - gl.expand_dims(m_safe, 1))
                alpha = gl.exp2(m_i - m_safe)
                l_acc = l_acc * gl.expand_dims(alpha, 1) + p
                m_i = m_new
                acc = acc * gl.expand_dims(gl.convert_layout(alpha, gl.SliceLayout(1, o_l)), 1)
                p_s.store(p.to(dtype))
                idx_s.index((j + STAGES) % 2).store(ahead)  # read after the next barrier
                fence_async_shared()

            _cta_barrier()
            last = (n_tiles - 1) % STAGES
            acc = warpgroup_mma(p_s, kl_s.index(last), acc, is_async=True)
            acc = warpgroup_mma_wait(0, deps=[acc])
            async_copy.wait_group(0)
            l_i = gl.convert_layout(gl.sum(l_acc, axis=1), gl.SliceLayout(1, o_l))
            safe_l = gl.where(l_i > 0, l_i, 1.0)
            out = (acc / gl.expand_dims(safe_l, 1)).to(dtype)
            # ---- epilogue: through the (now idle) first KV stage when it holds the tile, so
            # that the global stores are 16-byte pieces of whole rows, not wgmma fragments
            if BLOCK_N >= BLOCK_M:
                _cta_barrier()  # both warpgroups done reading every stage
                stage = kl_s.index(0).slice(0, BLOCK_M)
                stage.store(out)
                _cta_barrier()
                out = stage.load(st_l)
                out_l: gl.constexpr = st_l
            else:
                out_l: gl.constexpr = o_l
                out = gl.convert_layout(out, o_l)
            r_o = gl.arange(0, BLOCK_M, layout=gl.SliceLayout(1, out_l))
            tok_o = t0 + r_o // BLOCK_H
            orow = (
                out_ptr
                + tok_o.to(gl.int64) * out_stride_t
                + (pid_h * BLOCK_H + r_o % BLOCK_H).to(gl.int64) * out_stride_h
            )
            lat_o = gl.arange(0, LORA, layout=gl.SliceLayout(0, out_l))
            gl.store(
                gl.expand_dims(orow, 1) + gl.expand_dims(lat_o, 0),
                out,
                mask=gl.expand_dims((tok_o >= tok_lo) & (tok_o < tok_hi), 1)
                & gl.expand_dims(lat_o < LORA, 0),
            )
            _cta_barrier()  # the stage is read before the next pass
        async_copy.wait_group(0)  # no copy outlives the program (flag launch)


def compile_for_hopper(
    block_n: int = BLOCK_N, stages: int = STAGES, fold_mixed: bool = True
) -> dict:
    """Compile the kernel for sm_90 with the installed triton, no GPU needed (not under
    ``TRITON_INTERPRET=1``, which wraps triton's own helpers); returns
    ``{"shared": bytes, "registers": n, "stack": bytes}`` (the last two ``None`` when
    triton's ``cuobjdump`` is missing). Catches Gluon API changes without a GPU."""
    import re
    import subprocess
    import tempfile

    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    signature = {
        "q_ptr": "*bf16",
        "q_stride_t": "i32",
        "q_stride_h": "i32",
        "kv_ptr": "*bf16",
        "kv_stride": "i32",
        "idx_ptr": "*i32",
        "idx_stride": "i32",
        "out_ptr": "*bf16",
        "out_stride_t": "i32",
        "out_stride_h": "i32",
        "mixed_ptr": "*i32",
        "num_tokens": "i32",
        "width": "i32",
        "qk_scale": "fp32",
    }
    constexprs = dict(
        LORA=LORA,
        ROPE=ROPE,
        BLOCK_H=BLOCK_H,
        GROUP=GROUP,
        BLOCK_N=block_n,
        STAGES=stages,
        SCAN=SCAN,
        FOLD_MIXED=int(fold_mixed),
        DIAG_NO_LOADS=0,
    )
    # as a launch with 16-aligned pointers and strides specialises it (cp.async needs it)
    aligned = (
        "q_ptr",
        "q_stride_t",
        "q_stride_h",
        "kv_ptr",
        "kv_stride",
        "idx_ptr",
        "out_ptr",
        "out_stride_t",
        "out_stride_h",
        "mixed_ptr",
        "num_tokens",
    )
    names = list(signature)
    attrs = {(names.index(name),): [["tt.divisibility", 16]] for name in aligned}
    compiled = triton.compile(
        GluonASTSource(
            fn=_gluon_sparse_mla_kernel, signature=signature, constexprs=constexprs, attrs=attrs
        ),
        target=GPUTarget("cuda", 90, 32),
        options={"num_warps": NUM_WARPS},
    )
    result = {"shared": compiled.metadata.shared, "registers": None, "stack": None}
    import triton.backends.nvidia as nvidia

    tool = os.path.join(os.path.dirname(nvidia.__file__), "bin", "cuobjdump")
    if os.path.exists(tool):
        with tempfile.NamedTemporaryFile(suffix=".cubin") as cubin:
            cubin.write(compiled.asm["cubin"])
            cubin.flush()
            usage = subprocess.run(
                [tool, "-res-usage", cubin.name], capture_output=True, text=True, check=True
            ).stdout
        found = re.search(r"REG:(\d+) STACK:(\d+)", usage)
        if found:
            result["registers"], result["stack"] = int(found.group(1)), int(found.group(2))
    return result


def gluon_mode() -> str:
    """``DSPARK_MLA_GLUON``: ``auto`` (default: the Gluon kernel on the triton versions
    it was verified with on a GPU, ``VERIFIED_TRITON``), ``1`` (any triton; a compile
    failure falls back) or ``0`` (never)."""
    mode = os.environ.get("DSPARK_MLA_GLUON", "auto")
    if mode not in ("auto", "0", "1"):
        raise ValueError(f"DSPARK_MLA_GLUON={mode!r} is invalid: expected 'auto', '1' or '0'")
    return mode


def gluon_enabled() -> bool:
    """Whether ``gluon_mode()`` and the installed triton allow the Gluon kernel at all."""
    mode = gluon_mode()
    return HAVE_GLUON and (
        mode == "1" or (mode == "auto" and triton.__version__.startswith(VERIFIED_TRITON))
    )


def gluon_supported(query: torch.Tensor, kv_cache: torch.Tensor, kv_lora_rank: int) -> bool:
    """Whether the Gluon kernel handles these inputs (the module docstring's list)."""
    if not gluon_enabled() or query.device.type != "cuda":
        return False
    if torch.cuda.get_device_capability(query.device)[0] != 9:
        return False
    if query.dtype != torch.bfloat16 or kv_cache.dtype != query.dtype:
        return False
    return kv_lora_rank == LORA and query.shape[-1] == LORA + ROPE and query.shape[1] % BLOCK_H == 0


def _launch(
    query,
    kv_cache,
    indices,
    scale,
    fold_mixed=FOLD_MIXED,
    mixed_pass=True,
    block_n=BLOCK_N,
    stages=STAGES,
    diag_no_loads=False,
):
    """One launch. ``fold_mixed``: mixed groups are attended token by token inside the
    kernel (one launch); else they are flagged and, with ``mixed_pass``, left to the
    per-token Triton kernel. The other keyword arguments are for measurements
    (``diag_no_loads``: the kernel without its KV copies after the first tiles; the
    result is then wrong)."""
    num_tokens, num_heads, head_dim = query.shape
    out = torch.empty((num_tokens, num_heads, LORA), dtype=query.dtype, device=query.device)
    if num_tokens == 0:
        return out
    query = query if query.stride(-1) == 1 else query.contiguous()
    kv = kv_cache.reshape(-1, head_dim)
    kv = kv if kv.stride(-1) == 1 else kv.contiguous()
    indices = indices if indices.stride(-1) == 1 else indices.contiguous()
    width = indices.shape[1]
    groups = triton.cdiv(num_tokens, GROUP)
    mixed = torch.empty(1 if fold_mixed else groups, dtype=torch.int32, device=query.device)
    _gluon_sparse_mla_kernel[(groups, num_heads // BLOCK_H)](
        query,
        query.stride(0),
        query.stride(1),
        kv,
        kv.stride(0),
        indices,
        indices.stride(0),
        out,
        out.stride(0),
        out.stride(1),
        mixed,
        num_tokens,
        width,
        float(scale) * math.log2(math.e),
        LORA=LORA,
        ROPE=ROPE,
        BLOCK_H=BLOCK_H,
        GROUP=GROUP,
        BLOCK_N=block_n,
        STAGES=stages,
        SCAN=SCAN,
        FOLD_MIXED=bool(fold_mixed),
        DIAG_NO_LOADS=diag_no_loads,
        num_warps=NUM_WARPS,
    )
    # Tokens of mixed groups (causal rows, groups straddling requests): per token.
    if not fold_mixed and mixed_pass:
        launch_per_token(query, kv, indices, out, scale, LORA, mixed=mixed, group=GROUP)
    return out


def gluon_sparse_mla_attention(
    query: torch.Tensor,
    kv_cache: torch.Tensor,
    indices: torch.Tensor,
    scale: float,
    kv_lora_rank: int,
) -> torch.Tensor:
    """Gluon ``dspark.sparse_mla_attention`` (module docstring); returns ``[T, H, L]``.

    Inputs the kernel does not handle go to ``grouped_sparse_mla_attention_triton``."""
    check_sparse_mla_args(query, kv_cache, indices, kv_lora_rank)
    key = (query.device.index, query.dtype)
    if (
        indices.shape[1] == 0
        or key in _failed
        or not gluon_supported(query, kv_cache, kv_lora_rank)
    ):
        return grouped_sparse_mla_attention_triton(query, kv_cache, indices, scale, kv_lora_rank)
    try:
        return _launch(query, kv_cache, indices, scale)
    except Exception:  # noqa: BLE001 - compile/launch failure: the Triton kernel is exact too
        logger.warning(
            "Gluon sparse MLA kernel failed on %s %s; using the Triton kernel",
            query.device,
            query.dtype,
            exc_info=True,
        )
        _failed.add(key)
        return grouped_sparse_mla_attention_triton(query, kv_cache, indices, scale, kv_lora_rank)
