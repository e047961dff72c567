"""What a shutdown leaves and waits for: one run's processes (``RunShutdown``), and the kernel-wide teardown
under the runs: every mesh the kernel holds, the wait for their processes, the job (``ShutdownReport``).

A run that shuts down (``Run.shutdown``) leaves its processes to others when its adapter shared a base's, keeps
them warm for the kernel's next run where it can (``forge_nb.system.runtime.warm``), and otherwise waits for
them to exit; ``RunShutdown`` says which went which way, so ``%forge_shutdown`` only shows it.

``forge_nb.shutdown_all`` (``%forge_shutdown --all``, the kernel's exit) first shuts each live run down through its
own assembly (``forge_nb.controller.lifecycle.assembly``), which the Run's module does since only it holds the
runs; what is left is not any run's: meshes kept warm for a next run, meshes a run did not own, and the hosts of
a monarch job in use (``forge_nb.use_job``), which would stay held otherwise. ``shutdown_kernel`` notes the
meshes' processes before the runs go, stops every mesh afterwards even when a run's shutdown raised, waits for the
processes to exit and releases the job; the ``ShutdownReport`` says what it stopped.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

__all__ = ["RunShutdown", "ShutdownReport", "run_gone", "shutdown_kernel", "wait_gone"]


@dataclass(frozen=True, slots=True, repr=False)
class RunShutdown:
    """What became of one run's processes when it shut down: left to the runs it ``shared_with`` (the same base),
    ``kept`` warm for the kernel's next run, ``exited``, or still ``alive`` when the wait ended. Shown as one
    line, as a cell that ends with ``await run.shutdown()`` displays it."""

    run: str
    shared_with: list[str]
    kept: list[int]
    exited: list[int]
    alive: list[int]

    def __repr__(self) -> str:
        if self.shared_with:
            return f"run {self.run!r} shut down; its processes train on with {', '.join(self.shared_with)}"
        parts = [f"{len(pids)} process(es) {how}" for pids, how in (
            (self.kept, "kept warm for the kernel's next run"), (self.exited, "exited"),
            (self.alive, "still exiting")) if pids]
        return f"run {self.run!r} shut down" + (f": {', '.join(parts)}" if parts else "")


async def wait_gone(pids: list[int], wait_s: float) -> list[int]:
    """Wait up to ``wait_s`` for ``pids`` to exit; those still alive then."""
    from forge_nb.system.processes.procs import pid_alive

    deadline = time.monotonic() + wait_s
    while (alive := [p for p in pids if pid_alive(p)]) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    return alive


async def run_gone(run: str, pids: list[int], shared_with: list[str], wait_s: float) -> RunShutdown:
    """After ``run`` closed its parts: its processes ``pids`` are left to ``shared_with`` when any, else those the
    kernel keeps warm are noted and the others waited for up to ``wait_s``."""
    from forge_nb.system.runtime import warm

    if shared_with:
        return RunShutdown(run, shared_with, [], [], [])
    kept = sorted({p for k in warm.kept() for p in k["pids"]} & set(pids))
    others = sorted(set(pids) - set(kept))
    alive = await wait_gone(others, wait_s)
    return RunShutdown(run, [], kept, [p for p in others if p not in alive], alive)


@dataclass(frozen=True, slots=True)
class ShutdownReport:
    """What :func:`shutdown_all` stopped: the runs by name, the meshes, their processes, those still alive after
    the wait (empty when all exited) and the hosts of a monarch job it released."""

    runs: list[str]
    meshes: int
    pids: list[int]
    alive: list[int]
    released_hosts: int


async def shutdown_kernel(shutdowns: list[Callable[[], Awaitable[Any]]], runs: list[str],
                          wait_s: float) -> ShutdownReport:
    """Each of ``shutdowns`` in turn (those of the live runs named ``runs``, oldest first), then every mesh of the
    kernel, then a wait of up to ``wait_s`` for their processes to exit, then the hosts of a monarch job. A run
    whose shutdown raised does not keep the next one or the meshes up: its error is raised after the rest is done."""
    from forge_nb.system.hosts import cluster
    from forge_nb.system.runtime import registry

    pids, meshes = [p for m in registry.meshes() for p in m.pids], len(registry.meshes())
    errors: list[BaseException] = []
    try:
        for shutdown in shutdowns:
            try:
                await shutdown()
            except Exception as error:  # the next run, and the meshes, go down all the same
                errors.append(error)
    finally:
        await registry.stop_all()
    alive = await wait_gone(pids, wait_s)
    released = 0
    if (job := cluster.current()) is not None:
        released = len(job.hosts)
        await cluster.release_job()
    if errors:
        raise errors[0]
    return ShutdownReport(runs, meshes, pids, alive, released)
