"""The curves over a real MetricsStore, and the throttle under them: values known, widget state asserted.

The dashboard as a whole (history, controls, health, explorer, HTML view) runs over a real Run in
test_dashboard_run.py; here rows of known values go straight into a MetricsStore, as the Run's loops
record them, so every drawn number can be checked.
"""

from __future__ import annotations

import asyncio
import time

import numpy as np
import pytest

from forge_nb.metrics import MetricsStore
from forge_nb.widgets import Dashboard
from forge_nb.widgets._shared.series import PANELS
from forge_nb.widgets._shared.throttle import Throttle
from forge_nb.widgets.curves import Curves
from tests.waiting import waiter

pytestmark = pytest.mark.timeout(120)


_until = waiter(timeout=5.0, interval=0.02)


def _record(store: MetricsStore, s: int) -> None:
    """One training step's row, with values that are functions of the step."""
    store.record(s, {
        "reward/mean": 0.1 * s, "reward/min": 0.1 * s - 0.5, "reward/max": 0.1 * s + 0.5,
        "reward/format": 0.05 * s, "reward/correct": 0.02 * s, "loss": 1.0 / s, "kl": 0.01 * s,
        "entropy": 2.0 - 0.01 * s, "grad_norm": 1.5, "response_len/mean": 20.0 + s, "policy_age/mean": 0.5,
        "tokens_per_s/generate": 1000.0, "tokens_per_s/train": 800.0, "time/step_s": 0.3})


def _curves(update_interval: float = 0.25) -> tuple[MetricsStore, Curves, list[BaseException]]:
    store, errors = MetricsStore(), []
    curves = Curves(update_interval, asyncio.get_running_loop(), errors.append)
    store.subscribe(curves.observe)
    return store, curves, errors


async def test_every_curve_draws_its_metric_and_reward_functions_get_a_line_each() -> None:
    store, curves, errors = _curves()
    try:
        for s in range(1, 9):
            _record(store, s)
        assert await _until(lambda: len(curves.trace("reward/mean").x) == 8)
        assert list(curves.trace("kl").y) == pytest.approx([0.01 * s for s in range(1, 9)])
        for key in ("entropy", "loss", "grad_norm", "response_len/mean", "policy_age/mean",
                    "tokens_per_s/generate", "tokens_per_s/train", "time/step_s"):
            assert len(curves.trace(key).x) == 8, key
        assert list(curves.trace("reward/format").y)[-1] == pytest.approx(0.4)  # added when first seen
        assert len(curves.trace("reward/correct").x) == 8
        assert curves.lags_ms and max(curves.lags_ms) < 1000 and not errors
    finally:
        curves.close()


async def test_a_burst_of_rows_is_drawn_in_few_batched_updates() -> None:
    store, curves, _ = _curves(update_interval=0.25)
    try:
        before = curves.throttle.flushes
        t0 = time.monotonic()
        for s in range(1, 201):
            _record(store, s)
        assert len(curves.trace("reward/mean").x) < 200  # nothing drawn synchronously per row
        assert await _until(lambda: len(curves.trace("reward/mean").x) == 200)
        flushes = curves.throttle.flushes - before
        elapsed = time.monotonic() - t0
        assert flushes <= 2 + elapsed / 0.25, (flushes, elapsed)
        # a trickle slower than the interval is drawn at once (leading edge), not 250 ms late
        await asyncio.sleep(0.3)
        t = time.monotonic()
        _record(store, 201)
        assert await _until(lambda: len(curves.trace("reward/mean").x) == 201)
        assert time.monotonic() - t < 0.2
    finally:
        curves.close()


def _sent(curves: Curves) -> list[dict[int, tuple[int, list[float], list[float]]]]:
    """Every points message the views are sent, decoded: trace -> (start, x, y). (Outside a kernel the
    widget's comm is a DummyComm; its publish_msg is where a kernel would hand the message to ZMQ.)"""
    messages: list[dict[int, tuple[int, list[float], list[float]]]] = []

    def publish(msg_type: str, data: dict | None = None, buffers: list | None = None, **_: object) -> None:
        content = (data or {}).get("content")
        if msg_type != "comm_msg" or (data or {}).get("method") != "custom" or content["type"] != "points":
            return
        values, at, decoded = np.frombuffer(buffers[0], dtype=np.float64), 0, {}
        for i, start, count in content["traces"]:
            decoded[i] = (start, list(values[at:at + count]), list(values[at + count:at + 2 * count]))
            at += 2 * count
        decoded["sync"] = content["sync"]
        messages.append(decoded)

    curves.widget.comm.publish_msg = publish
    return messages


