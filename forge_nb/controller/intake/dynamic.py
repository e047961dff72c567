"""The gate between a finished group and the replay buffer: dynamic sampling, overlong masking, and their counters.

``RunConfig.rollout`` (``forge_nb.config.RolloutConfig``) says what it does. Every group passes through
``GroupGate.admit`` before the controller accepts it:

- its rewards' spread is measured (``frac_reward_zero_std`` in each step's row, with or without dynamic sampling);
- with ``dynamic_sampling``, a group whose rewards are all equal is dropped: its episodes are accepted and end as
  ``zero_variance`` in the ledger at once (nothing is dropped without being counted), and the rollout loops go on
  making groups, which refills the batch; a group with a quarantined episode is never dropped here (the
  controller's quarantine watch counts it);
- with ``mask_truncated``, each answer the generator cut at its budget keeps its reward but none of its tokens
  trains (``Episode.policy_mask`` all false: zero gradient from every term of the loss).

``RLBatches.take`` asks ``refill_expired`` while it waits for a batch: past ``refill_timeout_s`` of refilling, the
step trains on what the buffer holds and a "refill_timeout" event says so. The row of each step (``row()``) has
``groups/generated``, ``groups/dropped`` and ``groups/trained`` since the previous step, and ``frac_reward_zero_std``.
"""

from __future__ import annotations

from typing import Any

import torch

from forge_nb.controller.intake.ledger import Ledger
from forge_nb.rl import Episode
from forge_nb.rl.overlong import is_truncated, zero_variance

__all__ = ["GroupGate"]


class GroupGate:
    """Applies a run's ``RolloutConfig`` to each finished group and counts what it did (see the module docstring)."""

    def __init__(self, rollout: Any, ledger: Ledger):
        self.rollout, self.ledger = rollout, ledger
        self._generated = self._dropped = self._flat = self._truncated = 0
        self.totals = dict.fromkeys(("groups_generated", "groups_dropped", "episodes_dropped", "masked_truncated"), 0)

    def admit(self, group: list[Episode]) -> list[Episode]:
        """The group to accept, or [] when dynamic sampling dropped it (its episodes then counted in the ledger)."""
        if not group:
            return group
        self._generated += 1
        self.totals["groups_generated"] += 1
        flat = zero_variance(group)
        self._flat += flat
        # a group with a quarantined episode goes on to accept(), whose quarantine watch must see every failure
        if flat and self.rollout.dynamic_sampling and not any(e.quarantine for e in group):
            self._dropped += 1
            self.totals["groups_dropped"] += 1
            self.totals["episodes_dropped"] += len(group)
            self.ledger.accept(len(group))
            self.ledger.end("zero_variance", len(group))
            return []
        if self.rollout.mask_truncated:
            for episode in group:
                if is_truncated(episode):
                    episode.policy_mask = torch.zeros(len(episode.completion.token_ids), dtype=torch.bool)
                    self._truncated += 1
                    self.totals["masked_truncated"] += 1
        return group

    def refill_expired(self, waited_s: float) -> bool:
        """Whether a step waiting ``waited_s`` for a full batch should train on what it has."""
        return self.rollout.dynamic_sampling and waited_s > self.rollout.refill_timeout_s

    def refill_left(self, waited_s: float) -> float | None:
        """Seconds until ``refill_expired`` (None: no dynamic sampling, or already expired)."""
        left = self.rollout.refill_timeout_s - waited_s
        return left if self.rollout.dynamic_sampling and left > 0 else None

    def row(self, trained_episodes: int, group_size: int) -> dict[str, float]:
        """This step's counters (groups generated and dropped since the last step's row), then starts over."""
        out = {"groups/generated": float(self._generated), "groups/dropped": float(self._dropped),
               "groups/trained": trained_episodes / group_size,
               "frac_reward_zero_std": self._flat / self._generated if self._generated else 0.0}
        if self.rollout.mask_truncated:
            out["episodes/masked_truncated"] = float(self._truncated)
        self._generated = self._dropped = self._flat = self._truncated = 0
        return out
