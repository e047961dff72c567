"""A real quickstart Run (2 vLLM CPU generator replicas, a trainer, torchstore) driven as cells drive it.

One Run is shared by the module (spawning it costs ~40 s); tests run in file order and each leaves
it paused. Every assertion is about behaviour a notebook user sees: steps, versions, metrics,
events, episodes, errors.
"""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest
import pytest_asyncio

import forge_nb
from forge_nb.rl import Episode
from tests.waiting import waiter

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(600), pytest.mark.asyncio(loop_scope="module")]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def run(tmp_path_factory):
    import time

    from forge_nb.system.processes.leftovers import engine_patterns, orphaned

    started = time.time()
    cfg = forge_nb.quickstart(run_dir=str(tmp_path_factory.mktemp("run")))
    from tests.actors_for_tests import BreakableGenerator

    run = await forge_nb.spawn(cfg, overrides={"generator.num_replicas": 2}, progress=False,  # one to kill
                               actors={"policy": BreakableGenerator})  # and one engine to break
    await run.policy.started()  # the trainer samples until they serve (stand_in); these tests are about them
    yield run
    await run.shutdown()
    from forge_nb.system.runtime import registry

    assert registry.meshes() == [], "shutdown left meshes behind"
    # the tests killed generators, engines and the trainer: nothing of theirs may be left in /dev/shm or /tmp
    left = [p for p in orphaned(engine_patterns(), min_age_s=0) if p.stat().st_mtime >= started]
    assert left == [], f"killed engines left {len(left)} file(s), e.g. {left[:3]}"


_until = waiter(timeout=240.0, interval=0.1)


async def test_each_engine_makes_its_rendezvous_file_in_its_generator_s_own_folder(run):
    """vLLM puts an engine's torch.distributed rendezvous file (``vllm_dist_*``, open in no process) in the
    temporary folder: each generator points that at its own folder, named by its pid, which goes with the process
    however it ends, so no clean-up has to guess whose such a file in the machine's /tmp is."""
    from forge_nb.system.processes.procs import SOCKETS_ROOT

    pids = [p for r in run.status()["services"]["policy"] for p in r.pids]
    assert len(pids) == 2
    for pid in pids:
        assert list((SOCKETS_ROOT / str(pid)).glob("vllm_dist_*")), sorted((SOCKETS_ROOT / str(pid)).iterdir())


async def test_step_trains_exactly_n_steps_and_versions_move_everywhere(run):
    rows = await run.step(3)
    assert [r["step"] for r in rows] == [1, 2, 3] and run.state == "paused"
    assert run.version == 3 and all(math.isfinite(r["loss"]) for r in rows)
    assert await run.policy.get_version.fanout() == [3, 3]  # every generator replica loaded version 3
    assert {s.version for s in run.policy.status()} == {3}
    for key in ("reward/mean", "reward/min", "reward/max", "entropy", "grad_norm", "response_len/mean",
                "policy_age/mean", "tokens_per_s/generate", "tokens_per_s/train", "weight_sync_s", "buffer/size"):
        assert key in rows[-1], key
    assert all(r["policy_age/max"] <= run.config.max_policy_age for r in rows)
    await asyncio.sleep(1.0)
    assert run.current_step == 3  # paused means paused


async def test_background_loops_keep_training_while_cells_run(run):
    start = run.current_step
    run.start()
    assert await _until(lambda: run.current_step >= start + 2)
    run.pause()
    await asyncio.sleep(3)  # the step in flight finishes, then nothing more
    paused_at = run.current_step
    await asyncio.sleep(2)
    assert run.current_step == paused_at and run.state == "paused"
    run.resume()
    assert await _until(lambda: run.current_step > paused_at)
    run.pause()


