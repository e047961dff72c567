"""RLTrainer's objectives: the configured forge_nb.rl policy loss (or torchforge's kind) and SFT cross-entropy.

A loss is given by name (``forge_nb.rl.make_loss(name, **loss_config)``) or as a callable. Callables with
forge_nb's signature ``(logprobs, ref_logprobs, generator_logprobs, advantages, mask, logits=None)``
get per-token logprobs of the response; callables whose first parameter is ``logits`` are torchforge's
(``simple_grpo_loss(logits, response, ref_logprobs, advantages, padding_mask)``) and get the whole
sequence's logits and the seed's target names, so code written for ``apps/grpo/main.py`` keeps working.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import torch

from forge_nb.rl import TrainBatch, compute_logprobs, entropy_from_logits

__all__ = ["loss_function", "rl_loss", "sft_loss"]

LossFn = Callable[..., Any]


def loss_function(loss: str | LossFn, loss_config: Mapping[str, Any] | None) -> LossFn:
    """A loss by name configured by ``loss_config``, or the callable given."""
    from forge_nb.rl import make_loss

    if isinstance(loss, str):
        return make_loss(loss, **dict(loss_config or {}))
    if not callable(loss):
        raise ValueError(f"loss={loss!r}: a loss name such as 'grpo', or a callable with the rl loss signature")
    if loss_config:
        raise ValueError("loss_config configures a loss given by name; configure your callable yourself")
    return loss


def rl_loss(
    loss_fn: LossFn, logits: torch.Tensor, batch: TrainBatch, temperature: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """(loss, metrics) of ``batch`` under ``logits`` [B, L, V] of its whole sequences.

    Logprobs, entropy and the seed's logits are all of ``logits / temperature``: the distribution the
    generator sampled from. Metrics gain "entropy" (when the loss gave none) and "kl" (= kl/k3).
    """
    dev, req = logits.device, batch.request_len
    response_logits = logits[:, req - 1 : -1].float() / temperature
    response, mask = batch.response.to(dev), batch.response_mask.to(dev)
    ref = batch.ref_logprobs.to(dev) if batch.has_ref_logprobs else None
    gen = batch.generator_logprobs.to(dev) if batch.has_generator_logprobs else None
    advantages = batch.advantages.to(dev)
    if _is_seed_loss(loss_fn):
        result = loss_fn(
            logits.float() / temperature, response=response, ref_logprobs=ref, advantages=advantages,
            padding_mask=mask,
        )
    else:
        logprobs = compute_logprobs(response_logits, response, align=False)
        kwargs = {"logits": response_logits.detach()} if _accepts_logits(loss_fn) else {}
        result = loss_fn(logprobs, ref, gen, advantages, mask, **kwargs)
    loss, metrics = result if isinstance(result, tuple) else (result, {})
    metrics = dict(metrics)
    if "entropy" not in metrics:
        with torch.no_grad():
            entropy = entropy_from_logits(response_logits.detach())
            metrics["entropy"] = float((entropy * mask).sum() / mask.sum().clamp(min=1))
    if "kl/k3" in metrics:
        metrics["kl"] = metrics["kl/k3"]
    return loss, metrics


def sft_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Token-mean cross-entropy of ``logits`` [B, L, V] against aligned ``labels`` [B, L] (-100 ignored)."""
    labels = labels.to(logits.device)
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)


def _params(fn: LossFn) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or C extension: assume the rl signature without logits
        return []


def _accepts_logits(fn: LossFn) -> bool:
    return any(p.name == "logits" or p.kind is inspect.Parameter.VAR_KEYWORD for p in _params(fn))


def _is_seed_loss(fn: LossFn) -> bool:
    params = _params(fn)
    return bool(params) and params[0].name == "logits"
