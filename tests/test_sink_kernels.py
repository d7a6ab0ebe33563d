"""Attention sinks in the Triton kernels and the run-time adapter.

The paged-attention kernel (per-token causal form with ``kv_offset``, the
full table with a window, and plain windowed decode / non-causal tables), the
fused window-metadata kernel and ``SlidingWindowAdapter``, against the torch
reference, the window arithmetic and a dense float64 mask built from
positions in plain Python. Without a GPU the kernels run on CPU tensors in the
Triton interpreter (conftest sets TRITON_INTERPRET=1); outputs are poisoned
(NaN / a sentinel) before each run so unwritten elements fail.
"""

import pytest
import torch

import dspark_compile  # noqa: F401  (registers torch.ops.dspark)
from dspark_compile import DraftWindowConfig
from dspark_compile.arithmetic import window
from dspark_compile.kernels.paged_attention import paged_attention_ref
from dspark_compile.kernels.paged_attention_triton import paged_attention_triton
from dspark_compile.kernels.window_metadata import window_metadata_triton
from dspark_compile.models import make_paged_batch, random_kv_cache
from dspark_compile.runtime import SlidingWindowAdapter
from tests.dense_sink_oracle import dense_sink_attention, random_window_cases

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


# seq_lens, q_lens, W, b, K, S, (Hq, Hkv): the edge cases sinks must get right.
CASES = {
    "empty request, seq < b": ([50, 0, 3, 21], [20, 0, 3, 0], 12, 8, 0, 8, (4, 2)),
    "W > seq": ([30, 12], [12, 5], 200, 4, 0, 4, (4, 2)),
    "window starts inside the sinks": ([40, 25], [6, 3], 16, 4, 0, 24, (4, 1)),
    "S and W not multiples of b": ([61, 47], [17, 9], 13, 8, 2, 5, (6, 2)),
    "S > seq": ([20, 9], [4, 2], 8, 4, 0, 100, (4, 2)),
    "q_len > W (multi-token causal)": ([40, 33], [24, 30], 8, 4, 0, 4, (8, 2)),
    "mixed decode and prefill": ([64, 35, 9, 100], [1, 20, 1, 33], 12, 4, 1, 8, (4, 4)),
    "long, several sink blocks": ([300, 170], [40, 1], 32, 16, 0, 40, (16, 2)),
}


def _case(name, device=DEVICE, dtype=torch.float32, seed=None):
    seq_lens, q_lens, W, b, K, S, (hq, hkv) = CASES[name]
    gen = torch.Generator().manual_seed(len(name) if seed is None else seed)
    batch = make_paged_batch(seq_lens, q_lens, b, device=device, generator=gen)
    kc, vc = random_kv_cache(
        batch.num_blocks, b, hkv, 16, dtype=dtype, device=device, generator=gen
    )
    q = torch.randn(batch.num_tokens, hq, 16, generator=gen).to(device, dtype)
    return batch, q, kc, vc, W, b, K, S


def _triton(*args, **kwargs):
    q = args[0]
    out = torch.full_like(q, float("nan"))
    got = paged_attention_triton(*args, out=out, **kwargs)
    assert got.data_ptr() == out.data_ptr()
    assert not torch.isnan(got).any(), "unwritten or NaN output"
    return got


def _close(got, want, tol=1e-5):
    torch.testing.assert_close(got.double().cpu(), want.double().cpu(), rtol=tol, atol=tol)


