"""Process helpers for the runtime: is a pid alive (zombies count as dead), and kill with a grace period."""

from __future__ import annotations

import os
import signal
import time


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs. A zombie counts as dead; we never reap (monarch waits on its children)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def kill_pids(pids: list[int], grace: float) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.05)
    for pid in pids:
        if pid_alive(pid):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def kill_groups(pgids: list[int]) -> None:
    """SIGKILL whole process groups: what a dead proc's children (vLLM's engine and workers) still share.

    A monarch proc leads its own group; the processes it starts inherit it and are re-parented when it
    dies, so only the group still names them. Never this process's own group.
    """
    own = os.getpgid(0)
    for pgid in pgids:
        if pgid > 1 and pgid != own:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
