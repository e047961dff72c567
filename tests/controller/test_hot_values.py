"""Hot changes are validated when they are made (issue 21, 2), through the public API on real CPU meshes with
the light actors of tests/light_actors.py: a value the config refuses raises in the cell and queues nothing;
a value the generator refuses when it applies rolls back with an event; temperature 0 samples greedily.
"""

from __future__ import annotations

import pytest
import pytest_asyncio

import forge_nb
from forge_nb.config import GeneratorConfig
from tests.controller.conftest import events, light_config
from tests.light_actors import LightGenerator, LightTrainer
from tests.light_actors_noisy import PickyGenerator

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="module")]


@pytest.fixture(scope="module")
def light_actors() -> dict[str, type]:
    return {"policy": PickyGenerator, "trainer": LightTrainer}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def greedy(tmp_path_factory):
    """A run that samples greedily: one answer per prompt at temperature 0."""
    cfg = light_config(str(tmp_path_factory.mktemp("greedy")), "light-greedy", group_size=1,
                       generator=GeneratorConfig(num_replicas=1, sampling_params={"temperature": 0}))
    run = await forge_nb.spawn(cfg, progress=False, actors={"policy": LightGenerator, "trainer": LightTrainer})
    yield run
    await run.shutdown()


WRONG = [
    ({"lr": -1}, r"run\.set\(lr=-1\): optimizer\.lr=-1: must be a positive number"),
    ({"lr": "abc"}, r"run\.set\(lr='abc'\): optimizer\.lr='abc': must be a positive number"),
    ({"max_policy_age": -1}, r"run\.set\(max_policy_age=-1\): RunConfig\.max_policy_age=-1: must be an integer >= 0"),
    ({"temperature": 0}, r"run\.set\(temperature=0\): temperature=0 with group_size=4: temperature 0 is greedy "
                         r"sampling.*Use a temperature > 0.*group_size=1"),
]


@pytest.mark.parametrize(("change", "message"), WRONG, ids=[str(c) for c, _ in WRONG])
async def test_a_wrong_value_raises_at_once_queues_nothing_and_the_run_steps_on(run, change, message):
    await run.step(1)  # paused from here on: a change applies at once
    before, pending = run.hparams, run.pending
    with pytest.raises(ValueError, match=message):
        run.set(weight_decay=0.01, **change)  # the valid part of the call is not queued either
    assert run.pending == pending == {}
    rows = await run.step(1)
    assert len(rows) == 1 and run.state == "paused" and run.error is None
    held = (await run.trainer.info.call())[0]["hparams"]["weight_decay"]
    assert run.hparams == before and held == before["weight_decay"] != 0.01
    assert not events(run, "set_refused")


async def test_a_sampling_value_the_generator_refuses_rolls_back_and_the_run_trains_on(run):
    run.set(top_p=0.3)  # the config allows it; this generator refuses it when it applies
    rows = await run.step(2)
    assert len(rows) == 2 and run.state == "paused" and run.error is None
    refused = events(run, "set_refused")[-1]
    assert refused["changes"] == {"top_p": 0.3}
    assert refused["reason"].startswith("generator: ") and "below what this engine serves" in refused["reason"]
    assert run.hparams["top_p"] == 1.0 and "top_p" not in run.sampling_overrides
    run.set(top_p=0.9, temperature=0.8)  # a value it serves applies, to the generators and the trainer
    await run.step(1)
    assert run.sampling_overrides == {"top_p": 0.9, "temperature": 0.8}
    assert (await run.trainer.info.call())[0]["hparams"]["temperature"] == 0.8
    assert events(run, "set")[-1]["changes"] == {"top_p": 0.9, "temperature": 0.8}


async def test_temperature_zero_samples_greedily_with_groups_of_one(greedy):
    assert greedy.hparams["temperature"] == 0
    assert (await greedy.trainer.info.call())[0]["hparams"]["temperature"] == 0.0
    greedy.set(temperature=0)
    rows = await greedy.step(2)
    assert len(rows) == 2 and greedy.error is None and not events(greedy, "set_refused")
    assert events(greedy, "set")[-1]["changes"] == {"temperature": 0}
    assert all(e["advantage"] == 0.0 for e in greedy.episodes())  # a group of one has nothing to compare
    with pytest.raises(ValueError, match=r"run\.set\(temperature=0\.7\): RunConfig\.group_size=1: GRPO compares"):
        greedy.set(temperature=0.7)
    assert greedy.pending == {}
