"""The DSpark reference draft through backend="dspark": the non-causal index pass
(composed with the draft window) makes the compiled draft equal the eager
non-causal reference; other methods leave the graph alone."""

import pytest
import torch

import dspark_compile
from dspark_compile.arithmetic.index_width import noncausal_width
from dspark_compile.kernels.sparse_mla import noncausal_swa_indices_ref
from dspark_compile.testing.dspark_case import (
    SMALL_DSPARK_CONFIG,
    dspark_args,
    make_dspark_case,
    run_dspark_eager,
)


def _noncausal(window, num_tokens):
    width = noncausal_width(window, num_tokens)

    def index_fn(seq_lens, locs, table, slots, block_size, _window, _width):
        return noncausal_swa_indices_ref(seq_lens, locs, table, slots, block_size, window, width)

    return index_fn


def _compile(model, lowering, **options):
    torch._dynamo.reset()
    return torch.compile(
        model, backend="dspark", dynamic=False, options={"lowering": lowering, **options}
    )


# W=120: the non-causal width (256) differs from the model's causal width (128).
@pytest.mark.parametrize(
    "lowering,window", [("aot_eager", None), ("aot_eager", 8), ("inductor", 8), ("inductor", 120)]
)
def test_compiled_dspark_equals_eager_noncausal_reference(lowering, window):
    # Requests: long context, seq_len < block, an empty request, W > context.
    model, batch, caches, hidden = make_dspark_case([60, 3, 0, 13], [5, 3, 0, 5])
    effective_window = window or SMALL_DSPARK_CONFIG.sliding_window
    want, want_caches = run_dspark_eager(
        model, batch, hidden, caches, _noncausal(effective_window, batch.num_tokens)
    )
    causal, _ = run_dspark_eager(model, batch, hidden, caches)

    dspark_compile.clear_pass_records()
    compiled = _compile(model, lowering, method="dspark", draft_window_size=window)
    got_caches = [c.clone() for c in caches]
    with torch.no_grad():
        got = compiled(*dspark_args(batch, hidden, got_caches))

    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    for got_cache, want_cache in zip(got_caches, want_caches):
        torch.testing.assert_close(got_cache, want_cache, rtol=2e-5, atol=2e-5)
    # Non-causal differs from causal for every request with more than one query.
    differs = (got - causal).abs().amax(-1) > 1e-4
    assert differs[:4].all() and differs[5:8].all()
    assert noncausal_width(effective_window, batch.num_tokens) == (256 if window == 120 else 128)
    [record] = [
        r for r in dspark_compile.pass_records() if r.pass_name == "dspark_noncausal_indices"
    ]
    assert record.stats == {
        "index_calls": 1,
        "rewritten": 1,
        "windowed": 0 if window is None else 1,
        "with_sinks": 0,
    }


def test_draft_window_bounds_the_context_part():
    """With W = 8 the first query of the long request reads 8 context tokens plus
    the block; the compiled outputs differ from the unwindowed non-causal draft."""
    model, batch, caches, hidden = make_dspark_case([60, 13], [5, 5], seed=1)
    narrow = _compile(model, "aot_eager", method="dspark", draft_window_size=8)
    with torch.no_grad():
        got_narrow = narrow(*dspark_args(batch, hidden, [c.clone() for c in caches]))
    wide = _compile(model, "aot_eager", method="dspark")
    with torch.no_grad():
        got_wide = wide(*dspark_args(batch, hidden, [c.clone() for c in caches]))
    assert (got_narrow[:5] - got_wide[:5]).abs().max() > 1e-3
    # The second request's context (8 tokens) fits both windows: identical rows.
    torch.testing.assert_close(got_narrow[5:], got_wide[5:], rtol=2e-5, atol=2e-5)


@pytest.mark.parametrize("method", ["dflash", "eagle3"])
def test_other_methods_leave_the_index_call_alone(method):
    model, batch, caches, hidden = make_dspark_case([30, 9], [4, 4], seed=2)
    want, _ = run_dspark_eager(model, batch, hidden, caches)
    dspark_compile.clear_pass_records()
    compiled = _compile(model, "aot_eager", method=method, draft_window_size=16)
    with torch.no_grad():
        got = compiled(*dspark_args(batch, hidden, [c.clone() for c in caches]))
    torch.testing.assert_close(got, want, rtol=2e-5, atol=2e-5)
    assert not [
        r for r in dspark_compile.pass_records() if r.pass_name == "dspark_noncausal_indices"
    ]


