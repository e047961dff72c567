"""Curves: the run's training curves as a uPlot widget that is sent only new points, throttled.

::

    metrics store ──observe(kind, row)──> CurveData (appends) ──Throttle (<= 4/s)──> one message:
        the points each changed trace gained since the last one, as one float64 buffer ──> curves.js

The store calls ``observe`` for every recorded row and event (on the recording thread). That only
appends to :class:`CurveData` and pokes a :class:`Throttle`; at most ~4 times a second the throttle
sends the new points of the changed traces as one custom message. The page (``curves.js``) appends
them, redraws at most every ``redraw_interval`` seconds (2) and only while the view is on screen,
and never answers an update. A view that opens late, or misses a message, asks for everything once
(``{"type": "sync"}``). The layout, trace styles, event marks and the smoothing weight are synced
traits, which change rarely.

The page draws with uPlot (vendored in ``vendor/``, MIT; these machines are offline): a small canvas
chart library made for streaming, which gives the axes, the legend (click an entry to hide its
trace), the hover readout, drag-to-zoom with double-click reset and the per-pixel decimation that
``curves.js`` used to hand-write. ``curves.js`` keeps the points protocol, the throttle, drawing only
in view, the EMA smoothing control (TensorBoard's, debiased; raw traces drawn faint beneath) and the
marks. Considered: plotly's FigureWidget (~120 ms of chromium per redraw of nine panels and deltas
sent back to the kernel after every update: training ran 40% slower, bench/HISTORY.md), Chart.js
and echarts (about 4x and 20x uPlot's 51 KB, made for richer charts rather than streaming ones).
``plotly()`` still gives a FigureWidget of the curves so far, to export.

``lags_ms`` keeps, per drawn row, the time from its recording to the message that carries it (the
dashboard's latency, which bench/dashboard.py reports).
"""

from __future__ import annotations

import asyncio
import base64
import functools
import pathlib
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

import anywidget
import numpy as np
import traitlets

from forge_nb.widgets._shared.series import REWARD_FUNCTIONS, CurveData, Row, Trace
from forge_nb.widgets._shared.throttle import Throttle

#: The dashboard's eight rows of panels: ~88 px of plot each (the reward row 1.6x), what six rows had at 860 px.
DASHBOARD_HEIGHT = 1130
CURVES_JS = pathlib.Path(__file__).with_name("curves.js")  #: the page half, in both hosts
VENDOR = pathlib.Path(__file__).with_name("vendor")  #: uPlot 1.6.32 (npm ``uplot``), its LICENSE, our CSS
#: seconds between the page's redraws for new points, in both hosts: at 1 s the uPlot curves cost 2-4% of
#: a 2-core run's steps with JupyterLab showing them (bench/dashboard_browser.py, bench/RESULTS.md)
REDRAW_INTERVAL = 2.0
PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf")
SMOOTHING = 0.6  #: the EMA weight a view opens with (TensorBoard's default); its slider goes 0..0.99


@functools.cache
def page_module() -> tuple[str, str]:
    """(ESM, CSS) of the page half: uPlot's IIFE build before ``curves.js`` in one module (it defines the
    module-level ``uPlot``; anywidget and panel take one module), and uPlot's stylesheet with ours."""
    esm = (VENDOR / "uPlot.iife.min.js").read_text() + "\n" + CURVES_JS.read_text()
    css = (VENDOR / "uPlot.min.css").read_text() + "\n" + (VENDOR / "curves.css").read_text()
    return esm, css


class CurvesView(anywidget.AnyWidget):
    """The page half: ``curves.js`` draws the points it is sent; the traits describe what to draw."""

    _esm, _css = page_module()
    panels = traitlets.List().tag(sync=True)  #: [{title, row, col, empty}]
    traces = traitlets.List().tag(sync=True)  #: [{key, panel, kind, name, color, width, dash, smooth}]
    marks = traitlets.List().tag(sync=True)  #: [[step, "set" | "failure", label]]
    mark_styles = traitlets.Dict().tag(sync=True)  #: kind -> {name, color, symbol, y}
    height = traitlets.Int(DASHBOARD_HEIGHT).tag(sync=True)  #: pixels
    #: seconds between redraws for new points: the page keeps every point it is sent, and draws them
    #: at most this often (hovering and resizing draw at once)
    redraw_interval = traitlets.Float(REDRAW_INTERVAL).tag(sync=True)
    #: the EMA weight over the line traces (0: raw); the page's slider sets it, and so can the kernel
    smoothing = traitlets.Float(SMOOTHING, min=0.0, max=0.99).tag(sync=True)


