"""The speculative-decoding loop: target prefill, draft proposals, target verification.

One request at a time, both models on paged KV caches (:class:`PagedKVCache`).
A round, with ``L`` committed tokens (the target has processed ``L - 1`` of them):

1. the draft catches up on committed tokens it has not processed (its prefill
   is the first catch-up, in chunks of ``draft_prefill_chunk`` tokens) and
   proposes ``d_1`` from its logits at position ``L - 1``, then ``d_2 .. d_K``
   one token per forward;
2. the target runs ``[x_{L-1}, d_1 .. d_K]`` at positions ``L-1 .. L+K-1`` in one
   forward;
3. :func:`greedy_verify` or :func:`rejection_sample` keeps ``a`` draft tokens and
   adds one target token; both caches roll back by length (``truncate``) to
   what stays valid. The target keeps ``L + a``; an EAGLE-style draft
   (``feature_size > 0``) keeps ``L`` (its later inputs used its own features,
   which the target's now replace); a token-only draft keeps ``L + min(a, K-1)``.

An EAGLE3 draft (one with ``aux_layer_ids`` and ``combine``, e.g.
:class:`~dspark_research.speculative.eagle3.Eagle3Draft`) runs as vLLM's ``eagle3``
proposer does: its position p reads token ``x[p + 1]`` and ``combine(aux[p])`` (``fc``
over the target's aux-layer states at p, which the target returns when its forward is
given ``aux_layer_ids``), so it holds ``L - 1`` positions after a catch-up and proposes
``d_1`` from position ``L - 2``; while proposing, each step reads the previous step's
pre-norm hidden. After verification it keeps ``L - 1`` and its catch-up recomputes
positions ``L - 1 .. L + a - 1`` from the target's aux states (vLLM's next first pass).

The draft is called through ``draft_fn`` (e.g. :func:`compile_draft`'s result),
so the window pass of ``backend="dspark"`` applies exactly as in deployment.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from dspark_research.speculative.paged_cache import PagedKVCache, StepInputs
from dspark_research.speculative.protocol import PagedModel
from dspark_research.speculative.sampling import greedy_verify, rejection_sample

logger = logging.getLogger(__name__)


def _ensure_backend_registered() -> None:
    """``backend="dspark"`` is found through the package's entry point once installed;
    from a bare source tree (``PYTHONPATH``), register it by name here."""
    from torch._dynamo.backends.registry import list_backends, register_backend

    if "dspark" not in list_backends(exclude_tags=()):
        from dspark_compile.backend import dspark_backend

        register_backend(compiler_fn=dspark_backend, name="dspark")


def compile_draft(
    draft: torch.nn.Module,
    window_size: Optional[int],
    block_size: Optional[int] = None,
    lowering: str = "inductor",
    extra_options: Optional[dict] = None,
) -> Callable:
    """``torch.compile(draft, backend="dspark")`` with the window on (``window_size``
    tokens, future offset 0: the loop's ``seq_lens`` always include the draft's
    current queries) or off (``None``).

    Shapes: the loop marks the token dimension of the draft's inputs dynamic
    (``torch._dynamo.mark_dynamic``) whenever it has 2 or more tokens, and gives
    every call fresh contiguous inputs and caches of a fixed size, so a draft
    compiles exactly two graphs: one for 1 token (torch specializes size 1) and
    one for any longer query (catch-up steps of 2 .. K+1 tokens, prefill chunks).
    """
    _ensure_backend_registered()
    options = {
        "draft_window_size": window_size,
        "future_offset": 0,
        "block_size": block_size,
        "lowering": lowering,
        **(extra_options or {}),
    }
    return torch.compile(draft, backend="dspark", options=options)


@dataclasses.dataclass
class SpecResult:
    """What one :meth:`SpeculativeDecoder.generate` call produced and measured.

    ``tokens``: exactly ``max_new_tokens`` generated tokens (a last round's
    surplus is dropped from ``tokens``, never from the statistics).
    ``accepted``: draft tokens accepted in each round (0 .. K).
    Times in seconds; the decode times exclude both prefills.
    """

    tokens: list[int]
    accepted: list[int]
    num_speculative_tokens: int
    prompt_len: int
    target_prefill_s: float
    draft_prefill_s: float
    draft_s: float
    target_s: float
    decode_s: float
    committed_tokens: int
    draft_nll: Optional[float] = None

    @property
    def rounds(self) -> int:
        return len(self.accepted)

    @property
    def tau(self) -> float:
        """Mean accepted length: mean accepted draft tokens per round + 1."""
        return sum(self.accepted) / max(self.rounds, 1) + 1.0

    @property
    def acceptance_per_position(self) -> list[float]:
        """Fraction of rounds whose draft token j (1-based) was accepted, j = 1 .. K."""
        return [
            sum(a >= j for a in self.accepted) / max(self.rounds, 1)
            for j in range(1, self.num_speculative_tokens + 1)
        ]

    @property
    def draft_tokens_per_s(self) -> float:
        return self.rounds * self.num_speculative_tokens / self.draft_s if self.draft_s else 0.0

    @property
    def target_tokens_per_s(self) -> float:
        return (
            self.rounds * (self.num_speculative_tokens + 1) / self.target_s
            if self.target_s
            else 0.0
        )

    @property
    def tokens_per_s(self) -> float:
        """End to end: committed tokens per second of decode (prefills excluded)."""
        return self.committed_tokens / self.decode_s if self.decode_s else 0.0

    def summary(self) -> dict:
        return {
            "tau": self.tau,
            "rounds": self.rounds,
            "acceptance_per_position": self.acceptance_per_position,
            "draft_tokens_per_s": self.draft_tokens_per_s,
            "target_tokens_per_s": self.target_tokens_per_s,
            "tokens_per_s": self.tokens_per_s,
            "target_prefill_s": self.target_prefill_s,
            "draft_prefill_s": self.draft_prefill_s,
            "draft_nll": self.draft_nll,
        }


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _model_device_dtype(model: torch.nn.Module) -> tuple[torch.device, torch.dtype]:
    param = next(model.parameters())
    return param.device, param.dtype


class SpeculativeDecoder:
    """Greedy (``temperature == 0``) or sampled speculative decoding of one request.

    ``target``/``draft`` implement :class:`PagedModel`; an EAGLE-style draft's
    ``feature_size`` must equal the target's hidden size. An EAGLE3 draft (with
    ``aux_layer_ids`` and ``combine(aux [T, n * Ht]) -> [T, feature_size]``) needs a
    target whose forward takes ``aux_layer_ids=`` and then returns ``(logits, hidden,
    aux)`` (:meth:`TransformerLM.forward`). ``draft_fn`` (default:
    ``draft`` itself) is what the loop calls with the draft's forward arguments.
    ``draft_prefill_chunk``: most tokens per draft catch-up forward (None: all at once).
    ``max_len``: cache capacity in tokens for every request (prompt + new tokens
    + ``2 K + 2``); fixed, so the caches' and block table's shapes never change and
    a compiled draft does not recompile per prompt length (None: sized per request).
    """

    def __init__(
        self,
        target: PagedModel,
        draft: PagedModel,
        *,
        num_speculative_tokens: int = 5,
        temperature: float = 0.0,
        draft_fn: Optional[Callable] = None,
        block_size: int = 16,
        draft_prefill_chunk: Optional[int] = None,
        max_len: Optional[int] = None,
    ) -> None:
        if not isinstance(num_speculative_tokens, int) or num_speculative_tokens <= 0:
            raise ValueError(
                f"num_speculative_tokens={num_speculative_tokens!r} is invalid: "
                "expected a positive int"
            )
        if temperature < 0:
            raise ValueError(f"temperature={temperature!r} is invalid: expected >= 0 (0: greedy)")
        if draft_prefill_chunk is not None and draft_prefill_chunk <= 0:
            raise ValueError(
                f"draft_prefill_chunk={draft_prefill_chunk!r} is invalid: "
                "expected a positive int or None"
            )
        for name, model in (("target", target), ("draft", draft)):
            if not isinstance(model, PagedModel):
                raise ValueError(
                    f"{name}={type(model).__name__} is invalid: expected a model "
                    "with feature_size, kv_cache_shape and forward (PagedModel)"
                )
        if target.feature_size:
            raise ValueError(
                f"target.feature_size={target.feature_size} is invalid: "
                "the target must read tokens only (0)"
            )
        self.aux_layer_ids = getattr(draft, "aux_layer_ids", None)
        if self.aux_layer_ids is not None and not callable(getattr(draft, "combine", None)):
            raise ValueError(
                f"draft={type(draft).__name__} is invalid: it has aux_layer_ids="
                f"{self.aux_layer_ids!r} (EAGLE3) but no combine(aux) method"
            )
        self.target, self.draft = target, draft
        self.draft_fn = draft if draft_fn is None else draft_fn
        self.k = num_speculative_tokens
        self.temperature = float(temperature)
        self.block_size = block_size
        self.draft_prefill_chunk = draft_prefill_chunk
        self.max_len = max_len
        self.device, self.dtype = _model_device_dtype(target)

    # -- helpers --------------------------------------------------------------------------
    def _probs(self, logits: torch.Tensor) -> torch.Tensor:
        return torch.softmax(logits.float() / self.temperature, dim=-1)

    def _pick(self, logits: torch.Tensor, generator: torch.Generator):
        """One token from ``logits [V]`` -> (token [1] on device, probs [V] or None)."""
        if self.temperature == 0:
            return logits.argmax(-1, keepdim=True), None
        probs = self._probs(logits)
        token = torch.multinomial(probs.cpu(), 1, generator=generator).to(self.device)
        return token, probs

    @staticmethod
    def _call(fn, tokens, features, cache: PagedKVCache, step: StepInputs):
        return fn(
            tokens,
            features,
            step.positions,
            cache.key_caches,
            cache.value_caches,
            step.block_table,
            step.seq_lens,
            step.query_start_loc,
            step.slot_mapping,
        )

    def _call_target(self, tokens, no_features, cache: PagedKVCache, step: StepInputs):
        """The target's forward -> ``(logits [T, V], the draft's features of these
        positions [T, F])``: its hidden (EAGLE), ``draft.combine(aux)`` (EAGLE3)."""
        if self.aux_layer_ids is None:
            return self._call(self.target, tokens, no_features, cache, step)
        logits, _, aux = self.target(
            tokens,
            no_features,
            step.positions,
            cache.key_caches,
            cache.value_caches,
            step.block_table,
            step.seq_lens,
            step.query_start_loc,
            step.slot_mapping,
            aux_layer_ids=self.aux_layer_ids,
        )
        return logits, self.draft.combine(aux)

    def _call_draft(self, tokens, features, cache: PagedKVCache, step: StepInputs):
        """The draft's forward with fresh contiguous per-token inputs (no views: a view's
        storage offset and base size would be guarded, recompiling every step), their
        token dimension marked dynamic when it is >= 2."""
        per_token = [t.clone() for t in (tokens, features, step.positions, step.slot_mapping)]
        if tokens.shape[0] >= 2:
            for t in per_token:
                torch._dynamo.mark_dynamic(t, 0)
        tokens, features, positions, slot_mapping = per_token
        return self.draft_fn(
            tokens,
            features,
            positions,
            cache.key_caches,
            cache.value_caches,
            step.block_table,
            step.seq_lens,
            step.query_start_loc,
            slot_mapping,
        )

    def _draft_catch_up(
        self,
        cache: PagedKVCache,
        seq: torch.Tensor,
        features: torch.Tensor,
        end: int,
        nll_start: Optional[int] = None,
    ):
        """Draft forward over positions ``[cache.length, end)`` (position p reads ``seq[p]``
        and ``features[p]``); returns the last position's (logits, hidden) and, with
        ``nll_start``, the mean NLL of the draft's next-token predictions at positions
        ``[nll_start, end - 1)`` (nats per token; position p predicts ``seq[p + 1]``)."""
        chunk = self.draft_prefill_chunk or end
        nll_sum, nll_count = torch.zeros((), device=self.device), 0
        logits = hidden = None
        while cache.length < end:
            start = cache.length
            count = min(chunk, end - start)
            step = cache.step(count)
            logits, hidden = self._call_draft(
                seq[start : start + count], features[start : start + count], cache, step
            )
            if nll_start is not None:
                lo, hi = max(start, nll_start), min(start + count, end - 1)
                if hi > lo:
                    nll_sum = nll_sum + F.cross_entropy(
                        logits[lo - start : hi - start].float(),
                        seq[lo + 1 : hi + 1],
                        reduction="sum",
                    )
                    nll_count += hi - lo
        nll = float(nll_sum) / nll_count if nll_count else None
        return logits[-1], hidden[-1], nll

    # -- the loop -------------------------------------------------------------------------
    @torch.no_grad()
    def generate(
        self, prompt: torch.Tensor, max_new_tokens: int, seed: int = 0, nll_tail: int = 0
    ) -> SpecResult:
        """Decode ``max_new_tokens`` after ``prompt [n]`` (int64 token ids).

        ``nll_tail > 0`` also reports the draft's NLL on the prompt's last
        ``nll_tail`` next-token predictions (computed during its prefill).
        """
        if prompt.dim() != 1 or prompt.numel() == 0:
            raise ValueError(
                f"prompt has shape {tuple(prompt.shape)}: expected a non-empty 1-D "
                "tensor of token ids"
            )
        if not isinstance(max_new_tokens, int) or max_new_tokens <= 0:
            raise ValueError(
                f"max_new_tokens={max_new_tokens!r} is invalid: expected a positive int"
            )
        k, device = self.k, self.device
        generator = torch.Generator().manual_seed(seed)
        n = prompt.numel()
        capacity = n + max_new_tokens + 2 * k + 2
        if self.max_len is not None:
            if capacity > self.max_len:
                raise ValueError(
                    f"max_new_tokens={max_new_tokens} is invalid for a prompt of {n} "
                    f"tokens: {capacity} cache slots (prompt + new + 2K + 2) "
                    f"exceed max_len={self.max_len}"
                )
            capacity = self.max_len
        target_cache = PagedKVCache(
            *self.target.kv_cache_shape, capacity, self.block_size, self.dtype, device, seed=seed
        )
        draft_cache = PagedKVCache(
            *self.draft.kv_cache_shape,
            capacity,
            self.block_size,
            _model_device_dtype(self.draft)[1],
            device,
            seed=seed + 1,
        )
        seq = torch.zeros(capacity, dtype=torch.long, device=device)
        seq[:n] = prompt.to(device)
        no_features = torch.zeros(capacity, 0, device=device, dtype=self.dtype)
        eagle = self.draft.feature_size > 0
        # EAGLE: features[p] = the target's hidden at p - 1 (the draft's input at p, with
        # x[p]); EAGLE3 (shift 1): features[p] = combine(aux[p]), with x[p + 1]
        shift = 1 if self.aux_layer_ids is not None else 0
        offset = 1 - shift  # features[p + offset] <- the target's output at position p
        draft_seq = seq[shift:]
        features = (
            torch.zeros(capacity + 1, self.draft.feature_size, device=device, dtype=self.dtype)
            if eagle
            else no_features
        )

        _sync(device)
        t0 = time.perf_counter()
        logits, hidden = self._call_target(
            seq[:n], no_features[:n], target_cache, target_cache.step(n)
        )
        first, _ = self._pick(logits[-1], generator)
        seq[n : n + 1] = first
        if eagle:
            features[offset : n + offset] = hidden
        _sync(device)
        t1 = time.perf_counter()
        length = n + 1
        draft_logits, draft_hidden, nll = self._draft_catch_up(
            draft_cache,
            draft_seq,
            features,
            length - shift,
            nll_start=max(n - nll_tail - shift, 0) if nll_tail else None,
        )
        _sync(device)
        t2 = time.perf_counter()

        accepted_counts: list[int] = []
        draft_s = target_s = 0.0
        while length - n < max_new_tokens:
            r0 = time.perf_counter()
            if draft_cache.length < length - shift:
                draft_logits, draft_hidden, _ = self._draft_catch_up(
                    draft_cache, draft_seq, features, length - shift
                )
            proposals, draft_probs = [], []
            for j in range(k):
                token, probs = self._pick(draft_logits, generator)
                proposals.append(token)
                draft_probs.append(probs)
                if j + 1 < k:
                    feat = draft_hidden.unsqueeze(0) if eagle else no_features[:1]
                    draft_logits, draft_hidden = self._call_draft(
                        token, feat, draft_cache, draft_cache.step(1)
                    )
                    draft_logits, draft_hidden = draft_logits[-1], draft_hidden[-1]
            draft_tokens = torch.cat(proposals)
            _sync(device)
            r1 = time.perf_counter()
            verify_tokens = torch.cat([seq[length - 1 : length], draft_tokens])
            target_logits, target_hidden = self._call_target(
                verify_tokens,
                no_features[: k + 1],
                target_cache,
                target_cache.step(k + 1),
            )
            if self.temperature == 0:
                accepted, next_token = greedy_verify(draft_tokens[None], target_logits[None])
            else:
                accepted, next_token = rejection_sample(
                    draft_tokens[None].cpu(),
                    torch.stack(draft_probs)[None].cpu(),
                    self._probs(target_logits)[None].cpu(),
                    generator,
                )
            a = int(accepted[0])
            seq[length : length + a] = draft_tokens[:a]
            seq[length + a] = next_token[0].to(device)
            if eagle:
                # the target's outputs at positions length - 1 .. length - 1 + a
                start = length - 1 + offset
                features[start : start + a + 1] = target_hidden[: a + 1]
            _sync(device)
            r2 = time.perf_counter()
            target_cache.truncate(length + a)
            draft_cache.truncate(length - shift if eagle else length + min(a, k - 1))
            length += a + 1
            accepted_counts.append(a)
            draft_s += r1 - r0
            target_s += r2 - r1
        t3 = time.perf_counter()
        return SpecResult(
            tokens=seq[n : n + max_new_tokens].tolist(),
            accepted=accepted_counts,
            num_speculative_tokens=k,
            prompt_len=n,
            target_prefill_s=t1 - t0,
            draft_prefill_s=t2 - t1,
            draft_s=draft_s,
            target_s=target_s,
            decode_s=t3 - t2,
            committed_tokens=length - n - 1,
            draft_nll=nll,
        )


@torch.no_grad()
def target_greedy_decode(
    target: PagedModel, prompt: torch.Tensor, max_new_tokens: int, block_size: int = 16
) -> tuple[list[int], float]:
    """The target alone, greedy, one token per forward on a paged cache:
    ``(tokens, decode tokens per second)`` (the prefill excluded from the rate)."""
    device, dtype = _model_device_dtype(target)
    n = prompt.numel()
    cache = PagedKVCache(*target.kv_cache_shape, n + max_new_tokens + 1, block_size, dtype, device)
    no_features = torch.zeros(n, 0, device=device, dtype=dtype)
    step = cache.step(n)
    logits, _ = target(
        prompt.to(device),
        no_features,
        step.positions,
        cache.key_caches,
        cache.value_caches,
        step.block_table,
        step.seq_lens,
        step.query_start_loc,
        step.slot_mapping,
    )
    token = logits[-1].argmax(-1, keepdim=True)
    out = [token]
    _sync(device)
    start = time.perf_counter()
    for _ in range(max_new_tokens - 1):
        step = cache.step(1)
        logits, _ = target(
            token,
            no_features[:1],
            step.positions,
            cache.key_caches,
            cache.value_caches,
            step.block_table,
            step.seq_lens,
            step.query_start_loc,
            step.slot_mapping,
        )
        token = logits[-1].argmax(-1, keepdim=True)
        out.append(token)
    tokens = torch.cat(out).tolist()
    elapsed = time.perf_counter() - start
    return tokens, (max_new_tokens - 1) / elapsed if elapsed > 0 else 0.0
