"""The dashboard and the inline panel app over a real quickstart Run, widget state asserted in this process.

One Run (the quickstart: a vLLM CPU generator, a trainer, torchstore) is shared by the module; tests run in
file order, each leaves it paused, and the last one stops it with the stop button. Every check reads
what the Run itself holds (its metrics rows, services, hparams, episodes), so nothing here is a
stand-in: a widget that drew the wrong row, or a button that called the wrong method, fails.
"""

from __future__ import annotations

import asyncio
import base64
import re
import urllib.error
import urllib.request

import numpy as np
import pytest
import pytest_asyncio

import forge_nb
from forge_nb.widgets import Dashboard, dashboard, panel_app, serve
from forge_nb.widgets.controls import render_status
from forge_nb.widgets.explorer import ALL
from tests.waiting import waiter

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(600), pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def run(tmp_path_factory):
    cfg = forge_nb.quickstart(name="widgets", run_dir=str(tmp_path_factory.mktemp("run")))
    run = await forge_nb.spawn(cfg, progress=False)
    await run.step(2)
    await run.policy.started()  # the trainer samples until the generator serves (stand_in); these tests show both
    yield run
    await run.shutdown()


_until = waiter(timeout=120.0, interval=0.05)


def _states(grid_html: str) -> dict[str, str]:
    return dict(re.findall(r"data-replica='([^']+)' data-state='(\w+)'", grid_html))


async def test_history_is_drawn_at_once_then_each_step_is_added(run) -> None:
    d = Dashboard(run)
    try:
        mean = d.curves.trace("reward/mean")
        assert list(mean.x) == [r["step"] for r in run.metrics.rows]  # the history, drawn at once
        rows = await run.step(2)
        assert await _until(lambda: len(d.curves.trace("reward/mean").x) == len(run.metrics.rows))
        assert list(d.curves.trace("reward/mean").y)[-2:] == pytest.approx([r["reward/mean"] for r in rows])
        assert list(d.curves.trace("loss").y)[-1] == pytest.approx(rows[-1]["loss"])
        assert list(d.curves.trace("entropy").x)[-1] == rows[-1]["step"]
        assert d.curves.lags_ms and max(d.curves.lags_ms) < 1000
        assert not d.errors.messages
    finally:
        d.close()


async def test_health_grid_lists_every_replica_of_the_run_with_its_pids_and_version(run) -> None:
    d = Dashboard(run)
    try:
        d.tick()
        grid = d.health.html.value
        expected = {f"{name}[{r.index}]" for name, svc in run.services.items() for r in svc.status()}
        assert expected == {"policy[0]", "trainer[0]"}  # the quickstart: one generator replica, the trainer
        assert _states(grid) == dict.fromkeys(expected, "healthy")
        assert "<b>policy</b> &mdash; 1/1 healthy" in grid
        for r in run.policy.replicas:
            assert str(r.mesh.pids[0]) in grid and r.version == run.version  # no version lag
    finally:
        d.close()


def _seen(run, d, at: int) -> str:
    """What the run and the dashboard held when a wait ran out: the assertion's message."""
    return (f"state {run.state}, step {run.current_step} (from {at}), buffer {len(run.replay_buffer)}, "
            f"error {run.error}, "
            f"dashboard errors {d.errors.messages}, message {d.controls.message.value}, "
            f"last events {run.metrics.events[-6:]}")


