"""The supervised ("sft") loop of a run, mixed into ``Controller``.

It is the training loop's twin with ``sft_data`` batches in place of episodes: the same step boundary
(pause, step budget, hot changes), the same weight publish after every step and the same step rows,
so a run can switch between RL and SFT with one set of controls. It uses the Controller's
``_step_boundary``, ``_skipped``, ``_publish``, ``_record_step``, ``_step_budget_spent`` and
``recover_trainer``, which is why it is a mixin and not a class of its own.
"""

from __future__ import annotations

import time
from typing import Any

from forge_nb.service import ReplicaDied


class SupervisedLoop:
    """``_sft_loop``: supervised steps with the RL loop's controls (see the module docstring)."""

    sft_data: Any
    trainer: Any
    training_idle: Any

    async def _sft_loop(self) -> None:
        """Supervised steps on ``sft_data`` with the RL loop's controls; every step's weights are published."""
        try:
            while True:
                if not await self._step_boundary():
                    continue
                if await self._sft_one_step():  # a step lost with the trainer's process is not counted
                    await self._step_budget_spent()
        finally:
            self.training_idle.set()

    async def _sft_one_step(self) -> bool:
        t0 = time.perf_counter()
        try:
            results = await self.trainer.sft_step.call(self.sft_data.next_batch())
        except ReplicaDied as error:
            await self.recover_trainer(str(error))
            return False
        out = {**results[0].metrics, "sft": 1.0}
        t1 = time.perf_counter()
        if not self._skipped(out) and not await self._publish(out):
            return False
        await self._record_step(out, t0, t1, 0.0)
        return True
