"""compare: several runs on the same curves, live: one panel per metric, one line per run.

::

    run_a.metrics ──observer(run_a)──┐
    run_b.metrics ──observer(run_b)──┴──> RunsData ("<run>/<metric>" traces) ──Throttle──> curves.js

    from forge_nb.widgets import compare
    cmp = compare(run_a, run_b, metrics=("reward/mean", "loss"))   # display it; it grows as they train
    cmp.add(run_c)                                                # a run started later, with its history
    cmp.close()                                                   # unsubscribes; the views go blank

This is the dashboard's chart, not a second one: :class:`RunsData` is a ``CurveData`` laid out as one
panel per chosen metric with a trace per run, and :class:`Curves` sends it to ``curves.js`` by the
same points protocol (only new points, at most ~4 messages a second). A run keeps its colour in every
panel (the legend names it); its hot changes and failures are marks in that colour, labelled with its
name. A run here is anything with ``.name`` and ``.metrics`` (a MetricsStore): a run that was shut
down still has its history, which is drawn. Where widgets cannot render, ``to_html()`` is a table of
each run's last value per metric.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Iterable
from typing import Any

import ipywidgets as w

from forge_nb.widgets._shared.calls import kernel_loop
from forge_nb.widgets._shared.errors import ErrorLog
from forge_nb.widgets._shared.series import MARKS, CurveData, Panel, Row, Trace, mark_of
from forge_nb.widgets._shared.view import LiveView
from forge_nb.widgets.curves import PALETTE, Curves

DEFAULT_METRICS = ("reward/mean", "loss", "kl", "entropy")


class RunsData(CurveData):
    """The curves of several runs: panel ``p`` draws ``metrics[p]``, one ``"<run>/<metric>"`` line per run."""

    def __init__(self, metrics: tuple[str, ...], max_points: int = 5_000, max_marks: int = 40):
        self.metrics = metrics
        self.panels = tuple(Panel(m, (m,), i // 2 + 1, i % 2 + 1, f"nothing recorded yet under {m!r}")
                            for i, m in enumerate(metrics))
        self.colors: dict[str, str] = {}  #: run -> its colour, in every panel
        self.run_of: dict[int, str] = {}  #: trace index -> run
        super().__init__(max_points, max_marks)

    def _add_traces(self) -> None:  # traces come with their runs (add_run)
        pass

    def add_run(self, run: str) -> None:
        self.colors[run] = PALETTE[len(self.colors) % len(PALETTE)]
        keys = [(f"{run}/{m}", p, "line") for p, m in enumerate(self.metrics)]
        for key, panel, kind in keys + [(f"mark:{k}:{run}", 0, "mark") for k in MARKS]:
            i = self._add(key, panel, kind)
            self.run_of[i] = run
            self.new_traces.append(i)

    def add_run_row(self, run: str, row: Row) -> None:
        step = row.get("step", 0)
        for metric in self.metrics:
            if metric in row:
                self._append(self._index[f"{run}/{metric}"], step, row[metric])
        if "time" in row:
            self.row_times.append(row["time"])

    def add_run_event(self, run: str, event: Row) -> None:
        mark = mark_of(event)
        if mark is None:
            return
        kind, label = f"{mark[0]}:{run}", f"{run}: {mark[1]}"
        step = event.get("step", 0)
        self._append(self._index[f"mark:{kind}"], step, MARKS[mark[0]][3], label)
        self.marks = [*self.marks, (step, kind, label)][-self.max_marks:]
        self.marks_dirty = True

    def mark_styles(self) -> dict[str, dict[str, Any]]:
        return {f"{kind}:{run}": {"name": f"{run}: {name}", "color": color, "symbol": symbol, "y": y}
                for run, color in self.colors.items() for kind, (name, _, symbol, y) in MARKS.items()}

    def build(self, figure: Any) -> Any:
        """The panels on a plotly ``figure``: a legend entry per run, its marks as dotted lines in its colour."""
        from plotly.subplots import make_subplots

        rows, lone = max((p.row for p in self.panels), default=1), len(self.panels) % 2 == 1
        specs: list[list[dict[str, Any] | None]] = [[{}, {}] for _ in range(rows)]
        if lone:
            specs[-1] = [{"colspan": 2}, None]
        fig = make_subplots(rows=rows, cols=2, specs=specs, figure=figure, vertical_spacing=0.08,
                            subplot_titles=[p.title for p in self.panels])
        for i, t in enumerate(self.traces):
            if t.kind == "line":
                run, panel = self.run_of[i], self.panels[t.panel]
                fig.add_scatter(x=t.x.view(), y=t.y.view(), name=run, legendgroup=run, mode="lines",
                                showlegend=t.panel == 0, line=dict(color=self.colors[run]),
                                row=panel.row, col=panel.col)
        fig.update_xaxes(matches="x")
        fig.update_layout(height=260 * rows + 80, uirevision="keep", hovermode="closest")
        for step, kind, _ in self.marks:
            fig.add_vline(x=step, line=dict(color=self.colors[kind.split(":", 1)[1]], width=1, dash="dot"))
        return fig


class RunsCurves(Curves):
    """The dashboard's :class:`Curves` over :class:`RunsData`: a run's lines share its colour and name."""

    data: RunsData

    def style(self, t: Trace, k: int) -> dict[str, Any]:
        run = self.data.run_of[self.data._index[t.key]]
        return {"key": t.key, "panel": t.panel, "kind": t.kind, "name": run, "color": self.data.colors[run],
                "width": 2 if t.kind == "line" else 1, "dash": False, "smooth": t.kind == "line"}


class Compare(LiveView):
    """Several runs' curves, live; display it (last expression of a cell), ``add`` a run, ``close()``."""

    def __init__(self, *runs: Any, metrics: Iterable[str] | str = DEFAULT_METRICS,
                 update_interval: float = 0.25, max_points: int = 5_000):
        self.metrics = _check_metrics(metrics)
        self.loop = kernel_loop()
        self.errors = ErrorLog()
        self.data = RunsData(self.metrics, max_points=max_points)
        self.curves = RunsCurves(update_interval, self.loop, self.errors.reporter("curves"), data=self.data)
        self.curves.widget.height = 60 + 230 * max(p.row for p in self.data.panels)
        self.runs: dict[str, Any] = {}
        self._unsubscribe: dict[str, Callable[[], None]] = {}
        self._seen: dict[str, dict[str, int]] = {}  # run -> rows and events drawn so far
        self.title = w.HTML()
        self.widget = w.VBox([self.title, self.curves.widget, self.errors.widget])
        self.widget.add_class("forge-compare")
        self.add(*runs)

    def add(self, *runs: Any) -> None:
        """Draw these runs too, each with the history it already has (nothing is added if one is refused)."""
        names = [_check_run(run) for run in runs]
        for name in names:
            if name in self.runs or names.count(name) > 1:
                raise ValueError(f"compare: two runs are named {name!r}; their curves would be one legend entry. "
                                 "Give each run its own name (RunConfig(name=...)) before comparing them")
        for name, run in zip(names, runs, strict=True):
            self.runs[name] = run
            self._seen[name] = {"step": 0, "event": 0}
            self.data.add_run(name)
            self._listen(name)
        self.curves.relayout()
        self.curves.flush()
        self.curves.lags_ms.clear()  # history is not latency
        self.title.value = self._legend()

    def _listen(self, name: str) -> None:
        """Subscribe to the run's store; rows recorded before (or while stopped) are drawn at once."""
        store, seen, observe = self.runs[name].metrics, self._seen[name], self._observer(name)
        self._unsubscribe[name] = store.subscribe(observe)
        for row in store.rows[seen["step"]:]:
            observe("step", row)
        for event in store.events[seen["event"]:]:
            observe("event", event)

    def _observer(self, name: str) -> Callable[[str, Row], None]:
        def observe(kind: str, row: Row) -> None:
            seen = self._seen[name]
            seen[kind] = seen.get(kind, 0) + 1
            try:
                if kind == "step":
                    self.data.add_run_row(name, row)
                elif kind == "event":
                    self.data.add_run_event(name, row)
                else:
                    return
                self.curves.throttle.poke()
            except Exception as e:  # shown under the curves; the store goes on with its other observers
                self.errors.report(f"compare observer ({name}, {kind})", e)

        observe.__qualname__ = f"compare[{name}]"
        return observe

    @property
    def listening(self) -> bool:
        return bool(self._unsubscribe)

    def start(self) -> None:
        """Listen again after ``stop()``: what the runs recorded meanwhile is drawn at once."""
        for name in self.runs:
            if name not in self._unsubscribe:
                self._listen(name)
        self.curves.flush()

    def stop(self) -> None:
        """Stop listening to every run's metrics store (the curves stay as they are)."""
        for unsubscribe in self._unsubscribe.values():
            unsubscribe()
        self._unsubscribe.clear()
        self.curves.throttle.cancel()

    def close(self) -> None:
        """Stop listening and close the widgets (their views in the page go blank)."""
        self.stop()
        self.curves.close()
        _close_tree(self.widget)

    # -- display ---------------------------------------------------------------------------------

    def _legend(self) -> str:
        items = " &nbsp; ".join(f"<span style='color:{self.data.colors[n]}'>&#9632;</span> <b>{html.escape(n)}</b>"
                                for n in self.runs)
        return f"<div class='forge-compare-legend'>{items or '<i>no runs yet: cmp.add(run)</i>'}</div>"

    def to_html(self) -> str:
        """A static table: each run's state and, per metric, its last value and the step it was recorded at."""
        head = "".join(f"<th style='padding:1px 8px;color:{self.data.colors[n]}'>{html.escape(n)}"
                       f"<br><small>{html.escape(str(getattr(r, 'state', '') or ''))}</small></th>"
                       for n, r in self.runs.items())
        body = ""
        for metric in self.metrics:
            cells = "".join(f"<td style='padding:1px 8px;text-align:right'>{_last(r.metrics, metric)}</td>"
                            for r in self.runs.values())
            body += f"<tr><td style='padding:1px 8px'>{html.escape(metric)}</td>{cells}</tr>"
        return (f"<div class='forge-compare-static'>{self._legend()}<table style='border-collapse:collapse;"
                f"font-size:12px'><tr><th>metric</th>{head}</tr>{body}</table>{self.errors.to_html()}</div>")

    def __repr__(self) -> str:
        return f"<Compare {list(self.runs)} on {list(self.metrics)}, listening={self.listening}>"