async def test_buttons_and_inputs_drive_the_run(run) -> None:
    d = Dashboard(run, poll_interval=0.05)
    try:
        b = d.controls.buttons
        at = run.current_step
        b["start"].click()
        assert await _until(lambda: run.current_step >= at + 1)
        b["pause"].click()
        assert await _until(lambda: "data-state='paused'" in d.controls.status.value)
        assert run.state == "paused" and b["pause"].disabled and not b["resume"].disabled
        b["resume"].click()
        assert await _until(lambda: run.state == "running")
        b["pause"].click()
        assert await _until(lambda: run.state == "paused" and run.training_idle.is_set())  # no step in flight

        for name, inp in d.controls.inputs.items():  # JupyterLab's UI font: ~7.5px a character
            assert int(inp.style.description_width.removesuffix("px")) >= 7.5 * len(name), name
        assert "max_policy_age" in d.controls.inputs
        assert d.controls.edited() == {}  # every input, None-valued ones (norm_len) too, shows the run's value

        d.controls.inputs["lr"].value = 2e-3
        d.controls.apply.click()
        d.controls.step_n.value = 2
        at = run.current_step
        b["step"].click()
        assert await _until(lambda: run.current_step == at + 2 and run.state == "paused"), _seen(run, d, at)
        assert run.hparams["lr"] == pytest.approx(2e-3) and run.metrics.last("lr") == pytest.approx(2e-3)

        run.set(max_norm=0.5)  # changed elsewhere (a magic): the input follows
        assert await _until(lambda: d.controls.inputs["max_norm"].value == pytest.approx(0.5), timeout=10)

        d.controls.inputs["max_tokens"].value = 10_000  # the run refuses it; the dashboard says why
        d.controls.apply.click()
        assert await _until(lambda: any("max_res_tokens" in m for m in d.errors.messages), timeout=10)
        assert any("run.set" in m for m in d.errors.messages)
        assert run.hparams["max_tokens"] != 10_000
    finally:
        d.close()


async def test_explorer_filters_the_runs_episodes_and_compares_a_prompt_across_versions(run) -> None:
    d = Dashboard(run)
    try:
        ex = d.explorer
        assert (ex.version.label, ex.version.index) == ("all", 0)  # not a blank box
        ex.n.value = 1000
        ex.refresh()
        assert (ex.version.label, ex.version.index) == ("all", 0) and len(ex.version.options) > 2
        episodes = run.episodes(1000)
        assert episodes and ex.table.value.count("<tr>") == 1 + len(episodes)
        versions = sorted({e["version"] for e in episodes})
        assert len(versions) >= 2
        ex.version.value = versions[-1]
        newest = run.episodes(1000, version=versions[-1])
        assert ex.table.value.count("<tr>") == 1 + len(newest)
        ex.version.value = ALL
        assert ex.version.label == "all" and ex.table.value.count("<tr>") == 1 + len(episodes)
        ex.min_reward.value = "0.5"
        assert ex.table.value.count("<tr>") == 1 + len(run.episodes(1000, min_reward=0.5))
        ex.min_reward.value = "abc"
        assert any("not a number" in m for m in d.errors.messages)
        ex.min_reward.value = ""
        prompt = next(p for p in dict.fromkeys(e["prompt"] for e in episodes)
                      if len({e["version"] for e in episodes if e["prompt"] == p}) >= 2)
        ex.prompt.value = prompt
        for v in {e["version"] for e in episodes if e["prompt"] == prompt}:
            assert f"version {v}" in ex.compare.value
    finally:
        d.close()


async def test_an_observer_error_is_shown_and_the_html_view_carries_the_numbers(run) -> None:
    d = Dashboard(run)
    try:
        bad = run.metrics.event("set", changes="lr=1")  # malformed: changes must be a dict
        run.metrics.events.remove(bad)  # the later tests' dashboards replay the history: keep it clean
        assert d.errors.messages and "metrics observer (event)" in d.errors.messages[0]
        assert "AttributeError" in d.errors.output.outputs[0]["text"]
        assert "1 dashboard callback error" in d.errors.title.value
        rows = await run.step(1)
        assert await _until(lambda: list(d.curves.trace("reward/mean").x)[-1] == rows[-1]["step"])  # goes on
        page = d.to_html()
        assert d._repr_html_() == page
        assert "widgets" in page and f"step <b>{run.current_step}</b>" in page and "AttributeError" in page
        assert "reward/mean" in page and "policy[0]" in page and "trainer[0]" in page

        from IPython.core.interactiveshell import InteractiveShell
        from IPython.display import display

        shell = InteractiveShell.instance()
        bundles: list[dict] = []
        shell.display_pub.publish = lambda data, **kw: bundles.append(data)  # type: ignore[method-assign]
        display(d)  # the live widget, then its snapshot as an output of its own (replaced at each cell's end)
        assert "application/vnd.jupyter.widget-view+json" in bundles[-2]
        assert "widget-view+json" not in bundles[-1] and "reward/mean" in bundles[-1]["text/html"]
        assert "data-title='reward'" in bundles[-1]["text/html"]  # its curves
    finally:
        d.close()


def _hooks(run) -> dict[str, int]:
    """How many state-change subscribers each of the run's services has."""
    return {name: len(svc._subscribers) for name, svc in run.services.items()}


