"""A trained EAGLE3 draft in the layout of vLLM's ``Eagle3LlamaForCausalLM`` (method
``eagle3``), its training on a target's aux hidden states, and its HF export.

What vLLM computes (``vllm/model_executor/models/llama_eagle3.py`` and the EAGLE
proposer ``vllm/v1/spec_decode/eagle.py``; the report of the ``eagle3`` branch cites
the lines), and what :class:`Eagle3Draft` computes the same way:

- the target returns **aux hidden states** for ``aux_layer_ids``: for id ``i`` the
  residual stream entering target layer ``i`` (``hidden + residual``, before any
  norm), i.e. the output of layer ``i - 1``; in ascending layer order, concatenated
  to ``[T, len(ids) * target_hidden]``. Id 0 (the embedding) is refused here: vLLM
  0.26's functionalization pass fails on it.
- the draft's step at position ``p`` reads token ``x[p + 1]`` and a hidden ``h[p]``
  and predicts ``x[p + 2]``. First draft step: ``h = fc(aux)``; later steps: ``h`` =
  the draft's own **pre-norm** output of the previous step.
- its one decoder layer (``midlayer``): ``residual = h``; ``a = cat[input_layernorm(
  embed(x)), hidden_norm(h)]`` (``2 * hidden`` wide) -> attention (q/k/v projections
  from ``2 * hidden``, RoPE, causal) -> ``r = o_proj(.) + residual`` -> ``pre = r +
  mlp(post_attention_layernorm(r))``; logits ``lm_head(norm(pre))``; ``pre`` is the
  hidden fed back.
- ``embed_tokens`` is the target's (the checkpoint has none, vLLM shares the
  target's); ``lm_head`` is the draft's own (in the checkpoint; vLLM shares the
  target's instead only when they are equal). ``draft_vocab_size == vocab_size`` and
  no ``d2t`` tensor: the draft's token ids are the target's.

Decoding: :class:`Eagle3Draft` is also a
:class:`~dspark_research.speculative.protocol.PagedModel` (``forward`` on a paged KV
cache through the ``dspark`` attention ops, so ``compile_draft`` windows it);
:class:`~dspark_research.speculative.loop.SpeculativeDecoder` drafts with it as vLLM's
``eagle3`` proposer does (see the loop's docstring).

Training (:func:`train_eagle3`): cross entropy of step 1 (teacher forcing on the
target's aux states) plus, with ``unroll=2``, of an unrolled second step fed by the
draft's own pre-norm hidden (EAGLE3's training-time test), whose query at position
``j + 1`` sees step 1's keys at ``0..j`` and its own key, as in vLLM's second draft
step. The embedding is the target's, frozen; everything else trains (``lm_head``
starts from the target's).
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Optional, Sequence

import torch
import torch.nn.functional as F
from torch import nn

import dspark_compile.ops  # noqa: F401  (torch.ops.dspark.*)
from dspark_compile.models.layers import RMSNorm, apply_rope
from dspark_research.speculative.corpus import random_windows
from dspark_research.speculative.hf_export import (
    TRAINING_CONTEXT_KEY,
    block_state,
    config_of,
    llama_config,
    load_block,
    read_checkpoint,
    save_checkpoint,
)
from dspark_research.speculative.lm import LMConfig, TransformerLM
from dspark_research.speculative.training import (
    TrainSpec,
    _autocast,
    optimize,
    soft_cross_entropy,
)

logger = logging.getLogger(__name__)

ARCHITECTURE = "LlamaForCausalLMEagle3"
STEP2_WEIGHT = 0.8  # the unrolled step's share of the loss (EAGLE3 decays later steps)


def check_aux_layer_ids(aux_layer_ids: Sequence[int], target_layers: Optional[int] = None):
    """``aux_layer_ids`` as a tuple, or ``ValueError`` naming what is allowed."""
    ids = tuple(aux_layer_ids)
    if (
        not ids
        or any(not isinstance(i, int) or isinstance(i, bool) for i in ids)
        or list(ids) != sorted(set(ids))
        or ids[0] < 1
    ):
        raise ValueError(
            f"aux_layer_ids={list(aux_layer_ids)!r} is invalid: expected strictly ascending "
            "ints >= 1 (vLLM collects them in layer order; id 0, the embedding, fails in "
            "vLLM 0.26)"
        )
    if target_layers is not None and ids[-1] >= target_layers:
        raise ValueError(
            f"aux_layer_ids={list(ids)!r} is invalid for a {target_layers}-layer target: "
            f"expected ids < {target_layers} (id i is the input of target layer i)"
        )
    return ids


def default_aux_layer_ids(num_layers: int) -> tuple[int, ...]:
    """vLLM's default ``(2, L // 2, L - 3)`` where those are distinct and >= 1, else
    ``1 .. min(3, L - 1)`` (small targets)."""
    ids = (2, num_layers // 2, num_layers - 3)
    if len(set(ids)) == 3 and min(ids) >= 1 and list(ids) == sorted(ids):
        return ids
    return tuple(range(1, min(3, num_layers - 1) + 1))


class Eagle3Draft(nn.Module):
    """One-layer EAGLE3 draft (vLLM ``Eagle3LlamaForCausalLM``). ``cfg``: its shape
    (``num_layers`` must be 1, ``feature_size`` 0); ``aux_layer_ids``: the target
    layers whose inputs it reads; ``target_hidden_size``: their width. ``forward_dense``
    (training, references) and the paged ``forward`` (the speculative loop) share the
    weights."""

    def __init__(
        self,
        cfg: LMConfig,
        aux_layer_ids: Sequence[int],
        target_hidden_size: int,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if cfg.num_layers != 1:
            raise ValueError(
                f"num_layers={cfg.num_layers} is invalid: the EAGLE3 draft has exactly "
                "1 layer (vLLM's midlayer)"
            )
        if cfg.feature_size:
            raise ValueError(
                f"feature_size={cfg.feature_size} is invalid: expected 0 (the EAGLE3 "
                "draft's input width comes from aux_layer_ids and target_hidden_size)"
            )
        if not isinstance(target_hidden_size, int) or target_hidden_size <= 0:
            raise ValueError(
                f"target_hidden_size={target_hidden_size!r} is invalid: expected a positive int"
            )
        self.cfg = cfg
        self.aux_layer_ids = check_aux_layer_ids(aux_layer_ids)
        self.target_hidden_size = target_hidden_size
        h = cfg.hidden_size
        self.q_size = cfg.num_heads * cfg.head_dim
        self.kv_size = cfg.num_kv_heads * cfg.head_dim
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.embed = nn.Embedding(cfg.vocab_size, h)
            self.fc = nn.Linear(len(self.aux_layer_ids) * target_hidden_size, h, bias=False)
            self.hidden_norm = RMSNorm(h, cfg.eps)
            self.input_norm = RMSNorm(h, cfg.eps)
            self.qkv = nn.Linear(2 * h, self.q_size + 2 * self.kv_size, bias=False)
            self.o_proj = nn.Linear(self.q_size, h, bias=False)
            self.mlp_norm = RMSNorm(h, cfg.eps)
            self.gate_up = nn.Linear(h, 2 * cfg.intermediate_size, bias=False)
            self.down = nn.Linear(cfg.intermediate_size, h, bias=False)
            self.norm = RMSNorm(h, cfg.eps)
            self.lm_head = nn.Linear(h, cfg.vocab_size, bias=False)
            for module in self.modules():
                if isinstance(module, (nn.Linear, nn.Embedding)):
                    nn.init.normal_(module.weight, std=0.02)

    # -- pieces ---------------------------------------------------------------------------
    def combine(self, aux: torch.Tensor) -> torch.Tensor:
        """``aux [..., n_aux * target_hidden]`` -> the first step's hidden ``[..., H]``
        (vLLM's ``combine_hidden_states``)."""
        return self.fc(aux.to(self.fc.weight.dtype))

    def _flat_qkv(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor):
        """``tokens [T]``, ``hidden [T, H]``, ``positions [T]`` -> q ``[T, Hq, D]``, k, v
        ``[T, Hkv, D]`` (RoPE on q, k): attention over ``cat[input_norm(embed(tokens)),
        hidden_norm(hidden)]``."""
        cfg = self.cfg
        x = torch.cat([self.input_norm(self.embed(tokens)), self.hidden_norm(hidden)], dim=-1)
        q, k, v = self.qkv(x).split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = apply_rope(q.reshape(-1, cfg.num_heads, cfg.head_dim), positions, cfg.rope_theta)
        k = apply_rope(k.reshape(-1, cfg.num_kv_heads, cfg.head_dim), positions, cfg.rope_theta)
        return q, k, v.reshape(-1, cfg.num_kv_heads, cfg.head_dim)

    def _qkv(self, tokens: torch.Tensor, hidden: torch.Tensor, positions: torch.Tensor):
        """``tokens [B, S]``, ``hidden [B, S, H]``, ``positions [S]`` -> q ``[B, Hq, S, D]``,
        k, v ``[B, Hkv, S, D]``."""
        batch, seq = tokens.shape
        qkv = self._flat_qkv(
            tokens.reshape(-1), hidden.reshape(batch * seq, -1), positions.repeat(batch)
        )
        return tuple(t.reshape(batch, seq, -1, self.cfg.head_dim).transpose(1, 2) for t in qkv)

    def _finish(self, attn: torch.Tensor, residual: torch.Tensor):
        """Attention output ``[..., Hq * D]`` and the layer's residual (its input hidden,
        ``[..., H]``) -> ``(logits [..., V] fp32, pre-norm hidden [..., H])``."""
        r = self.o_proj(attn) + residual
        gate, up = self.gate_up(self.mlp_norm(r)).chunk(2, dim=-1)
        pre = r + self.down(F.silu(gate) * up)
        return self.lm_head(self.norm(pre)).float(), pre

    @staticmethod
    def _heads_last(attn: torch.Tensor) -> torch.Tensor:
        """SDPA's ``[B, Hq, S, D]`` -> ``[B, S, Hq * D]``."""
        batch, heads, seq, dim = attn.shape
        return attn.transpose(1, 2).reshape(batch, seq, heads * dim)

    # -- forwards -------------------------------------------------------------------------
    def forward_dense(
        self,
        tokens: torch.Tensor,
        hidden: torch.Tensor,
        start: int = 0,
        attn_mask: Optional[torch.Tensor] = None,
    ):
        """One causal pass: ``tokens [B, S]`` (``x[p + 1]`` at slot p), ``hidden [B, S, H]``
        (``fc(aux)[p]``, or the draft's own pre-norm output) at positions ``start ..
        start + S - 1`` -> ``(logits [B, S, V] fp32, pre-norm hidden [B, S, H])``.
        ``attn_mask``: ``[S, S]`` bool (True: query i attends key j) instead of causal,
        e.g. causal and a sliding window."""
        positions = torch.arange(start, start + tokens.shape[1], device=tokens.device)
        q, k, v = self._qkv(tokens, hidden, positions)
        if attn_mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask, enable_gqa=True)
        return self._finish(self._heads_last(out), hidden)

    def forward_unrolled(self, tokens: torch.Tensor, aux: torch.Tensor, next_tokens: torch.Tensor):
        """Two draft steps, as vLLM runs them. Step 1: ``tokens [B, S]`` with ``fc(aux
        [B, S, n * Ht])`` at positions ``0..S-1``. Step 2: ``next_tokens [B, S]`` (the
        token after each step-1 token) with step 1's own pre-norm hidden at positions
        ``1..S``; slot j attends step 1's keys ``0..j`` and its own. Returns
        ``(logits1, logits2)``, each ``[B, S, V]`` fp32."""
        seq = tokens.shape[1]
        device = tokens.device
        hidden = self.combine(aux)
        positions = torch.arange(seq, device=device)
        q1, k1, v1 = self._qkv(tokens, hidden, positions)
        out1 = F.scaled_dot_product_attention(q1, k1, v1, is_causal=True, enable_gqa=True)
        logits1, pre1 = self._finish(self._heads_last(out1), hidden)
        q2, k2, v2 = self._qkv(next_tokens, pre1, positions + 1)
        causal = torch.ones(seq, seq, dtype=torch.bool, device=device).tril()
        own = torch.eye(seq, dtype=torch.bool, device=device)
        mask = torch.cat([causal, own], dim=1)
        out2 = F.scaled_dot_product_attention(
            q2, torch.cat([k1, k2], dim=2), torch.cat([v1, v2], dim=2), mask, enable_gqa=True
        )
        logits2, _ = self._finish(self._heads_last(out2), pre1)
        return logits1, logits2

    # -- the speculative loop's paged protocol (PagedModel) -------------------------------
    @property
    def feature_size(self) -> int:
        """Width of the hidden the paged forward reads beside each token: ``hidden_size``
        (``combine(aux)`` at positions the target verified, the draft's own pre-norm
        output while it proposes)."""
        return self.cfg.hidden_size

    @property
    def kv_cache_shape(self) -> tuple[int, int, int]:
        """(num_layers = 1, num_kv_heads, head_dim) of the paged KV cache it writes."""
        return 1, self.cfg.num_kv_heads, self.cfg.head_dim

    def forward(
        self,
        tokens: torch.Tensor,
        features: torch.Tensor,
        positions: torch.Tensor,
        key_caches: Sequence[torch.Tensor],
        value_caches: Sequence[torch.Tensor],
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
        query_start_loc: torch.Tensor,
        slot_mapping: torch.Tensor,
    ):
        """Paged forward (the loop's :class:`~dspark_research.speculative.protocol.PagedModel`,
        the attention through ``dspark.reshape_and_cache`` / ``dspark.paged_attention`` as
        :class:`~dspark_research.speculative.lm.Block`'s, so ``backend="dspark"`` windows it).

        ``tokens [T]`` int64 (vLLM's shifted ids: ``x[p + 1]`` at position p),
        ``features [T, H]`` (``combine(aux[p])`` or the draft's pre-norm output at p - 1),
        ``positions [T]``, one ``[num_blocks, b, Hkv, D]`` key/value cache in each list,
        ``block_table``, ``seq_lens``, ``query_start_loc``, ``slot_mapping`` as in
        :meth:`TransformerLM.forward`. Returns ``(logits [T, V] fp32, pre-norm hidden
        [T, H])``; the hidden is what vLLM feeds the next draft step.
        """
        hidden = features.to(self.fc.weight.dtype)
        q, k, v = self._flat_qkv(tokens, hidden, positions)
        torch.ops.dspark.reshape_and_cache(k, v, key_caches[0], value_caches[0], slot_mapping)
        out = torch.ops.dspark.paged_attention(
            q,
            key_caches[0],
            value_caches[0],
            block_table,
            seq_lens,
            query_start_loc,
            self.cfg.head_dim**-0.5,
            True,
        )
        return self._finish(out.reshape(-1, self.q_size), hidden)


