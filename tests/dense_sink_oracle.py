"""One dense, position-built oracle for the sink + window rule, shared by the sink tests."""

import torch


def lower_bound(p, W, b, K):
    """``lo(p) = floor(max(p + 1 + K - W, 0) / b) * b`` on plain ints."""
    return max(p + 1 + K - W, 0) // b * b


def dense_sink_attention(query, key_cache, value_cache, block_table, seq_lens,
                         query_start_loc, scale, causal, W, K, S):
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
        blocks = block_table[i, :-(-s // b)].long()
        k = key_cache[blocks].flatten(0, 1)[:s].double().cpu().repeat_interleave(group, 1)
        v = value_cache[blocks].flatten(0, 1)[:s].double().cpu().repeat_interleave(group, 1)
        mask = torch.zeros(q_len, s, dtype=torch.bool)
        for r in range(q_len):
            p = s - q_len + r
            anchor = p if causal else s - 1
            for j in range(s):
                in_window = W is None or j < sink_b or j >= lower_bound(anchor, W, b, K)
                mask[r, j] = (j <= p or not causal) and in_window
        q = query[locs[i]:locs[i + 1]].double().cpu()
        scores = torch.einsum("qhd,khd->hqk", q, k) * scale
        probs = torch.softmax(scores.masked_fill(~mask, float("-inf")), -1).nan_to_num(0.0)
        out[locs[i]:locs[i + 1]] = torch.einsum("hqk,khd->qhd", probs, v)
    return out
