"""Rejection sampling preserves the target distribution (statistical test, vocab 4).

Target and draft distributions depend only on the absolute position (so the
exact answer is known: the first tokens are independent draws from P[0], P[1],
...). Many independent streams run the speculative rounds vectorized; the
emitted tokens' joint distribution at positions (0, 1) and the marginal at
position 2 are compared with the target's by a chi-square test.
"""

import torch

from dspark_research.speculative import rejection_sample

VOCAB, K, STREAMS, POSITIONS = 4, 3, 40_000, 3
# chi-square critical values at p = 1e-4: df = 15 -> 44.3, df = 3 -> 21.1
CRITICAL = {15: 44.3, 3: 21.1}


def _tables(generator):
    length = POSITIONS + K + 2
    target = torch.softmax(2 * torch.randn(length, VOCAB, generator=generator), -1)
    draft = torch.softmax(2 * torch.randn(length, VOCAB, generator=generator), -1)
    draft[:, 0] = 0  # a token the draft never proposes
    draft /= draft.sum(-1, keepdim=True)
    return target, draft


def _emit(target, draft, sampler, generator):
    """Run rounds until every stream has emitted POSITIONS tokens -> [STREAMS, POSITIONS]."""
    emitted = torch.full((STREAMS, POSITIONS + K + 1), -1)
    length = torch.zeros(STREAMS, dtype=torch.long)
    while int(length.min()) < POSITIONS:
        offsets = (length[:, None] + torch.arange(K + 1)).clamp_max(target.shape[0] - 1)
        q = draft[offsets[:, :K]]  # [N, K, V]
        p = target[offsets]  # [N, K + 1, V]
        tokens = torch.multinomial(q.reshape(-1, VOCAB), 1, generator=generator).view(STREAMS, K)
        accepted, next_token = sampler(tokens, q, p, generator)
        rows = torch.arange(STREAMS)
        for j in range(K + 1):
            write = j <= accepted
            value = torch.where(j < accepted, tokens[:, min(j, K - 1)], next_token)
            index = (length + j).clamp_max(emitted.shape[1] - 1)
            emitted[rows[write], index[write]] = value[write]
        length += accepted + 1
    return emitted[:, :POSITIONS]


def _chi_square(observed_counts, expected_probs):
    expected = expected_probs * observed_counts.sum()
    return float(((observed_counts - expected) ** 2 / expected).sum())


def _statistics(emitted, target):
    pair = torch.bincount(emitted[:, 0] * VOCAB + emitted[:, 1], minlength=VOCAB**2).double()
    pair_expected = (target[0][:, None] * target[1][None, :]).flatten().double()
    third = torch.bincount(emitted[:, 2], minlength=VOCAB).double()
    return _chi_square(pair, pair_expected), _chi_square(third, target[2].double())


def test_rejection_sampling_preserves_target_distribution():
    generator = torch.Generator().manual_seed(0)
    target, draft = _tables(generator)
    emitted = _emit(target, draft, rejection_sample, generator)
    pair_stat, third_stat = _statistics(emitted, target)
    assert pair_stat < CRITICAL[15], pair_stat
    assert third_stat < CRITICAL[3], third_stat
    assert int((emitted[:, 0] == 0).sum()) > 0  # token 0 reached only through resampling


def test_chi_square_detects_a_wrong_sampler():
    """Negative control: accepting every draft token emits the draft's distribution,
    which the same test rejects."""

    def accept_all(tokens, q, p, generator):
        next_token = torch.multinomial(p[:, -1], 1, generator=generator).squeeze(1)
        return torch.full((tokens.shape[0],), K), next_token

    generator = torch.Generator().manual_seed(0)
    target, draft = _tables(generator)
    pair_stat, third_stat = _statistics(_emit(target, draft, accept_all, generator), target)
    assert pair_stat > 10 * CRITICAL[15]