def test_a_flush_is_one_message_with_only_the_new_points_and_a_sync_sends_them_all() -> None:
    curves = Curves(interval=60)  # no event loop here: a poke inside the interval waits for flush()
    sent = _sent(curves)
    loss, kl = curves.data._index["loss"], curves.data._index["kl"]
    try:
        for s in range(1, 4):
            curves.observe("step", {"step": s, "time": time.time(), "loss": 1.0 / s, "kl": 0.1 * s})
            curves.flush()
        assert len(sent) == 3  # one message per flush
        assert sent[2] == {loss: (2, [3.0], [pytest.approx(1 / 3)]), kl: (2, [3.0], [pytest.approx(0.3)]),
                           "sync": False}  # the point each changed trace gained, and no other trace
        assert list(curves.trace("loss").y) == pytest.approx([1.0, 0.5, 1 / 3])  # what the views hold
        assert list(curves.trace("kl").x) == [1, 2, 3]
        curves.observe("step", {"step": 4, "loss": 0.25})
        assert len(curves.trace("loss").x) == 3  # recorded, not yet sent

        curves.widget._handle_custom_msg({"type": "sync"}, [])  # what a view that opened late asks
        assert sent[3] == {loss: (0, [1.0, 2.0, 3.0, 4.0], pytest.approx([1.0, 0.5, 1 / 3, 0.25])),
                           kl: (0, [1.0, 2.0, 3.0], pytest.approx([0.1, 0.2, 0.3])), "sync": True}
        curves.flush()
        assert len(sent) == 4  # the sync carried the pending point: nothing left to send
    finally:
        curves.close()


def test_a_thinned_trace_is_sent_whole_and_the_views_hold_what_the_kernel_holds() -> None:
    curves = Curves(interval=0, max_points=8)
    sent = _sent(curves)
    loss = curves.data._index["loss"]
    try:
        held: list[float] = []  # what a view holds, replaying the messages as curves.js does
        for s in range(1, 40):
            curves.observe("step", {"step": s, "loss": 1.0 / s})
            curves.flush()
            start, x, _ = sent[-1][loss]
            assert start in (0, len(held)), (s, start, len(held))  # appends at the end, or replaces
            held = held[:start] + x
        assert any(m[loss][0] == 0 for m in sent[1:])  # thinned at least once, and then sent whole
        assert held == list(curves.data.traces[loss].x.view()) == list(curves.trace("loss").x)
        assert len(held) <= 8 and held[-1] == 39
    finally:
        curves.close()


def test_throttle_coalesces_pokes_and_reports_flush_errors() -> None:
    calls: list[int] = []
    errors: list[BaseException] = []

    async def main() -> None:
        throttle = Throttle(lambda: calls.append(1), interval=0.2)
        for _ in range(100):
            throttle.poke()
        await asyncio.sleep(0.05)
        assert len(calls) == 1
        for _ in range(100):
            throttle.poke()
        await asyncio.sleep(0.05)
        assert len(calls) == 1  # the second burst waits for the interval
        await asyncio.sleep(0.25)
        assert len(calls) == 2
        failing = Throttle(lambda: 1 / 0, interval=0.0, on_error=errors.append)
        failing.poke()
        await asyncio.sleep(0.01)

    asyncio.run(main())
    assert isinstance(errors[0], ZeroDivisionError)
    with pytest.raises(ValueError, match="interval"):
        Throttle(lambda: None, interval=-1)


