"""Sparse-MLA index ops and sparse MLA attention: references against brute force,
Triton kernels (interpreter on CPU, compiled on CUDA) against the references."""

import pytest
import torch

import dspark_compile  # noqa: F401  (registers torch.ops.dspark.*)
from dspark_compile.arithmetic.index_width import causal_width, noncausal_width
from dspark_compile.kernels import sparse_mla as ref, sparse_mla_triton as tri
from dspark_compile.models import make_paged_batch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

# (seq_lens, q_lens, block_size, window, width): empty request, seq_len < block,
# window larger than the sequence, W not a multiple of b, multi-block ranges.
INDEX_CASES = [
    ([9, 3, 0, 17], [3, 3, 0, 4], 4, 5, 128),
    ([40, 2, 23], [8, 2, 8], 5, 7, 128),
    ([300, 131, 6], [4, 1, 6], 5, 128, 256),
    ([12, 20], [4, 4], 4, 100, 128),
]


def brute_force_indices(batch, block_size, window, width, noncausal, num_tokens=None):
    """Per token, walk positions one by one through the block table."""
    num_tokens = batch.num_tokens if num_tokens is None else num_tokens
    rows = [[-1] * width for _ in range(num_tokens)]
    locs, table = batch.query_start_loc.tolist(), batch.block_table.tolist()
    slots = batch.slot_mapping.tolist()
    for r, seq in enumerate(batch.seq_lens.tolist()):
        q_len = locs[r + 1] - locs[r]
        ctx = seq - q_len
        for j in range(q_len):
            t = locs[r] + j
            if slots[t] < 0:
                continue
            if noncausal:
                visible = range(max(ctx - window, 0), ctx + q_len)
            else:
                pos = ctx + j
                visible = range(max(pos - window + 1, 0), pos + 1)
            for c, p in enumerate(visible):
                rows[t][c] = table[r][p // block_size] * block_size + p % block_size
    return torch.tensor(rows, dtype=torch.int32).reshape(num_tokens, width)


def _batch(seq_lens, q_lens, block_size, seed=0):
    gen = torch.Generator().manual_seed(seed)
    return make_paged_batch(seq_lens, q_lens, block_size, generator=gen)


def _index_args(batch, device=DEVICE):
    return (
        batch.seq_lens.to(device),
        batch.query_start_loc.to(device),
        batch.block_table.to(device),
        batch.slot_mapping.to(device),
    )


@pytest.mark.parametrize("noncausal", [False, True])
@pytest.mark.parametrize("seq_lens,q_lens,block_size,window,width", INDEX_CASES)
def test_index_reference_and_triton_match_brute_force(
    noncausal, seq_lens, q_lens, block_size, window, width
):
    batch = _batch(seq_lens, q_lens, block_size)
    batch.slot_mapping[1] = -1  # an invalid token: all -1 row
    want = brute_force_indices(batch, block_size, window, width, noncausal)
    ref_fn = ref.noncausal_swa_indices_ref if noncausal else ref.swa_indices_ref
    tri_fn = tri.noncausal_swa_indices_triton if noncausal else tri.swa_indices_triton
    op = torch.ops.dspark.noncausal_swa_indices if noncausal else torch.ops.dspark.swa_indices
    got_ref = ref_fn(*_index_args(batch, "cpu"), block_size, window, width)
    assert (got_ref == want).all()
    got_tri = tri_fn(*_index_args(batch), block_size, window, width)
    assert (got_tri.cpu() == want).all()
    got_op = op(*_index_args(batch), block_size, window, width)
    assert got_op.dtype == torch.int32 and (got_op.cpu() == want).all()
    assert (want[1] == -1).all()


def test_noncausal_rows_are_shared_by_the_block_and_include_future_tokens():
    batch = _batch([30, 11], [6, 3], 4)
    idx = ref.noncausal_swa_indices_ref(*_index_args(batch, "cpu"), 4, 8, 128)
    causal = ref.swa_indices_ref(*_index_args(batch, "cpu"), 4, 8, 128)
    assert (idx[:6] == idx[0]).all() and (idx[6:] == idx[6]).all()
    last_slot_of_block = int(batch.slot_mapping[5])
    assert last_slot_of_block in idx[0].tolist()  # the first query sees the last token
    assert last_slot_of_block not in causal[0].tolist()
    assert int((idx[0] >= 0).sum()) == 8 + 6  # W context tokens + the whole block


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_padding_tokens_get_all_minus_one_rows_never_stale(impl):
    batch = _batch([10, 7], [3, 2], 4)
    seq_lens, locs, table, slots = _index_args(batch)
    padded_slots = torch.cat([slots, torch.full((3,), 5, dtype=slots.dtype, device=slots.device)])
    fn = ref.noncausal_swa_indices_ref if impl == "reference" else tri.noncausal_swa_indices_triton
    got = fn(seq_lens, locs, table, padded_slots, 4, 6, 128)
    assert got.shape == (8, 128)
    assert (got[5:] == -1).all()  # past query_start_loc[-1]
    assert (got[:5] >= 0).any(dim=1).all()


@pytest.mark.parametrize("impl", ["reference", "op"])
@pytest.mark.parametrize("noncausal", [False, True])
def test_range_longer_than_width_raises(impl, noncausal):
    batch = _batch([200], [10], 4)
    fns = {
        "reference": (ref.swa_indices_ref, ref.noncausal_swa_indices_ref),
        "op": (torch.ops.dspark.swa_indices, torch.ops.dspark.noncausal_swa_indices),
    }
    # causal needs W=130 <= width; non-causal needs W + q_len = 128 + 10 > 128.
    window = 128 if noncausal else 130
    with pytest.raises(ValueError, match="longer than width=128"):
        fns[impl][noncausal](*_index_args(batch, "cpu"), 4, window, 128)


@pytest.mark.parametrize("noncausal", [False, True])
def test_triton_flags_a_range_longer_than_width(noncausal):
    """The kernel raises a device flag (no host sync); the wrapper turns it into an
    error (immediately on CPU, an async device assert on CUDA)."""
    batch = _batch([200, 50], [10, 3], 4)
    args = _index_args(batch)
    window = 128 if noncausal else 130
    _, overflow = tri.launch_index_kernel(*args, 4, window, 128, noncausal)
    assert int(overflow) == 1
    _, overflow = tri.launch_index_kernel(*args, 4, window, 256, noncausal)
    assert int(overflow) == 0
    if DEVICE == "cpu":  # on CUDA the device assert would end the process's CUDA context
        fn = tri.noncausal_swa_indices_triton if noncausal else tri.swa_indices_triton
        with pytest.raises(ValueError, match="longer than width=128"):
            fn(*args, 4, window, 128)


def test_index_args_are_validated():
    batch = _batch([10], [2], 4)
    seq_lens, locs, table, slots = _index_args(batch, "cpu")
    with pytest.raises(ValueError, match="window_size=0 is invalid"):
        ref.swa_indices_ref(seq_lens, locs, table, slots, 4, 0, 128)
    with pytest.raises(ValueError, match="block_table has shape .* torch.int64"):
        ref.swa_indices_ref(seq_lens, locs, table.long(), slots, 4, 8, 128)
    with pytest.raises(ValueError, match="query_start_loc has 3 entries"):
        ref.swa_indices_ref(
            seq_lens, torch.tensor([0, 1, 2], dtype=torch.int32), table, slots, 4, 8, 128
        )


def test_widths():
    assert noncausal_width(8, 4) == 128 and noncausal_width(128, 1) == 256
    assert noncausal_width(124, 4) == 128 and causal_width(129) == 256
    with pytest.raises(ValueError, match="max_query_len=-1"):
        noncausal_width(8, -1)


def sdpa_per_token(query, kv_cache, indices, scale, kv_lora_rank):
    """Per token: SDPA over exactly its listed slots (independent of the references)."""
    flat = kv_cache.reshape(-1, kv_cache.shape[-1]).double()
    out = torch.zeros(query.shape[0], query.shape[1], kv_lora_rank, dtype=torch.float64)
    for t in range(query.shape[0]):
        listed = [s for s in indices[t].tolist() if s >= 0]
        if not listed:
            continue
        kv = flat[listed]  # [n, D]
        q = query[t].double().unsqueeze(0)  # [1, H, D]
        out[t] = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(0, 1),
            kv.unsqueeze(0).expand(q.shape[1], -1, -1),
            kv[:, :kv_lora_rank].unsqueeze(0).expand(q.shape[1], -1, -1),
            scale=scale,
        ).squeeze(1)
    return out