@functools.cache
def panel_curves_view() -> type:
    """``PanelCurves``: ``curves.js`` as a panel ``JSComponent`` (made on first use, as panel is imported
    lazily). It offers what :class:`Curves` uses of a ``CurvesView``: the traits as params (``height`` is
    the component's own), ``send(content, buffers)``, whose float64 buffer travels base64-encoded since
    panel's messages are JSON, and ``on_msg(callback(widget, content, buffers))`` for the page's
    ``{"type": "sync"}``."""
    import param
    from panel.custom import JSComponent

    esm, css = page_module()

    class PanelCurves(JSComponent):
        _esm = esm
        _stylesheets = [css]  # panel renders into a shadow root: the page's stylesheets do not reach it
        panels = param.List(default=[])
        traces = param.List(default=[])
        marks = param.List(default=[])
        mark_styles = param.Dict(default={})
        redraw_interval = param.Number(default=REDRAW_INTERVAL)
        smoothing = param.Number(default=SMOOTHING, bounds=(0.0, 0.99))

        def __init__(self, **params: Any) -> None:
            super().__init__(**params)
            self._requests: list[Any] = []

        def send(self, content: dict[str, Any], buffers: list[Any] | None = None) -> None:
            if buffers:
                content = {**content, "b64": base64.b64encode(bytes(buffers[0])).decode("ascii")}
            self._send_msg(content)

        def on_msg(self, callback: Any) -> None:  # type: ignore[override]  # anywidget's signature
            self._requests.append(callback)

        def _handle_msg(self, data: Any) -> None:
            for callback in self._requests:
                callback(self, data, [])

    return PanelCurves


class Drawn(NamedTuple):
    """The points of one trace that the views have been sent (and a marked event's labels)."""

    x: np.ndarray
    y: np.ndarray
    text: tuple[str, ...] = ()