@pytest.mark.parametrize("name", list(CASES))
def test_causal_windowed_table_with_sinks_matches_reference_and_dense_mask(name):
    """The per-token causal form the window pass inserts: the table from the first
    query's window with the kept sink blocks in front, ``kv_offset`` = the window's
    first key; the kernel maps table tokens to positions and applies each query's
    lo(p) and the sinks. One split and several (sink range and window range split
    differently)."""
    batch, q, kc, vc, W, b, K, S = _case(name)
    lens, table, offset = window.causal_window_metadata(
        batch.seq_lens,
        batch.block_table,
        batch.query_start_loc,
        W,
        b,
        K,
        max_query_len=batch.num_tokens,
        sink_size=S,
    )
    want = dense_sink_attention(
        q, kc, vc, batch.block_table, batch.seq_lens, batch.query_start_loc, 0.3, True, W, K, S
    )
    windowed = (q, kc, vc, table, lens, batch.query_start_loc, 0.3, True)
    window_args = dict(kv_offset=offset, window_size=W, future_offset=K, sink_size=S)
    ref = paged_attention_ref(*windowed, **window_args)
    _close(ref, want)
    for splits in (1, 3):
        got = _triton(*windowed, num_splits=splits, **window_args)
        _close(got, want)
        _close(got, ref)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "name",
    [
        "empty request, seq < b",
        "window starts inside the sinks",
        "S and W not multiples of b",
        "long, several sink blocks",
    ],
)
def test_full_table_with_window_and_sinks(name, causal):
    """No kv_offset: the kernel windows the FULL table itself (sinks = table
    tokens < S_b); causal queries by their own position, non-causal by the last."""
    batch, q, kc, vc, W, b, K, S = _case(name, seed=7)
    args = (q, kc, vc, batch.block_table, batch.seq_lens, batch.query_start_loc, 0.25, causal)
    want = dense_sink_attention(*args, W, K, S)
    _close(paged_attention_ref(*args, window_size=W, future_offset=K, sink_size=S), want)
    got = _triton(*args, num_splits=2, window_size=W, future_offset=K, sink_size=S)
    _close(got, want)


@pytest.mark.parametrize(
    "name",
    [
        "empty request, seq < b",
        "window starts inside the sinks",
        "S and W not multiples of b",
        "S > seq",
        "mixed decode and prefill",
        "long, several sink blocks",
    ],
)
def test_non_causal_and_decode_tables_need_no_kernel_change(name):
    """Decode and non-causal blocks: the sinks are just leading table columns, so
    the kernel WITHOUT window arguments over the windowed (lengths, table) equals
    the dense mask with the window of the request's last position."""
    batch, q, kc, vc, W, b, K, S = _case(name, seed=3)
    lens, table = window.window_seq_lens_and_block_table(
        batch.seq_lens, batch.block_table, W, b, K, sink_size=S
    )
    want = dense_sink_attention(
        q, kc, vc, batch.block_table, batch.seq_lens, batch.query_start_loc, 0.3, False, W, K, S
    )
    got = _triton(q, kc, vc, table, lens, batch.query_start_loc, 0.3, False, num_splits=2)
    _close(got, want)
    decode_locs = torch.arange(
        len(batch.seq_lens) + 1, dtype=batch.query_start_loc.dtype, device=q.device
    )
    decode_q = q[: len(batch.seq_lens)].contiguous()
    want = dense_sink_attention(
        decode_q, kc, vc, batch.block_table, batch.seq_lens, decode_locs, 0.3, True, W, K, S
    )
    got = _triton(decode_q, kc, vc, table, lens, decode_locs, 0.3, True)
    _close(got, want)


@pytest.mark.parametrize(
    "launch", [dict(), dict(exact_tiles=False, heads_first=False), dict(block_n=128, num_splits=2)]
)
def test_decode_launches_with_sinks(launch):
    """Decode (one query per request) in the per-token form with sinks, under the
    decode launch (exact tiles, KV head first), the general one, and the GPU's
    decode KV tile (BLOCK_N 128, so one tile covers the sinks and the window)."""
    gen = torch.Generator().manual_seed(21)
    seq_lens, W, b, K, S = [300, 1, 17, 0, 64, 129], 40, 16, 2, 20
    batch = make_paged_batch(
        seq_lens, [1 if s else 0 for s in seq_lens], b, device=DEVICE, generator=gen
    )
    kc, vc = random_kv_cache(batch.num_blocks, b, 2, 16, device=DEVICE, generator=gen)
    q = torch.randn(batch.num_tokens, 8, 16, generator=gen).to(DEVICE)
    lens, table, offset = window.causal_window_metadata(
        batch.seq_lens,
        batch.block_table,
        batch.query_start_loc,
        W,
        b,
        K,
        max_query_len=1,
        sink_size=S,
    )
    want = dense_sink_attention(
        q, kc, vc, batch.block_table, batch.seq_lens, batch.query_start_loc, 0.3, True, W, K, S
    )
    got = _triton(
        q,
        kc,
        vc,
        table,
        lens,
        batch.query_start_loc,
        0.3,
        True,
        kv_offset=offset,
        window_size=W,
        future_offset=K,
        sink_size=S,
        **launch,
    )
    _close(got, want)


