"""RolloutConfig: what a run does with finished groups before they train (dynamic sampling, overlong answers).

DAPO's data side (Yu et al. 2025, "DAPO", arXiv:2503.14476, sections 3.2 and 3.4): a group whose rewards are
all equal has advantage 0 and trains nothing but fills the batch; an answer cut at the response budget is
trained as if it had ended. ``RunConfig.rollout`` holds the options; the controller applies them
(``forge_nb.controller.intake.dynamic``) and ``forge_nb.rl.overlong`` holds the penalty's formula.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["RolloutConfig"]


@dataclass(kw_only=True)
class RolloutConfig:
    """Options on finished groups, between the episode function and the replay buffer."""

    dynamic_sampling: bool = False
    """Drop groups whose rewards have zero variance (all right or all wrong: advantage 0) and refill the batch
    from new rollouts (DAPO; tinker-cookbook's ``remove_constant_reward_groups``, verl's ``filter_groups``).
    Every dropped episode is counted in the ledger (``zero_variance``); each step's row says how many groups
    were generated and dropped (``groups/generated``, ``groups/dropped``) and ``frac_reward_zero_std``."""
    refill_timeout_s: float = 120.0
    """With dynamic sampling, how long a step waits for a full batch of informative groups before it trains on
    the whole groups it has (a "refill_timeout" event says so): on a task the policy has saturated, refilling
    could otherwise wait for ever."""
    mask_truncated: bool = False
    """Train nothing on answers cut at the response budget (the generator's stop reason "length"): their
    tokens leave the loss (zero gradient); their reward still counts in their group's advantages. Use it when
    truncation is rare and a cut answer's reward says little about its tokens (DAPO's overlong filtering)."""
    overlong_buffer: int = 0
    """DAPO's soft overlong penalty: the last ``overlong_buffer`` tokens of the response budget cost reward
    linearly, up to ``overlong_penalty`` at the budget (``forge_nb.rl.overlong``); 0: no penalty. Use it to
    teach a policy to finish within its budget rather than ramble into it."""
    overlong_penalty: float = 1.0
    """The penalty at the budget itself (DAPO's is 1, on rewards in [0, 1] or [-1, 1])."""

    def __post_init__(self) -> None:
        for name in ("dynamic_sampling", "mask_truncated"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"RolloutConfig.{name}={getattr(self, name)!r}: must be True or False")
        t = self.refill_timeout_s
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0 < t < math.inf:
            raise ValueError(f"RolloutConfig.refill_timeout_s={t!r}: must be a number of seconds > 0 (e.g. 120); "
                             "after it a step trains on the groups it has")
        b = self.overlong_buffer
        if isinstance(b, bool) or not isinstance(b, int) or b < 0:
            raise ValueError(f"RolloutConfig.overlong_buffer={b!r}: must be an integer >= 0 (tokens before the "
                             "response budget where the penalty grows; 0 turns it off)")
        p = self.overlong_penalty
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0 <= p < math.inf:
            raise ValueError(f"RolloutConfig.overlong_penalty={p!r}: must be a finite number >= 0 (DAPO uses 1)")

    def check_budget(self, max_tokens: int) -> None:
        """The penalty's ramp fits in the response budget (``RunConfig`` calls it with its max_tokens)."""
        if self.overlong_buffer >= max_tokens:
            raise ValueError(f"rollout.overlong_buffer={self.overlong_buffer} is not below the response budget "
                             f"max_tokens={max_tokens}: every answer would be penalised; use a buffer of a fraction of "
                             f"it (DAPO: 4096 of 20480), e.g. {max(1, max_tokens // 4)}")
