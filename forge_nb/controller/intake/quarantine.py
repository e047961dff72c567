"""QuarantineWatch: quarantined episodes counted per reason, reported in bounded space, and a run that
produces almost nothing but quarantined episodes paused with a message that names the cause and its fix.

A reward function that always raises (or returns NaN), an agent that fails before its first call or an
environment whose step raises quarantines every episode: one event each would be thousands of events a
minute, and the trainer would starve with nothing to train on while the only signal blamed the generators.
Instead the controller notes every accepted episode here; ``flush`` records one "quarantine" event per
interval with the count per reason and the last message, and ``overwhelmed`` says when at least
``OVERWHELMED`` of the last ``window`` episodes were quarantined. Its message counts the reasons *in that
window* (not since the run began: an earlier problem that was fixed is not named) and gives the fix that
fits who quarantined them: a reward function, the agent of ``agent_episode``, or an environment. Where the
episode function kept the exception behind a reason (``Episode.quarantine_error``), it is the pause's
``cause``: the cell that waited shows the user's own traceback under the pause.
"""

from __future__ import annotations

import time
from collections import Counter, deque
from dataclasses import dataclass
from typing import Any

#: The share of the window's episodes that were quarantined at which the run is paused.
OVERWHELMED = 0.9

#: Who quarantined an episode, by how its reason begins, and what the user does about it.
_FIXES = (
    ("the agent ", "Fix the agent (run.episode_fn = agent_episode(your_agent))"),
    ("reward function ", "Fix the reward function (run.reward_fns)"),
    ("environment ", "Fix the environment (its step raised: run.logs() has its side)"),
)


def reason_key(reason: str) -> str:
    """What repeats of one problem share: the text up to the exception's message."""
    head, sep, _ = reason.partition(": ")
    return head if sep else reason[:120]


def fix_for(reason: str) -> str:
    """What to do about episodes quarantined for ``reason``."""
    for start, fix in _FIXES:
        if reason.startswith(start):
            return fix
    return "Fix what quarantines them (run.episode_fn, run.reward_fns)"


@dataclass(frozen=True, slots=True)
class Overwhelmed:
    """Why the run pauses: the message, and the exception behind its commonest reason (None: none kept)."""

    message: str
    cause: BaseException | None

    def error(self) -> RuntimeError:
        """What a waiting ``run.step(n)`` raises: the message, with ``cause`` under it (its traceback shown)."""
        error = RuntimeError(self.message)
        error.__cause__ = self.cause
        return error


class QuarantineWatch:
    """Counts of quarantined episodes per reason since the last report, and a window of recent outcomes."""

    def __init__(self, window: int, interval_s: float = 5.0):
        self.window, self.interval_s = window, interval_s
        self._recent: deque[str | None] = deque(maxlen=window)  # each episode's reason key, None if it trained
        self._pending: Counter[str] = Counter()
        self._last: dict[str, str] = {}
        self._errors: dict[str, BaseException] = {}  # the newest exception behind each reason, where kept
        self._flushed = time.monotonic()

    def note(self, quarantine: str | None, error: BaseException | None = None) -> None:
        key = None if quarantine is None else reason_key(quarantine)
        self._recent.append(key)
        if quarantine is not None and key is not None:
            self._pending[key] += 1
            self._last[key] = quarantine
            if error is not None:
                self._errors[key] = error

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

    def overwhelmed(self) -> Overwhelmed | None:
        """Why the run should pause when nearly every recent episode was quarantined (the window full), else
        None. The message names the window's reasons, commonest first, each with its count and last message."""
        window = Counter(k for k in self._recent if k is not None)
        quarantined = sum(window.values())
        if len(self._recent) < self.window or quarantined < OVERWHELMED * self.window:
            return None
        reasons = window.most_common()
        named = "; ".join(f"{n} x {self._last[k][:500]}" for k, n in reasons[:3])
        if len(reasons) > 3:
            named += f"; {sum(n for _, n in reasons[3:])} for {len(reasons) - 3} other reason(s)"
        fixes = dict.fromkeys(fix_for(self._last[k]) for k, _ in reasons[:3])
        message = (f"{quarantined} of the last {self.window} episodes were quarantined, so the run paused: {named}. "
                   f"{'; '.join(fixes)}, and run.start() again")
        return Overwhelmed(message, self._errors.get(reasons[0][0]))

    def reset(self) -> None:
        """Forget the window (after the run paused for it): a restarted run gets a fresh window."""
        self._recent.clear()
        self._errors.clear()
