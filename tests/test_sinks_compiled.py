"""Attention sinks through torch.compile(backend="dspark") (docs/design.md,
"Attention sinks"): the compiled reference draft with ``draft_sink_size`` S
equals eager attention masked by position on the FULL block table, for decode,
causal query blocks (per-token window) and non-causal blocks, in both lowerings.

Two oracles: ``testing.oracles.windowed_attention_ref(W, K, S)`` (the reference
kernel with the window and sinks on the full table) and ``dense_sink_attention``
below, whose mask is built from positions in plain Python ints: a query at p
sees key j iff j <= p (causal) and (j < S_b or j >= lo(anchor)), with
S_b = ceil(S / b) * b, lo(p) = floor(max(p + 1 + K - W, 0) / b) * b and anchor
= p (causal) or seq_len - 1 (non-causal).
"""

import pytest
import torch

import dspark_compile
from dspark_compile import DraftWindowConfig
from dspark_compile.arithmetic import window
from dspark_compile.passes.attention_registry import (
    AttentionOpSpec,
    PerTokenWindowArgs,
    attention_op_specs,
    register_attention_op,
)
from dspark_compile.passes.draft_window import DraftWindowPass
from dspark_compile.passes.graph_utils import get_arg
from tests.dense_sink_oracle import dense_sink_attention
from tests.draft_cases import make_draft_case, post_pass_graph, run_eager_reference

B = 4  # the draft cases' KV block size


def _dense_eager(case, W, K, S):
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
            K,
            S,
        ).to(query.dtype)

    case.model.attention_override = attention
    try:
        with torch.no_grad():
            return case.model(*case.fresh_args())
    finally:
        case.model.attention_override = None


# (name, seq_lens, q_lens, causal, method, num_speculative_tokens, W, S). b = 4.
CASES = [
    # decode (one query per request; per-token form, q_len = 1)
    ("decode, S = one block", [37, 9, 64, 1], [1, 1, 1, 1], True, "eagle3", 2, 10, 4),
    (
        "decode, window starts inside the sinks",
        [15, 19, 23, 40],
        [1, 1, 1, 1],
        True,
        "eagle3",
        2,
        10,
        12,
    ),  # start_block 1, 2 (kept 1, 2 of 3 sink blocks), 3, 8 (kept 3)
    ("decode, S % b != 0, empty request", [37, 0, 3, 64], [1, 0, 1, 1], True, "dflash", 1, 9, 6),
    ("decode, S > seq", [37, 9, 3], [1, 1, 1], True, "eagle3", 1, 8, 100),
    # causal query blocks (per-token window: kv_offset, W, K, S on the op)
    ("causal blocks, q_len > W", [40, 33], [24, 30], True, "dflash", 1, 8, 4),
    (
        "causal blocks, empty request, seq < b",
        [50, 0, 3, 21],
        [20, 0, 3, 0],
        True,
        "dflash",
        1,
        13,
        6,
    ),
    (
        "causal blocks, window inside the sinks",
        [90, 70, 9, 14],
        [40, 1, 1, 3],
        True,
        "eagle3",
        3,
        16,
        16,
    ),
    ("causal blocks, W > seq", [30, 12], [12, 5], True, "dflash", 1, 200, 8),
    # non-causal blocks (per-request form: the window of the last position)
    ("non-causal, S = one block", [40, 23, 8, 61], [8, 8, 8, 8], False, "dflash", 1, 12, 4),
    (
        "non-causal, S = 4 blocks of 15 tokens",
        [50, 30, 19, 5],
        [6, 0, 3, 5],
        False,
        "dspark",
        1,
        16,
        15,
    ),
    ("non-causal, S > seq, W > seq", [33, 70], [4, 4], False, "dflash", 1, 200, 300),
]
# Inductor compiles take ~1 min each on 2 busy cores: the cases that cover each form.
INDUCTOR = {
    "decode, window starts inside the sinks",
    "causal blocks, q_len > W",
    "causal blocks, empty request, seq < b",
    "non-causal, S = 4 blocks of 15 tokens",
}


def _compile(model, lowering, **options):
    torch._dynamo.reset()
    return torch.compile(
        model, backend="dspark", options={"lowering": lowering, **options}, dynamic=False
    )