async def test_band_and_markers_for_hot_changes_and_failures() -> None:
    store, curves, _ = _curves()
    try:
        for s in range(1, 5):
            _record(store, s)
        store.event("set", step=4, changes={"lr": 3e-6})  # what run.set() records when it is applied
        _record(store, 5)
        store.event("replica", step=5, service="generator", replica=1, old="healthy", new="recovering",
                    reason="process died")
        store.event("replica", step=5, service="generator", replica=1, old="recovering", new="healthy",
                    reason="ready")  # a recovery is not a failure: no marker
        assert await _until(lambda: len(curves.trace("mark:failure").x) == 1)
        styles = {t["key"]: t for t in curves.widget.traces}
        assert styles["reward/max"]["kind"] == "upper" and styles["reward/min"]["kind"] == "lower"
        assert styles["reward/mean"]["width"] > styles["loss"]["width"]
        # reward functions get their own panel and colours: a single one equals the mean and hid it
        titles = [p["title"] for p in curves.widget.panels]
        functions = [styles["reward/format"], styles["reward/correct"]]
        assert {titles[f["panel"]] for f in functions} == {"reward per function"}
        assert titles[styles["reward/mean"]["panel"]] == "reward"
        colours = {f["color"] for f in functions}
        assert len(colours) == 2 and styles["reward/mean"]["color"] not in colours
        assert [f["name"] for f in functions] == ["format", "correct"]
        assert all(s["smooth"] for s in styles.values() if s["kind"] == "line")
        assert not any(s["smooth"] for s in styles.values() if s["kind"] != "line")
        assert list(curves.trace("reward/max").y)[-1] == pytest.approx(1.0)
        assert list(curves.trace("reward/min").y)[-1] == pytest.approx(0.0)
        sets = curves.trace("mark:set")
        assert list(sets.x) == [4] and "lr=3e-06" in sets.text[0]
        failure = curves.trace("mark:failure")
        assert list(failure.x) == [5] and "generator[1] healthy -> recovering" in failure.text[0]

        figure = curves.plotly()  # the same curves in plotly, to zoom and export
        names = [t.name for t in figure.data]
        upper, lower = figure.data[names.index("reward max")], figure.data[names.index("reward min..max")]
        assert lower.fill == "tonexty" and figure.data.index(upper) + 1 == figure.data.index(lower)
        assert list(figure.data[names.index("reward mean")].x) == [1, 2, 3, 4, 5]
        lines = {(s.x0, s.line.color) for s in figure.layout.shapes}
        assert (4, "#7b1fa2") in lines and (5, "#d62728") in lines
        assert len(figure.layout.shapes) == 2 * len(PANELS)  # a line per marked event in each panel
    finally:
        curves.close()


def test_a_run_without_metrics_is_refused_with_a_clear_message() -> None:
    with pytest.raises(TypeError, match="no .metrics store"):
        Dashboard(object())


def test_long_runs_are_halved_and_arrays_already_drawn_never_change() -> None:
    from forge_nb.widgets._shared.series import CurveData

    data = CurveData(max_points=10)
    drawn = []
    for s in range(1, 200):
        data.add_row({"step": s, "loss": 1.0 / s})
        drawn.append((s, data.arrays(data._index["loss"])["x"]))  # what a flush would hand the figure
    x = list(data.arrays(data._index["loss"])["x"])
    assert len(x) <= 10 and x[-1] == 199 and x == sorted(x)  # bounded, newest kept, in order
    assert data.last_values()["loss"] == (199.0, pytest.approx(1 / 199))
    for s, arr in drawn:  # appends and halvings later never wrote into a handed-out array
        assert arr[-1] == s and list(arr) == sorted(arr)


def test_the_page_half_is_the_vendored_uplot_and_curves_js_in_one_module_in_both_hosts() -> None:
    from forge_nb.widgets.curves import VENDOR, CurvesView, page_module, panel_curves_view

    esm, css = page_module()
    assert esm.startswith("/*! https://github.com/leeoniya/uPlot (v1.6.32) */") and "var uPlot=" in esm
    assert esm.rstrip().endswith("export default { render };")  # curves.js after uPlot, one module
    assert ".u-legend" in css and ".forge-curves-toolbar" in css
    assert "MIT" in (VENDOR / "uPlot.LICENSE").read_text()
    view = CurvesView()
    try:
        assert view._esm == esm and view._css == css and view.smoothing == pytest.approx(0.6)
        view.smoothing = 0.9  # what the page's slider does
        with pytest.raises(Exception, match="smoothing"):
            view.smoothing = 1.0  # an EMA weight of 1 would never move
    finally:
        view.close()
    panel_view = panel_curves_view()
    assert panel_view._esm == esm and panel_view._stylesheets == [css]
    assert panel_view(height=300).smoothing == pytest.approx(0.6)
