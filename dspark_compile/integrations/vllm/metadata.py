"""Window a vLLM draft layer's attention: native per-token window + windowed metadata
(without sinks), per-token expanded metadata (with attention sinks; "Sinks" below).

Without sinks the vLLM route meets the window contract for every causal draft
query token at absolute position ``p``, for any query length (decode,
multi-token draft steps, draft prefill, chunked prefill): it attends to keys ``j`` with
``lo(p) <= j <= p``, ``lo(p) = max(p + 1 + K - W, 0)`` EXACTLY, i.e. its last
``W - K`` tokens. Two mechanisms, both applied to every draft-layer call:

1. **Native per-token window** (correctness). The layer's attention
   implementation gets the backend's own sliding window of ``n = W - K``
   tokens (``set_native_window``): FlashAttention and Triton take
   ``sliding_window = (n - 1, 0)`` (left window; Triton's mask is
   ``q - k < 1 + (n - 1)``), CPU attention takes ``sliding_window = n``
   (its kernel and its scheduler metadata).
2. **Windowed metadata** (bandwidth; ``window_attention_metadata``). Per
   request, the KV before the block-aligned window start of the request's
   FIRST query token is cut away: with ``q`` the request's query length and
   ``s`` its ``seq_len``,

   ``start = floor(max(s - q + 1 + K - W, 0) / b) * b``

   ``seq_lens -> s - start``; ``block_table -> columns start/b + [0, C)`` of
   the full table, zero past what the request needs and past the table's
   width, with ``C = min(width, ceil((max_query_len + W - K) / b) + 1)``;
   ``max_seq_len -> min(max_seq_len, max_query_len + W - K + b - 2)``.
   Every query token keeps all keys its window needs (the first token's
   window starts earliest), so (1) alone decides what each token reads.
   A NON-causal draft block (DFlash: all its queries read the same keys)
   gets no native window and the metadata window of its last token
   (``q`` taken as 1).
   FlashAttention's AOT ``scheduler_metadata`` (planned from the full
   lengths) is dropped so FA3 plans from the windowed ones; CPU attention's
   scheduler metadata is recomputed from the windowed lengths and window.

``slot_mapping`` (KV writes, absolute slots) is the same tensor object; every
other field is shared. Multimodal prefix ranges, R-SWA and decode context
parallel raise. ``StepWindows`` applies (2) once per metadata object per
forward step into persistent buffers allocated at the first call (before any
CUDA-graph capture) and never reallocated.

Sinks (``draft_sink_size`` S > 0; ``sink_window_metadata``). A native sliding
window hides the front of the sequence, so with sinks the layer gets NONE
(``check_no_native_window``) and the metadata alone decides what each query
reads. The rule is then the block-aligned one of ``dspark.paged_attention``
(docs/design.md, "Window arithmetic"): a query at ``p`` sees keys ``j <= p``
with ``j < S_b`` or ``j >= lo(p)``, ``S_b = ceil(S / b) * b``,
``lo(p) = floor(max(p + 1 + K - W, 0) / b) * b`` (so up to ``b - 1`` keys
more than the token-exact window without sinks).

- Causal calls are expanded per token: every query token ``t`` (request
  ``r``, position ``p_t``) becomes its own single-query request,
  ``query_start_loc -> arange(T + 1)`` (T = ``num_actual_tokens``),
  ``max_query_len -> 1``, ``seq_lens[t]``/``block_table[t]`` = the decode-form
  window of ``seq_len = p_t + 1`` on request ``r``'s table row
  (``window_seq_lens_and_block_table`` with ``sink_size``: ``min(ceil(S/b),
  lo/b)`` kept sink blocks, then the window's blocks, no block twice),
  ``max_seq_len -> min(max_seq_len, windowed_len_bound(W, b, K, 1, S))``.
  With one query per row the kernel's causal mask is the whole row, so the
  result is the rule above exactly, for any query length. Output rows stay
  in token order. Requests with no query tokens (padding) have no row.
- Non-causal calls (DFlash-style blocks): no expansion; each request gets the
  window of its last token plus sinks.
- Backend fields: FlashAttention's AOT ``scheduler_metadata`` is dropped
  (it plans per request), ``use_cascade`` (older FlashAttention metadata)
  raises; Triton's split-K scratch (``softmax_segm_*``, rows per query token)
  and ``seq_threshold_3D`` are kept (the kernel picks 2D when the token rows
  exceed the threshold or the scratch); CPU attention's scheduler metadata is
  recomputed for the rows with no sliding window.
- Cost: one table row per query token (``max_window_blocks(W, b, sink_size=S)``
  columns), so a draft prefill reads each token's window separately (T
  single-query rows instead of one query block per request).
- Buffers (``SinkWindowBuffers``): ``max_num_batched_tokens`` rows (the
  proposers' token budget), allocated at the first call and never
  reallocated; a step that does not fit raises.

With S = 0 nothing of this runs: the native window and (2) above, unchanged.

Where each piece lives (this module re-exports them): ``backends`` (backend names, the
native window, CPU attention's scheduler metadata), ``token_window`` (2, no sinks),
``sink_window`` (sinks), ``step_windows`` (``StepWindows``), ``config.WindowSpec`` (the
validated W, K, b, S) and ``arithmetic.window`` (every formula); vLLM itself through
``seam`` only.
"""

from __future__ import annotations

from dspark_compile.config import WindowSpec
from dspark_compile.integrations.vllm.backends import (
    SUPPORTED_BACKENDS,
    check_no_native_window,
    check_supported,
    is_causal,
    kernel_block_size,
    metadata_backend,
    native_window_value,
    set_native_window,
    supported_metadata_types,
)
from dspark_compile.integrations.vllm.seam import cpu_attn_ops
from dspark_compile.integrations.vllm.sink_window import SinkWindowBuffers, sink_window_metadata
from dspark_compile.integrations.vllm.step_windows import StepWindows, WindowStats
from dspark_compile.integrations.vllm.token_window import (
    WindowBuffers,
    window_attention_metadata,
    window_columns,
    window_start,
)

__all__ = [
    "SUPPORTED_BACKENDS",
    "SinkWindowBuffers",
    "StepWindows",
    "WindowBuffers",
    "WindowSpec",
    "WindowStats",
    "check_no_native_window",
    "check_supported",
    "cpu_attn_ops",
    "is_causal",
    "kernel_block_size",
    "metadata_backend",
    "native_window_value",
    "set_native_window",
    "sink_window_metadata",
    "supported_metadata_types",
    "window_attention_metadata",
    "window_columns",
    "window_start",
]
