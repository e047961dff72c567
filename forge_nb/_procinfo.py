"""A one-endpoint actor the runtime spawns on every mesh to learn its pids (imports monarch)."""

import os

from monarch.actor import Actor, endpoint


class ProcInfo(Actor):
    """Answers with its pid so the kernel can account for, and if need be kill, every proc."""

    @endpoint
    async def pid(self) -> int:
        return os.getpid()