def test_pass_on_a_bare_graph_respects_method():
    from dspark_compile import DraftWindowConfig
    from dspark_compile.passes import DSparkNonCausalIndexPass

    model, batch, caches, hidden = make_dspark_case([30, 9], [4, 4], seed=3)
    from torch.fx.experimental.proxy_tensor import make_fx

    args = (batch.seq_lens, batch.query_start_loc, batch.block_table, batch.slot_mapping)
    gm = make_fx(
        lambda s, q, t, m: torch.ops.dspark.swa_indices(s, q, t, m, 4, 16, 128), tracing_mode="fake"
    )(*args)  # nodes carry meta["val"] like post-grad
    dflash = DSparkNonCausalIndexPass(DraftWindowConfig(method="dflash"))
    assert dflash.apply(gm.graph) == {
        "index_calls": 1,
        "rewritten": 0,
        "windowed": 0,
        "with_sinks": 0,
    }
    dspark = DSparkNonCausalIndexPass(DraftWindowConfig(method="dspark"))
    assert dspark.apply(gm.graph) == {
        "index_calls": 1,
        "rewritten": 1,
        "windowed": 0,
        "with_sinks": 0,
    }
    gm.recompile()
    got = gm(*args)
    want = noncausal_swa_indices_ref(*args, 4, 16, noncausal_width(16, batch.num_tokens))
    assert got.shape == want.shape and (got == want).all()
    assert dflash.uuid() != dspark.uuid()


def test_symbolic_token_count_is_refused_with_a_clear_error():
    model, batch, caches, hidden = make_dspark_case([30, 9], [4, 4], seed=4)
    torch._dynamo.reset()
    compiled = torch.compile(
        model, backend="dspark", dynamic=True, options={"lowering": "aot_eager", "method": "dspark"}
    )
    with pytest.raises(Exception, match="token count is symbolic .* dynamic=False"):
        with torch.no_grad():
            compiled(*dspark_args(batch, hidden, [c.clone() for c in caches]))


def test_propose_greedy_follows_markov_chain_and_pads_rows():
    model, batch, caches, hidden = make_dspark_case([30, 9], [5, 5], seed=5)
    with torch.no_grad():
        out, _ = run_dspark_eager(model, batch, hidden, caches, _noncausal(24, batch.num_tokens))
        anchors = torch.tensor([3, 7, 0])  # 3 rows: the last one is padding
        tokens = model.propose(out, batch.query_start_loc, anchors, 4, 0.0, torch.arange(3))
        assert tokens.shape == (3, 4) and (tokens[2] == -1).all()
        for r in range(2):
            prev = int(anchors[r])
            for i in range(4):
                logits = model.lm_head(out[int(batch.query_start_loc[r]) + 1 + i])
                want = int(torch.argmax(logits + model.markov_head(torch.tensor([prev]))[0]))
                assert int(tokens[r, i]) == want
                prev = want


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Triton kernels under Inductor on CUDA")
def test_compiled_dspark_on_cuda_equals_cpu_reference():
    model, batch, caches, hidden = make_dspark_case(
        [300, 3, 0, 77], [6, 3, 0, 6], block_size=16, seed=6
    )
    # W=120, T=15: non-causal width 256, the model's causal width 128.
    want, want_caches = run_dspark_eager(
        model, batch, hidden, caches, _noncausal(120, batch.num_tokens)
    )
    cuda_model = model.to("cuda")
    fields = ("block_table", "seq_lens", "query_start_loc", "slot_mapping", "positions")
    for name in fields:
        setattr(batch, name, getattr(batch, name).cuda())
    got_caches = [c.cuda() for c in caches]
    compiled = _compile(cuda_model, "inductor", method="dspark", draft_window_size=120)
    with torch.no_grad():
        got = compiled(*dspark_args(batch, hidden.cuda(), got_caches))
    torch.testing.assert_close(got.cpu(), want, rtol=1e-4, atol=1e-4)
    for got_cache, want_cache in zip(got_caches, want_caches):
        torch.testing.assert_close(got_cache.cpu(), want_cache, rtol=1e-4, atol=1e-4)


def test_cli_demo_runs_the_dspark_draft(capsys):
    from dspark_compile.tools import cli

    assert (
        cli.main(
            [
                "demo",
                "--draft",
                "dspark",
                "--contexts",
                "80",
                "--window",
                "32",
                "--requests",
                "2",
                "--lowering",
                "aot_eager",
            ]
        )
        == 0
    )
    out = capsys.readouterr().out
    assert "DSpark reference draft" in out
    assert "OK: the compiled DSpark draft matches the eager non-causal reference" in out
