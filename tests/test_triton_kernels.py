"""Triton kernels against their torch references.

Without a GPU they run on CPU tensors in the Triton interpreter (conftest sets
TRITON_INTERPRET=1), so every case here also runs in CI. Outputs are poisoned
(NaN / a sentinel) before each run so unwritten elements fail.
"""

import pytest
import torch

import dspark_compile  # noqa: F401
from dspark_compile.arithmetic.window import (
    compute_window,
    gather_window_block_table,
    max_window_blocks,
)
from dspark_compile.kernels.paged_attention import paged_attention_ref
from dspark_compile.kernels.paged_attention_launch import choose_launch, wave_fit_splits
from dspark_compile.kernels.paged_attention_triton import paged_attention_triton
from dspark_compile.kernels.window_metadata import window_metadata_triton
from dspark_compile.models import make_paged_batch, random_kv_cache
from dspark_compile.runtime.sliding_window import SlidingWindowAdapter

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _batch(seq_lens, q_lens, block_size, heads, kv_heads, head_dim, dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    batch = make_paged_batch(seq_lens, q_lens, block_size, device=DEVICE, generator=gen)
    kc, vc = random_kv_cache(
        batch.num_blocks, block_size, kv_heads, head_dim, dtype=dtype, device=DEVICE, generator=gen
    )
    q = torch.randn(batch.num_tokens, heads, head_dim, generator=gen).to(DEVICE, dtype)
    return batch, q, kc, vc


def _run(q, kc, vc, table, seq_lens, qsl, scale, causal, **launch):
    out = torch.full_like(q, float("nan"))
    got = paged_attention_triton(q, kc, vc, table, seq_lens, qsl, scale, causal, out=out, **launch)
    assert got.data_ptr() == out.data_ptr()
    assert not torch.isnan(got).any(), "unwritten or NaN output"
    return got


def _assert_close(got, want, dtype):
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol)


ATTENTION_CASES = [
    # seq_lens, q_lens, b, Hq, Hkv, D, dtype, splits: decode (q_len 1) with an empty
    # request and seq_len < b, GQA 4, split-KV vs one split
    ([37, 9, 0, 64, 3], [1, 1, 0, 1, 1], 4, 8, 2, 16, torch.float32, None),
    ([37, 9, 0, 64, 3], [1, 1, 0, 1, 1], 4, 8, 2, 16, torch.float32, 1),
    # DFlash/DSpark query blocks, GQA 3 (not a power of two), head_dim 24 (padded)
    ([40, 23, 8, 61], [8, 8, 8, 8], 4, 6, 2, 24, torch.float32, 3),
    # GQA 16: query tiles of 4 queries, so one request spans several tiles
    ([30, 17], [9, 5], 8, 16, 1, 16, torch.float32, 2),
    # low precision: fp32 accumulation, result in the input dtype
    ([50, 19], [6, 1], 16, 4, 4, 32, torch.bfloat16, None),
    ([50, 19], [3, 4], 16, 4, 2, 32, torch.float16, 2),
]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("seq_lens,q_lens,b,hq,hkv,d,dtype,splits", ATTENTION_CASES)
def test_paged_attention_matches_reference(causal, seq_lens, q_lens, b, hq, hkv, d, dtype, splits):
    batch, q, kc, vc = _batch(seq_lens, q_lens, b, hq, hkv, d, dtype, seed=sum(seq_lens) + d)
    args = (q, kc, vc, batch.block_table, batch.seq_lens, batch.query_start_loc, d**-0.5, causal)
    got = _run(*args, num_splits=splits)
    _assert_close(got, paged_attention_ref(*args), dtype)


