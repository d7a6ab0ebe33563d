"""The speculative-decoding loop: exact on cases with known answers.

Drafts run compiled with backend="dspark" (aot_eager lowering: our passes, then
eager ATen) on the paged ops, as in the study.
"""

import copy

import pytest
import torch

from dspark_research.speculative import (
    LMConfig,
    PagedKVCache,
    SpeculativeDecoder,
    TransformerLM,
    compile_draft,
    greedy_verify,
    target_greedy_decode,
)

BLOCK = 16
TARGET_CFG = LMConfig(
    hidden_size=32, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=8, intermediate_size=64
)
DRAFT_CFG = LMConfig(
    hidden_size=32, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16, intermediate_size=64
)
EAGLE_CFG = LMConfig(
    hidden_size=32,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    intermediate_size=64,
    feature_size=32,
)


def _peaked(model: TransformerLM, scale: float = 8.0) -> TransformerLM:
    """Sharpen the output distribution (random LMs are near uniform, every argmax a near-tie)."""
    model.lm_head.weight.data *= scale
    return model.eval().requires_grad_(False)


@pytest.fixture(scope="module")
def target():
    return _peaked(TransformerLM(TARGET_CFG, seed=0))


def _noisy_copy(model: TransformerLM, noise: float, seed: int) -> TransformerLM:
    """A draft that agrees with ``model`` often but not always."""
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    for p in draft.parameters():
        p.data += noise * p.data.std() * torch.randn(p.shape, generator=generator)
    return draft


def _prompt(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(seed))


