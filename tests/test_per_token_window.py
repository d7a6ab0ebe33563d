"""Per-token (causal) draft window: op, Triton kernel, arithmetic and the pass
against a dense reference whose mask is built from positions.

Contract: a causal query at absolute position p sees keys j with
lo(p) <= j <= p, lo(p) = floor(max(p + 1 + K - W, 0) / b) * b. A non-causal
query block sees [lo(seq_len - 1), seq_len) (the window of its last position)
for every query. ``dense_attention`` below builds that mask in plain Python
ints; it never calls the code under test.
"""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import dspark_compile
from dspark_compile.arithmetic import window
from dspark_compile.kernels.paged_attention import paged_attention_ref
from dspark_compile.kernels.paged_attention_triton import paged_attention_triton
from dspark_compile.models import make_paged_batch, random_kv_cache
from dspark_compile.passes.graph_utils import get_arg
from tests.draft_cases import cuda_args, make_draft_case, post_pass_graph

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def expected_lo(p, W, b, K):
    return max(p + 1 + K - W, 0) // b * b


def dense_attention(
    query, key_cache, value_cache, block_table, seq_lens, query_start_loc, scale, causal, W, K
):
    """float64 attention over the FULL table, masked per query from positions."""
    b, group = key_cache.shape[1], query.shape[1] // key_cache.shape[2]
    out = torch.zeros(query.shape, dtype=torch.float64, device=query.device)
    locs = query_start_loc.tolist()
    for i, s in enumerate(seq_lens.tolist()):
        q_len = locs[i + 1] - locs[i]
        if q_len == 0 or s == 0:
            continue
        blocks = block_table[i, : (s + b - 1) // b].long()
        k = key_cache[blocks].flatten(0, 1)[:s].double().repeat_interleave(group, 1)
        v = value_cache[blocks].flatten(0, 1)[:s].double().repeat_interleave(group, 1)
        mask = torch.zeros(q_len, s, dtype=torch.bool)
        for j in range(q_len):
            p = s - q_len + j
            anchor = p if causal else s - 1
            lo = 0 if W is None else expected_lo(anchor, W, b, K)
            hi = p if causal else s - 1
            mask[j, lo : hi + 1] = True
        q = query[locs[i] : locs[i + 1]].double()
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        scores = scores.masked_fill(~mask.to(scores.device), float("-inf"))
        probs = torch.softmax(scores, -1).nan_to_num(0.0)
        out[locs[i] : locs[i + 1]] = torch.einsum("hqk,khd->qhd", probs, v)
    return out


def dense_attention_override(W, K=0):
    """A drop-in for dspark.paged_attention in the eager reference draft."""

    def attention(
        query, key_cache, value_cache, block_table, seq_lens, query_start_loc, scale, causal
    ):
        return dense_attention(
            query,
            key_cache,
            value_cache,
            block_table,
            seq_lens,
            query_start_loc,
            scale,
            causal,
            W,
            K,
        ).to(query.dtype)

    return attention


# seq_lens, q_lens, W, b, K: the edge cases the window must get right.
CASES = {
    "q_len > W": ([40, 33], [24, 30], 8, 4, 0),
    "q_len > W - K": ([29, 18], [9, 7], 10, 4, 3),
    "chunked prefill": ([90, 70], [40, 1], 16, 4, 0),
    "empty request, seq < b": ([50, 0, 3, 21], [20, 0, 3, 0], 12, 8, 0),
    "W > seq": ([30, 12], [12, 5], 200, 4, 0),
    "W % b != 0": ([61, 47], [17, 9], 13, 8, 2),
    "mixed decode and prefill": ([64, 35, 9, 100], [1, 20, 1, 33], 12, 4, 1),
}


def _batch(seq_lens, q_lens, b, heads=4, kv_heads=2, head_dim=16, seed=0, device="cpu"):
    gen = torch.Generator().manual_seed(seed)
    batch = make_paged_batch(seq_lens, q_lens, b, device=device, generator=gen)
    kc, vc = random_kv_cache(batch.num_blocks, b, kv_heads, head_dim, device=device, generator=gen)
    q = torch.randn(batch.num_tokens, heads, head_dim, generator=gen).to(device)
    return batch, q, kc, vc


def _check_sees_something(out, batch):
    """Every real query sees at least its own key: no all-zero output row."""
    assert out.shape[0] == batch.num_tokens
    assert torch.all(out.abs().flatten(1).amax(1) > 0)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", list(CASES))
def test_reference_on_the_full_table_matches_the_dense_mask(name, causal):
    seq_lens, q_lens, W, b, K = CASES[name]
    batch, q, kc, vc = _batch(seq_lens, q_lens, b, seed=len(name))
    args = (q, kc, vc, batch.block_table, batch.seq_lens, batch.query_start_loc, 0.3, causal)
    got = torch.ops.dspark.paged_attention(*args, window_size=W, future_offset=K)
    torch.testing.assert_close(got.double(), dense_attention(*args, W, K), rtol=1e-5, atol=1e-5)
    _check_sees_something(got, batch)


@pytest.mark.parametrize("packed", [False, True])
@pytest.mark.parametrize("name", list(CASES))
def test_windowed_table_with_kv_offset_matches_the_dense_mask(name, packed):
    """What the pass inserts: the table from the first query's window, then the op
    applies each query's lo(p); reference and Triton kernel agree with the mask."""
    seq_lens, q_lens, W, b, K = CASES[name]
    batch, q, kc, vc = _batch(seq_lens, q_lens, b, seed=len(name), device=DEVICE)
    fn = window.causal_window_metadata_packed if packed else window.causal_window_metadata
    lens, table, offset = fn(
        batch.seq_lens,
        batch.block_table,
        batch.query_start_loc,
        W,
        b,
        K,
        max_query_len=batch.num_tokens,
    )
    assert table.shape[1] == window.max_window_blocks(W, b, batch.num_tokens)
    want = dense_attention(
        q, kc, vc, batch.block_table, batch.seq_lens, batch.query_start_loc, 0.3, True, W, K
    )
    windowed = (q, kc, vc, table, lens, batch.query_start_loc, 0.3, True)
    got = paged_attention_ref(*windowed, kv_offset=offset, window_size=W, future_offset=K)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    _check_sees_something(got, batch)
    for splits in (1, 3):
        out = torch.full_like(q, float("nan"))
        got = paged_attention_triton(
            *windowed, out=out, num_splits=splits, kv_offset=offset, window_size=W, future_offset=K
        )
        assert not torch.isnan(got).any()
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("name", ["q_len > W", "W % b != 0", "mixed decode and prefill"])
def test_triton_kernel_on_the_full_table(name, causal):
    seq_lens, q_lens, W, b, K = CASES[name]
    batch, q, kc, vc = _batch(seq_lens, q_lens, b, heads=8, seed=3, device=DEVICE)
    args = (q, kc, vc, batch.block_table, batch.seq_lens, batch.query_start_loc, 0.25, causal)
    got = paged_attention_triton(*args, num_splits=2, window_size=W, future_offset=K)
    torch.testing.assert_close(got.double(), dense_attention(*args, W, K), rtol=1e-5, atol=1e-5)


def test_bf16_windowed_kernel_and_cuda_registration():
    """Low precision and the op's CUDA entry point (run here on CPU tensors)."""
    from dspark_compile.ops.paged_attention import _paged_attention_cuda

    seq_lens, q_lens, W, b, K = CASES["q_len > W"]
    batch, q, kc, vc = _batch(seq_lens, q_lens, b, seed=5, device=DEVICE)
    lens, table, offset = window.causal_window_metadata(
        batch.seq_lens,
        batch.block_table,
        batch.query_start_loc,
        W,
        b,
        K,
        max_query_len=batch.num_tokens,
    )
    want = dense_attention(
        q, kc, vc, batch.block_table, batch.seq_lens, batch.query_start_loc, 0.3, True, W, K
    )
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
    )
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want, rtol=3e-2, atol=3e-2)


