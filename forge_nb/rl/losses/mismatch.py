"""How far the generator's logprobs are from the trainer's, and the importance weights that correct for it.

The generator (vLLM) samples with its own kernels and numerics, and in async mode with weights up to
``max_policy_age`` versions old; the trainer recomputes the logprob of every sampled token before its step.
Per token, with ``r = pi_trainer / pi_generator`` (the trainer's logprob, detached, minus the generator's):

- ``mismatch/kl``: Schulman's k3 estimator ``r - 1 - log r`` of KL(pi_generator || pi_trainer), the tokens
  being samples of the generator; never negative, 0 when the two agree (prime-rl's "mismatch_kl").
- ``mismatch/ratio_p1``, ``_p50``, ``_p99``, ``_min``, ``_max``: the ratio's tail, which a mean hides.
- ``mismatch/frac_outside``: the share of tokens whose ratio lies outside ``[1 / cap, cap]``.

A correction (``PolicyLoss.mismatch_correction``) makes the loss's own ratio and clip relative to the trainer's
logprobs before the step (the proximal policy, as TRL and verl recompute it) and multiplies each token's policy
term by a detached importance weight ``w`` against the generator:

================  ==============================================================================
mode              weight of a token
================  ==============================================================================
token_truncate    ``min(r_t, cap)`` (truncated IS, TIS)
token_mask        ``r_t`` where ``floor <= r_t <= cap``, else 0 (masked IS, MIS)
sequence_*        the same with the sequence's geometric mean ``exp(mean_t log r_t)`` for every token
================  ==============================================================================

Without a correction (``"off"``) the losses keep the generator's logprobs as the old policy: their ratio is then
already taken against the behaviour policy and bounded by their own clip (verl's "bypass" arrangement).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Literal

from forge_nb.rl.losses.ops import MAX_LOG_RATIO, masked_mean

if TYPE_CHECKING:
    import torch

__all__ = ["CORRECTIONS", "TOKEN_RATIOS", "Correction", "check_mismatch", "importance_weights", "mismatch_metrics",
           "token_ratios"]

Correction = Literal["off", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]
CORRECTIONS: tuple[str, ...] = ("off", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask")
TOKEN_RATIOS = "mismatch/token_ratios"  #: the trainer's per-row ratios, handed from the train step to the explorer
_QUANTILES = ((0.01, "p1"), (0.5, "p50"), (0.99, "p99"))
#: torch.quantile refuses inputs above 2**24 elements: a larger batch's tail is read from a strided sample
_QUANTILE_LIMIT = 1 << 24


def check_mismatch(owner: str, correction: str, cap: float, floor: float) -> None:
    """A ValueError naming the field, the value and the fix for a bad correction setting."""
    if correction not in CORRECTIONS:
        raise ValueError(f"{owner}.mismatch_correction={correction!r}: choose one of {list(CORRECTIONS)} "
                         "('off' leaves the ratio against the generator's logprobs, as the losses take it)")
    if isinstance(cap, bool) or not isinstance(cap, int | float) or not 1.0 <= cap < float("inf"):
        raise ValueError(f"{owner}.mismatch_cap={cap!r}: must be a finite number >= 1 (the largest importance weight "
                         "kept; a cap below 1 would truncate or mask agreeing tokens too). 2.0 is TIS's and verl's "
                         "default, TRL's is 3.0")
    if isinstance(floor, bool) or not isinstance(floor, int | float) or not 0.0 <= floor < 1.0:
        raise ValueError(f"{owner}.mismatch_floor={floor!r}: must be in [0, 1) (mask modes drop weights below it; "
                         "0 drops none, 0.5 is IcePop's lower bound)")


def _log_ratio(logprobs: torch.Tensor, generator_logprobs: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    log_r = logprobs.detach().to(dtype) - generator_logprobs.detach().to(dtype)
    return log_r.clamp(-MAX_LOG_RATIO, MAX_LOG_RATIO)


def importance_weights(
    logprobs: torch.Tensor, generator_logprobs: torch.Tensor, mask: torch.Tensor, correction: str, cap: float,
    floor: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(weights [B, T], changed [B, T] bool): the detached importance weight of every token under ``correction``
    (see the module docstring), and the tokens the cap truncated or the band masked. ``mask`` [B, T] is true
    on the trained tokens; weights elsewhere are 0."""
    import torch
    valid = mask.bool()
    log_r = _log_ratio(logprobs, generator_logprobs, torch.float32) * valid
    if correction.startswith("sequence"):
        per_seq = log_r.sum(-1, keepdim=True) / valid.sum(-1, keepdim=True).clamp(min=1)
        log_r = per_seq.expand_as(log_r)
    ratio = torch.exp(log_r)
    if correction.endswith("truncate"):
        changed = ratio > cap
        weights = ratio.clamp(max=cap)
    elif correction.endswith("mask"):
        changed = (ratio > cap) | (ratio < floor)
        weights = ratio.masked_fill(changed, 0.0)
    else:
        raise ValueError(f"importance_weights: correction {correction!r} is none of {list(CORRECTIONS[1:])}")
    return weights * valid, changed & valid


def mismatch_metrics(
    logprobs: torch.Tensor, generator_logprobs: torch.Tensor, mask: torch.Tensor, cap: float,
    rows: torch.Tensor | None = None,
) -> dict[str, float]:
    """The ``mismatch/*`` metrics of the module docstring over the trained tokens (``mask`` [B, T]);
    with ``rows`` [B] bool, also ``mismatch/kl_same_version`` over those rows alone (the episodes generated by the
    weights being trained: their mismatch is the engine's alone), when there are any."""
    import torch
    valid = mask.bool()
    if not valid.any():
        return {}
    log_r = _log_ratio(logprobs, generator_logprobs, torch.float64)
    k3 = torch.expm1(log_r) - log_r  # in float64: float32's exp(x) - 1 - x cancels to noise (even < 0) at 1e-9
    ratio = torch.exp(log_r[valid])
    sample = ratio if ratio.numel() <= _QUANTILE_LIMIT else ratio[:: ratio.numel() // _QUANTILE_LIMIT + 1]
    quantiles = torch.quantile(sample, torch.tensor([q for q, _ in _QUANTILES], dtype=torch.float64,
                                                    device=sample.device))
    out = {"mismatch/kl": masked_mean(k3, valid).item()}
    out |= {f"mismatch/ratio_{name}": float(v) for (_, name), v in zip(_QUANTILES, quantiles.tolist(), strict=True)}
    out |= {"mismatch/ratio_min": ratio.min().item(), "mismatch/ratio_max": ratio.max().item(),
            "mismatch/frac_outside": ((ratio > cap) | (ratio < 1.0 / cap)).double().mean().item()}
    if rows is not None:
        same = valid & rows.to(valid.device).bool().reshape(-1, 1)
        if same.any():
            out["mismatch/kl_same_version"] = masked_mean(k3, same).item()
    return out


def token_ratios(logprobs: torch.Tensor, generator_logprobs: torch.Tensor, mask: torch.Tensor) -> list[Any]:
    """Each row's per-token ratio ``pi_trainer / pi_generator`` over its trained tokens, as float16 arrays (the
    explorer's view; numpy, which pickles a row in a fraction of a tensor's time)."""
    import numpy as np
    import torch

    ratio = torch.exp(_log_ratio(logprobs, generator_logprobs, torch.float32)).cpu().numpy().astype(np.float16)
    valid = mask.bool().cpu().numpy()
    return [ratio[i][valid[i]] for i in range(ratio.shape[0])]
