"""QuarantineWatch: quarantined episodes counted per reason, reported in bounded space, and a run that
produces almost nothing but quarantined episodes stopped with a message that names the cause.

A reward function that always raises (or returns NaN) quarantines every episode: one event each
would be thousands of events a minute, and the trainer would starve with nothing to train on while
the only signal blamed the generators. Instead the controller notes every accepted episode here;
``flush`` records one "quarantine" event per interval with the count per reason and the last
message, and ``overwhelmed`` says when at least ``OVERWHELMED`` of the last ``window`` episodes
were quarantined, with a message naming the reward function and its last exception.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from typing import Any

#: The share of the window's episodes that were quarantined at which the run is paused.
OVERWHELMED = 0.9


def reason_key(reason: str) -> str:
    """What repeats of one problem share: the text up to the exception's message."""
    head, sep, _ = reason.partition(": ")
    return head if sep else reason[:120]


class QuarantineWatch:
    """Counts of quarantined episodes per reason since the last report, and a window of recent outcomes."""

    def __init__(self, window: int, interval_s: float = 5.0):
        self.window, self.interval_s = window, interval_s
        self._recent: deque[bool] = deque(maxlen=window)
        self._pending: Counter[str] = Counter()
        self._last: dict[str, str] = {}
        self._total: Counter[str] = Counter()
        self._flushed = time.monotonic()

    def note(self, quarantine: str | None) -> None:
        self._recent.append(quarantine is not None)
        if quarantine is not None:
            key = reason_key(quarantine)
            self._pending[key] += 1
            self._total[key] += 1
            self._last[key] = quarantine

    def due(self) -> bool:
        return bool(self._pending) and time.monotonic() - self._flushed >= self.interval_s

    def flush(self) -> dict[str, Any] | None:
        """The event data of what was quarantined since the last report (None if nothing was)."""
        self._flushed = time.monotonic()
        if not self._pending:
            return None
        counts, self._pending = dict(self._pending), Counter()
        return {"episodes": sum(counts.values()), "reasons": counts,
                "last": {k: self._last[k][:300] for k in counts}}

    def overwhelmed(self) -> str | None:
        """A message when nearly every recent episode was quarantined (the window full), else None."""
        if len(self._recent) < self.window or sum(self._recent) < OVERWHELMED * self.window:
            return None
        key = self._total.most_common(1)[0][0]
        return (f"{sum(self._recent)} of the last {self.window} episodes were quarantined, so the run paused: "
                f"{self._last.get(key, key)[:300]}. Fix the reward function (run.reward_fns) and run.start() again")

    def reset(self) -> None:
        """Forget the window (after the run paused for it): a restarted run gets a fresh window."""
        self._recent.clear()
        self._total.clear()