@torch.no_grad()
def target_aux(
    target: TransformerLM,
    tokens: torch.Tensor,
    aux_layer_ids: Sequence[int],
    with_logits: bool = False,
):
    """The target's aux hidden states as vLLM's Llama returns them: for each id i
    (ascending) the residual stream entering layer i, concatenated: ``tokens [B, S]``
    -> ``[B, S, n * H]``; ``with_logits``: ``(aux, the target's logits [B, S, V] fp32)``."""
    ids = check_aux_layer_ids(aux_layer_ids, target.cfg.num_layers)
    hidden = target._input(tokens, None)
    out = []
    for i, layer in enumerate(target.layers):
        if i in ids:
            out.append(hidden)
        hidden = layer.forward_dense(hidden)
    aux = torch.cat(out, dim=-1)
    if not with_logits:
        return aux
    return aux, target.lm_head(target.norm(hidden)).float()


def tie_eagle3_to_target(draft: Eagle3Draft, target: TransformerLM) -> None:
    """Copy the target's embedding (frozen) and ``lm_head`` (trainable start) into
    ``draft``; the shapes must match the target's."""
    if (
        draft.cfg.vocab_size != target.cfg.vocab_size
        or draft.cfg.hidden_size != target.cfg.hidden_size
        or draft.target_hidden_size != target.cfg.hidden_size
    ):
        raise ValueError(
            f"draft vocab_size={draft.cfg.vocab_size}, hidden_size={draft.cfg.hidden_size}, "
            f"target_hidden_size={draft.target_hidden_size} are invalid: expected the "
            f"target's vocab_size={target.cfg.vocab_size} and hidden_size="
            f"{target.cfg.hidden_size}"
        )
    check_aux_layer_ids(draft.aux_layer_ids, target.cfg.num_layers)
    draft.embed.weight.data.copy_(target.embed.weight.data)
    draft.embed.weight.requires_grad_(False)
    draft.lm_head.weight.data.copy_(target.lm_head.weight.data)


