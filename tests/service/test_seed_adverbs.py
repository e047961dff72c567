"""The TorchForge documents' adverbs and failures on real monarch meshes: ``route``/``fanout`` on an actor,
``except ActorFailure``, constructor and setup errors at the caller, and the custom environment service."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest
from monarch.actor import ActorError

from forge_nb.service import ActorFailure, ActorStartFailed, NoHealthyReplica, ReplicaDied
from forge_nb.system.processes.procs import pid_alive
from forge_nb.system.runtime import registry, spawning
from tests.actors_for_tests import BadInitEnv, BadSetupEnv, CustomEnv, WaitingInitEnv, Worker
from tests.waiting import waiter

pytestmark = pytest.mark.timeout(180)

FAST = dict(restart_backoff=0.1, route_wait_timeout=60.0)
_until = waiter(timeout=30.0, interval=0.05)


async def test_route_and_fanout_on_an_actor_act_as_on_its_one_replica(runtime):
    # concepts.md: `loss = await trainer.train_step.route(batch)` and `replay_buffer.add.route(...)` on actors
    actor = await Worker.as_actor()
    wide = await Worker.options(procs=2).as_actor()
    try:
        pid = actor.replica.mesh.pids[0]
        assert await actor.work.route(1) == pid == await actor.work.call_one(2)
        assert await actor.pid.fanout() == [pid]
        assert await actor.pid.call() == [pid]
        assert actor.replica.served == 4
        # several procs: every rank answers, in rank order, as a service's route does for its replica
        assert await wide.pid.route() == wide.replica.mesh.pids == await wide.pid.call()
        assert await wide.pid.fanout() == [wide.replica.mesh.pids]
        with pytest.raises(ActorError, match="bad input 7"):  # the endpoint's own error, unchanged
            await actor.fail.route("bad input 7")
        assert actor.replica.state == "healthy"
    finally:
        await actor.shutdown()
        await wide.shutdown()


async def test_a_dead_actor_is_an_actor_failure_and_an_endpoint_error_is_not(runtime):
    actor = await Worker.options(**FAST).as_actor()
    try:
        with pytest.raises(ActorError, match="bad input") as raised:
            await actor.fail.route("bad input")
        assert not isinstance(raised.value, ActorFailure)

        request = asyncio.ensure_future(actor.work.route(1, 5.0))
        await asyncio.sleep(0.5)
        os.kill(actor.replica.mesh.pids[0], signal.SIGKILL)
        try:  # concepts.md, "Fault Tolerance"
            await request
            caught = None
        except ActorFailure as failure:
            caught = failure
        assert isinstance(caught, ReplicaDied), caught  # an actor is never retried: its caller is told
        assert await _until(lambda: actor.replica.state == "healthy")  # ... and it is respawned
        assert await actor.work.route(2) == actor.replica.mesh.pids[0]
    finally:
        await actor.shutdown()


async def test_a_service_with_no_replica_left_raises_an_actor_failure(runtime):
    svc = await Worker.options(num_replicas=1, max_restarts=0, **FAST).as_service()
    try:
        os.kill(svc.replicas[0].mesh.pids[0], signal.SIGKILL)
        assert await _until(lambda: svc.replicas[0].state == "failed")
        with pytest.raises(ActorFailure, match="no healthy replica") as raised:
            await svc.work.route(1)
        assert isinstance(raised.value, NoHealthyReplica)
    finally:
        await svc.shutdown()


async def test_an_exception_in_init_reaches_the_caller_with_its_type_message_and_traceback(runtime, monkeypatch):
    spawned = []
    spawn_mesh = spawning.spawn_mesh

    async def recording(*args, **kwargs):
        spawned.append(await spawn_mesh(*args, **kwargs))
        return spawned[-1]

    monkeypatch.setattr(spawning, "spawn_mesh", recording)
    for start in (lambda: BadInitEnv.options(num_replicas=2).as_service(), lambda: BadInitEnv.as_actor()):
        with pytest.raises(ActorStartFailed) as raised:
            await start()
        error = raised.value
        text = str(error)
        assert "failed to start: ValueError: size=100 is too large for this environment" in text
        assert "_check_size" in text and 'raise ValueError(f"size={size}' in text  # the user's traceback
        assert "raised in BadInitEnv.__init__" in text
        assert isinstance(error.__cause__, ValueError) and isinstance(error.exception, ValueError)
        assert isinstance(error, ActorFailure) and "_check_size" in error.remote_traceback
        assert registry.meshes() == []  # nothing left running
    assert len(spawned) == 3 and not [p for m in spawned for p in m.pids if pid_alive(p)]
    actor = await BadInitEnv.as_actor(size=3)  # the same class starts when __init__ does not raise
    try:
        assert await actor.reset.route() == 0
    finally:
        await actor.shutdown()


async def test_an_exception_in_setup_reaches_the_caller_and_nothing_is_left(runtime):
    with pytest.raises(ActorStartFailed, match=r"BadSetupEnv\[\d\] failed to start: KeyError: .*tic-tac-toe") as raised:
        await BadSetupEnv.options(num_replicas=2).as_service()
    assert "in setup" in str(raised.value) and isinstance(raised.value.__cause__, KeyError)
    assert registry.meshes() == []


async def test_a_process_death_during_start_reports_monarchs_whole_text(runtime, tmp_path):
    marker = tmp_path / "crash"
    marker.write_text("x")  # Worker.setup calls os._exit(3)
    with pytest.raises(ActorStartFailed, match=r"Worker\[0\] failed to start: its process died") as raised:
        await Worker.as_actor(crash_marker=str(marker))
    assert raised.value.exception is None and raised.value.remote_traceback
    assert registry.meshes() == []


async def test_the_documents_custom_environment_as_a_service(runtime):
    # rl_workflows.md, "Custom Environments" (num_replicas=16 there; two here, on two cores)
    env = await CustomEnv.options(procs=1, num_replicas=2).as_service()
    try:
        assert await env.initial_state.fanout() == [0, 0]  # __init__'s `self.state = self.reset()` ran reset
        obs = await env.reset.route()
        assert obs == 0
        done, steps = False, 0
        while not done:  # the document's loop; a replica each step, so each replica's episode advances
            action = 1
            obs, reward, done = await env.step.route(action)
            steps += 1
        assert done and reward == 1.0 and steps <= 2 * 3

        await env.reset.fanout()
        async with env.session():  # one episode on one replica
            trajectory = [await env.step.route(1) for _ in range(3)]
        assert trajectory == [(1, 0.0, False), (2, 0.0, False), (3, 1.0, True)]
        assert await env.restart.route() == (0, "goal=3")  # `await self.reset()` and a sync `self.describe()`
    finally:
        await env.shutdown()


async def test_an_endpoint_that_must_wait_called_from_init_says_to_use_setup(runtime):
    with pytest.raises(ActorStartFailed, match=r"WaitingInitEnv.reset\(\) was called from __init__") as raised:
        await WaitingInitEnv.as_actor()
    assert "await self.reset()" in str(raised.value) and isinstance(raised.value.__cause__, TypeError)
    assert registry.meshes() == []


def test_a_forge_actor_constructed_in_the_kernel_raises_as_any_class():
    with pytest.raises(ValueError, match="too large"):
        BadInitEnv()
    assert CustomEnv(goal=5).state == 0  # `self.reset()` in __init__ runs here too