# (seq_lens, q_lens, block_size, window, width, heads, kv_lora_rank, rope_dim)
MLA_CASES = [
    ([21, 9, 0, 3], [4, 4, 0, 3], 4, 8, 128, 3, 32, 16),
    ([150, 40], [5, 5], 5, 128, 256, 4, 16, 8),
]


def _triton_mla(query, kv_cache, indices, scale, lora):
    return tri.sparse_mla_attention_triton(
        query.to(DEVICE), kv_cache.to(DEVICE), indices.to(DEVICE), scale, lora
    ).cpu()


def _mla_inputs(batch, heads, lora, rope, seed, dtype=torch.float32):
    gen = torch.Generator().manual_seed(seed)
    query = torch.randn(batch.num_tokens, heads, lora + rope, generator=gen).to(dtype)
    kv_cache = torch.randn(batch.num_blocks, batch.block_size, lora + rope, generator=gen).to(dtype)
    return query, kv_cache


@pytest.mark.parametrize("noncausal", [False, True])
@pytest.mark.parametrize("seq_lens,q_lens,block_size,window,width,heads,lora,rope", MLA_CASES)
def test_sparse_mla_matches_sdpa_over_listed_slots(
    noncausal, seq_lens, q_lens, block_size, window, width, heads, lora, rope
):
    batch = _batch(seq_lens, q_lens, block_size, seed=3)
    fn = ref.noncausal_swa_indices_ref if noncausal else ref.swa_indices_ref
    indices = fn(*_index_args(batch, "cpu"), block_size, window, width)
    query, kv_cache = _mla_inputs(batch, heads, lora, rope, seed=4)
    scale = (lora + rope) ** -0.5
    want = sdpa_per_token(query, kv_cache, indices, scale, lora)
    got_ref = ref.sparse_mla_attention_ref(query, kv_cache, indices, scale, lora)
    torch.testing.assert_close(got_ref.double(), want, rtol=1e-5, atol=1e-5)
    got_tri = tri.sparse_mla_attention_triton(
        query.to(DEVICE), kv_cache.to(DEVICE), indices.to(DEVICE), scale, lora
    )
    torch.testing.assert_close(got_tri.cpu().double(), want, rtol=1e-4, atol=1e-4)
    got_op = torch.ops.dspark.sparse_mla_attention(
        query.to(DEVICE), kv_cache.to(DEVICE), indices.to(DEVICE), scale, lora
    )
    torch.testing.assert_close(got_op.cpu().double(), want, rtol=1e-4, atol=1e-4)