def test_random_cases_against_the_reference():
    """Seeded random shapes (b, W, K, S, lengths, GQA): the causal per-token form,
    and non-causal blocks on the per-request table with ``kv_offset``."""
    for batch, q, kc, vc, W, b, K, S, rand in random_window_cases(
        13, 6, [1, 2, 4, 8, 16], max_window=40, max_sinks=40, max_seq=120, max_q=12, device=DEVICE
    ):
        lens, table, offset = window.causal_window_metadata(
            batch.seq_lens,
            batch.block_table,
            batch.query_start_loc,
            W,
            b,
            K,
            max_query_len=batch.num_tokens,
            sink_size=S,
        )
        window_args = dict(kv_offset=offset, window_size=W, future_offset=K, sink_size=S)
        windowed = (q, kc, vc, table, lens, batch.query_start_loc, 0.3, True)
        want = dense_sink_attention(
            q, kc, vc, batch.block_table, batch.seq_lens, batch.query_start_loc, 0.3, True, W, K, S
        )
        _close(paged_attention_ref(*windowed, **window_args), want)
        _close(_triton(*windowed, num_splits=rand(1, 3), **window_args), want)
        # non-causal on the per-request table with kv_offset and the window arguments
        lens, table = window.window_seq_lens_and_block_table(
            batch.seq_lens, batch.block_table, W, b, K, sink_size=S
        )
        window_args["kv_offset"] = window.compute_window(batch.seq_lens, W, b, K, sink_size=S).start
        windowed = (q, kc, vc, table, lens, batch.query_start_loc, 0.3, False)
        want = dense_sink_attention(
            q, kc, vc, batch.block_table, batch.seq_lens, batch.query_start_loc, 0.3, False, W, K, S
        )
        _close(paged_attention_ref(*windowed, **window_args), want)
        _close(_triton(*windowed, num_splits=rand(1, 3), **window_args), want)


def test_zero_sinks_is_bit_identical_and_bad_sink_size_is_refused():
    batch, q, kc, vc, W, b, K, _ = _case("mixed decode and prefill")
    lens, table, offset = window.causal_window_metadata(
        batch.seq_lens,
        batch.block_table,
        batch.query_start_loc,
        W,
        b,
        K,
        max_query_len=batch.num_tokens,
    )
    args = (q, kc, vc, table, lens, batch.query_start_loc, 0.3, True)
    plain = _triton(*args, kv_offset=offset, window_size=W, future_offset=K)
    zero = _triton(*args, kv_offset=offset, window_size=W, future_offset=K, sink_size=0)
    assert torch.equal(plain, zero)
    with pytest.raises(ValueError, match="sink_size=4 is invalid"):
        paged_attention_triton(*args, sink_size=4)  # no window
    with pytest.raises(ValueError, match="sink_size=-1 is invalid"):
        paged_attention_triton(*args, window_size=W, sink_size=-1)


