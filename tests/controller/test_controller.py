"""The controller on real CPU meshes with light actors (tests/light_actors.py): loops, backpressure,
pause/step/stop, hot changes, weight sync, failures and shutdown, in seconds instead of minutes.

Everything but the model is real: monarch processes, services with health and respawn, torchstore
with the run's own key namespace, the replay buffer and the ledger. The heavy twins of these tests
(real vLLM generators and the real trainer) are in tests/run/.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal

import pytest
import pytest_asyncio

import forge_nb
from forge_nb import weights
from tests.light_actors import LightGenerator, LightTrainer
from tests.waiting import waiter

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="module")]

_until = waiter(timeout=60.0, interval=0.02)
LIGHT = {"policy": LightGenerator, "trainer": LightTrainer}


def light_config(tmp_path, name: str, max_policy_age: int = 1, **loop: object) -> forge_nb.RunConfig:
    from forge_nb.config import GeneratorConfig, LoopConfig

    return forge_nb.quickstart(run_dir=str(tmp_path / name), name=name, max_res_tokens=4, group_size=4, batch_size=8,
                               max_policy_age=max_policy_age, loop=LoopConfig(**{"rollout_loops": 2, **loop}),
                               generator=GeneratorConfig(num_replicas=2))


async def spawn_light(tmp_path, name: str, max_policy_age: int = 1, **loop: object) -> forge_nb.Run:
    return await forge_nb.spawn(light_config(tmp_path, name, max_policy_age, **loop), progress=False, actors=LIGHT)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def run(tmp_path_factory):
    run = await spawn_light(tmp_path_factory.mktemp("ctl"), "light")
    yield run
    await run.shutdown()


async def test_step_trains_exactly_n_steps_and_publishes_each_version(run):
    rows = await run.step(3)
    assert [r["step"] for r in rows] == [1, 2, 3] and run.current_step == 3 and run.version == 3
    assert run.state == "paused" and run.training_idle.is_set()
    assert await run.policy.get_version.fanout() == [3, 3]
    assert [r.version for r in run.policy.replicas] == [3, 3]
    # the run's own namespace holds only the current version; the default namespace is untouched
    assert run.weights_namespace != weights.PREFIX
    assert await weights.stored_versions(namespace=run.weights_namespace) == [3]
    assert await weights.stored_versions() == []
    assert run.ledger()["balanced"] and run.ledger()["trained"] == 3 * 8


async def test_pause_parks_every_loop_and_resume_goes_on(run):
    run.start()
    assert await _until(lambda: run.current_step >= 5)
    run.pause()
    assert await _until(lambda: run.training_idle.is_set())
    parked = run.current_step
    accepted = run.ledger()["accepted"]
    await asyncio.sleep(0.5)  # paused: neither a step nor a new group in that time
    assert run.current_step == parked and run.state == "paused"
    assert run.ledger()["accepted"] <= accepted + 2 * 4  # at most the groups that were in flight
    run.resume()
    assert await _until(lambda: run.current_step >= parked + 2)
    await run.stop()
    assert run.state == "stopped" and all(s == "done" for s in run.status()["loops"].values())
    assert run.ledger()["balanced"] and run.ledger()["in_step"] == 0


async def test_resume_then_pause_in_one_cell_starts_no_step(run):
    """``resume(); pause()`` with no await between wakes the parked loop after the pause: no step begins."""
    await run.step(1)  # parked between steps, with a batch waiting in the buffer
    parked = run.current_step
    run.resume()
    run.pause()
    await asyncio.sleep(0.5)  # the loop wakes at once; a step it began would be in flight by now
    await run._ctl.no_step_in_flight()
    assert run.current_step == parked and run.state == "paused"


async def test_async_rollouts_run_ahead_by_at_most_max_policy_age_plus_one_batches(run):
    run.set(max_policy_age=1)
    await run.apply_changes()
    sizes: list[int] = []

    async def watch() -> None:
        while True:
            sizes.append(len(run.replay_buffer))
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    try:
        await run.step(6)
    finally:
        watcher.cancel()
    limit = run._ctl.buffer_limit
    assert limit == 8 * 2
    # a rollout checks the limit before it generates: at most one group per loop lands past it
    assert max(sizes) <= limit + 2 * 4, max(sizes)
    ages = [r["policy_age/max"] for r in run.metrics.rows[-6:]]
    assert max(ages) <= 1, ages  # the buffer evicts what is older than max_policy_age


async def test_set_routes_each_change_to_where_it_is_declared(run):
    with pytest.raises(ValueError, match="unknown name"):
        run.set(lr=0.1, not_a_knob=1)
    assert run.pending == {}  # a refused change queues nothing
    with pytest.raises(ValueError, match="max_tokens"):
        run.set(max_tokens=99)
    run.set(lr=0.25, temperature=0.5, max_policy_age=2)
    rows = await run.step(1)
    assert (await run.trainer.info.call())[0]["hparams"]["lr"] == 0.25 and rows[0]["lr"] == 0.25
    assert run.sampling_overrides == {"temperature": 0.5} and run.replay_buffer.max_policy_age == 2
    assert run.hparams["lr"] == 0.25 and run.pending == {}
    sets = [e for e in run.metrics.events if e["kind"] == "set"]
    assert sets[-1]["changes"] == {"lr": 0.25, "temperature": 0.5, "max_policy_age": 2}


async def test_a_raising_episode_function_stops_the_run_then_a_fixed_one_continues(run):
    original = run.episode_fn

    async def broken(run_, sample):
        raise RuntimeError("reward service unreachable")

    run.episode_fn = broken
    run.start()
    assert await _until(lambda: run.state == "failed")
    assert "rollout" in run.error and "reward service unreachable" in run.error
    assert await _until(lambda: all(s == "done" for s in run.status()["loops"].values()))
    assert run.ledger()["balanced"]
    run.episode_fn = original
    step = run.current_step
    await run.step(1)
    assert run.current_step == step + 1 and run.error is None


async def test_a_killed_generator_is_respawned_and_catches_up_while_training_goes_on(run):
    run.start()
    victim = run.policy.replicas[0]
    os.kill(victim.mesh.pids[0], signal.SIGKILL)
    assert await _until(lambda: victim.state == "healthy" and victim.restarts >= 1)
    step = run.current_step
    assert await _until(lambda: run.current_step >= step + 2)
    await run.stop()
    assert await run.policy.get_version.fanout() == [run.version, run.version]
    assert run.ledger()["balanced"] and run.health == "ok"


async def test_a_trainer_killed_mid_step_rewinds_to_its_checkpoint(run):
    await run.step(1)
    await run.checkpoint()
    saved_step, saved_version = run.current_step, run.version
    await run.step(2)
    await run.trainer.set_hparams.call(lr=0.25)  # keep lr; the point is a slow enough step to be hit
    run.start()
    await asyncio.sleep(0.2)
    os.kill(run.trainer.replica.mesh.pids[0], signal.SIGKILL)
    assert await _until(lambda: any(e["kind"] == "rewind" for e in run.metrics.events))
    rewind = [e for e in run.metrics.events if e["kind"] == "rewind"][-1]
    assert rewind["checkpoint_step"] == saved_step and rewind["version"] == saved_version
    before_rewind = rewind["step"]
    assert await _until(lambda: run.current_step >= before_rewind + 2)  # numbering goes on, never repeats
    await run.stop()
    assert run.ledger()["balanced"], run.ledger()
    assert (await run.trainer.info.call())[0]["step"] == run.version
    assert await weights.stored_versions(namespace=run.weights_namespace) == [run.version]
    steps = [r["step"] for r in run.metrics.rows]
    assert steps == sorted(set(steps)), "a step number was recorded twice"


def logging_episodes(tag: str):
    """The default episode function, logging one warning per group on the kernel's shared forge_nb logger."""
    from forge_nb.controller.episodes import generate_episode

    async def episode(run, sample):
        logging.getLogger("forge_nb.tests.whose").warning("a group of %s", tag)
        return await generate_episode(run, sample)

    return episode


