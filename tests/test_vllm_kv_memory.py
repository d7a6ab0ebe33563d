"""The draft layers' vLLM KV-cache spec under the window (integrations/vllm/kv_memory.py):
which layers become SlidingWindowSpec(W - K), the draft's group first, and every
case where the memory cannot be bounded warns (no engine; needs vllm importable)."""

import logging
from types import SimpleNamespace

import pytest

vllm = pytest.importorskip("vllm")
torch = pytest.importorskip("torch")

from vllm.v1.kv_cache_interface import FullAttentionSpec, SlidingWindowSpec  # noqa: E402

from dspark_compile.integrations.vllm import kv_memory  # noqa: E402

TARGET = ["model.layers.0.self_attn.attn", "model.layers.1.self_attn.attn"]
DRAFT = ["draft_model.model.layers.0.self_attn.attn", "draft_model.model.layers.1.self_attn.attn"]


def full(block=32):
    return FullAttentionSpec(block_size=block, num_kv_heads=2, head_size=32, dtype=torch.float32)


def specs():
    return {name: full() for name in TARGET + DRAFT}


def config(
    window=256,
    method="draft_model",
    k=3,
    sinks=None,
    extra=None,
    disable_hybrid=False,
    dcp=1,
    max_len=4096,
    step_tokens=128,
):
    additional = {"draft_window_size": window} if window is not None else {}
    if sinks is not None:
        additional["draft_sink_size"] = sinks
    additional.update(extra or {})
    return SimpleNamespace(
        additional_config=additional,
        speculative_config=SimpleNamespace(method=method, num_speculative_tokens=k),
        scheduler_config=SimpleNamespace(
            disable_hybrid_kv_cache_manager=disable_hybrid, max_num_batched_tokens=step_tokens
        ),
        model_config=SimpleNamespace(max_model_len=max_len),
        parallel_config=SimpleNamespace(decode_context_parallel_size=dcp),
    )


def test_draft_layers_become_sliding_window_first():
    out = kv_memory.bound_draft_kv_specs(config(), specs(), set(DRAFT))
    assert list(out) == DRAFT + TARGET  # the draft's group becomes group 0
    for name in DRAFT:
        assert type(out[name]) is SlidingWindowSpec
        assert out[name].sliding_window == 256 - 3
        assert out[name].block_size == 32 and out[name].page_size_bytes == full().page_size_bytes
    for name in TARGET:
        assert type(out[name]) is FullAttentionSpec
    assert kv_memory.LAST_DECISION == {
        "bounded": True,
        "sliding_window": 253,
        "layers": sorted(DRAFT),
    }


def test_groups_put_the_draft_first():
    """vLLM's own grouping of the result: group 0 is the draft's sliding-window group,
    one page size for all (the layout vLLM's allocator shares tensors across)."""
    try:  # vLLM 0.33
        from vllm.v1.core.kv_cache_planning import _get_kv_cache_groups_uniform_page_size
    except ImportError:  # vLLM 0.26 - 0.32
        from vllm.v1.core.kv_cache_utils import _get_kv_cache_groups_uniform_page_size

    out = kv_memory.bound_draft_kv_specs(config(), specs(), set(DRAFT))
    groups = _get_kv_cache_groups_uniform_page_size(out)
    assert [sorted(g.layer_names) for g in groups] == [sorted(DRAFT), sorted(TARGET)]
    assert isinstance(groups[0].kv_cache_spec, SlidingWindowSpec)


@pytest.mark.parametrize(
    "method,k,expected", [("eagle3", 3, 61), ("eagle", 2, 62), ("draft_model", 5, 59)]
)
def test_window_length_per_method(method, k, expected):
    out = kv_memory.bound_draft_kv_specs(config(64, method, k), specs(), set(DRAFT))
    assert out[DRAFT[0]].sliding_window == expected


def test_no_window_changes_nothing():
    before = specs()
    assert kv_memory.bound_draft_kv_specs(config(None), before, set(DRAFT)) is before


@pytest.mark.parametrize(
    "kwargs,layers,reason",
    [
        (dict(sinks=40), set(DRAFT), "attention sinks"),
        (dict(disable_hybrid=True), set(DRAFT), "hybrid KV-cache manager is disabled"),
        (dict(dcp=2), set(DRAFT), "decode context parallel"),
        (dict(method="dflash"), set(DRAFT), "method 'dflash'"),
        (dict(), None, "attention layers are unknown"),
        (dict(), {"no.such.layer"}, "without a plain FullAttentionSpec"),
    ],
)
def test_unbounded_cases_warn(kwargs, layers, reason, caplog):
    before = specs()
    with caplog.at_level(logging.WARNING, logger=kv_memory.__name__):
        out = kv_memory.bound_draft_kv_specs(config(**kwargs), before, layers)
    assert out is before
    assert "NOT bounded" in caplog.text and reason in caplog.text
    assert kv_memory.LAST_DECISION["bounded"] is False


def test_draft_with_own_sliding_window_warns(caplog):
    before = specs()
    before[DRAFT[0]] = SlidingWindowSpec(
        block_size=32, num_kv_heads=2, head_size=32, dtype=torch.float32, sliding_window=61
    )
    with caplog.at_level(logging.WARNING, logger=kv_memory.__name__):
        assert kv_memory.bound_draft_kv_specs(config(), before, set(DRAFT)) is before
    assert "SlidingWindowSpec" in caplog.text