def test_cuda_registration_runs_the_kernel_with_sinks_in_bf16(caplog):
    """The op's CUDA entry point (on CPU tensors here) takes the Triton kernel
    with sinks: no reference fallback, bf16 result close to the dense mask."""
    from dspark_compile.ops.paged_attention import _paged_attention_cuda

    batch, q, kc, vc, W, b, K, S = _case("window starts inside the sinks")
    lens, table, offset = window.causal_window_metadata(
        batch.seq_lens,
        batch.block_table,
        batch.query_start_loc,
        W,
        b,
        K,
        max_query_len=batch.num_tokens,
        sink_size=S,
    )
    want = dense_sink_attention(
        q, kc, vc, batch.block_table, batch.seq_lens, batch.query_start_loc, 0.3, True, W, K, S
    )
    with caplog.at_level("WARNING"):
        got = _paged_attention_cuda(
            q.bfloat16(),
            kc.bfloat16(),
            vc.bfloat16(),
            table,
            lens,
            batch.query_start_loc,
            0.3,
            True,
            offset,
            W,
            K,
            S,
        )
    assert got.dtype == torch.bfloat16
    assert "no Triton kernel" not in caplog.text
    _close(got, want, tol=3e-2)


# ------------------------------------------------ window metadata kernel and adapter


@pytest.mark.parametrize(
    "W,b,K,S", [(100, 16, 0, 16), (10, 4, 2, 5), (2000, 16, 0, 48), (12, 4, 0, 40), (24, 8, 1, 1)]
)
@pytest.mark.parametrize("table_dtype", [torch.int32, torch.int64])
def test_window_metadata_with_sinks_equals_the_arithmetic(W, b, K, S, table_dtype):
    """Random tables and lengths (0, 1, b, window inside the sinks, S > seq):
    lengths, start and table equal ``window_seq_lens_and_block_table(...,
    sink_size=S)`` / ``compute_window``; rows past num_reqs stay untouched."""
    gen = torch.Generator().manual_seed(W + b + S)
    seq_lens = torch.randint(0, 300, (11,), generator=gen, dtype=torch.int32)
    seq_lens[:5] = torch.tensor([0, 1, b, W + b, S + 1])
    table = torch.randint(1, 1000, (11, 20), generator=gen).to(table_dtype)
    seq_lens, table = seq_lens.to(DEVICE), table.to(DEVICE)
    cols = window.max_window_blocks(W, b, sink_size=S)
    buffer = torch.full((13, cols), -7, dtype=torch.int32, device=DEVICE)  # poisoned
    lens, start, out = window_metadata_triton(
        seq_lens, table, W, b, K, out_table=buffer[:11], sink_size=S
    )
    want_lens, want_table = window.window_seq_lens_and_block_table(
        seq_lens, table, W, b, K, sink_size=S
    )
    assert torch.equal(lens, want_lens)
    assert torch.equal(start, window.compute_window(seq_lens, W, b, K, sink_size=S).start)
    assert torch.equal(out.long(), want_table.long())
    assert torch.all(buffer[11:] == -7), "rows past num_reqs must stay untouched"
    with pytest.raises(ValueError, match=f"expected \\(11, {cols}\\)"):
        window_metadata_triton(
            seq_lens, table, W, b, K, sink_size=S, out_table=buffer[:11, : cols - 1]
        )


def test_window_metadata_zero_sinks_and_empty_table():
    seq_lens = torch.tensor([5, 40], dtype=torch.int32, device=DEVICE)
    table = torch.randint(1, 99, (2, 12), dtype=torch.int32).to(DEVICE)
    assert all(
        torch.equal(x, y)
        for x, y in zip(
            window_metadata_triton(seq_lens, table, 8, 4, sink_size=0),
            window_metadata_triton(seq_lens, table, 8, 4),
        )
    )
    lens, start, out = window_metadata_triton(seq_lens, table[:, :0], 8, 4, sink_size=6)
    assert lens.tolist() == [5, 16] and start.tolist() == [0, 32]
    assert out.shape == (2, 5) and torch.all(out == 0)
    with pytest.raises(ValueError, match="sink_size=-2 is invalid"):
        window_metadata_triton(seq_lens, table, 8, 4, sink_size=-2)


