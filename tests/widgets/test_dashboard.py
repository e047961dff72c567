"""The ipywidgets dashboard over a real MetricsStore, asserted in the kernel-side widget state."""

from __future__ import annotations

import asyncio
import time

import pytest

from forge_nb.widgets import Dashboard, dashboard
from forge_nb.widgets._throttle import Throttle

pytestmark = pytest.mark.timeout(120)


async def _until(predicate, timeout: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        await asyncio.sleep(0.02)
    return predicate()


async def test_curves_replay_history_then_grow_as_rows_are_recorded(stand_in_run) -> None:
    run = stand_in_run
    for _ in range(5):
        run.train_step()
    d = Dashboard(run)
    try:
        mean = d.curves.trace("reward/mean")
        assert list(mean.x) == [1, 2, 3, 4, 5]  # the history, drawn at once
        assert list(d.curves.trace("kl").y) == pytest.approx([0.01, 0.02, 0.03, 0.04, 0.05])
        for _ in range(3):
            run.train_step()
        assert await _until(lambda: len(d.curves.trace("reward/mean").x) == 8)
        for key in ("entropy", "loss", "grad_norm", "response_len/mean", "policy_age/mean",
                    "tokens_per_s/generate", "tokens_per_s/train", "time/step_s"):
            assert len(d.curves.trace(key).x) == 8, key
        # one line per reward function, added when first seen
        assert list(d.curves.trace("reward/format").y)[-1] == pytest.approx(0.4)
        assert len(d.curves.trace("reward/correct").x) == 8
        assert d.curves.lags_ms and max(d.curves.lags_ms) < 1000
    finally:
        d.close()


async def test_a_burst_of_rows_is_drawn_in_few_batched_updates(stand_in_run) -> None:
    d = Dashboard(stand_in_run, update_interval=0.25)
    try:
        before = d.curves.throttle.flushes
        t0 = time.monotonic()
        for _ in range(200):
            stand_in_run.train_step()
        assert len(d.curves.trace("reward/mean").x) < 200  # nothing drawn synchronously per row
        assert await _until(lambda: len(d.curves.trace("reward/mean").x) == 200)
        flushes = d.curves.throttle.flushes - before
        elapsed = time.monotonic() - t0
        assert flushes <= 2 + elapsed / 0.25, (flushes, elapsed)
        # a trickle slower than the interval is drawn at once (leading edge), not 250 ms late
        await asyncio.sleep(0.3)
        t = time.monotonic()
        stand_in_run.train_step()
        assert await _until(lambda: len(d.curves.trace("reward/mean").x) == 201)
        assert time.monotonic() - t < 0.2
    finally:
        d.close()


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


async def test_band_and_markers_for_hot_changes_and_failures(stand_in_run) -> None:
    run = stand_in_run
    d = Dashboard(run)
    try:
        for _ in range(4):
            run.train_step()
        run.set(lr=3e-6)
        run.train_step()
        run.metrics.event("replica", service="generator", replica=1, old="healthy", new="recovering",
                          reason="process died")
        run.metrics.event("replica", service="generator", replica=1, old="recovering", new="healthy",
                          reason="ready")  # a recovery is not a failure: no marker
        assert await _until(lambda: len(d.curves.trace("mark:failure").x) == 1)
        upper, lower = d.curves.trace("reward/max"), d.curves.trace("reward/min")
        assert lower.fill == "tonexty" and d.curves.figure.data.index(upper) + 1 == d.curves.figure.data.index(lower)
        assert list(upper.y)[-1] == pytest.approx(1.0) and list(lower.y)[-1] == pytest.approx(0.0)
        sets = d.curves.trace("mark:set")
        assert list(sets.x) == [4] and "lr=3e-06" in sets.text[0]
        failure = d.curves.trace("mark:failure")
        assert list(failure.x) == [5] and "generator[1] healthy -> recovering" in failure.text[0]
        lines = {(s.x0, s.line.color) for s in d.curves.figure.layout.shapes}
        assert (4, "#7b1fa2") in lines and (5, "#d62728") in lines
        assert len(d.curves.figure.layout.shapes) == 2 * 9  # a line per marked event in each panel
    finally:
        d.close()


async def test_an_observer_error_shows_in_the_output_and_the_dashboard_goes_on(stand_in_run) -> None:
    run = stand_in_run
    d = Dashboard(run)
    try:
        run.metrics.event("set", changes="lr=1")  # malformed: changes must be a dict
        assert d.errors.messages and "metrics observer (event)" in d.errors.messages[0]
        assert "AttributeError" in d.errors.output.outputs[0]["text"]
        assert "1 dashboard callback error" in d.errors.title.value
        run.train_step()
        assert await _until(lambda: len(d.curves.trace("reward/mean").x) == 1)  # still drawing
        assert "AttributeError" in d.to_html()
    finally:
        d.close()


async def test_button_and_apply_errors_show_in_the_output(stand_in_run) -> None:
    run = stand_in_run
    d = Dashboard(run)
    try:
        d.controls.inputs["lr"].value = 2e-5
        d.controls.inputs["max_tokens"].value = 128
        d.controls.apply.click()
        assert run.calls[-1] == ("set", {"lr": 2e-5, "max_tokens": 128})

        async def broken_step(n: int) -> None:
            raise RuntimeError("step refused: the run is stopped")

        run.step = broken_step
        d.controls.buttons["step"].click()
        assert await _until(lambda: any("step refused" in m for m in d.errors.messages))
        assert any("run.step" in m for m in d.errors.messages)
    finally:
        d.close()


async def test_buttons_call_the_run_and_the_status_follows(stand_in_run) -> None:
    run = stand_in_run
    d = Dashboard(run, poll_interval=0.05)
    try:
        b = d.controls.buttons
        b["start"].click()
        assert run.state == "running"
        b["pause"].click()
        assert await _until(lambda: "data-state='paused'" in d.controls.status.value)
        assert b["pause"].disabled and not b["resume"].disabled
        b["resume"].click()
        d.controls.step_n.value = 3
        b["step"].click()
        assert await _until(lambda: run.current_step == 3)
        b["stop"].click()
        assert await _until(lambda: run.state == "stopped")
        assert [c for c, _ in run.calls] == ["start", "pause", "resume", "step", "stop"]
        assert ("step", 3) in run.calls
        # a value changed elsewhere (a magic) reaches its input
        run.set(beta=0.5)
        assert await _until(lambda: d.controls.inputs["beta"].value == 0.5)
    finally:
        d.close()


async def test_explorer_filters_by_version_and_reward_and_compares_across_versions(stand_in_run) -> None:
    run = stand_in_run
    for _ in range(6):
        run.train_step()
    d = Dashboard(run)
    try:
        ex = d.explorer
        ex.refresh()
        assert ex.table.value.count("<tr>") == 1 + 24  # header + 6 steps x 4 episodes
        ex.version.value = 3
        assert ex.table.value.count("<tr>") == 1 + 4 and "answer v3 #0" in ex.table.value
        ex.version.value = None
        ex.min_reward.value = "0.5"
        assert "answer v1 #0" in ex.table.value and "answer v1 #1" not in ex.table.value  # reward (s+k)%2
        ex.min_reward.value = "abc"
        assert any("not a number" in m for m in d.errors.messages)
        ex.min_reward.value = ""
        ex.prompt.value = "what is 0 + 1?"  # steps 1 and 4 asked it
        assert "version 1" in ex.compare.value and "version 4" in ex.compare.value
        assert "version 2" not in ex.compare.value and "answer v4 #1" in ex.compare.value
    finally:
        d.close()


async def test_html_fallback_and_display_bundle_carry_the_numbers(stand_in_run) -> None:
    run = stand_in_run
    for _ in range(7):
        run.train_step()
    d = Dashboard(run)
    try:
        page = d.to_html()
        assert d._repr_html_() == page
        assert "test-run" in page and "step <b>7</b>" in page
        assert "reward/mean" in page and "0.7" in page and "0.142857" in page  # loss = 1/7
        from IPython.core.interactiveshell import InteractiveShell

        shell = InteractiveShell.instance()
        bundles: list[dict] = []
        shell.display_pub.publish = lambda data, **kw: bundles.append(data)  # type: ignore[method-assign]
        from IPython.display import display

        display(d)
        assert "application/vnd.jupyter.widget-view+json" in bundles[-1]
        assert "reward/mean" in bundles[-1]["text/html"]
    finally:
        d.close()


async def test_the_poll_task_is_owned_and_stops(stand_in_run) -> None:
    d = dashboard(stand_in_run)
    assert dashboard(stand_in_run) is d  # re-running the cell does not stack pollers
    task = d._task
    assert task is not None and task.get_name() == "forge_nb.dashboard.poll.test-run" and d.polling
    d.stop()
    await asyncio.sleep(0.05)
    assert task.cancelled() and not d.polling
    stand_in_run.train_step()
    assert len(d.curves.trace("reward/mean").x) == 0  # unsubscribed
    d.start()  # resumes: the row recorded while stopped is drawn, nothing twice
    assert d.polling and list(d.curves.trace("reward/mean").x) == [1]
    stand_in_run.train_step()
    assert await _until(lambda: list(d.curves.trace("reward/mean").x) == [1, 2])
    d.close()
    fresh = dashboard(stand_in_run)
    assert fresh is not d
    fresh.close()


def test_without_an_event_loop_the_dashboard_says_it_will_not_refresh(stand_in_run) -> None:
    d = Dashboard(stand_in_run)
    assert not d.polling and "no running event loop" in d.errors.messages[0]
    stand_in_run.train_step()  # with no loop the first row is drawn synchronously
    assert len(d.curves.trace("reward/mean").x) == 1
    d.close()


def test_a_run_without_metrics_is_refused_with_a_clear_message() -> None:
    with pytest.raises(TypeError, match="no .metrics store"):
        Dashboard(object())
