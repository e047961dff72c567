"""SidePlacement: a dashboard docked beside the notebook where the front-end can, and in the cell where it cannot.

``%forge_dashboard --side`` asks sidecar for a panel beside the notebook. Only JupyterLab's shell can dock one:
Notebook 7 (its shell has no side area for it: sidecar's view throws), VS Code and nbclassic render the cell's
widgets but never the panel, and say nothing back. The signal used here is the side view's own render result,
read in the page itself: a tiny ``beacon`` view inside the panel marks its model once its element is in the
page (sidecar renders the panel's contents before docking it; where docking throws, as in Notebook 7, they
stay detached, so "rendered" alone would lie), and the cell's ``note`` view (the same page, the same widget
manager) waits a bounded time for that mark. If it comes, the note says the dashboard is beside the notebook;
if not, the note puts the dashboard into a box in the cell (``holder.children``, set in the page and synced
back) and says why in one line. A late mark moves it back beside the notebook. The note's text is what the
page shows at that moment, never a promise.

Why in the page and not in the kernel: while a cell runs ipykernel reads no comm message from the front-end
(they wait on the shell channel behind the cells queued by Run All), so a kernel waiting for the render
report would decide on a timeout while the report sits in the queue. And the front-end's name would be a
guess about the panel (a JupyterLab with sidecar's extension missing fails the same way); the render is not.
Without a front-end (nbclient, a saved notebook) no view runs; the cell keeps the note's static line and
the dashboard's snapshot.
"""

from __future__ import annotations

import html
from typing import Any

import anywidget
import ipywidgets as w
import traitlets as t

WAIT_MS = 4000  #: how long the note waits for the side view before it shows the dashboard in the cell

_BEACON = """
export default {
  render({ model, el }) {
    el.style.display = "none";
    // page-side only (never saved): the panel holding this view is in the page, docked
    const docked = () => el.isConnected && (model.set("rendered", true), true);
    if (docked()) return;
    const started = Date.now(), timer = setInterval(() => {
      if (docked() || Date.now() - started > 60000) clearInterval(timer);
    }, 100);
    return () => clearInterval(timer);
  },
};
"""

_NOTE = """
const id = ref => ref.slice("IPY_MODEL_".length);
export default {
  async render({ model, el }) {
    el.className = "forge-side-note";
    el.style.cssText = "font-size:13px;color:var(--jp-ui-font-color1, inherit);padding:2px 0";
    const run = model.get("run_name"), tab = model.get("tab"), wait = model.get("wait_ms");
    const say = (where, text) => {
      el.dataset.where = where;
      el.textContent = text;
      if (where !== "waiting" && model.get("where") !== where) { model.set("where", where); model.save_changes(); }
    };
    let beacon, holder, board;
    try {
      const wm = model.widget_manager;
      [beacon, holder, board] = await Promise.all(
        ["beacon", "holder", "board"].map(key => wm.get_model(id(model.get(key)))));
    } catch (e) {
      say("error", `the dashboard of run '${run}' cannot be placed: ${e}; %forge_dashboard shows it in the cell`);
      return;
    }
    const place = (children) => {
      if (holder.get("children").length === children.length) return;
      holder.set("children", children);
      holder.save_changes();
    };
    const beside = () => {
      place([]);
      say("side", `the dashboard of run '${run}' is beside the notebook (tab '${tab}'; drag its tab to move it); `
                  + "%forge_dashboard without --side shows it in the cell");
    };
    const here = () => {
      place([board]);
      say("cell", `no side panel in this front-end (the panel's view did not render within ${wait / 1000} s; ` +
                  `only JupyterLab docks one), so the dashboard of run '${run}' is here in the cell`);
    };
    beacon.on("change:rendered", () => beacon.get("rendered") && beside());
    if (beacon.get("rendered")) { beside(); return; }
    say("waiting", `opening the dashboard of run '${run}' beside the notebook (tab '${tab}')...`);
    setTimeout(() => beacon.get("rendered") || here(), wait);
  },
};
"""


class _Beacon(anywidget.AnyWidget):
    _esm = _BEACON


class _Note(anywidget.AnyWidget):
    _esm = _NOTE
    run_name = t.Unicode().tag(sync=True)
    tab = t.Unicode().tag(sync=True)
    wait_ms = t.Int(WAIT_MS).tag(sync=True)
    beacon = t.Instance(_Beacon).tag(sync=True, **w.widget_serialization)
    holder = t.Instance(w.Box).tag(sync=True, **w.widget_serialization)
    board = t.Instance(w.Widget).tag(sync=True, **w.widget_serialization)
    where = t.Unicode("").tag(sync=True)  #: "side" or "cell", as the page reported it (after the cell's queue)


class SidePlacement:
    """``side``: what goes into the side panel; display the object itself in the cell (note and holder)."""

    def __init__(self, board: w.Widget, run_name: str, tab: str, wait_ms: int = WAIT_MS):
        self.beacon = _Beacon()
        self.holder = w.Box(layout=w.Layout(width="100%"))
        self.note = _Note(run_name=run_name, tab=tab, wait_ms=wait_ms, beacon=self.beacon, holder=self.holder,
                          board=board)
        self.side = w.VBox([self.beacon, board])
        self.widget = w.VBox([self.note, self.holder])

    @property
    def where(self) -> str:
        """Where the page showed the dashboard ("side", "cell"), once its report reached the kernel; else ""."""
        return self.note.where

    def _ipython_display_(self) -> None:
        from IPython.display import display

        bundle = self.widget._repr_mimebundle_()
        line = (f"the dashboard of run {self.note.run_name!r}: beside the notebook in JupyterLab (tab "
                f"'{self.note.tab}'), in the cell in a front-end with no side panel; its snapshot follows")
        bundle["text/plain"] = line
        bundle["text/html"] = f"<div class='forge-side-note'>{html.escape(line)}</div>"
        display(bundle, raw=True)

    def close(self) -> None:
        for widget in (self.widget, self.note, self.beacon, self.holder, self.side):
            widget.close()


def place_beside(panel: Any, board: w.Widget, run_name: str, tab: str, wait_ms: int = WAIT_MS) -> SidePlacement:
    """Put ``board`` (with its beacon) into the sidecar ``panel``; display the returned object in the cell."""
    placement = SidePlacement(board, run_name, tab, wait_ms)
    # Set as the panel's outputs, not captured with `with panel: display(...)`: nothing depends on the
    # front end routing this cell's messages, and a headless run (nbclient) sees no output at all.
    panel.append_display_data(placement.side)
    return placement
