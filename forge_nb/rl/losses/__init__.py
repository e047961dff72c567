"""Policy losses for group-relative RL, by name: GRPO, Dr. GRPO, DAPO, CISPO, GSPO, SAPO.

Every loss is a small dataclass whose config is checked on construction, called as

    loss, metrics = loss_fn(logprobs, ref_logprobs, generator_logprobs, advantages, mask, logits=None)

with per-token [B, T] tensors, advantages [B, 1] or [B], and `metrics` a dict of floats:
loss/policy, loss/total, kl/k1 and kl/k3 (when ref_logprobs is given), clip/frac_low,
clip/frac_high, ratio/mean, ratio/max, and entropy (when logits [B, T, V] are given).

    make_loss("dapo", clip_high=0.3)     # or DAPOLoss(clip_high=0.3)

Every loss is also callable in TorchForge's form, `loss(logits=, target_ids=, advantages=,
generator_logprobs=, loss_mask=, ref_logprobs=)`, takes TorchForge's keyword names (`agg_type`,
`clip_range`, `adaptive_kl`, `kl_target`, `dual_clip_c`) and is importable as `forge_nb.rl.loss.GRPOLoss`
etc.; TorchForge's building blocks are in `forge_nb.rl.loss.ops`.

The losses' modules import torch in the functions that compute, not at the top: a RunConfig builds its loss to
check the settings, in the kernel, before its first spawn, whose processes import torch meanwhile
(`forge_nb.controller.lifecycle.prestart`).
"""

from __future__ import annotations

import re
from dataclasses import fields
from typing import Any

from forge_nb.rl.losses.base import PolicyLoss
from forge_nb.rl.losses.clipped import DAPOLoss, DrGRPOLoss, GRPOLoss
from forge_nb.rl.losses.ops import (
    AGG_MODES,
    AGG_TYPES,
    AggMode,
    aggregate,
    aligned_logits,
    compute_logprobs,
    entropy_from_logits,
)
from forge_nb.rl.losses.sequence import GSPOLoss
from forge_nb.rl.losses.soft import CISPOLoss, SAPOLoss

__all__ = [
    "AGG_MODES",
    "AGG_TYPES",
    "LOSSES",
    "AggMode",
    "CISPOLoss",
    "DAPOLoss",
    "DrGRPOLoss",
    "GRPOLoss",
    "GSPOLoss",
    "PolicyLoss",
    "SAPOLoss",
    "aggregate",
    "aligned_logits",
    "compute_logprobs",
    "entropy_from_logits",
    "make_loss",
]

LOSSES: dict[str, type[PolicyLoss]] = {
    cls.name: cls for cls in (GRPOLoss, DrGRPOLoss, DAPOLoss, CISPOLoss, GSPOLoss, SAPOLoss)
}


def make_loss(name: str, **config: Any) -> PolicyLoss:
    """Build the loss registered as `name` ("grpo", "dr_grpo", "dapo", "cispo", "gspo", "sapo")."""
    key = re.sub(r"[\s.\-]+", "_", name.strip().lower())
    if key not in LOSSES:
        raise ValueError(f"unknown loss {name!r}; known losses: {', '.join(sorted(LOSSES))}")
    try:
        return LOSSES[key](**config)
    except TypeError as err:  # an unexpected keyword: say which fields exist
        known = sorted(f.name for f in fields(LOSSES[key]))
        raise ValueError(f"make_loss({name!r}): {err}; {LOSSES[key].__name__} takes {known}") from err
