"""Hot changes: hyperparameters a cell changes while the run trains, applied at the next step boundary.

Which names can change, and where each applies, is declared once on the config's fields
(``forge_nb.config.hot_fields``): "trainer" (sent to the trainer's ``set_hparams``: lr, max_norm,
the loss's fields), "sampling" (the generators' request overrides: temperature, top_p, max_tokens)
or "run" (the replay buffer's ``max_policy_age``, the task's ``difficulty``). ``queue`` validates
and records the change as pending (a value the config refuses raises there, in the cell); the
training loop calls ``apply(step)`` between steps, and every applied change is recorded in the run's
metrics as a "set" event at that step.

A change the config allows may still be refused where it applies: by the trainer's ``set_hparams``, or
by vLLM, which reads sampling values only when a request comes. So ``apply`` first sends one cheap
request (one answer, to :data:`PROBE_PROMPT`) with the new sampling values to one generator, then the
trainer's part; if either raises, nothing of the change applies, a "set_refused" event says why, and
the run trains on with the values it had.
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

from forge_nb.config import RunConfig, check_change, trainer_changes
from forge_nb.metrics import MetricsStore
from forge_nb.service import ActorFailure, ReplicaDied
from forge_nb.service.errors import last_line

logger = logging.getLogger(__name__)

PROBE_PROMPT = "Hello"
"""The prompt of the request that tries new sampling values on one generator before rollouts use them."""


class HotChanges:
    """Pending and current values of the hot-changeable hyperparameters of one run."""

    def __init__(self, config: RunConfig, routes: dict[str, str], values: dict[str, Any], *, trainer: Any,
                 buffer: Any, task: Any, metrics: MetricsStore, policy: Any = None):
        self.routes, self.values = dict(routes), dict(values)
        self.pending: dict[str, Any] = {}
        self.sampling: dict[str, Any] = {}  # what rollouts pass to generate(), on top of the config
        self._config, self._trainer, self._buffer, self._task, self._metrics = config, trainer, buffer, task, metrics
        self._policy = policy
        self._lock = asyncio.Lock()

    def _check(self, name: str, value: Any) -> None:
        """The config's verdict on ``run.set(name=value)``, a loss field checked with the loss's other fields."""
        check_change(self._config, name, value, task=self._task, current=self.values,
                     loss_fields=[n for n, where in self.routes.items() if where == "trainer"])

    def queue(self, changes: dict[str, Any]) -> dict[str, Any]:
        """Validate ``changes`` (nothing is queued if one is wrong) and keep them for the next boundary."""
        unknown = sorted(set(changes) - set(self.routes))
        if unknown:
            raise ValueError(f"run.set(): unknown name(s) {unknown}; hot-changeable: {sorted(self.routes)}")
        for name, value in changes.items():
            self._check(name, value)
        self.pending.update(changes)
        return dict(self.pending)

    async def apply(self, step: int) -> dict[str, Any]:
        """Apply what is pending, recorded at ``step``; serialized, so a step never starts while earlier changes
        are applied."""
        async with self._lock:
            if not self.pending:
                return {}
            changes, self.pending = self.pending, {}
            sampling = {k: v for k, v in changes.items() if self.routes[k] == "sampling"}
            try:
                if sampling and self._policy is not None:
                    await self._policy.generate.route(PROBE_PROMPT, **(self.sampling | sampling | {"n": 1}))
            except ActorFailure as error:  # the generator died, not the values: try again at the next boundary
                logger.warning("run.set(%s): the generator trying the new sampling values failed (%s); "
                               "the change stays pending", changes, error)
                self.pending = changes | self.pending
                return {}
            except Exception as error:  # vLLM refused a value: nothing of the change applies, the run goes on
                self._refused(changes, "generator: " + last_line(error), step)
                return {}
            trainer_part = trainer_changes(changes, self.routes)  # temperature too: its logprobs follow it
            if trainer_part:
                try:
                    await self._trainer.set_hparams.call(**trainer_part)
                except ReplicaDied:
                    raise  # the run's recovery handles a dead trainer; the change stays unapplied
                except Exception as error:  # refused: nothing of the change applies, the run goes on
                    self._refused(changes, "trainer: " + last_line(error), step)
                    return {}
            self.sampling.update(sampling)
            for name, value in changes.items():
                if name == "max_policy_age":
                    self._buffer.max_policy_age = int(value)
                elif name == "difficulty":
                    self._task.difficulty = int(value)
            self.values.update(changes)
            self._metrics.event("set", step=step, changes=changes)
            return changes

    def _refused(self, changes: dict[str, Any], reason: str, step: int) -> None:
        run = self._config.name
        logger.warning("run %s: run.set(%s) was refused and not applied: %s", run, changes, reason)
        self._metrics.event("set_refused", step=step, changes=changes, reason=reason[:500])
        # the cell that called run.set returned long ago: one line where the user looks, the run trains on
        made = ", ".join(f"{k}={v!r}" for k, v in changes.items())
        print(f"forge_nb: run {run!r}: run.set({made}) was refused and rolled back; the run trains on with the old "
              f"values. Why: {reason[:300]}", file=sys.stderr)
