"""GSPO: the clipped surrogate applied to whole sequences instead of single tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from forge_nb.rl.losses.base import PolicyLoss, PolicyTerms, check_clip, log_ratio
from forge_nb.rl.losses.ops import AggMode

if TYPE_CHECKING:
    import torch

__all__ = ["GSPOLoss"]


@dataclass(kw_only=True)
class GSPOLoss(PolicyLoss):
    """GSPO: Zheng et al. 2025 (Qwen), "Group Sequence Policy Optimization" (arXiv:2507.18071).

        s_i  = exp( 1/|o_i| sum_t (logp_it - logp_old_it) )     (geometric mean of token ratios)
        loss = -1/B sum_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)

    The reward is given per sequence, so the importance weight is too: the length-normalised sequence
    ratio has far lower variance than token ratios, which is what made MoE training stable without
    routing replay. Because s_i is a geometric mean its clip range is tiny (the paper: 3e-4 / 4e-4).

    Each token carries s_i in value with its own gradient (the paper's GSPO-token form,
    `s_it = sg(s_i) * pi(y_t) / sg(pi(y_t))`, as torchforge's compute_ratio(ratio_type="sequence")): with
    per-sequence advantages and the default "seq-mean-token-mean" this is exactly the 1/B sum_i above, and
    per-token advantages [B, T] also work. Ratio and clip metrics are per sequence for per-sequence
    advantages, per token otherwise. (torchforge's GSPOLoss defaults to clip_low = clip_high = 0.2.)
    """

    clip_low: float = 3e-4
    clip_high: float = 4e-4
    beta: float = 0.0
    agg: AggMode = "seq-mean-token-mean"

    name: ClassVar[str] = "gspo"

    def __post_init__(self, agg_type: str | None) -> None:
        super().__post_init__(agg_type)
        check_clip(type(self).__name__, "clip_low", self.clip_low)
        check_clip(type(self).__name__, "clip_high", self.clip_high)

    def _policy_terms(
        self, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
    ) -> PolicyTerms:
        import torch
        m = mask.to(logprobs.dtype)
        lengths = m.sum(-1)
        seq_log_ratio = (log_ratio(logprobs, old_logprobs) * m).sum(-1) / lengths.clamp(min=1.0)  # [B]
        # GSPO-token: every token's ratio is s_i in value, with that token's own gradient
        token_ratio = torch.exp(logprobs - logprobs.detach() + seq_log_ratio.detach().unsqueeze(-1))
        lo, hi = 1.0 - self.clip_low, 1.0 + self.clip_high
        per_token = torch.maximum(-advantages * token_ratio, -advantages * token_ratio.clamp(lo, hi))
        s = seq_log_ratio.detach().exp()
        if advantages.shape[-1] == 1:  # per-sequence advantages: per-sequence ratio and clip metrics
            adv = advantages.reshape(-1)
            return PolicyTerms(per_token, s, lengths > 0, (adv < 0) & (s < lo), (adv > 0) & (s > hi))
        r = token_ratio.detach()
        return PolicyTerms(per_token, r, mask, (advantages < 0) & (r < lo), (advantages > 0) & (r > hi))
