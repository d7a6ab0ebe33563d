"""Windowed vLLM metadata WITHOUT sinks (mechanism 2 of ``metadata``: bandwidth).

Per request the KV before the block-aligned start of the token-exact window of its
FIRST query token is cut away (``arithmetic.window.first_query_window_start``); the
block table keeps ``first_query_window_columns`` columns and ``max_seq_len`` becomes
``min(max_seq_len, windowed_len_bound(W, b, K, max_query_len))``. The backend's native
window (``backends.apply_native_window``) decides what each token reads. Where the
backend's forward reads the window from the metadata (``backends.reads_metadata_window``:
vLLM 0.26's FlashAttention), a causal copy carries it: ``sliding_window = (W - K - 1, 0)``.

A causal FlashAttention copy whose forward applies the draft window runs it with ONE KV
split (``max_num_splits = 1``, vLLM's batch-invariant setting): the call reads at most
``W - K + b - 1`` keys per query, so more splits buy nothing but a combine launch, and
one split makes its output independent of any split schedule
(``benchmarks/fa_window_determinism.py`` times both). The ahead-of-time FlashAttention plan is
dropped whenever the copy's window or split count differs from the one it was planned
for (FA3 then plans from the call's own arguments).

A FlashAttention/Triton step that the window cannot cut (``max_seq_len < W - K + b``:
every request with a query has its window start at key 0) keeps its own lengths and
table (a shallow copy with ``dspark_window_cut = False``): no kernel launch, the same
attention (the native window still applies). Where
the metadata carries the window and the native window hides no key either
(``max_seq_len <= W - K``, ``arithmetic.window.native_window_cuts_nothing``), the copy
keeps vLLM's window, split count and plan too: the attention the target's own layers
run. Not while a CUDA graph is being captured, and not for CPU attention (its scheduler
metadata must be re-planned for the native window).
"""

from __future__ import annotations

from typing import Any

import torch

