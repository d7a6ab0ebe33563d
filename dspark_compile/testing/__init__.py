"""Test oracles and reference draft cases (used by tests, demos, inspection and benchmarks)."""

from dspark_compile.testing.dspark_case import (
    SMALL_DSPARK_CONFIG,
    DSparkCase,
    dspark_args,
    make_dspark_case,
    run_dspark_eager,
)
from dspark_compile.testing.oracles import windowed_attention_ref
from dspark_compile.testing.reference_case import DraftCase, make_draft_case

__all__ = [
    "SMALL_DSPARK_CONFIG",
    "DSparkCase",
    "DraftCase",
    "dspark_args",
    "make_draft_case",
    "make_dspark_case",
    "run_dspark_eager",
    "windowed_attention_ref",
]
