"""Attention sinks in the window arithmetic and the paged-attention reference
(docs/design.md, "Attention sinks"), checked against positions built by hand."""

import pytest
import torch
from hypothesis import given, settings, strategies as st

from dspark_compile.arithmetic import window
from dspark_compile.kernels.paged_attention import paged_attention_ref
from tests.dense_sink_oracle import dense_sink_attention, lower_bound


@st.composite
def sink_cases(draw):
    block_size = draw(st.integers(1, 16))
    window_size = draw(st.integers(1, 120))
    future_offset = draw(st.integers(0, window_size - 1))
    sink_size = draw(st.integers(0, 70))
    seq_lens = draw(st.lists(st.integers(0, 400), min_size=1, max_size=5))
    q_lens = [draw(st.integers(0, min(s, 9))) for s in seq_lens]
    return seq_lens, q_lens, window_size, block_size, future_offset, sink_size


def _table(seq_lens, block_size, seed, extra_cols=1):
    width = max(-(-s // block_size) for s in seq_lens) + extra_cols
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randperm(len(seq_lens) * width, generator=gen) + 1  # distinct, non-zero
    return ids.view(len(seq_lens), width).to(torch.int32)


def _slots(table_row, num_tokens, b):
    t = torch.arange(num_tokens)
    return (table_row[t // b].long() * b + t % b).tolist()


@settings(max_examples=300, deadline=None)
@given(sink_cases(), st.integers(0, 2**31 - 1), st.booleans())
def test_windowed_table_holds_the_sinks_then_the_window_once(case, seed, packed):
    """Decode / non-causal form: the windowed table's tokens are exactly the
    positions ``j < S_b or j >= lo(seq_len - 1)``, ascending, none twice."""
    seq_lens, _, W, b, K, S = case
    table = _table(seq_lens, b, seed)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    fn = (
        window.window_seq_lens_and_block_table_packed
        if packed
        else window.window_seq_lens_and_block_table
    )
    wlen, wtable = fn(lens, table, W, b, K, sink_size=S)
    cols = window.max_window_blocks(W, b, sink_size=S)
    assert wtable.shape == (len(seq_lens), cols)
    sink_b = -(-S // b) * b
    for i, s in enumerate(seq_lens):
        lo = lower_bound(s - 1, W, b, K) if s else 0
        want = [j for j in range(s) if j < sink_b or j >= lo]
        assert int(wlen[i]) == len(want) <= window.windowed_len_bound(W, b, K, sink_size=S)
        full = _slots(table[i], s, b)
        assert _slots(wtable[i], len(want), b) == [full[j] for j in want]
        needed = -(-len(want) // b)
        assert torch.all(wtable[i, needed:] == 0)


@settings(max_examples=200, deadline=None)
@given(sink_cases(), st.integers(0, 2**31 - 1), st.booleans())
def test_causal_table_and_offsets_map_tokens_to_their_positions(case, seed, packed):
    """Causal form: table token t is at ``table_token_positions(t, kv_offset)``;
    the table holds the sinks and every key of the first query's window."""
    seq_lens, q_lens, W, b, K, S = case
    table = _table(seq_lens, b, seed)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    qsl = torch.tensor([0] + list(torch.tensor(q_lens).cumsum(0).tolist()), dtype=torch.int32)
    max_q = max(max(q_lens), 1)
    fn = window.causal_window_metadata_packed if packed else window.causal_window_metadata
    wlen, wtable, offset = fn(lens, table, qsl, W, b, K, max_query_len=max_q, sink_size=S)
    sink_b = -(-S // b) * b
    for i, s in enumerate(seq_lens):
        first = s - max(q_lens[i], 1)
        lo = lower_bound(first, W, b, K) if s else 0
        want = [j for j in range(s) if j < sink_b or j >= lo]
        assert int(offset[i]) == lo and int(wlen[i]) == len(want)
        positions = window.table_token_positions(
            torch.arange(len(want)), offset[i].long(), S, b
        ).tolist()
        assert positions == want
        full = _slots(table[i], s, b)
        assert _slots(wtable[i], len(want), b) == [full[j] for j in want]


def test_zero_sinks_is_the_plain_window():
    lens = torch.tensor([0, 5, 100, 333], dtype=torch.int32)
    table = _table(lens.tolist(), 16, 0)
    plain = window.compute_window(lens, 64, 16, 3)
    assert plain.kept_sinks is None
    for got, want in zip(
        window.window_seq_lens_and_block_table(lens, table, 64, 16, 3, 0),
        window.window_seq_lens_and_block_table(lens, table, 64, 16, 3),
    ):
        assert torch.equal(got, want)
    assert window.max_window_blocks(64, 16, sink_size=1) == window.max_window_blocks(64, 16) + 1
    assert (
        window.windowed_len_bound(64, 16, 3, sink_size=17)
        == window.windowed_len_bound(64, 16, 3) + 32
    )


def test_bad_sink_size_names_the_argument():
    with pytest.raises(ValueError, match="sink_size=-1 is invalid"):
        window.max_window_blocks(64, 16, sink_size=-1)
    with pytest.raises(ValueError, match="sink_size=4 is invalid"):
        paged_attention_ref(
            torch.randn(1, 2, 8),
            torch.randn(2, 4, 2, 8),
            torch.randn(2, 4, 2, 8),
            torch.zeros(1, 2, dtype=torch.int32),
            torch.tensor([3]),
            torch.tensor([0, 1]),
            1.0,
            True,
            sink_size=4,
        )


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize(
    "W,b,K,S", [(24, 8, 0, 8), (24, 8, 2, 17), (10, 4, 1, 40), (100, 16, 0, 16), (9, 16, 3, 5)]
)
def test_reference_full_and_windowed_tables_match_the_dense_mask(causal, W, b, K, S):
    """The reference on the full table and on the windowed table (+ kv_offset)
    both equal dense attention with the explicit sink + window mask; edge
    cases: an empty request, seq_len < block, window past the sequence,
    window starting inside the sinks, S not a multiple of b."""
    torch.manual_seed(0)
    seq_lens, q_lens = [0, 3, 37, 90, 61], [0, 2, 5, 1, 7]
    hkv, d = 2, 8
    width = max(-(-s // b) for s in seq_lens) + 1
    num_blocks = len(seq_lens) * width + 1
    kc, vc = torch.randn(num_blocks, b, hkv, d), torch.randn(num_blocks, b, hkv, d)
    table = (
        (torch.randperm(num_blocks - 1)[: len(seq_lens) * width] + 1)
        .view(len(seq_lens), width)
        .to(torch.int32)
    )
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    qsl = torch.tensor([0] + torch.tensor(q_lens).cumsum(0).tolist(), dtype=torch.int32)
    query = torch.randn(sum(q_lens), 2 * hkv, d)
    want = dense_sink_attention(query, kc, vc, table, lens, qsl, 0.3, causal, W, K, S)
    full = paged_attention_ref(
        query, kc, vc, table, lens, qsl, 0.3, causal, window_size=W, future_offset=K, sink_size=S
    )
    torch.testing.assert_close(full.double(), want, rtol=1e-5, atol=1e-5)
    if causal:
        wlen, wtable, offset = window.causal_window_metadata(
            lens, table, qsl, W, b, K, max_query_len=max(q_lens), sink_size=S
        )
        got = paged_attention_ref(
            query,
            kc,
            vc,
            wtable,
            wlen,
            qsl,
            0.3,
            True,
            kv_offset=offset,
            window_size=W,
            future_offset=K,
            sink_size=S,
        )
    else:
        wlen, wtable = window.window_seq_lens_and_block_table(lens, table, W, b, K, S)
        got = paged_attention_ref(query, kc, vc, wtable, wlen, qsl, 0.3, False)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
