"""Failures that say what is wrong, in bounded space, and leave the run able to go on (issue 21, 2 and 3),
on real CPU meshes with the light actors of tests/light_actors.py.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest

from tests.controller.conftest import events as _events
from tests.waiting import waiter

pytestmark = [pytest.mark.timeout(300), pytest.mark.asyncio(loop_scope="module")]

_until = waiter(timeout=60.0, interval=0.02)


def _raises(prompt, response, target):
    raise KeyError("the grader's answer table has no entry " + prompt)


def _nan(prompt, response, target):
    return float("nan")


@pytest.mark.parametrize(("failure", "says"), [(_raises, "KeyError"), (_nan, "returned the non-finite number nan")],
                         ids=["raises", "nan"])
async def test_a_reward_that_always_fails_pauses_the_run_naming_it_in_a_few_events(run, failure, says):
    good = list(run.reward_fns)

    def broken_reward(prompt, response, target):
        return failure(prompt, response, target)

    # Stopping cancels the rollouts in flight and reports what was quarantined so far, so groups of an
    # earlier step cannot land (or be reported) in the middle of this test's counts.
    await run.stop()
    run.reward_fns[:] = [broken_reward]
    quarantined_before, reports_before = run.ledger()["quarantined"], len(_events(run, "quarantine"))
    try:
        with pytest.raises(RuntimeError, match="broken_reward") as raised:
            await run.step(2)
        assert "quarantined" in str(raised.value) and says in str(raised.value)
        assert run.state == "paused" and "broken_reward" in run.error
        assert _events(run, "quarantine_pause")
        await run.stop()  # groups still generating when the run paused land or are cancelled; all reported
        reports = _events(run, "quarantine")[reports_before:]
        quarantined = run.ledger()["quarantined"] - quarantined_before
        assert quarantined >= 32 and len(reports) <= 3, (quarantined, len(reports))  # counts, not one per episode
        assert sum(r["episodes"] for r in reports) == quarantined
        assert run.ledger()["balanced"]
    finally:
        run.reward_fns[:] = good
    rows = await run.step(1)  # fixed: it goes on at once, and the window starts afresh
    assert len(rows) == 1 and run.error is None


async def test_an_async_reward_that_never_returns_times_out_and_quarantines(run):
    good = list(run.reward_fns)

    async def stuck_reward(prompt, response, target):
        await asyncio.Event().wait()

    run.reward_fns[:] = [stuck_reward]
    before = run.ledger()["quarantined"]
    try:
        run.start()
        assert await _until(lambda: run.ledger()["quarantined"] >= before + 4)
        run.pause()
    finally:
        run.reward_fns[:] = good
    await run.stop()
    reasons = [last for r in _events(run, "quarantine") for last in r["last"].values()]
    assert any("did not return within 0.3 s" in text for text in reasons), reasons


async def test_a_change_the_trainer_refuses_rolls_back_and_the_run_trains_on(run):
    lr = run.hparams["lr"]
    run.set(lr=50.0)  # the config allows it; this trainer refuses it when it applies
    rows = await run.step(2)
    assert len(rows) == 2 and run.state == "paused" and run.error is None
    refused = _events(run, "set_refused")[-1]
    assert refused["changes"] == {"lr": 50.0} and "more than this trainer takes" in refused["reason"]
    assert run.hparams["lr"] == lr and rows[-1]["lr"] == lr


async def test_fixing_a_failed_run_during_a_step_in_flight_goes_on_at_once(run):
    original = run.episode_fn

    async def broken(run_, sample):
        raise RuntimeError("environment service unreachable")

    run.start()
    assert await _until(lambda: not run.training_idle.is_set())  # a training step is in flight
    run.episode_fn = broken
    assert await _until(lambda: run.state == "failed")
    run.episode_fn = original  # fixed while the failed loops are still stopping
    step = run.current_step
    rows = await asyncio.wait_for(run.step(2), 60)
    assert len(rows) == 2 and run.current_step >= step + 2 and run.error is None
    assert set(run.status()["loops"].values()) == {"running"}  # the new loops, not cancelled by the old failure
    await run.stop()
    assert run.ledger()["balanced"]


async def test_a_stopped_generator_does_not_stall_training(run):
    run.start()
    await run.step(1)
    run.start()
    victim = run.policy.replicas[0]
    pid = victim.mesh.pids[0]
    step = run.current_step
    stopped_at = time.monotonic()
    os.kill(pid, signal.SIGSTOP)
    try:
        assert await _until(lambda: run.current_step >= step + 2)
        stall = time.monotonic() - stopped_at
        assert await _until(lambda: victim.restarts >= 1 and victim.state == "healthy")
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass
    print(f"training took 2 steps {stall:.1f} s after a generator was stopped (target: within 5 s)")
    await run.stop()
    assert run.ledger()["balanced"] and run.health == "ok"
