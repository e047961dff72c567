"""Two event loops: the server answers on a thread of its own, and the work on runs goes to the kernel's loop.

``ServerThread`` starts a loop in a daemon thread, runs a coroutine there (``call``), and stops it; ``on_kernel``
runs a coroutine on the kernel's loop from the server's, failing with a message that says what to do when the
kernel's loop does not answer within ``BLOCKED_S`` (a cell blocked on a synchronous Tinker call in the kernel that
serves it would otherwise wait for ever: ``forge_nb.tinker.server``'s "Threads").
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable
from typing import Any

from forge_nb.tinker.wire import TinkerRefusal

__all__ = ["BLOCKED_S", "ServerThread"]

#: how long a call waits for the kernel's event loop to answer before it fails, saying the loop is blocked
BLOCKED_S = 30.0


class ServerThread:
    """A daemon thread running an event loop of its own, made from the kernel's loop (which it remembers)."""

    def __init__(self, name: str) -> None:
        self.kernel = asyncio.get_running_loop()
        self.loop = asyncio.new_event_loop()
        self._thread: threading.Thread | None = threading.Thread(target=self.loop.run_forever, name=name,
                                                                 daemon=True)
        self._thread.start()

    async def call(self, work: Awaitable[Any]) -> Any:
        """Run ``work`` on the thread's loop (from the kernel's) and return what it returns."""
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(work, self.loop))  # type: ignore[arg-type]

    @property
    def running(self) -> bool:
        return self._thread is not None and self.loop.is_running()

    async def stop(self) -> None:
        thread, self._thread = self._thread, None
        if thread is not None:
            self.loop.call_soon_threadsafe(self.loop.stop)
            await asyncio.to_thread(thread.join, 10)
            self.loop.close()

    async def on_kernel(self, work: Callable[[], Awaitable[Any]]) -> Any:
        """Run ``work()`` on the kernel's loop (from the thread's) and return what it returns; work that the kernel's
        loop has not begun within ``BLOCKED_S`` is called off and fails the call (one hop there and one back: the
        loop's answer to the work itself says it is alive)."""
        started = threading.Event()

        async def begin() -> Any:
            started.set()
            return await work()

        done = asyncio.run_coroutine_threadsafe(begin(), self.kernel)
        result = asyncio.wrap_future(done)
        finished, _ = await asyncio.wait({result}, timeout=BLOCKED_S)
        if not finished and not started.is_set() and done.cancel():
            raise TinkerRefusal(
                f"the kernel's event loop did not answer for {BLOCKED_S:.0f} s: a cell is blocked, most likely on a "
                "Tinker call's .result() in the kernel that serves it. In a cell, await the SDK's calls (`await "
                "training.forward_backward(...)`); run synchronous client code in a thread (`await "
                "asyncio.to_thread(fn)`)")
        return await result
