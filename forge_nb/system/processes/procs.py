"""Process helpers for the runtime: is a pid alive (zombies count as dead), kill with a grace period, a
reaper that kills a mesh's process groups when the kernel dies, and removal of what killed processes left:
the shared-memory segments only they used, and what is named by their pid in forge_nb's folders.

A SIGKILLed process runs no clean-up, so whoever kills it cleans after it: :func:`kill_groups` reads which
segments the group's processes map before it kills them and removes those no other process uses (vLLM's
``psm_*`` message queues, hundreds of MB of apparent size each), and the reaper, once the kernel is gone,
also removes the kernel's and the procs' folders (a generator's sockets and rendezvous file) and weight files.
What these miss (a reaper that was itself killed) goes at the next spawn or shutdown
(``forge_nb.system.processes.leftovers``).

Which processes live, their parents, states and start times come from psutil. Which files a process maps
or holds open is read from ``/proc/<pid>/maps`` and ``fd`` directly: psutil's ``memory_maps()`` parses
``smaps`` (tens of ms a process, and :func:`kill_groups` asks every process of the machine) and its
``open_files()`` leaves out what is not a regular file.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from pathlib import Path

import psutil

SHM = Path("/dev/shm")
#: Where each generator process's vLLM sockets go, in a folder named by its pid (forge_nb.actors.generator).
SOCKETS_ROOT = Path(tempfile.gettempdir()) / "forge_nb-vllm"
#: Shared-memory files a killed process leaves: Python's ``shared_memory`` segments (vLLM's message queues)
#: and multiprocessing's named semaphores.
SEGMENTS = ("psm_*", "sem.mp-*")


def weight_files_root() -> Path:
    """Where forge_nb's weight files are (``forge_nb.weights.shm.shm_root()``; here without torch: the reaper
    and the leftovers' clean-up read it)."""
    return Path(os.environ.get("FORGE_NB_SHM_DIR", "/dev/shm/forge_nb"))


def started(pid: int) -> float | None:
    """When ``pid`` started (psutil's ``create_time``), or None if there is no such process. With the pid it
    names one process for good: pids are reused, start times are not (compare them with :func:`same_start`)."""
    try:
        return psutil.Process(pid).create_time()
    except (psutil.Error, ValueError):
        return None


def same_process(pid: int, start: float | None) -> bool:
    """True while ``pid`` is alive and is the process that started at ``start`` (not a later one that got its
    pid); with ``start`` None, only whether ``pid`` is alive."""
    return pid_alive(pid) and (start is None or same_start(started(pid), start))


def same_start(a: float | None, b: float | None) -> bool:
    """Whether two :func:`started` times are one process's: to the second, as the time since the epoch moves
    with the clock's adjustments (NTP), while a pid is never handed out again within a second of its start."""
    return a is not None and b is not None and abs(a - b) < 1.0


def status(pid: int) -> str | None:
    """psutil's state of ``pid`` (``psutil.STATUS_*``: "running", "sleeping", "stopped", "zombie", ...), or
    None if there is no such process."""
    try:
        return psutil.Process(pid).status()
    except (psutil.Error, ValueError):
        return None


def pid_alive(pid: int) -> bool:
    """True while ``pid`` runs. A zombie counts as dead; we never reap (monarch waits on its children)."""
    return status(pid) not in (None, psutil.STATUS_ZOMBIE)


def _running(process: psutil.Process) -> bool:
    try:
        return process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def live_children(root: int, recursive: bool = False) -> list[psutil.Process]:
    """The live (not zombie) children of ``root`` (with ``recursive``, every process under it)."""
    try:
        found = psutil.Process(root).children(recursive=recursive)
    except (psutil.Error, ValueError):
        return []
    return [p for p in found if _running(p)]


def descendants(root: int) -> dict[int, str]:
    """Every live process under ``root`` -> its command line (what a kernel started, for a listing or a test)."""
    found = {}
    for child in live_children(root, recursive=True):
        try:
            found[child.pid] = " ".join(child.cmdline()).strip()
        except psutil.Error:  # gone meanwhile
            continue
    return found


