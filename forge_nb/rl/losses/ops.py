"""Tensor helpers shared by the losses: logprobs and entropy from logits, and loss aggregation.

`compute_logprobs` and `entropy_from_logits` work one batch row at a time in float32: a full
`log_softmax` over [B, T, V] would materialise a second logits-sized tensor (for a 150k vocabulary
that is the largest allocation of the step), while a row costs only [T, V].
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

__all__ = [
    "AGG_MODES",
    "AGG_TYPES",
    "AggMode",
    "CROSS_ENTROPY_IGNORE_IDX",
    "agg_mode",
    "aggregate",
    "aligned_logits",
    "compute_logprobs",
    "entropy_from_logits",
    "masked_mean",
]

# exp() of a log-ratio beyond this overflows float32 long before it carries information; clamping keeps
# one wild token (a bf16 rounding artefact, a stale episode) from turning the whole loss into inf/nan.
MAX_LOG_RATIO = 20.0

AggMode = Literal["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"]
AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
# torchforge's `agg_type` names for the same reductions: "fixed_horizon" divides by B * T (a constant
# horizon, Dr. GRPO), "sequence_mean" is the mean of per-sequence token means (GRPO's 1/|o_i|).
AGG_TYPES: dict[str, AggMode] = {
    "token_mean": "token-mean",
    "sequence_mean": "seq-mean-token-mean",
    "fixed_horizon": "seq-mean-token-sum-norm",
}


def agg_mode(value: str, owner: str = "aggregate") -> AggMode:
    """forge_nb's aggregation mode for `value`, a forge_nb mode or one of torchforge's agg_type names."""
    if value in AGG_MODES:
        return value  # type: ignore[return-value]
    if value in AGG_TYPES:
        return AGG_TYPES[value]
    raise ValueError(
        f"{owner}: unknown aggregation {value!r}; use one of forge_nb's {list(AGG_MODES)} "
        f"or torchforge's agg_type names {list(AGG_TYPES)}"
    )


#: Logits up to this many elements (16 MiB as float32) are reduced in one pass, larger ones a row at a time.
WHOLE_BATCH_ELEMENTS = 2**22


CROSS_ENTROPY_IGNORE_IDX = -100  # a target position that is not trained (torch's cross-entropy convention)


def compute_logprobs(
    logits: torch.Tensor,
    target_ids: torch.Tensor,
    temperature: float = 1.0,
    ignore_index: int = CROSS_ENTROPY_IGNORE_IDX,
) -> torch.Tensor:
    """Logprob of each target token: ``log_softmax(logits / temperature)`` gathered at ``target_ids``.

    logits: [B, T, V] aligned with target_ids: [B, T], ``logits[:, t]`` predicting ``target_ids[:, t]`` (the
    TorchForge documents' convention); returns float32 [B, T], 0 where the target is ``ignore_index``.
    For the logits of a whole request + response, :func:`aligned_logits` picks the positions that predict
    the response. Gradient flows to ``logits``.
    """
    import torch
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}; use the sampling temperature, or 1.0 "
                         "for greedy sampling (temperature 0: the logprobs of the raw logits)")
    if logits.dim() != 3 or target_ids.shape != logits.shape[:2]:
        raise ValueError(
            f"compute_logprobs expects logits [B, T, V] aligned with target_ids [B, T], got "
            f"{tuple(logits.shape)} and {tuple(target_ids.shape)}; logits[:, t] must predict target_ids[:, t] "
            "(for the logits of a whole sequence, pass aligned_logits(logits, T))"
        )
    ignored = target_ids == ignore_index
    safe = target_ids.masked_fill(ignored, 0)
    # A row at a time keeps one row's float32 copy alive, not the batch's (large vocabularies); small
    # logits go in one pass: 16 rows of the quickstart took 1.2 ms a row at a time, 0.14 in one pass.
    if logits.numel() <= WHOLE_BATCH_ELEMENTS:
        picked = _picked_logprobs(logits, safe, temperature)
    else:
        picked = torch.stack([_picked_logprobs(row, ids, temperature) for row, ids in zip(logits, safe, strict=True)])
    return picked.masked_fill(ignored, 0.0)


def aligned_logits(logits: torch.Tensor, num_targets: int) -> torch.Tensor:
    """The positions of a whole sequence's logits [B, L, V] that predict its last ``num_targets`` tokens,
    ``logits[:, L - T - 1 : L - 1]``: a causal model's position t predicts token t + 1, so the response's T
    tokens are predicted by the T positions before the last one."""
    if logits.dim() != 3 or logits.shape[1] < num_targets + 1:
        raise ValueError(f"aligned_logits needs logits [B, L, V] of at least T + 1 = {num_targets + 1} positions, "
                         f"got {tuple(logits.shape)}; pass the logits of the whole request + response sequence")
    return logits[:, -num_targets - 1 : -1]


def _picked_logprobs(logits: torch.Tensor, target_ids: torch.Tensor, temperature: float) -> torch.Tensor:
    import torch
    z = logits.float() / temperature
    return z.gather(-1, target_ids.long().unsqueeze(-1)).squeeze(-1) - torch.logsumexp(z, dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of `softmax(logits)` over the last dimension, in float32: [..., V] -> [...]."""
    import torch
    if logits.dim() < 2:
        raise ValueError(f"entropy_from_logits expects [..., V] logits, got shape {tuple(logits.shape)}")
    # iterate over [T, V] slices so only one slice's softmax is alive at a time (small logits: one pass)
    if logits.numel() <= WHOLE_BATCH_ELEMENTS:
        slices = logits.reshape(1, -1, logits.shape[-1])
    else:
        slices = logits.unsqueeze(0) if logits.dim() == 2 else logits.reshape(-1, *logits.shape[-2:])
    rows = []
    for row in slices:
        row = row.float()
        # H = logsumexp(z) - sum_v softmax(z)_v z_v: one softmax, no log of small probabilities
        rows.append(torch.logsumexp(row, dim=-1) - (torch.softmax(row, dim=-1) * row).sum(-1))
    return torch.stack(rows).reshape(logits.shape[:-1])


def masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of `values` where `mask` is True; 0 when the mask is empty."""
    mask = mask.to(values.dtype)
    return (values * mask).sum() / mask.sum().clamp(min=1.0)


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, mode: AggMode, norm_len: int | None = None
) -> torch.Tensor:
    """Reduce a [B, T] per-token loss to a scalar.

    - "token-mean": sum over all valid tokens / number of valid tokens. Every token weighs the same,
      so long responses are not diluted (DAPO).
    - "seq-mean-token-mean": mean over sequences of each sequence's token mean (GRPO, the seed).
    - "seq-mean-token-sum": mean over sequences of each sequence's token sum.
    - "seq-mean-token-sum-norm": sum over valid tokens / (B * norm_len), norm_len a constant
      (default T): Dr. GRPO's length-unbiased normaliser.
    Sequences without a valid token contribute 0 and still count in the sequence means.
    """
    m = mask.to(per_token.dtype)
    summed = per_token * m
    if mode == "token-mean":
        return summed.sum() / m.sum().clamp(min=1.0)
    if mode == "seq-mean-token-mean":
        return (summed.sum(-1) / m.sum(-1).clamp(min=1.0)).mean()
    if mode == "seq-mean-token-sum":
        return summed.sum(-1).mean()
    if mode == "seq-mean-token-sum-norm":
        denominator = per_token.shape[-1] if norm_len is None else norm_len
        return summed.sum() / (per_token.shape[0] * denominator)
    raise ValueError(f"unknown aggregation {mode!r}; choose one of {list(AGG_MODES)}")