async def test_set_applies_at_the_next_step_boundary_and_is_recorded(run):
    with pytest.raises(ValueError, match="hot-changeable"):
        run.set(learning_rate=1.0)
    with pytest.raises(ValueError, match="max_res_tokens"):
        run.set(max_tokens=999)
    with pytest.raises(ValueError, match="use_reference=True"):  # a KL penalty without a reference model
        run.set(beta=0.05)
    assert run.pending == {}  # a refused change queues nothing
    run.set(lr=2e-3, temperature=0.7)  # the recipe's lr is 1e-3
    await run.step(1)
    (event,) = [e for e in run.metrics.events if e["kind"] == "set"][-1:]
    assert event["changes"] == {"lr": 2e-3, "temperature": 0.7}
    assert run.hparams["lr"] == 2e-3 and run.sampling_overrides["temperature"] == 0.7
    assert run.metrics.last("lr") == pytest.approx(2e-3)  # the trainer stepped with it


async def test_episodes_are_inspectable(run):
    eps = run.episodes(10)
    assert 0 < len(eps) <= 10
    first = eps[-1]
    assert set(first) >= {"prompt", "response", "target", "reward", "advantage", "version"}
    assert first["prompt"] in run.task.alphabet and 0.0 <= first["reward"] <= 1.0
    assert all(e["version"] == 0 for e in run.episodes(1000, version=0))
    assert all(e["reward"] >= 0.5 for e in run.episodes(1000, min_reward=0.5))


async def test_sync_mode_is_on_policy_from_the_same_episode_function(run):
    run.config.loop.mode = "sync"
    run.set(max_policy_age=0)
    rows = await run.step(2)
    assert all(r["policy_age/max"] == 0 for r in rows)
    run.config.loop.mode = "async"
    run.set(max_policy_age=forge_nb.quickstart().max_policy_age)  # the fixture's again


async def test_custom_episode_function_curriculum_and_multi_task(run):
    """The seeds' patterns: a curriculum raising difficulty, and two tasks sampled in turn."""
    from forge_nb.controller import generate_episode

    seen: list[tuple[str, int]] = []

    async def curriculum_episode(run, sample) -> list[Episode]:
        # multi-task: every other group comes from a second, harder task
        task = "long" if len(seen) % 2 else "short"
        if task == "long":
            sample = {"request": sample["request"] * 2, "target": (sample["request"] * 4)[:4]}
        seen.append((task, run.task.difficulty))
        return await generate_episode(run, sample)

    run.episode_fn = curriculum_episode
    run.set(difficulty=2)  # curriculum step, applied at the boundary
    for _ in range(8):  # the first steps may train what the buffer held: step until two groups were made
        await run.step(1)
        if len(seen) >= 2:
            break
    run.episode_fn = generate_episode
    assert {t for t, _ in seen} == {"short", "long"}
    assert any(d == 2 for _, d in seen)


async def test_a_loop_that_raises_stops_the_run_with_its_error(run):
    async def broken(run, sample):
        raise ZeroDivisionError("my episode function has a bug")

    run.episode_fn = broken
    # what the earlier tests left in the buffer could make a whole step (CI's run stepped on it and never raised)
    run.clear_buffer("this step must be made of new episodes")
    with pytest.raises(RuntimeError, match="ZeroDivisionError: my episode function has a bug"):
        await run.step(1)
    assert run.state == "failed" and "rollout" in run.error
    assert [e for e in run.metrics.events if e["kind"] == "error"]
    # the training step in flight when the rollout failed finished before its loop was cancelled
    assert await _until(lambda: not any(s == "running" for s in run.status()["loops"].values()), timeout=60)
    assert run.ledger()["balanced"], run.ledger()
    from forge_nb.controller import generate_episode

    run.episode_fn = generate_episode  # fixed: the run continues
    before = run.current_step
    await run.step(1)
    assert run.current_step == before + 1 and run.state == "paused" and run.error is None


async def test_a_starved_trainer_says_so(run):
    async def stuck(run, sample):
        await asyncio.sleep(3600)

    run.episode_fn = stuck
    run.clear_buffer("the test wants a trainer with nothing to train on")
    run.config.loop.starved_after_s = 0.5
    run.start()
    assert await _until(lambda: any(e["kind"] == "starved" for e in run.metrics.events), timeout=30)
    await run.stop(timeout=5)
    from forge_nb.controller import generate_episode

    run.episode_fn = generate_episode
    run.config.loop.starved_after_s = 60.0


