"""MetricsStore: one in-kernel record of a run's per-step values and events, observable by widgets.

Values are *returned* by the trainer and the loops and recorded here by the Run, once per step
(there is no global ``record_metric``). Widgets and exporters subscribe; the store calls them on
the recording thread (the kernel's event loop) and never lets an observer's error stop training:
it is kept in ``observer_errors`` and logged.

Rows are plain dicts ``{"step": int, "time": float, name: float, ...}``; events are
``{"kind": str, "step": int, "time": float, ...}`` (hot changes, replica failures and respawns,
evictions, skipped steps, quarantined episodes). Both append to JSON-lines files in the run
directory when one is attached, so ``forge_nb.resume`` starts with the history intact. Events are
bounded: at most ``MAX_EVENTS`` in memory and ``MAX_EVENTS_BYTES`` in ``events.jsonl`` (the older part
moves to ``events.jsonl.1``); rows are one per step and stay whole: the last ``rows.KEEP`` in memory, the
older ones read back from ``metrics.jsonl`` when asked for (``forge_nb.metrics.rows``), so the kernel does not
grow with the run's length. On a full disk, rows and events stay in memory (``unwritten``) and go to the files
with the next write that fits: training goes on, nothing is lost unless the kernel dies before space returns.
"""

from __future__ import annotations

import itertools
import json
import logging
import math
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from forge_nb.metrics.rows import KEEP, Rows
from forge_nb.system.diskspace import is_no_space

logger = logging.getLogger(__name__)

MAX_EVENTS = 20_000  #: events kept in memory (the newest; the files keep more)
MAX_EVENTS_BYTES = 16 * 2**20  #: size at which events.jsonl moves to events.jsonl.1

Row = dict[str, Any]
Observer = Callable[[str, Row], None]  # ("step" | "event", row)


