"""A user-registered attention op with host mirrors and scalar upper bounds."""

import pytest
import torch

import dspark_compile
from dspark_compile import AttentionOpSpec, register_attention_op, unregister_attention_op
from dspark_compile.kernels.paged_attention import paged_attention_ref
from dspark_compile.models import make_paged_batch, random_kv_cache
from dspark_compile.passes import PassManager

SEEN = []


@torch.library.custom_op("dspark_test::mirrored_attention", mutates_args=())
def mirrored_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
    seq_lens_cpu: torch.Tensor,
    query_start_loc: torch.Tensor,
    max_seq_len: int,
) -> torch.Tensor:
    """Records the KV-length inputs it was given, then attends (non-causal)."""
    SEEN.append((seq_lens.clone(), seq_lens_cpu.clone(), max_seq_len, block_table.clone()))
    return paged_attention_ref(
        query, key_cache, value_cache, block_table, seq_lens, query_start_loc, 1.0, False
    )


@mirrored_attention.register_fake
def _(
    query, key_cache, value_cache, block_table, seq_lens, seq_lens_cpu, query_start_loc, max_seq_len
):
    return torch.empty_like(query)


@pytest.fixture
def registered():
    spec = AttentionOpSpec(
        op=torch.ops.dspark_test.mirrored_attention.default,
        seq_lens="seq_lens",
        block_table="block_table",
        kv_cache="key_cache",
        host_seq_lens=("seq_lens_cpu",),
        upper_bounds=("max_seq_len",),
    )
    register_attention_op(spec)
    SEEN.clear()
    yield spec
    unregister_attention_op(spec.op)


def _two_layers(q, kc, vc, table, lens, lens_cpu, locs, max_len):
    a = torch.ops.dspark_test.mirrored_attention(q, kc, vc, table, lens, lens_cpu, locs, max_len)
    return torch.ops.dspark_test.mirrored_attention(a, kc, vc, table, lens, lens_cpu, locs, max_len)


@pytest.mark.parametrize("lowering", ["aot_eager", "inductor"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_mirrors_and_bounds_windowed_with_device_arithmetic(registered, lowering, dynamic):
    W, b, K = 20, 8, 3
    gen = torch.Generator().manual_seed(0)
    batch = make_paged_batch([70, 13, 41], [2, 2, 2], b, generator=gen)
    kc, vc = random_kv_cache(batch.num_blocks, b, 2, 8, generator=gen)
    q = torch.randn(batch.num_tokens, 2, 8, generator=gen)
    args = (
        q,
        kc,
        vc,
        batch.block_table,
        batch.seq_lens,
        batch.seq_lens.clone(),
        batch.query_start_loc,
        70,
    )
    dspark_compile.clear_pass_records()
    fn = torch.compile(
        _two_layers,
        backend="dspark",
        dynamic=dynamic,
        options={
            "draft_window_size": W,
            "method": "eagle3",
            "num_speculative_tokens": K,
            "lowering": lowering,
            **({"block_size": b} if dynamic else {}),
        },
    )
    got = fn(*args)

    want_lens, want_table = dspark_compile.window_seq_lens_and_block_table(
        batch.seq_lens, batch.block_table, W, b, K
    )
    assert len(SEEN) == 2
    for lens, lens_cpu, max_len, table in SEEN:
        assert torch.equal(lens, want_lens)
        assert torch.equal(lens_cpu, want_lens)
        assert max_len == min(70, W - K + b - 1) == 24
        assert torch.equal(table, want_table)
    SEEN.clear()
    eager = _two_layers(q, kc, vc, want_table, want_lens, want_lens, batch.query_start_loc, 24)
    torch.testing.assert_close(got, eager)
    [record] = [r for r in dspark_compile.pass_records() if r.pass_name == "draft_window"]
    assert record.stats["rewritten"] == 2
    assert record.stats["window_computations"] == 1
    assert record.stats["host_mirrors_windowed"] == 1
    assert record.stats["upper_bounds_windowed"] == 2


def test_symbolic_block_size_needs_the_option(registered):
    gen = torch.Generator().manual_seed(1)
    batch = make_paged_batch([30, 9], [1, 1], 4, generator=gen)
    kc, vc = random_kv_cache(batch.num_blocks, 4, 1, 8, generator=gen)
    args = (
        torch.randn(2, 1, 8, generator=gen),
        kc,
        vc,
        batch.block_table,
        batch.seq_lens,
        batch.seq_lens.clone(),
        batch.query_start_loc,
        30,
    )
    fn = torch.compile(
        _two_layers,
        backend="dspark",
        dynamic=True,
        options={"draft_window_size": 8, "lowering": "aot_eager"},
    )
    with pytest.raises(Exception, match="is not static .*set the block_size option"):
        fn(*args)
    torch._dynamo.reset()
    fn = torch.compile(
        _two_layers,
        backend="dspark",
        dynamic=False,
        options={"draft_window_size": 8, "lowering": "aot_eager", "block_size": 16},
    )
    with pytest.raises(Exception, match="block_size=16 does not match the KV cache"):
        fn(*args)


def test_spec_rejects_unknown_argument_names():
    with pytest.raises(ValueError, match=r"seq_lens='lengths' is not an argument of"):
        AttentionOpSpec(
            op=torch.ops.dspark.paged_attention.default,
            seq_lens="lengths",
            block_table="block_table",
        )
    with pytest.raises(ValueError, match="expected an OpOverload"):
        AttentionOpSpec(
            op=torch.ops.dspark.paged_attention, seq_lens="seq_lens", block_table="block_table"
        )


def test_uuid_covers_the_config():
    from dspark_compile.backend import build_passes

    def uuid(**options):
        config = dspark_compile.DraftWindowConfig(**options)
        return PassManager(build_passes(config, "inductor")).uuid()

    assert uuid(draft_window_size=64) == uuid(draft_window_size=64)
    assert (
        len(
            {
                uuid(draft_window_size=64),
                uuid(draft_window_size=128),
                uuid(draft_window_size=64, method="eagle3"),
                uuid(),
            }
        )
        == 4
    )
    # An unhashable chained user pass disables caching rather than sharing entries.
    manager = PassManager(
        build_passes(dspark_compile.DraftWindowConfig(), "inductor"), chained=lambda graph: None
    )
    assert manager.uuid() is None


def test_mode_is_honoured(monkeypatch):
    import torch._inductor.compile_fx as compile_fx_module

    seen = {}
    real = compile_fx_module.compile_fx

    def spy(gm, inputs, config_patches=None, **kwargs):
        seen.update(config_patches or {})
        return real(gm, inputs, config_patches=config_patches, **kwargs)

    monkeypatch.setattr(compile_fx_module, "compile_fx", spy)
    fn = torch.compile(
        lambda x: x + 1, backend="dspark", options={"mode": "max-autotune-no-cudagraphs"}
    )
    fn(torch.ones(2))
    assert seen.get("max_autotune") is True
    assert isinstance(seen["post_grad_custom_post_pass"], PassManager)
