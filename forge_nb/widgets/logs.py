"""LogsView: the dashboard's view of what a run's processes wrote (vLLM, monarch, torch), read back from its log files.

Every process a run spawns writes to ``<run_dir>/logs/<mesh>.log`` (``forge_nb.system.processes.proclogs``), not to
the cells; this view shows the last lines of one service or replica (``run.logs(service, index, n,
level)``, as ``%forge_logs`` prints them), filtered by level, with warnings and errors coloured.

Cheap by construction, so it stays inside the dashboard's kernel-time budget (bench/dashboard.py):
``tick(open)`` runs on the dashboard's poll and does nothing while the view is closed; while open it
first compares the log folder's listing (name, size, mtime: one ``scandir``) with the last read and
calls ``run.logs`` only when a file changed, at most once per ``min_interval`` seconds. Changing the
source, the level or the line count, or the refresh button, reads at once.

Considered: ``ipywidgets.Output`` with ``print`` (one comm message per print and an ever-growing
output area, where one ``HTML`` value replaced per read is a single message), and JupyterLab's own log
console (extension-specific, kernel-wide, and it does not know a run's meshes); tailing libraries
(``tailer``, ``sh``) follow one file and would add a dependency for what ``run.logs`` already does.
"""

from __future__ import annotations

import html
import os
import time

import ipywidgets as w

from forge_nb.system.processes.proclogs import LEVELS
from forge_nb.widgets._shared.errors import ErrorLog
from forge_nb.widgets._shared.run import RunView

ALL = "all"
LEVEL_OPTIONS = ((ALL, None), ("warning", "warning"), ("error", "error"))
LINES_OPTIONS = (20, 40, 100, 200)


class LogsView:
    """The last ``n`` log lines of the run's processes: a source (all, a service, a replica), a level and a count."""

    def __init__(self, run: RunView, errors: ErrorLog, *, n: int = 40, min_interval: float = 1.0):
        if n not in LINES_OPTIONS:
            raise ValueError(f"LogsView(n={n!r}): choose one of {LINES_OPTIONS} lines")
        self.run = run
        self.min_interval = min_interval
        self.reads = 0  #: how many times the logs were read (tests and the benchmark read it)
        self.shown: list[str] = []  #: the lines on view
        self._updating = False  # set while read() replaces the source options (their observer must not read)
        self._signature: tuple[tuple[str, int, int], ...] | None = None
        self._last_read = -float("inf")
        self.source = w.Dropdown(options=self.sources(), value=(None, None), description="process",
                                 style={"description_width": "60px"}, layout=w.Layout(width="220px"))
        self.level = w.ToggleButtons(options=LEVEL_OPTIONS, value=None, style={"button_width": "70px"})
        self.lines = w.Dropdown(options=LINES_OPTIONS, value=n, description="lines",
                                style={"description_width": "40px"}, layout=w.Layout(width="120px"))
        self.refresh_button = w.Button(description="refresh", icon="refresh", layout=w.Layout(width="100px"))
        self.status = w.HTML("")
        self.html = w.HTML("", layout=w.Layout(max_height="320px", overflow="auto"))
        self.widget = w.VBox([w.HBox([self.source, self.level, self.lines, self.refresh_button]), self.status,
                              self.html])
        self.widget.add_class("forge-logs")
        changed = errors.guard("logs view")(lambda _: None if self._updating else self.read())
        for control in (self.source, self.level, self.lines):
            control.observe(changed, names="value")
        self.refresh_button.on_click(errors.guard("logs view refresh")(lambda _: self.read()))

    def sources(self) -> list[tuple[str, tuple[str | None, int | None]]]:
        """Dropdown options: all, each service, each replica of a service that has several, and the kernel."""
        options: list[tuple[str, tuple[str | None, int | None]]] = [(ALL, (None, None))]
        for name, svc in (getattr(self.run, "services", None) or {}).items():
            options.append((name, (name, None)))
            replicas = getattr(svc, "replicas", ())
            if len(replicas) > 1:
                options += [(f"{name}[{r.index}]", (name, r.index)) for r in replicas]
        options.append(("kernel", ("kernel", None)))  # forge_nb's own records in the kernel (run.logs("kernel"))
        return options

    def choose(self, service: str | None = None, index: int | None = None, level: str | None = None) -> None:
        """Show ``service`` (replica ``index``; None: all) at ``level`` from the next read on."""
        sources = self.sources()
        if (service, index) not in dict(sources).values():
            raise ValueError(f"logs of ({service!r}, {index!r}): choose one of {[label for label, _ in sources]} "
                             "(a service name, and a replica index where it has several)")
        if level not in dict(LEVEL_OPTIONS).values():
            raise ValueError(f"logs level={level!r}: use None (every line), 'warning' or 'error'")
        self._updating = True
        try:
            self.source.options = sources
            self.source.value, self.level.value = (service, index), level
        finally:
            self._updating = False
        self._signature, self._last_read = None, -float("inf")  # the next tick reads

    def _folder_signature(self) -> tuple[tuple[str, int, int], ...]:
        try:
            with os.scandir(self.run.dir.logs) as entries:
                return tuple(sorted((e.name, (s := e.stat()).st_size, s.st_mtime_ns)
                                    for e in entries if e.name.endswith(".log")))
        except OSError:  # no log written yet
            return ()

    def tick(self, is_open: bool) -> bool:
        """The poll's call: read again when open, a log changed and ``min_interval`` passed; True if it read."""
        if not is_open or time.monotonic() - self._last_read < self.min_interval:
            return False
        if self._folder_signature() == self._signature:
            return False
        self.read()
        return True

    def read(self) -> None:
        """Read the chosen lines now and draw them."""
        sources = self.sources()
        if list(self.source.options) != sources:  # a service added, or its replicas changed
            self._updating = True
            try:
                value = self.source.value
                self.source.options = sources
                self.source.value = value if value in dict(sources).values() else (None, None)
            finally:
                self._updating = False
        service, index = self.source.value or (None, None)
        self._signature = self._folder_signature()
        self._last_read = time.monotonic()
        self.reads += 1
        text = self.run.logs(service, index, n=self.lines.value, level=self.level.value)
        lines = self.shown = text.splitlines()
        where = self.source.label or ALL
        level = f", {self.level.value} and above" if self.level.value else ""
        self.status.value = (f"<span style='font-size:11px;color:#666'>last {len(lines)} line(s) of {where}{level}"
                             f" &middot; {html.escape(str(self.run.dir.logs))} &middot; "
                             f"read {time.strftime('%H:%M:%S')}</span>")
        self.html.value = render_lines(lines)

    @property
    def text(self) -> str:
        """The lines on view, as plain text."""
        return "\n".join(self.shown)


def render_lines(lines: list[str]) -> str:
    """Log lines as HTML: monospace, errors red, warnings amber, each line a div (wrapping long lines)."""
    if not lines:
        return "<div style='font-size:12px;color:#666'><i>nothing logged yet</i></div>"
    out = ["<div class='forge-log-lines' style='font:11px/1.35 monospace;white-space:pre-wrap'>"]
    for line in lines:
        body = line.split("] ", 1)[-1]  # the mesh prefix must not make a line an error
        colour = ("#b00020" if LEVELS["error"].search(body) else "#a15c00" if LEVELS["warning"].search(body)
                  else "inherit")
        out.append(f"<div style='color:{colour}'>{html.escape(line)}</div>")
    out.append("</div>")
    return "".join(out)
