"""forge_nb.shutdown_all(): the kernel-wide teardown that %forge_shutdown --all calls, on real CPU meshes with the light
actors of tests/light_actors.py: every live run in order (one of them training), then every other mesh."""

from __future__ import annotations

import pytest

import forge_nb
from forge_nb.system.processes import procs
from forge_nb.system.runtime import registry, spawning
from tests.controller.test_controller import spawn_light

pytestmark = [pytest.mark.timeout(300)]


async def test_shutdown_all_stops_every_run_then_every_mesh(runtime, tmp_path):
    first = await spawn_light(tmp_path, "all-a")
    second = await spawn_light(tmp_path, "all-b")
    bare = await spawning.spawn_mesh("all-bare", 1)  # a mesh of the user's own, outside any run
    assert [r.name for r in forge_nb.live_runs()] == ["all-a", "all-b"]
    first.start()  # one run trains while the teardown comes: it stops at a step boundary
    pids = [p for m in registry.meshes() for p in m.pids]
    report = await forge_nb.shutdown_all()
    assert report.runs == ["all-a", "all-b"] and report.alive == [] and report.released_hosts == 0
    assert sorted(report.pids) == sorted(pids) and report.meshes >= 5  # two runs' services and the bare mesh
    assert first.state == second.state == "shut down" and first.ledger()["balanced"]
    assert forge_nb.live_runs() == [] and registry.meshes() == [] and not procs.pid_alive(bare.pids[0])
    assert not [p for p in pids if procs.pid_alive(p)]
    again = await forge_nb.shutdown_all()  # nothing left: a second call stops nothing
    assert again.runs == [] and again.meshes == 0