@pytest.mark.parametrize(
    "launch",
    [
        dict(exact_tiles=True),
        dict(heads_first=True),
        dict(exact_tiles=True, heads_first=True),
        dict(programs_per_sm=1, min_split_tokens=8),
        dict(programs_per_sm=64, min_split_tokens=4),
    ],
)
@pytest.mark.parametrize("q_lens", [[1, 1, 0, 1, 1], [3, 1, 0, 4, 2]])
def test_launch_knobs_do_not_change_the_result(launch, q_lens):
    """The tuning knobs (benchmarks/bench_peer_attention.py --configs) only cut the
    work differently: decode (q_len 1, where exact_tiles applies) with an empty
    request, and mixed query blocks (exact_tiles ignored), GQA 4, causal."""
    batch, q, kc, vc = _batch([37, 9, 0, 64, 3], q_lens, 4, 8, 2, 16, torch.float32, 3)
    args = (q, kc, vc, batch.block_table, batch.seq_lens, batch.query_start_loc, 0.25, True)
    _assert_close(_run(*args, **launch), paged_attention_ref(*args), torch.float32)


def test_splits_fill_whole_waves():
    """Fewest splits whose programs fill their waves to >= 90%; else the best fill."""
    # 256 decode programs (32 requests x 8 KV heads), 132 SMs x 3 resident: 3 splits
    # (768 of 792 slots), not 1 or 2 (256 or 512 of 396 / 792)
    assert wave_fit_splits(256, 396, 32768, 128, 128) == 3
    assert wave_fit_splits(256, 264, 32768, 128, 128) == 1
    # few programs, short table: the most splits allowed (256 tokens each)
    assert wave_fit_splits(8, 396, 2064, 128, 9) == 9
    # 8 programs, 264 slots: 32 splits (256 programs), not 29-31 (rounded to 29)
    assert wave_fit_splits(8, 264, 32768, 128, 128) == 32


def _launch(cfg):
    return (
        cfg.num_splits,
        cfg.block_n,
        cfg.num_warps,
        cfg.num_stages,
        cfg.exact_tiles,
        cfg.heads_first,
    )


def test_default_launches_are_the_measured_ones():
    """The H200 launches behind benchmarks/results/2026-11-30/2026-11-30-h200-pipelined-launches.md
    (Hq 32 / Hkv 8, b=16, W=2048 -> 129-block windowed tables, 132 SMs)."""
    gpu = torch.device("cuda", 0)  # only picks defaults; nothing touches a GPU
    win = max_window_blocks(2048, 16)
    long_decode = (1, 128, 4, 5, True, True)  # pipelined, 1 program per SM
    short_decode = (1, 128, 4, 3, True, True)  # 2 programs per SM
    for width in (2048, 8192):  # batch 32 decode: 32k, 128k
        assert _launch(choose_launch(32, 32, 8, 4, width, 16, gpu, num_sms=132)) == long_decode
    assert _launch(choose_launch(32, 32, 8, 4, win, 16, gpu, num_sms=132)) == short_decode
    in_kernel = choose_launch(32, 32, 8, 4, 2048, 16, gpu, num_sms=132, window_tokens=2048)
    assert _launch(in_kernel) == short_decode  # the window's span decides, not the table
    assert _launch(choose_launch(1, 1, 8, 4, 2048, 16, gpu, num_sms=132)) == (15,) + long_decode[1:]
    assert _launch(choose_launch(1, 1, 8, 4, win, 16, gpu, num_sms=132)) == (9,) + short_decode[1:]
    blocks = (1, 64, 4, 5, False, False)  # 16-token blocks, pipelined
    for width in (8192, win):  # 128k and the window
        launch = choose_launch(512, 32, 8, 4, width, 16, gpu, num_sms=132)
        assert _launch(launch) == blocks and launch.block_m == 64
    # the earlier default, as a sweep's baseline
    old = choose_launch(
        32,
        32,
        8,
        4,
        2048,
        16,
        gpu,
        num_sms=132,
        programs_per_sm=16,
        block_n=64,
        num_stages=3,
        exact_tiles=False,
        heads_first=False,
    )
    assert _launch(old) == (9, 64, 4, 3, False, False)
    # the earlier rule on request: ceil(16 x 132 / 256) = 9 splits
    assert (
        choose_launch(
            32, 32, 8, 4, 2048, 16, gpu, num_sms=132, programs_per_sm=16, block_n=64
        ).num_splits
        == 9
    )


