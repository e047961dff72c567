"""While a run starts on a machine with fewer cores than it has busy processes, its generators get a core.

On two cores the quickstart starts three busy processes at once: the generator imports vLLM and builds its
engine (~14-16 s of one core: the start's longest chain, and the first step waits for it), the trainer imports
torch and transformers and builds its model (~8 s), and the kernel imports torchstore (~2 s). Linux shares
the two cores among them, so the generator's chain ran at ~80% of a core. :func:`generators_first` keeps the
kernel and the run's other processes off the first core(s) until the generators' service is up: the
generators' processes have those cores to themselves and may use the rest as well. Then every thread it moved
gets the machine's cores back, and the trainer finishes its start on both. Measured on the project's two-core
machine, the quickstart from spawn to its first step, alternating ``FORGE_NB_START_CORES=0`` and 1 (7 pairs):
sooner in 5 (by 0.3-2.3 s), later in 2 (by 0.1 and 1.1 s), 0.6 s sooner on average: 0.9-2.3 s in the first
three (14.1 / 13.6 / 15.7 s against 15.1 / 15.9 / 16.6 s), about nothing in the four 20 minutes later.
Where there are as many cores as busy processes, on a job's hosts, or on a machine of one core, it does
nothing; ``FORGE_NB_START_CORES=0`` turns it off. A run whose trainer samples the first rollouts while the generators
start (``forge_nb.controller.lifecycle.stand_in``) waits for the trainer instead: the core is the trainer's, until
it is up, and then the generators', until they serve (the meshes kept first are the caller's choice; the names
below say generators, the usual one).

Linux sets a CPU mask per thread (``sched_setaffinity``) and a new thread or process takes its creator's:

* the kernel's threads are moved at once, so the processes it spawns meanwhile start with the narrow mask; each
  is widened as soon as it is seen (a look every 50 ms, less often while nothing new is born: ``MAX_POLL_S``), and
  the run's processes that are not generators are moved back onto the narrow mask once their meshes report their
  pids (~1 s after the spawn);
* a generator's process is widened once, when it is first seen, and never touched again: an engine that pins
  its own threads later keeps them as it pinned them;
* at the end, a thread of the kernel or of the run's other processes is given the whole mask back only if it
  still has the narrow one (a mask somebody else set is left alone).

Considered:

* the trainer's core kept until the generators serve, while it samples their rollouts: its steps are faster, but a
  trainer not yet asked to sample (a run spawned and not stepping) holds a core their start needs.
* ``nice`` for the trainer and the kernel: a process may lower its own priority but not raise it back without
  ``CAP_SYS_NICE``, and after the start the trainer's step is what a training step waits for.
* a cgroup's ``cpu.weight``: needs a cgroup delegated to the user, which a notebook's kernel rarely has.
* ``taskset`` around each process: monarch starts the processes, and the generator is not the only one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator, Callable

from forge_nb.system.hosts import cluster
from forge_nb.system.processes.procs import live_children
from forge_nb.system.runtime import registry

logger = logging.getLogger(__name__)

POLL_S = 0.05  #: how often the kernel looks for new processes and threads while a run starts
#: The longest wait between two looks: each look that finds no new process doubles the wait up to this. A look lists
#: every process on the machine (3-4 ms of the kernel's CPU); while the trainer samples a run's first rollouts,
#: looks every 50 ms took a fifth of the kernel's time. A process born meanwhile waits at most this for its mask.
MAX_POLL_S = 0.5


def _threads(pid: int) -> list[int]:
    try:
        return [int(tid) for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:  # the process ended
        return []


def _set_mask(pid: int, cpus: frozenset[int], *, only_from: frozenset[int]) -> None:
    """Give the threads of ``pid`` whose mask is ``only_from`` the mask ``cpus``."""
    for tid in _threads(pid):
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            if os.sched_getaffinity(tid) == only_from:
                os.sched_setaffinity(tid, cpus)


class _Reservation:
    """The cores kept for the generators (``kept``), the rest (``narrow``), and the processes seen so far."""

    def __init__(self, generator_meshes: str, cores: frozenset[int], generator_processes: int,
                 run_meshes: str | None = None):
        self.prefix, self.run_meshes = generator_meshes, run_meshes
        self.cores = cores
        self.kept = frozenset(sorted(cores)[:generator_processes])
        self.narrow = cores - self.kept
        self.before = {child.pid for child in live_children(os.getpid(), recursive=True)}  # not this start's
        self.seen = set(self.before)  # processes widened at birth (and those of before)
        self.others: set[int] = set()  # this start's processes that are not generators: kept narrow

    def poll(self) -> bool:
        """Set the masks of what is new since the last poll; whether anything was (a process, a mesh's pids)."""
        kernel = os.getpid()
        _set_mask(kernel, self.narrow, only_from=self.cores)
        new = False
        for child in live_children(kernel, recursive=True):
            if child.pid not in self.seen:  # it took the narrow mask from the kernel's thread that started it
                self.seen.add(child.pid)
                new = True
                _set_mask(child.pid, self.cores, only_from=self.narrow)
        local = [mesh for mesh in registry.meshes() if mesh.local]
        generators = {pid for mesh in local if mesh.name.startswith(self.prefix) for pid in mesh.pids}
        others = {pid for mesh in local for pid in mesh.pids} - generators - self.before
        if self.run_meshes is not None:  # the run's processes that were up before the block: kept narrow too
            others |= {pid for mesh in local if mesh.name.startswith(self.run_meshes) for pid in mesh.pids} - generators
        new = new or not others <= self.others
        self.others |= others
        for pid in self.others:
            _set_mask(pid, self.narrow, only_from=self.cores)
        return new

    def release(self) -> None:
        kernel = os.getpid()
        others = {*self.others, *(child.pid for pid in self.others for child in live_children(pid, recursive=True))}
        born = {child.pid for child in live_children(kernel, recursive=True)} - self.seen  # since the last poll
        for pid in {kernel, *others, *born}:
            _set_mask(pid, self.cores, only_from=self.narrow)


def applies(processes: int, generator_processes: int) -> frozenset[int] | None:
    """The kernel's cores if a start of ``processes`` busy processes on this machine (the kernel not counted),
    ``generator_processes`` of them generators, should keep cores for the generators; else None."""
    if not hasattr(os, "sched_setaffinity") or os.environ.get("FORGE_NB_START_CORES") == "0":  # Linux; opt out
        return None
    cores = frozenset(os.sched_getaffinity(0))
    if cluster.current() is not None or not 1 <= generator_processes < len(cores) < processes + 1:
        return None
    return cores


@contextlib.asynccontextmanager
async def generators_first(generator_meshes: str, *, processes: int, generator_processes: int,
                           run_meshes: str | None = None) -> AsyncIterator[Callable[[], None]]:
    """Within the block, the meshes whose names start with ``generator_meshes`` have the first
    ``generator_processes`` cores to themselves (see the module docstring); ``processes``: every busy process
    the block starts on this machine, generators included. The block gets a function that ends this early
    (once the generators are up, the others may have every core); the block's end calls it. ``run_meshes``: the
    processes of meshes whose names start with it are kept off those cores too, though they were up before the
    block began (a run's trainer, up and training, while its generators finish starting)."""
    cores = applies(processes, generator_processes)
    if cores is None:
        yield lambda: None
        return
    reservation = _Reservation(generator_meshes, cores, generator_processes, run_meshes)
    logger.info("while the services start, cores %s are kept for %s*", sorted(reservation.kept), generator_meshes)

    async def keep() -> None:
        wait = POLL_S
        while True:
            try:
                wait = POLL_S if reservation.poll() else min(MAX_POLL_S, wait * 2)
            except Exception:  # a speed-up only: the start goes on without it
                logger.debug("keeping cores for %s*", generator_meshes, exc_info=True)
            await asyncio.sleep(wait)

    keeping = asyncio.ensure_future(keep())

    released = False

    def release() -> None:
        nonlocal released
        if not released:
            released = True
            keeping.cancel()  # a poll runs in this loop's thread, as this does: none comes after it
            reservation.release()

    try:
        yield release
    finally:
        release()