def test_adapter_with_sinks_fused_equals_eager_and_the_arithmetic():
    gen = torch.Generator().manual_seed(5)
    W, b, K, S = 24, 8, 1, 12
    fused = SlidingWindowAdapter(
        W, b, max_num_reqs=6, future_offset=K, device=DEVICE, fused=True, sink_size=S
    )
    eager = SlidingWindowAdapter(
        W, b, max_num_reqs=6, future_offset=K, device=DEVICE, fused=False, sink_size=S
    )
    assert fused.block_table_buffer.shape == (6, window.max_window_blocks(W, b, sink_size=S))
    ptr = fused.block_table_buffer.data_ptr()
    for _ in range(2):
        seq_lens = torch.randint(0, 120, (5,), generator=gen, dtype=torch.int32).to(DEVICE)
        table = torch.randint(1, 500, (5, 16), generator=gen, dtype=torch.int32).to(DEVICE)
        got = fused.apply(seq_lens, table, seq_lens_cpu=seq_lens.cpu(), max_seq_len=120)
        want = eager.apply(seq_lens, table, seq_lens_cpu=seq_lens.cpu(), max_seq_len=120)
        want_lens, want_table = window.window_seq_lens_and_block_table(
            seq_lens, table, W, b, K, sink_size=S
        )
        assert got.block_table.data_ptr() == ptr
        for meta in (got, want):
            assert torch.equal(meta.block_table, want_table)
            assert torch.equal(meta.seq_lens, want_lens)
            assert torch.equal(meta.seq_lens_cpu, want_lens.cpu())
            assert meta.max_seq_len == window.window_upper_bound(120, W, b, K, sink_size=S)
        assert torch.equal(got.start, want.start)
    assert got.max_seq_len == W - K + b - 1 + 16


def test_adapter_from_config_takes_the_sink_option():
    config = DraftWindowConfig(
        draft_window_size=64, method="eagle3", num_speculative_tokens=3, draft_sink_size=20
    )
    adapter = SlidingWindowAdapter.from_config(config, max_num_reqs=4, block_size=16)
    assert (adapter.window_size, adapter.block_size, adapter.future_offset, adapter.sink_size) == (
        64,
        16,
        3,
        20,
    )
    assert adapter.block_table_buffer.shape == (4, window.max_window_blocks(64, 16) + 2)
    own_b = DraftWindowConfig(draft_window_size=64, block_size=8, draft_sink_size=1)
    assert SlidingWindowAdapter.from_config(own_b, 2, block_size=16).block_size == 8
    with pytest.raises(ValueError, match="block_size=None is invalid"):
        SlidingWindowAdapter.from_config(DraftWindowConfig(draft_window_size=64), 2)
    with pytest.raises(ValueError, match="window is off"):
        SlidingWindowAdapter.from_config(DraftWindowConfig(), 2, block_size=16)
    with pytest.raises(ValueError, match="sink_size=-1 is invalid"):
        SlidingWindowAdapter(64, 16, 2, sink_size=-1)


# --------------------------------------------------------------- CUDA (run on a GPU)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the Triton kernels on CUDA")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sink_kernels_on_cuda_match_the_reference(dtype):
    """A moderate size on the GPU: 8 requests, contexts up to 3k, causal blocks of
    up to 48 queries and decodes, W=256, b=16, S=40 (3 sink blocks), GQA 4; the
    window metadata from the fused kernel (decode form) and the arithmetic
    (causal form) against the reference on the full table."""
    gen = torch.Generator().manual_seed(0)
    seq_lens = [3000, 2049, 700, 257, 40, 1, 1500, 999]
    q_lens = [48, 1, 33, 1, 17, 1, 1, 16]
    W, b, K, S = 256, 16, 0, 40
    batch = make_paged_batch(seq_lens, q_lens, b, device="cuda", generator=gen)
    kc, vc = random_kv_cache(batch.num_blocks, b, 2, 64, dtype=dtype, device="cuda", generator=gen)
    q = torch.randn(batch.num_tokens, 8, 64, generator=gen).to("cuda", dtype)
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    full = (q, kc, vc, batch.block_table, batch.seq_lens, batch.query_start_loc, 0.125)
    lens, table, offset = window.causal_window_metadata(
        batch.seq_lens,
        batch.block_table,
        batch.query_start_loc,
        W,
        b,
        K,
        max_query_len=batch.num_tokens,
        sink_size=S,
    )
    want = paged_attention_ref(*full, True, window_size=W, future_offset=K, sink_size=S)
    got = torch.ops.dspark.paged_attention(
        q, kc, vc, table, lens, batch.query_start_loc, 0.125, True, offset, W, K, S
    )
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)
    lens, start, table = window_metadata_triton(
        batch.seq_lens, batch.block_table, W, b, K, sink_size=S
    )
    want = paged_attention_ref(*full, False, window_size=W, future_offset=K, sink_size=S)
    got = paged_attention_triton(q, kc, vc, table, lens, batch.query_start_loc, 0.125, False)
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


