"""A quickstart Run whose trainer samples the rollouts until its vLLM generators serve (controller.lifecycle.stand_in).

The generators here wait behind a gate the test opens (a file beside the run's model), so which source served which
step is the test's choice, not a race: the first steps' episodes are the trainer's, and once the generators serve,
they hold the run's version and serve every later episode.
"""

from __future__ import annotations

import asyncio
import gc
import logging
from pathlib import Path

import pytest
import torch

import forge_nb
from forge_nb.actors.generator import Generator
from forge_nb.controller.lifecycle.stand_in import StandInPolicy
from forge_nb.service import endpoint
from tests.waiting import waiter

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(300)]

GATE = "generators.gate"
_until = waiter(timeout=120.0, interval=0.05)


class GatedGenerator(Generator):
    """A vLLM Generator whose setup waits until a file named ``GATE`` exists beside the model (vLLM's import goes on
    meanwhile, as it starts with the process); ``fail`` in the file: its setup raises instead."""

    @endpoint
    async def setup(self) -> None:
        gate = Path(self._raw["model"]).parent / GATE
        while not gate.exists():
            await asyncio.sleep(0.05)
        if gate.read_text() == "fail":
            raise RuntimeError("this generator was told to fail")
        await Generator.setup._method(self)


def batches(run: forge_nb.Run) -> list[dict]:
    return [r for r in run.metrics.rows if "reward/mean" in r]


async def test_the_first_steps_are_the_trainers_and_later_ones_vllms_at_the_runs_version(tmp_path: Path,
                                                                                         caplog) -> None:
    cfg = forge_nb.quickstart(run_dir=str(tmp_path / "run"))
    with caplog.at_level(logging.INFO, logger="forge_nb"):
        run = await forge_nb.spawn(cfg, progress=False, actors={"policy": GatedGenerator})
    try:
        # the trainer's processes were started before the run's modules were imported, and its replica took them
        # once they had imported the trainer's (controller.lifecycle.prestart)
        said = caplog.messages
        assert any("mesh quickstart-trainer-early: the trainer's imports done" in m for m in said), said
        assert any("mesh quickstart-trainer-r0 taken warm" in m for m in said), said
        assert isinstance(run.policy, StandInPolicy) and not run.policy.serving
        assert [r.state for r in run.status()["services"]["policy"]] == ["starting"]
        await run.step(3)  # the generators wait behind their gate: the trainer sampled every episode
        assert [r["rollout/from_trainer"] for r in batches(run)] == [1.0, 1.0, 1.0]
        assert all(r["policy_age/max"] <= cfg.max_policy_age for r in batches(run))
        sampled = run.episodes(200)
        assert sampled and all(e["served_by"] == "trainer" for e in sampled)
        assert {e["version"] for e in sampled} <= {0, 1, 2, 3}  # the trainer's step when it sampled each
        assert run.version == 3

        async with run.policy.session():  # begun before the generators serve: its calls stay on the trainer
            (Path(run.model).parent / GATE).write_text("open")
            await run.policy.started()
            (turn,) = await run.policy.generate.route("c", n=1)
            assert run.policy.serving and turn.metadata["served_by"] == "trainer"
        (up,) = [e for e in run.metrics.events if e["kind"] == "generators_up"]
        assert up["version"] == run.version  # loaded before the first request reached them
        assert up["trainer_groups"] >= 3 * cfg.batch_size // cfg.group_size
        assert await run.policy.get_version.fanout() == [run.version]
        assert run.policy.serving and [r.version for r in run.policy.replicas] == [run.version]
        # at one version the two samplers read alike: the prompt's ids, and the logprobs of what vLLM sampled
        for prompt in {run.task.sample()["request"] for _ in range(4)}:
            (theirs,) = await run.policy.generate.route(prompt, n=1)
            (mine,) = await run.trainer.generate.call_one(prompt, n=1, max_tokens=cfg.max_res_tokens)
            assert mine.prompt_ids.tolist() == theirs.prompt_ids.tolist()
            assert mine.generator_version == theirs.generator_version == run.version
            assert "served_by" not in theirs.metadata and mine.metadata["served_by"] == "trainer"
            ids = torch.cat([theirs.prompt_ids, theirs.token_ids])[None]
            logprobs = await run.trainer.forward.call_one(ids, len(theirs.prompt_ids))
            torch.testing.assert_close(logprobs[0], theirs.logprobs, atol=1e-4, rtol=1e-4)

        seen = len(run.episodes(10_000))
        await run.step(12)
        later = run.episodes(10_000)[seen:]
        from_vllm = [e for e in later if "served_by" not in e]
        assert from_vllm and all(e["served_by"] == "trainer" for e in later if "served_by" in e)
        assert min(e["version"] for e in from_vllm) >= up["version"]  # never older than what they loaded
        assert "rollout/from_trainer" not in batches(run)[-1]  # the buffer's episodes of the trainer are gone by then
        assert all(r["policy_age/max"] <= cfg.max_policy_age for r in batches(run))
    finally:
        (Path(run.model).parent / GATE).write_text("open")  # a start in flight finishes before its shutdown
        await run.shutdown()


async def test_generators_that_fail_to_start_stop_the_run_with_their_error(tmp_path: Path) -> None:
    cfg = forge_nb.quickstart(run_dir=str(tmp_path / "run"))
    run = await forge_nb.spawn(cfg, progress=False, actors={"policy": GatedGenerator})
    try:
        await run.step(1)  # the trainer's rollouts
        (Path(run.model).parent / GATE).write_text("fail")
        with pytest.raises(RuntimeError, match="told to fail"):
            await run.policy.started()
        with pytest.raises(RuntimeError, match="service 'policy' failed to start: .*told to fail"):
            await run.step(2)
        assert run.state == "failed" and "failed to start" in run.error
        # what the kernel held when the run was made stays out of its full collections until the run's shutdown
        assert gc.get_freeze_count() > 100_000
    finally:
        gate = Path(run.model).parent / GATE
        if not gate.exists():  # a failure before the gate: the start still waiting ends, and so does the shutdown
            gate.write_text("fail")
        await run.shutdown()
    assert forge_nb.live_runs() or gc.get_freeze_count() == 0  # collectable again once no run lives