from dspark_compile.arithmetic.window import (
    batch_window_start,
    first_query_window_columns,
    first_query_window_table,
    native_window_cuts_nothing,
    window_cuts_nothing,
    windowed_len_bound,
)
from dspark_compile.config import WindowSpec
from dspark_compile.integrations.vllm.backends import (
    check_supported,
    cpu_scheduler_metadata,
    is_causal,
    metadata_backend,
    native_window_value,
    reads_metadata_window,
    shallow_copy,
)


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
        self._views: dict[tuple[int, int], tuple[torch.Tensor, torch.Tensor]] = {}

    def views(self, num_reqs: int, cols: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(seq_lens[:num_reqs], block_table[:num_reqs, :cols])``, made once per shape
        (the views share the buffers' storage)."""
        views = self._views.get((num_reqs, cols))
        if views is None:
            views = (self.seq_lens[:num_reqs], self.block_table[:num_reqs, :cols])
            self._views[(num_reqs, cols)] = views
        return views

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


def window_start(
    seq_lens: torch.Tensor, query_start_loc: torch.Tensor, spec: WindowSpec, causal: bool = True
) -> torch.Tensor:
    """Block-aligned window start per request (device, no sync).

    Causal: the window of the request's FIRST query token, so every token of
    the block keeps its own window. Non-causal (a DFlash-style block whose
    queries all read the same keys): the window of the last token,
    ``max(seq_len + K - W, 0)``. (``arithmetic.window.first_query_window_start``.)
    """
    return batch_window_start(seq_lens, query_start_loc, spec.tokens, spec.block_size, causal)


def window_columns(max_query_len: int, table_width: int, spec: WindowSpec) -> int:
    """Columns of the windowed block table: enough for any request of the step
    (``arithmetic.window.first_query_window_columns``)."""
    return first_query_window_columns(spec.tokens, spec.block_size, max_query_len, table_width)


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
    (module doc; ``arithmetic.window.first_query_window_table``, the reference of
    ``query_window_table_triton`` and ``_window_table_numpy``)."""
    first_query_window_table(
        seq_lens, query_start_loc, table, spec.tokens, spec.block_size, new_lens, new_table, causal
    )


def _window_table_numpy(
    seq_lens: torch.Tensor,
    query_start_loc: torch.Tensor,
    table: torch.Tensor,
    spec: WindowSpec,
    causal: bool,
    new_lens: torch.Tensor,
    new_table: torch.Tensor,
) -> None:
    """``_window_table_torch`` on CPU tensors through NumPy views of the same memory:
    the same values, a dozen NumPy calls on a few small arrays instead of as many torch
    ops (on the CPU engine this runs between the draft's layers on every draft forward)."""
    import numpy as np

    lens = seq_lens.numpy()
    num_reqs, width = table.shape
    if causal:
        qsl = query_start_loc.numpy()[: num_reqs + 1]
        first = lens - (qsl[1:] - qsl[:-1]).astype(lens.dtype)
    else:
        first = lens - 1
    block = spec.block_size
    start_block = np.maximum(first + 1 - spec.tokens, 0) // block
    windowed = lens - start_block * block
    new_lens.numpy()[:] = windowed
    out = new_table.numpy()
    cols = out.shape[1]
    offsets = np.arange(cols)
    src = start_block[:, None] + offsets
    valid = (offsets < (windowed[:, None] + block - 1) // block) & (src < width)
    np.minimum(src, width - 1, out=src)
    gathered = np.take_along_axis(table.numpy(), src, axis=1)
    np.multiply(gathered, valid, out=out, casting="unsafe")


def _cuts_nothing(metadata: Any, spec: WindowSpec) -> bool:
    """No request of the step reaches past its window's first block
    (``arithmetic.window.window_cuts_nothing`` on the host's ``max_seq_len``), and no
    CUDA graph is being captured (a captured step is replayed with other lengths)."""
    if not window_cuts_nothing(int(metadata.max_seq_len), spec.tokens, spec.block_size):
        return False
    return not (metadata.seq_lens.is_cuda and torch.cuda.is_current_stream_capturing())


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
    (``kernels.query_window_table.query_window_table_triton``) instead of ~10 torch ops
    (``_window_table_torch``, its reference): the same values, less host time per
    draft call where the draft runs outside CUDA graphs. CPU tables take NumPy views of
    the same memory (``_window_table_numpy``, the same values again).
    """
    backend = metadata_backend(metadata)
    check_supported(metadata)
    if backend != "CPU_ATTN" and _cuts_nothing(metadata, spec):
        out = shallow_copy(metadata)
        out.dspark_window_cut = False
        _flash_attention_window(out, spec, backend, cut=False)
        return out
    seq_lens, table = metadata.seq_lens, metadata.block_table
    buffers.check_fits(seq_lens, table)
    num_reqs, width = table.shape
    causal = is_causal(metadata)
    max_query_len = int(metadata.max_query_len) if causal else 1
    cols = window_columns(max_query_len, width, spec)
    new_lens, new_table = buffers.views(num_reqs, cols)
    if width and (table.is_cuda if use_triton is None else use_triton):
        from dspark_compile.kernels.query_window_table import query_window_table_triton

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
    elif width and table.device.type == "cpu" and not table.requires_grad:
        _window_table_numpy(
            seq_lens, metadata.query_start_loc, table, spec, causal, new_lens, new_table
        )
    else:
        _window_table_torch(
            seq_lens, metadata.query_start_loc, table, spec, causal, new_lens, new_table
        )
    out = shallow_copy(metadata)
    out.dspark_window_cut = True
    out.seq_lens = new_lens
    out.block_table = new_table
    bound = windowed_len_bound(spec.window_size, spec.block_size, spec.future_offset, max_query_len)
    out.max_seq_len = min(int(metadata.max_seq_len), bound)
    if backend == "FLASH_ATTN" and getattr(metadata, "scheduler_metadata", None) is not None:
        out.scheduler_metadata = None
    if backend == "CPU_ATTN":
        out.scheduler_metadata = cpu_scheduler_metadata(out, layer, spec, query_dtype)
    _flash_attention_window(out, spec, backend, cut=True)
    return out


def _flash_attention_window(out: Any, spec: WindowSpec, backend: str, cut: bool) -> None:
    """A causal FlashAttention copy (module doc): the native window where the forward
    reads it from the metadata, one KV split, and no ahead-of-time plan made for another
    window or split count. A kept step (``cut=False``) whose native window hides no key
    keeps vLLM's metadata as it is."""
    if backend != "FLASH_ATTN" or not is_causal(out):
        return
    changed = False
    if reads_metadata_window(out):
        if not cut and native_window_cuts_nothing(int(out.max_seq_len), spec.tokens):
            return
        want = native_window_value(backend, spec.tokens)
        if out.sliding_window != want:
            out.sliding_window = want
            changed = True
    if getattr(out, "max_num_splits", 1) != 1:
        out.max_num_splits = 1
        changed = True
    if changed:
        out.scheduler_metadata = None