@pytest.mark.parametrize(
    "lowering,name,seq_lens,q_lens,causal,method,nst,W,S",
    [
        (lowering, *case)
        for case in CASES
        for lowering in ("aot_eager", "inductor")
        if lowering == "aot_eager" or case[0] in INDUCTOR
    ],
)
def test_compiled_draft_with_sinks_equals_the_dense_mask(
    lowering, name, seq_lens, q_lens, causal, method, nst, W, S
):
    case = make_draft_case(seq_lens, q_lens, causal=causal, seed=len(name) + S)
    config = DraftWindowConfig(
        draft_window_size=W, method=method, num_speculative_tokens=nst, draft_sink_size=S
    )
    K = config.resolved_future_offset
    want, want_keys, want_values = run_eager_reference(case, W, K, S)
    torch.testing.assert_close(
        want.double(), _dense_eager(case, W, K, S).double(), rtol=1e-5, atol=1e-5
    )

    dspark_compile.clear_pass_records()
    compiled = _compile(
        case.model,
        lowering,
        draft_window_size=W,
        method=method,
        num_speculative_tokens=nst,
        draft_sink_size=S,
    )
    keys, values = case.clone_caches()
    with torch.no_grad():
        got = compiled(*case.args(keys, values))
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    for k, wk, v, wv in zip(keys, want_keys, values, want_values):  # KV writes: absolute slots
        torch.testing.assert_close(k, wk, rtol=2e-5, atol=2e-5)
        torch.testing.assert_close(v, wv, rtol=2e-5, atol=2e-5)
    if any(-(-S // B) * B < s and W < s for s in seq_lens):
        window_only, _, _ = run_eager_reference(case, W, K)
        assert not torch.allclose(got, window_only, atol=1e-3), "the sinks must change the output"
    [record] = [r for r in dspark_compile.pass_records() if r.pass_name == "draft_window"]
    assert record.stats["attention_calls"] == record.stats["rewritten"] == 3
    assert record.stats["with_sinks"] == 3 and record.stats["window_computations"] == 1


def _ops(graph):
    """The post-pass graph as (op, target, args with nodes replaced by their names)."""

    def show(args):
        return str(torch.fx.node.map_arg(args, lambda node: node.name))

    return [(n.op, str(n.target), show(n.args), show(n.kwargs)) for n in graph.nodes]


@pytest.mark.parametrize("causal", [True, False])
def test_sink_size_zero_is_todays_graph(causal):
    """draft_sink_size=0 inserts exactly the ops of the window alone; S > 0 widens the
    table by ceil(S / b) columns and gives per-token calls sink_size=S."""
    case = make_draft_case([45, 12, 30], [5, 1, 7], causal=causal, num_layers=2)
    base = dict(draft_window_size=12, method="eagle3", num_speculative_tokens=2)
    without = post_pass_graph(case, base)
    with_zero = post_pass_graph(case, {**base, "draft_sink_size": 0})
    assert _ops(with_zero) == _ops(without)
    for call in (
        n for n in with_zero.nodes if n.target == torch.ops.dspark.paged_attention.default
    ):
        assert get_arg(call, 11, "sink_size") in (None, 0)

    sinks = post_pass_graph(case, {**base, "draft_sink_size": 6})
    calls = [n for n in sinks.nodes if n.target == torch.ops.dspark.paged_attention.default]
    assert len(calls) == 2
    for call in calls:
        width = call.args[3].meta["val"].shape[1]
        if causal:
            assert (
                width
                == window.max_window_blocks(12, B, 13, sink_size=6)
                == window.max_window_blocks(12, B, 13) + 2
            )
            assert get_arg(call, 11, "sink_size") == 6
        else:
            assert width == window.max_window_blocks(12, B, sink_size=6)
            assert get_arg(call, 11, "sink_size") in (None, 0)  # per request: no op argument


def test_pass_uuid_changes_with_sink_size():
    uuids = {
        DraftWindowPass(DraftWindowConfig(draft_window_size=64, draft_sink_size=s)).uuid()
        for s in (0, 4, 16)
    }
    assert len(uuids) == 3
    assert (
        DraftWindowPass(DraftWindowConfig(draft_window_size=64)).uuid()
        == DraftWindowPass(DraftWindowConfig(draft_window_size=64, draft_sink_size=0)).uuid()
    )


def test_upper_bounds_and_host_mirrors_count_the_sinks():
    """An op registered with a host mirror and a max_seq_len bound (per-request form):
    the mirror is windowed with the sinks and the bound capped at
    windowed_len_bound(W, b, K, sink_size=S)."""
    lib = torch.library.Library("dspark_sinks_test", "FRAGMENT")
    lib.define(
        "attn(Tensor q, Tensor key_cache, Tensor block_table, Tensor seq_lens, "
        "Tensor seq_lens_cpu, int max_seq_len) -> Tensor"
    )
    seen = {}

    def impl(q, key_cache, block_table, seq_lens, seq_lens_cpu, max_seq_len):
        seen.update(
            table=block_table.clone(),
            lens=seq_lens.clone(),
            mirror=seq_lens_cpu.clone(),
            bound=max_seq_len,
        )
        return q.clone()

    lib.impl("attn", impl, "CompositeExplicitAutograd")
    lib._register_fake("attn", lambda q, *args: torch.empty_like(q))
    op = torch.ops.dspark_sinks_test.attn.default
    register_attention_op(
        AttentionOpSpec(
            op=op,
            seq_lens="seq_lens",
            block_table="block_table",
            kv_cache="key_cache",
            host_seq_lens=("seq_lens_cpu",),
            upper_bounds=("max_seq_len",),
        )
    )
    try:

        def fn(q, kc, table, lens, lens_cpu):
            return op(q, kc, table, lens, lens_cpu, 1000)

        W, S, K = 10, 6, 0
        lens = torch.tensor([37, 9, 3, 64], dtype=torch.int32)
        table = torch.arange(1, 4 * 17 + 1, dtype=torch.int32).view(4, 17)
        kc = torch.zeros(80, B, 1, 8)
        torch._dynamo.reset()
        compiled = torch.compile(
            fn,
            backend="dspark",
            dynamic=False,
            options={"draft_window_size": W, "draft_sink_size": S, "lowering": "aot_eager"},
        )
        compiled(torch.ones(4, 2), kc, table, lens, lens.clone())
        want_lens, want_table = window.window_seq_lens_and_block_table(
            lens, table, W, B, K, sink_size=S
        )
        assert torch.equal(seen["lens"], want_lens) and torch.equal(seen["mirror"], want_lens)
        assert torch.equal(seen["table"], want_table)
        assert seen["bound"] == window.windowed_len_bound(W, B, K, sink_size=S) == W + B - 1 + 8
    finally:
        from dspark_compile.passes.attention_registry import unregister_attention_op

        unregister_attention_op(op)


def test_an_op_without_a_sink_argument_is_refused_for_causal_calls():
    """A per-token op that names no sink_size argument cannot keep sinks: the pass
    raises naming draft_sink_size (never drops the sinks silently)."""
    op = torch.ops.dspark.paged_attention.default
    original = attention_op_specs()[op]
    register_attention_op(
        AttentionOpSpec(
            op=op,
            seq_lens="seq_lens",
            block_table="block_table",
            kv_cache="key_cache",
            per_token_window=PerTokenWindowArgs(),
        )
    )
    try:
        case = make_draft_case([40, 33], [4, 4], causal=True)
        compiled = _compile(case.model, "aot_eager", draft_window_size=8, draft_sink_size=4)
        with pytest.raises(
            Exception,
            match=r"draft_sink_size=4 is not supported by .*"
            r"PerTokenWindowArgs\(sink_size=\.\.\.\)",
        ):
            with torch.no_grad():
                compiled(*case.fresh_args())
        # non-causal calls use the per-request form, which needs no op argument
        case = make_draft_case([40, 33], [4, 4], causal=False)
        want, _, _ = run_eager_reference(case, 8, 0, 4)
        compiled = _compile(case.model, "aot_eager", draft_window_size=8, draft_sink_size=4)
        with torch.no_grad():
            torch.testing.assert_close(compiled(*case.fresh_args()), want, rtol=2e-5, atol=2e-5)
    finally:
        register_attention_op(original)


def test_sinks_need_a_window():
    with pytest.raises(ValueError, match="draft_sink_size=4 is invalid without a window"):
        DraftWindowConfig(draft_sink_size=4)
    torch._dynamo.reset()
    fn = torch.compile(
        lambda x: x + 1, backend="dspark", options={"draft_sink_size": -1, "draft_window_size": 8}
    )
    with pytest.raises(ValueError, match="draft_sink_size=-1 is invalid"):
        fn(torch.ones(2))
