"""Shared: a kernel-wide resource that starts on its first lease and stops on its last release.

Several users of one kernel (runs side by side, services, a notebook's own cells) need the same
resource: the kernel's torchstore, the runtime. None of them owns it; each *leases* it under a name
of its own (its holder id)::

    store = Shared("torchstore", start=start_store, stop=stop_store, alive=store_is_up)
    await store.acquire("run-A")   # starts it
    await store.acquire("run-B")   # already up: nothing to do
    await store.release("run-A")   # run-B still holds it
    await store.release("run-B")   # the last one: stops it

Rules: ``acquire`` is idempotent per holder (a second acquire by the same holder is one lease);
``release`` of a holder that holds nothing is a no-op, so a shutdown may release twice. Acquire and
release are serialized with an asyncio lock, so services started side by side (``asyncio.gather``)
and a shutdown running meanwhile see one consistent count. ``alive`` (optional) tells whether the
resource is still up: a resource that died under its holders (a killed process, a direct stop) is
started again by the next acquire, whoever holds it. A ``start`` that raises leases nothing. Whoever
stops the resource directly calls ``forget_all``: the leases end with it.

Nothing else in the library fits: ``contextlib.AsyncExitStack`` and friends scope a resource to one
block of one owner, and the owners here come and go independently (cells, runs, services).
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Awaitable, Callable

__all__ = ["Shared"]


class Shared:
    """A resource started by its first holder's ``acquire`` and stopped by its last holder's ``release``."""

    def __init__(self, name: str, start: Callable[[], Awaitable[None]], stop: Callable[[], Awaitable[None]],
                 alive: Callable[[], bool] | None = None):
        self.name = name
        self._start, self._stop, self._alive = start, stop, alive
        self._holders: set[str] = set()
        # one lock per event loop: an asyncio.Lock is bound to the loop it first waited on, and a
        # kernel-wide object outlives loops (test runners start one per test)
        self._locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()

    @property
    def holders(self) -> frozenset[str]:
        """Who holds a lease now."""
        return frozenset(self._holders)

    def _lock(self) -> asyncio.Lock:
        return self._locks.setdefault(asyncio.get_running_loop(), asyncio.Lock())

    async def acquire(self, holder: str) -> None:
        """Lease the resource for ``holder``, starting it if no one holds it (or it is no longer alive)."""
        if not isinstance(holder, str) or not holder:
            raise TypeError(f"{self.name} lease: holder={holder!r}; pass a non-empty string that names the user")
        async with self._lock():
            if not self._holders or (self._alive is not None and not self._alive()):
                await self._start()
            self._holders.add(holder)

    async def release(self, holder: str) -> None:
        """End ``holder``'s lease; the last one stops the resource. A holder that holds nothing: no-op."""
        async with self._lock():
            if holder not in self._holders:
                return
            self._holders.discard(holder)
            if not self._holders:
                await self._stop()

    def forget_all(self) -> None:
        """Drop every lease without calling ``stop``: for whoever stopped the resource directly. Later
        releases of those holders are no-ops; the next acquire starts the resource again."""
        self._holders.clear()

    def __repr__(self) -> str:
        return f"Shared({self.name!r}, holders={sorted(self._holders)})"
