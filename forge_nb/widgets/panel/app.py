"""The dashboard as a panel app: inline (``panel_app(run)``) or served on 127.0.0.1 (``serve(run)``).

Same parts as the ipywidgets dashboard (status and controls, replica health, curves, episodes) built
from the same pieces (:class:`Curves` and its ``curves.js`` canvas, ``render_health``,
``render_episodes``), with panel widgets. Served, each browser session runs on the server's thread
while the Run lives on the kernel's event loop, so the two meet only through thread-safe hand-offs:

- the metrics observer (kernel thread) only appends to a deque; the session's periodic callback
  (every 0.25 s, so updates are throttled by construction) drains it into the curves, which send the
  page only the new points (a new page asks for the rest once, as in the notebook);
- status, hyperparameters and episodes are read *on the kernel loop* (``call_soon_threadsafe``) into
  a snapshot that the next tick renders: a busy kernel delays the grid, never blocks the server;
- buttons call the run's methods on the kernel loop (:class:`LoopCaller`), awaiting coroutines there.

The server around it (``serve``) is in ``forge_nb.widgets.panel.server``.

panel is imported inside the functions: ``import forge_nb.widgets`` stays light.
"""

from __future__ import annotations

import traceback
from collections import deque
from typing import Any

from forge_nb.widgets._shared.calls import LoopCaller, kernel_loop
from forge_nb.widgets._shared.run import RunView
from forge_nb.widgets.controls import (
    ACTIONS,
    FINAL_STATES,
    parse_text,
    read_hparams,
    render_status,
    run_summary,
    shown_text,
)
from forge_nb.widgets.curves import DASHBOARD_HEIGHT, Curves, panel_curves_view
from forge_nb.widgets.explorer import _bound, render_compare, render_episodes
from forge_nb.widgets.health import render_health, sharing, snapshot


