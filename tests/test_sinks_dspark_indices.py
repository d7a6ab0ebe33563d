"""Attention sinks in the DSpark sparse-MLA indices (issue 13): ``sink_size`` S keeps the
first ``S_b = ceil(S / b) * b`` KV tokens visible beside the window.

Everything is compared with an independent dense reference: per token, every KV
position is tested against an explicit mask (``p < S_b or lo <= p``, over the
positions ``p < hi`` the token may read), in plain Python."""

import math

import pytest
import torch
from hypothesis import given, settings, strategies as st

import dspark_compile
from dspark_compile import DraftWindowConfig
from dspark_compile.arithmetic.index_width import causal_width, noncausal_width
from dspark_compile.kernels import sparse_mla as ref, sparse_mla_triton as tri
from dspark_compile.models import make_paged_batch
from dspark_compile.testing.dspark_case import dspark_args, make_dspark_case, run_dspark_eager

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# (seq_lens, q_lens, b, W, S): an empty request, seq_len < b, S not a multiple of b,
# W larger than the sequence, windows starting inside the sinks, S larger than the
# sequence, S a multiple of b, S_b alone wider than 128.
CASES = [
    ([9, 3, 0, 17], [3, 3, 0, 4], 4, 5, 3),
    ([40, 2, 23], [8, 2, 8], 5, 7, 12),
    ([300, 131, 6], [4, 1, 6], 5, 128, 1),
    ([12, 20], [4, 4], 4, 100, 50),
    ([7, 50, 64], [2, 3, 5], 16, 4, 5),
    ([200, 37], [10, 6], 8, 30, 8),
    ([400, 90], [3, 3], 4, 20, 150),
]


def _batch(seq_lens, q_lens, block_size, seed=0):
    return make_paged_batch(
        seq_lens, q_lens, block_size, generator=torch.Generator().manual_seed(seed)
    )


def _args(batch, device="cpu"):
    return (
        batch.seq_lens.to(device),
        batch.query_start_loc.to(device),
        batch.block_table.to(device),
        batch.slot_mapping.to(device),
    )


def dense_visible(batch, block_size, window, sink_size, noncausal):
    """Per token, the visible KV positions by an explicit per-position mask (None: invalid)."""
    sink_end = math.ceil(sink_size / block_size) * block_size
    locs, slots = batch.query_start_loc.tolist(), batch.slot_mapping.tolist()
    out = [None] * batch.num_tokens
    for r, seq in enumerate(batch.seq_lens.tolist()):
        q_len = locs[r + 1] - locs[r]
        ctx = seq - q_len
        for j in range(q_len):
            t = locs[r] + j
            if slots[t] < 0:
                continue
            if noncausal:
                lo, hi = max(ctx - window, 0), seq
            else:
                lo, hi = max(ctx + j - window + 1, 0), ctx + j + 1
            out[t] = (r, [p for p in range(hi) if p < sink_end or lo <= p])
    return out