class MetricsStore:
    """Per-step values and events of one run; ``subscribe`` to hear of each as it is recorded."""

    def __init__(self, directory: str | Path | None = None, keep_rows: int = KEEP):
        self.rows = Rows()  # the last rows in memory, the older ones read back from metrics.jsonl (metrics.rows)
        self.events: list[Row] = []
        self.observer_errors: list[str] = []
        self._observers: list[Observer] = []
        self._dir = Path(directory) if directory is not None else None
        self._unwritten: dict[str, list[str]] = {}  # file -> lines a full disk kept back
        self.disk_full: str | None = None  #: why the last write failed for space, while it does
        if self._dir is not None:
            self._dir.mkdir(parents=True, exist_ok=True)
            self.rows = Rows(self._dir / "metrics.jsonl", keep=keep_rows)
            self.events = _read_jsonl(self._dir / "events.jsonl")

    # -- recording --------------------------------------------------------------------------------

    def record(self, step: int, values: dict[str, Any]) -> Row:
        """Record one step's values (non-numbers are dropped; NaN is kept as NaN). ``step`` and ``time``
        are the row's own: a value under either name is dropped, never allowed to renumber the row."""
        row: Row = {"step": int(step), "time": time.time()}
        for key, value in values.items():
            if key in ("step", "time") or isinstance(value, bool) or not isinstance(value, int | float):
                continue
            row[key] = float(value)
        self.rows.append(row)
        self._append("metrics.jsonl", row)
        self._notify("step", row)
        return row

    def event(self, kind: str, step: int | None = None, **data: Any) -> Row:
        """Record something that happened (``kind`` e.g. "set", "replica", "quarantine", "skip")."""
        row: Row = {"kind": kind, "step": step if step is not None else self.step, "time": time.time(), **data}
        self.events.append(row)
        if len(self.events) > MAX_EVENTS:
            del self.events[: len(self.events) - MAX_EVENTS // 2]  # the newest half stays in memory
        self._append("events.jsonl", row)
        self._notify("event", row)
        return row

    # -- reading ----------------------------------------------------------------------------------

    @property
    def step(self) -> int:
        """The last recorded step (0 before any)."""
        return self.rows[-1]["step"] if self.rows else 0

    def last(self, name: str | None = None) -> Any:
        """The last row, or the last recorded value of ``name`` (None if never recorded)."""
        if name is None:
            return self.rows[-1] if self.rows else {}
        for row in reversed(self.rows):
            if name in row:
                return row[name]
        return None

    def series(self, name: str) -> tuple[list[int], list[float]]:
        """(steps, values) of one metric."""
        pairs = [(r["step"], r[name]) for r in self.rows if name in r]
        return [s for s, _ in pairs], [v for _, v in pairs]

    def names(self) -> list[str]:
        return sorted({k for r in self.rows for k in r} - {"step", "time"})

    def frame(self) -> Any:
        """The per-step values as a pandas DataFrame indexed by step."""
        import pandas as pd

        df = pd.DataFrame(self.rows)
        return df.set_index("step") if not df.empty else df

    def events_frame(self, kind: str | None = None) -> Any:
        import pandas as pd

        return pd.DataFrame([e for e in self.events if kind is None or e["kind"] == kind])

    # -- observers --------------------------------------------------------------------------------

    def subscribe(self, observer: Observer, replay: bool = False) -> Callable[[], None]:
        """Call ``observer(kind, row)`` for every new row/event; returns an unsubscribe function.

        ``replay=True`` first feeds it the history (a widget opened mid-run draws the whole curve).
        """
        if replay:
            for row in list(self.rows):
                self._call(observer, "step", row)
            for row in list(self.events):
                self._call(observer, "event", row)
        self._observers.append(observer)
        return lambda: self._observers.remove(observer) if observer in self._observers else None

    def _notify(self, kind: str, row: Row) -> None:
        for observer in list(self._observers):
            self._call(observer, kind, row)

    def _call(self, observer: Observer, kind: str, row: Row) -> None:
        try:
            observer(kind, row)
        except Exception as e:  # an observer must never stop the run; its error stays visible
            message = f"{getattr(observer, '__qualname__', observer)!s}: {type(e).__name__}: {e}"
            self.observer_errors.append(message)
            logger.warning("metrics observer failed: %s", message)

    # -- files ------------------------------------------------------------------------------------

    def _append(self, name: str, row: Row) -> None:
        """Append ``row`` (after what an earlier full disk kept back, in every file) as whole lines: a write that
        fails is cut back to where it began, and its lines wait in memory for the next write (said once)."""
        if self._dir is None:
            return
        self._unwritten.setdefault(name, []).append(json.dumps(row, default=_jsonable) + "\n")
        for file, waiting in self._unwritten.items():
            if waiting and not self._write(file, waiting):
                return
        if self.disk_full:
            logger.warning("space is back on the disk of %s: the rows and events kept meanwhile are written", self._dir)
            self.disk_full = None

    def _write(self, name: str, waiting: list[str]) -> bool:
        path = self._dir / name
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            start = os.fstat(fd).st_size
            try:
                lines = [line.encode() for line in waiting]
                data = b"".join(lines)
                while data:
                    data = data[os.write(fd, data):]
            except OSError as e:
                os.ftruncate(fd, start)
                if not is_no_space(e):
                    raise
                if not self.disk_full:
                    self.disk_full = f"{self._dir}: {e.strerror}"
                    logger.warning("the disk of %s is full: metric rows and events are kept in memory and "
                                   "written when space returns; training goes on", self._dir)
                return False
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        waiting.clear()
        if name == "metrics.jsonl":  # where each row's line starts: the rows can leave memory (metrics.rows)
            self.rows.written(list(itertools.accumulate((len(line) for line in lines[:-1]), initial=start)))
        if name == "events.jsonl" and size > MAX_EVENTS_BYTES:  # bounded: the older half moves to events.jsonl.1
            os.replace(path, path.with_name(name + ".1"))
        return True

    @property
    def unwritten(self) -> int:
        """Rows and events a full disk kept in memory, to be written with the next ones."""
        return sum(len(lines) for lines in self._unwritten.values())


def _jsonable(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    return str(value)


def _read_jsonl(path: Path) -> list[Row]:
    if not path.exists():
        return []
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError:  # a line cut by a crash mid-write: keep the rest
                logger.warning("skipping a damaged line in %s", path)
    return rows


def summarize(values: Iterable[float], prefix: str) -> dict[str, float]:
    """mean/std/min/max of ``values`` under ``prefix/`` (empty input gives nothing)."""
    xs = [float(v) for v in values]
    if not xs:
        return {}
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / len(xs))
    return {f"{prefix}/mean": mean, f"{prefix}/std": std, f"{prefix}/min": min(xs), f"{prefix}/max": max(xs)}
