"""Losses that keep every token's gradient instead of hard-clipping it away: CISPO and SAPO.

PPO-style clipping zeroes the gradient of a token whose ratio left the trust region. Rare "fork"
tokens ("Wait", "However") move furthest after one update, so they are the ones silenced. CISPO bounds
the importance weight instead of the update; SAPO replaces the clip's cliff with a smooth sigmoid gate.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from forge_nb.rl.losses.base import PolicyLoss, PolicyTerms, check_clip, log_ratio
from forge_nb.rl.losses.ops import AggMode

if TYPE_CHECKING:
    import torch

__all__ = ["CISPOLoss", "SAPOLoss"]


@dataclass(kw_only=True)
class CISPOLoss(PolicyLoss):
    """CISPO: MiniMax 2025, "MiniMax-M1: Scaling Test-Time Compute Efficiently with Lightning
    Attention" (arXiv:2506.13585), Eq. 4-5.

        r_it  = exp(logp_it - logp_old_it)
        loss  = -1/sum_i |o_i| sum_i sum_t sg(clip(r_it, 1 - eps_low, 1 + eps_high)) A_i logp_it

    sg is stop-gradient: the clipped ratio only weighs a REINFORCE gradient `A grad logp`, so no token
    loses its gradient. The paper sets no lower bound (`clip_low=None`) and tunes only eps_high.
    The loss value is `-w A logp`, not a ratio surrogate, so it is not comparable across loss types;
    its gradient is what matters. clip/frac_high counts tokens whose weight was capped at 1 + eps_high.
    (torchforge's CISPOLoss defaults to clip_low=1.0, i.e. no lower bound, and clip_high=4.0.)
    """

    clip_low: float | None = None
    """eps_low; None for no lower bound on the weight."""
    clip_high: float = 0.28
    beta: float = 0.0
    agg: AggMode = "token-mean"

    name: ClassVar[str] = "cispo"

    def __post_init__(self, agg_type: str | None) -> None:
        super().__post_init__(agg_type)
        check_clip(type(self).__name__, "clip_low", self.clip_low, allow_none=True)
        check_clip(type(self).__name__, "clip_high", self.clip_high)

    def _policy_terms(
        self, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
    ) -> PolicyTerms:
        import torch
        ratio = torch.exp(log_ratio(logprobs, old_logprobs)).detach()
        low = None if self.clip_low is None else 1.0 - self.clip_low
        weight = ratio.clamp(min=low, max=1.0 + self.clip_high)
        clipped_low = torch.zeros_like(mask) if low is None else ratio < low
        return PolicyTerms(
            per_token=-weight * advantages * logprobs,
            ratio=ratio,
            ratio_mask=mask,
            clipped_low=clipped_low,
            clipped_high=ratio > 1.0 + self.clip_high,
        )


@dataclass(kw_only=True)
class SAPOLoss(PolicyLoss):
    """SAPO: Gao et al. 2025 (Qwen), "Soft Adaptive Policy Optimization" (arXiv:2511.20347).

        r_it   = exp(logp_it - logp_old_it)
        tau_i  = tau_pos if A_i > 0 else tau_neg
        f(r)   = (4 / tau) * sigmoid(tau * (r - 1))
        loss   = -1/B sum_i 1/|o_i| sum_t f(r_it) A_i

    The gradient is `-A * w * r * grad logp` with `w = 4 s (1 - s)`, `s = sigmoid(tau (r - 1))`:
    w = 1 on-policy (r = 1), so there SAPO is the plain policy gradient, and w decays smoothly as r
    leaves 1 instead of dropping to 0 at a clip boundary. A larger tau decays faster; the paper uses
    tau_neg > tau_pos because negative advantages spread probability to many unsampled tokens and
    destabilise training sooner. SAPO has no hard clip, so clip/frac_low and clip/frac_high count
    tokens whose gradient weight w fell below 1/2 with r < 1 and r > 1 respectively.
    """

    tau_pos: float = 1.0
    tau_neg: float = 1.05
    beta: float = 0.0
    agg: AggMode = "seq-mean-token-mean"

    name: ClassVar[str] = "sapo"

    def __post_init__(self, agg_type: str | None) -> None:
        super().__post_init__(agg_type)
        for field_name in ("tau_pos", "tau_neg"):
            value = getattr(self, field_name)
            if not value > 0:
                raise ValueError(
                    f"SAPOLoss.{field_name} must be > 0, got {value!r}; "
                    "the paper uses tau_pos=1.0, tau_neg=1.05"
                )

    def _policy_terms(
        self, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
    ) -> PolicyTerms:
        import torch
        ratio = torch.exp(log_ratio(logprobs, old_logprobs))
        # built in the input dtype: torch.where on Python floats would round tau to float32
        tau = torch.full_like(advantages, self.tau_neg).masked_fill(advantages > 0, self.tau_pos)
        gate = torch.sigmoid(tau * (ratio - 1.0))
        per_token = -(4.0 / tau) * gate * advantages
        s = gate.detach()
        attenuated = 4.0 * s * (1.0 - s) < 0.5
        r = ratio.detach()
        return PolicyTerms(
            per_token=per_token,
            ratio=r,
            ratio_mask=mask,
            clipped_low=attenuated & (r < 1.0),
            clipped_high=attenuated & (r > 1.0),
        )
