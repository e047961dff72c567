"""The Tinker API's futures: every call that does work answers at once with a request id, and the SDK then asks for
its result (``POST /api/v1/retrieve_future``), again and again until it is there.

``Futures.submit`` starts a call as a task and returns its id; ``Futures.retrieve`` waits up to ``POLL_S`` for it
(a long poll: the SDK gives each retrieval 45 s) and answers the result, the call's error in the SDK's shape, or
``{"type": "try_again"}``. The calls of one training client run one at a time in the order they came (``Lane``):
the SDK sends a client's requests in its own order (``TrainingClient._take_turn``) and waits for each to be
accepted before it sends the next, so the order they arrive in is the order they were made in, and a
``forward_backward`` submitted before an ``optim_step`` is trained before it even when the SDK pipelines them.

A result is kept until it is retrieved, and a while after (``KEEP_S``), for a retrieval the network lost; at most
``MAX_KEPT`` finished results are kept, the oldest dropped first (a retrieval of a dropped one is a 404).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from forge_nb.tinker.wire import TinkerRefusal

__all__ = ["Futures", "Lane", "Outcome"]

logger = logging.getLogger(__name__)

#: how long a retrieval waits for its call before it answers try_again (the SDK's own timeout is 45 s)
POLL_S = 20.0
#: how long a retrieved result stays for a retrieval the network lost
KEEP_S = 300.0
MAX_KEPT = 4096


@dataclass
class Outcome:
    """A finished call: a protobuf payload, a JSON body, or an error (``category``: the SDK's ``user`` for a refusal,
    ``server`` for a failure of the run)."""

    proto: bytes | None = None
    json: dict[str, Any] | None = None
    error: str | None = None
    category: str = "user"


class Lane:
    """One training client's calls, one at a time in the order they were submitted."""

    def __init__(self) -> None:
        self._turns = itertools.count()
        self._done = 0
        self._moved = asyncio.Condition()

    def ticket(self) -> int:
        """The next place in line; taken when the request arrives, before its answer goes back."""
        return next(self._turns)

    async def wait_turn(self, ticket: int) -> None:
        async with self._moved:
            await self._moved.wait_for(lambda: self._done == ticket)

    async def done(self) -> None:
        async with self._moved:
            self._done += 1
            self._moved.notify_all()


@dataclass
class _Call:
    task: asyncio.Task[Outcome]
    kind: str
    retrieved_at: float | None = None


class Futures:
    """The server's calls in flight and their results (see the module docstring)."""

    def __init__(self, name: str = "tinker") -> None:
        self._name = name
        self._ids = itertools.count(1)
        self._calls: OrderedDict[str, _Call] = OrderedDict()

    def submit(self, kind: str, work: Callable[[], Awaitable[Outcome]], lane: Lane | None = None) -> str:
        """Start ``work`` (after the earlier calls of ``lane``) and return its request id."""
        request_id = f"{self._name}-{next(self._ids)}"
        ticket = lane.ticket() if lane is not None else None
        task = asyncio.create_task(self._run(kind, work, lane, ticket), name=f"tinker {kind} {request_id}")
        self._calls[request_id] = _Call(task, kind)
        self._trim()
        return request_id

    async def _run(self, kind: str, work: Callable[[], Awaitable[Outcome]], lane: Lane | None,
                   ticket: int | None) -> Outcome:
        try:
            if lane is not None and ticket is not None:
                await lane.wait_turn(ticket)
            return await work()
        except TinkerRefusal as e:
            return Outcome(error=str(e), category="user")
        except asyncio.CancelledError:
            return Outcome(error=f"{kind}: the server stopped before the call finished", category="server")
        except Exception as e:  # the run's failure, said as the SDK says a server error
            logger.warning("tinker %s failed", kind, exc_info=True)
            return Outcome(error=f"{kind}: {type(e).__name__}: {e}", category="server")
        finally:
            if lane is not None:
                await lane.done()

    async def retrieve(self, request_id: str, wait_s: float = POLL_S) -> Outcome | None:
        """The call's outcome, waiting up to ``wait_s`` for it; None while it runs; KeyError for an unknown id."""
        call = self._calls[request_id]
        if not call.task.done():
            await asyncio.wait({call.task}, timeout=wait_s)
            if not call.task.done():
                return None
        call.retrieved_at = call.retrieved_at or time.monotonic()
        return call.task.result()

    def in_flight(self) -> dict[str, int]:
        """How many calls of each kind are running."""
        counts: dict[str, int] = {}
        for call in self._calls.values():
            if not call.task.done():
                counts[call.kind] = counts.get(call.kind, 0) + 1
        return counts

    def _trim(self) -> None:
        now = time.monotonic()
        for request_id, call in list(self._calls.items()):
            stale = call.retrieved_at is not None and now - call.retrieved_at > KEEP_S
            if stale or (len(self._calls) > MAX_KEPT and call.task.done()):
                del self._calls[request_id]

    async def close(self) -> None:
        """Cancel the calls still running (their retrievals answer a server error)."""
        tasks = [c.task for c in self._calls.values() if not c.task.done()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
