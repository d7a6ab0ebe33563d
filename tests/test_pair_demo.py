"""The demo's acceptance part on the committed trained pair (our speculative loop, CPU)."""

import pytest

from dspark_research.pair_demo import PAIR_DIR, _row, pair_contexts, run_pair_demo

pytest.importorskip("safetensors")


def test_the_window_restores_acceptance_at_16x_and_changes_no_token():
    """At 1024 prompt tokens (16x the draft's 64-token training context), one held-out
    prompt, 24 greedy tokens: the windowed draft is accepted more (the demo's full run,
    4 prompts x 32 tokens: tau 1.63 -> 2.33) and both runs emit the target's own greedy
    tokens."""
    assert pair_contexts() == [64, 1024]
    (row,) = run_pair_demo(PAIR_DIR, [1024], num_prompts=1, new_tokens=24)
    assert row.window == 64
    assert row.tokens_equal
    assert row.rounds > 0
    assert row.tau_window > 1.2 * row.tau_off, row


def test_bad_context_and_missing_pair_name_the_argument(tmp_path):
    with pytest.raises(
        ValueError, match=r"context=100 is invalid: the pair has prompts of \[64, 1024\]"
    ):
        next(run_pair_demo(PAIR_DIR, [100]))
    with pytest.raises(FileNotFoundError, match="prompts.json not found"):
        next(run_pair_demo(tmp_path, [64]))


def _runs(*token_lists):
    from dspark_research.speculative.loop import SpecResult

    return [SpecResult(list(t), [1, 0], 5, 4, 0.0, 0.0, 0.0, 0.0, 0.0, len(t)) for t in token_lists]


def test_tokens_equal_compares_with_the_targets_own_greedy_tokens():
    """Both speculative runs must equal the target's greedy decode. Negative control: two
    runs that agree with each other but not with the target (what a comparison of the
    draft-off run with the windowed one would pass) are not equal."""
    reference = [[1, 2, 3], [4, 5, 6]]
    assert _row(64, 64, _runs(*reference), _runs(*reference), reference).tokens_equal
    wrong = [[1, 2, 3], [4, 5, 7]]
    assert not _row(64, 64, _runs(*wrong), _runs(*wrong), reference).tokens_equal
    assert not _row(64, 64, _runs(*reference), _runs(*wrong), reference).tokens_equal
    assert not _row(64, 64, _runs(*wrong), _runs(*reference), reference).tokens_equal
    assert not _row(64, 64, _runs(reference[0]), _runs(reference[0]), reference).tokens_equal


def test_negative_control_a_wrong_target_reference_is_caught(monkeypatch):
    """The demo end to end at 64 tokens (one prompt, 8 tokens) with the target's greedy
    decode replaced by one whose last token is off by one: ``tokens_equal`` turns False,
    so the demo's comparison does read the target's own decode (the unpatched run is the
    first test's)."""
    from dspark_research.speculative import loop

    real = loop.target_greedy_decode

    def shifted(*args, **kwargs):
        tokens, rate = real(*args, **kwargs)
        return tokens[:-1] + [(tokens[-1] + 1) % 256], rate

    monkeypatch.setattr(loop, "target_greedy_decode", shifted)
    (row,) = run_pair_demo(PAIR_DIR, [64], num_prompts=1, new_tokens=8)
    assert not row.tokens_equal
