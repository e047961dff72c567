"""compare(): several runs on the same curves, over real MetricsStores with known rows; widget state asserted.

A "run" here is a small object with ``.name`` and ``.metrics`` (all the widget reads); the points are
checked where the canvas gets them: the decoded messages sent to the page, and ``curves.trace``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pytest

from forge_nb.metrics import MetricsStore
from forge_nb.widgets.compare import Compare, compare
from tests.waiting import waiter

pytestmark = pytest.mark.timeout(120)

_until = waiter(timeout=5.0, interval=0.02)


@dataclass
class RunLike:
    name: str
    metrics: MetricsStore = field(default_factory=MetricsStore)
    state: str = "running"


def _record(run: RunLike, s: int, scale: float) -> None:
    """One step's row whose values are functions of the step and of the run (its ``scale``)."""
    run.metrics.record(s, {"reward/mean": scale * 0.1 * s, "loss": scale / s, "kl": scale * 0.01 * s,
                           "entropy": 2.0 - scale * 0.01 * s, "grad_norm": 1.0})


def _sent_sync(cmp: Compare) -> dict[str, tuple[list[float], list[float]]]:
    """Ask for everything as a view that just opened does, and decode that message: trace key -> (x, y).
    (Outside a kernel the widget's comm is a DummyComm; publish_msg is where a kernel hands it to ZMQ.)"""
    got: dict[str, tuple[list[float], list[float]]] = {}
    keys = [t["key"] for t in cmp.curves.widget.traces]

    def publish(msg_type: str, data: dict | None = None, buffers: list | None = None, **_: object) -> None:
        content = (data or {}).get("content") or {}
        if msg_type != "comm_msg" or content.get("type") != "points":
            return
        assert content["sync"]
        values, at = np.frombuffer(buffers[0], dtype=np.float64), 0
        for i, start, count in content["traces"]:
            assert start == 0
            got[keys[i]] = (list(values[at:at + count]), list(values[at + count:at + 2 * count]))
            at += 2 * count

    cmp.curves.widget.comm.publish_msg = publish
    cmp.curves.widget._handle_custom_msg({"type": "sync"}, [])
    return got


def test_each_run_gets_a_line_per_metric_holding_exactly_its_values_and_keeps_its_colour() -> None:
    a, b = RunLike("lr-1e-5"), RunLike("lr-3e-5", state="shut down")  # a shut-down run keeps its history
    for s in range(1, 6):
        _record(a, s, 1.0)
    for s in range(1, 4):
        _record(b, s, 2.0)
    cmp = compare(a, b, metrics=("reward/mean", "loss", "kl"))
    try:
        sent = _sent_sync(cmp)
        assert set(sent) == {f"{r}/{m}" for r in ("lr-1e-5", "lr-3e-5") for m in ("reward/mean", "loss", "kl")}
        assert sent["lr-1e-5/loss"] == ([1, 2, 3, 4, 5], pytest.approx([1 / s for s in range(1, 6)]))
        assert sent["lr-3e-5/loss"] == ([1, 2, 3], pytest.approx([2 / s for s in range(1, 4)]))
        assert sent["lr-3e-5/reward/mean"][1] == pytest.approx([0.2, 0.4, 0.6])
        assert list(cmp.curves.trace("lr-1e-5/kl").y) == pytest.approx([0.01 * s for s in range(1, 6)])
        assert not any(k.endswith("grad_norm") for k in sent)  # only the chosen metrics

        panels = cmp.curves.widget.panels
        assert [p["title"] for p in panels] == ["reward/mean", "loss", "kl"]
        lines = [t for t in cmp.curves.widget.traces if t["kind"] == "line"]
        for t in lines:  # the legend names the run; its panel is its metric's
            run, metric = t["key"].split("/", 1)
            assert t["name"] == run and panels[t["panel"]]["title"] == metric
        colors = {run: {t["color"] for t in lines if t["name"] == run} for run in ("lr-1e-5", "lr-3e-5")}
        assert all(len(c) == 1 for c in colors.values())  # one colour per run, in every panel
        assert colors["lr-1e-5"] != colors["lr-3e-5"]

        page = cmp.to_html()  # what a viewer without widgets shows
        assert "shut down" in page and "lr-3e-5" in page and "(step 3)" in page
    finally:
        cmp.close()


async def test_rows_recorded_after_opening_arrive_live_on_their_own_run_only() -> None:
    a, b = RunLike("sync"), RunLike("async")
    _record(a, 1, 1.0)
    cmp = compare(a, b, metrics=("loss", "entropy"), update_interval=0.05)
    try:
        assert list(cmp.curves.trace("sync/loss").x) == [1] and not len(cmp.curves.trace("async/loss").x)
        for s in range(2, 6):
            _record(a, s, 1.0)
        for s in range(1, 4):
            _record(b, s, 3.0)
        assert await _until(lambda: len(cmp.curves.trace("sync/loss").x) == 5
                            and len(cmp.curves.trace("async/loss").x) == 3)
        assert list(cmp.curves.trace("async/loss").y) == pytest.approx([3.0, 1.5, 1.0])
        assert list(cmp.curves.trace("sync/entropy").y) == pytest.approx([2.0 - 0.01 * s for s in range(1, 6)])
        assert cmp.curves.messages >= 2 and cmp.curves.lags_ms and not cmp.errors.messages
    finally:
        cmp.close()