async def test_two_runs_side_by_side_keep_their_own_weights_and_one_shuts_down_alone(run, tmp_path):
    from forge_nb.widgets import compare

    other = await spawn_light(tmp_path, "light-b", max_policy_age=0, mode="sync")
    assert other.weights_namespace != run.weights_namespace
    view = compare(run, other, metrics=("loss", "reward/mean"))
    episode_fn = run.episode_fn
    run.episode_fn, other.episode_fn = logging_episodes("run-one"), logging_episodes("run-two")
    run.start()
    other.start()
    try:
        assert await _until(lambda: other.current_step >= 3 and run.current_step >= 3)
        # the comparison draws each run's own rows, live, on its own line
        assert await _until(lambda: len(view.curves.trace("light-b/loss").x) >= 3)
        drawn = view.curves.trace("light-b/loss")
        recorded = {r["step"]: r["loss"] for r in other.metrics.rows}
        assert [recorded[int(x)] for x in drawn.x] == pytest.approx(list(drawn.y))
        own, others = (r.dir.logs / "kernel.log" for r in (run, other))
        assert "a group of run-one" in own.read_text() and "a group of run-two" not in own.read_text()
        assert "a group of run-two" in others.read_text() and "a group of run-one" not in others.read_text()
        await other.shutdown()
        assert other.state == "shut down"
        assert await weights.stored_versions(namespace=other.weights_namespace) == []
        step = run.current_step
        assert await _until(lambda: run.current_step >= step + 3)  # the first run trains on
    finally:
        view.close()
        await run.stop()
        run.episode_fn = episode_fn
    assert run.state == "stopped" and run.error is None
    assert run.ledger()["balanced"] and other.ledger()["balanced"]
    assert await weights.stored_versions(namespace=run.weights_namespace) == [run.version]
    assert await run.policy.get_version.fanout() == [run.version, run.version]
    assert not [m for m in forge_nb.meshes() if m.name.startswith("light-b")]
    assert all(r["policy_age/max"] == 0 for r in other.metrics.rows)  # sync, max_policy_age=0: on-policy


async def test_a_second_live_run_with_the_same_name_is_refused_before_spawning(run, tmp_path):
    meshes = len(forge_nb.meshes())
    with pytest.raises(ValueError, match="in use by a live run"):
        await spawn_light(tmp_path, "light")
    assert len(forge_nb.meshes()) == meshes


async def test_step_n_across_a_rewind_records_n_steps_and_never_repeats_a_number(run):
    await run.checkpoint()

    async def kill_trainer_mid_step() -> None:
        await _until(lambda: not run.training_idle.is_set())
        os.kill(run.trainer.replica.mesh.pids[0], signal.SIGKILL)

    first = run.current_step
    killer = asyncio.create_task(kill_trainer_mid_step())
    rows = await run.step(3)
    await killer
    assert any(e["kind"] == "rewind" for e in run.metrics.events[-20:])
    assert [r["step"] for r in rows] == [first + 1, first + 2, first + 3]  # the lost step is not one of the 3
    steps = [r["step"] for r in run.metrics.rows]
    assert steps == sorted(set(steps))
    assert run.ledger()["balanced"]
