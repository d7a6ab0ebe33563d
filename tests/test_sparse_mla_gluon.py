"""The Gluon (Hopper) sparse MLA kernel: against the torch reference on a Hopper GPU
(skipped elsewhere), and its dispatch (mode switch, fallback) everywhere."""

import pytest
import torch

from dspark_compile.kernels import sparse_mla as ref, sparse_mla_gluon as glu
from dspark_compile.kernels.sparse_mla_grouped_triton import grouped_sparse_mla_attention_triton

HOPPER = (
    torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9 and glu.gluon_enabled()
)
hopper_only = pytest.mark.skipif(not HOPPER, reason="the Gluon kernel needs a Hopper (sm_90) GPU")

SCALE = 576**-0.5


def _inputs(num_tokens, heads, width, num_blocks, holes, shared, runs, seed):
    """Random bf16 query / cache (never zeros); each run of ``shared`` tokens gets one
    index row (consecutive slots when ``runs``, else a random permutation) with a
    ``holes`` share of ``-1``; every unlisted cache row is NaN."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    query = torch.randn(num_tokens, heads, 576, device="cuda", dtype=torch.bfloat16, generator=gen)
    kv_cache = torch.randn(num_blocks, 64, 576, device="cuda", dtype=torch.bfloat16, generator=gen)
    slots = num_blocks * 64
    rows = []
    for t0 in range(0, num_tokens, shared):
        if runs:
            start = int(torch.randint(0, max(1, slots - width), (1,), generator=gen, device="cuda"))
            row = torch.arange(start, start + width, device="cuda") % slots
        else:
            row = torch.randperm(slots, generator=gen, device="cuda")[:width]
        row = torch.where(torch.rand(width, generator=gen, device="cuda") < holes, -1, row)
        rows += [row.to(torch.int32)] * min(shared, num_tokens - t0)
    indices = torch.stack(rows) if rows else torch.empty(0, width, dtype=torch.int32, device="cuda")
    listed = torch.zeros(slots, dtype=torch.bool, device="cuda")
    listed[indices[indices >= 0].long()] = True
    kv_cache.view(-1, 576)[~listed] = float("nan")
    return query, kv_cache, indices


@hopper_only
@pytest.mark.parametrize(
    "num_tokens,heads,width,num_blocks,holes,shared,runs",
    [
        (8, 16, 2056, 64, 0.05, 8, True),  # DSpark shape: runs of consecutive slots
        (5, 16, 100, 8, 0.2, 4, True),  # T not a multiple of the group, width of 64
        (12, 32, 37, 4, 0.3, 4, False),  # two head blocks, scattered slots
        (6, 16, 130, 8, 0.0, 2, True),  # groups with different rows (per-token pass)
        (9, 16, 300, 16, 0.5, 3, False),  # mixed groups, many holes
        (7, 16, 150, 8, 0.1, 2, True),  # a last group of 3 tokens with different rows
        (1, 16, 1, 2, 0.0, 1, True),  # width 1
    ],
)
def test_gluon_matches_reference(num_tokens, heads, width, num_blocks, holes, shared, runs):
    query, kv_cache, indices = _inputs(
        num_tokens, heads, width, num_blocks, holes, shared, runs, seed=num_tokens * 131 + width
    )
    want = ref.sparse_mla_attention_ref(query, kv_cache, indices, SCALE, 512)
    got = glu.gluon_sparse_mla_attention(query, kv_cache, indices, SCALE, 512)
    assert not glu._failed, "the Gluon kernel failed and the Triton fallback ran"
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got.float(), want.float(), rtol=3e-2, atol=3e-2)


@hopper_only
def test_gluon_all_holes_and_empty():
    query, kv_cache, indices = _inputs(4, 16, 64, 4, 1.0, 4, True, seed=1)
    got = glu.gluon_sparse_mla_attention(query, kv_cache, indices, SCALE, 512)
    assert torch.equal(got, torch.zeros_like(got))
    empty = glu.gluon_sparse_mla_attention(query[:0], kv_cache, indices[:0], SCALE, 512)
    assert empty.shape == (0, 16, 512)


@hopper_only
def test_gluon_falls_back_for_other_shapes():
    query, kv_cache, indices = _inputs(4, 16, 64, 4, 0.1, 4, True, seed=2)
    query8 = query[:, :8].contiguous()  # 8 heads: not a multiple of 16
    assert not glu.gluon_supported(query8, kv_cache, 512)
    want = ref.sparse_mla_attention_ref(query8, kv_cache, indices, SCALE, 512)
    got = glu.gluon_sparse_mla_attention(query8, kv_cache, indices, SCALE, 512)
    torch.testing.assert_close(got.float(), want.float(), rtol=3e-2, atol=3e-2)


@hopper_only
@pytest.mark.parametrize("num_tokens,shared", [(9, 4), (9, 3), (11, 2)])
@pytest.mark.parametrize(
    "variant",
    [
        dict(fold_mixed=True),
        dict(fold_mixed=False),
        dict(block_n=32, stages=4),
        dict(block_n=32, stages=3, fold_mixed=False),
    ],
)
def test_gluon_launch_variants(variant, num_tokens, shared):
    """Mixed groups (all but the last when ``shared`` < 4; with 11 tokens the last group
    of 3 is mixed too) are attended token by token in the kernel (``fold_mixed``) or by
    the per-token Triton kernel; both agree with the reference, at every ring shape."""
    query, kv_cache, indices = _inputs(num_tokens, 16, 1000, 32, 0.1, shared, True, seed=3 + shared)
    want = ref.sparse_mla_attention_ref(query, kv_cache, indices, SCALE, 512)
    got = glu._launch(query, kv_cache, indices, SCALE, **variant)
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got.float(), want.float(), rtol=3e-2, atol=3e-2)


@hopper_only
@pytest.mark.parametrize("variant", [dict(), dict(fold_mixed=False), dict(block_n=32, stages=4)])
def test_gluon_trailing_padding_changes_nothing(variant):
    """Index rows end in ``-1`` padding up to ``width`` (as the index ops write them).
    Padding five more tiles wide changes no bit of the output: the all-hole tiles add
    exact zeros and rescale by exactly 1. Group 0 is uniform and its rows end mid-tile;
    in mixed group 1 a later token's row runs 130 columns past the lead token's."""
    query, kv_cache, indices = _inputs(8, 16, 200, 16, 0.1, 4, True, seed=5)
    padded = torch.full((8, 200 + 5 * 64 + 17), -1, dtype=torch.int32, device="cuda")
    padded[:, :200] = indices
    padded[0:4, 130:] = -1  # group 0: live end 130, mid-tile
    padded[4, 70:] = -1  # group 1: lead ends at 70 ...
    padded[5] = padded[7] = padded[4]  # ... token 6 keeps its 200 columns
    want = ref.sparse_mla_attention_ref(query, kv_cache, padded, SCALE, 512)
    got = glu._launch(query, kv_cache, padded, SCALE, **variant)
    cut = glu._launch(query, kv_cache, padded[:, :200].contiguous(), SCALE, **variant)
    assert not torch.isnan(got).any()
    torch.testing.assert_close(got.float(), want.float(), rtol=3e-2, atol=3e-2)
    assert torch.equal(got, cut)


@hopper_only
def test_gluon_flag_launch_finishes_uniform_groups_without_the_per_token_pass():
    """With the flag launch and no per-token pass, the kernel alone writes the final
    rows of a uniform group that sits between mixed ones (the per-token pass adds
    nothing there)."""
    query, kv_cache, indices = _inputs(12, 16, 200, 8, 0.1, 2, True, seed=7)
    indices[4:8] = indices[4]  # group 1 uniform, groups 0 and 2 mixed
    want = ref.sparse_mla_attention_ref(query, kv_cache, indices, SCALE, 512)
    got = glu._launch(query, kv_cache, indices, SCALE, fold_mixed=False, mixed_pass=False)
    torch.testing.assert_close(got[4:8].float(), want[4:8].float(), rtol=3e-2, atol=3e-2)


def test_gluon_mode_switch(monkeypatch):
    monkeypatch.delenv("DSPARK_MLA_GLUON", raising=False)
    assert glu.gluon_mode() == "auto"
    monkeypatch.setenv("DSPARK_MLA_GLUON", "yes")
    with pytest.raises(
        ValueError, match="DSPARK_MLA_GLUON='yes' is invalid: expected 'auto', '1' or '0'"
    ):
        glu.gluon_mode()


def test_gluon_runs_only_on_verified_triton_unless_forced(monkeypatch):
    """``auto`` refuses an unverified triton, ``1`` accepts any (where Gluon imports),
    ``0`` none; on a CPU tensor nothing is supported."""
    query, kv_cache = torch.randn(4, 16, 576), torch.randn(2, 64, 576)
    monkeypatch.setattr(glu, "HAVE_GLUON", True)
    for version, mode, enabled in (
        ("9.9.0", "auto", False),
        ("9.9.0", "1", True),
        ("3.6.0", "auto", True),
        ("3.8.0", "auto", True),
        ("3.6.0", "0", False),
    ):
        monkeypatch.setattr(glu.triton, "__version__", version)
        monkeypatch.setenv("DSPARK_MLA_GLUON", mode)
        assert glu.gluon_enabled() == enabled, (version, mode)
        assert not glu.gluon_supported(query, kv_cache, 512)  # CPU


@pytest.mark.skipif(torch.cuda.is_available(), reason="CPU dispatch (Triton interpreter)")
def test_gluon_entry_point_falls_back_to_the_grouped_kernel_on_cpu():
    gen = torch.Generator().manual_seed(4)
    query = torch.randn(6, 16, 576, generator=gen)
    kv_cache = torch.randn(4, 64, 576, generator=gen)
    indices = torch.randperm(256, generator=gen)[:40].to(torch.int32).repeat(6, 1)
    indices[:, 3] = -1
    got = glu.gluon_sparse_mla_attention(query, kv_cache, indices, 0.05, 512)
    want = grouped_sparse_mla_attention_triton(query, kv_cache, indices, 0.05, 512)
    assert torch.equal(got, want)
    torch.testing.assert_close(
        got, ref.sparse_mla_attention_ref(query, kv_cache, indices, 0.05, 512), rtol=1e-4, atol=1e-4
    )


@hopper_only
def test_gluon_switched_off_gives_the_grouped_kernel_bit_for_bit(monkeypatch):
    query, kv_cache, indices = _inputs(8, 16, 300, 8, 0.1, 8, True, seed=5)
    monkeypatch.setenv("DSPARK_MLA_GLUON", "0")
    got = torch.ops.dspark.sparse_mla_attention(query, kv_cache, indices, SCALE, 512)
    want = grouped_sparse_mla_attention_triton(query, kv_cache, indices, SCALE, 512)
    assert torch.equal(got, want)


def test_gluon_kernel_compiles_for_hopper_without_a_gpu():
    """The installed triton compiles the kernel for sm_90 (no GPU needed; in a fresh
    process without TRITON_INTERPRET): within an H100/H200's shared memory and without
    register spills. This catches Gluon API changes in CI; whether the result is right
    needs the GPU tests above."""
    import json
    import os
    import subprocess
    import sys

    if not glu.HAVE_GLUON:
        pytest.skip("Gluon's Hopper API is not importable with this triton")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    code = (
        "import json; from dspark_compile.kernels.sparse_mla_gluon import "
        "compile_for_hopper; print(json.dumps(compile_for_hopper()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    stats = json.loads(done.stdout.strip().splitlines()[-1])
    assert 0 < stats["shared"] <= 232448
    assert stats["stack"] in (0, None), stats
