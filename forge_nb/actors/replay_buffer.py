"""ReplayBuffer as an actor, for TorchForge code that spawns it: ``ReplayBuffer.options().as_actor(...)``.

forge_nb's own Run keeps its buffer as a plain object in the kernel (``forge_nb.rl.ReplayBuffer``): it
needs no process. This actor wraps the same class so seed code runs unchanged::

    buf = await ReplayBuffer.options(procs=1).as_actor(batch_size=16, max_policy_age=1, collate=collate)
    await buf.add.call_one(episode)
    batch = await buf.sample.call_one(curr_policy_version=3)
"""

from __future__ import annotations

from typing import Any

from monarch.actor import endpoint

from forge_nb.rl import Episode
from forge_nb.rl import ReplayBuffer as _Buffer
from forge_nb.service.actor import ForgeActor


class ReplayBuffer(ForgeActor):
    """The endpoints of ``forge_nb.rl.ReplayBuffer``, in its own process."""

    def __init__(self, **kwargs: Any):
        self._kwargs = kwargs
        self.buffer: _Buffer | None = None

    @endpoint
    async def setup(self) -> None:
        self.buffer = _Buffer(**self._kwargs)  # invalid arguments raise here, where the caller sees them

    @endpoint
    async def add(self, episode: Episode) -> None:
        self._buf().add(episode)

    @endpoint
    async def sample(self, curr_policy_version: int, batch_size: int | None = None) -> Any:
        return self._buf().sample(curr_policy_version, batch_size)

    @endpoint
    async def evict(self, curr_policy_version: int) -> int:
        return self._buf().evict(curr_policy_version)

    @endpoint
    async def clear(self) -> None:
        self._buf().clear()

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

    def _buf(self) -> _Buffer:
        if self.buffer is None:
            raise RuntimeError("the replay buffer is not set up; spawn it with .as_actor(), which runs setup()")
        return self.buffer
