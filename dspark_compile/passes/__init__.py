"""FX passes over the post-grad ATen graph and the pass manager that runs them."""

from dspark_compile.passes import stats
from dspark_compile.passes.attention_registry import (
    AttentionOpSpec,
    PerTokenWindowArgs,
    attention_op_specs,
    register_attention_op,
    unregister_attention_op,
)
from dspark_compile.passes.base import GraphPass
from dspark_compile.passes.draft_window import DraftWindowPass
from dspark_compile.passes.dspark_noncausal import DSparkNonCausalIndexPass
from dspark_compile.passes.manager import PassManager, PassRecord, clear_pass_records, pass_records

__all__ = [
    "AttentionOpSpec",
    "DraftWindowPass",
    "GraphPass",
    "PassManager",
    "PassRecord",
    "PerTokenWindowArgs",
    "attention_op_specs",
    "clear_pass_records",
    "pass_records",
    "register_attention_op",
    "unregister_attention_op",
    "DSparkNonCausalIndexPass",
    "stats",
]
