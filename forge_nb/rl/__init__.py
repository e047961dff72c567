"""The RL core of forge_nb: episodes, replay buffer, advantages, losses, rewards and tasks.

Pure PyTorch and the standard library (math_verify and datasets are imported lazily where needed), so it
runs, and is tested, without monarch, vLLM or a notebook. One GRPO step in these terms:

    group = [Episode(...completion=c) for c in completions]   # one prompt, G completions
    for ep in group: (await score(task.reward_fns, ep.prompt, ep.completion.text, ep.target)).apply_to(ep)
    assign_advantages(group)                                  # group-relative, quarantine-aware
    for ep in group: buffer.add(ep)
    batch = collate(buffer.sample(curr_policy_version=step)[0])
    loss, metrics = make_loss("grpo")(logprobs, batch.ref_logprobs, batch.generator_logprobs,
                                      batch.advantages, batch.response_mask)
"""

from forge_nb.rl.advantages import (
    ADVANTAGE_METHODS,
    AdvantageMethod,
    assign_advantages,
    group_relative,
    leave_one_out,
)
from forge_nb.rl.losses import (
    AGG_MODES,
    AGG_TYPES,
    LOSSES,
    AggMode,
    CISPOLoss,
    DAPOLoss,
    DrGRPOLoss,
    GRPOLoss,
    GSPOLoss,
    PolicyLoss,
    SAPOLoss,
    aggregate,
    aligned_logits,
    compute_logprobs,
    entropy_from_logits,
    make_loss,
)
from forge_nb.rl.replay_buffer import ReplayBuffer
from forge_nb.rl.rewards import (
    MathReward,
    RewardFn,
    RewardResult,
    ThinkingReward,
    extract_answer,
    reward_name,
    score,
)
from forge_nb.rl.tasks import (
    GSM8K_SYSTEM_PROMPT,
    Gsm8kTask,
    PatternReward,
    Task,
    ToyTask,
    gsm8k_transform,
    load_gsm8k,
)
from forge_nb.rl.types import (
    Completion,
    Episode,
    ForwardBackwardResult,
    Group,
    SeedBatch,
    TextTrainBatch,
    TrainBatch,
    collate,
    collate_seed,
)

__all__ = [
    "ADVANTAGE_METHODS",
    "AGG_MODES",
    "AGG_TYPES",
    "GSM8K_SYSTEM_PROMPT",
    "LOSSES",
    "AdvantageMethod",
    "AggMode",
    "CISPOLoss",
    "Completion",
    "DAPOLoss",
    "DrGRPOLoss",
    "Episode",
    "ForwardBackwardResult",
    "GRPOLoss",
    "GSPOLoss",
    "Group",
    "Gsm8kTask",
    "MathReward",
    "PatternReward",
    "PolicyLoss",
    "ReplayBuffer",
    "RewardFn",
    "RewardResult",
    "SAPOLoss",
    "SeedBatch",
    "Task",
    "TextTrainBatch",
    "ThinkingReward",
    "ToyTask",
    "TrainBatch",
    "aggregate",
    "aligned_logits",
    "assign_advantages",
    "collate",
    "collate_seed",
    "compute_logprobs",
    "entropy_from_logits",
    "extract_answer",
    "group_relative",
    "gsm8k_transform",
    "leave_one_out",
    "load_gsm8k",
    "make_loss",
    "reward_name",
    "score",
]