async def test_the_poll_task_is_owned_and_stops(run) -> None:
    hooks = _hooks(run)
    d = dashboard(run)
    assert dashboard(run) is d  # re-running the cell does not stack pollers
    task = d._task
    assert task is not None and task.get_name() == "forge_nb.dashboard.poll.widgets" and d.polling
    assert _hooks(run) == {n: k + 1 for n, k in hooks.items()}
    d.stop()
    await asyncio.sleep(0.05)
    assert task.cancelled() and not d.polling
    assert _hooks(run) == hooks  # the grid's hooks are gone
    drawn = len(d.curves.trace("reward/mean").x)
    await run.step(1)
    assert len(d.curves.trace("reward/mean").x) == drawn  # unsubscribed
    d.start()  # resumes: the row recorded while stopped is drawn, nothing twice
    assert d.polling and list(d.curves.trace("reward/mean").x) == [r["step"] for r in run.metrics.rows]
    d.close()
    fresh = dashboard(run)
    assert fresh is not d
    fresh.close()


async def test_without_an_event_loop_the_dashboard_says_it_will_not_refresh(run) -> None:
    def build() -> None:  # a worker thread: no running event loop there
        d = Dashboard(run)
        try:
            assert not d.polling and "no running event loop" in d.errors.messages[0]
            assert len(d.curves.trace("reward/mean").x) == len(run.metrics.rows)  # drawn synchronously
        finally:
            d.close()

    await asyncio.to_thread(build)


def _reward_steps(message: dict, traces: list[dict]) -> tuple[int, list[float]]:
    """(start, x values) of reward/mean in one points message of the panel app's curves."""
    values = np.frombuffer(base64.b64decode(message["b64"]), dtype=np.float64)
    at = 0
    for i, start, count in message["traces"]:  # each trace's x values, then its y values
        if traces[i]["key"] == "reward/mean":
            return start, list(values[at : at + count])
        at += 2 * count
    raise AssertionError(f"no reward/mean points in {message['traces']}")


async def test_the_inline_panel_app_draws_the_run_and_its_buttons_call_it(run) -> None:
    layout = panel_app(run)
    view = layout.dashboard
    try:
        steps = [r["step"] for r in run.metrics.rows]
        assert list(view.curves.trace("reward/mean").x) == steps
        layout.get_root()  # a bokeh model, as a notebook display makes: what the browser is sent
        (model,) = [m for m, _ in view.plot._models.values()]
        assert "reward/mean" in [t["key"] for t in model.data.traces]  # the synced styles
        sent: list[dict] = []
        view.plot._send_msg = sent.append  # what goes to the page: JSON, the points base64-encoded
        view._request_snapshot()
        view._tick()
        for r in run.policy.replicas:
            assert f"data-replica='policy[{r.index}]' data-state='healthy'" in view.health.object
        assert f"step <b>{run.current_step}</b>" in view.status.object
        assert set(view.hparam_inputs) == set(run.hparams)

        view.hparam_inputs["temperature"].value = 0.9
        view.apply.clicks += 1
        view.step_n.value = 1
        at = run.current_step
        bad = run.metrics.event("set", changes="lr=1")  # malformed: reported, and the rows after it drawn
        run.metrics.events.remove(bad)
        view.buttons["step"].clicks += 1
        assert await _until(lambda: run.current_step == at + 1 and run.state == "paused")
        assert run.sampling_overrides["temperature"] == pytest.approx(0.9)
        view._tick()
        assert view.curves.trace("reward/mean").x[-1] == run.current_step
        steps = [r["step"] for r in run.metrics.rows]
        start, xs = _reward_steps(sent[-1], model.data.traces)
        assert start > 0 and xs == steps[start:]  # only the new points
        view.plot._handle_msg({"type": "sync"})  # a page that opens asks for everything
        assert sent[-1]["sync"] and _reward_steps(sent[-1], model.data.traces) == (0, steps)
        assert any(m.startswith("metrics event: AttributeError") for m in view.errors), view.errors
        view._request_episodes()
        view._tick()
        assert run.episodes(1)[0]["episode_id"] in view.episodes.object
    finally:
        view.close()