def dense_indices(batch, block_size, window, sink_size, width, noncausal):
    """Rows of slot ids from ``dense_visible``: ascending positions, then -1."""
    table = batch.block_table.tolist()
    rows = [[-1] * width for _ in range(batch.num_tokens)]
    for t, entry in enumerate(dense_visible(batch, block_size, window, sink_size, noncausal)):
        if entry is None:
            continue
        r, positions = entry
        assert len(positions) <= width
        for c, p in enumerate(positions):
            rows[t][c] = table[r][p // block_size] * block_size + p % block_size
    return torch.tensor(rows, dtype=torch.int32).reshape(batch.num_tokens, width)


def _width(q_lens, window, sink_size, block_size, noncausal):
    if noncausal:
        return noncausal_width(window, max(q_lens), sink_size, block_size)
    return causal_width(window, sink_size, block_size)


def _fns(noncausal):
    if noncausal:
        return (
            ref.noncausal_swa_indices_ref,
            tri.noncausal_swa_indices_triton,
            torch.ops.dspark.noncausal_swa_indices,
        )
    return ref.swa_indices_ref, tri.swa_indices_triton, torch.ops.dspark.swa_indices


@pytest.mark.parametrize("noncausal", [False, True])
@pytest.mark.parametrize("seq_lens,q_lens,b,window,sinks", CASES)
def test_reference_triton_and_op_match_the_dense_mask(
    noncausal, seq_lens, q_lens, b, window, sinks
):
    batch = _batch(seq_lens, q_lens, b, seed=sum(seq_lens) + sinks)
    batch.slot_mapping[1] = -1  # an invalid token: all -1 row
    width = _width(q_lens, window, sinks, b, noncausal)
    want = dense_indices(batch, b, window, sinks, width, noncausal)
    ref_fn, tri_fn, op = _fns(noncausal)
    got_ref = ref_fn(*_args(batch), b, window, width, sinks)
    assert got_ref.dtype == torch.int32 and (got_ref == want).all()
    got_tri = tri_fn(*_args(batch, DEVICE), b, window, width, sinks)
    assert (got_tri.cpu() == want).all()
    got_op = op(*_args(batch, DEVICE), b, window, width, sink_size=sinks)
    assert (got_op.cpu() == want).all()
    assert (want[1] == -1).all()
    # A wider index only adds padding.
    wide = ref_fn(*_args(batch), b, window, width + 128, sinks)
    assert (wide[:, :width] == want).all() and (wide[:, width:] == -1).all()


@pytest.mark.parametrize("noncausal", [False, True])
@pytest.mark.parametrize("seq_lens,q_lens,b,window,sinks", CASES)
def test_rows_list_each_slot_once_sinks_first_and_blocks_share_rows(
    noncausal, seq_lens, q_lens, b, window, sinks
):
    batch = _batch(seq_lens, q_lens, b, seed=7)
    width = _width(q_lens, window, sinks, b, noncausal)
    ref_fn, _, _ = _fns(noncausal)
    rows = ref_fn(*_args(batch), b, window, width, sinks)
    for row in rows.tolist():
        live = [s for s in row if s >= 0]
        assert len(live) == len(set(live))  # nothing listed twice
        assert row[len(live) :] == [-1] * (width - len(live))  # then only padding
    if noncausal:
        locs = batch.query_start_loc.tolist()
        for r in range(len(seq_lens)):
            block = rows[locs[r] : locs[r + 1]]
            assert (block == block[:1]).all()  # sinks included


def test_window_inside_the_sinks_is_just_the_prefix():
    """seq 23, q 8, W 7, S 12 (S_b 15, b 5): the window starts at 8 < 15 -> [0, 23)."""
    batch = _batch([23], [8], 5)
    rows = ref.noncausal_swa_indices_ref(*_args(batch), 5, 7, 128, 12)
    table = batch.block_table[0].tolist()
    want = [table[p // 5] * 5 + p % 5 for p in range(23)]
    assert rows[0, :23].tolist() == want and (rows[:, 23:] == -1).all()


def test_sinks_then_window_order():
    """seq 60, q 4, W 10, S 6, b 4: sinks [0, 8), then the window [46, 60)."""
    batch = _batch([60], [4], 4)
    rows = ref.noncausal_swa_indices_ref(*_args(batch), 4, 10, 128, 6)
    table = batch.block_table[0].tolist()
    want = [table[p // 4] * 4 + p % 4 for p in list(range(8)) + list(range(46, 60))]
    assert rows[0, : len(want)].tolist() == want and (rows[0, len(want) :] == -1).all()


@pytest.mark.parametrize("noncausal", [False, True])
def test_sink_size_zero_is_todays_rows(noncausal):
    from tests.test_sparse_mla_ops import INDEX_CASES, brute_force_indices

    ref_fn, tri_fn, op = _fns(noncausal)
    for seq_lens, q_lens, b, window, width in INDEX_CASES:
        batch = _batch(seq_lens, q_lens, b)
        want = brute_force_indices(batch, b, window, width, noncausal)
        for fn in (ref_fn, tri_fn, op):
            default = fn(*_args(batch, DEVICE), b, window, width).cpu()
            zero = fn(*_args(batch, DEVICE), b, window, width, 0).cpu()
            assert torch.equal(default, want) and torch.equal(zero, want)


@pytest.mark.parametrize("bad", [-1, True, 2.0, "4"])
def test_sink_size_is_validated(bad):
    batch = _batch([20], [4], 4)
    for fn in (
        ref.swa_indices_ref,
        ref.noncausal_swa_indices_ref,
        tri.noncausal_swa_indices_triton,
    ):
        with pytest.raises(ValueError, match=r"sink_size=.* is invalid: expected a non-negative"):
            fn(
                *_args(batch, DEVICE if fn is tri.noncausal_swa_indices_triton else "cpu"),
                4,
                8,
                128,
                bad,
            )
    if bad == -1:
        with pytest.raises(ValueError, match="sink_size=-1 is invalid"):
            torch.ops.dspark.noncausal_swa_indices(*_args(batch), 4, 8, 128, -1)


@pytest.mark.parametrize("impl", ["reference", "op", "triton"])
@pytest.mark.parametrize("noncausal", [False, True])
def test_row_longer_than_width_raises_with_the_sink_rule(impl, noncausal):
    # seq 300, q 10, W 100, S 30, b 16 -> S_b 32: non-causal 142 > 128, causal 132 > 128.
    batch = _batch([300, 40], [10, 3], 16)
    fn = {"reference": _fns(noncausal)[0], "triton": _fns(noncausal)[1], "op": _fns(noncausal)[2]}[
        impl
    ]
    device = DEVICE if impl == "triton" else "cpu"
    if torch.device(device).type == "cpu":
        with pytest.raises(ValueError, match=r"longer than width=128.*S_b \+ W"):
            fn(*_args(batch, device), 16, 100, 128, 30)
    # On CUDA an over-long row is an asynchronous device assert, which ends the
    # process (test_triton_flags_sink_overflow checks the flag it asserts on).
    # Without the sinks the same call fits: the sinks are what overflows.
    fn(*_args(batch, device), 16, 100, 128, 0)
    width = _width([10, 3], 100, 30, 16, noncausal)
    assert width == 256
    fn(*_args(batch, device), 16, 100, width, 30)


@pytest.mark.parametrize("noncausal", [False, True])
def test_triton_flags_sink_overflow(noncausal):
    batch = _batch([300, 40], [10, 3], 16)
    _, overflow = tri.launch_index_kernel(*_args(batch, DEVICE), 16, 100, 128, noncausal, 30)
    assert int(overflow) == 1
    _, overflow = tri.launch_index_kernel(*_args(batch, DEVICE), 16, 100, 256, noncausal, 30)
    assert int(overflow) == 0


def test_width_rule_values_and_arguments():
    assert noncausal_width(100, 10) == noncausal_width(100, 10, 0) == 128
    assert noncausal_width(100, 10, 1, 16) == 128 and noncausal_width(100, 10, 30, 16) == 256
    assert causal_width(128) == causal_width(128, 0, None) == 128
    assert causal_width(128, 1, 1) == 256 and causal_width(112, 9, 8) == 128
    with pytest.raises(ValueError, match="sink_size=4 needs block_size"):
        noncausal_width(8, 4, 4)
    with pytest.raises(ValueError, match="sink_size=-2 is invalid"):
        causal_width(8, -2, 4)
    with pytest.raises(ValueError, match="block_size=0 is invalid"):
        noncausal_width(8, 4, 4, 0)


@settings(max_examples=40, deadline=None)
@given(
    window=st.integers(1, 300),
    max_q=st.integers(1, 40),
    sinks=st.integers(0, 300),
    block=st.integers(1, 32),
    data=st.data(),
)
def test_width_rule_never_overflows_and_is_tight(window, max_q, sinks, block, data):
    """Random requests (q_len <= max_q) fit the rule's width; the worst case (a window
    starting past the sinks, q_len = max_q) does not fit one 128 narrower."""
    sink_end = math.ceil(sinks / block) * block
    num = data.draw(st.integers(1, 3))
    q_lens = [data.draw(st.integers(0, max_q)) for _ in range(num)] + [max_q]
    seq_lens = [q + data.draw(st.integers(0, sink_end + window + 20)) for q in q_lens[:-1]]
    seq_lens.append(max_q + sink_end + window + data.draw(st.integers(0, 10)))  # worst case
    batch = _batch(seq_lens, q_lens, block, seed=data.draw(st.integers(0, 2**16)))
    for noncausal in (False, True):
        width = _width([max_q], window, sinks, block, noncausal)
        rows = _fns(noncausal)[0](*_args(batch), block, window, width, sinks)
        longest = int((rows >= 0).sum(1).max())
        assert longest == sink_end + window + (max_q if noncausal else 0)
        assert width - 128 < longest <= width
        if width > 128:
            with pytest.raises(ValueError, match="longer than width"):
                _fns(noncausal)[0](*_args(batch), block, window, width - 128, sinks)


def test_sparse_mla_over_sink_rows_equals_dense_masked_attention():
    """Attention over the sink rows equals softmax over every position of the request
    masked by the dense rule (float64; the reference computes in float32)."""
    gen = torch.Generator().manual_seed(3)
    b, window, sinks, heads, lora, rope = 4, 6, 5, 2, 8, 4
    batch = _batch([37, 5, 0, 20], [4, 2, 0, 3], b, seed=3)
    width = noncausal_width(window, 4, sinks, b)
    idx = ref.noncausal_swa_indices_ref(*_args(batch), b, window, width, sinks)
    query = torch.randn(batch.num_tokens, heads, lora + rope, generator=gen, dtype=torch.float64)
    kv_cache = torch.randn(batch.num_blocks, b, lora + rope, generator=gen, dtype=torch.float64)
    scale = 0.3
    got = ref.sparse_mla_attention_ref(query, kv_cache, idx, scale, lora)
    table = batch.block_table.tolist()
    flat = kv_cache.reshape(-1, lora + rope)
    for t, entry in enumerate(dense_visible(batch, b, window, sinks, noncausal=True)):
        r, positions = entry
        keys = flat[[table[r][p // b] * b + p % b for p in positions]]
        probs = torch.softmax(scale * query[t] @ keys.T, dim=-1)
        torch.testing.assert_close(got[t], probs @ keys[:, :lora], rtol=1e-5, atol=1e-5)


# --- the DSpark pass and the compiled reference draft ---------------------------------


def _eager_dense(model, batch, hidden, caches, window, sinks, block_size):
    """Eager draft whose indices come from the dense per-position mask (no index op)."""
    width = max(batch.seq_lens.tolist()) + 1

    def index_fn(*_):
        return dense_indices(batch, block_size, window, sinks, width, noncausal=True)

    return run_dspark_eager(model, batch, hidden, caches, index_fn)


def _compiled(model, batch, hidden, caches, lowering, **options):
    torch._dynamo.reset()
    dspark_compile.clear_pass_records()
    compiled = torch.compile(
        model,
        backend="dspark",
        dynamic=False,
        options={"lowering": lowering, "method": "dspark", **options},
    )
    caches = [c.clone() for c in caches]
    with torch.no_grad():
        out = compiled(*dspark_args(batch, hidden, caches))
    [record] = [
        r for r in dspark_compile.pass_records() if r.pass_name == "dspark_noncausal_indices"
    ]
    return out, caches, record.stats


# W=8, S=6 (S_b=8): the long request reads [0, 8) + [47, 60), the last one's window
# starts inside the sinks. W=120, S=10: width ceil((12 + 120 + 13) / 128) * 128 = 256.
@pytest.mark.parametrize(
    "lowering,window,sinks", [("aot_eager", 8, 6), ("inductor", 8, 6), ("inductor", 120, 10)]
)
def test_compiled_draft_with_sinks_equals_eager_dense_mask(lowering, window, sinks):
    model, batch, caches, hidden = make_dspark_case([60, 3, 0, 13, 30], [5, 3, 0, 5, 4])
    want, want_caches = _eager_dense(model, batch, hidden, caches, window, sinks, 4)
    got, got_caches, stats = _compiled(
        model, batch, hidden, caches, lowering, draft_window_size=window, draft_sink_size=sinks
    )
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    for got_cache, want_cache in zip(got_caches, want_caches):
        torch.testing.assert_close(got_cache, want_cache, rtol=2e-5, atol=2e-5)
    assert stats == {"index_calls": 1, "rewritten": 1, "windowed": 1, "with_sinks": 1}
    if window == 8:  # the sinks change the long request's rows, not the short ones'
        no_sinks, _ = _eager_dense(model, batch, hidden, caches, window, 0, 4)
        assert (got[:5] - no_sinks[:5]).abs().max() > 1e-3
        torch.testing.assert_close(got[5:13], no_sinks[5:13], rtol=2e-5, atol=2e-5)


def test_compiled_draft_with_sink_size_zero_is_todays_output():
    model, batch, caches, hidden = make_dspark_case([60, 3, 0, 13], [5, 3, 0, 5], seed=1)
    want, _ = _eager_dense(model, batch, hidden, caches, 8, 0, 4)
    got, _, stats = _compiled(
        model, batch, hidden, caches, "aot_eager", draft_window_size=8, draft_sink_size=0
    )
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    assert stats["with_sinks"] == 0


def _index_graph(batch, sink_size=None):
    from torch.fx.experimental.proxy_tensor import make_fx

    extra = () if sink_size is None else (sink_size,)
    args = _args(batch)
    gm = make_fx(
        lambda s, q, t, m: torch.ops.dspark.swa_indices(s, q, t, m, 4, 16, 128, *extra),
        tracing_mode="fake",
    )(*args)
    return gm, args


def test_pass_sets_sinks_and_width_only_with_sinks():
    from dspark_compile.passes import DSparkNonCausalIndexPass

    batch = _batch([90, 9], [4, 4], 4, seed=5)
    # draft_sink_size=0: the rewritten call is today's (no sink argument at all).
    gm, args = _index_graph(batch)
    DSparkNonCausalIndexPass(DraftWindowConfig(method="dspark", draft_window_size=8)).apply(
        gm.graph
    )
    [call] = [n for n in gm.graph.nodes if n.op == "call_function"]
    assert "sink_size" not in call.kwargs and len(call.args) == 7
    assert call.args[5:] == (8, 128)
    # draft_sink_size=6 (b 4 -> S_b 8), T=8: width ceil((8 + 100 + 8) / 128) * 128 = 128;
    # S=30 (S_b 32): ceil((32 + 100 + 8) / 128) * 128 = 256.
    for sinks, width in ((6, 128), (30, 256)):
        gm, args = _index_graph(batch)
        stats = DSparkNonCausalIndexPass(
            DraftWindowConfig(method="dspark", draft_window_size=100, draft_sink_size=sinks)
        ).apply(gm.graph)
        assert stats == {"index_calls": 1, "rewritten": 1, "windowed": 1, "with_sinks": 1}
        [call] = [n for n in gm.graph.nodes if n.op == "call_function"]
        assert call.kwargs["sink_size"] == sinks and call.args[6] == width
        assert tuple(call.meta["val"].shape) == (8, width)
        gm.recompile()
        got = gm(*args)
        want = dense_indices(batch, 4, 100, sinks, width, noncausal=True)
        assert torch.equal(got, want)


def test_pass_keeps_a_calls_own_sinks_when_the_window_is_off():
    from dspark_compile.passes import DSparkNonCausalIndexPass

    batch = _batch([90, 9], [4, 4], 4, seed=6)
    gm, args = _index_graph(batch, sink_size=5)  # the call's own S=5 -> S_b 8
    stats = DSparkNonCausalIndexPass(DraftWindowConfig(method="dspark")).apply(gm.graph)
    assert stats == {"index_calls": 1, "rewritten": 1, "windowed": 0, "with_sinks": 1}
    gm.recompile()
    got = gm(*args)
    assert got.shape[1] == noncausal_width(16, 8, 5, 4) == 128
    assert torch.equal(got, dense_indices(batch, 4, 16, 5, 128, noncausal=True))
    # With the window on, draft_sink_size replaces the call's own sinks.
    gm, args = _index_graph(batch, sink_size=5)
    DSparkNonCausalIndexPass(DraftWindowConfig(method="dspark", draft_window_size=16)).apply(
        gm.graph
    )
    gm.recompile()
    assert torch.equal(gm(*args), dense_indices(batch, 4, 16, 0, 128, noncausal=True))


def test_pass_uuid_depends_on_the_sinks():
    from dspark_compile.passes import DSparkNonCausalIndexPass

    uuids = {
        DSparkNonCausalIndexPass(
            DraftWindowConfig(method="dspark", draft_window_size=16, draft_sink_size=s)
        ).uuid()
        for s in (0, 4, 8)
    }
    assert len(uuids) == 3


def test_ascend_check_sinks_insert_no_op_and_flag_the_same_ops():
    """The torchair route does not lower the index ops (our custom ops, CPU stand-ins
    there): with sinks the pass inserts nothing, and the post-pass graph holds the
    same unconvertible ops as without them."""
    model, batch, caches, hidden = make_dspark_case([30, 9], [4, 4], seed=8)
    checks = {}
    for sinks in (0, 6):
        options = {"method": "dspark", "draft_window_size": 8, "draft_sink_size": sinks}
        args = dspark_args(batch, hidden, [c.clone() for c in caches])
        inserted = dspark_compile.check_ascend(model, *args, options=options, inserted_only=True)
        assert inserted.ok and inserted.num_nodes == 0
        args = dspark_args(batch, hidden, [c.clone() for c in caches])
        checks[sinks] = dspark_compile.check_ascend(model, *args, options=options)
    assert set(checks[6].unsupported) == set(checks[0].unsupported)
    assert "torch.ops.dspark.noncausal_swa_indices.default" in checks[6].unsupported
