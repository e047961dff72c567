"""The trainer's two Tinker-shaped calls: ``forward_backward`` adds the gradients of a loss over Datums, and
``optim_step`` applies what has been added (the Tinker API's training calls; forge_nb's own ``train_step`` does both
at once).

A Datum here is plain data, what a Tinker server hands the trainer: ``{"tokens": [int, ...], "inputs": {name:
values}}``, ``inputs`` holding the loss's ``loss_fn_inputs`` (``target_tokens``, ``weights``, ``logprobs``,
``advantages``), each as long as ``tokens``: position i of ``tokens`` predicts ``target_tokens[i]`` (Tinker's
next-token alignment). The Datums of one call go through the model together, left-padded with the pad token and
masked; the losses are sums (``forge_nb.rl.losses.tinker``), so padding adds nothing.

Gradients from every ``forward_backward`` since the last ``optim_step`` add up, as Tinker documents. ``optim_step``
sets the optimizer's hyperparameters to the call's Adam parameters (Tinker's ``AdamParams``: ``learning_rate``,
``beta1``, ``beta2``, ``eps``, ``weight_decay`` decoupled, ``grad_clip_norm`` with 0 for none), steps, and clears
the gradients; a non-finite gradient norm skips the step (reported, never raised), as ``train_step`` does.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch

from forge_nb.actors.training.loss import clip_and_step
from forge_nb.rl import compute_logprobs
from forge_nb.rl.losses.tinker import needed_inputs, tinker_loss

__all__ = ["AdamStep", "datum_batch", "forward_backward", "optim_step"]


@dataclass(frozen=True, slots=True)
class AdamStep:
    """Tinker's ``AdamParams``, with its defaults."""

    learning_rate: float = 1e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-12
    weight_decay: float = 0.0
    grad_clip_norm: float = 0.0

    def __post_init__(self) -> None:
        for name in ("learning_rate", "eps", "weight_decay", "grad_clip_norm"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0:
                raise ValueError(f"adam_params.{name}={value!r}: a number >= 0")
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
                raise ValueError(f"adam_params.{name}={value!r}: a number in [0, 1)")


def datum_batch(datums: list[dict[str, Any]], loss_fn: str, pad_id: int
                ) -> tuple[torch.Tensor, torch.Tensor, dict[str, torch.Tensor], list[int]]:
    """The Datums as one left-padded batch: tokens [B, T], the mask of real positions, each input the loss reads
    [B, T] (``target_tokens`` long, the others float32, zero on padding), and each Datum's length. A Datum whose
    inputs are missing or not as long as its tokens is a ValueError naming it."""
    names = needed_inputs(loss_fn)
    if not datums:
        raise ValueError("forward_backward: no Datums")
    lengths = []
    for i, datum in enumerate(datums):
        tokens, inputs = datum.get("tokens"), datum.get("inputs") or {}
        if not isinstance(tokens, list | tuple) or not tokens:
            raise ValueError(f"datum {i}: its model input holds no tokens")
        missing = [n for n in names if n not in inputs]
        if missing:
            raise ValueError(f"datum {i}: loss_fn={loss_fn!r} needs loss_fn_inputs {list(names)}; {missing} missing")
        for name in names:
            if len(inputs[name]) != len(tokens):
                raise ValueError(f"datum {i}: loss_fn_inputs[{name!r}] has {len(inputs[name])} values for "
                                 f"{len(tokens)} input tokens; each position's input goes with the token it follows")
        lengths.append(len(tokens))
    width = max(lengths)
    batch = torch.full((len(datums), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(datums), width), dtype=torch.long)
    inputs = {n: torch.zeros((len(datums), width), dtype=torch.long if n == "target_tokens" else torch.float32)
              for n in names}
    for row, (datum, n) in enumerate(zip(datums, lengths, strict=True)):
        batch[row, width - n:] = torch.as_tensor(datum["tokens"], dtype=torch.long)
        mask[row, width - n:] = 1
        for name in names:
            inputs[name][row, width - n:] = torch.as_tensor(datum["inputs"][name], dtype=inputs[name].dtype)
    return batch, mask, inputs, lengths


def forward_backward(trainer: Any, datums: list[dict[str, Any]], loss_fn: str, config: dict[str, Any] | None,
                     backward: bool) -> dict[str, Any]:
    """The loss of ``loss_fn`` over ``datums`` under the trainer's policy (its adapter active), its gradients added
    to those already there when ``backward``; returns each Datum's target logprobs and the metrics (``loss:sum``).
    A non-finite loss adds no gradient and says so (``skipped:nonfinite_loss``)."""
    if trainer.world > 1:
        raise ValueError("forward_backward: the Tinker calls train a one-proc trainer (a LoRA run's); this one has "
                         f"{trainer.world} procs")
    policy = trainer._policy()
    tokens, mask, inputs, lengths = datum_batch(datums, loss_fn, policy.pad_id or 0)
    policy.module.train(backward)
    with nullcontext() if backward else torch.no_grad(), trainer._autocast():
        logits = policy.logits(tokens, attention_mask=mask)
        vocab = logits.shape[-1]
        if int(inputs["target_tokens"].max()) >= vocab or int(inputs["target_tokens"].min()) < 0:
            raise ValueError(f"forward_backward: a target token is outside the model's vocabulary of {vocab}")
        lp = compute_logprobs(logits, inputs["target_tokens"].to(logits.device)) * mask.to(logits.device)
        del logits
        loss, metrics = tinker_loss(loss_fn, lp, {k: v.to(lp.device) for k, v in inputs.items()}, config)
    if backward:
        if math.isfinite(metrics["loss:sum"]):
            loss.backward()
        else:
            metrics["skipped:nonfinite_loss"] = 1.0
    lp = lp.detach().float().cpu()
    return {"logprobs": [lp[row, lp.shape[1] - n:] for row, n in enumerate(lengths)], "metrics": metrics}


def optim_step(optimizer: Any, adam: AdamStep) -> dict[str, float]:
    """Apply the gradients added since the last step with ``adam``'s hyperparameters; returns the step's metrics
    (``skipped:sum`` 1.0 where a non-finite gradient norm skipped it: the trainer counts the others)."""
    if not type(optimizer).__name__.startswith("Adam"):
        raise ValueError(f"optim_step(adam_params): this trainer's optimizer is {type(optimizer).__name__}; "
                         "create it with optimizer={'name': 'AdamW'}")
    for group in optimizer.param_groups:
        group.update(lr=adam.learning_rate, betas=(adam.beta1, adam.beta2), eps=adam.eps,
                     weight_decay=adam.weight_decay)
    grad_norm = clip_and_step(optimizer, adam.grad_clip_norm)
    return {"grad_norm:mean": grad_norm, "learning_rate:mean": adam.learning_rate,
            "skipped:sum": float(not math.isfinite(grad_norm))}