def test_sparse_mla_skips_minus_one_and_empty_rows_are_zero():
    batch = _batch([9], [3], 4, seed=5)
    query, kv_cache = _mla_inputs(batch, 2, 16, 16, seed=6)
    indices = torch.full((3, 64), -1, dtype=torch.int32)
    indices[0, [0, 5, 40]] = torch.tensor([2, 7, 3], dtype=torch.int32)  # scattered, holes
    want = sdpa_per_token(query, kv_cache, indices, 0.3, 16)
    for fn in (ref.sparse_mla_attention_ref, _triton_mla):
        got = fn(query, kv_cache, indices, 0.3, 16)
        torch.testing.assert_close(got.double(), want, rtol=1e-4, atol=1e-4)
        assert (got[1:] == 0).all() and not torch.isnan(got).any()


def test_noncausal_output_depends_on_the_last_block_token_and_causal_does_not():
    """Scaling the KV of the request's last block token changes every non-causal
    output of the block (the first query reads a future token), never the causal
    output of the first query."""
    block_size, window, lora, rope = 4, 8, 32, 16
    batch = _batch([21], [4], block_size, seed=7)
    query, kv_cache = _mla_inputs(batch, 3, lora, rope, seed=8)
    args = _index_args(batch, "cpu")
    noncausal = ref.noncausal_swa_indices_ref(*args, block_size, window, 128)
    causal = ref.swa_indices_ref(*args, block_size, window, 128)
    last = int(batch.slot_mapping[-1])
    scaled = kv_cache.clone()
    scaled.view(-1, lora + rope)[last] *= 8.0
    scale = (lora + rope) ** -0.5
    for fn in (ref.sparse_mla_attention_ref, _triton_mla):
        before_nc = fn(query, kv_cache, noncausal, scale, lora)
        after_nc = fn(query, scaled, noncausal, scale, lora)
        before_c = fn(query, kv_cache, causal, scale, lora)
        after_c = fn(query, scaled, causal, scale, lora)
        rel = (after_nc[0] - before_nc[0]).norm() / before_nc[0].norm()
        assert rel > 0.1, f"non-causal first query ignored the last block token ({rel:.3f})"
        assert torch.equal(after_c[0], before_c[0])
        assert not torch.equal(after_c[-1], before_c[-1])  # the last causal query reads it


