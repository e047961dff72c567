"""A run's checkpoints and the way back to one: saving, resuming, and rewinding when the trainer dies.

``Checkpoints`` is a part of ``Controller`` (its base class): these methods run on the controller's own state
(step, buffer, ledger, hot changes, weight versions, run directory) and are called from its training loop
at a step boundary, from ``Run.checkpoint`` and from the build of a resumed run. They are apart from the
loops because they answer a different question: what a checkpoint holds and how a run gets back to one,
whether the user resumes it or the trainer's service respawned a dead trainer from its last checkpoint.
"""

from __future__ import annotations

import logging
from typing import Any

from forge_nb.system.diskspace import full_disk_as

logger = logging.getLogger(__name__)

__all__ = ["Checkpoints"]


class Checkpoints:
    """Checkpoint, resume, restore and rewind of the run a ``Controller`` drives (see the module docstring)."""

    step: int
    mode: str
    name: str
    _rewound_to: list[int]
    _trainer_failures_seen: int
    trainer: Any
    buffer: Any
    ledger: Any
    hot: Any
    sync: Any
    metrics: Any
    dir: Any

    async def checkpoint(self) -> str:
        """Trainer checkpoint, buffer snapshot, ledger and counters, in the run directory (DiskFull, saying so)."""
        with full_disk_as(self.dir.checkpoints, f"the checkpoint of version {self.sync.version}",
                          self.dir.checkpoint_bytes()):
            path = (await self.trainer.save_checkpoint.call(self.sync.version))[0]
            self.dir.save_state(self.sync.version, path, step=self.step, buffer=self.buffer.state_dict(),
                                hparams=self.hot.values, ledger=self.ledger.state_dict(), mode=self.mode)
        self.metrics.event("checkpoint", path=path, version=self.sync.version)
        return path

    async def resume_from(self, state: dict[str, Any] | None) -> None:
        """A resumed run goes on from ``state``, a checkpoint's (None: the initial weights). Step numbers go on from
        the last recorded row: steps after the checkpoint are a "rewind" event, trained again, not renumbered."""
        recorded, said = self.metrics.step, {}
        if state is None:
            self.step = recorded
            said["message"] = "no checkpoint yet: starting from the initial weights"
        else:
            await self.restore(state)
            if recorded > int(state["step"]):
                self.metrics.event("rewind", checkpoint_step=int(state["step"]), version=self.sync.version,
                                   message=f"steps {int(state['step']) + 1}..{recorded} came after the last "
                                           f"checkpoint: their weights are gone; training goes on from version "
                                           f"{self.sync.version} as step {recorded + 1}")
            said["version"] = self.sync.version
            if state.get("mode") == "sft":  # the SFT examples live in the notebook, not in the checkpoint
                said["message"] = ("checkpointed during SFT: the run resumes in RL mode; `await run.sft(examples)` "
                                   "goes on with supervised steps")
                logger.warning("resume %s: %s", self.name, said["message"])
        self.metrics.event("resume", from_step=self.step, **said)

    async def restore(self, state: dict[str, Any]) -> None:
        """Buffer, ledger and hot changes from a checkpoint's state; the trainer republishes its weights."""
        self.step = max(int(state["step"]), self.metrics.step)
        self.buffer.load_state_dict(state["buffer"])
        self.ledger.load_state_dict(state.get("ledger", {}))
        if state.get("hparams"):
            self.hot.queue(state["hparams"])
            await self.hot.apply(self.step)
        await self.sync.publish(int(state["version"]))

    async def recover_trainer(self, reason: str) -> None:
        """The trainer died. Its service respawns it and it loads its last complete checkpoint (or its
        initial weights); the run rewinds to that point, visibly, and goes on."""
        self.metrics.event("trainer_died", step=self.step, reason=reason[:300])
        info = (await self.trainer.info.call())[0]  # waits for the respawned, restored trainer
        self._trainer_failures_seen = self._trainer_failures()
        checkpoint_step = int((self.dir.load_state() or {"step": 0})["step"])
        from_version, version = self.sync.version, int(info["step"])
        self._rewound_to.append(version)
        self.clear_buffer("made by weights the rewind took back")
        await self.sync.publish(version)
        # step numbers go on (a row's step never repeats); the version says where the weights went back to
        self.metrics.event("rewind", checkpoint_step=checkpoint_step, from_version=from_version, version=version,
                           message=f"the trainer restarted from its last complete checkpoint (step {checkpoint_step}, "
                                   f"version {version}); the weights of versions {version + 1}..{from_version} are "
                                   "gone and training goes on from there")

    def _trainer_failures(self) -> int:
        return sum(r.failures for r in self.trainer.replicas)
