"""Services on real monarch meshes: routing, fanout, sessions, failover, respawn, and clear misuse errors."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from monarch.actor import ActorError

from forge_nb.service import NoHealthyReplica
from forge_nb.system.processes.procs import pid_alive
from forge_nb.system.runtime import faults, registry
from tests.actors_for_tests import Ledger, OwnSquare, Squarer, Worker
from tests.waiting import waiter

pytestmark = pytest.mark.timeout(180)

FAST = dict(restart_backoff=0.1, route_wait_timeout=60.0)


_until = waiter(timeout=30.0, interval=0.05)


def _healthy(svc) -> bool:
    return all(r.state == "healthy" for r in svc.replicas)


async def test_route_spreads_load_and_fanout_reaches_every_replica(runtime):
    svc = await Worker.options(num_replicas=2, **FAST).as_service()
    try:
        pids = await svc.pid.fanout()
        assert len(set(pids)) == 2 and set(pids) == {r.mesh.pids[0] for r in svc.replicas}
        answers = await asyncio.gather(*(svc.work.route(i, 0.2) for i in range(20)))
        assert set(answers) == set(pids)
        served = [s.served for s in svc.status()]
        assert min(served) >= 8, served  # least-loaded: concurrent requests spread evenly
        # Sequential calls alternate (round-robin among equally idle replicas).
        seq = [await svc.pid.route() for _ in range(4)]
        assert seq[0] != seq[1] and seq[0] == seq[2]
    finally:
        await svc.shutdown()


async def test_session_sticks_and_moves_when_its_replica_dies(runtime):
    svc = await Worker.options(num_replicas=2, **FAST).as_service()
    try:
        async with svc.session():
            first = {await svc.pid.route() for _ in range(6)}
            assert len(first) == 1
            (sticky,) = first
            os.kill(sticky, signal.SIGKILL)
            moved = {await svc.pid.route() for _ in range(4)}
            assert len(moved) == 1 and moved != first
        # Outside the session, routing is free again.
        assert await _until(lambda: _healthy(svc))
        assert len({await svc.pid.route() for _ in range(4)}) == 2
    finally:
        await svc.shutdown()


async def test_sigkill_mid_request_is_retried_once_and_the_replica_respawns(runtime):
    ledger = await Ledger.as_actor()
    svc = await Worker.options(num_replicas=2, **FAST).as_service(ledger=ledger.replica.actor)
    events = []
    svc.subscribe(events.append)
    try:
        old_pids = [r.mesh.pids[0] for r in svc.replicas]
        requests = [asyncio.ensure_future(svc.work.route(i, 1.5)) for i in range(6)]
        await asyncio.sleep(0.5)
        os.kill(old_pids[0], signal.SIGKILL)
        answers = await asyncio.gather(*requests)  # no request fails
        assert all(pid != old_pids[0] for pid in answers)

        records = await ledger.all.call_one()
        ids = sorted(i for i, _ in records)
        assert ids == list(range(6)), "a request was lost or applied twice"

        assert await _until(lambda: _healthy(svc))
        back = svc.replicas[0]
        assert back.mesh.pids[0] not in old_pids and back.restarts == 1 and back.failures >= 1
        assert await svc.get_setups.fanout() == [1, 1]  # the new process ran setup
        transitions = [(e.replica, e.old, e.new) for e in events]
        assert (0, "healthy", "recovering") in transitions and (0, "recovering", "healthy") in transitions
    finally:
        await svc.shutdown()
        await ledger.shutdown()


async def test_every_replica_killed_requests_wait_for_the_respawns(runtime):
    svc = await Worker.options(num_replicas=2, **FAST).as_service()
    try:
        old_pids = [r.mesh.pids[0] for r in svc.replicas]
        requests = [asyncio.ensure_future(svc.work.route(i, 1.5)) for i in range(4)]
        await asyncio.sleep(0.5)
        os.kill(old_pids[0], signal.SIGKILL)
        assert await _until(lambda: svc.replicas[0].state != "healthy")
        await asyncio.sleep(0.3)  # its requests are now retried on replica 1, which dies under them too
        os.kill(old_pids[1], signal.SIGKILL)
        answers = await asyncio.gather(*requests)  # none fails: they are served by the respawned replicas
        assert len(answers) == 4 and not set(answers) & set(old_pids)
        assert all(r.restarts == 1 for r in svc.replicas)
    finally:
        await svc.shutdown()


async def test_respawn_works_when_monarch_reports_the_death_before_the_watchdog(runtime, monkeypatch):
    # monarch's fault hook runs on its own thread, inside a context that names another actor; a respawn
    # started from there used to fail ("'NoneType' object has no attribute 'slice'"), which happened
    # whenever monarch beat the pid watchdog, as on a loaded CI machine.
    monkeypatch.setattr(faults, "WATCHDOG_PERIOD_S", 120.0)
    await asyncio.sleep(2 * 0.25)  # let a running watchdog pick up the new period
    svc = await Worker.options(num_replicas=2, **FAST).as_service()
    try:
        old = svc.replicas[0].mesh.pids[0]
        os.kill(old, signal.SIGKILL)
        assert await _until(lambda: svc.replicas[0].state == "recovering")
        assert await _until(lambda: _healthy(svc), timeout=60), svc.replicas[0].last_error
        assert svc.replicas[0].mesh.pids[0] != old and svc.replicas[0].restarts == 1
        assert await svc.get_setups.fanout() == [1, 1]
    finally:
        await svc.shutdown()
        faults._watchdog.cancel()  # it sleeps the long period; the next spawn starts a fresh one


async def test_hung_replica_times_out_and_the_late_answer_is_discarded(runtime):
    # under the watchdog's STOPPED_HANG_S (2 s), so the timeout, not the watchdog, finds it hung
    svc = await Worker.options(num_replicas=2, request_timeout=1.0, **FAST).as_service()
    try:
        frozen = svc.replicas[1].mesh.pids[0]
        os.kill(frozen, signal.SIGSTOP)
        answers = await asyncio.gather(*(svc.work.route(i, 0.05) for i in range(4)))
        assert frozen not in answers and len(answers) == 4
        assert await _until(lambda: _healthy(svc))
        assert svc.replicas[1].mesh.pids[0] != frozen
        assert "request_timeout" in (svc.replicas[1].last_error or "")
    finally:
        await svc.shutdown()


async def test_a_replica_silent_in_a_fanout_is_restarted_and_left_out_after_the_grace(runtime):
    """A replica whose process runs but does not answer (no SIGSTOP for the watchdog to see) holds up a
    fanout only ``fanout_grace_s`` after the others answered, not until ``request_timeout``."""
    svc = await Worker.options(num_replicas=2, fanout_grace_s=0.5, request_timeout=300.0, **FAST).as_service()
    try:
        fast, silent = (r.mesh.pids[0] for r in svc.replicas)
        answers = await asyncio.wait_for(svc.slow_in.fanout(silent, 3600.0), timeout=60)
        assert answers == [fast]
        assert "fanout" in (svc.replicas[1].last_error or "") and svc.replicas[1].restarts <= 1
        assert await _until(lambda: _healthy(svc))
        assert svc.replicas[1].mesh.pids[0] != silent
        # a replica that is merely slower than the grace, with the grace off, is waited for
        slow = svc.replicas[1].mesh.pids[0]
        svc.options.fanout_grace_s = None
        assert sorted(await svc.slow_in.fanout(slow, 1.0)) == sorted([fast, slow])
    finally:
        await svc.shutdown()


async def test_crash_loop_stops_at_max_restarts_and_traffic_goes_elsewhere(runtime, tmp_path):
    marker = tmp_path / "crash"
    svc = await Worker.options(num_replicas=2, max_restarts=2, **FAST).as_service(crash_marker=str(marker))
    try:
        marker.write_text("every respawn dies in setup")
        os.kill(svc.replicas[0].mesh.pids[0], signal.SIGKILL)
        assert await _until(lambda: svc.replicas[0].state == "failed", timeout=60)
        assert svc.replicas[0].restarts == 2
        assert svc.replicas[0].mesh.alive_pids() == []  # no process left behind by the attempts
        assert len([m for m in registry.meshes() if m.owner == svc.holder]) == 1
        assert {await svc.pid.route() for _ in range(3)} == {svc.replicas[1].mesh.pids[0]}
    finally:
        await svc.shutdown()


async def test_deaths_spread_out_in_a_long_run_never_use_up_max_restarts(runtime):
    svc = await Worker.options(num_replicas=1, max_restarts=1, restart_reset_s=1.0, **FAST).as_service()
    try:
        replica = svc.replicas[0]
        for restarts in (1, 2, 3):  # three deaths, each after serving longer than restart_reset_s
            await asyncio.sleep(1.2)
            os.kill(replica.mesh.pids[0], signal.SIGKILL)
            assert await _until(lambda n=restarts: replica.restarts == n and replica.state == "healthy")
        assert await svc.work.route(1) == replica.mesh.pids[0]
    finally:
        await svc.shutdown()


async def test_endpoint_exception_reaches_the_caller_and_the_replica_stays_healthy(runtime):
    svc = await Worker.options(num_replicas=1, **FAST).as_service()
    try:
        with pytest.raises(ActorError, match="bad input 42"):
            await svc.fail.route("bad input 42")
        assert svc.replicas[0].state == "healthy" and svc.replicas[0].failures == 0
        assert await svc.work.route(1) == svc.replicas[0].mesh.pids[0]
    finally:
        await svc.shutdown()


async def test_route_waits_for_a_respawn_then_gives_a_clear_error_when_none_comes(runtime, tmp_path):
    svc = await Worker.options(num_replicas=1, **FAST).as_service()
    try:
        os.kill(svc.replicas[0].mesh.pids[0], signal.SIGKILL)
        await _until(lambda: svc.replicas[0].state == "recovering")
        assert await svc.work.route(7) == svc.replicas[0].mesh.pids[0]  # waited for the respawn
    finally:
        await svc.shutdown()

    marker = tmp_path / "crash"
    svc = await Worker.options(max_restarts=5, restart_backoff=2.0, route_wait_timeout=0.5).as_service(
        crash_marker=str(marker))
    try:
        marker.write_text("x")
        os.kill(svc.replicas[0].mesh.pids[0], signal.SIGKILL)
        await _until(lambda: svc.replicas[0].state == "recovering")
        with pytest.raises(NoHealthyReplica, match="route_wait_timeout=0.5s"):
            await svc.work.route(1)
    finally:
        await svc.shutdown()


async def test_catch_up_hook_runs_on_respawn_before_traffic(runtime):
    svc = await Worker.options(num_replicas=2, **FAST).as_service()
    try:
        current = {"version": 5}

        async def catch_up(replica):
            await replica.actor.load.call_one(current["version"])

        svc.set_catch_up(catch_up)
        os.kill(svc.replicas[1].mesh.pids[0], signal.SIGKILL)
        assert await _until(lambda: _healthy(svc) and svc.replicas[1].restarts == 1)
        assert await svc.get_loaded.fanout() == [-1, 5]
    finally:
        await svc.shutdown()


async def test_actor_adverbs_and_misuse_errors(runtime):
    actor = await Worker.options(procs=2).as_actor()
    svc = await Worker.as_service()
    try:
        assert len(set(await actor.pid.call())) == 2
        with pytest.raises(ValueError, match=r"use \.call\(\)"):
            await actor.pid.call_one()
        assert await actor.pid.route() == actor.replica.mesh.pids  # one replica, routed (test_seed_adverbs)
        with pytest.raises(AttributeError, match=r"is a service; use \.route\(\)"):
            await svc.pid.call_one()
        with pytest.raises(AttributeError, match="no endpoint 'nope'.*fail, get_loaded"):
            _ = svc.nope
        with pytest.raises(ValueError, match="num_replicas=2; an actor has one"):
            await Worker.options(num_replicas=2).as_actor()
        status = svc.status()[0]
        assert status.state == "healthy" and status.served == 0 and len(status.pids) == 1
    finally:
        await actor.shutdown()
        await svc.shutdown()


async def test_a_setup_error_reaches_the_caller_and_nothing_is_left(runtime, tmp_path):
    marker = tmp_path / "crash"
    marker.write_text("x")
    with pytest.raises(RuntimeError, match=r"Worker\[\d\] failed to start"):
        await Worker.options(num_replicas=2).as_service(crash_marker=str(marker))
    assert registry.meshes() == []


async def test_shutdown_leaves_no_process(runtime):
    svc = await Worker.options(num_replicas=2, procs=2).as_service()
    pids = [p for r in svc.replicas for p in r.mesh.pids]
    assert len(pids) == 4
    await svc.shutdown()
    assert await _until(lambda: not any(pid_alive(p) for p in pids), timeout=15)
    assert [r.state for r in svc.replicas] == ["stopped", "stopped"]


async def test_setup_after_starts_the_processes_first_and_setup_once_it_is_done(runtime):
    """What a run's spawn does while the kernel still writes the model: the replicas' processes and actors
    start at once, their setup waits for the future; a failed future fails the start and stops them all."""
    from forge_nb.service.service import Service

    configured = Worker.options(num_replicas=2, **FAST)
    ready = asyncio.get_running_loop().create_future()
    starting = asyncio.ensure_future(Service.start(configured, configured._options, (), {}, setup_after=ready))
    assert await _until(lambda: len(registry.meshes()) == 2)  # both processes are up before the future is done
    await asyncio.sleep(0.5)
    assert not starting.done()  # ... and no replica ran its setup
    ready.set_result(None)
    svc = await starting
    try:
        assert await svc.get_setups.fanout() == [1, 1]
    finally:
        await svc.shutdown()

    broken = asyncio.get_running_loop().create_future()
    starting = asyncio.ensure_future(Service.start(configured, configured._options, (), {}, setup_after=broken))
    assert await _until(lambda: len(registry.meshes()) == 2)
    pids = [p for m in registry.meshes() for p in m.pids]
    broken.set_exception(FileNotFoundError("the model was never written"))
    with pytest.raises(Exception, match="the model was never written"):
        await starting
    assert registry.meshes() == [] and not [p for p in pids if pid_alive(p)]


async def test_route_calls_made_together_go_out_as_one_message_per_replica(runtime):
    """``batched_endpoints``: calls of ``square`` made in one turn of the loop reach the replicas as
    ``square_many`` (split over the two), each caller gets its own answer or its own error; calls with other
    keyword arguments, a call alone and calls in a session go out as themselves."""
    svc = await Squarer.options(num_replicas=2, **FAST).as_service()
    try:
        together = [svc.square.route(x) for x in (0, 1, 2, 3, -1, 5, 6)] + [svc.square.route(2, offset=1)]
        answers = await asyncio.gather(*together, return_exceptions=True)
        assert answers[:4] + answers[5:] == [0, 1, 4, 9, 25, 36, 5]
        assert isinstance(answers[4], ActorError) and "negative: -1" in str(answers[4])  # its own, as if alone
        got = await svc.received.fanout()
        assert sorted(b for g in got for b in g["batches"]) == [[-1, 5, 6], [0, 1, 2, 3]]  # one per replica
        assert sum(g["messages"]["square"] for g in got) == 1  # offset=1: alone in its group, as itself
        assert svc.coalescers["square"].batches == 2

        assert await svc.square.route(4) == 16  # nothing beside it: as itself
        with pytest.raises(ActorError, match="negative: -2"):  # alone: monarch's own error, the same type
            await svc.square.route(-2)
        async with svc.session():  # sticky calls are never gathered
            assert await asyncio.gather(svc.square.route(1), svc.square.route(2)) == [1, 4]
        got = await svc.received.fanout()
        assert sum(g["messages"]["square"] for g in got) == 5
        assert sum(g["messages"]["square_many"] for g in got) == 2
    finally:
        await svc.shutdown()


def test_batched_endpoints_are_checked_and_an_override_below_them_turns_them_off():
    import torch

    from forge_nb.service.coalesce import _equal, split
    from forge_nb.service.service import batched_endpoints

    assert batched_endpoints(Squarer) == {"square": "square_many"}
    assert batched_endpoints(OwnSquare) == {}  # square_many would bypass OwnSquare's own square
    assert split(list(range(7)), 2) == [[0, 1, 2, 3], [4, 5, 6]] and split([9], 4) == [[9]]
    assert _equal({"n": 4}, {"n": 4}) and not _equal({"n": 4}, {"n": 8})
    assert not _equal({"bias": torch.zeros(2)}, {"bias": torch.zeros(2)})  # cannot say: never gathered

    class Wrong(Squarer):
        batched_endpoints = {"square": "cube_many"}

    with pytest.raises(TypeError, match=r"Wrong.batched_endpoints names what is not an endpoint: square -> cube_many"):
        batched_endpoints(Wrong)
