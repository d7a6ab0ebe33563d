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
"""

from __future__ import annotations

import copy
import dataclasses
import logging
from typing import Any

import torch

from dspark_compile.arithmetic.window import (
    compute_window,
    max_window_blocks,
    table_columns,
    windowed_len_bound,
)

logger = logging.getLogger(__name__)

SUPPORTED_BACKENDS = ("FLASH_ATTN", "TRITON_ATTN", "CPU_ATTN")
_STEP_CACHE_KEY = "dspark_windowed_attn_metadata"
# (field, backend feature) pairs the window cannot shift: absolute positions
# or per-rank context lengths.
_UNSUPPORTED_FIELDS = (
    ("dcp_context_kv_lens", "decode context parallel"),
    ("mm_prefix_query_range_tensor", "multimodal prefix ranges"),
    ("mm_prefix_range_tensor", "multimodal prefix ranges"),
    ("rswa_prefix_lens", "R-SWA"),
)


@dataclasses.dataclass(frozen=True)
class WindowSpec:
    """W (window), K (future offset), b (kernel block size), S (sink tokens, 0: none);
    ``tokens = W - K``."""

    window_size: int
    future_offset: int
    block_size: int
    sink_size: int = 0

    def __post_init__(self) -> None:
        if self.future_offset >= self.window_size:
            raise ValueError(
                f"future_offset={self.future_offset} must be < window_size={self.window_size}"
            )
        if self.block_size < 1:
            raise ValueError(f"block_size={self.block_size} must be positive")
        if not isinstance(self.sink_size, int) or self.sink_size < 0:
            raise ValueError(
                f"sink_size={self.sink_size!r} is invalid: expected a "
                "non-negative int (0: no attention sinks)"
            )

    @property
    def tokens(self) -> int:
        return self.window_size - self.future_offset


def _metadata_classes() -> dict[str, type]:
    """Metadata class per supported backend name, for the backends this vLLM ships."""
    classes: dict[str, type] = {}
    try:
        from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadata

        classes["FLASH_ATTN"] = FlashAttentionMetadata
    except ImportError:  # CPU builds may lack the FA extension
        pass
    from vllm.v1.attention.backends.triton_attn import TritonAttentionMetadata

    classes["TRITON_ATTN"] = TritonAttentionMetadata
    try:
        from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadata

        classes["CPU_ATTN"] = CPUAttentionMetadata
    except ImportError:
        pass
    return classes


def supported_metadata_types() -> tuple[type, ...]:
    return tuple(_metadata_classes().values())


def metadata_backend(metadata: Any) -> str:
    """The backend name of a metadata object; ``TypeError`` for any other backend."""
    for name, cls in _metadata_classes().items():
        if isinstance(metadata, cls):
            return name
    raise TypeError(
        f"attention metadata of type {type(metadata).__name__} cannot be windowed: "
        f"the draft window supports the {', '.join(SUPPORTED_BACKENDS)} backends"
    )


def kernel_block_size(kv_cache: torch.Tensor) -> int:
    """Block size of a FlashAttention/Triton/CPU KV cache, logical ``[B, Hkv, b, 2*D]``
    (FlashAttention: ``[2, B, b, Hkv, D]``)."""
    if kv_cache.dim() == 5 and kv_cache.shape[0] == 2:
        return int(kv_cache.shape[2])
    if kv_cache.dim() != 4:
        raise ValueError(
            f"kv_cache of shape {tuple(kv_cache.shape)} is not a "
            "[num_blocks, num_kv_heads, block_size, 2 * head_size] cache"
        )
    return int(kv_cache.shape[2])


def native_window_value(backend: str, tokens: int) -> Any:
    """The ``impl.sliding_window`` value that makes a query see its last ``tokens`` keys."""
    if backend in ("FLASH_ATTN", "TRITON_ATTN"):
        return (tokens - 1, 0)
    if backend == "CPU_ATTN":
        return tokens
    raise ValueError(
        f"backend={backend!r} has no native draft window: expected one of "
        f"{', '.join(SUPPORTED_BACKENDS)}"
    )


def _window_disabled(value: Any) -> bool:
    return value is None or value == -1 or value == (-1, -1)


def set_native_window(layer: Any, backend: str, tokens: int, causal: bool = True) -> None:
    """Give ``layer.impl`` the backend's sliding window of ``tokens`` (idempotent).

    Only for causal attention: a non-causal draft block (DFlash) is windowed
    by its metadata alone (every query of the block reads the same keys), and
    a layer that has the native window must never run non-causal (raises).
    Raises ``NotImplementedError`` when the layer already has a different
    sliding window of its own (a draft with trained sliding-window layers).
    """
    impl = layer.impl
    want = native_window_value(backend, tokens)
    have = getattr(impl, "sliding_window", None)
    if have == want:
        if not causal:
            raise RuntimeError(
                f"draft layer {getattr(layer, 'layer_name', '?')} has the native causal draft "
                "window but now runs non-causal attention; the window cannot serve both"
            )
        return
    if not causal:
        return
    if not _window_disabled(have):
        raise NotImplementedError(
            f"draft layer {getattr(layer, 'layer_name', '?')} already has its own sliding "
            f"window {have!r}; combining it with the draft window ({want!r}) is not supported"
        )
    impl.sliding_window = want


class WindowBuffers:
    """Persistent windowed ``seq_lens`` and block table of one KV-cache group.

    Sized once, ``[max_num_reqs]`` and ``[max_num_reqs, table_width]`` (the
    runner's full block-table width); never reallocated, so pointers captured
    in CUDA graphs stay valid. A step that does not fit raises.
    """

    def __init__(
        self,
        max_num_reqs: int,
        table_width: int,
        device: torch.device,
        seq_lens_dtype: torch.dtype,
        table_dtype: torch.dtype,
    ) -> None:
        self.seq_lens = torch.zeros(max_num_reqs, dtype=seq_lens_dtype, device=device)
        self.block_table = torch.zeros(max_num_reqs, table_width, dtype=table_dtype, device=device)

    def check_fits(self, seq_lens: torch.Tensor, block_table: torch.Tensor) -> None:
        num_reqs, width = block_table.shape
        cap_reqs, cap_width = self.block_table.shape
        if (
            num_reqs > cap_reqs
            or width > cap_width
            or seq_lens.device != self.seq_lens.device
            or seq_lens.dtype != self.seq_lens.dtype
            or block_table.dtype != self.block_table.dtype
        ):
            raise RuntimeError(
                f"draft window buffers ([{cap_reqs}, {cap_width}] {self.block_table.dtype} on "
                f"{self.block_table.device}) cannot hold a step with {num_reqs} requests and a "
                f"[{num_reqs}, {width}] {block_table.dtype} block table on {block_table.device}; "
                "they are sized once from max_num_seqs and the first block table and never "
                "reallocated (CUDA graphs keep their pointers)"
            )


def is_causal(metadata: Any) -> bool:
    """True for plain causal metadata (a per-step causal tensor counts as non-causal)."""
    causal = getattr(metadata, "causal", True)
    return causal is True


def window_start(
    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, spec: WindowSpec, causal: bool = True
) -> torch.Tensor:
    """Block-aligned window start per request (device, no sync).

    Causal: the window of the request's FIRST query token, so every token of
    the block keeps its own window. Non-causal (a DFlash-style block whose
    queries all read the same keys): the window of the last token,
    ``max(seq_len + K - W, 0)``.
    """
    num_reqs = seq_lens.shape[0]
    if causal:
        q_lens = (query_start_loc[1 : num_reqs + 1] - query_start_loc[:num_reqs]).to(seq_lens.dtype)
    else:
        q_lens = torch.ones_like(seq_lens)
    first = seq_lens - q_lens
    lo = torch.clamp(first + 1 - spec.tokens, min=0)
    return torch.div(lo, spec.block_size, rounding_mode="floor") * spec.block_size


def window_columns(max_query_len: int, table_width: int, spec: WindowSpec) -> int:
    """Columns of the windowed block table: enough for any request of the step."""
    needed = -(-(max(max_query_len, 1) + spec.tokens) // spec.block_size) + 1
    return max(1, min(table_width, needed))


def _window_table_torch(
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    table: torch.Tensor,
    spec: WindowSpec,
    causal: bool,
    new_lens: torch.Tensor,
    new_table: torch.Tensor,
) -> None:
    """Windowed lengths into ``new_lens [R]`` and table into ``new_table [R, cols]``
    (module doc, mechanism 2; the reference of ``query_window_table_triton``)."""
    width, cols = table.shape[1], new_table.shape[1]
    start = window_start(seq_lens, query_start_loc, spec, causal)
    torch.sub(seq_lens, start, out=new_lens)
    offsets = torch.arange(cols, device=table.device, dtype=table.dtype)
    src = (
        torch.div(start, spec.block_size, rounding_mode="floor").to(table.dtype)[:, None] + offsets
    )
    needed = torch.div(new_lens + spec.block_size - 1, spec.block_size, rounding_mode="floor").to(
        table.dtype
    )
    valid = (offsets[None, :] < needed[:, None]) & (src < width)
    gathered = torch.gather(table, 1, torch.clamp(src, max=width - 1).long())
    torch.where(
        valid, gathered, torch.zeros((), dtype=table.dtype, device=table.device), out=new_table
    )


def window_attention_metadata(
    metadata: Any,
    buffers: WindowBuffers,
    spec: WindowSpec,
    layer: Any = None,
    query_dtype: torch.dtype | None = None,
    use_triton: bool | None = None,
) -> Any:
    """Windowed shallow copy of a FlashAttention/Triton/CPU metadata object (module doc).

    ``layer`` (the draft layer) and ``query_dtype`` are needed for CPU attention,
    whose scheduler metadata is recomputed. ``use_triton`` (default: the table is on a
    GPU) computes the windowed lengths and table in one Triton launch
    (``kernels.window_metadata.query_window_table_triton``) instead of ~20 torch ops
    (``_window_table_torch``, its reference): the same values, less host time per
    draft call where the draft runs outside CUDA graphs.
    """
    backend = metadata_backend(metadata)
    _check_supported(metadata)
    seq_lens, table = metadata.seq_lens, metadata.block_table
    buffers.check_fits(seq_lens, table)
    num_reqs, width = table.shape
    causal = is_causal(metadata)
    max_query_len = int(metadata.max_query_len) if causal else 1
    cols = window_columns(max_query_len, width, spec)
    new_lens = buffers.seq_lens[:num_reqs]
    new_table = buffers.block_table[:num_reqs, :cols]
    if width and (table.is_cuda if use_triton is None else use_triton):
        from dspark_compile.kernels.window_metadata import query_window_table_triton

        query_window_table_triton(
            seq_lens,
            metadata.query_start_loc,
            table,
            spec.tokens,
            spec.block_size,
            new_lens,
            new_table,
            causal,
        )
    else:
        _window_table_torch(
            seq_lens, metadata.query_start_loc, table, spec, causal, new_lens, new_table
        )
    out = copy.copy(metadata)
    out.seq_lens = new_lens
    out.block_table = new_table
    bound = max_query_len + spec.tokens + spec.block_size - 2
    out.max_seq_len = min(int(metadata.max_seq_len), bound)
    if backend == "FLASH_ATTN" and getattr(metadata, "scheduler_metadata", None) is not None:
        out.scheduler_metadata = None
    if backend == "CPU_ATTN":
        out.scheduler_metadata = _cpu_scheduler_metadata(out, layer, spec, query_dtype)
    return out


def _check_supported(metadata: Any) -> None:
    for field, feature in _UNSUPPORTED_FIELDS:
        if getattr(metadata, field, None) is not None:
            raise NotImplementedError(
                f"{type(metadata).__name__}.{field} is set ({feature}): the draft window "
                f"does not support {feature}"
            )


def cpu_attn_ops() -> Any:
    """The vLLM module with ``cpu_attn_get_scheduler_metadata``: ``vllm._cpu_ops`` (0.34;
    what its CPU attention backend calls), else ``vllm._custom_ops`` (0.26 to 0.33)."""
    try:
        from vllm import _cpu_ops as ops
    except ImportError:
        ops = None
    if ops is None or not hasattr(ops, "cpu_attn_get_scheduler_metadata"):
        from vllm import _custom_ops as ops
    return ops


def _cpu_scheduler_metadata(
    metadata: Any,
    layer: Any,
    spec: WindowSpec,
    query_dtype: torch.dtype | None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """CPU attention's work plan for the windowed lengths and the native window
    (``sliding_window``: that of the layer's kernel; default ``W - K``)."""
    import vllm.envs as envs

    ops = cpu_attn_ops()
    if layer is None or query_dtype is None:
        raise ValueError(
            "CPU attention metadata needs the draft layer and the query dtype "
            "to recompute its scheduler metadata"
        )
    impl = layer.impl
    return ops.cpu_attn_get_scheduler_metadata(
        num_reqs=metadata.seq_lens.shape[0],
        num_heads=impl.num_heads,
        num_kv_heads=impl.num_kv_heads,
        head_dim=impl.head_size,
        seq_lens=metadata.seq_lens,
        dtype=query_dtype,
        query_start_loc=metadata.query_start_loc,
        causal=metadata.causal,
        sliding_window_size=spec.tokens if sliding_window is None else sliding_window,
        isa=layer.isa,
        enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV,
        dynamic_causal=metadata.dynamic_causal,
        kv_cache_dtype=impl.kv_cache_dtype,
    )


class SinkWindowBuffers:
    """Persistent windowed metadata of one KV-cache group with attention sinks.

    ``seq_lens [rows]``, ``block_table [rows, cols]`` and ``query_start_loc =
    arange(rows + 1)`` with ``rows`` the most query tokens of a step (vLLM's
    ``max_num_batched_tokens``; causal calls get one row per query token) and
    ``cols = max_window_blocks(W, b, sink_size=S)`` (sink blocks + the
    decode-form window). Sized once; never reallocated, so pointers captured
    in CUDA graphs stay valid. A step that does not fit raises.
    """

    def __init__(
        self,
        rows: int,
        cols: int,
        device: torch.device,
        seq_lens_dtype: torch.dtype,
        table_dtype: torch.dtype,
        query_start_loc_dtype: torch.dtype,
    ) -> None:
        self.seq_lens = torch.zeros(rows, dtype=seq_lens_dtype, device=device)
        self.block_table = torch.zeros(rows, cols, dtype=table_dtype, device=device)
        self.query_start_loc = torch.arange(rows + 1, dtype=query_start_loc_dtype, device=device)

    def check_fits(self, rows: int, metadata: Any) -> None:
        seq_lens, table = metadata.seq_lens, metadata.block_table
        capacity = self.block_table.shape[0]
        if (
            rows > capacity
            or seq_lens.device != self.seq_lens.device
            or seq_lens.dtype != self.seq_lens.dtype
            or table.dtype != self.block_table.dtype
            or metadata.query_start_loc.dtype != self.query_start_loc.dtype
        ):
            raise RuntimeError(
                f"draft window + sink buffers ({capacity} rows of {self.block_table.dtype} on "
                f"{self.block_table.device}) cannot hold a step needing {rows} rows (one per "
                f"query token of a causal call, one per request otherwise) with "
                f"{seq_lens.dtype} seq_lens and a {table.dtype} block table on {table.device}; "
                "they are sized once from max_num_batched_tokens and never reallocated "
                "(CUDA graphs keep their pointers)"
            )


def check_no_native_window(layer: Any, backend: str) -> None:
    """With sinks the layer must run WITHOUT a native sliding window (it would hide the
    sinks): raises ``NotImplementedError`` when it has one (its own, or the draft
    window's from a run without sinks)."""
    have = getattr(layer.impl, "sliding_window", None)
    if not _window_disabled(have):
        raise NotImplementedError(
            f"draft layer {getattr(layer, 'layer_name', '?')} ({backend}) has a sliding window "
            f"{have!r}: attention sinks need the layer without one (a native window hides "
            "the sinks); drafts with sliding-window layers cannot use draft_sink_size"
        )


def sink_window_metadata(
    metadata: Any,
    buffers: SinkWindowBuffers,
    spec: WindowSpec,
    layer: Any = None,
    query_dtype: torch.dtype | None = None,
) -> Any:
    """Windowed copy of a FlashAttention/Triton/CPU metadata object WITH attention sinks
    (``spec.sink_size > 0``; module docstring, "Sinks").

    Causal: one single-query row per query token ``t`` (``query_start_loc ->
    arange(T + 1)``, ``max_query_len -> 1``): ``seq_lens[t]`` and ``block_table[t]``
    are the decode-form window (``window_seq_lens_and_block_table``) of
    ``seq_len = p_t + 1`` on the token's request row, sinks included. Non-causal:
    one row per request, the window of its last token, sinks included. In both
    ``max_seq_len -> min(max_seq_len, windowed_len_bound(W, b, K, 1, S))``;
    FlashAttention's AOT ``scheduler_metadata`` is dropped, CPU attention's is
    recomputed for the new rows (no sliding window). The layer must run without
    a native window. ``slot_mapping`` and every other field are shared.
    """
    backend = metadata_backend(metadata)
    _check_supported(metadata)
    if getattr(metadata, "use_cascade", False):
        raise NotImplementedError(
            f"{type(metadata).__name__}.use_cascade is set (cascade attention): the draft "
            "window with sinks does not support cascade attention"
        )
    seq_lens, table, qsl = metadata.seq_lens, metadata.block_table, metadata.query_start_loc
    num_reqs, width = table.shape
    causal = is_causal(metadata)
    rows = int(metadata.num_actual_tokens) if causal else num_reqs
    buffers.check_fits(rows, metadata)
    window, offset, block, sinks = (
        spec.window_size,
        spec.future_offset,
        spec.block_size,
        spec.sink_size,
    )
    cols = max(
        1,
        min(width, buffers.block_table.shape[1], max_window_blocks(window, block, sink_size=sinks)),
    )
    new_lens = buffers.seq_lens[:rows]
    new_table = buffers.block_table[:rows, :cols]
    if rows and num_reqs and width:
        if causal:
            tokens = torch.arange(rows, device=qsl.device, dtype=qsl.dtype)
            req = torch.clamp(
                torch.searchsorted(qsl[1 : num_reqs + 1].contiguous(), tokens, right=True),
                max=num_reqs - 1,
            )
            first = qsl[req]
            s_req = seq_lens[req]
            # p_t + 1 (clamped to [1, s] so that padding rows stay harmless)
            ends = (
                s_req
                - (qsl[req + 1] - first).to(s_req.dtype)
                + (tokens - first).to(s_req.dtype)
                + 1
            )
            ends = torch.clamp(torch.minimum(ends, s_req), min=1)
        else:
            req = torch.arange(num_reqs, device=seq_lens.device)
            ends = seq_lens
        bounds = compute_window(ends, window, block, offset, sink_size=sinks)
        col = torch.arange(cols, device=table.device, dtype=bounds.start_block.dtype)[None, :]
        index = table_columns(col, bounds.start_block[:, None], bounds.kept_sinks[:, None])
        valid = (col < bounds.needed[:, None]) & (index < width)
        values = table[req.long()[:, None], torch.clamp(index, min=0, max=width - 1).long()]
        torch.where(
            valid, values, torch.zeros((), dtype=table.dtype, device=table.device), out=new_table
        )
        new_lens.copy_(bounds.windowed_len)
    else:
        new_lens.zero_()
        new_table.zero_()
    out = copy.copy(metadata)
    out.seq_lens = new_lens
    out.block_table = new_table
    out.max_seq_len = min(
        int(metadata.max_seq_len), windowed_len_bound(window, block, offset, 1, sinks)
    )
    if causal:
        out.query_start_loc = buffers.query_start_loc[: rows + 1]
        out.max_query_len = 1
    if backend == "FLASH_ATTN" and getattr(metadata, "scheduler_metadata", None) is not None:
        out.scheduler_metadata = None
    if backend == "CPU_ATTN":
        out.scheduler_metadata = _cpu_scheduler_metadata(
            out, layer, spec, query_dtype, sliding_window=-1
        )
    out.dspark_expanded = causal
    return out


@dataclasses.dataclass
class WindowStats:
    """What the windowed op did in this process (read by tests and logs)."""

    windowed_calls: dict[str, int] = dataclasses.field(default_factory=dict)
    metadata_windowed: int = 0
    # metadata objects windowed with sinks: per query token (causal) / per request
    metadata_expanded: int = 0
    metadata_sinks_noncausal: int = 0


class StepWindows:
    """Windowed metadata, computed once per metadata object per forward step.

    Buffers are keyed by the first layer that reads a metadata object in a
    step: layers of one KV-cache group share it, distinct groups get distinct
    buffers (no group ever reads another group's windowed table).
    """

    def __init__(self) -> None:
        self._buffers: dict[tuple, Any] = {}
        self.stats = WindowStats()

    def windowed(
        self,
        forward_context: Any,
        layer_name: str,
        layer: Any,
        metadata: Any,
        kv_cache: torch.Tensor,
        window_size: int,
        future_offset: int,
        max_num_seqs: int,
        query_dtype: torch.dtype,
        sink_size: int = 0,
        max_num_tokens: int = 0,
    ) -> Any:
        """``sink_size`` S > 0: ``sink_window_metadata`` into buffers of
        ``max(max_num_tokens, max_num_seqs, rows of this call)`` rows; else
        ``window_attention_metadata`` (no sinks; ``max_num_tokens`` unused)."""
        self.stats.windowed_calls[layer_name] = self.stats.windowed_calls.get(layer_name, 0) + 1
        step = forward_context.additional_kwargs.setdefault(_STEP_CACHE_KEY, {})
        hit = step.get(id(metadata))
        if hit is not None and hit[0] is metadata:
            return hit[1]
        if sink_size:
            spec = WindowSpec(window_size, future_offset, kernel_block_size(kv_cache), sink_size)
            buffers = self._sink_buffers_for(
                layer_name, metadata, spec, max_num_seqs, max_num_tokens
            )
            result = sink_window_metadata(metadata, buffers, spec, layer, query_dtype)
            if result.dspark_expanded:
                self.stats.metadata_expanded += 1
            else:
                self.stats.metadata_sinks_noncausal += 1
        else:
            spec = WindowSpec(window_size, future_offset, kernel_block_size(kv_cache))
            buffers = self._buffers_for(layer_name, metadata, spec, max_num_seqs)
            result = window_attention_metadata(metadata, buffers, spec, layer, query_dtype)
        result.dspark_window = spec
        self.stats.metadata_windowed += 1
        step[id(metadata)] = (metadata, result)
        return result

    def _buffers_for(
        self, layer_name: str, metadata: Any, spec: WindowSpec, max_num_seqs: int
    ) -> WindowBuffers:
        key = (layer_name, spec)
        buffers = self._buffers.get(key)
        if buffers is None:
            num_reqs, width = metadata.block_table.shape
            capacity = max(num_reqs, max_num_seqs, 1)
            logger.info(
                "dspark draft window: buffers for %s: %d requests x %d blocks",
                layer_name,
                capacity,
                width,
            )
            buffers = WindowBuffers(
                capacity,
                width,
                metadata.seq_lens.device,
                metadata.seq_lens.dtype,
                metadata.block_table.dtype,
            )
            self._buffers[key] = buffers
        return buffers

    def _sink_buffers_for(
        self,
        layer_name: str,
        metadata: Any,
        spec: WindowSpec,
        max_num_seqs: int,
        max_num_tokens: int,
    ) -> SinkWindowBuffers:
        key = (layer_name, spec)
        buffers = self._buffers.get(key)
        if buffers is None:
            rows = max(
                int(metadata.num_actual_tokens),
                metadata.block_table.shape[0],
                max_num_tokens,
                max_num_seqs,
                1,
            )
            cols = max_window_blocks(spec.window_size, spec.block_size, sink_size=spec.sink_size)
            logger.info(
                "dspark draft window + sinks: buffers for %s: %d rows x %d blocks",
                layer_name,
                rows,
                cols,
            )
            buffers = SinkWindowBuffers(
                rows,
                cols,
                metadata.seq_lens.device,
                metadata.seq_lens.dtype,
                metadata.block_table.dtype,
                metadata.query_start_loc.dtype,
            )
            self._buffers[key] = buffers
        return buffers
