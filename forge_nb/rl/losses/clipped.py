"""The PPO-clip family for group-relative RL: GRPO, Dr. GRPO and DAPO.

All three use the per-token clipped surrogate

    r_t = exp(logp_t - logp_old_t)
    L_t = -min(r_t * A, clip(r_t, 1 - eps_low, 1 + eps_high) * A)

and differ in the clip range, the KL penalty and how L_t is averaged (see each class). The clip is
"active" - the token gets no gradient - when A > 0 and r_t > 1 + eps_high (counted in clip/frac_high)
or A < 0 and r_t < 1 - eps_low (clip/frac_low).

TorchForge's keyword names work beside forge_nb's: `GRPOLoss(clip_low=0.2, clip_high=0.28, beta=0.1,
agg_type="fixed_horizon")`, `DAPOLoss(clip_range=0.2, adaptive_kl=True, kl_target=0.01)`, and DAPO's
dual clip `dual_clip_c` (torchforge's DAPOLoss default is 3.0; here None, off, unless given).
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, fields
from typing import TYPE_CHECKING, ClassVar

from forge_nb.rl.losses.base import PolicyLoss, PolicyTerms, check_clip, log_ratio
from forge_nb.rl.losses.ops import AggMode

if TYPE_CHECKING:
    import torch

__all__ = ["DAPOLoss", "DrGRPOLoss", "GRPOLoss", "clipped_surrogate"]


def clipped_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    eps_low: float,
    eps_high: float,
) -> PolicyTerms:
    """Per-token PPO-clip loss `max(-r A, -clip(r, 1 - eps_low, 1 + eps_high) A)`."""
    import torch
    ratio = torch.exp(log_ratio(logprobs, old_logprobs))
    clipped = ratio.clamp(1.0 - eps_low, 1.0 + eps_high)
    per_token = torch.maximum(-advantages * ratio, -advantages * clipped)
    r = ratio.detach()
    return PolicyTerms(
        per_token=per_token,
        ratio=r,
        ratio_mask=mask,
        clipped_low=(advantages < 0) & (r < 1.0 - eps_low),
        clipped_high=(advantages > 0) & (r > 1.0 + eps_high),
    )


@dataclass(kw_only=True)
class _SymmetricClip(PolicyLoss):
    """The PPO-clip surrogate with one clip range for both sides (GRPO and Dr. GRPO)."""

    clip_eps: float = 0.2
    """Symmetric clip range eps of the ratio."""
    clip_low: float | None = None
    """torchforge's name: the lower range eps_low; None means clip_eps."""
    clip_high: float | None = None
    """torchforge's name: the upper range eps_high; None means clip_eps."""

    def __post_init__(self, agg_type: str | None) -> None:
        super().__post_init__(agg_type)
        owner = type(self).__name__
        check_clip(owner, "clip_eps", self.clip_eps)
        check_clip(owner, "clip_low", self.clip_low, allow_none=True)
        check_clip(owner, "clip_high", self.clip_high, allow_none=True)

    @property
    def _eps(self) -> tuple[float, float]:
        """(eps_low, eps_high) in use."""
        low = self.clip_eps if self.clip_low is None else self.clip_low
        return low, self.clip_eps if self.clip_high is None else self.clip_high

    def _policy_terms(
        self, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
    ) -> PolicyTerms:
        return clipped_surrogate(logprobs, old_logprobs, advantages, mask, *self._eps)


@dataclass(kw_only=True)
class GRPOLoss(_SymmetricClip):
    """GRPO: Shao et al. 2024, "DeepSeekMath" (arXiv:2402.03300).

        loss = 1/B sum_i 1/|o_i| sum_t [ -min(r_it A_i, clip(r_it, 1-eps, 1+eps) A_i) + beta k3_it ]
        k3_it = exp(ref_it - logp_it) - (ref_it - logp_it) - 1

    Defaults match torchforge's `simple_grpo_loss` (beta=0.1, per-sequence token mean): with
    generator_logprobs=None every ratio is 1 and this is exactly the seed's loss. torchforge's newer
    GRPOLoss defaults to clip_high=0.28 and agg_type="fixed_horizon" (Dr. GRPO's); pass them to get it.
    """

    beta: float = 0.1
    agg: AggMode = "seq-mean-token-mean"

    name: ClassVar[str] = "grpo"


