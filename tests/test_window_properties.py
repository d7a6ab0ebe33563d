"""Properties of the window arithmetic (docs/design.md, "Window arithmetic"), checked with
hypothesis."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

from dspark_compile.arithmetic import window
from dspark_compile.runtime import SlidingWindowAdapter


@st.composite
def window_cases(draw):
    block_size = draw(st.integers(1, 32))
    window_size = draw(st.integers(1, 300))
    future_offset = draw(st.integers(0, window_size - 1))
    seq_lens = draw(st.lists(st.integers(0, 700), min_size=1, max_size=6))
    extra_cols = draw(st.integers(0, 3))
    return seq_lens, window_size, block_size, future_offset, extra_cols


def _full_table(seq_lens, block_size, extra_cols, seed):
    width = max(-(-s // block_size) for s in seq_lens) + extra_cols
    gen = torch.Generator().manual_seed(seed)
    # Distinct, non-zero block ids, so a zeroed column is never a real block.
    ids = torch.randperm(len(seq_lens) * max(width, 1), generator=gen)[: len(seq_lens) * width] + 1
    return ids.view(len(seq_lens), width).to(torch.int32)


@settings(max_examples=300, deadline=None)
@given(window_cases(), st.integers(0, 2**31 - 1))
def test_window_reads_exactly_the_recent_tokens(case, seed):
    seq_lens, W, b, K, extra_cols = case
    table = _full_table(seq_lens, b, extra_cols, seed)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    bounds = window.compute_window(lens, W, b, K)
    mwb = window.max_window_blocks(W, b)
    windowed = window.gather_window_block_table(table, bounds.start_block, bounds.needed, mwb)
    assert windowed.shape == (len(seq_lens), mwb) and windowed.dtype == table.dtype
    for i, s in enumerate(seq_lens):
        start, wlen = int(bounds.start[i]), int(bounds.windowed_len[i])
        needed = int(bounds.needed[i])
        wanted_from = max(0, s + K - W)
        # Block aligned, at or before the wanted start, by less than one block.
        assert start % b == 0 and start == int(bounds.start_block[i]) * b
        assert wanted_from - b < start <= wanted_from
        assert wlen == s - start
        assert wlen <= W - K + b - 1
        assert needed == math.ceil(wlen / b) <= mwb
        # Every wanted position is readable through the windowed table, in
        # windowed coordinates p - start < windowed_len; positions before
        # start cannot be expressed (the table starts at start_block).
        for p in range(wanted_from, s):
            assert p - start < wlen
            assert windowed[i, (p - start) // b] == table[i, p // b]
        # Columns past `needed` are zero (never a real, non-zero block id).
        assert torch.all(windowed[i, needed:] == 0)
        assert torch.all(windowed[i, :needed] != 0)


@settings(max_examples=200, deadline=None)
@given(window_cases())
def test_host_mirrors_and_upper_bounds_use_the_same_arithmetic(case):
    seq_lens, W, b, K, _ = case
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    device_len = window.compute_window(lens, W, b, K).windowed_len
    host_len = window.window_seq_lens(lens.to(torch.int64), W, b, K)
    assert host_len.tolist() == device_len.tolist()
    bound = max(seq_lens)
    windowed_bound = window.window_upper_bound(bound, W, b, K)
    assert windowed_bound == min(bound, W - K + b - 1)
    assert int(device_len.max()) <= windowed_bound


@settings(max_examples=500, deadline=None)
@given(st.integers(1, 5000), st.integers(1, 256), st.data())
def test_max_window_blocks_covers_worst_case(W, b, data):
    K = data.draw(st.integers(0, W - 1))
    worst = math.ceil((W - K + b - 1) / b)
    assert worst <= window.max_window_blocks(W, b) == math.ceil(W / b) + 1


def test_floor_w_over_b_plus_one_is_not_enough():
    # The seed's W//b + 1 misses one block when b does not divide W.
    W, b, K = 100, 16, 0
    assert math.ceil((W - K + b - 1) / b) == 8 > W // b + 1
    lens = torch.tensor([275], dtype=torch.int32)  # start = 160, windowed_len = 115
    bounds = window.compute_window(lens, W, b, K)
    assert int(bounds.needed[0]) == 8 == window.max_window_blocks(W, b)


def test_empty_and_short_requests():
    lens = torch.tensor([0, 1, 5, 63], dtype=torch.int32)
    table = torch.arange(1, 4 * 4 + 1, dtype=torch.int32).view(4, 4)
    wlen, wtable = window.window_seq_lens_and_block_table(lens, table, 64, 16)
    assert wlen.tolist() == [0, 1, 5, 63]  # W > seq_len: nothing cut
    assert wtable[0].tolist() == [0] * 5  # empty request: all zero
    assert wtable[1].tolist() == [5, 0, 0, 0, 0]
    assert wtable[3].tolist() == [13, 14, 15, 16, 0]


def test_zero_width_table():
    lens = torch.tensor([0, 0], dtype=torch.int32)
    table = torch.zeros(2, 0, dtype=torch.int32)
    _, wtable = window.window_seq_lens_and_block_table(lens, table, 8, 4)
    assert wtable.shape == (2, 3) and torch.all(wtable == 0)


@pytest.mark.parametrize("bad", [0, -3, 1.5, True, None])
def test_functional_api_rejects_bad_sizes(bad):
    lens = torch.tensor([4], dtype=torch.int32)
    with pytest.raises(ValueError, match="window_size"):
        window.compute_window(lens, bad, 4)
    with pytest.raises(ValueError, match="block_size"):
        window.max_window_blocks(8, bad)


def test_adapter_is_deprecated_with_a_message_naming_the_replacements():
    with pytest.warns(DeprecationWarning) as record:
        SlidingWindowAdapter(window_size=32, block_size=8, max_num_reqs=4)
    message = str(record[0].message)
    assert "SlidingWindowAdapter is deprecated" in message
    assert "integrations.vllm.StepWindows" in message
    assert "window_seq_lens_and_block_table" in message


def test_adapter_validates_the_window_through_window_spec():
    with (
        pytest.warns(DeprecationWarning),
        pytest.raises(ValueError, match="future_offset=32 must be < window_size=32"),
    ):
        SlidingWindowAdapter(window_size=32, block_size=8, max_num_reqs=4, future_offset=32)


@pytest.mark.filterwarnings("ignore:SlidingWindowAdapter is deprecated:DeprecationWarning")
def test_adapter_reuses_its_buffer_and_keeps_the_full_table():
    adapter = SlidingWindowAdapter(window_size=32, block_size=8, max_num_reqs=4)
    ptr = adapter.block_table_buffer.data_ptr()
    table = torch.arange(1, 3 * 10 + 1, dtype=torch.int32).view(3, 10)
    for lens in ([40, 10, 79], [41, 11, 80], [8, 0, 33]):
        lens = torch.tensor(lens, dtype=torch.int32)
        meta = adapter.apply(lens, table, seq_lens_cpu=lens.clone(), max_seq_len=int(lens.max()))
        assert meta.block_table.data_ptr() == ptr
        assert meta.full_block_table is table
        want_len, want_table = window.window_seq_lens_and_block_table(lens, table, 32, 8)
        assert torch.equal(meta.seq_lens, want_len)
        assert torch.equal(meta.block_table, want_table)
        assert torch.equal(meta.seq_lens_cpu, want_len)
        assert meta.max_seq_len == min(int(lens.max()), 32 + 8 - 1)
    with pytest.raises(ValueError, match="max_num_reqs=4"):
        adapter.apply(torch.ones(5, dtype=torch.int32), torch.ones(5, 2, dtype=torch.int32))


@settings(max_examples=150, deadline=None)
@given(window_cases(), st.integers(0, 2**31 - 1))
def test_packed_form_equals_the_two_tensor_form(case, seed):
    seq_lens, W, b, K, extra_cols = case
    table = _full_table(seq_lens, b, extra_cols, seed)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    want_len, want_table = window.window_seq_lens_and_block_table(lens, table, W, b, K)
    got_len, got_table = window.window_seq_lens_and_block_table_packed(lens, table, W, b, K)
    assert torch.equal(got_len, want_len) and torch.equal(got_table, want_table)
    assert got_len.is_contiguous() and got_table.is_contiguous()
    # One buffer: the lengths sit right after the table rows (a zero-width
    # full table falls back to two tensors).
    if table.shape[1] > 0:
        assert got_len.data_ptr() == got_table.data_ptr() + got_table.numel() * 4


# (seq_len, q_len) requests, W, K, b of the first-query window properties
FIRST_QUERY_BATCH = (
    st.lists(st.tuples(st.integers(0, 400), st.integers(0, 40)), min_size=1, max_size=6),
    st.integers(1, 300),
    st.integers(0, 5),
    st.integers(1, 32),
)


@settings(max_examples=300, deadline=None)
@given(*FIRST_QUERY_BATCH, st.booleans())
def test_window_cuts_nothing_exactly_when_no_start_moves(requests, size, k, block, causal):
    """``window_cuts_nothing(max_seq_len)`` implies that every request WITH a query has
    its window start at 0 (causal: from its first query; non-causal: its last position);
    a request without queries (vLLM's padding, q_len 0) reads no key, so where its start
    moves (by at most one token past the bound) keeping its keys changes no attention
    output. Tight: at ``max_seq_len = n + b`` a decode request of that length starts at
    block 1."""
    k = min(k, size - 1)
    n = size - k
    seq = torch.tensor([max(s, q) for s, q in requests], dtype=torch.int32)
    q_lens = torch.tensor([q for _, q in requests], dtype=torch.int32)
    qsl = torch.zeros(len(requests) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(q_lens, 0)
    start = window.batch_window_start(seq, qsl, n, block, causal)
    if window.window_cuts_nothing(int(seq.max()), n, block):
        reads = q_lens >= 1 if causal else torch.ones_like(q_lens, dtype=torch.bool)
        assert not start[reads].any()
        assert (start[~reads] <= block).all()
    edge = torch.tensor([n + block], dtype=torch.int32)
    assert not window.window_cuts_nothing(n + block, n, block)
    assert window.batch_window_start(edge, torch.tensor([0, 1]), n, block).tolist() == [block]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.integers(1, 300), st.integers(1, 40)), min_size=1, max_size=6),
    st.integers(1, 300),
)
def test_native_window_cuts_nothing_exactly_when_every_query_sees_every_key(requests, n):
    """``native_window_cuts_nothing(max_seq_len, n)`` holds exactly when the token-exact
    causal window of ``n`` keys (query p sees ``[max(p - n + 1, 0), p]``) hides no key
    ``j <= p`` from any query of the batch."""
    seq = [max(s, q) for s, q in requests]
    hidden = any(p - n + 1 > 0 for s, (_, q) in zip(seq, requests) for p in range(s - min(q, s), s))
    assert window.native_window_cuts_nothing(max(seq), n) is (not hidden)


@settings(max_examples=200, deadline=None)
@given(*FIRST_QUERY_BATCH)
def test_first_query_window_is_token_exact_and_fits_its_columns(requests, size, k, block):
    """``first_query_window_start`` by position: every query ``p`` of the request keeps
    its last ``W - K`` keys ``[max(p + 1 - n, 0), p]`` (n = W - K), ``start`` is block
    aligned and at most ``b - 1`` below the first query's; with ``q >= 1`` it is
    ``compute_window``'s first-query start (shown for K = 0, where the two agree); the
    windowed table fits ``first_query_window_columns`` columns."""
    k = min(k, size - 1)
    n = size - k
    seq = torch.tensor([max(s, q) for s, q in requests], dtype=torch.int32)
    q_lens = torch.tensor([q for _, q in requests], dtype=torch.int32)
    start = window.first_query_window_start(seq, q_lens, n, block).tolist()
    max_q = int(q_lens.max())
    cols = window.first_query_window_columns(n, block, max_q, 10**6)
    for s, q, lo in zip(seq.tolist(), q_lens.tolist(), start):
        first = s - q  # position of the first query (s for q = 0)
        exact = max(first + 1 - n, 0)
        assert lo % block == 0 and exact - block < lo <= exact
        assert -(-(s - lo) // block) <= cols
        assert s - lo <= window.windowed_len_bound(size, block, k, max(max_q, 1))
        if q >= 1:
            want = window.compute_window(
                torch.tensor([s]), n, block, 0, query_lens=torch.tensor([q]), max_query_len=q
            ).start
            assert lo == int(want)
