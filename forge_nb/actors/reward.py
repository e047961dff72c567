"""RewardActor: reward functions behind an ``evaluate_response`` endpoint, as the TorchForge documents use it.

One class serves both of the documents' forms (a thin shell over ``forge_nb.rl.rewards.score``):

- apps/grpo's: ``RewardActor.options(num_replicas=2).as_service(reward_functions=[MathReward(),
  ThinkingReward()])``; ``evaluate_response.route(prompt=, response=, target=)`` returns the mean of the
  functions' rewards, a float;
- the skill card's base class (``forge_nb.rl.grading.RewardActor`` is this class)::

      class MathReward(RewardActor):
          def grade(self, prompt: str, completion: str, metadata: dict) -> float: ...

  A subclass instance is a reward function itself (``instance(prompt, response, target)`` calls
  ``grade`` with ``metadata={"answer": target}``, or the target when it is already a dict), so it can be
  passed in ``reward_functions=[...]``; and the subclass deploys alone: ``MathReward.options().as_service()``
  then ``evaluate_response.route(...)``. Creating an instance in the kernel needs no process (checked on
  monarch 0.7: an Actor subclass instantiates and pickles like a plain object; only its endpoints need a
  spawned actor). The subclass must be importable by the spawned process (defined in a module, not a cell).

A reward function that raises, or returns something that is not a finite number (NaN, None, a bool...),
makes ``evaluate_response`` raise ``RewardFunctionError`` naming the function and what it did: a reward
of 0 from a crashed grader would silently teach the policy something false. ``score`` never raises
for them: it returns the ``RewardResult`` (total 0.0, the per-function rewards that were valid, and the
quarantine reason) for code that wants to keep the episode for inspection.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from monarch.actor import endpoint

from forge_nb.rl.rewards import RewardFn, RewardResult, score
from forge_nb.service.actor import ForgeActor

__all__ = ["RewardActor", "RewardFunctionError"]


class RewardFunctionError(ValueError):
    """A reward function raised or returned something other than a finite number."""


class RewardActor(ForgeActor):
    """Scores responses with ``reward_functions``, or with ``grade`` in a subclass.

    Args:
        reward_functions: Callables ``(prompt, response, target) -> float``, sync or async; their mean is
            the reward. Leave it out in a subclass that defines ``grade``.
    """

    def __init__(self, reward_functions: Sequence[RewardFn] | None = None) -> None:
        grades = type(self).grade is not RewardActor.grade
        if reward_functions is not None and grades:
            raise ValueError(
                f"{type(self).__name__} defines grade() and also got reward_functions; pass "
                "reward_functions to RewardActor itself, or deploy the subclass without them"
            )
        if reward_functions is None and not grades:
            raise ValueError(
                "RewardActor needs reward_functions=[...] (e.g. [MathReward(), ThinkingReward()]), or "
                "subclass it and define grade(self, prompt, completion, metadata) -> float"
            )
        if reward_functions is not None:
            reward_functions = list(reward_functions)
            bad = [f for f in reward_functions if not callable(f)]
            if not reward_functions or bad:
                raise ValueError(
                    f"reward_functions must be a non-empty list of callables (prompt, response, target) -> "
                    f"float; got {reward_functions!r}"
                )
        self.reward_functions: list[RewardFn] | None = reward_functions

    def grade(self, prompt: str, completion: str, metadata: dict[str, Any]) -> float:
        """The skill card's hook: the reward of ``completion``; ``metadata["answer"]`` is the target."""
        raise NotImplementedError(f"{type(self).__name__}.grade() is not defined; see RewardActor's docstring")

    def __call__(self, prompt: str, response: str, target: Any = None) -> float:
        """A subclass as a plain reward function: ``grade`` with the target as ``metadata["answer"]``."""
        metadata = target if isinstance(target, dict) else {"answer": target}
        return self.grade(prompt, response, metadata)

    def _functions(self) -> list[RewardFn]:
        return self.reward_functions if self.reward_functions is not None else [self]

    @endpoint
    async def score(self, prompt: str, response: str, target: Any = None) -> RewardResult:
        """Every function's reward, the mean, and the quarantine reason if one failed; never raises."""
        return await score(self._functions(), prompt, response, target)

    @endpoint
    async def evaluate_response(self, prompt: str, response: str, target: Any = None) -> float:
        """The mean reward over the functions; raises ``RewardFunctionError`` if one fails."""
        result = await score(self._functions(), prompt, response, target)
        if result.quarantine is not None:
            raise RewardFunctionError(
                f"{result.quarantine}. The response is not scored; fix the reward function, or call "
                "score(...) instead to get the RewardResult with the reason"
            )
        return result.total