@dataclass(kw_only=True)
class DrGRPOLoss(_SymmetricClip):
    """Dr. GRPO: Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective"
    (arXiv:2503.20783).

        loss = 1/(B * L_max) sum_i sum_t -min(r_it A_i, clip(r_it, 1-eps, 1+eps) A_i)  [+ beta k3]

    GRPO's 1/|o_i| makes short correct answers and long wrong ones weigh more per token (a length
    bias); Dr. GRPO divides by a constant L_max instead (`norm_len`, default the padded length T).
    The other half of the fix is in the advantages: use `assign_advantages(group, "dr_grpo")`, which
    does not divide by the group's reward std. No KL penalty by default, as in the paper.
    """

    beta: float = 0.0
    agg: AggMode = "seq-mean-token-sum-norm"

    name: ClassVar[str] = "dr_grpo"


@dataclass(kw_only=True)
class DAPOLoss(PolicyLoss):
    """DAPO: Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"
    (arXiv:2503.14476).

        loss = 1/sum_i |o_i| sum_i sum_t -min(r_it A_i, clip(r_it, 1-eps_low, 1+eps_high) A_i)

    "Clip-higher": a wider upper range (eps_high=0.28 > eps_low=0.2) lets unlikely tokens gain
    probability, which keeps entropy from collapsing. Token-level aggregation makes every token count
    the same, so long responses are not under-weighted. No KL penalty by default, as in the paper.
    (Dynamic sampling and overlong shaping, DAPO's other parts, belong to the rollout loop.)
    The TorchForge documents' `adaptive_kl=True` adds a KL term whose beta PPO's rule adapts (see base).

    With `dual_clip_c` = c (torchforge's DAPOLoss, after Ye et al. 2020's dual-clip PPO), a token with
    A < 0 loses at most -c A: its loss is min(L_t, -c A), so a very unlikely sampled token cannot
    dominate the batch; clip/frac_dual counts the tokens capped.
    """

    clip_low: float = 0.2
    clip_high: float = 0.28
    beta: float = 0.0
    agg: AggMode = "token-mean"
    dual_clip_c: float | None = None
    """Cap the loss of negative-advantage tokens at -c A (c > 1); None disables the dual clip."""
    clip_range: InitVar[float | None] = None
    """The TorchForge documents' name for one symmetric range: sets clip_low and clip_high."""

    name: ClassVar[str] = "dapo"

    def __post_init__(self, agg_type: str | None, clip_range: float | None) -> None:
        super().__post_init__(agg_type)
        owner = type(self).__name__
        if clip_range is not None:
            check_clip(owner, "clip_range", clip_range)
            defaults = {f.name: f.default for f in fields(self)}
            for side in ("clip_low", "clip_high"):
                if getattr(self, side) not in (defaults[side], clip_range):
                    raise ValueError(
                        f"{owner}: clip_range={clip_range} sets clip_low and clip_high, but {side}="
                        f"{getattr(self, side)} was also given; give clip_range or clip_low/clip_high"
                    )
            self.clip_low = self.clip_high = clip_range
        check_clip(owner, "clip_low", self.clip_low)
        check_clip(owner, "clip_high", self.clip_high)
        if self.dual_clip_c is not None and not self.dual_clip_c > 1:
            raise ValueError(f"{owner}.dual_clip_c must be > 1 or None, got {self.dual_clip_c!r}; torchforge uses 3.0")

    def _policy_terms(
        self, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
    ) -> PolicyTerms:
        import torch
        terms = clipped_surrogate(logprobs, old_logprobs, advantages, mask, self.clip_low, self.clip_high)
        if self.dual_clip_c is None:
            return terms
        cap = -self.dual_clip_c * advantages
        capped = (advantages < 0) & (terms.per_token > cap)
        return terms._replace(
            per_token=torch.where(capped, cap.expand_as(terms.per_token), terms.per_token),
            dual_clipped=capped.detach() & mask,
        )