class Curves:
    """The run's curves; ``observe`` is the metrics-store observer, ``widget`` the view to display."""

    def __init__(self, interval: float = 0.25, loop: asyncio.AbstractEventLoop | None = None,
                 on_error: Callable[[BaseException], None] | None = None, max_points: int = 5_000,
                 view: Any = None, data: CurveData | None = None):
        """``view``: the page half to feed; a :class:`CurvesView` by default. The panel app passes its
        ``PanelCurves`` (:func:`panel_curves_view`), which has the same traits, ``send`` and ``on_msg``.
        ``data``: the model to draw, the dashboard's layout by default (``compare`` passes its own)."""
        self.data = data if data is not None else CurveData(max_points=max_points)
        self.widget = view if view is not None else CurvesView()
        self.relayout()
        self.widget.on_msg(self._on_msg)
        self.throttle = Throttle(self.draw, interval=interval, loop=loop, on_error=on_error)
        self._on_error = on_error
        self._sent: dict[int, tuple[int, int]] = {}  # trace -> (its halvings, points) when last sent
        self.messages = 0  #: point messages sent (tests and the benchmark read it)
        self.lags_ms: deque[float] = deque(maxlen=10_000)

    def relayout(self) -> None:
        """Send the panels, trace styles and mark styles of the model (when made, and when it grew)."""
        self.widget.panels = [{"title": p.title, "row": p.row, "col": p.col, "empty": p.empty}
                              for p in self.data.panels]
        self.widget.traces = self._styles()
        self.widget.mark_styles = self.data.mark_styles()

    def observe(self, kind: str, row: Row) -> None:
        if kind == "step":
            self.data.add_row(row)
        elif kind == "event":
            self.data.add_event(row)
        else:
            return
        self.throttle.poke()

    def flush(self) -> None:
        """Send whatever is pending now (tests, scripts without an event loop)."""
        self.throttle.flush()

    def draw(self) -> None:
        """Send what changed since the last call: the throttle's flush (the panel app calls it from its tick)."""
        new, dirty, marks_dirty, times = self.data.take()
        if new:
            self.widget.traces = self._styles()
        if marks_dirty:
            self.widget.marks = [list(mark) for mark in self.data.marks]
        self._send(dirty)
        now = time.time()
        self.lags_ms.extend(1000 * (now - t) for t in times)

    def _send(self, indices: list[int], sync: bool = False) -> None:
        """One message with the points each trace gained since it was last sent (all of them on a sync,
        or after the trace was thinned)."""
        header, parts = [], []
        for i in indices:
            t = self.data.traces[i]
            if t.kind == "mark":  # drawn from the marks trait
                continue
            start = 0 if sync else self._held(i)
            x, y = t.x.view()[start:], t.y.view()[start:]
            if start and not len(x):  # already sent (by a sync since it changed)
                continue
            header.append([i, start, len(x)])
            parts += [x, y]
            self._sent[i] = (t.halvings, start + len(x))
        if header or sync:
            buffer = np.concatenate(parts) if parts else np.empty(0)
            self.widget.send({"type": "points", "traces": header, "sync": sync}, buffers=[memoryview(buffer)])
            self.messages += 1

    def _on_msg(self, _widget: Any, content: dict[str, Any], _buffers: list[Any]) -> None:
        if content.get("type") != "sync":
            return
        try:  # a view opened, or missed a message: everything, in one message
            self._send([i for i, t in enumerate(self.data.traces) if len(t.x)], sync=True)
        except Exception as e:
            if self._on_error is None:
                raise
            self._on_error(e)

    def _styles(self) -> list[dict[str, Any]]:
        styles, used = [], dict.fromkeys(range(len(self.data.panels)), 0)
        for t in self.data.traces:
            style = self.style(t, used[t.panel])
            used[t.panel] += t.kind == "line"
            styles.append(style)
        return styles

    def style(self, t: Trace, k: int) -> dict[str, Any]:
        """How curves.js draws trace ``t``, the ``k``-th line of its panel."""
        return _style(t, k)

    def trace(self, key: str) -> Drawn:
        """What the views have been sent of a metric (``"reward/mean"``) or of a marked event kind
        (``"mark:set"``, ``"mark:failure"``, or compare's ``"mark:set:<run>"``: steps, the symbol's height, labels)."""
        if key.startswith("mark:"):
            kind = key.split(":", 1)[1]
            mine = [(mark[0], mark[2]) for mark in self.widget.marks if mark[1] == kind]
            y = self.widget.mark_styles[kind]["y"]
            return Drawn(np.array([s for s, _ in mine], dtype=float), np.full(len(mine), y),
                         tuple(label for _, label in mine))
        i = self.data._index.get(key)
        if i is None:
            raise KeyError(f"no trace for {key!r}; traces: {[t.key for t in self.data.traces]}")
        t, n = self.data.traces[i], self._held(i)
        return Drawn(t.x.view()[:n].copy(), t.y.view()[:n].copy())

    def _held(self, i: int) -> int:
        """How many of trace ``i``'s points the views hold: none once it was thinned since they got it."""
        halvings, sent = self._sent.get(i, (self.data.traces[i].halvings, 0))
        return sent if halvings == self.data.traces[i].halvings else 0

    def plotly(self) -> Any:
        """A plotly FigureWidget of the curves so far (zoom, hover, export); it does not update."""
        import plotly.graph_objects as go

        return self.data.build(go.FigureWidget())

    def close(self) -> None:
        self.throttle.cancel()
        self.widget.close()


def _style(t: Trace, k: int) -> dict[str, Any]:
    """How curves.js draws trace ``t``, the ``k``-th line of its panel. Reward functions have a panel of
    their own (a single one equals the mean: in one panel the two lines hid each other)."""
    style = {"key": t.key, "panel": t.panel, "kind": t.kind, "name": t.key, "color": PALETTE[k % len(PALETTE)],
             "width": 1, "dash": False, "smooth": t.kind == "line"}
    if t.kind in ("upper", "lower"):
        style.update(name="reward min..max", color="rgba(31,119,180,0.2)")
    elif t.key == "reward/mean":
        style.update(name="reward mean", width=2)
    elif t.key == "advantages/mean":
        style.update(name="mean advantage (Tinker steps)", dash=True)
    elif t.panel == REWARD_FUNCTIONS:
        style.update(name=t.key.removeprefix("reward/"), color=PALETTE[(k + 1) % len(PALETTE)])
    return style