def test_sparse_mla_validates_arguments():
    query = torch.randn(2, 2, 24)
    kv_cache = torch.randn(3, 4, 24)
    good = torch.zeros(2, 8, dtype=torch.int32)
    with pytest.raises(ValueError, match="indices has shape .* expected \\[2, width\\] int32"):
        ref.sparse_mla_attention_ref(query, kv_cache, good.long(), 1.0, 16)
    with pytest.raises(ValueError, match="kv_lora_rank=32 is invalid"):
        ref.sparse_mla_attention_ref(query, kv_cache, good, 1.0, 32)
    with pytest.raises(ValueError, match="expected -1 or \\[0, 12\\)"):
        ref.sparse_mla_attention_ref(query, kv_cache, good + 12, 1.0, 16)
    with pytest.raises(ValueError, match="kv_cache head dim 20"):
        ref.sparse_mla_attention_ref(query, torch.randn(3, 4, 20), good, 1.0, 16)


def test_mla_cache_write_writes_absolute_slots_and_skips_negative():
    cache = torch.randn(3, 4, 8)
    before = cache.clone()
    kv = torch.randn(3, 8)
    torch.ops.dspark.mla_cache_write(kv, cache, torch.tensor([9, -1, 0]))
    assert torch.equal(cache[2, 1], kv[0]) and torch.equal(cache[0, 0], kv[2])
    untouched = torch.ones(3, 4, dtype=torch.bool)
    untouched[2, 1] = untouched[0, 0] = False
    assert torch.equal(cache[untouched], before[untouched])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="bf16 Triton path needs a GPU")
def test_sparse_mla_bf16_on_gpu():
    batch = _batch([300, 77], [6, 6], 16, seed=9)
    indices = ref.noncausal_swa_indices_ref(*_index_args(batch, "cpu"), 16, 128, 256)
    query, kv_cache = _mla_inputs(batch, 16, 512, 64, seed=10, dtype=torch.bfloat16)
    scale = 576**-0.5
    want = ref.sparse_mla_attention_ref(query, kv_cache, indices, scale, 512)
    got = tri.sparse_mla_attention_triton(query.cuda(), kv_cache.cuda(), indices.cuda(), scale, 512)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.cpu().float(), want.float(), rtol=3e-2, atol=3e-2)