async def test_sft_warm_start_has_the_same_controls_then_rl_goes_on(run):
    with pytest.raises(ValueError, match="non-empty text"):
        await run.sft([{"request": "c", "response": ""}])
    assert run.mode == "rl"  # a refused switch changes nothing
    await run.sft([{"request": "c", "response": "cccc"}], batch_size=4)
    version = run.version
    rows = await run.step(4)
    assert [r.get("sft") for r in rows] == [1.0] * 4 and run.state == "paused"
    assert run.version == version + 4 and await run.policy.get_version.fanout() == [run.version] * 2
    assert all(math.isfinite(r["loss"]) for r in rows) and "reward/mean" not in rows[-1]
    assert rows[-1]["loss"] < rows[0]["loss"]  # one example, four optimizer steps: it is learned
    run.set(lr=2e-3)  # hot changes apply to SFT steps too
    (row,) = await run.step(1)
    assert row["lr"] == pytest.approx(2e-3)
    await run.rl()
    (row,) = await run.step(1)
    assert "sft" not in row and "reward/mean" in row and run.mode == "rl"
    assert [e["mode"] for e in run.metrics.events if e["kind"] == "mode"][-2:] == ["sft", "rl"]


async def test_generator_killed_mid_rollout_at_seeded_times_loses_nothing(run):
    import os
    import random
    import signal

    rng = random.Random(1234)
    rolled_back = run.ledger()["rolled_back"]
    unbalanced: list[dict] = []

    async def audit() -> None:  # the books add up at every moment, mid-step and mid-respawn included
        while True:
            if not (ledger := run.ledger())["balanced"]:
                unbalanced.append(ledger)
            await asyncio.sleep(0.02)

    auditor = asyncio.create_task(audit())
    run.start()
    try:
        for _ in range(2):
            await asyncio.sleep(rng.uniform(1.0, 4.0))
            victim = run.policy.replicas[rng.randrange(2)]
            assert await _until(lambda v=victim: v.state == "healthy")
            os.kill(victim.mesh.pids[0], signal.SIGKILL)
            assert await _until(lambda v=victim: v.state == "healthy" and v.restarts >= 1)
        steps = run.current_step
        assert await _until(lambda: run.current_step >= steps + 2)  # training went on
        await run.stop()
    finally:
        auditor.cancel()
    ledger = run.ledger()
    assert ledger["balanced"] and ledger["in_step"] == 0, ledger
    assert not unbalanced, unbalanced[:3]
    assert ledger["rolled_back"] == rolled_back, ledger  # no rewind: no episode may be dropped as one
    assert await run.policy.get_version.fanout() == [run.version, run.version]  # came back current
    assert run.health == "ok"


async def test_all_generators_killed_the_run_is_down_then_continues(run):
    import os
    import signal

    run.start()
    for replica in run.policy.replicas:
        os.kill(replica.mesh.pids[0], signal.SIGKILL)
    assert await _until(lambda: run.health == "down", timeout=10)
    steps = run.current_step
    assert await _until(lambda: run.health == "ok" and run.current_step >= steps + 2)
    await run.stop()
    assert run.ledger()["balanced"] and run.state == "stopped"


async def test_a_dead_engine_in_a_live_generator_process_is_respawned(run):
    """On CPU vLLM's engine runs inside the generator's process: when it fails (here its worker drops its
    model, so vLLM's next step raises), the actor still answers but cannot generate. The generator ends
    its process on the engine's death, so the service respawns it."""
    victim = run.policy.replicas[0]
    restarts = victim.restarts
    await victim.actor.break_engine.call_one()
    run.start()
    assert await _until(lambda: victim.restarts == restarts + 1 and victim.state == "healthy")
    steps = run.current_step
    assert await _until(lambda: run.current_step >= steps + 2)  # training went on
    await run.stop()
    assert run.state == "stopped" and run.ledger()["balanced"], run.ledger()
    assert await run.policy.get_version.fanout() == [run.version, run.version]


