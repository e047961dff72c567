"""Throttle: coalesce many pokes into at most one flush per interval, run on the kernel's event loop.

The metrics store calls its observers once per recorded row, on whatever thread recorded it. Redrawing
a figure per row would cost the training loop a comm message per value, so views only mark themselves
dirty (``poke``) and the throttle runs their ``flush`` later: at once (next loop iteration) when the
last flush is older than ``interval``, else when ``interval`` has passed since it. A burst of 100 rows
therefore costs one flush, and a slow trickle is drawn without delay.

Pokes from another thread are handed to the loop with ``call_soon_threadsafe``. With no event loop at
all (a plain script), a poke flushes synchronously when the interval allows, and ``flush()`` forces it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable


class Throttle:
    """Run ``flush()`` at most once per ``interval`` seconds after ``poke()``; errors go to ``on_error``."""

    def __init__(self, flush: Callable[[], None], interval: float = 0.25,
                 loop: asyncio.AbstractEventLoop | None = None,
                 on_error: Callable[[BaseException], None] | None = None):
        if interval < 0:
            raise ValueError(f"Throttle(interval={interval}): the interval must be >= 0 seconds")
        self._flush_fn = flush
        self.interval = interval
        self.loop = loop
        self._on_error = on_error
        self._last = -float("inf")
        self._scheduled = False
        self._pending = False
        self._handle: asyncio.TimerHandle | asyncio.Handle | None = None
        self._lock = threading.Lock()
        self.flushes = 0  #: how many flushes ran (tests and the benchmark read it)

    def poke(self) -> None:
        """Something changed: flush soon, coalesced with every other poke until then."""
        with self._lock:
            self._pending = True
            if self._scheduled:
                return
            self._scheduled = True
        delay = max(0.0, self._last + self.interval - time.monotonic())
        loop = _running_loop()
        if loop is not None and (self.loop is None or loop is self.loop):
            self._schedule(loop, delay)
        elif self.loop is not None and self.loop.is_running():
            self.loop.call_soon_threadsafe(self._schedule, self.loop, delay)
        else:  # no loop to defer to: flush now if allowed, else on a later poke or flush()
            with self._lock:
                self._scheduled = False
            if delay == 0.0:
                self.flush()

    def _schedule(self, loop: asyncio.AbstractEventLoop, delay: float) -> None:
        self._handle = loop.call_later(delay, self.flush) if delay > 0 else loop.call_soon(self.flush)

    def flush(self) -> None:
        """Run the pending flush now (a no-op when nothing is pending)."""
        with self._lock:
            self._scheduled = False
            if self._handle is not None:
                self._handle.cancel()
                self._handle = None
            if not self._pending:
                return
            self._pending = False
        self._last = time.monotonic()
        self.flushes += 1
        try:
            self._flush_fn()
        except Exception as e:
            if self._on_error is None:
                raise
            self._on_error(e)

    def cancel(self) -> None:
        """Drop anything scheduled (the owner is closing)."""
        with self._lock:
            self._pending = self._scheduled = False
            if self._handle is not None:
                self._handle.cancel()
                self._handle = None


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