def _losses(
    draft: Eagle3Draft,
    target: TransformerLM,
    windows: torch.Tensor,
    unroll: int,
    distill: bool = False,
):
    """``windows [B, C + 1]`` -> (loss, step-1 CE, step-2 CE or None). The target reads
    ``x[0..C-1]``; step 1 at slot p (``p < C - 2``) reads ``x[p+1]`` and predicts
    ``x[p+2]``; step 2 reads ``x[p+2]`` and predicts ``x[p+3]`` (positions < C).
    ``distill``: the CE is against the target's own next-token distributions at those
    positions (:func:`soft_cross_entropy`) instead of the window's tokens."""
    context = windows.shape[1] - 1
    seq = context - 2
    aux, teacher = target_aux(target, windows[:, :context], draft.aux_layer_ids, distill), None
    if distill:
        aux, teacher = aux
    aux = aux[:, :seq].float()
    tokens = windows[:, 1 : seq + 1]
    vocab = draft.cfg.vocab_size

    def ce(logits, step):  # step s at slot p predicts x[p + s + 1]
        if teacher is not None:
            return soft_cross_entropy(logits, teacher[:, step : seq + step])
        labels = windows[:, step + 1 : seq + step + 1]
        return F.cross_entropy(logits.reshape(-1, vocab), labels.reshape(-1))

    if unroll == 1:
        logits1, _ = draft.forward_dense(tokens, draft.combine(aux))
        ce1 = ce(logits1, 1)
        return ce1, ce1, None
    logits1, logits2 = draft.forward_unrolled(tokens, aux, windows[:, 2 : seq + 2])
    ce1, ce2 = ce(logits1, 1), ce(logits2, 2)
    return ce1 + STEP2_WEIGHT * ce2, ce1, ce2


