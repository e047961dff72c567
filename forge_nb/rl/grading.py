"""The skill card's ``forge.rl.grading``: ``RewardActor``, the base class of reward graders.

``class MathReward(RewardActor): def grade(self, prompt, completion, metadata) -> float`` works as in the
skill card; see ``forge_nb.actors.reward`` for what a subclass can do (be a reward function, or deploy
as a service).

``RewardActor`` is an actor, so it lives in ``forge_nb.actors.reward``; ``forge_nb.rl`` stays free of
monarch (its modules import only torch and the standard library). This module resolves the name on
first use instead of importing it, so ``import forge_nb.rl.grading`` loads nothing heavy. It is the one
place where ``rl`` reaches up to ``actors``, and only lazily, because the documents name this path.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["RewardActor", "RewardFunctionError"]  # noqa: F822 -- resolved by __getattr__ below


def __getattr__(name: str) -> Any:
    if name in __all__:
        return getattr(importlib.import_module("forge_nb.actors.reward"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
