"""dspark-compile: torch.compile passes for speculative-decoding draft models.

``torch.compile(draft, backend="dspark", options={"draft_window_size": 2048,
"method": "dflash"})`` windows every draft attention call (DESIGN.md 1.1);
``method="dspark"`` also swaps causal sparse-MLA indices for the DSpark
non-causal block form (DESIGN.md 1.2).
"""

import logging

from dspark_compile import ops  # noqa: F401  (registers torch.ops.dspark.*)
from dspark_compile.ascend import AscendCheck, check_ascend
from dspark_compile.backend import dspark_backend, valid_options
from dspark_compile.config import METHODS, DraftWindowConfig
from dspark_compile.inspection import InspectionReport, inspect
from dspark_compile.models.markov_sampling import (
    DSparkMarkovHead, block_sample_indices, gumbel_noise, sample_sequential)
from dspark_compile.kernels.sparse_mla import causal_width, noncausal_width
from dspark_compile.passes import (
    AttentionOpSpec, DraftWindowPass, DSparkNonCausalIndexPass, PassManager, PassRecord,
    PerTokenWindowArgs, attention_op_specs,
    clear_pass_records, pass_records, register_attention_op, unregister_attention_op)
from dspark_compile.window import (
    SlidingWindowAdapter, WindowBounds, WindowedMetadata, causal_window_metadata,
    causal_window_metadata_packed, compute_window,
    gather_window_block_table, max_window_blocks, window_seq_lens,
    window_seq_lens_and_block_table, window_seq_lens_and_block_table_packed,
    window_upper_bound, windowed_len_bound)

logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__ = "0.1.0"

__all__ = [
    "METHODS", "AttentionOpSpec", "DraftWindowConfig", "DraftWindowPass", "PassManager",
    "PassRecord", "PerTokenWindowArgs", "SlidingWindowAdapter", "WindowBounds", "WindowedMetadata",
    "attention_op_specs", "causal_window_metadata", "causal_window_metadata_packed",
    "clear_pass_records", "compute_window", "dspark_backend",
    "gather_window_block_table", "max_window_blocks", "pass_records", "register_attention_op",
    "unregister_attention_op", "valid_options", "window_seq_lens",
    "window_seq_lens_and_block_table", "window_seq_lens_and_block_table_packed",
    "window_upper_bound", "windowed_len_bound",
    "AscendCheck", "InspectionReport", "check_ascend", "inspect",
    "DSparkMarkovHead", "block_sample_indices", "gumbel_noise", "sample_sequential",
    "DSparkNonCausalIndexPass", "causal_width", "noncausal_width",
]
