"""vLLM 0.34's V2 model runner (``vllm/v1/worker/gpu/``) with a ``draft_model`` draft:
the code paths of 0.34 that our hooks must cover, on CPU, without an engine.

In 0.34 the V2 runner's ``draft_model`` speculator (``StandaloneARSpeculator``, now an
``AutoRegressiveSpeculator``) captures CUDA graphs for its prefill and its decode steps
(0.33's captured none), and with backends that can refresh their decode metadata in
place (``update_draft_decode_metadata``: FLASH_ATTN, TRITON_ATTN) it runs its K - 1
decode steps fused on one metadata object that it updates between steps. These tests
run the real 0.34 functions on those paths: the draft's model tag, the V2 runner's
``get_kv_cache_spec`` under our hook, the V2 speculator's ``draft_attn_layer_names``
and the in-place metadata refresh under the window. A GPU run of the captured graphs
is not part of them (docs/vllm.md, "vLLM 0.34").
"""

import inspect
from types import SimpleNamespace

import pytest

vllm = pytest.importorskip("vllm", reason="vLLM is not installed (the [vllm] extra)")
torch = pytest.importorskip("torch")

from packaging.version import Version  # noqa: E402

_SERIES = Version(Version(vllm.__version__).base_version).release[:2]
pytestmark = pytest.mark.skipif(
    _SERIES != (0, 34),
    reason=f"needs vLLM 0.34.x (its V2 runner's draft_model code paths); this is vLLM "
    f"{vllm.__version__} (run scripts/test_vllm034.sh)",
)

if _SERIES == (0, 34):
    from vllm.forward_context import get_forward_context, set_forward_context
    from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadataBuilder
    from vllm.v1.attention.backends.triton_attn import TritonAttentionMetadataBuilder
    from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec
    from vllm.v1.worker.gpu import model_runner as v2_model_runner
    from vllm.v1.worker.gpu.spec_decode.speculator import DraftModelSpeculator

    from dspark_compile.integrations.vllm import StepWindows, kv_memory
    from dspark_compile.integrations.vllm.compile_context import DRAFT_MODEL_TAGS
    from tests.test_vllm_kv_memory import DRAFT, TARGET, config
    from tests.test_vllm_metadata import (
        BLOCK,
        expected_window,
        flash_metadata,
        triton_metadata,
    )
    from tests.vllm_helpers import cpu_vllm_config


def _standalone_ar():
    from vllm.utils.import_utils import resolve_obj_by_qualname
    from vllm.v1.worker.gpu.spec_decode.speculator_config import _CONFIG_BY_METHOD

    config_cls = resolve_obj_by_qualname(_CONFIG_BY_METHOD["draft_model"])
    return resolve_obj_by_qualname(config_cls.speculator_class)


def test_v2_draft_model_speculator_is_tagged_and_captures_graphs():
    """``method="draft_model"`` -> ``StandaloneARSpeculator``: a ``DraftModelSpeculator``
    (its ``draft_attn_layer_names`` feed our KV hook) that builds its model under the
    ``draft_model`` tag (the pass's draft test on 0.32) and, new in 0.34, has CUDA-graph
    managers for its prefill and decode."""
    from vllm.v1.worker.gpu.spec_decode.autoregressive.speculator import (
        AutoRegressiveSpeculator,
    )

    speculator = _standalone_ar()
    assert issubclass(speculator, DraftModelSpeculator)
    assert issubclass(speculator, AutoRegressiveSpeculator)
    assert 'set_model_tag("draft_model")' in inspect.getsource(speculator.load_draft_model)
    assert "draft_model" in DRAFT_MODEL_TAGS
    assert "prefill_cudagraph_manager" in inspect.getsource(speculator.init_cudagraph_manager)
    # DraftModelSpeculator.load_model sets the list our hook reads, and tags the layers
    # (Attention.is_draft_layer, which the pass reads first).
    load = inspect.getsource(DraftModelSpeculator.load_model)
    assert "self.draft_attn_layer_names =" in load and ".is_draft_layer = True" in load