def require_sink_forwarding() -> None:
    """Fail (never skip) unless this tree's window pass gives ``dspark::paged_attention``'s
    per-token calls ``sink_size`` (its registered ``PerTokenWindowArgs.sink_size``, the
    graph-pass side of issue 13): a missing ``sink_size`` is a defect, not a platform gap."""
    import dataclasses

    from dspark_compile.passes.attention_registry import PerTokenWindowArgs, attention_op_specs

    if "sink_size" not in {f.name for f in dataclasses.fields(PerTokenWindowArgs)}:
        pytest.fail("PerTokenWindowArgs has no sink_size: the window pass cannot forward sinks")
    spec = attention_op_specs().get(torch.ops.dspark.paged_attention.default)
    if spec is None or spec.per_token_window is None or spec.per_token_window.sink_size is None:
        pytest.fail(
            "dspark::paged_attention is registered without a per-token sink_size argument: "
            f"the window pass would refuse draft_sink_size ({spec})"
        )


def test_the_window_pass_forwards_sink_size():
    require_sink_forwarding()


def test_negative_control_a_missing_sink_size_fails_not_skips(monkeypatch):
    """With ``dspark::paged_attention`` registered without ``sink_size`` (as before issue
    13), the check fails the test: a ``Failed``, not a ``Skipped``."""
    import dataclasses

    from dspark_compile.passes import attention_registry

    op = torch.ops.dspark.paged_attention.default
    spec = attention_registry.attention_op_specs()[op]
    without = dataclasses.replace(
        spec, per_token_window=attention_registry.PerTokenWindowArgs(sink_size=None)
    )
    monkeypatch.setitem(attention_registry._REGISTRY, op, without)
    with pytest.raises(pytest.fail.Exception, match="without a per-token sink_size"):
        require_sink_forwarding()


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton kernels under Inductor on CUDA")
@pytest.mark.parametrize("sink_size", [4, 40])
def test_compiled_causal_draft_with_sinks_on_cuda_matches_the_dense_mask(sink_size):
    """Inductor on CUDA with ``draft_sink_size``: the window code and the Triton
    attention with sinks and per-token bounds, for a long causal block (draft
    prefill) beside decodes (as test_per_token_window's CUDA test, plus sinks:
    one block, and 10 blocks so the window of the short request starts inside them)."""
    require_sink_forwarding()
    from tests.draft_cases import cuda_args, make_draft_case

    case = make_draft_case([300, 70, 9], [120, 1, 9], causal=True, seed=1)
    W = 32

    def attention(
        query, key_cache, value_cache, block_table, seq_lens, query_start_loc, scale, causal
    ):
        return dense_sink_attention(
            query,
            key_cache,
            value_cache,
            block_table,
            seq_lens,
            query_start_loc,
            scale,
            causal,
            W,
            0,
            sink_size,
        ).to(query.dtype)

    keys, values = case.clone_caches()
    case.model.attention_override = attention
    try:
        with torch.no_grad():
            want = case.model(*case.args(keys, values))
    finally:
        case.model.attention_override = None
    args = cuda_args(case)
    torch._dynamo.reset()
    compiled = torch.compile(
        case.model.cuda(),
        backend="dspark",
        dynamic=False,
        options={"draft_window_size": W, "method": "dflash", "draft_sink_size": sink_size},
    )
    with torch.no_grad():
        got = compiled(*args)
    torch.testing.assert_close(got.cpu(), want, rtol=2e-4, atol=2e-4)