def test_launch_that_does_not_fit_retries_smaller_and_remembers(monkeypatch):
    """A GPU with less shared memory than a default launch needs (the long-table
    launches take 113-137 KiB; many GPUs allow ~100 KiB per block): the op retries
    with fewer stages, then a smaller KV tile, gives the same result, and goes
    straight to the shape that fit on the next call."""
    import triton

    from dspark_compile.kernels import (
        paged_attention_launch as policy,
        paged_attention_triton as pat,
    )

    batch, q, kc, vc = _batch([37, 9, 64], [1, 1, 1], 4, 8, 2, 16, torch.float32, 3)
    args = (q, kc, vc, batch.block_table, batch.seq_lens, batch.query_start_loc, 0.25, True)
    want = paged_attention_ref(*args)
    real_launch, tried = pat._launch, []

    def small_gpu(cfg, *rest):
        tried.append((cfg.block_n, cfg.num_stages))
        if cfg.block_n * cfg.num_stages > 32:  # "needs too much shared memory"
            raise triton.runtime.errors.OutOfResources(cfg.num_stages * 1000, 1000, "shared memory")
        return real_launch(cfg, *rest)

    monkeypatch.setattr(pat, "_launch", small_gpu)
    monkeypatch.setattr(policy, "_FITTED_SHAPES", {})
    _assert_close(_run(*args, block_n=16, num_stages=5), want, torch.float32)
    assert tried == [(16, 5), (16, 4), (16, 3), (16, 2)]
    tried.clear()
    _assert_close(_run(*args, block_n=16, num_stages=5), want, torch.float32)
    assert tried == [(16, 2)]  # remembered for this shape
    tried.clear()

    def nothing_fits(cfg, *rest):
        tried.append((cfg.block_n, cfg.num_stages))
        raise triton.runtime.errors.OutOfResources(1, 0, "shared memory")

    monkeypatch.setattr(pat, "_launch", nothing_fits)
    with pytest.raises(triton.runtime.errors.OutOfResources):
        _run(*args, block_n=32, num_stages=2)
    assert tried == [(32, 2), (32, 1), (16, 2), (16, 1)]
    assert policy.smaller_tile(16, 1) is None


def test_launch_knobs_shape_the_grid():
    gpu = torch.device("cuda", 0)  # only picks defaults; nothing touches a GPU
    decode = choose_launch(
        32,
        32,
        8,
        4,
        129,
        16,
        gpu,
        num_sms=132,
        exact_tiles=True,
        heads_first=True,
        programs_per_sm=2,
        min_split_tokens=512,
    )
    assert decode.grid(32, 32, 8) == (8, 32, decode.num_splits)
    assert decode.num_splits == 2  # 2 x 132 programs wanted / 256
    blocks = choose_launch(32 * 16, 32, 8, 4, 129, 16, gpu, num_sms=132, exact_tiles=True)
    assert not blocks.exact_tiles and blocks.grid(512, 32, 8) == (64, 8, blocks.num_splits)
    with pytest.raises(ValueError, match="launch options"):
        paged_attention_triton(
            *_batch([5], [1], 4, 2, 1, 16, torch.float32, 1)[1:4],
            torch.zeros(1, 2, dtype=torch.int32),
            torch.ones(1, dtype=torch.int32),
            torch.tensor([0, 1], dtype=torch.int32),
            0.3,
            True,
            splits=2,
        )


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window,future_offset", [(10, 0), (12, 2), (200, 0)])
def test_windowed_kernels_match_masked_full_reference(causal, window, future_offset):
    """Both kernels together, as after the window pass: fused window metadata,
    then attention over the windowed (lengths, table) == the reference masked to
    [start, seq_len) on the FULL table. W=10/12 are not multiples of b=4;
    W=200 is larger than every sequence."""
    batch, q, kc, vc = _batch([45, 12, 3, 30], [4, 1, 3, 4], 4, 8, 2, 16, torch.float32, 11)
    lens, start, table = window_metadata_triton(
        batch.seq_lens, batch.block_table, window, 4, future_offset
    )
    got = _run(q, kc, vc, table, lens, batch.query_start_loc, 0.25, causal, num_splits=2)
    kv_start = compute_window(batch.seq_lens, window, 4, future_offset).start
    want = paged_attention_ref(
        q,
        kc,
        vc,
        batch.block_table,
        batch.seq_lens,
        batch.query_start_loc,
        0.25,
        causal,
        kv_start=kv_start,
    )
    _assert_close(got, want, torch.float32)


