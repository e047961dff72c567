"""A Generator whose vLLM engine a test can break from outside: what a crash inside vLLM looks like.

``break_engine()`` asks the engine's worker (in the actor's process on CPU) to drop its model, so the
engine's next step raises inside vLLM itself: the failure the Generator must survive by ending its
process (the service then respawns the replica). Nothing of vLLM is replaced; the engine really fails.
"""

from __future__ import annotations

from typing import Any

from monarch.actor import endpoint

from forge_nb.actors.generator import Generator


def _drop_model(worker: Any) -> None:
    worker.model_runner.model = None


class BreakableGenerator(Generator):
    @endpoint
    async def break_engine(self) -> None:
        await self._require_engine("break_engine").collective_rpc(_drop_model)
