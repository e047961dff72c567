"""The light run the failure and hot-change tests share: light actors on real CPU meshes, one per module."""

from __future__ import annotations

from typing import Any

import pytest
import pytest_asyncio

import forge_nb
from forge_nb.config import GeneratorConfig, LoopConfig, TrainerConfig
from tests.light_actors import LightGenerator, LightTrainer


def light_config(run_dir: str, name: str, **overrides: Any) -> forge_nb.RunConfig:
    """Small groups and batches, a 0.3 s reward timeout and a trainer step of 0.3 s (so a step can be caught
    in flight); ``overrides`` replace top-level fields."""
    fields: dict[str, Any] = dict(
        run_dir=run_dir, name=name, max_res_tokens=4, group_size=4, batch_size=8, reward_timeout_s=0.3,
        loop=LoopConfig(rollout_loops=2), generator=GeneratorConfig(num_replicas=2),  # a replica to fail over to
        trainer=TrainerConfig(optimizer={"lr": 0.1}, loss="grpo", loss_config={"beta": 0.0},
                              extra={"step_delay_s": 0.3}))
    return forge_nb.quickstart(**(fields | overrides))


def events(run: forge_nb.Run, kind: str) -> list[dict[str, Any]]:
    return [e for e in run.metrics.events if e["kind"] == kind]


@pytest.fixture(scope="module")
def light_actors() -> dict[str, type]:
    """The actor classes of the module's ``run``; a module overrides this fixture to spawn others."""
    return {"policy": LightGenerator, "trainer": LightTrainer}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def run(tmp_path_factory, light_actors):
    cfg = light_config(str(tmp_path_factory.mktemp("fail")), "light-fail")
    run = await forge_nb.spawn(cfg, progress=False, actors=light_actors)
    yield run
    await run.shutdown()
