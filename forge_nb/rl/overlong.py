"""DAPO's soft overlong penalty and the tests of a finished group that dynamic sampling and overlong masking use.

Yu et al. 2025, "DAPO" (arXiv:2503.14476), eq. 13: with a response budget ``L_max`` and a buffer ``L_cache``, an
answer of ``L`` tokens gets

    0                                  if L <= L_max - L_cache
    (L_max - L_cache - L) / L_cache    if L_max - L_cache < L <= L_max      (from 0 down to -1)
    -1                                 if L > L_max

times ``penalty``, added to its reward (``rewards["overlong"]``) before the group's advantages.
"""

from __future__ import annotations

from forge_nb.rl.types import Episode

__all__ = ["add_overlong_penalty", "is_truncated", "overlong_penalty", "zero_variance"]


def overlong_penalty(length: int, max_tokens: int, buffer: int, penalty: float = 1.0) -> float:
    """The soft penalty (<= 0) of an answer of ``length`` tokens; see the module docstring. ``buffer`` 0: none."""
    if buffer <= 0 or length <= max_tokens - buffer:
        return 0.0
    if length > max_tokens:
        return -penalty
    return penalty * (max_tokens - buffer - length) / buffer


def add_overlong_penalty(group: list[Episode], max_tokens: int, buffer: int, penalty: float = 1.0) -> None:
    """Add each scored episode's penalty to its reward, as the reward function ``overlong`` (kept even when 0)."""
    for episode in group:
        if episode.reward is None or episode.completion is None:
            continue
        value = overlong_penalty(len(episode.completion.token_ids), max_tokens, buffer, penalty)
        episode.rewards["overlong"] = value
        episode.reward += value


def is_truncated(episode: Episode) -> bool:
    """Whether the generator cut the answer at its token budget (vLLM's finish reason "length")."""
    return episode.completion is not None and episode.completion.stop_reason == "length"


def zero_variance(group: list[Episode], tol: float = 1e-6) -> bool:
    """Whether the group's rewards are all equal (within ``tol``): its advantages are 0, it trains nothing."""
    rewards = [e.reward for e in group if e.reward is not None and not e.quarantine]
    return len(rewards) > 0 and max(rewards) - min(rewards) <= tol
