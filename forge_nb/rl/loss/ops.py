"""TorchForge's ``forge.rl.loss.ops``: the loss building blocks with its meanings, compute_logprobs, compute_ratio,
compute_kl, aggregate, on top of forge_nb's own ops (``forge_nb.rl.losses.ops``).

These are what a loss written for TorchForge (``from forge.rl.loss.ops import ...``) calls. Each returns a tensor,
as the TorchForge documents' ``CustomLoss`` uses them (torchforge's own ``primitives`` also return a list of
metrics; a loss here reports metrics itself). forge_nb's native code does not import this module: it exists for
the documents' path (``tests/test_import_graph.py`` checks that).

Alignment, the one convention of the package: ``logits[:, t]`` predicts ``target_ids[:, t]``;
``compute_logprobs`` is ``forge_nb.rl.compute_logprobs`` itself. For a whole sequence
``target_ids = create_shifted_targets(input_ids, loss_mask)`` (``input_ids`` moved left by one, -100 where
nothing is trained); forge_nb's trainer passes the response positions only, already aligned that way.
"""

from __future__ import annotations

from typing import Literal

import torch

from forge_nb.rl.losses.ops import CROSS_ENTROPY_IGNORE_IDX, MAX_LOG_RATIO, agg_mode, compute_logprobs, masked_mean
from forge_nb.rl.losses.ops import aggregate as reduce

__all__ = [
    "CROSS_ENTROPY_IGNORE_IDX",
    "aggregate",
    "compute_kl",
    "compute_logprobs",
    "compute_ratio",
    "create_shifted_targets",
    "masked_mean",
]

_MAX_K3 = 10.0  # torchforge's cap on the per-token k3 estimate


def create_shifted_targets(
    input_ids: torch.Tensor, loss_mask: torch.Tensor | None = None, ignore_index: int = CROSS_ENTROPY_IGNORE_IDX
) -> torch.Tensor:
    """Next-token targets of the same shape: ``targets[..., i] = input_ids[..., i + 1]``; the last position,
    and positions where ``loss_mask`` is False, hold ``ignore_index``."""
    targets = torch.roll(input_ids, shifts=-1, dims=-1)
    targets[..., -1] = ignore_index
    if loss_mask is not None:
        targets = torch.where(loss_mask.bool(), targets, torch.full_like(targets, ignore_index))
    return targets


def compute_ratio(
    logprobs: torch.Tensor,
    generator_logprobs: torch.Tensor | None,
    loss_mask: torch.Tensor | None = None,
    ratio_type: Literal["token", "sequence"] = "token",
) -> torch.Tensor:
    """Importance ratio pi_theta / pi_generator, [B, T], with gradient through ``logprobs``.

    "token": ``exp(logprobs - generator_logprobs)`` per token (log-ratio clamped to +-20).
    "sequence" (GSPO): every token carries its sequence's ``exp(mean_t log-ratio)`` over ``loss_mask``,
    with each token's own gradient (``exp(logp - sg(logp) + sg(seq_log_ratio))``).
    ``generator_logprobs=None`` means on-policy: the ratio is 1 in value and keeps its gradient.
    """
    old = logprobs.detach() if generator_logprobs is None else generator_logprobs.detach().to(logprobs.dtype)
    if old.shape != logprobs.shape:
        raise ValueError(
            f"compute_ratio: generator_logprobs has shape {tuple(old.shape)} but logprobs has "
            f"{tuple(logprobs.shape)}; both are per target token [B, T]"
        )
    log_ratio = logprobs - old
    if ratio_type == "sequence":
        if loss_mask is None:
            raise ValueError("compute_ratio(ratio_type='sequence') needs loss_mask to know each sequence's tokens")
        m = loss_mask.to(logprobs.dtype)
        seq = (log_ratio * m).sum(-1, keepdim=True) / m.sum(-1, keepdim=True).clamp(min=1.0)
        log_ratio = logprobs - logprobs.detach() + seq.detach()
    elif ratio_type != "token":
        raise ValueError(f"compute_ratio: ratio_type must be 'token' or 'sequence', got {ratio_type!r}")
    return torch.exp(log_ratio.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO))


def compute_kl(
    logprobs: torch.Tensor,
    ref_logprobs: torch.Tensor | None,
    loss_mask: torch.Tensor | None = None,
    kl_type: Literal["k1", "k2", "k3"] = "k3",
) -> torch.Tensor:
    """Per-token estimate [B, T] of KL(pi_theta || pi_ref) (Schulman's k1, k2 or k3; k3 capped at 10).

    ``loss_mask`` is accepted for torchforge's signature; the values are not masked (aggregate does that).
    """
    if ref_logprobs is None:
        raise ValueError(
            "compute_kl: ref_logprobs is None; the batch has no reference-model logprobs. Give the episodes "
            "ref_logprobs (a ReferenceModel) or drop the KL term (beta=0)"
        )
    if ref_logprobs.shape != logprobs.shape:
        raise ValueError(
            f"compute_kl: ref_logprobs has shape {tuple(ref_logprobs.shape)} but logprobs has "
            f"{tuple(logprobs.shape)}; both are per target token [B, T]"
        )
    log_ratio = logprobs - ref_logprobs.detach().to(logprobs.dtype)  # log(pi_theta / pi_ref)
    if kl_type == "k1":
        return log_ratio
    if kl_type == "k2":
        return 0.5 * log_ratio.square()
    if kl_type == "k3":
        d = (-log_ratio).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)
        return (torch.exp(d) - d - 1).clamp(0.0, _MAX_K3)
    raise ValueError(f"compute_kl: kl_type must be 'k1', 'k2' or 'k3', got {kl_type!r}")


def aggregate(
    per_token_loss: torch.Tensor,
    loss_mask: torch.Tensor,
    agg_type: str = "token_mean",
    loss_scale: torch.Tensor | float | None = None,
) -> torch.Tensor:
    """Scalar from a [B, T] per-token loss over ``loss_mask``.

    ``agg_type``: torchforge's "token_mean" (sum / number of masked tokens, or / ``loss_scale`` when given),
    "fixed_horizon" (sum / (B * T)) or "sequence_mean" (mean of per-sequence token means), or any of
    forge_nb's modes (``forge_nb.rl.AGG_MODES``).
    """
    if loss_mask.shape != per_token_loss.shape:
        raise ValueError(
            f"aggregate: loss_mask has shape {tuple(loss_mask.shape)} but the loss has "
            f"{tuple(per_token_loss.shape)}; both are [B, T]"
        )
    mode = agg_mode(agg_type)
    if loss_scale is not None:
        if mode != "token-mean":
            raise ValueError(f"aggregate: loss_scale applies to agg_type='token_mean' only, got {agg_type!r}")
        scale = torch.as_tensor(loss_scale, dtype=per_token_loss.dtype, device=per_token_loss.device)
        return (per_token_loss * loss_mask.to(per_token_loss.dtype)).sum() / scale.clamp(min=1.0)
    return reduce(per_token_loss, loss_mask, mode)