def _v2_runner(draft_layers, vllm_config):
    """A V2 ``GPUModelRunner`` as its ``get_kv_cache_spec`` reads it: a real (unbuilt)
    draft-model speculator, DCP off."""
    speculator = object.__new__(_standalone_ar())
    speculator.draft_attn_layer_names = set(draft_layers)
    speculator.dcp_size = 1
    runner = object.__new__(v2_model_runner.GPUModelRunner)
    runner.__dict__.update(vllm_config=vllm_config, speculator=speculator, dcp_size=1)
    return runner


def _vllm_specs(vllm_config):
    """What 0.34's ``attn_utils.get_kv_cache_spec`` returns: full-attention specs, the
    draft's marked ``is_draft``."""
    return {
        name: FullAttentionSpec(
            block_size=32,
            num_kv_heads=2,
            head_size=32,
            dtype=torch.float32,
            is_draft=name in DRAFT,
        )
        for name in TARGET + DRAFT
    }


def test_v2_runner_get_kv_cache_spec_bounds_the_draft(monkeypatch):
    """The real 0.34 V2 ``GPUModelRunner.get_kv_cache_spec`` under ``kv_memory.install``:
    the draft's layers become ``SlidingWindowSpec(W - K)``, keep ``is_draft`` and vLLM's
    layer order (V2 builds each draft layer's metadata from its own group)."""
    assert kv_memory.install()
    method = v2_model_runner.GPUModelRunner.get_kv_cache_spec
    assert getattr(method, kv_memory._MARK, False)
    monkeypatch.setattr(v2_model_runner, "get_kv_cache_spec", _vllm_specs)
    out = _v2_runner(DRAFT, config(window=256, k=3)).get_kv_cache_spec()
    assert list(out) == TARGET + DRAFT
    for name in DRAFT:
        assert type(out[name]) is SlidingWindowSpec
        assert out[name].sliding_window == 256 - 3
        assert out[name].is_draft
        assert out[name].block_size == 32
    for name in TARGET:
        assert type(out[name]) is FullAttentionSpec and not out[name].is_draft
    assert kv_memory.LAST_DECISION["bounded"] is True


def test_v2_runner_without_window_keeps_vllms_specs(monkeypatch):
    kv_memory.install()
    monkeypatch.setattr(v2_model_runner, "get_kv_cache_spec", _vllm_specs)
    out = _v2_runner(DRAFT, config(window=None)).get_kv_cache_spec()
    assert all(type(spec) is FullAttentionSpec for spec in out.values())


@pytest.mark.parametrize("make", ["triton", "flash"])
def test_fused_draft_decode_steps_rewindow_the_updated_metadata(make):
    """0.34's fused multi-step draft decode (``AutoRegressiveSpeculator.
    _fused_multi_step_decode``): ONE metadata object, ``seq_lens`` advanced in place and
    the backend's real ``update_draft_decode_metadata`` called between steps, one
    forward context per step. Every step must be windowed from its own lengths (the
    windowed copy of step 1 must not be reused), in the same persistent buffers (the
    decode CUDA graph captures their pointers)."""
    builder = TritonAttentionMetadataBuilder if make == "triton" else FlashAttentionMetadataBuilder
    vllm_config = cpu_vllm_config()
    windows = StepWindows()
    cache = torch.empty(4, 2, BLOCK, 32)
    metadata = (triton_metadata if make == "triton" else flash_metadata)(
        [300, 41, 77], q_lens=[1, 1, 1]
    )
    stub = SimpleNamespace(dcp_world_size=1)  # the builder's state the update reads
    ptrs = set()
    for _step in range(1, 4):
        metadata.seq_lens += 1  # the speculator advances its input buffers in place
        builder.update_draft_decode_metadata(stub, metadata)
        with set_forward_context({}, vllm_config):
            out = windows.windowed(
                get_forward_context(), "draft.0", None, metadata, cache, 64, 0, 8, torch.float32
            )
        lens, table = expected_window(metadata, 64, 0)
        assert torch.equal(out.seq_lens, lens) and torch.equal(out.block_table, table)
        ptrs.add((out.seq_lens.data_ptr(), out.block_table.data_ptr()))
    assert len(ptrs) == 1
    assert windows.stats.metadata_windowed == 3