@pytest.mark.parametrize(
    "window,max_len,step,bounded",
    [
        (2048, 1024, 128, False),  # the window covers max_model_len
        (256, 4096, 4096, False),  # vLLM's in-flight reserve alone is max_model_len
        (256, 4096, 3500, True),  # 253 - 1 + 3500 tokens: 118 + 1 blocks < 128
        (256, 4096, 3800, False),  # 253 - 1 + 3800 tokens: 127 + 1 blocks >= 128
    ],
)
def test_bounded_only_when_it_saves(window, max_len, step, bounded):
    out = kv_memory.bound_draft_kv_specs(
        config(window, max_len=max_len, step_tokens=step), specs(), set(DRAFT)
    )
    assert kv_memory.LAST_DECISION["bounded"] is bounded
    assert (type(out[DRAFT[0]]) is SlidingWindowSpec) is bounded


def test_opt_out():
    before = specs()
    out = kv_memory.bound_draft_kv_specs(
        config(extra={"draft_window_kv_memory": False}), before, set(DRAFT)
    )
    assert out is before and kv_memory.LAST_DECISION["bounded"] is False


def test_untested_version_warns(monkeypatch, caplog):
    import vllm

    monkeypatch.setattr(vllm, "__version__", "0.1.0")
    before = specs()
    with caplog.at_level(logging.WARNING, logger=kv_memory.__name__):
        assert kv_memory.bound_draft_kv_specs(config(), before, set(DRAFT)) is before
    assert "untested" in caplog.text


def _v1_runner():
    """vLLM's V1 ``GPUModelRunner``, or None (vLLM 0.34 removed it: V2 only)."""
    try:
        from vllm.v1.worker.gpu_model_runner import GPUModelRunner
    except ImportError:
        return None
    return GPUModelRunner


def test_install_wraps_the_runner_once():
    GPUModelRunner = _v1_runner()
    if GPUModelRunner is None:
        pytest.skip(f"vLLM {vllm.__version__} has no V1 GPUModelRunner (removed in 0.34)")

    assert kv_memory.install()
    wrapped = GPUModelRunner.get_kv_cache_spec
    assert kv_memory.install()
    assert GPUModelRunner.get_kv_cache_spec is wrapped
    runner = SimpleNamespace(
        vllm_config=config(), drafter=SimpleNamespace(_draft_attn_layer_names=set(DRAFT))
    )
    original = wrapped.__wrapped__
    try:
        wrapped.__wrapped__ = None  # not used by the wrapper; keep the closure's original
        assert kv_memory.draft_layer_names(runner) == set(DRAFT)
    finally:
        wrapped.__wrapped__ = original


def test_v2_runner_keeps_vllms_layer_order():
    """The V2 runner reads each draft layer's own group: no reordering there."""
    out = kv_memory.bound_draft_kv_specs(config(), specs(), set(DRAFT), draft_first=False)
    assert list(out) == TARGET + DRAFT
    assert all(type(out[n]) is SlidingWindowSpec and out[n].sliding_window == 253 for n in DRAFT)
    assert all(type(out[n]) is FullAttentionSpec for n in TARGET)


def test_install_wraps_the_v2_runner_too():
    from vllm.v1.worker.gpu.model_runner import GPUModelRunner as V2ModelRunner

    assert kv_memory.install()
    assert kv_memory.install()  # idempotent
    for runner_class in [c for c in (_v1_runner(), V2ModelRunner) if c is not None]:
        wrapped = runner_class.get_kv_cache_spec
        assert getattr(wrapped, kv_memory._MARK)
        assert not getattr(wrapped.__wrapped__, kv_memory._MARK, False)  # wrapped once
    runner = SimpleNamespace(speculator=SimpleNamespace(draft_attn_layer_names=set(DRAFT)))
    assert kv_memory.draft_layer_names(runner) == set(DRAFT)
    assert kv_memory.draft_layer_names(SimpleNamespace()) is None


def test_wrapped_v2_spec_is_bounded_in_vllm_order():
    class FakeRunner:
        def __init__(self):
            self.vllm_config = config()
            self.speculator = SimpleNamespace(draft_attn_layer_names=set(DRAFT))

        def get_kv_cache_spec(self):
            return specs()

    kv_memory._wrap(FakeRunner, draft_first=False)
    out = FakeRunner().get_kv_cache_spec()
    assert list(out) == TARGET + DRAFT
    assert type(out[DRAFT[0]]) is SlidingWindowSpec


def test_pass_warns_when_the_spec_hook_never_ran(caplog):
    from dspark_compile import validation
    from dspark_compile.config import DraftWindowConfig
    from dspark_compile.integrations.vllm import inductor_pass

    config = DraftWindowConfig(draft_window_size=64, method="draft_model", num_speculative_tokens=3)
    saved = dict(kv_memory.LAST_DECISION)
    kv_memory.LAST_DECISION.clear()
    validation._WARNED.discard((inductor_pass.logger.name, "kv_spec_hook_missed"))
    try:
        with caplog.at_level(logging.WARNING, logger=inductor_pass.logger.name):
            inductor_pass._warn_if_kv_spec_hook_missed(config)
        assert "NOT bounded" in caplog.text and "did not run" in caplog.text
        assert "V1 and V2" in caplog.text
        caplog.clear()
        kv_memory.LAST_DECISION.update(bounded=True)
        validation._WARNED.discard((inductor_pass.logger.name, "kv_spec_hook_missed"))
        with caplog.at_level(logging.WARNING, logger=inductor_pass.logger.name):
            inductor_pass._warn_if_kv_spec_hook_missed(config)
        assert "NOT bounded" not in caplog.text
    finally:
        kv_memory.LAST_DECISION.clear()
        kv_memory.LAST_DECISION.update(saved)
