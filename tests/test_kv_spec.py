"""The draft's vLLM sliding-window length (integrations/vllm/kv_spec.py): nothing the
window still reads is ever freed, checked with hypothesis against a simulation of
vLLM's sliding-window freeing over chunked prefill, speculative steps with
rejections, preemption and prefix-cache hits."""

import pytest
from hypothesis import given, settings, strategies as st

from dspark_compile.integrations.vllm import kv_spec


@st.composite
def windows(draw):
    window = draw(st.integers(1, 400))
    offset = draw(st.integers(0, min(window - 1, 8)))
    block = draw(st.sampled_from([1, 2, 3, 4, 8, 16, 32, 64]))
    return window, offset, block


@settings(max_examples=500, deadline=None)
@given(windows(), st.integers(0, 3000), st.integers(0, 64))
def test_nothing_read_is_freed(case, computed, ahead):
    """Blocks freed at c processed tokens never hold a key a query at p >= c reads."""
    window, offset, block = case
    sw = kv_spec.draft_sliding_window(window, offset)
    freed = kv_spec.freed_tokens(computed, sw, block)
    position = computed + ahead
    assert freed <= kv_spec.lowest_key_read(position, window, offset)


@settings(max_examples=300, deadline=None)
@given(windows(), st.integers(0, 3000))
def test_one_token_less_frees_a_read_key(case, computed):
    """sw = W - K is the smallest sound length: W - K - 1 frees a key that is still read
    (block size 1, once the window has moved off position 0)."""
    window, offset, _ = case
    sw = kv_spec.draft_sliding_window(window, offset)
    if sw < 2 or computed + 1 + offset - window < 0:
        return
    assert kv_spec.freed_tokens(computed, sw - 1, 1) > kv_spec.lowest_key_read(
        computed, window, offset
    )


@settings(max_examples=300, deadline=None)
@given(windows(), st.integers(0, 4000))
def test_vllm_semantics_equal_the_window(case, position):
    """vLLM's sliding window sw lets a query at p see (p - sw, p]: the window's keys."""
    window, offset, _ = case
    sw = kv_spec.draft_sliding_window(window, offset)
    assert max(position - sw + 1, 0) == kv_spec.lowest_key_read(position, window, offset)


@st.composite
def schedules(draw):
    """A request's life: prompt length, chunk size, per-step accepted draft tokens and
    where it gets preempted (all KV dropped, recomputed from a prefix-cache hit)."""
    window, offset, block = draw(windows())
    prompt = draw(st.integers(1, 1500))
    chunk = draw(st.integers(1, 600))
    num_spec = max(offset, 1)
    accepted = draw(st.lists(st.integers(0, num_spec), min_size=1, max_size=40))
    preempt_at = draw(st.sets(st.integers(0, 39), max_size=3))
    return window, offset, block, prompt, chunk, num_spec, accepted, preempt_at


@settings(max_examples=300, deadline=None)
@given(schedules())
def test_request_lifecycle(case):
    """Simulated request: before every step vLLM frees whole blocks below c - sw + 1 (c =
    processed computed tokens); the step's draft queries (the target's new tokens
    and the K - 1 positions beyond) read only kept blocks. A preemption frees all
    and resumes from a prefix-cache hit, which needs only blocks vLLM keeps."""
    window, offset, block, prompt, chunk, num_spec, accepted, preempt_at = case
    sw = kv_spec.draft_sliding_window(window, offset)
    freed_blocks = set()
    computed = 0

    def free_before_step(c):
        for blk in range(kv_spec.freed_tokens(c, sw, block) // block):
            freed_blocks.add(blk)

    def check_reads(first, last):
        for p in (first, last):
            lo = kv_spec.lowest_key_read(p, window, offset)
            for blk in range(lo // block, p // block + 1):
                assert blk not in freed_blocks, (p, lo, blk, sw)

    # prefill in chunks
    while computed < prompt:
        free_before_step(computed)
        step = min(chunk, prompt - computed)
        check_reads(computed, computed + step - 1)
        computed += step
    for i, acc in enumerate(accepted):
        if i in preempt_at:
            # all blocks freed; the recomputation starts at a prefix-cache hit h, for
            # which vLLM keeps (requires cached) only the last cache_hit_blocks blocks
            hit = computed // block * block
            need = kv_spec.cache_hit_blocks(sw, block)
            freed_blocks = set(range(max(hit // block - need, 0)))
            computed = hit
        free_before_step(computed)
        # target verifies [c, c + K]; draft re-runs from c and drafts K - 1 beyond
        check_reads(computed, computed + num_spec + num_spec)
        computed += acc + 1


def test_capacity_goal_arithmetic():
    """A self-draft, W=2048, K=3 at 32k: with vLLM's admission cap the window wins back
    >= 80% of the capacity the draft costs when the in-flight tokens are <= ~1.5k;
    the CPU tier's scale (W=256 at 4k, 128 tokens per step) has the same ratio."""
    gpu = kv_spec.predicted_recovered_fraction(2048, 3, 16, 1024, 32768, 2, 2)
    assert 0.82 < gpu < 0.84
    assert kv_spec.predicted_recovered_fraction(2048, 3, 16, 8192, 32768, 2, 2) < 0.6
    cpu = kv_spec.predicted_recovered_fraction(256, 3, 32, 128, 4096, 2, 2)
    assert 0.8 < cpu < 0.83
    # no window at all: the sliding group reaches max_model_len, nothing won back
    assert kv_spec.predicted_recovered_fraction(8192, 3, 32, 128, 4096, 2, 2) < 0


def test_capacity_helpers():
    assert kv_spec.sliding_blocks_per_request(253, 32, 128, 4096) == 13
    assert kv_spec.full_blocks_per_request(32, 4096) == 128
    assert kv_spec.capacity_tokens(1000, 128, 4096) == 32000
    assert kv_spec.recovered_fraction(100, 50, 90) == pytest.approx(0.8)
    with pytest.raises(ValueError, match="costs no capacity"):
        kv_spec.recovered_fraction(100, 100, 100)


@pytest.mark.parametrize("args", [(0, 0), (3, 3), (4, -1), (2.0, 0)])
def test_bad_windows_raise(args):
    with pytest.raises(ValueError):
        kv_spec.draft_sliding_window(*args)


def test_mirror_matches_vllm():
    """Our copy of vLLM's admission cap and skipped-token rule equals vLLM's own."""
    pytest.importorskip("vllm")
    import torch
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    for sw, block, inflight, max_len in [
        (253, 32, 128, 4096),
        (2045, 16, 1024, 32768),
        (61, 32, 8192, 1024),
        (1, 1, 1, 5),
    ]:
        spec = SlidingWindowSpec(
            block_size=block, num_kv_heads=2, head_size=32, dtype=torch.float32, sliding_window=sw
        )
        assert spec.max_admission_blocks_per_request(
            max_in_flight_tokens=inflight, max_model_len=max_len
        ) == kv_spec.sliding_blocks_per_request(sw, block, inflight, max_len)
