"""Speculative decoding with a windowed draft: the loop, a trained byte-level
target/draft pair, and the acceptance-vs-context study.

``SpeculativeDecoder(target, draft, draft_fn=compile_draft(draft, W, b))``
decodes with any pair implementing :class:`PagedModel`.
"""

from dspark_research.speculative.lm import LMConfig, TransformerLM
from dspark_research.speculative.loop import (
    SpecResult,
    SpeculativeDecoder,
    compile_draft,
    target_greedy_decode,
)
from dspark_research.speculative.paged_cache import PagedKVCache, StepInputs
from dspark_research.speculative.protocol import PagedModel
from dspark_research.speculative.sampling import greedy_verify, rejection_sample

__all__ = [
    "LMConfig",
    "PagedKVCache",
    "PagedModel",
    "SpecResult",
    "SpeculativeDecoder",
    "StepInputs",
    "TransformerLM",
    "compile_draft",
    "greedy_verify",
    "rejection_sample",
    "target_greedy_decode",
]