def test_paged_forward_matches_dense_forward():
    model = TransformerLM(EAGLE_CFG, seed=3).eval()
    tokens = _prompt(45)
    features = torch.randn(1, 45, 32)
    dense_logits, dense_hidden = model.forward_dense(tokens[None], features)
    cache = PagedKVCache(*model.kv_cache_shape, capacity=50, block_size=BLOCK)
    logits, hidden = [], []
    for n in (17, 1, 5, 22):  # chunks crossing block boundaries
        step = cache.step(n)
        out = model(
            tokens[step.positions],
            features[0, step.positions],
            step.positions,
            cache.key_caches,
            cache.value_caches,
            step.block_table,
            step.seq_lens,
            step.query_start_loc,
            step.slot_mapping,
        )
        logits.append(out[0])
        hidden.append(out[1])
    torch.testing.assert_close(torch.cat(logits), dense_logits[0], rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(torch.cat(hidden), dense_hidden[0], rtol=1e-4, atol=1e-4)


def test_greedy_verify_known_answers():
    logits = torch.full((3, 4, 10), -1.0)
    argmax = torch.tensor([[1, 2, 3, 4], [5, 2, 3, 4], [1, 2, 7, 9]])
    logits.scatter_(2, argmax.unsqueeze(-1), 1.0)
    draft = torch.tensor([[1, 2, 3], [1, 2, 3], [1, 2, 3]])
    accepted, next_token = greedy_verify(draft, logits)
    assert accepted.tolist() == [3, 0, 2]
    assert next_token.tolist() == [4, 5, 7]


@pytest.mark.parametrize("k", [1, 4])
def test_self_draft_accepts_every_token(target, k):
    """The target as its own draft (compiled, no window): tau = K + 1 exactly."""
    decoder = SpeculativeDecoder(
        target,
        target,
        num_speculative_tokens=k,
        draft_fn=compile_draft(target, None, lowering="aot_eager"),
    )
    result = decoder.generate(_prompt(37), max_new_tokens=20)
    assert result.tau == k + 1
    assert result.acceptance_per_position == [1.0] * k
    assert result.tokens == target_greedy_decode(target, _prompt(37), 20)[0]


def test_sampled_self_draft_accepts_every_token_and_reproduces(target):
    """Rejection sampling in the loop: with q == p every draft token is accepted
    (u * q < p for u < 1); the same seed gives the same tokens."""
    decoder = SpeculativeDecoder(
        target,
        target,
        num_speculative_tokens=3,
        temperature=1.0,
        draft_fn=compile_draft(target, None, lowering="aot_eager"),
    )
    first = decoder.generate(_prompt(20), max_new_tokens=16, seed=5)
    assert first.tau == 4.0
    assert decoder.generate(_prompt(20), max_new_tokens=16, seed=5).tokens == first.tokens
    assert decoder.generate(_prompt(20), max_new_tokens=16, seed=6).tokens != first.tokens


@pytest.mark.parametrize("family", ["draft_model", "eagle"])
def test_accepted_output_equals_target_greedy_decode(target, family):
    """Whatever the draft proposes, greedy speculative decoding emits the target's
    own greedy tokens, with a window much shorter than the context and a chunked
    draft prefill."""
    draft = (
        _noisy_copy(target, 0.3, seed=1)
        if family == "draft_model"
        else _peaked(TransformerLM(EAGLE_CFG, seed=2))
    )
    decoder = SpeculativeDecoder(
        target,
        draft,
        num_speculative_tokens=3,
        draft_prefill_chunk=8,
        max_len=128,
        draft_fn=compile_draft(draft, 24, lowering="aot_eager"),
    )
    for seed, n in ((0, 70), (1, 5)):
        result = decoder.generate(_prompt(n, seed), max_new_tokens=24)
        assert result.tokens == target_greedy_decode(target, _prompt(n, seed), 24)[0]
        assert result.committed_tokens + 1 >= 24  # + the token of the target prefill
    if family == "draft_model":
        assert 0 < sum(result.accepted) < 3 * result.rounds  # partly accepted: a real test


def test_window_wider_than_context_gives_no_window_tokens(target):
    draft = _noisy_copy(target, 0.3, seed=1)
    runs = {}
    for window in (None, 512, 16):
        decoder = SpeculativeDecoder(
            target,
            draft,
            num_speculative_tokens=3,
            draft_prefill_chunk=8,
            max_len=128,
            draft_fn=compile_draft(draft, window, lowering="aot_eager"),
        )
        runs[window] = decoder.generate(_prompt(60), max_new_tokens=24, nll_tail=40)
    assert runs[512].tokens == runs[None].tokens
    assert runs[512].accepted == runs[None].accepted
    assert runs[512].draft_nll == pytest.approx(runs[None].draft_nll, rel=1e-6)
    # a window shorter than the context changes what the draft predicts: the pass is live
    assert abs(runs[16].draft_nll - runs[None].draft_nll) > 1e-4


def test_bad_arguments_raise_value_error(target):
    with pytest.raises(ValueError, match="num_speculative_tokens=0 is invalid"):
        SpeculativeDecoder(target, target, num_speculative_tokens=0)
    with pytest.raises(ValueError, match="temperature=-1"):
        SpeculativeDecoder(target, target, temperature=-1)
    with pytest.raises(ValueError, match="target.feature_size=32 is invalid"):
        eagle = TransformerLM(EAGLE_CFG)
        SpeculativeDecoder(eagle, target)
    decoder = SpeculativeDecoder(target, target, max_len=30)
    with pytest.raises(ValueError, match="max_new_tokens=20 is invalid"):
        decoder.generate(_prompt(10), max_new_tokens=20)
    with pytest.raises(ValueError, match="prompt has shape"):
        decoder.generate(torch.zeros(0, dtype=torch.long), max_new_tokens=2)
    with pytest.raises(ValueError, match="capacity=0 is invalid"):
        PagedKVCache(1, 1, 8, capacity=0)
    cache = PagedKVCache(1, 1, 8, capacity=20)
    with pytest.raises(ValueError, match="exceed the cache capacity 20"):
        cache.step(21)
    with pytest.raises(ValueError, match="num_heads=3 is invalid"):
        LMConfig(num_heads=3, num_kv_heads=2)