def test_queries_before_the_window_see_nothing_and_output_zeros():
    """seq_len < q_len (window shorter than the block): causal queries at
    negative positions output exactly 0, never NaN."""
    batch, q, kc, vc = _batch([20, 9], [5, 2], 4, 4, 2, 16, torch.float32, 5)
    seq_lens = torch.tensor([3, 0], dtype=torch.int32, device=DEVICE)
    args = (q, kc, vc, batch.block_table, seq_lens, batch.query_start_loc, 0.3, True)
    got = _run(*args, num_splits=2)
    want = paged_attention_ref(*args)
    _assert_close(got, want, torch.float32)
    assert torch.all(got[:2] == 0) and torch.all(got[5:] == 0) and got[2:5].abs().sum() > 0


def test_empty_block_table_and_no_tokens():
    batch, q, kc, vc = _batch([5], [2], 4, 2, 1, 16, torch.float32, 1)
    no_table = batch.block_table[:, :0]
    got = _run(
        q, kc, vc, no_table, torch.zeros_like(batch.seq_lens), batch.query_start_loc, 0.3, False
    )
    assert torch.all(got == 0)
    empty = paged_attention_triton(
        q[:0],
        kc,
        vc,
        batch.block_table[:0],
        batch.seq_lens[:0],
        batch.query_start_loc[:1],
        0.3,
        False,
    )
    assert empty.shape == (0, 2, 16)


def test_launch_is_sized_from_table_width_not_lengths():
    """Same shapes, different lengths -> same launch; windowed width -> fewer splits."""
    gpu = torch.device("cuda", 0)  # only picks defaults; nothing touches a GPU
    full = choose_launch(32, 32, 8, 4, 8192, 16, gpu, block_n=64, num_sms=132)
    windowed = choose_launch(
        32, 32, 8, 4, max_window_blocks(2048, 16), 16, gpu, block_n=64, num_sms=132
    )
    assert full.num_splits * full.tokens_per_split >= 8192 * 16
    assert windowed.num_splits * windowed.tokens_per_split < 2 * (2048 + 2 * 16 + 64)
    assert (full.block_q, full.block_m) == (1, 16)
    blocks = choose_launch(32 * 16, 32, 8, 4, 129, 16, gpu, num_sms=132)
    assert blocks.block_q == 16 and blocks.block_m == 64


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("window", [None, 24])
def test_splits_cut_each_span_so_a_wider_table_changes_nothing(causal, window):
    """The split COUNT comes from shapes, each split's LENGTH from the tile's own span
    (seq_lens): the same batch with its table padded to 8x the columns (a CUDA graph
    captured for a longer context) gives bit-for-bit the same output for the same count,
    and never reads the padding (it points at a NaN block)."""
    batch, q, kc, vc = _batch([70, 33, 5, 0, 48], [1, 6, 5, 0, 16], 4, 4, 2, 16, torch.float32, 7)
    poison = torch.full_like(kc[:1], float("nan"))
    kc, vc = torch.cat([kc, poison]), torch.cat([vc, poison])
    width = batch.block_table.shape[1]
    pad = torch.full((batch.block_table.shape[0], 7 * width), kc.shape[0] - 1)
    wide = torch.cat([batch.block_table, pad.to(batch.block_table)], dim=1)
    common = (batch.seq_lens, batch.query_start_loc, 0.25, causal)
    kw = {} if window is None else dict(window_size=window, future_offset=1)
    want = paged_attention_ref(q, kc, vc, batch.block_table, *common, **kw)
    for splits in (2, 5):
        tight = _run(q, kc, vc, batch.block_table, *common, num_splits=splits, **kw)
        assert torch.equal(_run(q, kc, vc, wide, *common, num_splits=splits, **kw), tight)
        _assert_close(tight, want, torch.float32)


