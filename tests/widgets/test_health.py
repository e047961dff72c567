"""The health grid over a real service on monarch meshes: a SIGKILLed replica turns red, then healthy.

The grid is built as the Dashboard builds it (services and version are read through callables), over
a service of real replicas; the grid of a real Run is covered in test_dashboard_run.py."""

from __future__ import annotations

import asyncio
import os
import re
import signal
import time

import pytest

from forge_nb.widgets.health import HealthGrid, render_health, status_dict
from tests.actors_for_tests import Worker

pytestmark = pytest.mark.timeout(180)


def _cells(html: str, replica: str) -> list[str]:
    """The text of each cell of one replica's row."""
    row = re.search(rf"<tr data-replica='{re.escape(replica)}'.*?</tr>", html).group(0)
    return [re.sub(r"<[^>]+>", "", c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]


def _state_in_grid(html: str, replica: str) -> str | None:
    m = re.search(rf"data-replica='{re.escape(replica)}' data-state='(\w+)'", html)
    return m.group(1) if m else None


async def test_healthturns_recovering_within_a_second_then_healthy_again(runtime) -> None:
    svc = await Worker.options(num_replicas=2, restart_backoff=0.1, route_wait_timeout=60.0).as_service()
    version = {"run": 0}
    errors: list[BaseException] = []
    health = HealthGrid(lambda: {"worker": svc}, lambda: version["run"], asyncio.get_running_loop(), errors.append)
    seen: dict[str, float] = {}  # state -> when the service reported it
    svc.subscribe(lambda e: seen.setdefault(e.new, e.time) if e.replica == 0 else None)
    try:
        await asyncio.gather(*(svc.work.route(i) for i in range(4)))
        health.refresh()  # the dashboard's poll: served counts and latencies
        grid = health.html.value
        assert _state_in_grid(grid, "worker[0]") == "healthy" and _state_in_grid(grid, "worker[1]") == "healthy"
        assert "2/2 healthy" in grid and str(svc.replicas[0].mesh.pids[0]) in grid
        assert sum(s.served for s in svc.status()) == 4
        version["run"] = 3
        svc.replicas[1].version = 2
        health.refresh()
        cells = _cells(health.html.value, "worker[1]")
        assert cells[0] == "worker[1]" and cells[1] == "healthy" and cells[7] == "1"  # version lag 3 - 2
        assert int(cells[4]) >= 1 and cells[5] == "0&nbsp;/&nbsp;0"  # served; failures / restarts
        assert float(cells[6].split("&nbsp;")[0]) > 0  # p50 latency

        os.kill(svc.replicas[0].mesh.pids[0], signal.SIGKILL)
        drawn: dict[str, float] = {}
        deadline = time.monotonic() + 60
        while "healthy" not in drawn and time.monotonic() < deadline:
            state = _state_in_grid(health.html.value, "worker[0]")  # redrawn on the service's events
            if state is not None and state not in drawn and (state != "healthy" or "recovering" in drawn):
                drawn[state] = time.time()
            await asyncio.sleep(0.02)
        assert "recovering" in drawn and "healthy" in drawn, (drawn, seen)
        assert drawn["recovering"] - seen["recovering"] < 1.0
        assert drawn["healthy"] - seen["healthy"] < 1.0
        assert "#d62728" in render_health({"worker": [status_dict(svc.status()[0]) | {"state": "recovering"}]}, 0)
        error_row = re.search(r"data-replica='worker\[0\]'.*?</tr><tr class='forge-last-error'>(.*?)</tr>",
                              health.html.value)
        assert error_row and "last error: " in error_row.group(1) and "process died" in error_row.group(1)
        row = health.snapshot["worker"][0]
        assert row["restarts"] == 1 and row["failures"] == 1 and "process died" in (row["last_error"] or "")
        assert health.states() == {"worker[0]": "healthy", "worker[1]": "healthy"}
        assert not errors
    finally:
        health.close()
        await svc.shutdown()


def test_every_state_has_a_colour_of_its_own() -> None:
    from forge_nb.widgets.controls import STATE_COLORS, render_status
    from forge_nb.widgets.health import COLORS

    assert len(set(COLORS.values())) == len(COLORS)  # replica states
    assert len(set(STATE_COLORS.values())) == len(STATE_COLORS)  # run states
    for state in ("ready", "running", "paused", "stopped", "failed", "shut down"):
        html = render_status({"name": "r", "state": state, "step": 1, "version": 0, "error": None})
        assert f"background:{STATE_COLORS[state]}" in html and f"data-state='{state}'" in html


def test_a_replica_on_a_job_s_host_shows_where_it_runs() -> None:
    from forge_nb.widgets.health import render_health, status_dict

    row = {"service": "policy", "index": 0, "state": "healthy", "pids": [41, 42], "version": 3}
    there = render_health({"policy": [status_dict({**row, "host": "generators[1]"})]}, 3)
    here = render_health({"policy": [status_dict({**row, "host": "kernel"})]}, 3)
    assert "41,42 @generators[1]" in there and "41,42<" in here and "@" not in here


def test_the_job_s_line_heads_the_grid_and_turns_red_when_a_host_is_lost():
    job = {"kind": "SlurmJob", "scheduler": "slurm", "job_id": "42", "state": "RUNNING",
           "nodes": ["n1", "n2"], "hosts": {"hosts[0]": "alive", "hosts[1]": "alive"}}
    html = render_health({}, None, job)
    assert "data-job='42' data-job-state='RUNNING'" in html
    assert "SLURM job 42: RUNNING, nodes n1, n2; hosts hosts[0] alive, hosts[1] alive" in html
    assert "color:inherit" in html
    lost = {**job, "state": "CANCELLED", "hosts": {"hosts[0]": "job 42 ended: CANCELLED", "hosts[1]": "alive"}}
    html = render_health({}, None, lost)
    assert "hosts[0] LOST: job 42 ended: CANCELLED" in html and "color:#7f0000" in html
    assert "forge-job" not in render_health({}, None, None)  # one machine: no line
