"""Ledger: the "nothing lost" books of a run: where every accepted episode ended up.

An episode a rollout hands to the run is *accepted*; from then on it is in exactly one place::

    accepted = quarantined + zero_variance + rolled_back + buffered + evicted (by the replay buffer) + cleared
             + in_step (the batch of the training step in flight; 0 between steps)
             + trained + skipped_step + failed_step + trainer_died

``zero_variance``: groups whose rewards were all equal, dropped by dynamic sampling (``controller.dynamic``).
``books()`` adds the replay buffer's own counters and says whether the equation holds (``balanced``),
at any moment, not only between steps. The controller is the only writer; a checkpoint keeps
``state_dict()`` and a resumed run loads it.
"""

from __future__ import annotations

from typing import Any

from forge_nb.rl import ReplayBuffer

#: Where an accepted episode can end up, besides the buffer (which counts its own evictions).
ENDS = ("quarantined", "zero_variance", "rolled_back", "cleared", "trained", "skipped_step", "failed_step",
        "trainer_died")


class Ledger:
    """The run's books; see the module docstring."""

    def __init__(self, buffer: ReplayBuffer):
        self.buffer = buffer
        self._counts = dict.fromkeys(("accepted", *ENDS, "in_step"), 0)

    def accept(self, n: int = 1) -> None:
        self._counts["accepted"] += n

    def end(self, outcome: str, n: int = 1) -> None:
        """``n`` accepted episodes ended as ``outcome`` (one of ``ENDS``) without entering a step."""
        if outcome not in ENDS:
            raise KeyError(f"ledger outcome {outcome!r}: one of {ENDS}")
        self._counts[outcome] += n

    def begin_step(self, n: int) -> None:
        """``n`` episodes left the buffer for the training step now in flight."""
        self._counts["in_step"] += n

    def settle_step(self, outcome: str, n: int) -> None:
        """The step in flight with ``n`` episodes ended as ``outcome``: they leave ``in_step`` for it."""
        self._counts["in_step"] -= n
        self.end(outcome, n)

    def books(self) -> dict[str, Any]:
        counts = {**self._counts, **{k: v for k, v in self.buffer.counters().items() if k != "added"},
                  "buffered": len(self.buffer)}
        ends = sum(v for k, v in counts.items() if k not in ("accepted", "sampled"))
        return {**counts, "balanced": counts["accepted"] == ends}

    def state_dict(self) -> dict[str, int]:
        return dict(self._counts)

    def load_state_dict(self, state: dict[str, int]) -> None:
        unknown = set(state) - set(self._counts)
        if unknown:
            raise KeyError(f"ledger state has unknown outcomes {sorted(unknown)}")
        self._counts.update(state)
        self._counts["in_step"] = 0  # a checkpoint is taken between steps
