"""The shared frame of every policy loss: its two call forms, input checks, KL penalty, aggregation, metrics.

A concrete loss only says how to turn (logprobs, old logprobs, advantages) into a per-token policy loss
(`_policy_terms`); `PolicyLoss.__call__` does the rest the same way for all of them:

    loss = aggregate(policy_loss_per_token + beta * k3_per_token, mask, agg)

k3 is Schulman's unbiased, always non-negative KL estimator
`exp(ref - logp) - (ref - logp) - 1` of KL(pi_theta || pi_ref).
"old logprobs" are the generator's logprobs when given (importance ratio against the behaviour
policy) and otherwise `logprobs.detach()`, which makes every ratio exactly 1 in value while keeping
its gradient: the on-policy case of torchforge's `simple_grpo_loss`.

Two call forms, one computation (see `PolicyLoss.__call__`):

    loss(logprobs, ref_logprobs, generator_logprobs, advantages, mask, logits=None)       # forge_nb's
    loss(logits=, target_ids=, advantages=, generator_logprobs=, loss_mask=, ref_logprobs=)  # TorchForge's

`adaptive_kl=True` turns beta into PPO's adaptive KL coefficient (Schulman et al. 2017, "Proximal Policy
Optimization Algorithms", section 4): after each training call, beta is halved when the measured KL is
below kl_target / 1.5 and doubled when it is above kl_target * 1.5, within [1e-4, 10].
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import InitVar, dataclass, fields
from typing import TYPE_CHECKING, ClassVar, NamedTuple

from forge_nb.rl.losses.mismatch import Correction, check_mismatch, importance_weights, mismatch_metrics
from forge_nb.rl.losses.ops import (
    CROSS_ENTROPY_IGNORE_IDX,
    MAX_LOG_RATIO,
    AggMode,
    agg_mode,
    aggregate,
    compute_logprobs,
    entropy_from_logits,
    masked_mean,
)

if TYPE_CHECKING:
    import torch

__all__ = ["PolicyLoss", "PolicyTerms", "check_clip", "log_ratio"]

# PPO's adaptive KL rule: the band around the target, the step factor, the bounds, and the start value
# when beta is 0 (a loss whose default has no KL term): a multiplicative rule never leaves 0.
_KL_BAND, _KL_STEP, _BETA_MIN, _BETA_MAX, _ADAPTIVE_START = 1.5, 2.0, 1e-4, 10.0, 0.1


class PolicyTerms(NamedTuple):
    """What a concrete loss computes; `ratio`, `clipped_*` and `ratio_mask` feed the metrics."""

    per_token: torch.Tensor  # [B, T] policy loss per token
    ratio: torch.Tensor  # [B, T] per-token or [B] per-sequence importance ratio (detached)
    ratio_mask: torch.Tensor  # bool, same shape as ratio: entries that count in the metrics
    clipped_low: torch.Tensor  # bool, same shape as ratio
    clipped_high: torch.Tensor  # bool, same shape as ratio
    dual_clipped: torch.Tensor | None = None  # bool [B, T]: tokens whose loss DAPO's dual clip capped


def check_clip(owner: str, name: str, value: float | None, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if value is None or not value > 0:
        raise ValueError(f"{owner}.{name} must be > 0, got {value!r}; typical values are 0.2 to 0.3")


def log_ratio(logprobs: torch.Tensor, old_logprobs: torch.Tensor) -> torch.Tensor:
    return (logprobs - old_logprobs).clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


@dataclass(kw_only=True)
class PolicyLoss(ABC):
    """Base of the policy losses; subclasses set their own defaults and implement `_policy_terms`."""

    beta: float = 0.0
    """Weight of the k3 KL penalty towards the reference model; 0 disables it (no ref logprobs needed).
    With adaptive_kl it is the current coefficient, updated after each training call."""
    agg: AggMode = "token-mean"
    """How per-token losses become a scalar; see `forge_nb.rl.losses.ops.aggregate`. torchforge's names
    ("token_mean", "sequence_mean", "fixed_horizon") are accepted and stored as forge_nb's."""
    norm_len: int | None = None
    """Constant length normaliser for agg="seq-mean-token-sum-norm"; None means the padded length T."""
    adaptive_kl: bool = False
    """Adapt beta towards kl_target across training calls (PPO's adaptive KL); needs ref_logprobs."""
    kl_target: float = 0.01
    """The per-token KL (k3, token mean) that adaptive_kl steers towards."""
    entropy_coef: float = 0.0
    """Weight of an entropy bonus, ``loss - entropy_coef * H`` with H the mean entropy of the sampled
    distribution over the trained tokens; 0 disables it. It keeps a small policy from collapsing onto one
    answer (a group of identical samples has no advantage, so no gradient, ever again). Needs the logits
    with their gradients: the trainer passes them whenever this is > 0."""
    mismatch_correction: Correction = "off"
    """Correct for the generator/trainer mismatch with importance weights (``forge_nb.rl.losses.mismatch``):
    "token_truncate", "token_mask", "sequence_truncate" or "sequence_mask"; the loss's ratio is then taken
    against the trainer's own logprobs before the step. "off": the ratio is against the generator's logprobs
    (the behaviour policy) and bounded by the loss's clip. The ``mismatch/*`` metrics are reported either way."""
    mismatch_cap: float = 2.0
    """The largest importance weight kept (>= 1): truncate modes cap weights at it, mask modes drop tokens (or
    sequences) above it. ``mismatch/frac_outside`` counts the tokens outside [1/cap, cap] in every mode."""
    mismatch_floor: float = 0.0
    """Mask modes also drop weights below this (in [0, 1); 0: none)."""
    agg_type: InitVar[str | None] = None
    """torchforge's name for `agg` ("token_mean", "sequence_mean", "fixed_horizon"); sets agg."""

    name: ClassVar[str] = "policy"

    def __post_init__(self, agg_type: str | None) -> None:
        owner = type(self).__name__
        if not self.beta >= 0:
            raise ValueError(f"{owner}.beta must be >= 0, got {self.beta!r}; use 0 to disable the KL penalty")
        if not isinstance(self.agg, str):
            raise ValueError(f"{owner}.agg must be a string, got {self.agg!r}")
        self.agg = agg_mode(self.agg, f"{owner}.agg")
        if agg_type is not None:
            mode = agg_mode(agg_type, f"{owner}.agg_type")
            default = {f.name: f.default for f in fields(self)}["agg"]
            if self.agg not in (default, mode):
                raise ValueError(
                    f"{owner}: agg={self.agg!r} and agg_type={agg_type!r} name different aggregations; give one"
                )
            self.agg = mode
        if self.norm_len is not None and not (isinstance(self.norm_len, int) and self.norm_len >= 1):
            raise ValueError(
                f"{owner}.norm_len must be an int >= 1 or None, got {self.norm_len!r}; use the maximum "
                "response length in tokens"
            )
        coef = self.entropy_coef
        if isinstance(coef, bool) or not isinstance(coef, int | float) or not math.isfinite(coef) or coef < 0:
            raise ValueError(f"{owner}.entropy_coef must be a finite number >= 0, got {coef!r}; e.g. 0.01, "
                             "or 0 for no entropy bonus")
        check_mismatch(owner, self.mismatch_correction, self.mismatch_cap, self.mismatch_floor)
        if self.adaptive_kl:
            if not self.kl_target > 0:
                raise ValueError(f"{owner}.kl_target must be > 0 with adaptive_kl=True, got {self.kl_target!r}")
            if self.beta == 0:
                self.beta = _ADAPTIVE_START

    @abstractmethod
    def _policy_terms(
        self, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
    ) -> PolicyTerms:
        """Per-token policy loss from logprobs [B, T], detached old logprobs [B, T], advantages [B, 1]."""

    def __call__(
        self,
        logprobs: torch.Tensor | None = None,
        ref_logprobs: torch.Tensor | None = None,
        generator_logprobs: torch.Tensor | None = None,
        advantages: torch.Tensor | None = None,
        mask: torch.Tensor | None = None,
        logits: torch.Tensor | None = None,
        *,
        target_ids: torch.Tensor | None = None,
        loss_mask: torch.Tensor | None = None,
        same_version: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, dict[str, float]]:
        """Loss and metrics, called in forge_nb's form or TorchForge's.

        forge_nb's: ``(logprobs, ref_logprobs, generator_logprobs, advantages, mask, logits=None)`` with
        per-token ``logprobs`` [B, T] under the current policy; ``logits`` [B, T, V] aligned with them
        feed the entropy metric only.
        TorchForge's: ``(logits=, target_ids=, advantages=, generator_logprobs=, loss_mask=,
        ref_logprobs=)`` with ``logits`` [B, T, V] where ``logits[:, t]`` predicts ``target_ids[:, t]``
        (torchforge's alignment; -100 targets are ignored); the same six in that order positionally.
        Both: ref_logprobs / generator_logprobs [B, T] or None (None: on-policy, every ratio 1);
        advantages per sequence [B] / [B, 1] or per token [B, T]; mask / loss_mask [B, T], true on the
        trained tokens. ``same_version`` [B] bool: the rows generated by the weights being trained (their
        mismatch is the engine's alone: ``mismatch/kl_same_version``).
        """
        import torch
        owner = type(self).__name__
        if target_ids is not None or loss_mask is not None or (logprobs is not None and logprobs.dim() == 3):
            if target_ids is None and loss_mask is None:  # all six given by position, in TorchForge's order
                logits, target_ids, advantages, generator_logprobs, loss_mask, ref_logprobs = (
                    logprobs, ref_logprobs, generator_logprobs, advantages, mask, logits,
                )
            elif logits is None:  # loss(logits, target_ids=..., ...)
                logits = logprobs
            if logits is None or target_ids is None or loss_mask is None:
                raise TypeError(
                    f"{owner}: TorchForge's call form needs logits=, target_ids= and loss_mask= (with "
                    "advantages=, generator_logprobs= and ref_logprobs=); forge_nb's form passes "
                    "(logprobs, ref_logprobs, generator_logprobs, advantages, mask)"
                )
            logprobs = compute_logprobs(logits, target_ids)
            mask = loss_mask.bool() & (target_ids != CROSS_ENTROPY_IGNORE_IDX)
        if logprobs is None or advantages is None or mask is None:
            raise TypeError(
                f"{owner}: needs logprobs, advantages and mask (or TorchForge's logits, target_ids, loss_mask)"
            )
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
        if advantages.shape == logprobs.shape:
            adv = advantages.to(logprobs.dtype)  # per token
        elif advantages.numel() == batch:
            adv = advantages.reshape(batch, 1).to(logprobs.dtype)  # per sequence
        else:
            raise ValueError(
                f"{owner}: advantages has shape {tuple(advantages.shape)}; expected [B], [B, 1] or "
                f"[B, T] with [B, T] = {list(logprobs.shape)}"
            )
        if self.beta > 0 and ref_logprobs is None:
            raise ValueError(
                f"{owner}: beta={self.beta} needs ref_logprobs; "
                "pass the reference model's logprobs or set beta=0"
            )
        valid = mask.bool()
        old, weights, mismatch = logprobs.detach(), None, {}
        if generator_logprobs is not None:
            gen = generator_logprobs.to(logprobs.dtype).detach()
            mismatch = mismatch_metrics(logprobs, gen, valid, self.mismatch_cap, same_version)
            if self.mismatch_correction == "off":
                old = gen
            else:  # the ratio against the trainer's own logprobs, the mismatch in a detached weight
                weights, changed = importance_weights(logprobs, gen, valid, self.mismatch_correction,
                                                      self.mismatch_cap, self.mismatch_floor)
                what = "truncated" if self.mismatch_correction.endswith("truncate") else "masked"
                mismatch[f"mismatch/frac_{what}"] = (changed.sum() / valid.sum().clamp(min=1)).item()
        terms = self._policy_terms(logprobs, old, adv, valid)
        per_token = terms.per_token if weights is None else terms.per_token * weights.to(terms.per_token.dtype)

        policy_loss = aggregate(per_token, valid, self.agg, self.norm_len)
        loss = policy_loss
        metrics: dict[str, float] = {"loss/policy": policy_loss.detach().item(), **mismatch}
        if ref_logprobs is not None:
            delta = ref_logprobs.to(logprobs.dtype) - logprobs
            k3 = torch.exp(delta) - delta - 1
            if self.beta > 0:
                loss = loss + self.beta * aggregate(k3, valid, self.agg, self.norm_len)
                metrics["kl/beta"] = self.beta
            metrics["kl/k1"] = masked_mean(-delta.detach(), valid).item()
            metrics["kl/k3"] = masked_mean(k3.detach(), valid).item()
            if self.adaptive_kl and torch.is_grad_enabled():
                self.beta = _adapted_beta(self.beta, metrics["kl/k3"], self.kl_target)
        metrics.update(_ratio_metrics(terms))
        if self.entropy_coef > 0:
            if logits is None:
                raise ValueError(f"{owner}: entropy_coef={self.entropy_coef} needs the logits (logits=, with "
                                 "their gradients); pass them or set entropy_coef=0")
            entropy = masked_mean(entropy_from_logits(logits), valid)
            loss = loss - self.entropy_coef * entropy
            metrics["loss/entropy_bonus"] = self.entropy_coef * entropy.detach().item()
            metrics["entropy"] = entropy.detach().item()
        elif logits is not None:
            with torch.no_grad():
                metrics["entropy"] = masked_mean(entropy_from_logits(logits.detach()), valid).item()
        metrics["loss/total"] = loss.detach().item()
        return loss, metrics


def _adapted_beta(beta: float, kl: float, target: float) -> float:
    """PPO's adaptive KL step: halve beta when kl < target / 1.5, double it when kl > target * 1.5."""
    if kl < target / _KL_BAND:
        beta /= _KL_STEP
    elif kl > target * _KL_BAND:
        beta *= _KL_STEP
    return min(max(beta, _BETA_MIN), _BETA_MAX)


def _ratio_metrics(terms: PolicyTerms) -> dict[str, float]:
    counted = terms.ratio_mask
    ratio = terms.ratio.detach().float()
    n = counted.sum().clamp(min=1).float()
    out = {} if terms.dual_clipped is None else {"clip/frac_dual": (terms.dual_clipped.sum() / n).item()}
    return out | {
        "clip/frac_low": ((terms.clipped_low & counted).sum() / n).item(),
        "clip/frac_high": ((terms.clipped_high & counted).sum() / n).item(),
        "ratio/mean": masked_mean(ratio, counted).item(),
        "ratio/max": ratio[counted].max().item() if counted.any() else 1.0,
    }
