"""The speculative loop with an EAGLE3 draft: lossless, and its proposals are vLLM's.

The reference is vLLM's ``eagle3`` drafting written out densely from
:meth:`Eagle3Draft.forward_dense`: with ``L`` committed tokens, position p (0 .. L-2)
reads token ``x[p + 1]`` and ``fc(aux[p])`` (the target's aux-layer states at p); each
proposal step appends the proposed token and the previous position's pre-norm hidden.
The drafts run compiled with backend="dspark" (aot_eager lowering), windowed or not.
"""

import pytest
import torch

from dspark_research.speculative import (
    LMConfig,
    PagedKVCache,
    SpeculativeDecoder,
    TransformerLM,
    compile_draft,
    loop,
    target_greedy_decode,
)
from dspark_research.speculative.eagle3 import Eagle3Draft, target_aux, tie_eagle3_to_target

VOCAB = 8  # small: a random draft's argmax often agrees with the target's (partial acceptance)
K = 3
TARGET_CFG = LMConfig(
    vocab_size=VOCAB,
    hidden_size=32,
    num_layers=3,
    num_heads=4,
    num_kv_heads=2,
    head_dim=8,
    intermediate_size=64,
)
DRAFT_CFG = LMConfig(
    vocab_size=VOCAB,
    hidden_size=32,
    num_layers=1,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    intermediate_size=64,
)
AUX = (1, 2)


@pytest.fixture(scope="module")
def pair():
    """Seeds picked (from the first few) so that greedy rounds accept 0, 1, 2 and 3 tokens."""
    target = TransformerLM(TARGET_CFG, seed=3)
    target.lm_head.weight.data *= 4.0  # peaked: no near-tie argmax
    target.eval().requires_grad_(False)
    draft = Eagle3Draft(DRAFT_CFG, AUX, TARGET_CFG.hidden_size, seed=30)
    tie_eagle3_to_target(draft, target)
    for p in draft.parameters():  # O(1) weights: hidden, attention and MLP all matter
        if p.dim() == 2 and p is not draft.embed.weight:
            p.data *= 10.0
    return target, draft.eval().requires_grad_(False)


