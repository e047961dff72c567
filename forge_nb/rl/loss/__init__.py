"""TorchForge's loss package, ``forge.rl.loss``, on forge_nb: the policy losses and the ops a custom loss uses.

    from forge_nb.rl.loss import GRPOLoss, DAPOLoss
    loss_fn = GRPOLoss(clip_low=0.2, clip_high=0.28, beta=0.1, agg_type="fixed_horizon")
    loss, metrics = loss_fn(logits=logits, target_ids=target_ids, advantages=advantages,
                            generator_logprobs=generator_logprobs, loss_mask=loss_mask,
                            ref_logprobs=ref_logprobs)

The loss classes are forge_nb.rl.losses' own (the same objects, so ``RLTrainer(loss=GRPOLoss(...))``
and ``make_loss("grpo")`` agree); ``forge_nb.rl.loss.ops`` holds compute_logprobs, compute_ratio,
compute_kl and aggregate with TorchForge's meanings (``logits[:, t]`` predicts ``target_ids[:, t]``).
"""

from forge_nb.rl.loss import ops
from forge_nb.rl.loss.ops import (
    CROSS_ENTROPY_IGNORE_IDX,
    aggregate,
    compute_kl,
    compute_logprobs,
    compute_ratio,
    create_shifted_targets,
    masked_mean,
)
from forge_nb.rl.losses import (
    AGG_TYPES,
    LOSSES,
    CISPOLoss,
    DAPOLoss,
    DrGRPOLoss,
    GRPOLoss,
    GSPOLoss,
    PolicyLoss,
    SAPOLoss,
    make_loss,
)

__all__ = [
    "AGG_TYPES",
    "CROSS_ENTROPY_IGNORE_IDX",
    "LOSSES",
    "CISPOLoss",
    "DAPOLoss",
    "DrGRPOLoss",
    "GRPOLoss",
    "GSPOLoss",
    "PolicyLoss",
    "SAPOLoss",
    "aggregate",
    "compute_kl",
    "compute_logprobs",
    "compute_ratio",
    "create_shifted_targets",
    "make_loss",
    "masked_mean",
    "ops",
]
