"""Steps a run takes outside its own loops: a caller that drives the trainer itself (the Tinker API's ``optim_step``,
``forge_nb.tinker``) records each step as a row of the run, and pushes the weights when it asks for them.

Such a run is switched to the mode "outside" (:func:`drive_from_outside`): ``start()`` / ``resume()`` start no loops
and mark it running, ``pause()`` marks it paused, and the caller waits for :func:`calls_allowed` before each call,
so ``%forge_pause`` holds the outside calls at their next boundary and ``%forge_resume`` lets them go on.

A step from outside counts as the run's next step and carries ``source/<name>`` = 1 in its row (the run's own
steps carry none), so the dashboard draws it on the same curves and the rows say where each came from. It takes
nothing from the replay buffer: the run's ledger is left as it is.
"""

from __future__ import annotations

from typing import Any

__all__ = ["calls_allowed", "drive_from_outside", "publish_now", "record_outside_sample", "record_outside_step"]


async def drive_from_outside(ctl: Any) -> None:
    """Stop the run's loops for good (at a step boundary) and mark it running: from now on a caller drives it."""
    await ctl.switch("outside")
    ctl.start()


async def calls_allowed(ctl: Any) -> None:
    """Return once the run is running (at once, unless ``pause()`` holds it); a run shut down is a RuntimeError."""
    ctl.require_not_shut_down()
    await ctl._running.wait()
    ctl.require_not_shut_down()


def record_outside_step(ctl: Any, values: dict[str, Any], source: str) -> int:
    """Record ``values`` as the run's next step, trained by ``source``; returns the step's number."""
    if ctl.mode != "outside":
        raise RuntimeError(f"run {ctl.name!r} trains with its own loops (mode {ctl.mode!r}); a {source} step needs "
                           "a run driven from outside (drive_from_outside)")
    ctl.step += 1
    ctl.metrics.record(ctl.step, {**values, f"source/{source}": 1.0, "version": ctl.sync.version})
    return ctl.step


async def publish_now(ctl: Any) -> int:
    """Push the trainer's weights as the run's next version and load them on every generator now; returns it."""
    ctl.require_not_shut_down()
    version = ctl.sync.version + 1
    await ctl.sync.publish(version)
    ctl.metrics.event("weights", version=version, source="outside")
    return version


def record_outside_sample(ctl: Any, sample_id: str, prompt: str, completion: Any, source: str) -> None:
    """Show a completion a caller sampled (a Tinker ``sample``) among the run's recent episodes, where
    ``run.episodes()`` and the explorer read them: no reward, no advantage, never trained by the run's loops."""
    ctl.recent.append({"episode_id": sample_id, "prompt": prompt, "response": completion.text, "target": None,
                       "reward": None, "advantage": None, "version": completion.generator_version,
                       "quarantine": None, "source": source})
