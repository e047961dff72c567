"""The forward and backward passes of RLTrainer's ``train_step`` and ``sft_step``, over the rank's rows.

Each rank takes its contiguous slice of the batch (``batch.local_rows``), runs the policy, feeds the
per-token logprobs of the response to the configured loss (``loss``) and runs backward, the rows split into
``training.gradient_accumulation_steps`` micro-batches whose gradients add up (each loss weighted by its share
of the rows). What comes back is a :class:`Gradients`: the trainer then clips and applies them (or skips the
optimizer step) and keeps the step count, its metrics and its checkpoints.

A non-finite loss on any rank stops the passes on every rank before their backward (``backward``), so FSDP's
collectives in backward run on all ranks or on none; the trainer then skips the optimizer step and reports why.
"""

from __future__ import annotations

import dataclasses
from typing import Any, NamedTuple

import torch

from forge_nb.actors.training import lora
from forge_nb.actors.training.batch import as_train_batch, local_rows, micro_batches, sft_labels
from forge_nb.actors.training.loss import mean_metrics, rl_loss, sft_loss, text_loss
from forge_nb.actors.training.policy_model import all_ranks
from forge_nb.rl.types import TextTrainBatch

__all__ = ["Gradients", "backward", "rl_gradients", "sft_gradients"]


class Gradients(NamedTuple):
    """What a step's passes left: the loss (mean over micro-batches), its metrics, the response tokens trained,
    and why the optimizer step must be skipped ("" when it must not)."""

    loss: torch.Tensor
    metrics: dict[str, Any]
    tokens: int
    reason: str


def rl_gradients(trainer: Any, batch: Any, targets: Any) -> Gradients:
    """An RL step's passes over the rank's rows of ``batch`` (a TrainBatch, torchforge's ``(inputs, targets)``, or
    a TextTrainBatch) under ``trainer``'s policy, loss and ``training`` section."""
    policy, cfg = trainer._policy(), trainer.train_cfg
    text = isinstance(batch, TextTrainBatch)
    rows = batch if text else as_train_batch(batch, targets)
    local = local_rows(rows, trainer.rank, trainer.world, cfg.local_batch_size)
    policy.module.train()
    losses, metrics, tokens, reason = [], [], 0, ""
    for micro in micro_batches(local, cfg.gradient_accumulation_steps):
        with trainer._autocast():
            if isinstance(micro, TextTrainBatch):
                logits = policy.logits(micro.input_ids)
                loss, m = text_loss(trainer.loss_fn, logits, micro, cfg.logits_temperature)
                tokens += int(micro.target_mask.sum())
            else:
                tokens_kept, request_len = policy.without_shared_padding(micro.tokens, micro.request_len)
                micro = dataclasses.replace(micro, tokens=tokens_kept, request_len=request_len)
                if trainer.lora is not None:  # its episodes carry no reference: the base's, for the whole batch
                    micro = lora.with_base_reference(policy, micro, cfg.logits_temperature)
                logits = policy.logits(micro.tokens, micro.request_len)
                loss, m = rl_loss(trainer.loss_fn, logits, micro, cfg.logits_temperature, trainer.step)
                tokens += int(micro.response_mask.sum())
        del logits  # free it before backward, whose peak it would otherwise raise
        reason = backward(loss, len(micro) / len(local), trainer.world)
        losses.append(loss.detach())
        metrics.append(m)
        if reason:
            break
    return Gradients(torch.stack(losses).mean(), mean_metrics(metrics), tokens, reason)


def sft_gradients(trainer: Any, batch: Any) -> Gradients:
    """A supervised step's pass: token-mean cross-entropy on the response tokens of a TrainBatch, or on ``labels``
    (aligned with ``tokens``, -100 ignored) of a ``{"tokens", "labels"}`` dict, over the rank's rows."""
    policy = trainer._policy()
    tokens, labels, request_len = sft_labels(batch)
    tokens = local_rows(tokens, trainer.rank, trainer.world, trainer.train_cfg.local_batch_size)
    labels = local_rows(labels, trainer.rank, trainer.world, None)
    policy.module.train()
    with trainer._autocast():
        logits = policy.logits(tokens, request_len)
    loss = sft_loss(logits, labels)
    del logits
    reason = backward(loss, 1.0, trainer.world)
    return Gradients(loss.detach(), {}, int((labels != -100).sum()), reason)


def backward(loss: torch.Tensor, weight: float, world: int) -> str:
    """Backward of ``weight * loss``, or the reason it was not run. Every rank agrees on the reason, so
    FSDP's collectives in backward run on all ranks or on none."""
    if not all_ranks(bool(torch.isfinite(loss.detach())), world):
        return "nonfinite_loss"
    (loss * weight).backward()
    return ""