def test_decode_is_unchanged():
    """q_len = 1: the per-token form is today's per-request window bit for bit
    (same lengths and table columns; the op output equals the kv_start reference)."""
    batch, q, kc, vc = _batch([37, 9, 0, 64, 3], [1, 1, 0, 1, 1], 4, seed=2)
    W, b, K = 10, 4, 2
    old = window.compute_window(batch.seq_lens, W, b, K)
    lens, table, offset = window.causal_window_metadata(
        batch.seq_lens, batch.block_table, batch.query_start_loc, W, b, K, max_query_len=1
    )
    old_lens, old_table = window.window_seq_lens_and_block_table(
        batch.seq_lens, batch.block_table, W, b, K
    )
    assert torch.equal(lens, old_lens) and torch.equal(table, old_table)
    assert torch.equal(offset, old.start)
    args = (q, kc, vc, table, lens, batch.query_start_loc, 0.3, True)
    assert torch.equal(
        paged_attention_ref(*args, kv_offset=offset, window_size=W, future_offset=K),
        paged_attention_ref(*args),
    )


def test_op_rejects_bad_window_arguments():
    batch, q, kc, vc = _batch([9], [2], 4)
    args = (q, kc, vc, batch.block_table, batch.seq_lens, batch.query_start_loc, 0.3, True)
    with pytest.raises(ValueError, match="window_size=0 is invalid"):
        torch.ops.dspark.paged_attention(*args, window_size=0)
    with pytest.raises(
        ValueError, match=r"future_offset=8 is invalid: expected an int in \[0, 8\)"
    ):
        torch.ops.dspark.paged_attention(*args, window_size=8, future_offset=8)
    with pytest.raises(ValueError, match=r"kv_offset \(2,\) is invalid"):
        paged_attention_triton(*args, kv_offset=torch.zeros(2, dtype=torch.int32), window_size=8)
    with pytest.raises(ValueError, match="seq_lens\\[0\\]=9 is invalid: it needs 3 blocks"):
        paged_attention_ref(
            q, kc, vc, batch.block_table[:, :2], batch.seq_lens, batch.query_start_loc, 0.3, True
        )
    with pytest.raises(ValueError, match="max_query_len=1 is invalid: a request has 2"):
        window.causal_window_metadata(
            batch.seq_lens, batch.block_table, batch.query_start_loc, 8, 4, max_query_len=1
        )


