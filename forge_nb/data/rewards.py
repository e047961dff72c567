"""The documents' ``forge.data.rewards``: torchforge's GSM8K reward functions, from ``forge_nb.rl.rewards``.

Both are plain callables ``(prompt, response, target) -> float``, usable in the kernel, in
``forge_nb.rl.score`` or in ``RewardActor(reward_functions=[MathReward(), ThinkingReward()])``.
"""

from forge_nb.rl.rewards import MathReward, ThinkingReward

__all__ = ["MathReward", "ThinkingReward"]
