"""A one-endpoint actor the runtime spawns on every mesh to learn its pids (imports monarch)."""

import os

from monarch.actor import Actor, endpoint


class ProcInfo(Actor):
    """Answers with its pid so the kernel can account for, and if need be kill, every proc."""

    @endpoint
    async def pid(self) -> tuple[int, int]:
        """(pid, process group): the group also holds whatever this proc starts (e.g. vLLM's engine)."""
        return os.getpid(), os.getpgid(0)
