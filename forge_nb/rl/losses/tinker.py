"""The Tinker API's built-in losses (``forward_backward(data, loss_fn=...)``), as its documentation defines them.

Each is a **sum** over every position of every Datum (no mean: Tinker leaves the scale to the caller's advantages
and weights), on the trained model's logprobs ``lp`` of each position's target token. ``q`` is the sampler's
logprobs (``loss_fn_inputs["logprobs"]``), ``A`` the advantages, ``r = exp(lp - q)``:

==================== ================================ =====================================================
``cross_entropy``    ``target_tokens``, ``weights``    ``-sum(weights * lp)``
``importance_sampling`` ``target_tokens``, ``logprobs``, ``-sum(r * A)``
                     ``advantages``
``ppo``              the same                          ``-sum(min(r * A, clip(r, low, high) * A))``
``cispo``            the same                          ``-sum(sg(clip(r, low, high)) * lp * A)``
``dro``              the same                          ``-sum(lp * A - beta / 2 * (lp - q) ** 2)``
==================== ================================ =====================================================

``low`` and ``high`` are ``loss_fn_config``'s ``clip_low_threshold`` and ``clip_high_threshold`` (0.8 and 1.2 by
default: Tinker's documented epsilon of 0.2), ``beta`` its ``beta`` (0.05 by default). The ratio's log is
clamped to +-20 as forge_nb's other losses clamp it (``log_ratio``).

``ppo`` and ``cispo`` are forge_nb's own per-token terms, summed: the PPO-clip surrogate of ``grpo`` / ``dapo``
(``clipped_surrogate`` with ``eps_low = 1 - low``, ``eps_high = high - 1``) and ``CISPOLoss``'s; forge_nb's losses
then average over tokens (``agg``) where Tinker's sum.

Padding: positions outside a Datum carry zero weights and advantages and a zero ``lp`` (the caller masks it), so
every term there is zero and adds nothing, to the loss or to the gradient.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from forge_nb.rl.losses.base import log_ratio
from forge_nb.rl.losses.clipped import clipped_surrogate
from forge_nb.rl.losses.soft import CISPOLoss

__all__ = ["TINKER_LOSSES", "needed_inputs", "tinker_loss"]

#: loss name -> the ``loss_fn_inputs`` it reads besides ``target_tokens``
TINKER_LOSSES: dict[str, tuple[str, ...]] = {
    "cross_entropy": ("weights",),
    "importance_sampling": ("logprobs", "advantages"),
    "ppo": ("logprobs", "advantages"),
    "cispo": ("logprobs", "advantages"),
    "dro": ("logprobs", "advantages"),
}
_CONFIG = {"ppo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
           "cispo": {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2},
           "dro": {"beta": 0.05}}


def needed_inputs(loss_fn: str) -> tuple[str, ...]:
    """The ``loss_fn_inputs`` ``loss_fn`` reads (``target_tokens`` first); a ValueError naming the known losses."""
    if loss_fn not in TINKER_LOSSES:
        raise ValueError(f"loss_fn={loss_fn!r}: the losses served are {sorted(TINKER_LOSSES)}")
    return ("target_tokens", *TINKER_LOSSES[loss_fn])


def loss_config(loss_fn: str, config: Mapping[str, Any] | None) -> dict[str, float]:
    """``config`` over ``loss_fn``'s defaults; an unknown key or a non-number is a ValueError naming it."""
    defaults = _CONFIG.get(loss_fn, {})
    unknown = set(config or {}) - set(defaults)
    if unknown:
        raise ValueError(f"loss_fn_config {sorted(unknown)}: {loss_fn!r} takes {sorted(defaults) or 'none'}")
    values = {**defaults, **(config or {})}
    for key, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"loss_fn_config[{key!r}]={value!r}: a number")
    if "clip_low_threshold" in values and not 0 <= values["clip_low_threshold"] < 1 < values["clip_high_threshold"]:
        raise ValueError(f"loss_fn_config: clip_low_threshold={values['clip_low_threshold']} and clip_high_threshold="
                         f"{values['clip_high_threshold']}: 0 <= low < 1 < high is needed (the defaults: 0.8, 1.2)")
    return {k: float(v) for k, v in values.items()}


def tinker_loss(loss_fn: str, lp: torch.Tensor, inputs: Mapping[str, torch.Tensor],
                config: Mapping[str, Any] | None = None) -> tuple[torch.Tensor, dict[str, float]]:
    """The summed loss of ``loss_fn`` on ``lp`` (the trained model's target logprobs, [B, T] or [N], zero where
    nothing is), with ``inputs`` of the same shape, and its metrics (``loss:sum``, as Tinker names them)."""
    needed_inputs(loss_fn)
    c = loss_config(loss_fn, config)
    if loss_fn == "cross_entropy":
        loss = -(inputs["weights"].to(lp.dtype) * lp).sum()
    else:
        q, advantages = inputs["logprobs"].to(lp.dtype), inputs["advantages"].to(lp.dtype)
        mask = torch.ones_like(lp, dtype=torch.bool)
        eps_low, eps_high = 1.0 - c.get("clip_low_threshold", 0.8), c.get("clip_high_threshold", 1.2) - 1.0
        if loss_fn == "importance_sampling":
            loss = -(torch.exp(log_ratio(lp, q)) * advantages).sum()
        elif loss_fn == "ppo":
            loss = clipped_surrogate(lp, q, advantages, mask, eps_low, eps_high).per_token.sum()
        elif loss_fn == "cispo":
            terms = CISPOLoss(clip_low=eps_low, clip_high=eps_high)._policy_terms(lp, q, advantages, mask)
            loss = terms.per_token.sum()
        else:  # dro
            loss = -(lp * advantages - 0.5 * c["beta"] * (lp - q).square()).sum()
    return loss, {"loss:sum": float(loss.detach())}