def _check_unroll(unroll) -> None:
    if unroll not in (1, 2):
        raise ValueError(f"unroll={unroll!r} is invalid: expected 1 or 2 (draft steps trained)")


def train_eagle3(
    draft: Eagle3Draft,
    target: TransformerLM,
    data: torch.Tensor,
    spec: TrainSpec,
    *,
    unroll: int = 2,
    distill: bool = False,
    progress=None,
    time_budget_s: Optional[float] = None,
) -> dict:
    """Train ``draft`` in place on ``target``'s aux states of byte windows of ``data``
    (``spec.context`` target positions per window; AdamW, the schedule of
    :func:`~dspark_research.speculative.training.train_lm`; ``distill``: against the
    target's next-token distributions, see :func:`_losses`). Returns the training
    record (``steps_done < steps`` when ``time_budget_s`` ran out)."""
    _check_unroll(unroll)
    if spec.context < 4:
        raise ValueError(f"context={spec.context} is invalid: expected >= 4 for EAGLE3 training")
    target.eval()

    def batch_loss(windows):
        loss, ce1, ce2 = _losses(draft, target, windows, unroll, distill)
        return loss, (ce1,) if ce2 is None else (ce1, ce2)

    record = optimize(
        draft,
        data,
        spec,
        batch_loss,
        progress=progress,
        time_budget_s=time_budget_s,
        what="EAGLE3 training",
    )
    history = record.pop("history")
    record["unroll"] = unroll
    record["distill"] = distill
    record["train_ce_every_25_steps"] = history[0] if history else []
    record["train_step2_ce_every_25_steps"] = history[1] if len(history) > 1 else []
    return record


