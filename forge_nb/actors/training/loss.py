"""RLTrainer's objectives: the configured forge_nb.rl policy loss (or a TorchForge-kind one) and SFT cross-entropy.

A loss is given by name (``forge_nb.rl.make_loss(name, **loss_config)``) or as a callable, dispatched on its
parameter names:

- forge_nb's ``PolicyLoss`` objects, and callables ``(logprobs, ref_logprobs, generator_logprobs, advantages,
  mask, logits=None)``: per-token logprobs of the response.
- TorchForge's loss objects (a parameter named ``target_ids`` or ``loss_mask``): ``loss(logits=,
  target_ids=, advantages=, generator_logprobs=, loss_mask=, ref_logprobs=)`` with the response positions
  in torchforge's alignment: ``logits`` [B, T, V] (divided by the sampling temperature) where
  ``logits[:, t]`` predicts ``target_ids[:, t]`` = response token t, -100 on padding; ``loss_mask`` [B, T]
  float; ``advantages`` [B, 1]; ``generator_logprobs`` [B, T] (the current policy's, detached, when the
  generator gave none: on-policy); ``ref_logprobs`` [B, T] or None, passed only if the loss takes it.
- torchforge's older ``simple_grpo_loss(logits, response, ref_logprobs, advantages, padding_mask)`` (first
  parameter ``logits``, no ``target_ids``): the whole sequence's logits, so ``apps/grpo/main.py`` code runs.

``text_loss`` does the same for the skill card's ``TextTrainBatch`` (whole-sequence logits aligned with its
``target_ids``, ``target_weights`` as per-token advantages, no reference logprobs).

A loss returns ``(loss, metrics)``, torchforge's ``LossOutput(loss, metrics)`` or a bare loss; its metrics
(a dict, or torchforge's list of ``Metric(key, value)``) come back from ``train_step``. For a forge_nb-kind loss
with the generator's logprobs, ``train_step``'s result also holds ``rows[TOKEN_RATIOS]``: each row's per-token ratio
trainer / generator (float16 arrays, in the batch's row order), which the controller hands to the explorer. A batch
without reference logprobs is refused for a loss with ``beta > 0`` rather than trained against zeros.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from forge_nb.rl import PolicyLoss, TrainBatch, compute_logprobs, entropy_from_logits
from forge_nb.rl.losses.mismatch import TOKEN_RATIOS, token_ratios
from forge_nb.rl.losses.ops import CROSS_ENTROPY_IGNORE_IDX
from forge_nb.rl.types import TextTrainBatch
from forge_nb.system.importpath import import_path

__all__ = ["TOKEN_RATIOS", "clip_and_step", "loss_function", "loss_kind", "mean_metrics", "rl_loss", "sft_loss",
           "text_loss"]

LossFn = Callable[..., Any]


def loss_function(loss: str | LossFn, loss_config: Mapping[str, Any] | None) -> LossFn:
    """A loss by name configured by ``loss_config``, a ``"package.module:Name"`` path (a class, built with
    ``loss_config``, or a callable), or the callable given."""
    from forge_nb.rl import make_loss

    if isinstance(loss, str) and ":" in loss:
        loss = import_path(loss, label="loss", where="in the trainer's process")
        if isinstance(loss, type):
            return loss(**dict(loss_config or {}))
    if isinstance(loss, str):
        return make_loss(loss, **dict(loss_config or {}))
    if not callable(loss):
        raise ValueError(f"loss={loss!r}: a loss name such as 'grpo', or a callable with the rl loss signature")
    if loss_config:
        raise ValueError("loss_config configures a loss given by name; configure your callable yourself")
    return loss


def rl_loss(
    loss_fn: LossFn, logits: torch.Tensor, batch: TrainBatch, temperature: float, version: int | None = None
) -> tuple[torch.Tensor, dict[str, float]]:
    """(loss, metrics) of ``batch`` under ``logits`` [B, L, V] of its whole sequences.

    Logprobs, entropy and the seed's logits are all of ``logits / temperature``: the distribution the
    generator sampled from (``temperature`` is ``TrainingConfig.logits_temperature``: 1 when the generator samples
    greedily). Metrics gain "entropy" (when the loss gave none) and "kl" (= kl/k3). ``version``: the version of
    the weights being trained; a forge_nb loss then reports the mismatch of the episodes it generated apart
    (``mismatch/kl_same_version``).
    """
    dev, req = logits.device, batch.request_len
    response_logits = logits[:, req - 1 : -1].float() / temperature
    response, mask = batch.response.to(dev), batch.response_mask.to(dev)
    ref = batch.ref_logprobs.to(dev) if batch.has_ref_logprobs else None
    gen = batch.generator_logprobs.to(dev) if batch.has_generator_logprobs else None
    advantages = batch.advantages.to(dev)
    if loss_kind(loss_fn) != "seed":
        same = None if version is None else batch.policy_versions.to(dev) == version
        return _aligned_loss(loss_fn, response_logits, response, mask, advantages, ref, gen, same)
    if ref is None:
        _refuse_missing_ref(loss_fn, always=True)
    result = loss_fn(
        logits.float() / temperature, response=response, ref_logprobs=ref, advantages=advantages, padding_mask=mask,
    )
    return _with_entropy_and_kl(_loss_and_metrics(loss_fn, result), response_logits, mask)


def text_loss(
    loss_fn: LossFn, logits: torch.Tensor, batch: TextTrainBatch, temperature: float
) -> tuple[torch.Tensor, dict[str, float]]:
    """(loss, metrics) of the skill card's ``TextTrainBatch`` under ``logits`` [B, L, V] of its input_ids.

    ``logits[:, t]`` predicts ``target_ids[:, t]``; ``target_weights`` are the per-token advantages. The
    batch carries no reference or generator logprobs: the ratio is on-policy, and a loss with a KL term
    (beta > 0, or torchforge's simple_grpo_loss) is refused.
    """
    dev = logits.device
    mask = batch.target_mask.to(dev).bool()
    if loss_kind(loss_fn) == "seed" or _beta(loss_fn) > 0:
        raise ValueError(
            f"the loss {_label(loss_fn)} needs reference logprobs (beta={_beta(loss_fn)}), which a TextTrainBatch "
            "does not carry; use a loss with beta=0 (e.g. loss='grpo', loss_config={'beta': 0}) or train on "
            "episodes with ref_logprobs (a TrainBatch)"
        )
    return _aligned_loss(
        loss_fn, logits.float() / temperature, batch.target_ids.to(dev), mask,
        batch.target_weights.to(dev).float(), None, None,
    )


def _aligned_loss(
    loss_fn: LossFn,
    logits: torch.Tensor,
    targets: torch.Tensor,
    mask: torch.Tensor,
    advantages: torch.Tensor,
    ref: torch.Tensor | None,
    gen: torch.Tensor | None,
    same_version: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """A forge_nb- or TorchForge-kind loss on ``logits`` [B, T, V] aligned with ``targets`` [B, T]."""
    safe_targets = targets.masked_fill(~mask, 0)  # padding may hold anything, -100 included
    if loss_kind(loss_fn) == "torchforge":
        if ref is None:
            _refuse_missing_ref(loss_fn, always=False)
        if gen is None:  # on-policy: the current policy's logprobs, 0 on padding as collate's are
            with torch.no_grad():
                gen = compute_logprobs(logits, safe_targets).masked_fill(~mask, 0.0)
        kwargs: dict[str, Any] = {
            "logits": logits, "target_ids": targets.masked_fill(~mask, CROSS_ENTROPY_IGNORE_IDX),
            "advantages": advantages, "generator_logprobs": gen, "loss_mask": mask.to(logits.dtype),
        }
        if _accepts(loss_fn, "ref_logprobs"):
            kwargs["ref_logprobs"] = ref
        result = loss_fn(**kwargs)
    else:  # a PolicyLoss refuses beta > 0 without ref logprobs itself
        logprobs = compute_logprobs(logits, safe_targets)
        # the logits feed the entropy metric, detached, unless the loss trains on their entropy
        trained = float(getattr(loss_fn, "entropy_coef", 0.0) or 0.0) > 0
        kwargs = {"logits": logits if trained else logits.detach()} if _accepts(loss_fn, "logits") else {}
        if same_version is not None and gen is not None and _accepts(loss_fn, "same_version"):
            kwargs["same_version"] = same_version
        result = loss_fn(logprobs, ref, gen, advantages, mask, **kwargs)
        if gen is not None:  # the explorer's per-token view: each row's ratios over its trained tokens
            loss, metrics = _with_entropy_and_kl(_loss_and_metrics(loss_fn, result), logits, mask)
            return loss, {**metrics, TOKEN_RATIOS: token_ratios(logprobs, gen, mask)}  # type: ignore[dict-item]
    return _with_entropy_and_kl(_loss_and_metrics(loss_fn, result), logits, mask)


def _with_entropy_and_kl(
    out: tuple[torch.Tensor, dict[str, float]], logits: torch.Tensor, mask: torch.Tensor
) -> tuple[torch.Tensor, dict[str, float]]:
    """Metrics gain "entropy" of ``logits`` over ``mask`` (when the loss gave none) and "kl" (= kl/k3)."""
    loss, metrics = out
    if "entropy" not in metrics:
        with torch.no_grad():
            entropy = entropy_from_logits(logits.detach())
            metrics["entropy"] = float((entropy * mask).sum() / mask.sum().clamp(min=1))
    if "kl/k3" in metrics:
        metrics["kl"] = metrics["kl/k3"]
    return loss, metrics


def loss_kind(fn: LossFn) -> str:
    """"forge_nb", "torchforge" (takes target_ids / loss_mask) or "seed" (torchforge's simple_grpo_loss)."""
    if isinstance(fn, PolicyLoss):
        return "forge_nb"
    names = [p.name for p in _params(fn)]
    if "target_ids" in names or "loss_mask" in names:
        return "torchforge"
    if names and names[0] == "logits":
        return "seed"
    return "forge_nb"


def sft_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Token-mean cross-entropy of ``logits`` [B, L, V] against aligned ``labels`` [B, L] (-100 ignored)."""
    labels = labels.to(logits.device)
    return torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), labels.flatten(), ignore_index=-100)


def _params(fn: LossFn) -> list[inspect.Parameter]:
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # a builtin or C extension: assume the rl signature without logits
        return []


def _accepts(fn: LossFn, name: str) -> bool:
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in _params(fn))


def _beta(fn: LossFn) -> float:
    beta = getattr(fn, "beta", None)
    return float(beta) if isinstance(beta, (int, float)) else 0.0


def _refuse_missing_ref(fn: LossFn, *, always: bool) -> None:
    beta = getattr(fn, "beta", None)
    if always or _beta(fn) > 0:
        what = f"beta={beta}" if isinstance(beta, (int, float)) else "a KL term against the reference model"
        raise ValueError(
            f"the loss {_label(fn)} has {what} but this batch has no reference logprobs (an episode's "
            "ref_logprobs is None); compute them with a ReferenceModel before adding episodes, or use a "
            "loss with beta=0"
        )


def _loss_and_metrics(fn: LossFn, result: Any) -> tuple[torch.Tensor, dict[str, float]]:
    """Split what a loss returned: (loss, metrics), torchforge's LossOutput, or a bare loss tensor."""
    if isinstance(result, tuple) and len(result) == 2:
        loss, raw = result
    elif hasattr(result, "loss") and hasattr(result, "metrics"):
        loss, raw = result.loss, result.metrics
    else:
        loss, raw = result, {}
    if not (isinstance(loss, torch.Tensor) and loss.numel() == 1):
        raise ValueError(
            f"the loss {_label(fn)} returned {type(loss).__name__} as its loss; return a scalar tensor, "
            "or (loss, metrics)"
        )
    pairs = raw.items() if isinstance(raw, Mapping) else ((m.key, m.value) for m in (raw or []))
    metrics: dict[str, float] = {}
    for key, value in pairs:
        try:
            metrics[str(key)] = float(value.detach()) if isinstance(value, torch.Tensor) else float(value)
        except (TypeError, ValueError, RuntimeError) as err:
            raise ValueError(
                f"the loss {_label(fn)} returned metric {key!r} = {value!r}; metrics must be numbers "
                "(use .item() on a scalar tensor)"
            ) from err
    return loss.reshape(()), metrics


def _label(fn: LossFn) -> str:
    return getattr(fn, "__qualname__", None) or type(fn).__name__


def mean_metrics(metrics: list[dict[str, Any]]) -> dict[str, Any]:
    """Each metric's mean over the micro-batches that reported it; per-row lists (``TOKEN_RATIOS``) concatenated."""
    out: dict[str, Any] = {}
    for name in sorted({k for m in metrics for k in m}):
        values = [m[name] for m in metrics if name in m]
        out[name] = [row for v in values for row in v] if isinstance(values[0], list) else sum(values) / len(values)
    return out


def clip_and_step(optimizer: torch.optim.Optimizer, max_norm: float) -> float:
    """Clip the gradients of ``optimizer``'s parameters to ``max_norm`` (0: measure only) and step, unless their
    norm is not finite; the gradients are cleared either way. Returns the norm before clipping (the trainer's
    step and the Tinker API's ``optim_step`` both end this way)."""
    trained = [p for group in optimizer.param_groups for p in group["params"]]
    norm = torch.nn.utils.clip_grad_norm_(trained, max_norm or math.inf)
    grad_norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
    if math.isfinite(grad_norm):
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm
