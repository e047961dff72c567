"""GSPO: the clipped surrogate applied to whole sequences instead of single tokens."""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from forge_nb.rl.losses.base import PolicyLoss, PolicyTerms, check_clip, log_ratio
from forge_nb.rl.losses.ops import AggMode

__all__ = ["GSPOLoss"]


@dataclass(kw_only=True)
class GSPOLoss(PolicyLoss):
    """GSPO: Zheng et al. 2025 (Qwen), "Group Sequence Policy Optimization" (arXiv:2507.18071).

        s_i  = exp( 1/|o_i| sum_t (logp_it - logp_old_it) )     (geometric mean of token ratios)
        loss = -1/B sum_i min(s_i A_i, clip(s_i, 1 - eps_low, 1 + eps_high) A_i)

    The reward is given per sequence, so the importance weight is too: the length-normalised sequence
    ratio has far lower variance than token ratios, which is what made MoE training stable without
    routing replay. Because s_i is a geometric mean its clip range is tiny (the paper: 3e-4 / 4e-4).

    The per-sequence loss is spread over the sequence's tokens and reduced with `agg`; the default
    "seq-mean-token-mean" gives exactly the 1/B sum_i above. Ratio and clip metrics are per sequence.
    """

    clip_low: float = 3e-4
    clip_high: float = 4e-4
    beta: float = 0.0
    agg: AggMode = "seq-mean-token-mean"

    name: ClassVar[str] = "gspo"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_clip(type(self).__name__, "clip_low", self.clip_low)
        check_clip(type(self).__name__, "clip_high", self.clip_high)

    def _policy_terms(
        self, logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor
    ) -> PolicyTerms:
        m = mask.to(logprobs.dtype)
        lengths = m.sum(-1)
        mean_log_ratio = (log_ratio(logprobs, old_logprobs) * m).sum(-1) / lengths.clamp(min=1.0)
        seq_ratio = torch.exp(mean_log_ratio)  # [B]
        adv = advantages.reshape(-1)
        clipped = seq_ratio.clamp(1.0 - self.clip_low, 1.0 + self.clip_high)
        per_seq = torch.maximum(-adv * seq_ratio, -adv * clipped)
        s = seq_ratio.detach()
        return PolicyTerms(
            per_token=per_seq.unsqueeze(-1).expand_as(logprobs),
            ratio=s,
            ratio_mask=lengths > 0,
            clipped_low=(adv < 0) & (s < 1.0 - self.clip_low),
            clipped_high=(adv > 0) & (s > 1.0 + self.clip_high),
        )
