"""The demo's acceptance part on the committed trained pair (our speculative loop, CPU)."""

import pytest

from dspark_compile.tools.pair_demo import PAIR_DIR, pair_contexts, run_pair_demo

pytest.importorskip("safetensors")


def test_the_window_restores_acceptance_at_16x_and_changes_no_token():
    """At 1024 prompt tokens (16x the draft's 64-token training context), one held-out
    prompt, 24 greedy tokens: the windowed draft is accepted more (the demo's full run,
    4 prompts x 32 tokens: tau 1.63 -> 2.33) and both runs emit the same tokens."""
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