async def test_an_update_that_reaches_only_some_replicas_mixes_no_stale_versions(run):
    """A frozen generator misses weight updates (found hung, by the request timeout or by the watchdog that
    sees it stopped, it is killed and respawned) while the other takes them: training goes on, and no batch
    holds an episode older than max_policy_age."""
    import os
    import signal

    victim = run.policy.replicas[1]
    restarts, first = victim.restarts, len(run.metrics.rows)
    rolled_back = run.ledger()["rolled_back"]
    run.policy.options.request_timeout = 5.0
    try:
        run.start()
        await asyncio.sleep(1.0)
        os.kill(victim.mesh.pids[0], signal.SIGSTOP)  # alive but answering nothing, weight updates included
        assert await _until(lambda: victim.restarts == restarts + 1 and victim.state == "healthy")
        steps = run.current_step
        assert await _until(lambda: run.current_step >= steps + 2)
        await run.stop()
    finally:
        run.policy.options.request_timeout = 300.0
    reasons = [str(e.get("reason")) for e in run.metrics.events if e["kind"] == "replica"]
    assert any("request_timeout" in r or "SIGSTOP" in r for r in reasons), reasons
    rows = run.metrics.rows[first:]
    assert rows and all(r["policy_age/max"] <= run.config.max_policy_age for r in rows if "policy_age/max" in r)
    assert run.ledger()["balanced"], run.ledger()
    # the replica that took each update made version v+1 while the update waited for the frozen one:
    # those episodes are good, not made by weights a rewind took back
    assert run.ledger()["rolled_back"] == rolled_back, run.ledger()


async def test_trainer_killed_mid_step_rewinds_to_its_last_checkpoint(run):
    import os
    import signal

    await run.step(1)
    await run.checkpoint()
    saved_step, saved_version = run.current_step, run.version
    await run.step(2)
    run.start()
    await asyncio.sleep(0.5)
    os.kill(run.trainer.replica.mesh.pids[0], signal.SIGKILL)
    assert await _until(lambda: any(e["kind"] == "rewind" for e in run.metrics.events))
    rewind = [e for e in run.metrics.events if e["kind"] == "rewind"][-1]
    assert rewind["checkpoint_step"] == saved_step and rewind["version"] == saved_version
    assert await _until(lambda: run.current_step >= rewind["step"] + 2)  # training goes on; numbers never repeat
    await run.stop()
    assert run.trainer.replica.restarts == 1
    assert run.ledger()["balanced"], run.ledger()
    # no optimizer step counted twice: the trainer's step is the run's version
    assert (await run.trainer.info.call())[0]["step"] == run.version


async def test_trainer_killed_between_steps_rewinds_too(run):
    """Killed while no step is in flight, the trainer is respawned with its last checkpoint before the next
    call, which then succeeds: the run still rewinds to that checkpoint, visibly (seen in a CI-like run)."""
    import os
    import signal

    await run.step(1)
    await run.checkpoint()
    saved_step, saved_version = run.current_step, run.version
    await run.step(1)
    replica = run.trainer.replica
    restarts = replica.restarts
    os.kill(replica.mesh.pids[0], signal.SIGKILL)
    assert await _until(lambda: replica.restarts == restarts + 1 and replica.state == "healthy")
    (row,) = await run.step(1)
    rewind = [e for e in run.metrics.events if e["kind"] == "rewind"][-1]
    assert (rewind["checkpoint_step"], rewind["version"]) == (saved_step, saved_version)
    assert row["step"] == saved_step + 2 and run.version == saved_version + 1  # the step number goes on
    assert (await run.trainer.info.call())[0]["step"] == run.version  # no optimizer step lost or doubled
    assert run.ledger()["balanced"], run.ledger()


