"""Snapshot: the dashboard as static HTML that stays current in the saved notebook: its curves as inline SVG.

A widget's view lives only in a page whose widget manager holds its model. A notebook saved, exported with
nbconvert or opened on GitHub shows, for a dashboard, only what the kernel sent as HTML: the widget's
``text/html`` is fixed when the output is displayed (step 0, "no metrics recorded yet"), and the widget
state nbconvert embeds is drawn by a renderer that loads from public CDNs, so offline nothing shows.

So the dashboard displays its snapshot as an output of its own, with a display id, and the kernel replaces it
(``update_display``) at the end of every cell that runs (IPython's ``post_run_cell`` event) while it changed,
and once more when the run has ended: the saved or exported notebook shows the run's state and the curves
as they were at the end of the cell that ran last, with no script and no network. Updating this output
never touches the live widget's output (an update of that one would re-create its views, losing zoom).
In a page where the live dashboard renders, the curves' stylesheet hides the snapshot (``curves.css``).

The curves are one SVG ``polyline`` per metric, a few KB per panel, made in well under a millisecond per
thousand points. plotly (already a dependency) draws only with its 3.5 MB script, and its static images
need kaleido and a browser; matplotlib is not a dependency and costs ~0.5 s to import in the kernel.
"""

from __future__ import annotations

import html
from collections.abc import Callable
from typing import Any

from forge_nb.widgets._shared.series import PANELS

WIDTH, HEIGHT, PAD = 300, 90, 4
MAX_POINTS = 600  #: per trace; longer series are thinned to every k-th point (the last one kept)
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c")


def curves_svg(store: Any) -> str:
    """One small SVG chart per dashboard panel that has values: its metrics' curves over the steps so far."""
    series: dict[str, tuple[list[int], list[float]]] = {key: ([], []) for p in PANELS for key in p.metrics}
    for row in store.rows:  # one pass: older rows may be read back from the run directory's file
        for key, (steps, values) in series.items():
            if key in row:
                steps.append(row["step"])
                values.append(row[key])
    charts = []
    for panel in PANELS:
        traces = [(key, *series[key]) for key in panel.metrics if series[key][0]]
        if traces:
            charts.append(_chart(panel.title, traces))
    if not charts:
        return ""
    return f"<div class='forge-static-curves' style='display:flex;flex-wrap:wrap;gap:6px'>{''.join(charts)}</div>"


def _chart(title: str, traces: list[tuple[str, list[int], list[float]]]) -> str:
    thinned = [(key, _thin(steps, values)) for key, steps, values in traces]
    finite = [p for _, kept in thinned for p in kept]
    if not finite:
        return ""
    x0, x1 = min(s for s, _ in finite), max(s for s, _ in finite)
    y0, y1 = min(v for _, v in finite), max(v for _, v in finite)
    sx = (WIDTH - 2 * PAD) / ((x1 - x0) or 1)
    sy = (HEIGHT - 2 * PAD) / ((y1 - y0) or 1)
    lines = []
    for i, (key, kept) in enumerate(thinned):
        points = " ".join(f"{PAD + (s - x0) * sx:.1f},{HEIGHT - PAD - (v - y0) * sy:.1f}" for s, v in kept)
        lines.append(f"<polyline data-key='{html.escape(key)}' data-points='{len(kept)}' points='{points}' "
                     f"fill='none' stroke='{COLORS[i % len(COLORS)]}' stroke-width='1.2'/>")
    label = f"{html.escape(title)}: steps {x0}-{x1}, {_num(y0)} to {_num(y1)}"
    return (f"<figure style='margin:0'><svg data-title='{html.escape(title)}' width='{WIDTH}' height='{HEIGHT}' "
            f"viewBox='0 0 {WIDTH} {HEIGHT}' style='border:1px solid #ddd' role='img' aria-label='{label}'>"
            f"{''.join(lines)}</svg><figcaption style='font-size:11px'>{label}</figcaption></figure>")


def _thin(steps: list[int], values: list[float]) -> list[tuple[int, float]]:
    """At most ~MAX_POINTS (step, value) pairs: every k-th one and the last, NaNs left out."""
    stride = max(1, -(-len(steps) // MAX_POINTS))
    picked = list(range(0, len(steps), stride))
    if picked[-1] != len(steps) - 1:
        picked.append(len(steps) - 1)
    return [(steps[j], values[j]) for j in picked if values[j] == values[j]]


def _num(value: float) -> str:
    return f"{value:.4g}"


class SnapshotOutput:
    """The snapshot output(s) of one view: shown with ``show()``, replaced at the end of each cell that ran.

    ``render()`` gives the HTML; ``final()`` says the run has ended (one last update, then it stops listening)."""

    def __init__(self, render: Callable[[], str], final: Callable[[], bool]):
        self._render = render
        self._final = final
        self._handles: list[Any] = []
        self._last = ""
        self._shell: Any = None

    def show(self) -> None:
        from IPython import get_ipython
        from IPython.display import HTML, display

        self._last = self._render()
        handle = display(HTML(self._last), display_id=True)
        if handle is not None:
            self._handles.append(handle)
        shell = get_ipython()
        if shell is not None and self._shell is None:
            self._shell = shell
            shell.events.register("post_run_cell", self.refresh)

    def refresh(self, *_: Any) -> None:
        """Replace every shown snapshot with the current one (when it changed)."""
        done = self._final()
        current = self._render()
        if current != self._last:
            from IPython.display import HTML

            self._last = current
            for handle in self._handles:
                handle.update(HTML(current))
        if done:
            self.close()

    def close(self) -> None:
        """Stop refreshing (the shown snapshots stay as they are)."""
        if self._shell is not None:
            try:
                self._shell.events.unregister("post_run_cell", self.refresh)
            except ValueError:  # already unregistered
                pass
            self._shell = None