# --------------------------------------------------------------- arithmetic


@st.composite
def causal_cases(draw):
    b = draw(st.integers(1, 32))
    W = draw(st.integers(1, 300))
    K = draw(st.integers(0, W - 1))
    reqs = draw(
        st.lists(st.tuples(st.integers(0, 700), st.integers(0, 400)), min_size=1, max_size=6)
    )
    seq_lens = [s for s, _ in reqs]
    q_lens = [min(q, s) for s, q in reqs]
    slack = draw(st.integers(0, 5))
    return seq_lens, q_lens, W, b, K, max(q_lens + [1]) + slack


def _table(seq_lens, b, seed):
    width = max([-(-s // b) for s in seq_lens] + [1])
    gen = torch.Generator().manual_seed(seed)
    ids = torch.randperm(len(seq_lens) * width, generator=gen) + 1  # distinct, non-zero
    return ids.view(len(seq_lens), width).to(torch.int32)


def _locs(q_lens):
    locs = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    locs[1:] = torch.cumsum(torch.tensor(q_lens, dtype=torch.int32), 0)
    return locs


@settings(max_examples=300, deadline=None)
@given(causal_cases(), st.integers(0, 2**31 - 1))
def test_windowed_table_holds_every_key_each_query_may_see(case, seed):
    seq_lens, q_lens, W, b, K, Q = case
    table = _table(seq_lens, b, seed)
    lens, wtable, offset = window.causal_window_metadata(
        torch.tensor(seq_lens, dtype=torch.int32), table, _locs(q_lens), W, b, K, max_query_len=Q
    )
    cols = window.max_window_blocks(W, b, Q)
    assert wtable.shape == (len(seq_lens), cols) and wtable.dtype == table.dtype
    assert cols == math.ceil((W + Q - 1) / b) + 1
    full_rows, rows = table.tolist(), wtable.tolist()
    for i, (s, q) in enumerate(zip(seq_lens, q_lens)):
        start, wlen = int(offset[i]), int(lens[i])
        first = s - max(q, 1)
        assert start == expected_lo(first, W, b, K) and wlen == s - start
        assert wlen <= window.windowed_len_bound(W, b, K, Q)
        needed = math.ceil(wlen / b)
        assert needed <= cols
        for p in range(max(first, 0), s):
            lo = expected_lo(p, W, b, K)
            # at least the last W - K tokens, at most b - 1 more; lo never decreases
            assert max(p + 1 + K - W, 0) - b < lo <= max(p + 1 + K - W, 0)
            assert lo >= start and lo <= expected_lo(p + 1, W, b, K)
        for j in range(start, s):  # every key from the window start on is readable
            assert j - start < wlen
            assert rows[i][(j - start) // b] == full_rows[i][j // b]
        assert all(x == 0 for x in rows[i][needed:]) and all(x != 0 for x in rows[i][:needed])


@settings(max_examples=150, deadline=None)
@given(causal_cases(), st.integers(0, 2**31 - 1))
def test_causal_packed_form_equals_the_three_tensor_form(case, seed):
    seq_lens, q_lens, W, b, K, Q = case
    table, locs = _table(seq_lens, b, seed), _locs(q_lens)
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    want = window.causal_window_metadata(lens, table, locs, W, b, K, max_query_len=Q)
    got = window.causal_window_metadata_packed(lens, table, locs, W, b, K, max_query_len=Q)
    for g, w in zip(got, want):
        assert torch.equal(g, w) and g.is_contiguous()
    assert got[0].data_ptr() + 4 * len(seq_lens) == got[2].data_ptr()  # one buffer
    assert got[2].data_ptr() + 4 * len(seq_lens) == got[1].data_ptr()


@settings(max_examples=150, deadline=None)
@given(causal_cases())
def test_single_query_blocks_are_the_decode_window(case):
    seq_lens, _, W, b, K, Q = case
    lens = torch.tensor(seq_lens, dtype=torch.int32)
    ones = torch.ones(len(seq_lens), dtype=torch.int32)
    per_token = window.compute_window(lens, W, b, K, query_lens=ones, max_query_len=Q)
    empty = window.compute_window(lens, W, b, K, query_lens=ones * 0, max_query_len=Q)
    decode = window.compute_window(lens, W, b, K)
    for got in (per_token, empty):
        assert torch.equal(got.start, decode.start)
        assert torch.equal(got.windowed_len, decode.windowed_len)
        assert torch.equal(got.needed, decode.needed)
    assert window.max_window_blocks(W, b, 1) == window.max_window_blocks(W, b)
    assert window.windowed_len_bound(W, b, K, 1) == W - K + b - 1
    assert window.window_upper_bound(10**6, W, b, K, Q) == W - K + b - 2 + Q


def test_max_query_len_is_validated():
    with pytest.raises(ValueError, match="max_query_len=0 is invalid"):
        window.max_window_blocks(8, 4, 0)


# --------------------------------------------------------------- the pass


COMPILED_CASES = [
    # seq_lens, q_lens, method, num_speculative_tokens, W, lowerings
    ([40, 33], [24, 30], "dflash", 1, 8, ("aot_eager", "inductor")),  # q_len > W
    ([90, 70, 9], [40, 1, 1], "eagle3", 3, 16, ("aot_eager", "inductor")),  # chunked
    ([50, 0, 3, 21], [20, 0, 3, 0], "dflash", 1, 13, ("aot_eager", "inductor")),  # empty
    ([30, 12], [12, 5], "dflash", 1, 200, ("aot_eager",)),  # W > seq
]


def _eager(case, W, K):
    keys, values = case.clone_caches()
    case.model.attention_override = dense_attention_override(W, K)
    try:
        with torch.no_grad():
            return case.model(*case.args(keys, values))
    finally:
        case.model.attention_override = None


@pytest.mark.parametrize(
    "seq_lens,q_lens,method,nst,W,lowering",
    [(*case[:5], lowering) for case in COMPILED_CASES for lowering in case[5]],
)
def test_compiled_causal_draft_matches_the_dense_mask(lowering, seq_lens, q_lens, method, nst, W):
    """A 3-layer causal draft: each layer's KV comes from the previous layer's
    outputs, so a query that lost its keys would corrupt every later layer."""
    case = make_draft_case(seq_lens, q_lens, causal=True, seed=W + len(seq_lens))
    K = nst if method == "eagle3" else 0
    want = _eager(case, W, K)
    dspark_compile.clear_pass_records()
    torch._dynamo.reset()
    compiled = torch.compile(
        case.model,
        backend="dspark",
        dynamic=False,
        options={
            "draft_window_size": W,
            "method": method,
            "num_speculative_tokens": nst,
            "lowering": lowering,
        },
    )
    with torch.no_grad():
        got = compiled(*case.args(*case.clone_caches()))
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    if W < max(seq_lens):
        assert not torch.allclose(got, _eager(case, None, 0), atol=1e-3)
    [record] = [r for r in dspark_compile.pass_records() if r.pass_name == "draft_window"]
    assert record.stats["rewritten"] == 3 and record.stats["window_computations"] == 1


def test_per_request_window_loses_keys_that_the_per_token_window_keeps():
    """The limit this removes: with the old per-request window, the first queries
    of a block longer than W - K saw no key at all (zero output)."""
    seq_lens, q_lens, W, b, K = CASES["q_len > W"]
    batch, q, kc, vc = _batch(seq_lens, q_lens, b, seed=9)
    start = window.compute_window(batch.seq_lens, W, b, K).start
    old = paged_attention_ref(
        q,
        kc,
        vc,
        batch.block_table,
        batch.seq_lens,
        batch.query_start_loc,
        0.3,
        True,
        kv_start=start,
    )
    assert torch.all(old[0] == 0)
    new = torch.ops.dspark.paged_attention(
        q,
        kc,
        vc,
        batch.block_table,
        batch.seq_lens,
        batch.query_start_loc,
        0.3,
        True,
        window_size=W,
    )
    _check_sees_something(new, batch)


def test_pass_rewires_causal_and_non_causal_calls_differently():
    """Causal: table of max_window_blocks(W, b, T) columns plus kv_offset/W/K.
    Non-causal: today's per-request window, no window arguments."""
    W, nst = 12, 2
    options = dict(draft_window_size=W, method="eagle3", num_speculative_tokens=nst)
    for causal in (True, False):
        case = make_draft_case([45, 12, 30], [5, 1, 7], causal=causal, num_layers=2)
        graph = post_pass_graph(case, options)
        calls = [n for n in graph.nodes if n.target == torch.ops.dspark.paged_attention.default]
        assert len(calls) == 2
        for call in calls:
            table = call.args[3].meta["val"]
            kv_offset, window_size, future_offset = (
                get_arg(call, 8 + i, name)
                for i, name in enumerate(("kv_offset", "window_size", "future_offset"))
            )
            if causal:
                assert table.shape[1] == window.max_window_blocks(W, 4, 13)
                assert window_size == W and future_offset == nst
                assert kv_offset.meta["val"].shape == (3,)
            else:
                assert table.shape[1] == window.max_window_blocks(W, 4)
                assert window_size is None and kv_offset is None


@pytest.mark.parametrize("lowering", ["aot_eager", "inductor"])
def test_dynamic_token_count_gets_a_symbolic_table_width(lowering):
    """dynamic=True: the table width follows the symbolic token count, so one
    compile is correct for other batch shapes too."""
    options = {"draft_window_size": 8, "block_size": 4, "lowering": lowering}
    first = make_draft_case([50, 30, 5, 19], [6, 0, 5, 3], causal=True, seed=3)
    torch._dynamo.reset()
    compiled = torch.compile(first.model, backend="dspark", dynamic=True, options=options)
    for seq_lens, q_lens in (
        ([50, 30, 5, 19], [6, 0, 5, 3]),
        ([70, 33, 9, 19, 40], [20, 1, 5, 3, 7]),
    ):
        case = make_draft_case(seq_lens, q_lens, causal=True, seed=3)  # same weights
        with torch.no_grad():
            got = compiled(*case.args(*case.clone_caches()))
        torch.testing.assert_close(got, _eager(case, 8, 0), rtol=2e-5, atol=2e-5)


def test_a_call_with_its_own_window_is_refused():
    class Model(torch.nn.Module):
        def forward(self, q, kc, vc, table, lens, locs):
            return torch.ops.dspark.paged_attention(
                q, kc, vc, table, lens, locs, 0.3, True, window_size=4
            )

    batch, q, kc, vc = _batch([9], [2], 4)
    torch._dynamo.reset()
    fn = torch.compile(
        Model(),
        backend="dspark",
        dynamic=False,
        options={"draft_window_size": 8, "lowering": "aot_eager"},
    )
    with pytest.raises(Exception, match="already has window_size=4"):
        fn(q, kc, vc, batch.block_table, batch.seq_lens, batch.query_start_loc)


def test_spec_validates_per_token_arguments():
    from dspark_compile import AttentionOpSpec, PerTokenWindowArgs

    op = torch.ops.dspark.paged_attention.default
    with pytest.raises(ValueError, match="per_token_window names 'offsets'"):
        AttentionOpSpec(
            op=op,
            seq_lens="seq_lens",
            block_table="block_table",
            per_token_window=PerTokenWindowArgs(kv_offset="offsets"),
        )
    with pytest.raises(ValueError, match="host_seq_lens=.*per_token_window is not supported"):
        AttentionOpSpec(
            op=op,
            seq_lens="seq_lens",
            block_table="block_table",
            host_seq_lens=("query_start_loc",),
            per_token_window=PerTokenWindowArgs(),
        )


@pytest.mark.parametrize("W,b,Q,reqs", [(16, 4, 14, 4), (100, 16, 40, 3)])
def test_inductor_computes_the_whole_packed_buffer(W, b, Q, reqs):
    """Regression: with the table first, Inductor's CPU code computed only the
    table part of the packed buffer once it had more than 8 columns."""
    gen = torch.Generator().manual_seed(W)
    lens = torch.randint(10, 300, (reqs,), generator=gen, dtype=torch.int32)
    q_lens = torch.randint(0, Q + 1, (reqs,), generator=gen, dtype=torch.int32)
    locs = torch.zeros(reqs + 1, dtype=torch.int32)
    locs[1:] = torch.cumsum(q_lens, 0)
    table = torch.randint(1, 1000, (reqs, 20), generator=gen, dtype=torch.int32)

    def fn(lens, table, locs):
        return window.causal_window_metadata_packed(lens, table, locs, W, b, 1, max_query_len=Q)

    torch._dynamo.reset()
    got = torch.compile(fn, backend="inductor", dynamic=False)(lens, table, locs)
    want = window.causal_window_metadata(lens, table, locs, W, b, 1, max_query_len=Q)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


# --------------------------------------------------------------- CUDA (run on a GPU)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton kernels under Inductor on CUDA")
def test_compiled_causal_draft_on_cuda_matches_the_dense_mask():
    """Inductor on CUDA: the window code and the Triton attention with per-token
    bounds, for a long causal block (draft prefill) beside decodes."""
    case = make_draft_case([300, 70, 9], [120, 1, 9], causal=True, seed=1)
    W = 32
    want = _eager(case, W, 0)
    args = cuda_args(case)
    torch._dynamo.reset()
    compiled = torch.compile(
        case.model.cuda(),
        backend="dspark",
        dynamic=False,
        options={"draft_window_size": W, "method": "dflash"},
    )
    with torch.no_grad():
        got = compiled(*args)
    torch.testing.assert_close(got.cpu(), want, rtol=2e-4, atol=2e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
def test_per_token_window_and_kernel_are_cuda_graph_capturable():
    """Window metadata + windowed attention captured once, replayed with other
    lengths: no host read anywhere, and the replay is correct."""
    seq_lens, q_lens, W, b, K = CASES["mixed decode and prefill"]
    batch, q, kc, vc = _batch(seq_lens, q_lens, b, seed=1, device="cuda")
    lens = batch.seq_lens.clone()
    out = torch.empty_like(q)

    def step():
        wlens, table, offset = window.causal_window_metadata_packed(
            lens, batch.block_table, batch.query_start_loc, W, b, K, max_query_len=batch.num_tokens
        )
        paged_attention_triton(
            q,
            kc,
            vc,
            table,
            wlens,
            batch.query_start_loc,
            0.3,
            True,
            out=out,
            kv_offset=offset,
            window_size=W,
            future_offset=K,
        )

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        step()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    shorter = torch.maximum(batch.seq_lens - 7, torch.tensor(q_lens, device="cuda"))
    for new in (batch.seq_lens, shorter.to(lens.dtype)):
        lens.copy_(new)
        graph.replay()
        torch.cuda.synchronize()
        want = dense_attention(
            q, kc, vc, batch.block_table, new, batch.query_start_loc, 0.3, True, W, K
        )
        torch.testing.assert_close(out.double(), want, rtol=1e-4, atol=1e-4)
