"""Calls: run a control method of the Run on the kernel's event loop, awaiting it if it is a coroutine.

Buttons in the notebook fire on the kernel's loop; buttons of the served panel app fire on the
server's thread. Either way the Run's methods must run on the kernel's loop (the Run and its
services are not thread-safe), and ``run.step(n)`` / ``run.stop()`` are coroutines that must be
awaited in a task someone owns. ``LoopCaller`` does both, keeps strong references to its tasks, and
reports every error to ``on_error`` (nothing raised in a button handler may vanish).
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from collections.abc import Callable
from typing import Any


class LoopCaller:
    """Calls ``fn(*args)`` on ``loop``; an awaitable result becomes an owned task."""

    def __init__(self, loop: asyncio.AbstractEventLoop | None,
                 on_error: Callable[[str, BaseException], None]):
        self.loop = loop
        self._on_error = on_error
        self.tasks: set[asyncio.Task[Any]] = set()

    def call(self, where: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        """Run now when on the loop's thread (or with no loop), else hand it to the loop."""
        if self.loop is None or not self.loop.is_running() or _on_loop(self.loop):
            self._run(where, fn, args, kwargs)
        else:
            self.loop.call_soon_threadsafe(self._run, where, fn, args, kwargs)

    def _run(self, where: str, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        try:
            result = fn(*args, **kwargs)
        except Exception as e:
            self._on_error(where, e)
            return
        if inspect.isawaitable(result):
            loop = self.loop if self.loop is not None and self.loop.is_running() else _running_loop()
            if loop is None:
                if inspect.iscoroutine(result):
                    result.close()
                self._on_error(where, RuntimeError(
                    f"{where} returned a coroutine but no event loop is running to await it; "
                    "use the dashboard from a Jupyter kernel (or inside asyncio.run)"))
                return
            task = asyncio.ensure_future(result, loop=loop)
            task.set_name(f"forge_nb.dashboard.{where}")
            self.tasks.add(task)
            task.add_done_callback(lambda t: self._done(where, t))

    def _done(self, where: str, task: asyncio.Task[Any]) -> None:
        self.tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._on_error(where, task.exception())  # type: ignore[arg-type]


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    return _running_loop() is loop or getattr(loop, "_thread_id", None) == threading.get_ident()


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def kernel_loop() -> asyncio.AbstractEventLoop | None:
    """The running loop of the calling thread (the kernel's, in a notebook cell), or None."""
    return _running_loop()