async def test_a_run_added_later_brings_its_history_and_then_grows() -> None:
    a, late = RunLike("baseline"), RunLike("candidate")
    for s in range(1, 4):
        _record(a, s, 1.0)
        _record(late, s, 2.0)
    cmp = compare(a, metrics=("loss",), update_interval=0.05)
    try:
        with pytest.raises(KeyError):
            cmp.curves.trace("candidate/loss")
        cmp.add(late)
        assert list(cmp.curves.trace("candidate/loss").y) == pytest.approx([2.0, 1.0, 2 / 3])
        assert _sent_sync(cmp)["candidate/loss"][0] == [1, 2, 3]
        _record(late, 4, 2.0)
        assert await _until(lambda: len(cmp.curves.trace("candidate/loss").x) == 4)
        assert list(cmp.curves.trace("baseline/loss").x) == [1, 2, 3]
        styles = {t["key"]: t["color"] for t in cmp.curves.widget.traces}
        assert styles["candidate/loss"] != styles["baseline/loss"]
        assert "candidate" in cmp.title.value and "baseline" in cmp.title.value
    finally:
        cmp.close()


async def test_stop_and_close_unsubscribe_and_start_catches_up() -> None:
    a = RunLike("a")
    _record(a, 1, 1.0)
    cmp = compare(a, metrics=("loss",), update_interval=0.05)
    assert len(a.metrics._observers) == 1 and cmp.listening
    cmp.stop()
    assert a.metrics._observers == [] and not cmp.listening
    _record(a, 2, 1.0)
    await _until(lambda: False, timeout=0.2)
    assert list(cmp.curves.trace("a/loss").x) == [1]  # not drawn while stopped
    cmp.start()
    assert list(cmp.curves.trace("a/loss").x) == [1, 2]  # what was recorded meanwhile, once
    cmp.close()
    assert a.metrics._observers == [] and not cmp.listening
    _record(a, 3, 1.0)
    assert list(cmp.curves.trace("a/loss").x) == [1, 2] and not a.metrics.observer_errors


def test_hot_changes_and_failures_are_marked_in_their_runs_colour() -> None:
    a, b = RunLike("a"), RunLike("b")
    for s in range(1, 4):
        _record(a, s, 1.0)
        _record(b, s, 1.0)
    a.metrics.event("set", step=2, changes={"lr": 1e-5})
    b.metrics.event("replica", step=3, service="generator", replica=0, old="healthy", new="failed",
                    reason="process died")
    cmp = compare(a, b)
    try:
        sets = cmp.curves.trace("mark:set:a")
        assert list(sets.x) == [2] and sets.text == ("a: set lr=1e-05",)
        assert not len(cmp.curves.trace("mark:set:b").x)
        assert list(cmp.curves.trace("mark:failure:b").x) == [3]
        colour = {t["name"]: t["color"] for t in cmp.curves.widget.traces if t["kind"] == "line"}
        styles = cmp.curves.widget.mark_styles
        assert styles["set:a"]["color"] == colour["a"] and styles["failure:b"]["color"] == colour["b"]
        figure = cmp.curves.plotly()  # the same curves in plotly: a legend entry per run
        assert [t.name for t in figure.data if t.showlegend] == ["a", "b"]
        assert {(s.x0, s.line.color) for s in figure.layout.shapes} == {(2, colour["a"]), (3, colour["b"])}
    finally:
        cmp.close()


def test_nonsense_is_refused_and_an_unknown_metric_says_nothing_was_recorded() -> None:
    a = RunLike("a")
    _record(a, 1, 1.0)
    with pytest.raises(TypeError, match="not a run"):
        compare(a, object())
    with pytest.raises(TypeError, match="non-empty string name"):
        compare(RunLike(""))
    with pytest.raises(ValueError, match="two runs are named 'a'"):
        compare(a, RunLike("a"))
    with pytest.raises(TypeError, match="metric names as strings"):
        compare(a, metrics=())
    with pytest.raises(ValueError, match="named twice"):
        compare(a, metrics=("loss", "loss"))
    assert a.metrics._observers == []  # a refused call subscribed to nothing

    cmp = compare(a, metrics=("loss", "reward/typo"))
    try:
        with pytest.raises(ValueError, match="two runs are named 'a'"):
            cmp.add(RunLike("b"), RunLike("a"))
        assert list(cmp.runs) == ["a"]  # nothing added from a refused call
        empty = cmp.curves.widget.panels[1]
        assert empty["title"] == "reward/typo" and "nothing recorded yet" in empty["empty"]
        assert not len(cmp.curves.trace("a/reward/typo").x) and len(cmp.curves.trace("a/loss").x) == 1
        assert "nothing recorded yet" in cmp.to_html()
    finally:
        cmp.close()
