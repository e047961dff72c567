"""A run's states and the transitions between them: the one place that says which exist.

::

    ready ──start──> running ──pause / a step budget spent / a full disk──> paused ──start──> running
      │                 │                                                      │
      └─────stop────────┴──────────────────────stop────────────────────────────┴──> stopped ──start──> running
    ready / running / paused / stopped ──a loop raised──> failed ──start (the cause fixed)──> running
    any state ──shutdown──> shut down (final: spawn a new run)

The Controller is the only writer (``Controller.set_state``, which refuses any other transition);
``Run.state``, the magics and the widgets read it. A RunState is a ``str`` (``run.state == "running"``
holds, and the "state" events record its text).
"""

from __future__ import annotations

from enum import StrEnum


class RunState(StrEnum):
    READY = "ready"
    RUNNING = "running"
    PAUSED = "paused"
    STOPPED = "stopped"
    FAILED = "failed"
    SHUT_DOWN = "shut down"


_ENDS = frozenset({RunState.FAILED, RunState.SHUT_DOWN})  # a loop may raise, a run may shut down, from anywhere
TRANSITIONS: dict[RunState, frozenset[RunState]] = {
    RunState.READY: frozenset({RunState.RUNNING, RunState.STOPPED}) | _ENDS,
    RunState.RUNNING: frozenset({RunState.PAUSED, RunState.STOPPED}) | _ENDS,
    RunState.PAUSED: frozenset({RunState.RUNNING, RunState.STOPPED}) | _ENDS,
    RunState.STOPPED: frozenset({RunState.RUNNING}) | _ENDS,
    RunState.FAILED: frozenset({RunState.RUNNING, RunState.SHUT_DOWN}),
    RunState.SHUT_DOWN: frozenset(),
}


def transition(old: RunState, new: RunState | str) -> RunState:
    """``new`` as a RunState, if a run may go there from ``old`` (staying is always allowed)."""
    new = RunState(new)
    if new != old and new not in TRANSITIONS[old]:
        allowed = ", ".join(sorted(TRANSITIONS[old])) or "none: it is final"
        raise RuntimeError(f"a run cannot go from {old.value!r} to {new.value!r} (from {old.value!r}: {allowed})")
    return new