async def test_the_served_panel_app_answers_on_localhost_and_stops(run) -> None:
    server = serve(run)
    try:
        assert server.url.startswith("http://127.0.0.1:")

        def get() -> str:
            with urllib.request.urlopen(server.url, timeout=60) as r:
                assert r.status == 200
                return r.read().decode()

        observers = len(run.metrics._observers)
        page = await asyncio.to_thread(get)  # the session runs panel_app on the server's thread
        assert "bokeh" in page.lower()
        # the session subscribes to the run's metrics on this (the kernel's) loop
        assert await _until(lambda: len(run.metrics._observers) == observers + 1, timeout=10)
    finally:
        await asyncio.to_thread(server.stop)
    assert not server.thread.is_alive()
    with pytest.raises(OSError):
        urllib.request.urlopen(server.url, timeout=2)


async def test_the_served_app_lets_in_only_its_signed_url_and_its_own_origin(run) -> None:
    """No session id, an unsigned one or one signed with another secret: 403. A websocket from another
    origin is refused even with the server's own token."""
    from bokeh.util.token import generate_secret_key, generate_session_id
    from tornado.httpclient import HTTPClientError, HTTPRequest
    from tornado.websocket import websocket_connect

    server = serve(run)
    try:
        base = f"http://127.0.0.1:{server.port}/"
        forged = generate_session_id(secret_key=generate_secret_key().encode(), signed=True)
        for url in (base, f"{base}?bokeh-session-id=guessed", f"{base}?bokeh-session-id={forged}"):
            with pytest.raises(urllib.error.HTTPError) as refused:
                await asyncio.to_thread(urllib.request.urlopen, url, timeout=60)
            assert refused.value.code == 403, url

        def page() -> str:
            with urllib.request.urlopen(server.url, timeout=60) as r:
                return r.read().decode()

        token = re.search(r'"token":\s*"([^"]+)"', await asyncio.to_thread(page)).group(1)
        for origin, allowed in (("http://evil.example", False), (f"http://127.0.0.1:{server.port}", True)):
            request = HTTPRequest(f"ws://127.0.0.1:{server.port}/ws", headers={"Origin": origin})
            if allowed:
                ws = await websocket_connect(request, subprotocols=["bokeh", token])
                ws.close()
            else:
                with pytest.raises(HTTPClientError) as refused:
                    await websocket_connect(request, subprotocols=["bokeh", token])
                assert refused.value.code == 403
    finally:
        await asyncio.to_thread(server.stop)


async def test_the_stop_button_stops_the_run(run) -> None:
    d = Dashboard(run, poll_interval=0.05)
    try:
        d.controls.buttons["stop"].click()
        assert await _until(lambda: run.state == "stopped")
        assert await _until(lambda: d.controls.buttons["stop"].disabled, timeout=5)
        assert "data-state='stopped'" in d.controls.status.value
    finally:
        d.close()


def _badge(status_html: str) -> str:
    return re.search(r"class='forge-state-badge' style='background:(#[0-9a-f]{6})", status_html).group(1)


async def test_after_shutdown_the_controls_are_disabled_and_the_panel_app_stops_serving(run) -> None:
    server = serve(run)
    d = Dashboard(run, poll_interval=0.05)
    layout = panel_app(run)
    view = layout.dashboard
    try:
        assert server.serving and not any(b.disabled for b in view.buttons.values())
        await run.shutdown()  # what %forge_shutdown calls
        assert await _until(lambda: not server.serving, timeout=30)
        with pytest.raises(OSError):
            urllib.request.urlopen(server.url, timeout=2)
        assert await _until(lambda: not d.polling, timeout=10)  # drawn once more, then the poll task ends
        c = d.controls
        assert "data-state='shut down'" in c.status.value
        assert all(b.disabled for b in c.buttons.values()) and c.apply.disabled and c.step_n.disabled
        assert all(inp.disabled for inp in c.inputs.values())
        ready = render_status({"name": "x", "state": "ready", "step": 0, "version": 0, "error": None})
        assert _badge(c.status.value) != _badge(ready)

        view._request_snapshot()
        await asyncio.sleep(0.1)  # the snapshot is taken on this (the kernel's) loop
        view._tick()
        assert "data-state='shut down'" in view.status.object
        assert all(b.disabled for b in view.buttons.values()) and view.apply.disabled
        with pytest.raises(ValueError, match="is shut down"):
            serve(run)
    finally:
        d.close()
        view.close()
        await asyncio.to_thread(server.stop)