class StoppedWatch:
    """Which processes have been stopped (SIGSTOP or a debugger: state T/t) for ``after_s`` or longer.

    A stopped process is alive to ``pid_alive`` yet answers nothing, so whoever waits on it (a weight
    fanout, a route) waits forever; the runtime's watchdog treats one stopped this long as hung."""

    def __init__(self, after_s: float):
        self.after_s = after_s
        self._since: dict[int, float] = {}

    def hung(self, pid: int) -> bool:
        if status(pid) not in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
            self._since.pop(pid, None)
            return False
        first = self._since.setdefault(pid, time.monotonic())
        return time.monotonic() - first >= self.after_s


def files_in_use(pids: Iterable[int | str] | None = None) -> set[str]:
    """Every file some live process (of ``pids``; None: any) maps or holds open (those this user may look at).

    A file of :data:`SHM` counts by its inode: ``sem_open`` (multiprocessing's named semaphores) maps a
    temporary file and then links it to its name, so its creator's mapping names a deleted file."""
    used: set[str] = set()
    shm = _shm_names()
    for entry in os.listdir("/proc") if pids is None else map(str, pids):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/maps") as f:
                for line in f:
                    fields = line.split(None, 5)
                    if len(fields) == 6 and "/" in fields[5]:
                        path = fields[5].strip()
                        used.add(shm.get(int(fields[4]), path) if path.startswith(f"{SHM}/") else path)
        except (OSError, ValueError):
            pass
        try:
            for fd in os.listdir(f"/proc/{entry}/fd"):
                used.add(os.readlink(f"/proc/{entry}/fd/{fd}"))
        except OSError:
            pass
    return {path.removesuffix(" (deleted)") for path in used}


def _shm_names() -> dict[int, str]:
    """The files in :data:`SHM` by inode."""
    names = {}
    for path in SHM.iterdir() if SHM.is_dir() else []:
        try:
            names[path.lstat().st_ino] = str(path)
        except OSError:
            continue
    return names


def remove_left_by_dead(root: Path, pids: Iterable[int] | None = None) -> list[Path]:
    """Delete the entries of ``root`` named ``<pid>`` or ``<pid>-...`` whose process is gone (files and
    folders alike; only those of ``pids`` when given): what a killed process could not clean up itself.
    Returns what was deleted."""
    only = None if pids is None else set(map(str, pids))
    removed = []
    for path in root.iterdir() if root.is_dir() else []:
        pid = path.name.split("-", 1)[0]
        if pid.isdigit() and (only is None or pid in only) and not pid_alive(int(pid)):
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


def group_members(pgids: Iterable[int]) -> list[int]:
    """The live processes of the process groups ``pgids``."""
    groups, members = set(pgids), []
    for pid in psutil.pids():
        try:
            if os.getpgid(pid) in groups and pid_alive(pid):
                members.append(pid)
        except OSError:
            continue
    return members