def test_paged_attention_rejects_bad_inputs():
    batch, q, kc, vc = _batch([5], [2], 4, 3, 2, 16, torch.float32, 1)
    with pytest.raises(ValueError, match="3 heads.*multiple of the cache's 2"):
        paged_attention_triton(
            q, kc, vc, batch.block_table, batch.seq_lens, batch.query_start_loc, 0.3, False
        )
    with pytest.raises(ValueError, match="dtype.*expected one of"):
        paged_attention_triton(
            q[:, :2].double(),
            kc.double(),
            vc.double(),
            batch.block_table,
            batch.seq_lens,
            batch.query_start_loc,
            0.3,
            False,
        )
    with pytest.raises(ValueError, match="out \\(2, 2, 16\\) torch.float16 is invalid"):
        paged_attention_triton(
            q[:, :2].contiguous(),
            kc,
            vc,
            batch.block_table,
            batch.seq_lens,
            batch.query_start_loc,
            0.3,
            False,
            out=q.new_empty(2, 2, 16, dtype=torch.float16),
        )
    with pytest.raises(ValueError, match="num_splits=0 is invalid"):
        paged_attention_triton(
            q[:, :2].contiguous(),
            kc,
            vc,
            batch.block_table,
            batch.seq_lens,
            batch.query_start_loc,
            0.3,
            False,
            num_splits=0,
        )


def test_cuda_registration_runs_the_triton_kernel():
    """The op's CUDA kernel (exercised here on CPU tensors in the interpreter)
    is the Triton path and matches the reference."""
    from dspark_compile.ops.paged_attention import _paged_attention_cuda

    batch, q, kc, vc = _batch([33, 7], [4, 1], 4, 4, 2, 16, torch.float32, 3)
    args = (q, kc, vc, batch.block_table, batch.seq_lens, batch.query_start_loc, 0.3, True)
    _assert_close(_paged_attention_cuda(*args), paged_attention_ref(*args), torch.float32)


WINDOW_CASES = [  # W, b, K
    (100, 16, 0),  # b does not divide W: needs ceil(W/b) + 1 = 8 columns
    (10, 4, 2),  # eagle3-style future offset
    (2000, 16, 0),  # window larger than every sequence
    (12, 4, 0),
]


@pytest.mark.parametrize("window,block_size,future_offset", WINDOW_CASES)
@pytest.mark.parametrize("table_dtype", [torch.int32, torch.int64])
def test_window_metadata_matches_reference(window, block_size, future_offset, table_dtype):
    gen = torch.Generator().manual_seed(window + block_size)
    seq_lens = torch.randint(0, 300, (9,), generator=gen, dtype=torch.int32)
    seq_lens[:3] = torch.tensor([0, 1, block_size])
    table = torch.randint(0, 1000, (9, 20), generator=gen).to(table_dtype)
    seq_lens, table = seq_lens.to(DEVICE), table.to(DEVICE)
    cols = max_window_blocks(window, block_size)
    buffer = torch.full((12, cols), -7, dtype=torch.int32, device=DEVICE)  # poisoned
    lens, start, out = window_metadata_triton(
        seq_lens, table, window, block_size, future_offset, out_table=buffer[:9]
    )
    want = compute_window(seq_lens, window, block_size, future_offset)
    assert torch.equal(lens, want.windowed_len) and torch.equal(start, want.start)
    assert out.data_ptr() == buffer.data_ptr()
    expected = gather_window_block_table(table, want.start_block, want.needed, cols)
    assert torch.equal(out.long(), expected.long())
    assert torch.all(buffer[9:] == -7), "rows past num_reqs must stay untouched"