def _close_tree(widget: w.Widget) -> None:
    for child in getattr(widget, "children", ()):
        _close_tree(child)
    widget.close()


def _last(store: Any, metric: str) -> str:
    for row in reversed(store.rows):
        if metric in row:
            return f"{row[metric]:.6g} <small>(step {row['step']})</small>"
    return "<i>nothing recorded yet</i>"


def _check_run(run: object) -> str:
    store = getattr(run, "metrics", None)
    if not hasattr(store, "subscribe") or not hasattr(store, "rows"):
        raise TypeError(f"compare: {type(run).__name__} {run!r:.80} is not a run (it has no .metrics store); "
                        "pass the Runs that `await forge_nb.spawn(config)` returned")
    name = getattr(run, "name", None)
    if not isinstance(name, str) or not name:
        raise TypeError(f"compare: the run's .name is {name!r}; a run needs a non-empty string name to be "
                        "told apart from the others (RunConfig(name=...))")
    return name


def _check_metrics(metrics: Iterable[str] | str) -> tuple[str, ...]:
    try:
        chosen = (metrics,) if isinstance(metrics, str) else tuple(metrics)
    except TypeError:
        chosen = ()
    bad = [m for m in chosen if not isinstance(m, str) or not m]
    if bad or not chosen:
        raise TypeError(f"compare(metrics={metrics!r}): give metric names as strings, e.g. "
                        f"metrics={DEFAULT_METRICS!r} (run.metrics.names() lists those recorded)")
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"compare(metrics={metrics!r}): a metric is named twice; name each once")
    return chosen


def compare(*runs: Any, metrics: Iterable[str] | str = DEFAULT_METRICS, **kwargs: Any) -> Compare:
    """Several runs on the same curves, growing live as they record steps; see :class:`Compare`."""
    return Compare(*runs, metrics=metrics, **kwargs)