def kill_groups(pgids: list[int], leaders: dict[int, float | None] | None = None,
                tracker_wait_s: float = 2.0) -> list[int]:
    """SIGKILL whole process groups: what a dead proc's children (vLLM's engine and workers) still share;
    then remove the shared-memory segments that only they used. Returns the processes it killed.

    A monarch proc leads its own group; the processes it starts inherit it and are re-parented when it
    dies, so only the group still names them. Never this process's own group. A segment is removed once
    no process outside the groups maps it or holds it open (removing one the dying processes still map
    is harmless: its memory goes when the last of them is gone).

    The groups are stopped first (nothing forks or maps meanwhile), then every member but Python's
    multiprocessing resource trackers is killed. A tracker unlinks the named semaphores and segments its
    processes registered once they are all gone, and only it still knows them when its proc died first
    (a killed kernel's procs die by PDEATHSIG before the reaper looks): so the trackers are let go on and
    get ``tracker_wait_s`` to finish before the groups are killed whole.

    ``leaders`` maps a group to its leader's start (:func:`started`, taken at spawn). Linux hands out a pid
    again only once no process or group uses it, so a process holding a group's pid that started at
    another time means the group ended and the pid now names someone else's process (a browser, a
    server started in its own session): that group is left alone. Without this check a mesh stopped long
    after its proc died killed whatever got the pid (on a 2-core box with pid_max 32768 the test suite
    saw its own browser killed).
    """
    groups = _still_ours(pgids, leaders)
    _signal_groups(groups, signal.SIGSTOP)
    members = group_members(groups)
    theirs = {path for path in map(Path, files_in_use(members))
              if path.parent == SHM and any(path.match(pattern) for pattern in SEGMENTS)}
    trackers = [pid for pid in members if _is_resource_tracker(pid)]
    for pid in members:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT if pid in trackers else signal.SIGKILL)
    deadline = time.monotonic() + tracker_wait_s
    while any(pid_alive(p) for p in trackers) and time.monotonic() < deadline:
        time.sleep(0.02)
    _signal_groups(groups, signal.SIGKILL)
    if theirs:
        others = [pid for pid in psutil.pids() if pid not in members]
        for path in theirs - set(map(Path, files_in_use(others))):
            path.unlink(missing_ok=True)
    return members


def _signal_groups(pgids: Iterable[int], sig: int) -> None:
    for pgid in pgids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)


def _is_resource_tracker(pid: int) -> bool:
    """Whether ``pid`` is a Python multiprocessing resource tracker (it runs ``-c "from
    multiprocessing.resource_tracker import main; ..."``)."""
    try:
        return any("multiprocessing.resource_tracker" in arg for arg in psutil.Process(pid).cmdline())
    except psutil.Error:
        return False


def _still_ours(pgids: list[int], leaders: dict[int, float | None] | None) -> list[int]:
    """The groups of ``pgids`` a kill may hit: not this process's own, not one whose pid was reused."""
    own, leaders = os.getpgid(0), leaders or {}
    return [g for g in pgids if g > 1 and g != own and not _taken_over(g, leaders.get(g))]


def _taken_over(pgid: int, start: float | None) -> bool:
    """Whether the pid ``pgid`` now names a process other than the group's leader that started at ``start``."""
    if start is None:
        return False
    now = started(pgid)
    return now is not None and not same_start(now, start)


def reap(kernel: int, pgids: list[int], wait_s: float = 10.0, leaders: dict[int, float | None] | None = None) -> None:
    """The reaper's last act once the kernel is gone: kill the groups (and remove their segments, see
    :func:`kill_groups`), wait for them to be gone, then remove the socket folders and weight files named
    by the kernel or the groups' leaders (the procs). Groups whose pid now names another process are left
    alone (see :func:`kill_groups`)."""
    killed = kill_groups(pgids, leaders)
    deadline = time.monotonic() + wait_s
    while any(pid_alive(p) for p in killed) and time.monotonic() < deadline:
        time.sleep(0.05)
    for root in (SOCKETS_ROOT, weight_files_root()):
        remove_left_by_dead(root, [kernel, *pgids])