def test_window_metadata_edge_shapes_and_errors():
    seq_lens = torch.tensor([5, 40], dtype=torch.int32, device=DEVICE)
    lens, start, table = window_metadata_triton(
        seq_lens, torch.zeros(2, 0, dtype=torch.int32, device=DEVICE), 8, 4
    )
    assert lens.tolist() == [5, 8] and start.tolist() == [0, 32]
    assert table.shape == (2, 3) and torch.all(table == 0)
    empty = window_metadata_triton(seq_lens[:0], torch.zeros(0, 4, dtype=torch.int32), 8, 4)
    assert empty[2].shape == (0, 3)
    with pytest.raises(ValueError, match="out_table has shape \\(2, 5\\), expected \\(2, 3\\)"):
        window_metadata_triton(
            seq_lens,
            torch.zeros(2, 4, dtype=torch.int32, device=DEVICE),
            8,
            4,
            out_table=torch.zeros(2, 5, dtype=torch.int32),
        )
    with pytest.raises(ValueError, match="window_size=0 is invalid"):
        window_metadata_triton(seq_lens, torch.zeros(2, 4, dtype=torch.int32), 0, 4)


def test_adapter_fused_equals_reference_with_a_stable_buffer():
    gen = torch.Generator().manual_seed(2)
    fused = SlidingWindowAdapter(24, 8, max_num_reqs=6, future_offset=1, device=DEVICE, fused=True)
    eager = SlidingWindowAdapter(24, 8, max_num_reqs=6, future_offset=1, device=DEVICE, fused=False)
    ptr = fused.block_table_buffer.data_ptr()
    for _ in range(2):  # seq_lens change between steps, the buffer stays put
        seq_lens = torch.randint(0, 120, (5,), generator=gen, dtype=torch.int32).to(DEVICE)
        table = torch.randint(0, 500, (5, 16), generator=gen, dtype=torch.int32).to(DEVICE)
        got = fused.apply(seq_lens, table, seq_lens_cpu=seq_lens.cpu(), max_seq_len=120)
        want = eager.apply(seq_lens, table, seq_lens_cpu=seq_lens.cpu(), max_seq_len=120)
        assert got.block_table.data_ptr() == ptr
        assert torch.equal(got.block_table, want.block_table)
        assert torch.equal(got.seq_lens, want.seq_lens) and torch.equal(got.start, want.start)
        assert torch.equal(got.seq_lens_cpu, want.seq_lens_cpu)
        assert got.max_seq_len == want.max_seq_len == 24 - 1 + 8 - 1
        assert got.full_block_table is table


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reshape_and_cache_matches_reference(dtype):
    """KV rows land at absolute slots, negative slots are skipped, nothing else changes
    (exercised through the op's CUDA registration on CPU tensors)."""
    from dspark_compile.kernels.paged_attention import reshape_and_cache_ref
    from dspark_compile.ops.paged_attention import _reshape_and_cache_cuda

    gen = torch.Generator().manual_seed(4)
    kc, vc = random_kv_cache(6, 4, 3, 24, dtype=dtype, device=DEVICE, generator=gen)
    key = torch.randn(5, 3, 24, generator=gen).to(DEVICE, dtype)
    value = torch.randn(5, 3, 24, generator=gen).to(DEVICE, dtype)
    slots = torch.tensor([0, 23, -1, 9, 14], device=DEVICE)
    want_k, want_v = kc.clone(), vc.clone()
    reshape_and_cache_ref(key, value, want_k, want_v, slots)
    _reshape_and_cache_cuda(key, value, kc, vc, slots)
    assert torch.equal(kc, want_k) and torch.equal(vc, want_v)
    assert not torch.equal(
        kc,
        random_kv_cache(
            6, 4, 3, 24, dtype=dtype, device=DEVICE, generator=torch.Generator().manual_seed(4)
        )[0],
    )


def test_cuda_registration_falls_back_to_the_reference_with_a_warning(caplog):
    """float64 has no Triton path: the reference runs and the fallback is logged."""
    from dspark_compile.ops.paged_attention import _paged_attention_cuda

    batch, q, kc, vc = _batch([9, 4], [2, 1], 4, 2, 1, 16, torch.float64, 8)
    args = (q, kc, vc, batch.block_table, batch.seq_lens, batch.query_start_loc, 0.3, False)
    with caplog.at_level("WARNING"):
        got = _paged_attention_cuda(*args)
    torch.testing.assert_close(got, paged_attention_ref(*args))
    assert "no Triton kernel for query torch.float64" in caplog.text
