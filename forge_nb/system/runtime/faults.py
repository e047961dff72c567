"""What notices that a process of a mesh died: monarch's fault hook, replaced, and a pid watchdog.

* A dead process is *recorded* for the mesh's owner instead of killing the kernel. Monarch's default
  ``unhandled_fault_hook`` calls ``sys.exit(1)``, which reaches a notebook as a KeyboardInterrupt in whatever
  cell is running; :func:`fault_hook` takes its place (``forge_nb.system.runtime.lifecycle`` installs it the first
  time the runtime starts) and hands the failure to the mesh that owns the actor, on the kernel's event loop.
* A dead process is noticed within about half a second. Monarch's own supervision polls every 10 s (its
  ``HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY``, read when monarch is imported), so the watchdog, a task on the
  kernel's loop, checks the recorded pids every ``WATCHDOG_PERIOD_S``. A faster monarch poll would not be
  needed and would cost: every poll leaves native memory in the kernel for good
  (``forge_nb.system.runtime.lifecycle.MONARCH_ENV_DEFAULTS``). It also fails every mesh of a job's host
  that was lost (``forge_nb.system.hosts.cluster``), and kills a process stopped (SIGSTOP) for ``STOPPED_HANG_S``.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from forge_nb.system.hosts import cluster
from forge_nb.system.processes.procs import StoppedWatch, kill_groups, same_process
from forge_nb.system.runtime import registry
from forge_nb.system.runtime.registry import Failure

logger = logging.getLogger(__name__)

#: How often the watchdog looks at every recorded pid (a /proc read each).
WATCHDOG_PERIOD_S = 0.25
#: A proc stopped (SIGSTOP) this long counts as hung: it is killed, and its service respawns it.
STOPPED_HANG_S = 2.0


def fault_hook(failure: Any) -> None:
    """Replaces monarch's hook: record the failure for the mesh's owner; never raise."""
    try:
        actor_mesh = str(getattr(failure, "mesh_name", "") or "")
        base = actor_mesh.rsplit("-", 1)[0]
        mesh = registry.owner_of(base)
        message = str(failure)
        if mesh is None:
            registry.unattributed_failures.append(message[:500])
            return
        record = Failure(
            mesh=mesh.name,
            actor_mesh=base,
            ranks=list(getattr(failure, "crashed_ranks", None) or _ranks_in(message)),
            message=message,
        )
        loop = mesh._loop
        if loop is not None and not loop.is_closed():
            # Run it in the spawner's context, not this monarch thread's: monarch keeps the current
            # actor in a context variable, and a respawn started from its context spawns on a
            # proc that has no host mesh (AttributeError: 'NoneType' object has no attribute 'slice').
            loop.call_soon_threadsafe(mesh._record, record, context=mesh._context.copy())
        else:
            mesh._record(record)
    except Exception:  # the hook must never take the kernel down
        logger.exception("forge_nb fault hook failed")


def _ranks_in(message: str) -> list[int]:
    """monarch does not always fill ``crashed_ranks``; its message names the point, e.g. {'procs': 1/2}."""
    return sorted({int(r) for r in re.findall(r"\{'procs': (\d+)/\d+\}", message)})


_watchdog: asyncio.Task[None] | None = None


def start_watchdog(loop: asyncio.AbstractEventLoop) -> None:
    """Watch the recorded pids from ``loop``, unless a watchdog already does; it ends with the meshes."""
    global _watchdog
    if _watchdog is None or _watchdog.done() or _watchdog.get_loop() is not loop:
        _watchdog = loop.create_task(_watch_pids(), name="forge_nb.system.runtime.faults.watchdog")


def stop_watchdog_if_idle() -> None:
    """End the watchdog now when no mesh is left (it would end by itself at its next look)."""
    if _watchdog is not None and not registry.meshes():
        _watchdog.cancel()


_stopped = StoppedWatch(STOPPED_HANG_S)


async def _watch_pids() -> None:
    """Record a failure for any running mesh whose recorded proc has exited, or whose job host was lost;
    ends with the meshes."""
    while True:
        running = [m for m in registry.meshes() if m.pids]
        if not running:
            return
        for mesh in running:
            lost = cluster.lost(mesh.host)
            if lost is not None and len(mesh._reaped) < mesh.procs:
                mesh._reaped.update(range(mesh.procs))
                mesh._record(Failure(mesh=mesh.name, actor_mesh="", ranks=list(range(mesh.procs)),
                                     message=f"host {mesh.host} of mesh {mesh.name!r} is lost: {lost}"))
            if not mesh.local:
                continue
            dead = [rank for rank, pid in enumerate(mesh.pids)
                    if rank not in mesh._reaped and (not same_process(pid, mesh.starts[rank]) or _stopped.hung(pid))]
            if dead:  # a stopped (hung) proc is killed with its group; a dead one's children live on there
                mesh._reaped.update(dead)  # once: later, the pid and then the group's id may name another's
                kill_groups([mesh.pgids[r] for r in dead], mesh.leaders())
                mesh._record(Failure(mesh=mesh.name, actor_mesh="", ranks=dead, message=(
                    f"process(es) {[mesh.pids[r] for r in dead]} of mesh {mesh.name!r} exited or stayed "
                    f"stopped (SIGSTOP) for {STOPPED_HANG_S:g} s")))
        await asyncio.sleep(WATCHDOG_PERIOD_S)
