"""The Tinker API's futures: every call that does work answers at once with a request id, and the SDK then asks for
its result (``POST /api/v1/retrieve_future``), again and again until it is there.

``Futures.submit`` hands a call to the kernel's loop at once (``ServerThread.on_kernel``: the work starts there
while the request id is still on its way back) and returns its id; ``Futures.retrieve`` answers a finished call's
result straight away, and otherwise waits up to ``POLL_S`` for it (a long poll: the SDK gives each retrieval 45 s),
woken the moment the result lands on the server's loop; it answers the result, the call's error in the SDK's shape,
or ``{"type": "try_again"}``.

The calls of one training client run one at a time in the order they came (``Lane``): the SDK sends a client's
requests in its own order (``TrainingClient._take_turn``) and waits for each to be accepted before it sends the
next, so the order they arrive in is the order they were made in, and the kernel's loop begins the calls handed to
it in that order. Each call waits there for the one before it, so a ``forward_backward`` submitted before an
``optim_step`` is trained before it even when the SDK pipelines them, and the ``optim_step`` starts on the kernel's
loop as soon as the ``forward_backward`` is done, with no hop through the server's thread between the two.

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

from forge_nb.tinker.threads import KernelCall, ServerThread
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
    ``server`` for a failure of the run).

    ``encode``, where given, makes the protobuf payload when the result is first retrieved, on the server's thread:
    the kernel's loop goes straight from a call to the next call of its client instead of encoding the first one's
    result in between."""

    proto: bytes | None = None
    json: dict[str, Any] | None = None
    error: str | None = None
    category: str = "user"
    encode: Callable[[], bytes] | None = None

    def encoded(self, kind: str) -> Outcome:
        """This outcome with its payload made (once); a payload that cannot be made is the call's server error."""
        encode, self.encode = self.encode, None
        if encode is not None:
            try:
                self.proto = encode()
            except Exception as e:
                logger.warning("tinker %s: its result could not be encoded", kind, exc_info=True)
                self.error, self.category = f"{kind}: {type(e).__name__}: {e}", "server"
        return self


class Lane:
    """One training client's calls, one at a time in the order they were submitted. Used on the kernel's loop only:
    each call, as that loop begins it, takes its place after the last one (``join``) and awaits the future of the
    one before it directly, so it starts in the loop's first callback after that one ends. (A call cancelled while
    it waits cancels that future too: calls are cancelled only all together, when the server stops.)"""

    def __init__(self) -> None:
        self._last: asyncio.Future[None] | None = None

    def join(self) -> tuple[asyncio.Future[None] | None, asyncio.Future[None]]:
        """The call before this one (None: none, or it is done) and this call's own, to be set when it is done."""
        mine = asyncio.get_running_loop().create_future()
        before, self._last = self._last, mine
        return (before if before is not None and not before.done() else None), mine


@dataclass
class _Call:
    kernel: KernelCall
    kind: str
    retrieved_at: float | None = None


class Futures:
    """The server's calls in flight and their results (see the module docstring); used on the server's loop."""

    def __init__(self, thread: ServerThread, name: str = "tinker") -> None:
        self._thread = thread
        self._name = name
        self._ids = itertools.count(1)
        self._calls: OrderedDict[str, _Call] = OrderedDict()
        self._trimmed = 0.0  # when _trim last looked

    def new_id(self) -> str:
        return f"{self._name}-{next(self._ids)}"

    def submit(self, kind: str, work: Callable[[], Awaitable[Outcome]], lane: Lane | None = None,
               request_id: str | None = None) -> str:
        """Start ``work`` on the kernel's loop (after the earlier calls of ``lane``) and return its request id
        (``request_id``, or a new one)."""
        request_id = request_id or self.new_id()
        self._calls[request_id] = _Call(self._thread.on_kernel(lambda: self._run(kind, work, lane)), kind)
        self._trim()
        return request_id

    @staticmethod
    def _run(kind: str, work: Callable[[], Awaitable[Outcome]], lane: Lane | None) -> Awaitable[Outcome]:
        """On the kernel's loop, in the order of submission: take the call's place in ``lane`` now, then run it."""
        before, mine = lane.join() if lane is not None else (None, None)

        async def run() -> Outcome:
            try:
                if before is not None:
                    await before  # woken in the callback right after the call before ends
                return await work()
            except TinkerRefusal as e:
                return Outcome(error=str(e), category="user")
            except asyncio.CancelledError:
                return Outcome(error=f"{kind}: the server stopped before the call finished", category="server")
            except Exception as e:  # the run's failure, said as the SDK says a server error
                logger.warning("tinker %s failed", kind, exc_info=True)
                return Outcome(error=f"{kind}: {type(e).__name__}: {e}", category="server")
            finally:
                if mine is not None and not mine.done():
                    mine.set_result(None)

        return run()

    async def retrieve(self, request_id: str, wait_s: float = POLL_S) -> Outcome | None:
        """The call's outcome, waiting up to ``wait_s`` for it; None while it runs; KeyError for an unknown id."""
        call = self._calls[request_id]
        result = call.kernel.result
        if not result.done():
            await asyncio.wait({result}, timeout=wait_s)
            if not result.done():
                return None
        call.retrieved_at = call.retrieved_at or time.monotonic()
        if result.cancelled():
            return Outcome(error=f"{call.kind}: the server stopped before the call finished", category="server")
        error = result.exception()
        if isinstance(error, TinkerRefusal):  # called off: the kernel's loop did not begin it
            return Outcome(error=str(error), category="user")
        if error is not None:
            return Outcome(error=f"{call.kind}: {type(error).__name__}: {error}", category="server")
        return result.result().encoded(call.kind)

    def in_flight(self) -> dict[str, int]:
        """How many calls of each kind are running."""
        counts: dict[str, int] = {}
        for call in self._calls.values():
            if not call.kernel.result.done():
                counts[call.kind] = counts.get(call.kind, 0) + 1
        return counts

    def _trim(self) -> None:
        """Drop what is stale or too many, looking at most once a second (a scan of every result kept per call
        would cost each call as much as the thousands of results a long run keeps)."""
        now = time.monotonic()
        if now - self._trimmed < 1.0 and len(self._calls) <= MAX_KEPT:
            return
        self._trimmed = now
        for request_id, call in list(self._calls.items()):
            stale = call.retrieved_at is not None and now - call.retrieved_at > KEEP_S
            if stale or (len(self._calls) > MAX_KEPT and call.kernel.result.done()):
                del self._calls[request_id]

    async def close(self, wait_s: float = 10.0) -> None:
        """Cancel the calls still running (their retrievals answer a server error) and wait up to ``wait_s`` for
        them to stop."""
        running = [c.kernel for c in self._calls.values() if not c.kernel.result.done()]
        for call in running:
            call.cancel()
        if running:
            await asyncio.wait({c.result for c in running}, timeout=wait_s)
