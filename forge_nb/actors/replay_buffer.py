"""ReplayBuffer as an actor, for TorchForge code that spawns it: ``ReplayBuffer.options().as_actor(...)``.

forge_nb's own Run keeps its buffer as a plain object in the kernel (``forge_nb.rl.ReplayBuffer``): it
needs no process. This actor wraps the same class so the documents' code runs unchanged::

    buf = await ReplayBuffer.options(procs=1).as_actor(batch_size=2, max_policy_age=1, dp_size=1)
    await buf.add.call_one(episode)                               # or add.route(episode)
    batch = await buf.sample.call_one(curr_policy_version=3)      # None until there are enough episodes
    inputs, targets = batch                                       # or trainer.train_step(batch)

``sample`` returns what ``collate`` makes of the ``dp_size`` lists of episodes; unlike torchforge's actor,
whose default is the raw lists, the default here is ``collate_seed``, a ``SeedBatch`` (one inputs and one
targets dict per rank), because the documents unpack every batch as ``inputs, targets`` without passing
a collate. Pass ``collate=None`` for the raw lists of episodes. ``sample()`` without a version evicts
nothing; episodes without a version or an advantage are handled as ``forge_nb.rl.ReplayBuffer`` says.

With ``snapshot_path=...`` the buffer survives its process: every call that changes it writes a snapshot
(atomically, before the call returns), and a respawned actor restores it in ``setup()``. So nothing a
call returned for is lost; a call in flight when the process died raises ``ReplicaDied`` to its caller
(actors do not retry), which is how the caller counts what did not make it. ``restored()`` says what
came back (episodes and the cumulative counters, so ``counters["added"]`` can be checked against the
caller's own count).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from monarch.actor import endpoint

from forge_nb.rl import Episode, collate_seed
from forge_nb.rl import ReplayBuffer as _Buffer
from forge_nb.service.actor import ForgeActor


class ReplayBuffer(ForgeActor):
    """The endpoints of ``forge_nb.rl.ReplayBuffer``, in its own process."""

    def __init__(self, snapshot_path: str | None = None, collate: Any = collate_seed, **kwargs: Any):
        self._kwargs = {"collate": collate, **kwargs}
        self._snapshot = Path(snapshot_path) if snapshot_path else None
        self._restored: dict[str, Any] | None = None
        self.buffer: _Buffer | None = None

    @endpoint
    async def setup(self) -> None:
        self.buffer = _Buffer(**self._kwargs)  # invalid arguments raise here, where the caller sees them
        if self._snapshot is not None and self._snapshot.exists():
            from forge_nb.rundir import load_plain

            state = load_plain(self._snapshot)
            self.buffer.load_state_dict(state["buffer"])
            self._restored = {"path": str(self._snapshot), "episodes": len(self.buffer),
                              "counters": self.buffer.counters(),
                              "snapshot_age_s": round(time.time() - state["time"], 3)}

    @endpoint
    async def add(self, episode: Episode) -> None:
        self._buf().add(episode)
        self._save()

    @endpoint
    async def sample(self, curr_policy_version: int | None = None, batch_size: int | None = None) -> Any:
        """``dp_size`` lists of ``batch_size`` episodes through ``collate``, or None when too few."""
        batch = self._buf().sample(curr_policy_version, batch_size)
        self._save()
        return batch

    @endpoint
    async def evict(self, curr_policy_version: int) -> int:
        n = self._buf().evict(curr_policy_version)
        self._save()
        return n

    @endpoint
    async def clear(self) -> None:
        self._buf().clear()
        self._save()

    @endpoint
    async def restored(self) -> dict[str, Any] | None:
        """What ``setup()`` restored from the snapshot (path, episodes, counters, age), or None."""
        return self._restored

    @endpoint
    async def length(self) -> int:
        return len(self._buf())

    @endpoint
    async def counters(self) -> dict[str, int]:
        return self._buf().counters()

    @endpoint
    async def state_dict(self) -> dict[str, Any]:
        return self._buf().state_dict()

    @endpoint
    async def load_state_dict(self, state: dict[str, Any]) -> None:
        self._buf().load_state_dict(state)

    def _save(self) -> None:
        if self._snapshot is None:
            return
        import torch

        self._snapshot.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._snapshot.with_name(self._snapshot.name + ".tmp")
        torch.save({"buffer": self._buf().state_dict(), "time": time.time()}, tmp)
        os.replace(tmp, self._snapshot)  # a process killed mid-write leaves the previous snapshot whole

    def _buf(self) -> _Buffer:
        if self.buffer is None:
            raise RuntimeError("the replay buffer is not set up; spawn it with .as_actor(), which runs setup()")
        return self.buffer
