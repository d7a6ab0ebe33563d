"""dspark.paged_attention / dspark.reshape_and_cache against brute-force loops."""

import math

import pytest
import torch

import dspark_compile  # noqa: F401
from dspark_compile.kernels.paged_attention import paged_attention_ref
from dspark_compile.models import make_paged_batch, random_kv_cache


def brute_force_attention(query, key_cache, value_cache, batch, scale, causal, kv_start=None):
    """One query, one head at a time, tokens read one by one through the block table."""
    b = key_cache.shape[1]
    group = query.shape[1] // key_cache.shape[2]
    out = torch.zeros_like(query, dtype=torch.float64)
    locs = batch.query_start_loc.tolist()
    for i, s in enumerate(batch.seq_lens.tolist()):
        q_len = locs[i + 1] - locs[i]
        lo = 0 if kv_start is None else int(kv_start[i])
        for j in range(q_len):
            pos = s - q_len + j
            hi = pos + 1 if causal else s
            for h in range(query.shape[1]):
                scores, values = [], []
                for t in range(lo, hi):
                    blk = int(batch.block_table[i, t // b])
                    k = key_cache[blk, t % b, h // group].double()
                    scores.append(float(query[locs[i] + j, h].double() @ k) * scale)
                    values.append(value_cache[blk, t % b, h // group].double())
                if not scores:
                    continue
                m = max(scores)
                weights = [math.exp(x - m) for x in scores]
                total = sum(weights)
                out[locs[i] + j, h] = sum(w / total * v for w, v in zip(weights, values))
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("seq_lens,q_lens", [([9, 3, 0, 17], [3, 3, 0, 1]), ([5, 12], [5, 4])])
def test_op_matches_brute_force(causal, seq_lens, q_lens):
    gen = torch.Generator().manual_seed(7)
    batch = make_paged_batch(seq_lens, q_lens, 4, generator=gen)
    kc, vc = random_kv_cache(batch.num_blocks, 4, 2, 8, generator=gen)
    q = torch.randn(batch.num_tokens, 6, 8, generator=gen)
    got = torch.ops.dspark.paged_attention(
        q, kc, vc, batch.block_table, batch.seq_lens, batch.query_start_loc, 0.3, causal
    )
    want = brute_force_attention(q, kc, vc, batch, 0.3, causal)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_kv_start_hides_earlier_tokens_and_empty_rows_are_zero():
    gen = torch.Generator().manual_seed(3)
    batch = make_paged_batch([10, 7], [3, 2], 4, generator=gen)
    kc, vc = random_kv_cache(batch.num_blocks, 4, 1, 8, generator=gen)
    q = torch.randn(batch.num_tokens, 2, 8, generator=gen)
    kv_start = torch.tensor([8, 6], dtype=torch.int32)
    got = paged_attention_ref(
        q,
        kc,
        vc,
        batch.block_table,
        batch.seq_lens,
        batch.query_start_loc,
        0.5,
        True,
        kv_start=kv_start,
    )
    want = brute_force_attention(q, kc, vc, batch, 0.5, True, kv_start)
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    # Request 0's first query sits at position 7 < kv_start 8: it sees nothing.
    assert torch.all(got[0] == 0) and not torch.isnan(got).any()


def test_low_precision_output_dtype():
    gen = torch.Generator().manual_seed(5)
    batch = make_paged_batch([20], [4], 8, generator=gen)
    kc, vc = random_kv_cache(batch.num_blocks, 8, 2, 16, dtype=torch.bfloat16, generator=gen)
    q = torch.randn(4, 4, 16, generator=gen).to(torch.bfloat16)
    got = torch.ops.dspark.paged_attention(
        q, kc, vc, batch.block_table, batch.seq_lens, batch.query_start_loc, 0.25, False
    )
    want = brute_force_attention(q, kc, vc, batch, 0.25, False)
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.double(), want, rtol=2e-2, atol=2e-2)


def test_reshape_and_cache_writes_absolute_slots_and_skips_negative():
    gen = torch.Generator().manual_seed(1)
    kc, vc = random_kv_cache(6, 4, 2, 8, generator=gen)
    before_k, before_v = kc.clone(), vc.clone()
    key, value = torch.randn(3, 2, 8, generator=gen), torch.randn(3, 2, 8, generator=gen)
    slots = torch.tensor([13, -1, 2], dtype=torch.int64)
    torch.ops.dspark.reshape_and_cache(key, value, kc, vc, slots)
    assert torch.equal(kc[3, 1], key[0]) and torch.equal(vc[3, 1], value[0])
    assert torch.equal(kc[0, 2], key[2]) and torch.equal(vc[0, 2], value[2])
    untouched = torch.ones(6, 4, dtype=torch.bool)
    untouched[3, 1] = untouched[0, 2] = False
    assert torch.equal(kc[untouched], before_k[untouched])
    assert torch.equal(vc[untouched], before_v[untouched])


def test_gqa_head_mismatch_raises():
    batch = make_paged_batch([4], [1], 4)
    kc, vc = random_kv_cache(batch.num_blocks, 4, 3, 8)
    with pytest.raises(ValueError, match="not a multiple"):
        paged_attention_ref(
            torch.randn(1, 4, 8),
            kc,
            vc,
            batch.block_table,
            batch.seq_lens,
            batch.query_start_loc,
            1.0,
            True,
        )
