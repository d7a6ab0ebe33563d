"""The vLLM attention backends the draft window supports, and their native window.

Which backend a metadata object belongs to, the KV cache's block size, the
``impl.sliding_window`` value that gives a layer the backend's own token-exact window
(mechanism 1 of ``metadata``), the metadata fields the window cannot shift, and CPU
attention's scheduler metadata. vLLM itself is reached through ``seam`` only.
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import torch

from dspark_compile.config import WindowSpec
from dspark_compile.integrations.vllm import seam

SUPPORTED_BACKENDS = ("FLASH_ATTN", "TRITON_ATTN", "CPU_ATTN")
# (field, backend feature) pairs the window cannot shift: absolute positions
# or per-rank context lengths.
_UNSUPPORTED_FIELDS = (
    ("dcp_context_kv_lens", "decode context parallel"),
    ("mm_prefix_query_range_tensor", "multimodal prefix ranges"),
    ("mm_prefix_range_tensor", "multimodal prefix ranges"),
    ("rswa_prefix_lens", "R-SWA"),
)


def supported_metadata_types() -> tuple[type, ...]:
    return tuple(seam.metadata_classes().values())


def metadata_backend(metadata: Any) -> str:
    """The backend name of a metadata object; ``TypeError`` for any other backend."""
    name = _backend_of_type(type(metadata))
    if name is None:
        raise TypeError(
            f"attention metadata of type {type(metadata).__name__} cannot be windowed: "
            f"the draft window supports the {', '.join(SUPPORTED_BACKENDS)} backends"
        )
    return name


@functools.cache
def _backend_of_type(cls: type) -> str | None:
    """Per metadata class, once per process: read on every windowed draft call."""
    for name, backend_cls in seam.metadata_classes().items():
        if issubclass(cls, backend_cls):
            return name
    return None


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


def is_causal(metadata: Any) -> bool:
    """True for plain causal metadata (a per-step causal tensor counts as non-causal)."""
    causal = getattr(metadata, "causal", True)
    return causal is True


def check_supported(metadata: Any) -> None:
    """``NotImplementedError`` when a field the window cannot shift is set."""
    for field, feature in _UNSUPPORTED_FIELDS:
        if getattr(metadata, field, None) is not None:
            raise NotImplementedError(
                f"{type(metadata).__name__}.{field} is set ({feature}): the draft window "
                f"does not support {feature}"
            )


def shallow_copy(metadata: Any) -> Any:
    """A new metadata object of the same class sharing every field's value: what
    ``copy.copy`` gives for vLLM's plain dataclass metadata, without its
    ``__reduce_ex__`` round trip (this runs on every windowed draft forward). Classes
    with ``__slots__``, ``__copy__`` or their own ``__getstate__`` go to ``copy.copy``."""
    cls = type(metadata)
    plain = (
        hasattr(metadata, "__dict__")
        and "__slots__" not in cls.__dict__
        and not hasattr(cls, "__copy__")
        and getattr(cls, "__getstate__", None) is getattr(object, "__getstate__", None)
    )
    if not plain:
        return copy.copy(metadata)
    out = cls.__new__(cls)
    out.__dict__.update(metadata.__dict__)
    return out


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


def reads_metadata_window(metadata: Any) -> bool:
    """Whether the backend's forward takes the sliding window from this metadata object
    instead of from the layer (``seam.has_metadata_window``: vLLM 0.26's FlashAttention,
    whose metadata carries the KV-cache group's window). The draft window then goes into
    the windowed metadata copy (``token_window.window_attention_metadata``) and the layer
    is left as it is, so vLLM's ahead-of-time FlashAttention plan, which it makes only
    while every layer's ``impl.sliding_window`` is the same, stays on for the target."""
    return _backend_of_type(type(metadata)) == "FLASH_ATTN" and seam.has_metadata_window(metadata)


def applied_window(layer: Any, metadata: Any) -> Any:
    """The sliding window the layer's forward applies with ``metadata``: the metadata's
    where the forward reads it (``reads_metadata_window``) and it is set, else the
    layer's ``impl.sliding_window``."""
    if reads_metadata_window(metadata) and metadata.sliding_window is not None:
        return metadata.sliding_window
    return seam.native_sliding_window(layer)


def apply_native_window(layer: Any, metadata: Any, tokens: int) -> None:
    """Make the layer's forward with ``metadata`` apply the native window of ``tokens``:
    ``set_native_window`` where the forward reads the layer's window; where it reads the
    metadata's (``reads_metadata_window``), only refuse a layer window of its own (the
    windowed metadata copy carries the draft window)."""
    backend = metadata_backend(metadata)
    if reads_metadata_window(metadata):
        want = native_window_value(backend, tokens)
        _refuse_own_window(layer, seam.native_sliding_window(layer), want)
        return
    set_native_window(layer, backend, tokens, is_causal(metadata))


def _refuse_own_window(layer: Any, have: Any, want: Any) -> None:
    if not _window_disabled(have):
        raise NotImplementedError(
            f"draft layer {getattr(layer, 'layer_name', '?')} already has its own sliding "
            f"window {have!r}; combining it with the draft window ({want!r}) is not supported"
        )


def set_native_window(layer: Any, backend: str, tokens: int, causal: bool = True) -> None:
    """Give ``layer.impl`` the backend's sliding window of ``tokens`` (idempotent).

    Only for causal attention: a non-causal draft block (DFlash) is windowed
    by its metadata alone (every query of the block reads the same keys), and
    a layer that has the native window must never run non-causal (raises).
    Raises ``NotImplementedError`` when the layer already has a different
    sliding window of its own (a draft with trained sliding-window layers).
    """
    want = native_window_value(backend, tokens)
    have = seam.native_sliding_window(layer)
    if have == want:
        if not causal:
            raise RuntimeError(
                f"draft layer {getattr(layer, 'layer_name', '?')} has the native causal draft "
                "window but now runs non-causal attention; the window cannot serve both"
            )
        return
    if not causal:
        return
    _refuse_own_window(layer, have, want)
    seam.set_native_sliding_window(layer, want)


def check_no_native_window(layer: Any, backend: str) -> None:
    """With sinks the layer must run WITHOUT a native sliding window (it would hide the
    sinks): raises ``NotImplementedError`` when it has one (its own, or the draft
    window's from a run without sinks)."""
    have = seam.native_sliding_window(layer)
    if not _window_disabled(have):
        raise NotImplementedError(
            f"draft layer {getattr(layer, 'layer_name', '?')} ({backend}) has a sliding window "
            f"{have!r}: attention sinks need the layer without one (a native window hides "
            "the sinks); drafts with sliding-window layers cannot use draft_sink_size"
        )


def cpu_scheduler_metadata(
    metadata: Any,
    layer: Any,
    spec: WindowSpec,
    query_dtype: torch.dtype | None,
    sliding_window: int | None = None,
) -> torch.Tensor:
    """CPU attention's work plan for the windowed lengths and the native window
    (``sliding_window``: that of the layer's kernel; default ``W - K``)."""
    if layer is None or query_dtype is None:
        raise ValueError(
            "CPU attention metadata needs the draft layer and the query dtype "
            "to recompute its scheduler metadata"
        )
    return seam.cpu_scheduler_metadata(
        metadata, layer, query_dtype, spec.tokens if sliding_window is None else sliding_window
    )
