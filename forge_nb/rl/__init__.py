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

Its names load with their module on first use (PEP 562): a RunConfig checks its loss and advantage names in the
kernel before the first spawn, and the modules behind most names here import torch.
"""
from __future__ import annotations

import importlib
from typing import Any

# public name -> the module that defines it
_EXPORTS = {
    "ADVANTAGE_METHODS": "forge_nb.rl.advantages",
    "AdvantageMethod": "forge_nb.rl.advantages",
    "assign_advantages": "forge_nb.rl.advantages",
    "group_relative": "forge_nb.rl.advantages",
    "leave_one_out": "forge_nb.rl.advantages",
    "AGG_MODES": "forge_nb.rl.losses",
    "AGG_TYPES": "forge_nb.rl.losses",
    "AggMode": "forge_nb.rl.losses",
    "CISPOLoss": "forge_nb.rl.losses",
    "DAPOLoss": "forge_nb.rl.losses",
    "DrGRPOLoss": "forge_nb.rl.losses",
    "GRPOLoss": "forge_nb.rl.losses",
    "GSPOLoss": "forge_nb.rl.losses",
    "LOSSES": "forge_nb.rl.losses",
    "PolicyLoss": "forge_nb.rl.losses",
    "SAPOLoss": "forge_nb.rl.losses",
    "aggregate": "forge_nb.rl.losses",
    "aligned_logits": "forge_nb.rl.losses",
    "compute_logprobs": "forge_nb.rl.losses",
    "entropy_from_logits": "forge_nb.rl.losses",
    "make_loss": "forge_nb.rl.losses",
    "ReplayBuffer": "forge_nb.rl.replay_buffer",
    "MathReward": "forge_nb.rl.rewards",
    "RewardFn": "forge_nb.rl.rewards",
    "RewardResult": "forge_nb.rl.rewards",
    "ThinkingReward": "forge_nb.rl.rewards",
    "extract_answer": "forge_nb.rl.rewards",
    "reward_name": "forge_nb.rl.rewards",
    "score": "forge_nb.rl.rewards",
    "GSM8K_SYSTEM_PROMPT": "forge_nb.rl.tasks",
    "Gsm8kTask": "forge_nb.rl.tasks",
    "PatternReward": "forge_nb.rl.tasks",
    "Task": "forge_nb.rl.tasks",
    "ToyTask": "forge_nb.rl.tasks",
    "gsm8k_transform": "forge_nb.rl.tasks",
    "load_gsm8k": "forge_nb.rl.tasks",
    "Completion": "forge_nb.rl.types",
    "Episode": "forge_nb.rl.types",
    "ForwardBackwardResult": "forge_nb.rl.types",
    "Group": "forge_nb.rl.types",
    "SeedBatch": "forge_nb.rl.types",
    "TextTrainBatch": "forge_nb.rl.types",
    "TrainBatch": "forge_nb.rl.types",
    "collate": "forge_nb.rl.types",
    "collate_seed": "forge_nb.rl.types",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'forge_nb.rl' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
