"""One dense, position-built oracle for the sink + window rule, shared by the sink tests."""

import torch


def lower_bound(p, W, b, K):
    """``lo(p) = floor(max(p + 1 + K - W, 0) / b) * b`` on plain ints."""
    return max(p + 1 + K - W, 0) // b * b


def dense_sink_attention(
    query, key_cache, value_cache, block_table, seq_lens, query_start_loc, scale, causal, W, K, S
):
    """float64 attention over the FULL table with the explicit mask: a query at
    p sees j if ``j <= p`` (causal) and ``j < S_b or j >= lo(anchor)`` (anchor:
    p if causal, else the request's last position; ``S_b = ceil(S / b) * b``);
    W None: no window. Returns ``[T, Hq, D]`` float64 on the CPU."""
    b, group = key_cache.shape[1], query.shape[1] // key_cache.shape[2]
    sink_b = -(-S // b) * b
    out = torch.zeros(query.shape, dtype=torch.float64)
    locs = query_start_loc.tolist()
    for i, s in enumerate(seq_lens.tolist()):
        q_len = locs[i + 1] - locs[i]
        if q_len == 0 or s == 0:
            continue
        blocks = block_table[i, : -(-s // b)].long()
        k = key_cache[blocks].flatten(0, 1)[:s].double().cpu().repeat_interleave(group, 1)
        v = value_cache[blocks].flatten(0, 1)[:s].double().cpu().repeat_interleave(group, 1)
        mask = torch.zeros(q_len, s, dtype=torch.bool)
        for r in range(q_len):
            p = s - q_len + r
            anchor = p if causal else s - 1
            for j in range(s):
                in_window = W is None or j < sink_b or j >= lower_bound(anchor, W, b, K)
                mask[r, j] = (j <= p or not causal) and in_window
        q = query[locs[i] : locs[i + 1]].double().cpu()
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)
        out[locs[i] : locs[i + 1]] = torch.einsum("hqk,khd->qhd", probs, v)
    return out


def random_window_cases(seed, count, block_sizes, max_window, max_sinks, max_seq, max_q, device):
    """Seeded random ``(batch, query, key_cache, value_cache, W, b, K, S, rand)`` cases
    (lengths, GQA, window, sinks); batches with no query token are skipped. ``rand(lo,
    hi)`` draws further ints from the same generator (e.g. a split count)."""
    from dspark_compile.models import make_paged_batch, random_kv_cache

    gen = torch.Generator().manual_seed(seed)

    def rand(lo, hi):
        return int(torch.randint(lo, hi + 1, (1,), generator=gen))

    for _ in range(count):
        b = block_sizes[rand(0, len(block_sizes) - 1)]
        W = rand(2, max_window)
        K, S = rand(0, min(W - 1, 3)), rand(0, max_sinks)
        hkv, group = rand(1, 2), rand(1, 4)
        seq_lens = [rand(0, max_seq) for _ in range(rand(1, 4))]
        q_lens = [rand(0, min(s, max_q)) for s in seq_lens]
        batch = make_paged_batch(seq_lens, q_lens, b, device=device, generator=gen)
        if batch.num_tokens == 0:
            continue
        kc, vc = random_kv_cache(batch.num_blocks, b, hkv, 16, device=device, generator=gen)
        q = torch.randn(batch.num_tokens, hkv * group, 16, generator=gen).to(device)
        yield batch, q, kc, vc, W, b, K, S, rand
