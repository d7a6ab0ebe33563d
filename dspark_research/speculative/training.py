"""Training of the study's target and drafts on byte windows of the corpus.

Plain next-byte cross entropy with AdamW, linear warm-up then cosine decay to
10%, fixed seeds (model init and batch order), bf16 autocast on CUDA. The
EAGLE-style draft (``feature_size > 0``) reuses the target's embedding and
``lm_head`` (frozen) and learns from the target's hidden states at its own short
context: input at p is ``[embed(x_p), f_{p-1}]``; loss = CE of its prediction of
``x_{p+1}`` + smooth-L1 between its hidden and the target's ``f_p`` (so its own
hidden can stand in for the target's while it proposes several tokens).
"""

from __future__ import annotations

import dataclasses
import logging
import math
import time
from typing import Callable, Optional

import torch
import torch.nn.functional as F

from dspark_research.speculative.corpus import random_windows
from dspark_research.speculative.lm import TransformerLM, shift_features

logger = logging.getLogger(__name__)

ProgressFn = Callable[[int, int, float], None]
BatchLossFn = Callable[[torch.Tensor], "tuple[torch.Tensor, tuple[torch.Tensor, ...]]"]


@dataclasses.dataclass(frozen=True)
class TrainSpec:
    """``steps`` optimizer steps of ``batch`` windows of ``context`` bytes."""

    steps: int
    batch: int
    context: int
    lr: float = 1e-3
    warmup: int = 50
    weight_decay: float = 0.1
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch", "context"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name}={value!r} is invalid: expected a positive int")


def _lr_at(step: int, spec: TrainSpec) -> float:
    if step < spec.warmup:
        return spec.lr * (step + 1) / spec.warmup
    progress = (step - spec.warmup) / max(spec.steps - spec.warmup, 1)
    return spec.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0))))


def _autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def soft_cross_entropy(logits: torch.Tensor, teacher_logits: torch.Tensor) -> torch.Tensor:
    """Mean over tokens of ``H(softmax(teacher), softmax(logits))`` (nats): distillation on
    the teacher's next-token distributions (``[..., V]`` both)."""
    teacher = F.softmax(teacher_logits.float(), dim=-1)
    return -(teacher * F.log_softmax(logits.float(), dim=-1)).sum(-1).mean()


def _losses(
    model: TransformerLM,
    batch: torch.Tensor,
    target: Optional[TransformerLM],
    teacher: Optional[TransformerLM] = None,
):
    inputs, labels = batch[:, :-1], batch[:, 1:]
    features = target_features = None
    if target is not None:
        with torch.no_grad():
            _, target_features = target.forward_dense(inputs)
        target_features = target_features.float()
        features = shift_features(target_features)
    logits, hidden = model.forward_dense(inputs, features)
    if teacher is not None:
        with torch.no_grad():
            teacher_logits, _ = teacher.forward_dense(inputs)
        ce = soft_cross_entropy(logits, teacher_logits)
    else:
        ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))
    if target is None:
        return ce, ce
    return ce + F.smooth_l1_loss(hidden.float(), target_features), ce


def tie_eagle_to_target(draft: TransformerLM, target: TransformerLM) -> None:
    """Copy the target's embedding and ``lm_head`` into ``draft`` and freeze them."""
    if (
        draft.cfg.hidden_size != target.cfg.hidden_size
        or draft.cfg.feature_size != target.cfg.hidden_size
    ):
        raise ValueError(
            f"draft hidden_size={draft.cfg.hidden_size}, feature_size="
            f"{draft.cfg.feature_size} are invalid: expected both equal to the "
            f"target's hidden_size={target.cfg.hidden_size}"
        )
    draft.embed.weight.data.copy_(target.embed.weight.data)
    draft.lm_head.weight.data.copy_(target.lm_head.weight.data)
    draft.embed.weight.requires_grad_(False)
    draft.lm_head.weight.requires_grad_(False)