async def test_checkpoint_then_resume_in_a_fresh_run_keeps_history(run):
    run.start()
    await run.step(1)
    await run.sft([{"request": "c", "response": "cccc"}], batch_size=4)  # checkpointed in SFT mode
    await run.checkpoint()
    version = run.version
    await run.step(1)  # one step after the checkpoint: resume shows it as a rewind
    path = run.dir.path
    rows_before = len(run.metrics.rows)
    assert run._assembly.parts() == [  # the order shutdown closes the run's parts in, loops first, its log last
        ("loops", "loops"), ("services", "policy"), ("services", "trainer"), ("weights", "weights"),
        ("records", "state"), ("records", "leftovers"), ("records", "the kernel's heap frozen"), ("log", "kernel log")]
    await run.shutdown()

    last_step = run.current_step
    again = await forge_nb.resume(path, progress=False)
    try:
        assert (again.current_step, again.version) == (last_step, version)  # numbering goes on; weights went back
        assert len(again.metrics.rows) == rows_before  # history intact
        kinds = [e["kind"] for e in again.metrics.events]
        assert "rewind" in kinds and kinds[-1] == "resume"
        assert again.mode == "rl" and "checkpointed during SFT" in again.metrics.events[-1]["message"]
        assert await again.policy.get_version.fanout() == [version, version]
        resumed = (await again.trainer.info.call())[0]["resumed"]  # read once, by the resume, not again
        assert resumed["checked"] == "by the resume, before the trainer started", resumed
        assert Path(resumed["path"]).name == f"step_{version:08d}"
        rows = await again.step(1)
        assert rows[-1]["step"] == last_step + 1 and again.version == version + 1
    finally:
        await again.shutdown()


async def test_damaged_checkpoints_are_skipped_by_name_and_none_whole_refuses_before_spawning(run):
    """The module's run directory holds the checkpoints the tests above made. The newest has a tensor file cut
    short, the one before lost its trainer folder's commit marker: resume comes back from the third, says
    why it skipped each, and sets them aside. With that one damaged too, resume refuses before spawning."""
    from forge_nb.rundir import CheckpointsDamaged
    from forge_nb.system.runtime import registry

    checkpoints = run.dir.checkpoints
    states = sorted(checkpoints.glob("state_*.pt"))
    assert len(states) == 3, sorted(p.name for p in checkpoints.iterdir())
    versions = [int(p.stem.split("_")[1]) for p in states]
    newest, second, third = (checkpoints / f"step_{v:08d}" for v in reversed(versions))
    shard = next(newest.glob("*.distcp"))
    size = shard.stat().st_size
    shard.write_bytes(shard.read_bytes()[: size // 2])  # as a full disk or a bad copy leaves it
    (second / "COMMITTED.json").unlink()

    again = await forge_nb.resume(run.dir.path, progress=False)
    try:
        assert again.version == versions[0]  # the third newest, the newest whole one
        info = (await again.trainer.info.call())[0]
        assert info["step"] == versions[0]
        assert info["resumed"]["checked"] == "by the resume, before the trainer started", info["resumed"]
        skipped = [e for e in again.metrics.events if e["kind"] == "checkpoint_skipped"]
        assert [e["reason"] for e in skipped] == [
            f"trainer checkpoint {newest.name}: {shard.name} is {size // 2} bytes; {size} were written",
            f"trainer checkpoint {second.name}: no commit marker (COMMITTED.json): its write did not finish"]
        assert [e["path"] for e in skipped] == [str(p) for p in reversed(states[1:])]
        assert not newest.exists() and (checkpoints / f"{newest.name}.skipped").is_dir()  # set aside, kept
        await again.step(1)
        assert again.version == versions[0] + 1 and again.ledger()["balanced"], again.ledger()
    finally:
        await again.shutdown()

    (checkpoints / f"step_{versions[0]:08d}" / ".metadata").unlink()
    before = len(registry.meshes())
    with pytest.raises(CheckpointsDamaged, match=rf"no whole checkpoint to resume from; state_{versions[0]:08d}.pt: "
                       rf"trainer checkpoint step_{versions[0]:08d}: .metadata is missing\. Nothing was spawned"):
        await forge_nb.resume(run.dir.path, progress=False)
    assert len(registry.meshes()) == before
