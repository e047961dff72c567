"""The curves over a real MetricsStore, and the throttle under them: values known, widget state asserted.

The dashboard as a whole (history, controls, health, explorer, HTML view) runs over a real Run in
test_dashboard_run.py; here rows of known values go straight into a MetricsStore, as the Run's loops
record them, so every drawn number can be checked.
"""

from __future__ import annotations

import asyncio
import time

import pytest

from forge_nb.metrics import MetricsStore
from forge_nb.widgets import Dashboard
from forge_nb.widgets._throttle import Throttle
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


def test_a_flush_is_one_comm_message_with_the_new_arrays_and_a_new_edit_id() -> None:
    """What the views get: one restyle message per flush (plotly_restyle sent four), carrying the changed
    traces' whole arrays and the edit id the figure will accept the views' replies for."""
    curves = Curves(interval=0)
    sent: list[dict] = []
    curves.figure.comm.publish_msg = lambda msg_type, data=None, **kw: sent.append(data)  # a DummyComm here
    try:
        for s in range(1, 4):
            curves.observe("step", {"step": s, "time": time.time(), "loss": 1.0 / s, "kl": 0.1 * s})
            curves.flush()
        assert len(sent) == 3, [m["state"].keys() for m in sent]
        states = [m["state"] for m in sent]
        ids = [st["_last_trace_edit_id"] for st in states]
        assert ids == list(range(ids[0], ids[0] + 3))  # a new id each time: always a change, no reset
        last = states[-1]["_py2js_restyle"]
        assert last["trace_edit_id"] == curves.figure._last_trace_edit_id
        assert last["layout_edit_id"] == curves.figure._last_layout_edit_id
        loss, kl = curves.data._index["loss"], curves.data._index["kl"]
        assert sorted(last["restyle_traces"]) == sorted([loss, kl])
        assert len(last["restyle_data"]["y"]) == 2  # one array per changed trace, no others
        assert list(curves.trace("loss").y) == pytest.approx([1.0, 0.5, 1 / 3])  # the kernel's figure too
        assert list(curves.trace("kl").x) == [1, 2, 3]
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
        upper, lower = curves.trace("reward/max"), curves.trace("reward/min")
        assert lower.fill == "tonexty" and curves.figure.data.index(upper) + 1 == curves.figure.data.index(lower)
        assert list(upper.y)[-1] == pytest.approx(1.0) and list(lower.y)[-1] == pytest.approx(0.0)
        sets = curves.trace("mark:set")
        assert list(sets.x) == [4] and "lr=3e-06" in sets.text[0]
        failure = curves.trace("mark:failure")
        assert list(failure.x) == [5] and "generator[1] healthy -> recovering" in failure.text[0]
        lines = {(s.x0, s.line.color) for s in curves.figure.layout.shapes}
        assert (4, "#7b1fa2") in lines and (5, "#d62728") in lines
        assert len(curves.figure.layout.shapes) == 2 * 9  # a line per marked event in each panel
    finally:
        curves.close()


def test_a_run_without_metrics_is_refused_with_a_clear_message() -> None:
    with pytest.raises(TypeError, match="no .metrics store"):
        Dashboard(object())


def test_long_runs_are_halved_and_arrays_already_drawn_never_change() -> None:
    from forge_nb.widgets._series import CurveData

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
