"""Pass names and stat keys: the counters every pass reports, as constants.

``PassManager`` records them (``pass_records()``), ``inspect`` prints them, the
demo reads them and the vLLM pass reports the same keys for the same things.
"""

from __future__ import annotations

# Pass names (``GraphPass.name``, ``PassRecord.pass_name``).
DRAFT_WINDOW_PASS = "draft_window"
NONCAUSAL_INDEX_PASS = "dspark_noncausal_indices"
VLLM_DRAFT_WINDOW_PASS = "vllm_draft_window"

# Stat keys shared by the window passes (ours and vLLM's).
ATTENTION_CALLS = "attention_calls"  # attention calls found in the graph
REWRITTEN = "rewritten"  # calls rewired to the window
WINDOW_COMPUTATIONS = "window_computations"  # window code blocks inserted (one per pair)
HOST_MIRRORS_WINDOWED = "host_mirrors_windowed"
UPPER_BOUNDS_WINDOWED = "upper_bounds_windowed"
WITH_SINKS = "with_sinks"  # of the rewritten: with attention sinks
# (draft_window: only when draft_sink_size > 0)

# The non-causal index pass.
INDEX_CALLS = "index_calls"  # dspark.swa_indices calls found
WINDOWED = "windowed"  # of the rewritten: W from draft_window_size

# The vLLM pass only.
TARGET_UNTOUCHED = "target_untouched"
UNKNOWN_UNTOUCHED = "unknown_untouched"
DRAFT_MLA_UNWINDOWED = "draft_mla_unwindowed"


def new_stats(*keys: str) -> dict[str, int]:
    """``{key: 0}`` for ``keys``, in order."""
    return {key: 0 for key in keys}
