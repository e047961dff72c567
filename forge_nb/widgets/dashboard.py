"""Dashboard: the live view of a Run in the notebook: controls, replica health, curves, episodes, errors.

::

    run.metrics ──observer──> Curves ──Throttle (<= 4/s)──> one message of new points to the canvas
    run.services ──events──> HealthGrid ──Throttle──> HTML table
         └─────── poll task (every 1 s): health counters, run state and hparams, explorer follow,
                  process logs (only while their section is open, and only when a log file changed)

The dashboard owns one asyncio task, ``forge_nb.dashboard.poll.<run>``, on the kernel's event loop
(so it keeps running while cells are idle); ``stop()`` cancels it and unsubscribes, ``close()`` also
closes the widgets. The task ends by itself once it has drawn the run shut down (buttons disabled).
It only *reads* the run (metrics and status) and calls its public control
methods; it never imports the service or runtime layers. Every callback error is shown in the
errors Output under the dashboard. Displayed, it shows the live widget and, as an output of its own,
``to_html()``: a static snapshot (run state, health, latest numbers, the curves as SVG) that the kernel keeps
current at the end of every cell (``snapshot.py``), for a saved or exported notebook; where the live
dashboard renders, its stylesheet hides the snapshot.
"""

from __future__ import annotations

import asyncio
import html
from typing import Any

import ipywidgets as w

from forge_nb.widgets._shared.calls import LoopCaller, kernel_loop
from forge_nb.widgets._shared.errors import ErrorLog
from forge_nb.widgets._shared.run import RunView
from forge_nb.widgets._shared.view import LiveView
from forge_nb.widgets.controls import FINAL_STATES, Controls, render_status, run_summary
from forge_nb.widgets.curves import Curves
from forge_nb.widgets.explorer import Explorer
from forge_nb.widgets.health import HealthGrid, render_health, sharing, snapshot
from forge_nb.widgets.logs import LogsView
from forge_nb.widgets.snapshot import SnapshotOutput, curves_svg

_live: dict[int, Dashboard] = {}  # id(run) -> its open dashboard, for dashboard(run)


