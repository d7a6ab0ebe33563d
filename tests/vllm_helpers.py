"""Real vLLM configs and metadata objects for CPU tests (no GPU, no model download)."""

import dataclasses
from typing import Any

# PassConfig flags whose fusion passes vLLM only imports on CUDA/ROCm/XPU
# (vllm/compilation/passes/pass_manager.py): PostGradPassManager.configure
# raises NameError on CPU unless they are off.
CUDA_ONLY_PASS_FLAGS = (
    "fuse_norm_quant",
    "fuse_act_quant",
    "fuse_attn_quant",
    "fuse_allreduce_rms",
    "enable_qk_norm_rope_fusion",
    "fuse_rope_kvcache_cat_mla",
    "fuse_act_padding",
    "fuse_mla_dual_rms_norm",
    "fuse_rope_kvcache",
    "fuse_qk_norm_rope_kvcache",
)


def cpu_vllm_config(compilation: dict[str, Any] | None = None, **kwargs: Any):
    """``VllmConfig`` on the CPU device with the CUDA-only fusion flags off."""
    from vllm.config import CompilationConfig, DeviceConfig, PassConfig, VllmConfig

    compilation = dict(compilation or {})
    compilation.setdefault(
        "pass_config", PassConfig(**{flag: False for flag in CUDA_ONLY_PASS_FLAGS})
    )
    return VllmConfig(
        device_config=DeviceConfig(device="cpu"),
        compilation_config=CompilationConfig(**compilation),
        **kwargs,
    )


def cpu_pass_manager(config):
    """vLLM's ``PostGradPassManager`` configured from ``config``, runnable on CPU.

    Its last step, ``FixFunctionalizationPass``, looks up
    ``torch.ops._C.rotary_embedding`` unconditionally (it skips only on XPU),
    and ``vllm._C`` does not load on a machine without CUDA; that step is
    replaced by a no-op here, so Inductor decomposes ``auto_functionalized``
    itself. Every other step is vLLM's own.
    """
    from vllm.compilation.passes.inductor_pass import CallableInductorPass
    from vllm.compilation.passes.pass_manager import PostGradPassManager

    manager = PostGradPassManager()
    manager.configure(config)
    manager.fix_functionalization = CallableInductorPass(
        lambda graph: None, uuid="fix_functionalization skipped on CPU"
    )
    return manager


def complete_metadata(cls: type, **given: Any) -> Any:
    """``cls(**given)`` for a vLLM attention-metadata dataclass, with the required fields
    another vLLM version has and the test does not set filled with their no-op values
    (vLLM 0.26's cascade fields: ``use_cascade=False``, ``common_prefix_len=0``, the cascade
    tensors None). A field this vLLM lacks stays an error."""
    for field in dataclasses.fields(cls):
        required = (
            field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
        )
        if required and field.name not in given:
            name = field.name
            given[name] = False if name.startswith("use_") else 0 if name.endswith("_len") else None
    return cls(**given)


def has_field(cls: type, name: str) -> bool:
    return name in {field.name for field in dataclasses.fields(cls)}