# A shell loop, in its own session (so a kill of the kernel's process group spares it). While the
# kernel lives (a zombie is dead: its parent may be slow to reap it) and any of the groups still has a
# member, it waits (a shell costs next to nothing all the kernel's life); once the kernel is gone, it runs
# :func:`reap` in the kernel's interpreter. Every signal that may kill goes through reap, which checks
# that a group's pid still names the proc that led it: the shell only probes (kill -0; a reused group
# keeps it waiting, no more). Only if that interpreter cannot run at all does the shell SIGKILL the
# groups unchecked. PR_SET_PDEATHSIG takes a mesh proc along with a killed kernel, but not what the proc
# started (vLLM's engine and workers), which is re-parented to init and would otherwise run on.
#
# A round waits in bash's builtin ``read -t`` on the read end of a pipe whose write end only the kernel
# holds (:func:`_life_pipe`): it ends after ``period``, or at once when the kernel ends however it ends
# (its files close, and the read sees the end of the pipe). Every probe is a builtin, so a round starts
# no program: ``sleep`` in each round cost 2.5 ms of CPU a second per mesh (20 s measured on the project's
# machine), and ``grep`` before it more, on the cores the run trains on. The kernel's liveness is still
# probed each round (a child the kernel forked without exec holds the write end too). A killed kernel's
# files close before it turns zombie, so the end of the pipe can come while /proc still shows it running:
# the reaper then gives it up to 2 s to finish. After the pipe ended with the kernel alive past that (its
# end closed by mistake), rounds wait with ``sleep``, as they do where bash is missing.
_REAPER = """
kernel_lives() {{
  [ -r /proc/{kernel}/status ] || return 1
  while read -r key state _; do
    [ "$key" = State: ] && {{ [ "$state" != Z ]; return; }}
  done < /proc/{kernel}/status
  return 0
}}
ended={ended}
while kernel_lives; do
  alive=
  for g in {groups}; do kill -0 -$g 2>/dev/null && alive=1; done
  [ -n "$alive" ] || exit 0
  if [ -z "$ended" ]; then
    read -r -t {period} -u {life} _
    if [ $? -le 128 ]; then
      ended=1
      n=0
      while [ $n -lt 40 ] && kernel_lives; do sleep 0.05; n=$((n + 1)); done
    fi
  else
    sleep {period}
  fi
done
{reap} 2>/dev/null || for g in {groups}; do kill -9 -$g 2>/dev/null; done
"""

_pipe: tuple[int, int, int] | None = None  # (this process's pid, the read end, the write end)


def _life_pipe() -> int:
    """The read end of a pipe whose write end this process holds open all its life (made once per
    process; both ends close on exec, so the procs it starts do not hold the write end). Both ends are
    above the standard streams: a process started with stdin or stdout closed gets fd 0 or 1 from
    ``os.pipe()``, which the reaper's own stdin would replace, or where this process's prints would go."""
    global _pipe
    if _pipe is None or _pipe[0] != os.getpid():  # a forked child makes its own
        ends = []
        for fd in os.pipe():
            ends.append(fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3))
            os.close(fd)
        _pipe = (os.getpid(), *ends)
    return _pipe[1]


def start_reaper(pgids: list[int], period: float = 0.5,
                 leaders: dict[int, float | None] | None = None) -> subprocess.Popen[bytes] | None:
    """Start a process that SIGKILLs the process groups ``pgids`` if this process dies, however it dies.

    It ends by itself once the groups are empty; ``Mesh.stop`` ends it at once (the groups are killed
    there). Returns None when there is no group to watch (never this process's own group)."""
    own = os.getpgid(0)
    groups = [g for g in pgids if g > 1 and g != own]
    if not groups:
        return None
    kernel, package_parent = os.getpid(), str(Path(__file__).resolve().parents[1])
    code = (f"import sys; sys.path.insert(0, {package_parent!r}); from forge_nb.system.processes.procs import reap; "
            f"reap({kernel}, {groups!r}, leaders={leaders or {}!r})")
    bash = shutil.which("bash")
    life = _life_pipe()
    script = _REAPER.format(kernel=kernel, groups=" ".join(map(str, groups)), period=period, life=life,
                            ended="" if bash else "1", reap=shlex.join([sys.executable, "-c", code]))
    return subprocess.Popen([bash or "/bin/sh", "-c", script], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, start_new_session=True, close_fds=True, pass_fds=(life,))


def stop_reaper(reaper: subprocess.Popen[bytes] | None) -> None:
    if reaper is not None and reaper.poll() is None:
        reaper.kill()
        reaper.wait(timeout=5)
