"""The dashboard's static snapshot (curves as SVG) and how it stays current in a real IPython shell's outputs,
and the side placement's widgets as the kernel sends them (the page side is checked in a browser by
tests/notebooks/test_notebook7.py and test_open_in_jupyterlab.py)."""

from __future__ import annotations

import re

import ipywidgets as w
import pytest
from IPython.core.interactiveshell import InteractiveShell

from forge_nb.metrics import MetricsStore
from forge_nb.widgets.placement import SidePlacement
from forge_nb.widgets.snapshot import MAX_POINTS, SnapshotOutput, curves_svg

pytestmark = pytest.mark.timeout(60)


def _store(steps: int) -> MetricsStore:
    store = MetricsStore()
    for s in range(1, steps + 1):
        store.record(s, {"reward/mean": 0.01 * s, "loss": 1.0 / s})
    return store


def _points(svg: str, key: str) -> int:
    (n,) = re.findall(rf"data-key='{re.escape(key)}' data-points='(\d+)'", svg)
    return int(n)


def test_the_curves_are_one_polyline_per_metric_thinned_past_a_bound() -> None:
    assert curves_svg(MetricsStore()) == ""
    svg = curves_svg(_store(275))
    assert "data-title='reward'" in svg and "data-title='loss'" in svg and "data-title='KL'" not in svg
    assert _points(svg, "reward/mean") == 275 and "steps 1-275, 0.01 to 2.75" in svg
    long = curves_svg(_store(5000))
    assert MAX_POINTS / 2 <= _points(long, "reward/mean") <= MAX_POINTS + 1 and len(long) < 60_000


def test_the_snapshot_output_is_replaced_at_each_cell_end_until_the_run_ends() -> None:
    shell = InteractiveShell.instance()
    store, ended, updates = _store(3), [False], []
    snapshot = SnapshotOutput(lambda: curves_svg(store), lambda: ended[0])
    published = shell.display_pub.publish

    def publish(data, metadata=None, *args, **kwargs):  # what a kernel sends: display_data / update_display_data
        updates.append((kwargs.get("update", False), data.get("text/html", "")))

    shell.display_pub.publish = publish
    try:
        snapshot.show()
        assert updates == [(False, curves_svg(_store(3)))]
        shell.run_cell("1")  # nothing recorded: nothing sent
        assert len(updates) == 1
        store.record(4, {"reward/mean": 0.04})
        shell.run_cell("1")
        assert updates[-1][0] and _points(updates[-1][1], "reward/mean") == 4
        ended[0] = True
        store.record(5, {"reward/mean": 0.05})
        shell.run_cell("1")  # the run's end: one last update, then no more
        store.record(6, {"reward/mean": 0.06})
        shell.run_cell("1")
        assert len(updates) == 3 and _points(updates[-1][1], "reward/mean") == 5
    finally:
        shell.display_pub.publish = published
        snapshot.close()


def test_the_side_placement_sends_the_page_what_it_needs_and_says_where_in_text() -> None:
    board = w.HTML("board")
    placement = SidePlacement(board, "quickstart", "dashboard: quickstart")
    try:
        state = placement.note.get_state()
        for key, widget in (("beacon", placement.beacon), ("holder", placement.holder), ("board", board)):
            assert state[key] == f"IPY_MODEL_{widget.model_id}", key
        assert placement.side.children == (placement.beacon, board)  # the panel's outputs
        assert placement.holder.children == ()  # the page fills it when the panel does not render
        assert placement.where == ""
        placement.note.set_state({"where": "cell"})  # the page's report, once it reaches the kernel
        assert placement.where == "cell"
    finally:
        placement.close()
