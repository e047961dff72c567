"""Bounded waits for the async tests: poll a condition (a wait's bound is not a timing assertion)."""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable


async def until(predicate: Callable[[], bool], *, timeout: float, interval: float) -> bool:
    """True as soon as ``predicate()`` is; once ``timeout`` seconds have passed, its last value."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(interval)
    return predicate()


def until_sync(predicate: Callable[[], bool], *, timeout: float, interval: float = 0.2) -> bool:
    """``until`` for code that is not async (tests driving kernels and daemons from outside)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return predicate()


def waiter(timeout: float, interval: float) -> Callable[..., object]:
    """``until`` with a module's own default bound and polling interval (``timeout=`` still overrides)."""
    return functools.partial(until, timeout=timeout, interval=interval)