def _prompt(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randint(0, VOCAB, (n,), generator=torch.Generator().manual_seed(seed))


def _window_mask(size: int, window, future_offset: int, block: int) -> torch.Tensor:
    """Causal, and with a window query p keeps keys ``j >= lo(p)``, ``lo(p) =
    floor(max(p + 1 + K - W, 0) / b) * b`` (docs/design.md's window arithmetic)."""
    p = torch.arange(size)[:, None]
    j = torch.arange(size)[None, :]
    mask = j <= p
    if window is not None:
        mask &= j >= (torch.clamp(p + 1 + future_offset - window, min=0) // block) * block
    return mask


def _reference_proposals(target, draft, committed, k, window=None, block=1):
    """vLLM's EAGLE3 greedy proposals (``k`` of them) after ``committed [L]`` tokens,
    densely; with ``window``: future offset ``k``, ``block``-aligned (as compiled)."""
    hidden = draft.combine(target_aux(target, committed[None, :-1], draft.aux_layer_ids))
    tokens = committed[None, 1:]
    proposals = []
    for _ in range(k):
        size = tokens.shape[1]
        logits, pre = draft.forward_dense(
            tokens, hidden, attn_mask=_window_mask(size, window, k, block)
        )
        token = logits[0, -1].argmax()
        proposals.append(int(token))
        tokens = torch.cat([tokens, token.view(1, 1)], dim=1)
        hidden = torch.cat([hidden, pre[:, -1:]], dim=1)
    return proposals


def _run(target, draft, prompt, new_tokens, window, block, monkeypatch):
    """Generate with the compiled draft; returns (result, each round's proposals)."""
    rounds = []
    greedy_verify = loop.greedy_verify

    def recording_verify(draft_tokens, target_logits):
        rounds.append(draft_tokens[0].tolist())
        return greedy_verify(draft_tokens, target_logits)

    monkeypatch.setattr(loop, "greedy_verify", recording_verify)
    decoder = SpeculativeDecoder(
        target,
        draft,
        num_speculative_tokens=K,
        draft_prefill_chunk=16,
        block_size=block,
        max_len=96,
        draft_fn=compile_draft(
            draft, window, None, "aot_eager", {"future_offset": K} if window else None
        ),
    )
    return decoder.generate(prompt, new_tokens), rounds


@pytest.mark.parametrize(("window", "block"), [(None, 4), (12, 1), (13, 4)])
def test_eagle3_loop_is_lossless_and_proposes_as_vllm(pair, window, block, monkeypatch):
    """Greedy output = the target's own; every round's proposals = the dense reference
    (with the window mask when windowed), over rounds of every accepted count."""
    target, draft = pair
    prompt = _prompt(50)
    result, rounds = _run(target, draft, prompt, 30, window, block, monkeypatch)
    assert result.tokens == target_greedy_decode(target, prompt, 30)[0]
    assert len(rounds) == result.rounds
    assert 0 < sum(result.accepted) < K * result.rounds  # partly accepted: a real test
    assert {0, K} < set(result.accepted)  # rounds of none, some and all K accepted
    seq = torch.cat([prompt, torch.tensor(result.tokens)])
    length = prompt.numel() + 1
    for proposals, accepted in zip(rounds, result.accepted):
        assert proposals == _reference_proposals(target, draft, seq[:length], K, window, block)
        length += accepted + 1


def test_compiled_eagle3_window_equals_masked_dense_reference(pair):
    """The compiled windowed draft really windows: on a 60-token sequence (prefill in
    chunks, then single tokens) its logits equal the dense reference with the window
    mask, and differ from the unwindowed draft's."""
    _, draft = pair
    size, window, block = 60, 12, 4
    generator = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, VOCAB, (size,), generator=generator)
    hidden = torch.randn(size, DRAFT_CFG.hidden_size, generator=generator)
    outputs = {}
    for w in (None, window):
        torch._dynamo.reset()
        fn = compile_draft(draft, w, None, "aot_eager", {"future_offset": K} if w else None)
        cache = PagedKVCache(*draft.kv_cache_shape, capacity=64, block_size=block, seed=1)
        logits = []
        for count in (20, 17, 1, 5, *[1] * 17):
            step = cache.step(count)
            per_token = [t.clone() for t in (tokens, hidden, step.positions, step.slot_mapping)]
            chunk_tokens, chunk_hidden = (t[step.positions] for t in per_token[:2])
            if count >= 2:
                for t in (chunk_tokens, chunk_hidden, per_token[2], per_token[3]):
                    torch._dynamo.mark_dynamic(t, 0)
            out, _ = fn(
                chunk_tokens,
                chunk_hidden,
                per_token[2],
                cache.key_caches,
                cache.value_caches,
                step.block_table,
                step.seq_lens,
                step.query_start_loc,
                per_token[3],
            )
            logits.append(out)
        outputs[w] = torch.cat(logits)
        reference, _ = draft.forward_dense(
            tokens[None], hidden[None], attn_mask=_window_mask(size, w, K, block)
        )
        torch.testing.assert_close(outputs[w], reference[0], rtol=1e-4, atol=1e-4)
    tail = slice(window, None)
    assert (outputs[window][tail] - outputs[None][tail]).abs().max() > 1e-2


def test_target_aux_option_and_eagle3_errors(pair):
    """The target's ``aux_layer_ids`` option returns what ``target_aux`` computes and
    leaves the default outputs alone; bad ids and an EAGLE3 draft without ``combine``
    raise ValueError naming the argument."""
    target, draft = pair
    tokens = _prompt(10)
    cache = PagedKVCache(*target.kv_cache_shape, capacity=16)
    step = cache.step(10)
    args = (
        tokens,
        torch.zeros(10, 0),
        step.positions,
        cache.key_caches,
        cache.value_caches,
        step.block_table,
        step.seq_lens,
        step.query_start_loc,
        step.slot_mapping,
    )
    logits, hidden = target(*args)
    logits_aux, hidden_aux, aux = target(*args, aux_layer_ids=AUX)
    torch.testing.assert_close(logits_aux, logits)
    torch.testing.assert_close(hidden_aux, hidden)
    torch.testing.assert_close(aux, target_aux(target, tokens[None], AUX)[0], rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match=r"aux_layer_ids=\[2, 1\] is invalid"):
        target(*args, aux_layer_ids=(2, 1))
    with pytest.raises(ValueError, match=r"aux_layer_ids=\[3\] is invalid"):
        target(*args, aux_layer_ids=(3,))

    class NoCombine(TransformerLM):
        aux_layer_ids = AUX

    with pytest.raises(ValueError, match="no combine"):
        SpeculativeDecoder(target, NoCombine(TARGET_CFG))
