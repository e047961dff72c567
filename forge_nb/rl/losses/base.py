"""The shared frame of every policy loss: input checks, KL penalty, aggregation and metrics.

A concrete loss only says how to turn (logprobs, old logprobs, advantages) into a per-token policy loss
(`_policy_terms`); `PolicyLoss.__call__` does the rest the same way for all of them:

    loss = aggregate(policy_loss_per_token + beta * k3_per_token, mask, agg)

k3 is Schulman's unbiased, always non-negative KL estimator
`exp(ref - logp) - (ref - logp) - 1` of KL(pi_theta || pi_ref).
"old logprobs" are the generator's logprobs when given (importance ratio against the behaviour
policy) and otherwise `logprobs.detach()`, which makes every ratio exactly 1 in value while keeping
its gradient: the on-policy case of torchforge's `simple_grpo_loss`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import ClassVar, NamedTuple

import torch

from forge_nb.rl.losses.ops import AGG_MODES, AggMode, aggregate, entropy_from_logits, masked_mean

__all__ = ["PolicyLoss", "PolicyTerms", "check_clip", "log_ratio"]

# exp() of a log-ratio beyond this overflows float32 long before it carries information; clamping keeps
# one wild token (a bf16 rounding artefact, a stale episode) from turning the whole loss into inf/nan.
_MAX_LOG_RATIO = 20.0


class PolicyTerms(NamedTuple):
    """What a concrete loss computes; `ratio`, `clipped_*` and `ratio_mask` feed the metrics."""

    per_token: torch.Tensor  # [B, T] policy loss per token
    ratio: torch.Tensor  # [B, T] per-token or [B] per-sequence importance ratio (detached)
    ratio_mask: torch.Tensor  # bool, same shape as ratio: entries that count in the metrics
    clipped_low: torch.Tensor  # bool, same shape as ratio
    clipped_high: torch.Tensor  # bool, same shape as ratio


def check_clip(owner: str, name: str, value: float | None, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or not value > 0:
        raise ValueError(f"{owner}.{name} must be > 0, got {value!r}; typical values are 0.2 to 0.3")


def log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    return (logprobs - old_logprobs).clamp(-_MAX_LOG_RATIO, _MAX_LOG_RATIO)


@dataclass(kw_only=True)
class PolicyLoss(ABC):
    """Base of the policy losses; subclasses set their own defaults and implement `_policy_terms`."""

    beta: float = 0.0
    """Weight of the k3 KL penalty towards the reference model; 0 disables it (no ref logprobs needed)."""
    agg: AggMode = "token-mean"
    """How per-token losses become a scalar; see `forge_nb.rl.losses.ops.aggregate`."""
    norm_len: int | None = None
    """Constant length normaliser for agg="seq-mean-token-sum-norm"; None means the padded length T."""

    name: ClassVar[str] = "policy"

    def __post_init__(self) -> None:
        owner = type(self).__name__
        if not self.beta >= 0:
            raise ValueError(f"{owner}.beta must be >= 0, got {self.beta!r}; use 0 to disable the KL penalty")
        if self.agg not in AGG_MODES:
            raise ValueError(f"{owner}.agg must be one of {list(AGG_MODES)}, got {self.agg!r}")
        if self.norm_len is not None and not (isinstance(self.norm_len, int) and self.norm_len >= 1):
            raise ValueError(
                f"{owner}.norm_len must be an int >= 1 or None, got {self.norm_len!r}; use the maximum "
                "response length in tokens"
            )

    @abstractmethod
    def _policy_terms(
        self, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
    ) -> PolicyTerms:
        """Per-token policy loss from logprobs [B, T], detached old logprobs [B, T], advantages [B, 1]."""

    def __call__(
        self,
        logprobs: torch.Tensor,
        ref_logprobs: torch.Tensor | None,
        generator_logprobs: torch.Tensor | None,
        advantages: torch.Tensor,
        mask: torch.Tensor,
        logits: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Loss and metrics for per-token `logprobs` [B, T] under the current policy.

        ref_logprobs / generator_logprobs: [B, T] or None; advantages: [B, 1] or [B]; mask: [B, T]
        (True on response tokens); logits: optional [B, T, V] aligned with logprobs, for the entropy
        metric only.
        """
        owner = type(self).__name__
        if logprobs.dim() != 2:
            raise ValueError(f"{owner}: logprobs must be [B, T], got shape {tuple(logprobs.shape)}")
        for label, other in (("ref_logprobs", ref_logprobs), ("generator_logprobs", generator_logprobs)):
            if other is not None and other.shape != logprobs.shape:
                raise ValueError(
                    f"{owner}: {label} has shape {tuple(other.shape)} but logprobs has "
                    f"{tuple(logprobs.shape)}; both must be per response token [B, T]"
                )
        if mask.shape != logprobs.shape:
            raise ValueError(f"{owner}: mask has shape {tuple(mask.shape)}, expected {tuple(logprobs.shape)}")
        batch = logprobs.shape[0]
        if advantages.numel() != batch:
            raise ValueError(
                f"{owner}: advantages has shape {tuple(advantages.shape)}; "
                f"expected [B, 1] or [B] with B = {batch}"
            )
        if self.beta > 0 and ref_logprobs is None:
            raise ValueError(
                f"{owner}: beta={self.beta} needs ref_logprobs; "
                "pass the reference model's logprobs or set beta=0"
            )
        adv = advantages.reshape(batch, 1).to(logprobs.dtype)
        valid = mask.bool()
        old = logprobs.detach() if generator_logprobs is None else generator_logprobs.to(logprobs.dtype)
        terms = self._policy_terms(logprobs, old.detach(), adv, valid)

        policy_loss = aggregate(terms.per_token, valid, self.agg, self.norm_len)
        loss = policy_loss
        metrics: dict[str, float] = {"loss/policy": policy_loss.detach().item()}
        if ref_logprobs is not None:
            delta = ref_logprobs.to(logprobs.dtype) - logprobs
            k3 = torch.exp(delta) - delta - 1
            if self.beta > 0:
                loss = loss + self.beta * aggregate(k3, valid, self.agg, self.norm_len)
            metrics["kl/k1"] = masked_mean(-delta.detach(), valid).item()
            metrics["kl/k3"] = masked_mean(k3.detach(), valid).item()
        metrics.update(_ratio_metrics(terms))
        if logits is not None:
            with torch.no_grad():
                metrics["entropy"] = masked_mean(entropy_from_logits(logits), valid).item()
        metrics["loss/total"] = loss.detach().item()
        return loss, metrics


def _ratio_metrics(terms: PolicyTerms) -> dict[str, float]:
    counted = terms.ratio_mask
    ratio = terms.ratio.detach().float()
    n = counted.sum().clamp(min=1).float()
    return {
        "clip/frac_low": ((terms.clipped_low & counted).sum() / n).item(),
        "clip/frac_high": ((terms.clipped_high & counted).sum() / n).item(),
        "ratio/mean": masked_mean(ratio, counted).item(),
        "ratio/max": ratio[counted].max().item() if counted.any() else 1.0,
    }
