"""ErrorLog: every error raised in a dashboard callback, shown in a visible ``ipywidgets.Output``.

ipywidgets swallows exceptions raised in ``observe`` and ``on_click`` handlers (they reach only the
kernel's log), and the metrics store keeps an observer's error without raising it. The dashboard
routes all of them here instead: each shows in the Output under the dashboard with its traceback,
stays in ``messages``, and is logged. Repeats of one message (a poll that fails every tick) are
counted, not printed again.
"""

from __future__ import annotations

import functools
import logging
import traceback
from collections.abc import Callable
from typing import ParamSpec, TypeVar

import ipywidgets as w

logger = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")


class ErrorLog:
    """A visible list of callback errors; ``guard(where)`` wraps a callback to report into it."""

    def __init__(self, limit: int = 50):
        self.messages: list[str] = []
        self.counts: dict[str, int] = {}
        self.limit = limit
        self.title = w.HTML("")
        self.output = w.Output(layout=w.Layout(max_height="240px", overflow="auto"))
        self.widget = w.VBox([self.title, self.output])

    def report(self, where: str, error: BaseException) -> None:
        """Show ``error`` (raised in ``where``) under the dashboard."""
        message = f"{where}: {type(error).__name__}: {error}"
        if message in self.counts:
            self.counts[message] += 1
            self._retitle()
            return
        self.counts[message] = 1
        self.messages.append(message)
        logger.warning("dashboard callback failed: %s", message)
        if len(self.messages) <= self.limit:
            tb = "".join(traceback.format_exception(type(error), error, error.__traceback__))
            self.output.append_stderr(f"{message}\n{tb}\n")
        self._retitle()

    def _retitle(self) -> None:
        total = sum(self.counts.values())
        self.title.value = (f"<b style='color:#b00020'>{total} dashboard callback error(s)</b>"
                            f" &mdash; the run goes on; the latest is at the bottom")

    def guard(self, where: str) -> Callable[[Callable[P, R]], Callable[P, R | None]]:
        """Decorator: errors of the wrapped callback are reported here instead of vanishing."""

        def wrap(fn: Callable[P, R]) -> Callable[P, R | None]:
            @functools.wraps(fn)
            def guarded(*args: P.args, **kwargs: P.kwargs) -> R | None:
                try:
                    return fn(*args, **kwargs)
                except Exception as e:
                    self.report(where, e)
                    return None

            return guarded

        return wrap

    def reporter(self, where: str) -> Callable[[BaseException], None]:
        """``on_error`` callback for a Throttle or a task."""
        return functools.partial(self.report, where)

    def clear(self) -> None:
        self.messages.clear()
        self.counts.clear()
        self.output.clear_output()
        self.title.value = ""

    def to_html(self) -> str:
        if not self.messages:
            return ""
        import html

        items = "".join(f"<li><code>{html.escape(m)}</code> (x{self.counts[m]})</li>" for m in self.messages)
        return f"<div class='forge-errors'><b>dashboard callback errors</b><ul>{items}</ul></div>"