class PanelDashboard:
    """One view (one browser session, or one inline display) of a run, made of panel components."""

    def __init__(self, run: RunView, loop: Any = None, interval: float = 0.25):
        import panel as pn

        self.run = run
        self.loop = loop
        self.errors: list[str] = []
        self.caller = LoopCaller(loop, self._report)
        self._queue: deque[tuple[str, dict[str, Any]]] = deque()
        self._latest: dict[str, Any] | None = None
        self._episodes: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None
        self._hparams: dict[str, Any] = {}
        self._pool: list[dict[str, Any]] = []
        self._closed = False

        self.status = pn.pane.HTML(render_status(run_summary(run)), css_classes=["forge-run-status"])
        self.buttons = {a: pn.widgets.Button(label=a, css_classes=[f"forge-{a}"], width=80) for a in ACTIONS}
        self.step_n = pn.widgets.IntInput(value=1, start=1, width=80)
        for action, button in self.buttons.items():
            button.on_click(lambda _, a=action: self._clicked(a))
        self.hparam_inputs: dict[str, Any] = {}
        self.apply = pn.widgets.Button(label="apply", color="primary", width=80)
        self.apply.on_click(lambda _: self._apply())
        self.hparams_row = pn.Row()
        self.health = pn.pane.HTML(render_health({}, None), sizing_mode="stretch_width")
        # The notebook's canvas curves; plotly cost the browser ~40% of two cores (bench/HISTORY.md).
        self.curves = Curves(view=panel_curves_view()(height=DASHBOARD_HEIGHT, sizing_mode="stretch_width"),
                             on_error=lambda e: self._report("curves", e))
        self.plot = self.curves.widget
        self.version = pn.widgets.Select(label="version", options={"all": None}, width=120)
        self.min_reward = pn.widgets.TextInput(label="min reward", width=100)
        self.max_reward = pn.widgets.TextInput(label="max reward", width=100)
        self.refresh = pn.widgets.Button(label="refresh episodes", width=140)
        self.refresh.on_click(lambda _: self._request_episodes())
        self.episodes = pn.pane.HTML(render_episodes([]), sizing_mode="stretch_width")
        self.prompt = pn.widgets.Select(label="prompt", options=[], sizing_mode="stretch_width")
        self.prompt.param.watch(lambda _: self._render_compare(), "value")
        self.compare = pn.pane.HTML(render_compare([], None), sizing_mode="stretch_width")
        self.errors_pane = pn.pane.HTML("", sizing_mode="stretch_width")
        b = self.buttons
        self.layout = pn.Column(
            self.status, pn.Row(b["start"], b["pause"], b["resume"], b["step"], self.step_n, b["stop"]),
            self.hparams_row, self.health, self.plot,
            pn.Card(pn.Row(self.version, self.min_reward, self.max_reward, self.refresh), self.episodes,
                    self.prompt, self.compare, title="episodes", collapsed=True, sizing_mode="stretch_width"),
            self.errors_pane, sizing_mode="stretch_width", css_classes=["forge-panel-dashboard"])
        self._unsubscribe: Any = None
        self._on_kernel(self._subscribe)  # on the kernel's thread: the replay sees a consistent history
        self._ticks = 0
        self._request_snapshot()
        self._tick()
        self._callback = pn.state.add_periodic_callback(self._tick, period=int(interval * 1000))
        if pn.state.curdoc is not None and pn.state.curdoc.session_context is not None:
            pn.state.curdoc.on_session_destroyed(lambda _: self.close())

    # -- hand-offs -----------------------------------------------------------------------------

    def _observe(self, kind: str, row: dict[str, Any]) -> None:
        self._queue.append((kind, row))  # deque.append is thread-safe; the tick does the drawing

    def _subscribe(self) -> None:
        if self._closed:
            return
        self._unsubscribe = self.run.metrics.subscribe(self._observe, replay=True)

    def _on_kernel(self, fn: Any) -> None:
        self.caller.call("panel app", fn)

    def _request_snapshot(self) -> None:
        def take() -> None:
            run = self.run
            services = getattr(run, "services", None) or {}
            self._latest = {"summary": run_summary(run), "health": snapshot(services), "shared": sharing(services),
                            "version": getattr(run, "version", None), "hparams": read_hparams(run),
                            "job": getattr(run, "job", None)}

        self._on_kernel(take)

    def _request_episodes(self) -> None:
        version, lo, hi = self.version.value, self.min_reward.value, self.max_reward.value

        def take() -> None:
            episodes = list(self.run.episodes(n=50, version=version, min_reward=_bound(lo, "min reward"),
                                              max_reward=_bound(hi, "max reward")))
            self._episodes = (episodes, list(self.run.episodes(n=500)))

        self._on_kernel(take)

    def _report(self, where: str, error: BaseException) -> None:
        tb = "".join(traceback.format_exception_only(type(error), error)).strip()
        self.errors.append(f"{where}: {tb}")

    # -- the tick (the session's thread) ----------------------------------------------------------

    def _tick(self) -> None:
        try:
            self._ticks += 1
            self._draw()
            if self._ticks % 2 == 0:
                self._request_snapshot()
            self._render()
        except Exception as e:
            self._report("panel app tick", e)
        if self.errors:
            import html

            items = "".join(f"<li><code>{html.escape(m)}</code></li>" for m in self.errors[-20:])
            value = f"<div style='color:#b00020'><b>{len(self.errors)} error(s)</b><ul>{items}</ul></div>"
            if value != self.errors_pane.object:
                self.errors_pane.object = value

    def _draw(self) -> None:
        if not self._queue:
            return
        while self._queue:
            kind, row = self._queue.popleft()
            try:  # one malformed row is reported and skipped; the rest are still drawn
                if kind == "step":
                    self.curves.data.add_row(row)
                elif kind == "event":
                    self.curves.data.add_event(row)
            except Exception as e:
                self._report(f"metrics {kind}", e)
        self.curves.draw()  # the new points, one message

    def _render(self) -> None:
        latest, self._latest = self._latest, None
        if latest is not None:
            status = render_status(latest["summary"])
            if status != self.status.object:
                self.status.object = status
            final = latest["summary"]["state"] in FINAL_STATES  # nothing left to control
            for button in (*self.buttons.values(), self.apply):
                button.disabled = final
            health = render_health(latest["health"], latest["version"], latest["job"], latest["shared"])
            if health != self.health.object:
                self.health.object = health
            hparams = latest["hparams"]
            if hparams.keys() != self._hparams.keys():
                self._build_inputs(hparams)
            for k, widget in self.hparam_inputs.items():  # follow the run unless the user is editing
                if hparams[k] != self._hparams.get(k) and self._value(k) == self._hparams.get(k):
                    widget.value = shown_text(hparams[k]) if isinstance(widget.value, str) else hparams[k]
            self._hparams = hparams
        episodes, self._episodes = self._episodes, None
        if episodes is not None:
            self._pool = episodes[1]
            self.episodes.object = render_episodes(episodes[0])
            versions = sorted({e.get("version") for e in self._pool if e.get("version") is not None})
            self.version.options = {"all": None, **{str(v): v for v in versions}}
            prompts = list(dict.fromkeys(str(e.get("prompt")) for e in reversed(self._pool)))[:100]
            self.prompt.options = prompts
            self._render_compare()

    def _render_compare(self) -> None:
        self.compare.object = render_compare(self._pool, self.prompt.value)

    # -- controls --------------------------------------------------------------------------------

    def _build_inputs(self, hparams: dict[str, Any]) -> None:
        import panel as pn

        self.hparam_inputs = {}
        for k, v in hparams.items():
            if isinstance(v, bool):
                self.hparam_inputs[k] = pn.widgets.Checkbox(label=k, value=v)
            elif isinstance(v, int):
                self.hparam_inputs[k] = pn.widgets.IntInput(label=k, value=v, width=110)
            elif isinstance(v, float):
                self.hparam_inputs[k] = pn.widgets.FloatInput(label=k, value=v, width=110)
            else:  # None (unset) or text: read back by parse_text
                text = pn.widgets.TextInput(label=k, value=shown_text(v), placeholder="None", width=110)
                self.hparam_inputs[k] = text
        self.hparams_row.objects = [*self.hparam_inputs.values(), self.apply] if self.hparam_inputs else []

    def _clicked(self, action: str) -> None:
        args = (int(self.step_n.value),) if action == "step" else ()
        self.caller.call(f"run.{action}", getattr(self.run, action), *args)

    def _value(self, name: str) -> Any:
        """An input's value as the run takes it."""
        widget = self.hparam_inputs[name]
        return parse_text(widget.value, self._hparams.get(name)) if isinstance(widget.value, str) else widget.value

    def _apply(self) -> None:
        changes = {k: v for k in self.hparam_inputs if (v := self._value(k)) != self._hparams.get(k)}
        if changes:
            self.caller.call("run.set", self.run.set, **changes)

    def close(self) -> None:
        self._closed = True
        if self._unsubscribe is not None:
            self._unsubscribe()
            self._unsubscribe = None
        self._callback.stop()


def panel_app(run: RunView, loop: Any = None) -> Any:
    """The dashboard as a panel object (display it in a cell, or serve it); ``.dashboard`` is its view."""
    import panel as pn

    pn.extension()
    view = PanelDashboard(run, loop=loop or kernel_loop())
    view.layout.dashboard = view  # type: ignore[attr-defined]
    return view.layout
