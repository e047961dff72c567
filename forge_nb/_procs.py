"""Process helpers for the runtime: is a pid alive (zombies count as dead), kill with a grace period, a
reaper that kills a mesh's process groups when the kernel dies, and removal of what dead processes left
in folders named by pid."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path


def stat_fields(pid: int | str) -> list[str]:
    """The fields of ``/proc/<pid>/stat`` after the command name (which may hold spaces and parentheses):
    ``[0]`` state, ``[1]`` parent pid, ``[11]`` user and ``[12]`` system CPU in clock ticks. OSError when
    there is no such process."""
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs. A zombie counts as dead; we never reap (monarch waits on its children)."""
    try:
        return stat_fields(pid)[0] != "Z"
    except (OSError, IndexError):
        return False


class StoppedWatch:
    """Which processes have been stopped (SIGSTOP or a debugger: state T/t) for ``after_s`` or longer.

    A stopped process is alive to ``pid_alive`` yet answers nothing, so whoever waits on it (a weight
    fanout, a route) waits forever; the runtime's watchdog treats one stopped this long as hung."""

    def __init__(self, after_s: float):
        self.after_s = after_s
        self._since: dict[int, float] = {}

    def hung(self, pid: int) -> bool:
        try:
            stopped = stat_fields(pid)[0] in ("T", "t")
        except (OSError, IndexError):
            stopped = False
        if not stopped:
            self._since.pop(pid, None)
            return False
        first = self._since.setdefault(pid, time.monotonic())
        return time.monotonic() - first >= self.after_s


def remove_left_by_dead(root: Path) -> list[Path]:
    """Delete the entries of ``root`` named ``<pid>`` or ``<pid>-...`` whose process is gone (files and
    folders alike): what a killed process could not clean up itself. Returns what was deleted."""
    removed = []
    for path in root.iterdir() if root.is_dir() else []:
        pid = path.name.split("-", 1)[0]
        if pid.isdigit() and not pid_alive(int(pid)):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:
                path.unlink(missing_ok=True)
            removed.append(path)
    return removed


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


# A shell loop, in its own session (so a kill of the kernel's process group spares it). While the
# kernel lives (a zombie is dead: its parent may be slow to reap it) and any of the groups still has a
# member, it waits; once the kernel is gone, it SIGKILLs the groups. PR_SET_PDEATHSIG takes a mesh proc
# along with a killed kernel, but not what the proc started (vLLM's engine and workers), which is
# re-parented to init and would otherwise run on.
_REAPER = """
while [ -r /proc/{kernel}/status ] && ! grep -q '^State:.Z' /proc/{kernel}/status; do
  alive=
  for g in {groups}; do kill -0 -$g 2>/dev/null && alive=1; done
  [ -n "$alive" ] || exit 0
  sleep {period}
done
for g in {groups}; do kill -9 -$g 2>/dev/null; done
"""


def start_reaper(pgids: list[int], period: float = 0.5) -> subprocess.Popen[bytes] | None:
    """Start a process that SIGKILLs the process groups ``pgids`` if this process dies, however it dies.

    It ends by itself once the groups are empty; ``Mesh.stop`` ends it at once (the groups are killed
    there). Returns None when there is no group to watch (never this process's own group)."""
    own = os.getpgid(0)
    groups = [g for g in pgids if g > 1 and g != own]
    if not groups:
        return None
    script = _REAPER.format(kernel=os.getpid(), groups=" ".join(map(str, groups)), period=period)
    return subprocess.Popen(["/bin/sh", "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True)


def stop_reaper(reaper: subprocess.Popen[bytes] | None) -> None:
    if reaper is not None and reaper.poll() is None:
        reaper.kill()
        reaper.wait(timeout=5)
