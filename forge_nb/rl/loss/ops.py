"""TorchForge's ``forge.rl.loss.ops``: compute_logprobs, compute_ratio, compute_kl and aggregate, returning tensors.

The implementation and the conventions (alignment, ignore index, on-policy ratio, k3 cap) are documented in
``forge_nb.rl.losses.primitives``; this module is the public path the TorchForge documents import from.
"""

from forge_nb.rl.losses.primitives import (
    CROSS_ENTROPY_IGNORE_IDX,
    aggregate,
    compute_kl,
    compute_logprobs,
    compute_ratio,
    create_shifted_targets,
    masked_mean,
)

__all__ = [
    "CROSS_ENTROPY_IGNORE_IDX",
    "aggregate",
    "compute_kl",
    "compute_logprobs",
    "compute_ratio",
    "create_shifted_targets",
    "masked_mean",
]
