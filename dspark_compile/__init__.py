"""dspark-compile: torch.compile passes for speculative-decoding draft models.

``torch.compile(draft, backend="dspark", options={"draft_window_size": 2048,
"method": "dflash"})`` windows every draft attention call (docs/design.md,
"Window arithmetic"); ``method="dspark"`` also swaps causal sparse-MLA indices
for the DSpark non-causal block form (docs/design.md, "DSpark indices").
"""

import logging

from dspark_compile import ops  # noqa: F401  (registers torch.ops.dspark.*)
from dspark_compile.arithmetic import (
    WindowBounds,
    causal_width,
    causal_window_metadata,
    causal_window_metadata_packed,
    compute_window,
    gather_window_block_table,
    max_window_blocks,
    noncausal_width,
    window_seq_lens,
    window_seq_lens_and_block_table,
    window_seq_lens_and_block_table_packed,
    window_upper_bound,
    windowed_len_bound,
)
from dspark_compile.backend import configured_backend, dspark_backend
from dspark_compile.config import METHODS, DraftWindowConfig
from dspark_compile.options import OptionError, valid_options
from dspark_compile.passes import (
    AttentionOpSpec,
    PassRecord,
    PerTokenWindowArgs,
    attention_op_specs,
    clear_pass_records,
    pass_records,
    register_attention_op,
    unregister_attention_op,
)
from dspark_compile.runtime import SlidingWindowAdapter, WindowedMetadata
from dspark_compile.tools.ascend_check import AscendCheck, check_ascend
from dspark_compile.tools.inspection import InspectionReport, inspect

logging.getLogger(__name__).addHandler(logging.NullHandler())

__version__ = "0.1.0"

__all__ = [
    # torch.compile backend and its options
    "METHODS",
    "DraftWindowConfig",
    "OptionError",
    "configured_backend",
    "dspark_backend",
    "valid_options",
    # attention ops the window pass rewrites; what the passes did
    "AttentionOpSpec",
    "PassRecord",
    "PerTokenWindowArgs",
    "attention_op_specs",
    "clear_pass_records",
    "pass_records",
    "register_attention_op",
    "unregister_attention_op",
    # window arithmetic and the run-time adapter
    "SlidingWindowAdapter",
    "WindowBounds",
    "WindowedMetadata",
    "causal_window_metadata",
    "causal_window_metadata_packed",
    "compute_window",
    "gather_window_block_table",
    "max_window_blocks",
    "window_seq_lens",
    "window_seq_lens_and_block_table",
    "window_seq_lens_and_block_table_packed",
    "window_upper_bound",
    "windowed_len_bound",
    "causal_width",
    "noncausal_width",
    # tools
    "AscendCheck",
    "InspectionReport",
    "check_ascend",
    "inspect",
]
