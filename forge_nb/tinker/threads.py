"""Two event loops: the server answers on a thread of its own, and the work on runs goes to the kernel's loop.

``ServerThread`` starts a loop in a daemon thread, runs a coroutine there (``call``), and stops it; ``on_kernel``
starts work on the kernel's loop from the server's and gives back a future on the server's loop that the work's
result lands in: one hop there (``call_soon_threadsafe``, made while the request is being answered) and one back
when it is done, nothing in between. Work that the kernel's loop has not begun within ``BLOCKED_S`` is called off
with a message that says what to do (a cell blocked on a synchronous Tinker call in the kernel that serves it would
otherwise wait for ever: ``forge_nb.tinker.server``'s "Threads").
"""

from __future__ import annotations

import asyncio
import contextlib
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

    def on_kernel(self, begin: Callable[[], Awaitable[Any]]) -> KernelCall:
        """Call ``begin()`` on the kernel's loop as soon as that loop comes round to it (from the thread's loop) and
        run what it returns there as a task; the returned call's ``result`` (a future on the thread's loop) gets the
        task's result or error, or a TinkerRefusal when the kernel's loop has not called ``begin`` within
        ``BLOCKED_S``, in which case it never will. Calls handed over one after another begin in that order."""
        call = KernelCall(self)
        self.kernel.call_soon_threadsafe(call.begin, begin)
        call.watch = self.loop.call_later(BLOCKED_S, call.call_off)
        return call


class KernelCall:
    """One piece of work handed to the kernel's loop by ``ServerThread.on_kernel``."""

    def __init__(self, thread: ServerThread) -> None:
        self._thread = thread
        self.result: asyncio.Future[Any] = thread.loop.create_future()
        self.task: asyncio.Task[Any] | None = None  # on the kernel's loop, once begun
        self.watch: asyncio.TimerHandle | None = None
        self._lock = threading.Lock()  # begun or called off: one of the two, decided once
        self._begun = self._off = False

    def begin(self, begin: Callable[[], Awaitable[Any]]) -> None:
        """On the kernel's loop: start the work, unless it was called off."""
        with self._lock:
            if self._off:
                return
            self._begun = True
        try:
            self.task = asyncio.ensure_future(begin())
        except Exception as e:  # handed to the caller's future, as the task's own error would be
            self._send(None, e)
            return
        self.task.add_done_callback(self._finished)
        if self._off:  # cancel() came between the lock and the task
            self.task.cancel()

    def _finished(self, task: asyncio.Task[Any]) -> None:
        if task.cancelled():
            self._send(None, asyncio.CancelledError())
        else:
            self._send(task.result() if task.exception() is None else None, task.exception())

    def _send(self, value: Any, error: BaseException | None) -> None:
        """From the kernel's loop: settle the result on the thread's loop (gone if the server stopped)."""
        with contextlib.suppress(RuntimeError):
            self._thread.loop.call_soon_threadsafe(self._settle, value, error)

    def _settle(self, value: Any, error: BaseException | None) -> None:
        if self.watch is not None:
            self.watch.cancel()
        if self.result.done():
            return
        if isinstance(error, asyncio.CancelledError):
            self.result.cancel()
        elif error is not None:
            self.result.set_exception(error)
        else:
            self.result.set_result(value)

    def call_off(self) -> None:
        """On the thread's loop, ``BLOCKED_S`` after the hand-over: fail the call if the kernel's loop has not begun
        it (and make sure it never does)."""
        with self._lock:
            if self._begun:
                return
            self._off = True
        if not self.result.done():
            self.result.set_exception(TinkerRefusal(
                f"the kernel's event loop did not answer for {BLOCKED_S:.0f} s: a cell is blocked, most likely on a "
                "Tinker call's .result() in the kernel that serves it. In a cell, await the SDK's calls (`await "
                "training.forward_backward(...)`); run synchronous client code in a thread (`await "
                "asyncio.to_thread(fn)`)"))

    def cancel(self) -> None:
        """From the thread's loop: cancel the work on the kernel's loop (work not begun yet never begins); the
        result is cancelled once the work has stopped."""
        with self._lock:
            begun, self._off = self._begun, True
        if not begun:
            self._settle(None, asyncio.CancelledError())
        elif self.task is not None:
            with contextlib.suppress(RuntimeError):
                self._thread.kernel.call_soon_threadsafe(self.task.cancel)
