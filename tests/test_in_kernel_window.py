"""The window applied inside the paged-attention kernel, on the FULL block table.

``dspark.paged_attention(..., window_size=W)`` without ``kv_offset`` needs no
window-metadata launch and no gathered table: the kernel starts each query
tile at its first query's ``lo`` and cuts only the window span into splits.
Checked against the torch reference, the dense position
mask (``tests/dense_sink_oracle.py``) and the two-launch form (gathered table
+ ``kv_offset``), with and without sinks, one split and several. Without a GPU
the kernel runs in the Triton interpreter; outputs are poisoned with NaN first.
"""

import pytest
import torch
from hypothesis import given, settings, strategies as st

import dspark_compile  # noqa: F401  (registers torch.ops.dspark)
from dspark_compile.arithmetic import window
from dspark_compile.kernels.paged_attention import paged_attention_ref
from dspark_compile.kernels.paged_attention_launch import choose_launch
from dspark_compile.kernels.paged_attention_triton import paged_attention_triton
from dspark_compile.models import make_paged_batch, random_kv_cache
from tests.dense_sink_oracle import dense_sink_attention, random_window_cases

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# seq_lens, q_lens, W, b, K, S, (Hq, Hkv)
CASES = {
    "empty request, seq < b": ([50, 0, 3, 21], [20, 0, 3, 0], 12, 8, 0, 8, (4, 2)),
    "W > seq": ([30, 12], [12, 5], 200, 4, 0, 4, (4, 2)),
    "W not a multiple of b, K > 0": ([61, 47], [17, 9], 13, 8, 2, 5, (6, 2)),
    "window deep in a long table": ([700, 390, 1], [3, 1, 1], 24, 8, 1, 9, (4, 1)),
    "mixed decode and prefill": ([64, 35, 9, 100], [1, 20, 1, 33], 12, 4, 1, 8, (4, 4)),
}


def _case(name, seed):
    seq_lens, q_lens, W, b, K, S, (hq, hkv) = CASES[name]
    gen = torch.Generator().manual_seed(seed)
    batch = make_paged_batch(seq_lens, q_lens, b, device=DEVICE, generator=gen)
    kc, vc = random_kv_cache(batch.num_blocks, b, hkv, 16, device=DEVICE, generator=gen)
    q = torch.randn(batch.num_tokens, hq, 16, generator=gen).to(DEVICE)
    return batch, q, kc, vc, W, b, K, S


def _triton(*args, **kwargs):
    out = torch.full_like(args[0], float("nan"))
    got = paged_attention_triton(*args, out=out, **kwargs)
    assert not torch.isnan(got).any(), "unwritten or NaN output"
    return got


def _close(got, want, tol=1e-5):
    torch.testing.assert_close(got.double().cpu(), want.double().cpu(), rtol=tol, atol=tol)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", list(CASES))
def test_full_table_window_matches_reference_dense_mask_and_two_launch_form(name, causal):
    batch, q, kc, vc, W, b, K, S_case = _case(name, seed=len(name))
    args = (q, kc, vc, batch.block_table, batch.seq_lens, batch.query_start_loc, 0.3, causal)
    for S in (0, S_case):
        window_args = dict(window_size=W, future_offset=K, sink_size=S)
        want = dense_sink_attention(*args, W, K, S)
        _close(paged_attention_ref(*args, **window_args), want)
        for splits in (None, 1, 3):
            _close(_triton(*args, num_splits=splits, **window_args), want)
        if causal:  # the per-token form the window pass inserts: same values
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
            two_launch = _triton(
                q,
                kc,
                vc,
                table,
                lens,
                batch.query_start_loc,
                0.3,
                True,
                kv_offset=offset,
                **window_args,
            )
            _close(two_launch, want)


def test_splits_cut_the_window_span_not_the_table():
    """A 128k-token table with W=2048: the launch sizes its splits from the window
    span (W + b + block_q tokens), so no program walks blocks below the window."""
    full = choose_launch(32, 32, 8, 4, 8192, 16, torch.device("cpu"), num_splits=4)
    windowed = choose_launch(
        32, 32, 8, 4, 8192, 16, torch.device("cpu"), num_splits=4, window_tokens=2048
    )
    assert full.num_splits * full.tokens_per_split >= 8192 * 16
    assert windowed.num_splits * windowed.tokens_per_split >= 2048 + 16 + windowed.block_q
    assert windowed.tokens_per_split * windowed.num_splits < 2048 + 16 + 16 + 64
    # never more than the table itself
    short = choose_launch(4, 4, 1, 4, 3, 16, torch.device("cpu"), window_tokens=2048)
    assert short.num_splits * short.tokens_per_split <= 3 * 16 + short.block_n


@settings(max_examples=300, deadline=None)
@given(
    W=st.integers(1, 300),
    b=st.sampled_from([1, 2, 4, 8, 16, 32, 64]),
    K=st.integers(0, 8),
    block_q=st.sampled_from([1, 2, 4, 8, 16, 64]),
    p0=st.integers(0, 5000),
    causal=st.booleans(),
)
def test_a_query_tile_reads_at_most_the_window_span(W, b, K, block_q, p0, causal):
    """kv_end - kv_begin <= W + b + block_q for any tile (the bound the launch uses):
    kv_begin = lo(first query) (causal) or lo(last position) (non-causal)."""
    K = min(K, W - 1)

    def lo(p):
        return max(p + 1 + K - W, 0) // b * b

    last = p0 + block_q - 1  # causal: the tile's queries p0 .. last
    kv_begin, kv_end = (lo(p0), last + 1) if causal else (lo(last), last + 1)
    assert kv_end - kv_begin <= W + b + block_q


def test_random_full_table_windows():
    for batch, q, kc, vc, W, _b, K, S, rand in random_window_cases(
        5, 5, [1, 4, 8, 16], max_window=50, max_sinks=30, max_seq=200, max_q=10, device=DEVICE
    ):
        for causal in (True, False):
            args = (
                q,
                kc,
                vc,
                batch.block_table,
                batch.seq_lens,
                batch.query_start_loc,
                0.3,
                causal,
            )
            want = dense_sink_attention(*args, W, K, S)
            got = _triton(*args, num_splits=rand(1, 4), window_size=W, future_offset=K, sink_size=S)
            _close(got, want)
