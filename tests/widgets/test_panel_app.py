"""The panel app: built inline over a real MetricsStore, and served on 127.0.0.1 from a thread."""

from __future__ import annotations

import asyncio
import time
import urllib.request

import pytest

from forge_nb.widgets import panel_app, serve
from tests.widgets.stand_in import StandInRun

pytestmark = pytest.mark.timeout(120)


class Replicas:
    """A service's status surface only (the real Service is covered by test_health.py)."""

    def __init__(self, name: str, states: list[str]):
        self.name, self.states = name, states

    def status(self) -> list[dict]:
        return [{"service": self.name, "index": i, "state": s, "pids": [100 + i], "in_flight": 0, "served": 7,
                 "failures": 0, "restarts": 0, "latency_p50_ms": 1.5, "latency_p95_ms": 3.0, "last_error": None,
                 "version": 1} for i, s in enumerate(self.states)]


async def test_inline_app_draws_curves_health_and_calls_the_run() -> None:
    run = StandInRun(services={"policy": Replicas("policy", ["healthy", "recovering"])})
    for _ in range(3):
        run.train_step()
    app = panel_app(run)
    view = app.dashboard
    try:
        reward = next(i for i, t in enumerate(view.data.traces) if t.key == "reward/mean")
        assert list(view.figure.data[reward].x) == [1, 2, 3]
        run.train_step()
        run.set(lr=1e-4)
        view._tick()  # the periodic callback's work, run now
        assert list(view.figure.data[reward].x) == [1, 2, 3, 4]
        assert any(s.x0 == 4 for s in view.figure.layout.shapes)  # the hot change, marked
        view._request_snapshot()
        view._tick()
        assert "data-replica='policy[1]' data-state='recovering'" in view.health.object
        assert "step <b>4</b>" in view.status.object
        assert set(view.hparam_inputs) == set(run.hparams)
        view.buttons["pause"].clicks += 1
        assert run.state == "paused"
        view.hparam_inputs["temperature"].value = 0.7
        view.apply.clicks += 1
        assert run.calls[-1] == ("set", {"temperature": 0.7})
        view.step_n.value = 2
        view.buttons["step"].clicks += 1
        await asyncio.sleep(0.05)
        assert run.current_step == 6
        view._request_episodes()
        view._tick()
        assert "answer v6 #1" in view.episodes.object
        view.prompt.value = view.prompt.options[0]
        assert "version 6" in view.compare.object

        async def refuse() -> None:
            raise RuntimeError("stop refused")

        run.stop = refuse
        view.buttons["stop"].clicks += 1
        await asyncio.sleep(0.05)
        view._tick()
        assert "stop refused" in view.errors_pane.object
    finally:
        view.close()


async def test_served_app_answers_on_localhost_and_stops() -> None:
    run = StandInRun(services={"policy": Replicas("policy", ["healthy", "healthy"])})
    run.train_step()
    server = serve(run)
    try:
        assert server.url.startswith("http://127.0.0.1:")

        def get() -> str:
            with urllib.request.urlopen(server.url, timeout=30) as r:
                assert r.status == 200
                return r.read().decode()

        page = await asyncio.to_thread(get)  # the session runs panel_app on the server's thread
        assert "bokeh" in page.lower()
        await asyncio.sleep(0.5)  # the session subscribes on this (the kernel's) loop
        assert len(run.metrics._observers) == 1
    finally:
        await asyncio.to_thread(server.stop)
    assert not server.thread.is_alive()
    t = time.monotonic()
    with pytest.raises(OSError):
        urllib.request.urlopen(server.url, timeout=2)
    assert time.monotonic() - t < 5
