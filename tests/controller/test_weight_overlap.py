"""The generators load a version while the next step trains (async mode), never in sync mode, and a
parked run's generators hold its version: light actors on real CPU meshes, the load slowed to 0.5 s.
The trainer hands each push's manifest on to generators whose ``update_weights`` takes ``manifest=``
(the controller then puts it in torchstore in the background) and calls the others as the documents
do (LightGenerator has no such keyword)."""

from __future__ import annotations

import pytest

import forge_nb
from forge_nb.config import GeneratorConfig, LoopConfig
from forge_nb.controller import weight_sync
from forge_nb.weights.shm import shm_root
from tests.controller.conftest import light_config
from tests.light_actors import HandedLightGenerator, LightGenerator, LightTrainer

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.timeout(300)]

LOAD_S = 0.5  # each generator's update_weights; a light train_step takes 0.3 s


def began_during_a_load(rows: list[dict], spans: list[list[tuple[float, float]]]) -> list[int]:
    """Steps whose train_step began while some generator was loading weights."""
    return [r["step"] for r in rows if any(a < r["started_at"] < b for replica in spans for a, b in replica)]


async def test_async_steps_train_while_generators_load_and_sync_steps_wait(tmp_path) -> None:
    cfg = light_config(str(tmp_path), "overlap", max_policy_age=1,
                       generator=GeneratorConfig(num_replicas=2, engine_args={"update_delay_s": LOAD_S}))
    run = await forge_nb.spawn(cfg, progress=False, actors={"policy": LightGenerator, "trainer": LightTrainer})
    try:
        assert run.config.loop.mode == "async"
        rows = await run.step(6)
        # parked: every generator has the run's version, and only that version is left in the store
        assert await run.policy.get_version.fanout() == [run.version] * 2 and run.version == 6
        assert await forge_nb.weights.stored_versions(namespace=run.weights_namespace) == [run.version]
        overlapped = began_during_a_load(rows, await run.policy.get_update_spans.fanout())
        assert overlapped, f"no async step began while the generators loaded: {[r['started_at'] for r in rows]}"
        assert all(r["policy_age/max"] <= 1 for r in rows)  # max_policy_age still holds

        run.config.loop.mode = "sync"  # lockstep: a step begins only once every generator has the last version
        rows = await run.step(4)
        assert began_during_a_load(rows, await run.policy.get_update_spans.fanout()) == []
        assert await run.policy.get_version.fanout() == [run.version] * 2 and run.version == 10
        assert await run.trainer.unannounced_pushes.call_one() == 0  # these generators were never handed one
    finally:
        await run.shutdown()


async def test_generators_that_take_the_manifest_are_handed_it(tmp_path, monkeypatch) -> None:
    # one put of a handed manifest per hour: after the first, only settle() (the parked run) puts one
    monkeypatch.setattr(weight_sync, "ANNOUNCE_EVERY_S", 3600.0)
    cfg = light_config(str(tmp_path), "handed", max_policy_age=1)
    run = await forge_nb.spawn(cfg, progress=False, actors={"policy": HandedLightGenerator, "trainer": LightTrainer})
    try:
        await run.step(4)
        # every version reached both replicas by its manifest: none asked torchstore where it was
        assert await run.policy.get_handed.fanout() == [[1, 2, 3, 4]] * 2
        assert await run.policy.get_version.fanout() == [4, 4]
        # the controller, not the trainer, puts the manifests in the store: version 1 at once, versions 2 and 3
        # never (superseded within the hour), 4 when the run parked. Parked, the store holds the run's version,
        # and only it, and the files of the versions that never entered the store are gone too.
        assert await run.trainer.unannounced_pushes.call_one() == 4
        assert run._sync.store_puts == 2
        namespace = run.weights_namespace
        assert await forge_nb.weights.stored_versions(namespace=namespace) == [4]
        files = sorted(p.name.split("-", 1)[1] for p in shm_root().glob(f"*-{namespace}.v*.bin"))
        assert files == [f"{namespace}.v4.bin"]
        with await forge_nb.weights.open_version(4, namespace=namespace) as state_dict:  # found through the store
            assert state_dict
    finally:
        await run.shutdown()


async def test_a_sync_interval_loads_every_nth_version_and_the_parked_runs_own(tmp_path) -> None:
    # the skill card's training.sync_interval: versions 2 and 4 load as the run trains, 1 and 3 are held
    # (never pushed), and the run parked after step 5 pushes and loads its version 5
    cfg = light_config(str(tmp_path), "interval", max_policy_age=2,
                       loop=LoopConfig(rollout_loops=2, sync_interval=2))
    run = await forge_nb.spawn(cfg, progress=False, actors={"policy": HandedLightGenerator, "trainer": LightTrainer})
    try:
        rows = await run.step(5)
        assert await run.policy.get_handed.fanout() == [[2, 4, 5]] * 2
        assert await run.trainer.unannounced_pushes.call_one() == 3  # pushes of 2, 4 and 5 only
        assert await run.policy.get_version.fanout() == [5, 5] and run.version == 5
        assert await forge_nb.weights.stored_versions(namespace=run.weights_namespace) == [5]
        assert all(r["policy_age/max"] <= 2 for r in rows), [r["policy_age/max"] for r in rows]
        assert [r["version"] for r in rows] == [1, 2, 3, 4, 5]  # a held version is the run's all the same
        assert ["time/push_s" in r for r in rows] == [False, True, False, True, False]
        assert rows[0]["weight_sync_s"] == 0.0 < rows[1]["weight_sync_s"]

        rows = await run.step(1)  # from the parked version 5: 6 is held, and pushed when the run parks again
        assert await run.policy.get_handed.fanout() == [[2, 4, 5, 6]] * 2
    finally:
        await run.shutdown()
