"""CurveData: the training curves as plain per-trace arrays, and the plotly figure that draws them.

One model serves every view (the canvas in curves.py, in the notebook dashboard and in the panel app,
and ``Curves.plotly()``): rows and events from the metrics store go in, the model appends to
per-trace columns and remembers which traces changed, and a view takes only those. Trace order in
the model is the trace order in a figure; traces for reward functions seen later go at the end.

Layout: reward on top (mean, a min/max band, and markers for hot changes and failures on a hidden 0..1
axis; a step taken through the Tinker API has no reward, and its Datums' mean advantage is drawn there), then
two columns of small panels, the last one a line per evaluation measure (from "eval" events, drawn at the step
that trained the evaluated version), the first one a line per reward function (in the reward panel a single
function's line lay on the mean's, which looked dashed). Every marked event
also draws a dotted vertical line across each panel at its step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

Row = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Panel:
    title: str
    metrics: tuple[str, ...]
    row: int
    col: int
    empty: str = "no values yet"  #: written across the panel while it has no point


PANELS: tuple[Panel, ...] = (
    Panel("reward", ("reward/mean", "advantages/mean"), 1, 1),  # the latter: steps taken through the Tinker API
    Panel("reward per function", (), 2, 1, "no values: the reward functions report no separate scores"),
    Panel("KL", ("kl",), 2, 2, "no values: the loss reports KL with a reference model (beta > 0)"),
    Panel("entropy", ("entropy",), 3, 1),
    Panel("loss", ("loss",), 3, 2),
    Panel("grad norm", ("grad_norm",), 4, 1),
    Panel("response length", ("response_len/mean",), 4, 2),
    Panel("policy age", ("policy_age/mean",), 5, 1),
    Panel("tokens/s", ("tokens_per_s/generate", "tokens_per_s/train"), 5, 2),
    Panel("step time (s)", ("time/step_s", "time/step"), 6, 1),
    Panel("turns per episode", ("turns/mean",), 6, 2, "no values: single-turn episodes (see forge_nb.envs)"),
    Panel("tool-call success", ("tools/success",), 7, 1, "no values: no tool was called"),
    Panel("mismatch KL (generator vs trainer)", ("mismatch/kl", "mismatch/kl_same_version"), 7, 2,
          "no values: the generator gives no logprobs, or the loss is not one of forge_nb's"),
    Panel("importance ratio p1 / p50 / p99", ("mismatch/ratio_p1", "mismatch/ratio_p50", "mismatch/ratio_p99"), 8, 1,
          "no values: the generator gives no logprobs, or the loss is not one of forge_nb's"),
    Panel("eval: avg@k, pass@k (by the step of the version)", (), 8, 2,
          "no values: no evaluation yet (run.evaluate, %forge_eval, loop.eval_every)"),
)
REWARD_FUNCTIONS = 1  #: the panel of the per-function reward lines ("reward/<function>")
EVALS = len(PANELS) - 1  #: the panel of the evaluations' lines ("eval/<measure>", from "eval" events)
BAND = ("reward/max", "reward/min")  # upper first: the lower trace fills "tonexty" up to it
REWARD_SUMMARIES = frozenset({"reward/mean", "reward/min", "reward/max", "reward/std"})
MARKS = {"set": ("hot change", "#7b1fa2", "triangle-down", 0.92), "failure": ("failure", "#d62728", "x", 0.80)}


class Column:
    """A float64 column that grows by doubling. ``view()`` is the filled part without a copy, and stays
    valid as the column grows (appends write past it; growing and halving move to a new buffer), so a
    flush hands numpy arrays to the figure instead of converting whole lists each time."""

    __slots__ = ("_buf", "_n")

    def __init__(self) -> None:
        self._buf = np.empty(64)
        self._n = 0

    def append(self, value: float) -> None:
        if self._n == len(self._buf):
            self._buf = np.concatenate([self._buf, np.empty(len(self._buf))])
        self._buf[self._n] = value
        self._n += 1

    def keep_every_other(self, start: int) -> None:
        kept = self._buf[start:self._n:2]
        self._n = len(kept)
        self._buf = np.concatenate([kept, np.empty(max(64, self._n))])

    def view(self) -> np.ndarray:
        return self._buf[:self._n]

    def __len__(self) -> int:
        return self._n


@dataclass(slots=True)
class Trace:
    key: str  #: metric name, or "mark:set" / "mark:failure"
    panel: int
    kind: str  #: "line", "upper", "lower" or "mark"
    x: Column = field(default_factory=Column)
    y: Column = field(default_factory=Column)
    text: list[str] = field(default_factory=list)
    halvings: int = 0  #: how often the points were thinned: a view holding older points must take all anew


def mark_of(event: Row) -> tuple[str, str] | None:
    """("set" | "failure", label) for an event worth marking on the step axis, else None."""
    kind = event.get("kind")
    if kind == "set":
        changes = event.get("changes") or {}
        return "set", "set " + ", ".join(f"{k}={v:g}" if isinstance(v, float) else f"{k}={v}"
                                         for k, v in changes.items())
    if kind == "replica" and event.get("new") in ("recovering", "failed"):
        where = f"{event.get('service')}[{event.get('replica')}]"
        return "failure", f"{where} {event.get('old')} -> {event.get('new')}: {event.get('reason', '')}"[:200]
    if kind == "state" and event.get("state") == "failed":
        return "failure", f"run failed: {event.get('error', '')}"[:200]
    return None


class CurveData:
    """Per-trace step/value lists fed by metrics rows and events; ``take()`` what changed.

    ``panels`` and ``_add_traces`` are the layout: the dashboard's by default; ``compare.RunsData``
    lays out several runs on the same model."""

    panels: tuple[Panel, ...] = PANELS

    def __init__(self, max_points: int = 5_000, max_marks: int = 40):
        self.max_points = max_points
        self.max_marks = max_marks
        self.traces: list[Trace] = []
        self._index: dict[str, int] = {}
        self.marks: list[tuple[float, str, str]] = []  #: (step, mark kind, label)
        self.dirty: set[int] = set()
        self.marks_dirty = False
        self.new_traces: list[int] = []
        self.row_times: list[float] = []  #: record times of rows not yet drawn
        self._add_traces()

    def _add_traces(self) -> None:
        for p, panel in enumerate(PANELS):
            if p == 0:
                self._add(BAND[0], p, "upper")
                self._add(BAND[1], p, "lower")
            for metric in panel.metrics:
                self._add(metric, p, "line")
            if p == 0:
                for mark in MARKS:
                    self._add(f"mark:{mark}", p, "mark")

    def mark_styles(self) -> dict[str, dict[str, Any]]:
        """How the page draws each mark kind: {kind: {name, color, symbol, y}}."""
        return {kind: {"name": name, "color": color, "symbol": symbol, "y": y}
                for kind, (name, color, symbol, y) in MARKS.items()}

    def _add(self, key: str, panel: int, kind: str) -> int:
        self._index[key] = len(self.traces)
        self.traces.append(Trace(key, panel, kind))
        return self._index[key]

    def add_row(self, row: Row) -> None:
        step = row.get("step", 0)
        for key, value in row.items():
            if key in ("step", "time"):
                continue
            i = self._index.get(key)
            if i is None:
                if not key.startswith("reward/") or key in REWARD_SUMMARIES:
                    continue
                i = self._add(key, REWARD_FUNCTIONS, "line")  # a reward function seen for the first time
                self.new_traces.append(i)
            self._append(i, step, value)
        if "time" in row:
            self.row_times.append(row["time"])

    def add_event(self, event: Row) -> None:
        if event.get("kind") == "eval":  # a line per measure, a point per evaluated version at the step that made it
            for key, value in event.items():
                if key.startswith("eval/") and isinstance(value, int | float):
                    i = self._index.get(key)
                    if i is None:
                        i = self._add(key, EVALS, "line")
                        self.new_traces.append(i)
                    self._append(i, event.get("step", 0), value)
            return
        mark = mark_of(event)
        if mark is None:
            return
        kind, label = mark
        step = event.get("step", 0)
        i = self._index[f"mark:{kind}"]
        self._append(i, step, MARKS[kind][3], label)
        self.marks = [*self.marks, (step, kind, label)][-self.max_marks:]
        self.marks_dirty = True

    def _append(self, i: int, step: float, value: Any, text: str | None = None) -> None:
        t = self.traces[i]
        t.x.append(step)
        t.y.append(float(value) if value is not None else math.nan)
        if text is not None:
            t.text.append(text)
        if len(t.x) > self.max_points:  # halve, keeping the newest point: long runs stay cheap to draw
            start = (len(t.x) - 1) % 2
            t.x.keep_every_other(start)
            t.y.keep_every_other(start)
            if t.text:
                t.text = t.text[start::2]
            t.halvings += 1
        self.dirty.add(i)

    def take(self) -> tuple[list[int], list[int], bool, list[float]]:
        """(new trace indices, changed trace indices, marks changed, record times) since the last take."""
        taken = (self.new_traces, sorted(self.dirty), self.marks_dirty, self.row_times)
        self.new_traces, self.dirty, self.marks_dirty, self.row_times = [], set(), False, []
        return taken

    def arrays(self, i: int) -> dict[str, Any]:
        t = self.traces[i]
        data: dict[str, Any] = {"x": t.x.view(), "y": t.y.view()}
        if t.kind == "mark":
            data["text"] = list(t.text)
        return data

    # -- the figure ------------------------------------------------------------------------------

    def build(self, figure: Any) -> Any:
        """Lay out the panels on ``figure`` (a go.Figure or go.FigureWidget) and add every trace."""
        from plotly.subplots import make_subplots

        specs: list[list[dict[str, Any] | None]] = [[{"colspan": 2, "secondary_y": True}, None]]
        specs += [[{}, {}] for _ in range(max(p.row for p in PANELS) - 1)]
        fig = make_subplots(rows=len(specs), cols=2, specs=specs, figure=figure,
                            subplot_titles=[p.title for p in PANELS], vertical_spacing=0.06,
                            horizontal_spacing=0.08, row_heights=[0.28] + [0.18] * (len(specs) - 1))
        for i in range(len(self.traces)):
            self.add_trace(fig, i)
        marks_axis = fig.get_subplot(1, 1, secondary_y=True).yaxis
        marks_axis.update(range=[0, 1], visible=False, fixedrange=True)
        fig.update_xaxes(matches="x")
        fig.update_layout(height=1130, margin=dict(l=50, r=20, t=70, b=30), uirevision="keep",
                          legend=dict(orientation="h", y=1.03, yanchor="bottom", x=0), hovermode="closest")
        fig.layout.shapes = self.shapes(fig)
        return fig

    def add_trace(self, fig: Any, i: int) -> None:
        t = self.traces[i]
        panel = PANELS[t.panel]
        style: dict[str, Any] = {"name": t.key, "mode": "lines", "showlegend": len(panel.metrics) != 1}
        if t.kind == "upper":
            style.update(line=dict(width=0), name="reward max", showlegend=False, hoverinfo="skip")
        elif t.kind == "lower":
            style.update(line=dict(width=0), name="reward min..max", fill="tonexty",
                         fillcolor="rgba(31,119,180,0.2)", hoverinfo="skip")
        elif t.kind == "mark":
            name, color, symbol, _ = MARKS[t.key.split(":", 1)[1]]
            style.update(name=name, mode="markers", hovertemplate="step %{x}<br>%{text}<extra></extra>",
                         marker=dict(color=color, symbol=symbol, size=10))
        elif t.key == "reward/mean":
            style.update(line=dict(color="#1f77b4", width=3), name="reward mean")
        elif t.key == "advantages/mean":  # Tinker's Datums carry advantages, not rewards
            style.update(line=dict(color="#ff7f0e", width=2, dash="dash"), name="mean advantage (Tinker steps)")
        fig.add_scatter(**style, **self.arrays(i), row=panel.row, col=panel.col,
                        secondary_y=t.kind == "mark")

    def shapes(self, fig: Any) -> list[dict[str, Any]]:
        """A dotted vertical line per marked event, in every panel."""
        shapes = []
        for p in PANELS:
            sub = fig.get_subplot(p.row, p.col)
            xref = sub.xaxis.plotly_name.replace("axis", "")
            yref = sub.yaxis.plotly_name.replace("axis", "") + " domain"
            for step, kind, _ in self.marks:
                shapes.append(dict(type="line", xref=xref, yref=yref, x0=step, x1=step, y0=0, y1=1,
                                   line=dict(color=MARKS[kind][1], width=1, dash="dot"), layer="below"))
        return shapes

    def last_values(self) -> dict[str, tuple[float, float]]:
        """metric -> (step, last value), for the plain HTML view."""
        return {t.key: (float(t.x.view()[-1]), float(t.y.view()[-1])) for t in self.traces
                if t.kind != "mark" and len(t.x)}

