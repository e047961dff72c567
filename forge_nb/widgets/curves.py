"""Curves: the training curves of a run as a plotly FigureWidget, fed by the metrics store, throttled.

The store calls ``observe(kind, row)`` for every recorded row and event (on the recording thread).
That only appends to :class:`CurveData` and pokes a :class:`Throttle`; at most ~4 times a second
the throttle copies the changed traces into the figure as one restyle message
(:func:`~forge_nb.widgets._series.restyle`), so a burst of rows costs one message to the browser.
``lags_ms`` keeps, per drawn row, the time from its recording to the figure holding it (the
dashboard's latency, which bench/dashboard.py reports).
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go

from forge_nb.widgets._series import CurveData, Row
from forge_nb.widgets._throttle import Throttle


class Curves:
    """A FigureWidget of the run's curves; ``observe`` is the metrics-store observer."""

    def __init__(self, interval: float = 0.25, loop: asyncio.AbstractEventLoop | None = None,
                 on_error: Callable[[BaseException], None] | None = None, max_points: int = 5_000):
        self.data = CurveData(max_points=max_points)
        self.figure: go.FigureWidget = self.data.build(go.FigureWidget())
        self.widget = self.figure
        self.throttle = Throttle(self._draw, interval=interval, loop=loop, on_error=on_error)
        self.lags_ms: deque[float] = deque(maxlen=10_000)

    def observe(self, kind: str, row: Row) -> None:
        if kind == "step":
            self.data.add_row(row)
        elif kind == "event":
            self.data.add_event(row)
        else:
            return
        self.throttle.poke()

    def flush(self) -> None:
        """Draw whatever is pending now (tests, scripts without an event loop)."""
        self.throttle.flush()

    def _draw(self) -> None:
        times = self.data.apply(self.figure)
        now = time.time()
        self.lags_ms.extend(1000 * (now - t) for t in times)

    def trace(self, key: str) -> Any:
        """The figure's trace for a metric (``"reward/mean"``) or a marker set (``"mark:set"``)."""
        for t, trace in zip(self.data.traces, self.figure.data, strict=False):
            if t.key == key:
                return trace
        raise KeyError(f"no trace for {key!r}; traces: {[t.key for t in self.data.traces]}")

    def close(self) -> None:
        self.throttle.cancel()
        self.figure.close()
