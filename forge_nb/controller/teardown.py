"""The kernel-wide teardown under the runs: every mesh the kernel holds, the wait for their processes, the job.

``forge_nb.shutdown_all`` (``%forge_shutdown --all``, the kernel's exit) first shuts each live run down through its
own assembly (``forge_nb.controller.assembly``), which the Run's module does since only it holds the runs; what is
left is not any run's: meshes kept warm for a next run, meshes a run did not own, and the hosts of a monarch job
in use (``forge_nb.use_job``), which would stay held otherwise. ``shutdown_kernel`` notes the meshes' processes
before the runs go, stops every mesh afterwards even when a run's shutdown raised, waits for the processes to exit
and releases the job; the ``ShutdownReport`` says what it stopped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

__all__ = ["ShutdownReport", "shutdown_kernel"]


@dataclass(frozen=True, slots=True)
class ShutdownReport:
    """What :func:`shutdown_all` stopped: the runs by name, the meshes, their processes, those still alive after
    the wait (empty when all exited) and the hosts of a monarch job it released."""

    runs: list[str]
    meshes: int
    pids: list[int]
    alive: list[int]
    released_hosts: int


async def shutdown_kernel(shut_down_runs: Callable[[], Awaitable[list[BaseException]]], runs: list[str],
                          wait_s: float) -> ShutdownReport:
    """``shut_down_runs()`` (the live runs named ``runs``, oldest first; it returns their errors), then every mesh of
    the kernel, then a wait of up to ``wait_s`` for their processes to exit, then the hosts of a monarch job. A run
    whose shutdown raised does not keep the meshes up: its error is raised after the rest is done."""
    from forge_nb.system.hosts import cluster
    from forge_nb.system.processes import procs
    from forge_nb.system.runtime import registry

    pids, meshes = [p for m in registry.meshes() for p in m.pids], len(registry.meshes())
    errors: list[BaseException] = []
    try:
        errors = await shut_down_runs()
    finally:
        await registry.stop_all()
    deadline = time.monotonic() + wait_s
    while (alive := [p for p in pids if procs.pid_alive(p)]) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    released = 0
    if (job := cluster.current()) is not None:
        released = len(job.hosts)
        await cluster.release_job()
    if errors:
        raise errors[0]
    return ShutdownReport(runs, meshes, pids, alive, released)