class Dashboard(LiveView):
    """Live dashboard of ``run``; display it (last expression of a cell) or call ``display()``."""

    def __init__(self, run: RunView, *, poll_interval: float = 1.0, update_interval: float = 0.25,
                 start: bool = True):
        if not hasattr(run, "metrics") or not hasattr(run.metrics, "subscribe"):
            raise TypeError(f"Dashboard(run): {type(run).__name__} has no .metrics store to subscribe to; "
                            "pass the Run that `await forge_nb.spawn(config)` returned")
        self.run = run
        self.poll_interval = poll_interval
        self.loop = kernel_loop()
        self.errors = ErrorLog()
        self.caller = LoopCaller(self.loop, self.errors.report)
        self.controls = Controls(run, self.caller, self.errors)
        self.health = HealthGrid(lambda: getattr(run, "services", None) or {},
                                 lambda: getattr(run, "version", None), self.loop,
                                 self.errors.reporter("health grid"), job=lambda: getattr(run, "job", None))
        self.curves = Curves(update_interval, self.loop, self.errors.reporter("curves"))
        self.explorer = Explorer(run, self.errors)
        self._explorer_box = w.Accordion([self.explorer.widget], titles=("episodes",))
        opened = self.errors.guard("episode explorer")(lambda _: self.explorer.tick(self._explorer_open))
        self._explorer_box.observe(opened, names="selected_index")
        self.logs = LogsView(run, self.errors)
        self._logs_box = w.Accordion([self.logs.widget], titles=("process logs",))
        self._logs_box.observe(self.errors.guard("logs view")(lambda _: self.logs.tick(self.logs_open)),
                               names="selected_index")
        self.widget = w.VBox([self.controls.widget, self.health.widget, self.curves.widget, self._explorer_box,
                              self._logs_box, self.errors.widget])
        self.widget.add_class("forge-dashboard")
        self._task: asyncio.Task[None] | None = None
        self._unsubscribe: Any = None
        self._seen = {"step": 0, "event": 0}  # rows and events drawn so far
        self.snapshot = SnapshotOutput(self.to_html, lambda: run_summary(run)["state"] in FINAL_STATES)
        self._listen()
        self.tick()
        if start:
            self.start()
        _live[id(run)] = self

    # -- feeding ---------------------------------------------------------------------------------

    def _listen(self) -> None:
        """Subscribe to the metrics store; rows recorded before (or while stopped) are drawn at once."""
        store = self.run.metrics
        self._unsubscribe = store.subscribe(self._observe)
        for row in store.rows[self._seen["step"]:]:
            self._observe("step", row)
        for event in store.events[self._seen["event"]:]:
            self._observe("event", event)
        self.curves.flush()
        self.curves.lags_ms.clear()  # history is not latency

    def _observe(self, kind: str, row: dict[str, Any]) -> None:
        self._seen[kind] = self._seen.get(kind, 0) + 1
        try:
            self.curves.observe(kind, row)
        except Exception as e:  # shown under the dashboard; the store goes on with its other observers
            self.errors.report(f"metrics observer ({kind})", e)

    def tick(self) -> None:
        """One poll: replica health, run state and hyperparameters, the explorer's follow, the open logs."""
        for where, refresh in (("health grid", self.health.refresh), ("controls", self.controls.refresh),
                               ("episode explorer", lambda: self.explorer.tick(self._explorer_open)),
                               ("logs view", lambda: self.logs.tick(self.logs_open))):
            try:
                refresh()
            except Exception as e:
                self.errors.report(where, e)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            self.tick()
            if run_summary(self.run)["state"] in FINAL_STATES:  # drawn as shut down; nothing will change
                self._task = None
                self.stop()
                return

    @property
    def _explorer_open(self) -> bool:
        return self._explorer_box.selected_index is not None

    @property
    def logs_open(self) -> bool:
        """Whether the process logs section is open (it reads only then)."""
        return self._logs_box.selected_index is not None

    def show_logs(self, service: str | None = None, index: int | None = None, level: str | None = None) -> None:
        """Open the process logs section on ``service`` (replica ``index``) at ``level`` and read them."""
        self.logs.choose(service, index, level)
        if self.logs_open:
            self.logs.read()
        else:
            self._logs_box.selected_index = 0  # its observer reads

    # -- lifecycle -------------------------------------------------------------------------------

    @property
    def polling(self) -> bool:
        return self._task is not None and not self._task.done()

    def start(self) -> None:
        """Start (or restart after ``stop()``) the poll task and the metrics subscription."""
        if self._unsubscribe is None:
            self._listen()
        if self.polling:
            return
        loop = self.loop or kernel_loop()
        if loop is None or not loop.is_running():
            self.errors.report("dashboard", RuntimeError(
                "no running event loop: the dashboard will not refresh by itself; "
                "open it in a Jupyter kernel, or call dashboard.tick() and dashboard.curves.flush()"))
            return
        self._task = loop.create_task(self._poll(), name=f"forge_nb.dashboard.poll.{getattr(self.run, 'name', '')}")
        self._task.add_done_callback(self._poll_ended)

    def _poll_ended(self, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is not None:
            self.errors.report("dashboard poll task (it stopped; call dashboard.start())", task.exception())  # type: ignore[arg-type]

    def stop(self) -> None:
        """Stop refreshing: cancel the poll task and stop listening to the metrics store."""
        if self._task is not None:
            self._task.cancel()
            self._task = None
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self.curves.throttle.cancel()
        self.health.unsubscribe()
        if _live.get(id(self.run)) is self:
            del _live[id(self.run)]

    def close(self) -> None:
        """Stop refreshing and close every widget (their views in the page go blank)."""
        self.stop()
        self.snapshot.close()
        self.health.close()
        self.curves.close()
        _close_tree(self.widget)

    # -- display ---------------------------------------------------------------------------------

    def _ipython_display_(self) -> None:
        """The live widget (its own HTML: one line), then the snapshot, kept current at each cell's end."""
        from IPython.display import display

        bundle = self.widget._repr_mimebundle_()
        bundle["text/html"] = (f"<div class='forge-live-note'>the live dashboard of run "
                               f"{html.escape(str(run_summary(self.run)['name']))!r}; its snapshot follows</div>")
        display(bundle, raw=True)
        self.snapshot.show()

    def to_html(self) -> str:
        """A static HTML snapshot: run state, replica health, the curves, the latest value of every metric, events."""
        run = self.run
        services = getattr(run, "services", None) or {}
        try:
            health = render_health(snapshot(services), getattr(run, "version", None), getattr(run, "job", None),
                                   sharing(services))
        except Exception as e:
            health = f"<div>replica status unavailable: {html.escape(repr(e))}</div>"
        return "".join([
            "<div class='forge-dashboard-static'>", render_status(run_summary(run)), health,
            curves_svg(run.metrics), metrics_table(run.metrics), events_list(run.metrics), self.errors.to_html(),
            "</div>"])

    def __repr__(self) -> str:
        s = run_summary(self.run)
        return f"<Dashboard of {s['name']}: {s['state']}, step {s['step']}, polling={self.polling}>"


def _close_tree(widget: w.Widget) -> None:
    for child in getattr(widget, "children", ()):
        _close_tree(child)
    widget.close()


def metrics_table(store: Any) -> str:
    """The latest value of every metric, and the step it was recorded at."""
    last: dict[str, tuple[int, float]] = {}
    for row in store.rows:
        for key, value in row.items():
            if key not in ("step", "time"):
                last[key] = (row["step"], value)
    if not last:
        return "<div><i>no metrics recorded yet</i></div>"
    rows = "".join(f"<tr><td style='padding:1px 6px'>{html.escape(k)}</td><td style='padding:1px 6px'>{s}</td>"
                   f"<td style='padding:1px 6px;text-align:right'>{_fmt(v)}</td></tr>"
                   for k, (s, v) in sorted(last.items()))
    return ("<table class='forge-metrics' style='border-collapse:collapse;font-size:12px'>"
            f"<tr><th>metric</th><th>step</th><th>last</th></tr>{rows}</table>")


def _fmt(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float | int) else html.escape(str(value))


def events_list(store: Any, limit: int = 10) -> str:
    events = store.events[-limit:]
    if not events:
        return ""
    items = "".join(
        f"<li>step {e.get('step')}: {html.escape(e.get('kind', ''))} "
        f"{html.escape(', '.join(f'{k}={v}' for k, v in e.items() if k not in ('kind', 'step', 'time')))}</li>"
        for e in events)
    return f"<div class='forge-events'><b>recent events</b><ul>{items}</ul></div>"


def dashboard(run: RunView, **kwargs: Any) -> Dashboard:
    """The run's open dashboard, or a new one (re-running a cell does not stack pollers)."""
    live = _live.get(id(run))
    if live is not None and live.run is run and live.polling and not kwargs:
        return live
    return Dashboard(run, **kwargs)