def optimize(
    model: torch.nn.Module,
    data: torch.Tensor,
    spec: TrainSpec,
    batch_loss: BatchLossFn,
    *,
    progress: Optional[ProgressFn] = None,
    time_budget_s: Optional[float] = None,
    what: str = "training",
) -> dict:
    """``spec.steps`` AdamW steps on ``model``'s trainable parameters (the schedule of
    :func:`_lr_at`, gradients clipped to norm 1), each on ``spec.batch`` random windows of
    ``spec.context + 1`` bytes of ``data`` (seeded by ``spec.seed``). ``batch_loss(windows)``
    returns ``(loss, (ce, *more))``; every 25 steps each entry of the tuple is recorded
    (``history[i]``) and ``progress(step, steps, ce)`` called. Stops early only when
    ``time_budget_s`` runs out (logged; ``steps_done < steps``)."""
    device = next(model.parameters()).device
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(
        params, lr=spec.lr, betas=(0.9, 0.95), weight_decay=spec.weight_decay
    )
    generator = torch.Generator().manual_seed(spec.seed)
    start = time.perf_counter()
    history: list[list[float]] = []
    step = 0
    for step in range(spec.steps):
        if time_budget_s is not None and time.perf_counter() - start > time_budget_s:
            logger.warning(
                "%s stopped by its time budget (%.0f s) after %d of %d steps",
                what,
                time_budget_s,
                step,
                spec.steps,
            )
            break
        for group in optimizer.param_groups:
            group["lr"] = _lr_at(step, spec)
        windows = random_windows(data, spec.batch, spec.context, generator).to(device)
        with _autocast(device):
            loss, ces = batch_loss(windows)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        optimizer.step()
        if step % 25 == 0 or step == spec.steps - 1:
            history.extend([] for _ in range(len(ces) - len(history)))
            for record, ce in zip(history, ces):
                record.append(float(ce.detach()))
            if progress is not None:
                progress(step + 1, spec.steps, history[0][-1])
    else:
        step = spec.steps
    model.eval()
    return {
        "steps": spec.steps,
        "steps_done": step,
        "batch": spec.batch,
        "context": spec.context,
        "seconds": time.perf_counter() - start,
        "history": history,
    }


def train_lm(
    model: TransformerLM,
    data: torch.Tensor,
    spec: TrainSpec,
    *,
    target: Optional[TransformerLM] = None,
    teacher: Optional[TransformerLM] = None,
    progress: Optional[ProgressFn] = None,
    time_budget_s: Optional[float] = None,
) -> dict:
    """Train ``model`` in place on ``data`` (token ids: uint8 bytes or int64, on the CPU);
    ``target`` given: EAGLE-style training on its hidden states (``target`` is frozen);
    ``teacher`` given: the loss is :func:`soft_cross_entropy` against the teacher's
    next-token distributions instead of the data's next token (distillation).
    Stops early only when ``time_budget_s`` runs out (logged, and recorded as
    ``steps_done < steps``). Returns the training record."""
    for frozen in (target, teacher):
        if frozen is not None:
            frozen.eval()

    def batch_loss(windows):
        loss, ce = _losses(model, windows, target, teacher)
        return loss, (ce,)

    record = optimize(model, data, spec, batch_loss, progress=progress, time_budget_s=time_budget_s)
    history = record.pop("history")
    record["train_ce_every_25_steps"] = history[0] if history else []
    return record


@torch.no_grad()
def eval_loss(
    model: TransformerLM,
    data: torch.Tensor,
    context: int,
    batches: int = 4,
    batch: int = 8,
    target: Optional[TransformerLM] = None,
    seed: int = 1234,
    teacher: Optional[TransformerLM] = None,
) -> float:
    """Held-out next-token cross entropy (nats/token) on random windows of ``context``
    (``teacher`` given: against its distributions, as :func:`train_lm` trains)."""
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    total = 0.0
    for _ in range(batches):
        windows = random_windows(data, batch, context, generator).to(device)
        with _autocast(device):
            _, ce = _losses(model, windows, target, teacher)
        total += float(ce)
    return total / batches