@torch.no_grad()
def eval_eagle3(
    draft: Eagle3Draft,
    target: TransformerLM,
    data: torch.Tensor,
    context: int,
    batches: int = 4,
    batch: int = 8,
    seed: int = 1234,
    distill: bool = False,
) -> dict:
    """Held-out next-byte cross entropy (nats/byte) of step 1 (``step1``, comparable
    to the other models' at the same ``context``) and of the unrolled step 2
    (``step2``), on random windows of ``data``."""
    device = next(draft.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    total1 = total2 = 0.0
    for _ in range(batches):
        windows = random_windows(data, batch, context, generator).to(device)
        with _autocast(device):
            _, ce1, ce2 = _losses(draft, target, windows, 2, distill)
        total1, total2 = total1 + float(ce1), total2 + float(ce2)
    return {"step1": total1 / batches, "step2": total2 / batches}


# ---------------------------------------------------------------- HF checkpoint
def eagle3_config(
    draft: Eagle3Draft,
    *,
    max_position_embeddings: int,
    training_context: Optional[int] = None,
    extra: Optional[dict] = None,
) -> dict:
    """The ``config.json`` vLLM reads as ``Eagle3LlamaForCausalLM``: a Llama config with
    one layer, ``draft_vocab_size`` (= ``vocab_size``), ``target_hidden_size`` and the aux
    layer ids both at the top level and in ``eagle_config`` (vLLM 0.26's V1 runner reads
    the latter, its V2 runner the former)."""
    config = llama_config(draft.cfg, max_position_embeddings=max_position_embeddings)
    ids = list(draft.aux_layer_ids)
    config.update(
        {
            "architectures": [ARCHITECTURE],
            "draft_vocab_size": draft.cfg.vocab_size,
            "target_hidden_size": draft.target_hidden_size,
            "eagle_aux_hidden_state_layer_ids": ids,
            "eagle_config": {"eagle_aux_hidden_state_layer_ids": ids},
            "dspark_layout": "vLLM Eagle3LlamaForCausalLM (method 'eagle3'): fc over the "
            "target's aux hidden states, midlayer (qkv over [input_layernorm(embed), "
            "hidden_norm(hidden)]), norm, own lm_head; embed_tokens shared from the target; "
            "no d2t (draft vocab = target vocab)",
        }
    )
    if training_context is not None:
        config[TRAINING_CONTEXT_KEY] = training_context
    config.update(extra or {})
    return config


def eagle3_state_dict(draft: Eagle3Draft) -> dict[str, torch.Tensor]:
    """The checkpoint's tensors (names as vLLM's ``Eagle3LlamaForCausalLM`` loads them;
    no ``embed_tokens``, no ``d2t``)."""
    if not isinstance(draft, Eagle3Draft):
        raise ValueError(f"draft={type(draft).__name__} is invalid: expected an Eagle3Draft")
    m = "midlayer."
    out = {
        "fc.weight": draft.fc.weight,
        m + "hidden_norm.weight": draft.hidden_norm.weight,
        m + "input_layernorm.weight": draft.input_norm.weight,
        **block_state(draft, m),
        "norm.weight": draft.norm.weight,
        "lm_head.weight": draft.lm_head.weight,
    }
    return {name: t.detach().float().cpu().contiguous() for name, t in out.items()}


def export_eagle3(
    draft: Eagle3Draft,
    path: Path,
    *,
    max_position_embeddings: int,
    training_context: int,
    extra: Optional[dict] = None,
) -> Path:
    """Write ``path/config.json`` (:func:`eagle3_config`) and ``path/model.safetensors``
    (:func:`eagle3_state_dict`)."""
    return save_checkpoint(
        path,
        eagle3_state_dict(draft),
        eagle3_config(
            draft,
            max_position_embeddings=max_position_embeddings,
            training_context=training_context,
            extra=extra,
        ),
    )


@torch.no_grad()
def load_eagle3(path: Path, target: TransformerLM) -> Eagle3Draft:
    """The draft :func:`export_eagle3` wrote (eval, frozen), with ``target``'s
    embedding (as vLLM shares it)."""
    config, state = read_checkpoint(path)
    if config.get("architectures") != [ARCHITECTURE]:
        raise ValueError(
            f"{path}: architectures={config.get('architectures')!r} is invalid: "
            f"expected [{ARCHITECTURE!r}]"
        )
    if config.get("draft_vocab_size", config["vocab_size"]) != config["vocab_size"]:
        raise ValueError(
            f"{path}: draft_vocab_size={config['draft_vocab_size']} is invalid: expected "
            f"vocab_size={config['vocab_size']} (no d2t mapping)"
        )
    cfg = config_of(config)
    draft = Eagle3Draft(
        cfg, config["eagle_aux_hidden_state_layer_ids"], config["target_hidden_size"]
    )
    tie_eagle3_to_target(draft, target)
    m = "midlayer."
    draft.fc.weight.copy_(state["fc.weight"])
    draft.hidden_norm.weight.copy_(state[m + "hidden_norm.weight"])
    draft.input_norm.weight.copy_(state[m + "input_layernorm.weight"])
    load_block(draft, state, m)
    draft.norm.weight.copy_(state["norm.weight"])
    draft.lm_head.weight.copy_(state["lm_head.weight"])
    return draft.eval().requires_grad_(False)
