"""Test oracles and reference draft cases (used by tests, demos, inspection and benchmarks)."""

from dspark_compile.testing.oracles import windowed_attention_ref
from dspark_compile.testing.reference_case import DraftCase, make_draft_case

__all__ = ["DraftCase", "make_draft_case", "windowed_attention_ref"]
