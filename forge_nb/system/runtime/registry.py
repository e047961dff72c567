"""The kernel's registry of the process meshes it spawned, and what a mesh is: its pids, state, GPUs and failures.

The kernel is the single controller: every mesh it spawns (``forge_nb.system.runtime.spawning``) is recorded
here until it stops, so that a process failure monarch reports, or the pid watchdog finds
(``forge_nb.system.runtime.faults``), reaches the mesh's owner (:meth:`Mesh.on_failure`) instead of the cell
that happens to run; tables and widgets read :func:`meshes`; and nothing is left running when the kernel
exits (:func:`kill_everything`, installed by ``forge_nb.system.runtime.lifecycle``). A mesh kept for a next
run (``forge_nb.system.runtime.warm``) stays recorded, as "parked", but is not among :func:`meshes`.

Stopping is the mesh's own: :meth:`Mesh.stop` stops the procs through monarch, kills what is still alive and
what the procs started (their process groups), and takes the mesh out of the registry. Process mechanics
live in ``forge_nb.system.processes.procs``, job hosts in ``forge_nb.system.hosts.cluster``.
"""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge_nb.system.hosts import cluster
from forge_nb.system.monarch_compat import await_maybe
from forge_nb.system.processes.procs import kill_groups, kill_pids, same_process, stop_reaper

logger = logging.getLogger(__name__)

MeshState = str  # "running" | "failed" | "stopped" | "parked" (kept for a next run: forge_nb.system.runtime.warm)


@dataclass(kw_only=True, slots=True)
class Failure:
    """One process failure monarch reported for a mesh this kernel owns."""

    mesh: str
    actor_mesh: str
    ranks: list[int]
    message: str
    time: float = field(default_factory=time.time)


@dataclass(kw_only=True, slots=True)
class MeshInfo:
    """Plain-data view of a mesh, for tables and widgets."""

    name: str
    procs: int
    with_gpus: bool
    gpu_ids: list[int]
    pids: list[int]
    state: MeshState
    owner: str | None
    failures: int
    age_s: float
    host: str = "kernel"


# -- A mesh ----------------------------------------------------------------------------------------

class Mesh:
    """A process mesh this kernel spawned, with its pids, state, GPUs and failures."""

    def __init__(self, name: str, procs: int, with_gpus: bool, gpu_ids: list[int], owner: str | None,
                 host: str = "kernel", local: bool = True):
        self.name, self.procs, self.with_gpus, self.gpu_ids, self.owner = name, procs, with_gpus, gpu_ids, owner
        self.host = host  # "kernel", or the job's host it runs on (forge_nb.system.hosts.cluster)
        self.local = local  # its pids are this machine's: the watchdog and kills may use them
        self.log_path: Path | None = None  # where its procs' stdout and stderr go
        self.proc_mesh: Any = None
        self.pids: list[int] = []
        self.pgids: list[int] = []
        self.starts: list[float | None] = []  # each proc's start (procs.started): its pid may be reused later
        self.state: MeshState = "running"
        self.failures: list[Failure] = []
        self.created = time.time()
        self._listeners: list[Callable[[Failure], None]] = []
        self._context = contextvars.copy_context()  # the spawner's; failures are recorded in it
        self._loop: asyncio.AbstractEventLoop | None = None
        self._actor_names: list[str] = []
        self.preloading: asyncio.Future[Any] | None = None  # its procs' imports at start (spawning.spawn_mesh)
        self._reaper: Any = None  # kills the procs' groups if the kernel dies (processes.procs.start_reaper)
        self._reaped: set[int] = set()  # ranks whose death the watchdog handled (their groups killed)

    def __repr__(self) -> str:
        return f"Mesh({self.name!r}, procs={self.procs}, state={self.state!r}, pids={self.pids})"

    def spawn(self, name: str, actor_cls: type, *args: Any, **kwargs: Any) -> Any:
        """Spawn ``actor_cls`` on every proc of this mesh; failures are routed to this mesh."""
        if self.state != "running":
            raise RuntimeError(f"mesh {self.name!r} is {self.state}; spawn a new mesh instead")
        # Unique for the life of the process: monarch may report a death late (up to its 10 s poll),
        # and a reused name would pin that stale failure on a newer mesh of the same name.
        actor_name = f"{self.name}__{name}__{next(_spawn_ids)}"
        _actor_mesh_owner[actor_name] = self
        self._actor_names.append(actor_name)
        return self.proc_mesh.spawn(actor_name, actor_cls, *args, **kwargs)

    def on_failure(self, callback: Callable[[Failure], None]) -> None:
        """Call ``callback(failure)`` on the kernel's event loop whenever a proc of this mesh dies."""
        self._listeners.append(callback)

    def alive_pids(self) -> list[int]:
        """The procs still running (a pid that now names another process is not one of them); [] for a
        mesh on another machine, whose pids name nothing here."""
        if not self.local:
            return []
        return [p for p, start in zip(self.pids, self.starts, strict=True) if same_process(p, start)]

    def leaders(self) -> dict[int, int | None]:
        """Each proc's group (it leads one) -> the proc's start: what kill_groups checks before killing."""
        return dict(zip(self.pgids, self.starts, strict=True))

    def info(self) -> MeshInfo:
        return MeshInfo(name=self.name, procs=self.procs, with_gpus=self.with_gpus, gpu_ids=list(self.gpu_ids),
                        pids=list(self.pids), state=self.state, owner=self.owner, failures=len(self.failures),
                        age_s=round(time.time() - self.created, 1), host=self.host)

    async def stop(self, timeout: float = 10.0) -> None:
        """Stop the procs through monarch, then make sure: any pid still alive is killed."""
        if self.state == "stopped":
            return
        self.state = "stopped"
        try:  # on a lost host there is nothing to stop, and monarch would wait for it until `timeout`
            if cluster.lost(self.host) is None:
                await asyncio.wait_for(await_maybe(self.proc_mesh.stop()), timeout)
        except Exception as e:  # a mesh with a dead proc may refuse a clean stop
            logger.debug("mesh %s did not stop cleanly: %s", self.name, e)
        kill_pids(self.alive_pids(), grace=2.0)
        kill_groups(self.pgids, self.leaders())  # what the procs started and left (vLLM engines and workers)
        if not self.local:  # pids this machine cannot signal: the host's probe ends them there
            await cluster.end_on(self.host, self.pids)
        stop_reaper(self._reaper)
        _release(self)

    def _record(self, failure: Failure) -> None:
        """Runs on the kernel's event loop (scheduled from monarch's thread by the fault hook)."""
        if self.state == "stopped":
            return
        known = {r for f in self.failures for r in f.ranks}
        if failure.ranks and known.issuperset(failure.ranks):
            return  # monarch and the watchdog both report a death; keep the first
        self.failures.append(failure)
        self.state = "failed"
        cluster.note_failure(self.host)
        for listener in list(self._listeners):
            try:
                listener(failure)
            except Exception:  # a listener bug must not hide the failure from the others
                logger.exception("failure listener of mesh %s raised", self.name)


_meshes: dict[str, Mesh] = {}
_spawn_ids = itertools.count()
_actor_mesh_owner: dict[str, Mesh] = {}
#: Failures monarch reported for actor meshes this registry does not know (its own logger meshes).
unattributed_failures: list[str] = []


def unique_name(name: str) -> str:
    """``name``, or the next free name like it (``name-2``, ``name-3``...)."""
    if name not in _meshes:
        return name
    i = 2
    while f"{name}-{i}" in _meshes:
        i += 1
    return f"{name}-{i}"


def record(mesh: Mesh) -> None:
    """Hold ``mesh`` under its name (a spawn records it before its procs start)."""
    _meshes[mesh.name] = mesh


def rename(mesh: Mesh, name: str) -> None:
    """Hold ``mesh`` under ``name`` (or the next free name like it) instead of its own."""
    _meshes.pop(mesh.name, None)
    mesh.name = unique_name(name)
    _meshes[mesh.name] = mesh


def owner_of(actor_mesh: str) -> Mesh | None:
    """The mesh an actor mesh (its name as :meth:`Mesh.spawn` gave it) was spawned on, if this kernel knows it."""
    return _actor_mesh_owner.get(actor_mesh)


def meshes() -> list[Mesh]:
    """Every mesh this kernel spawned and has not stopped, oldest first; not those kept for a next run
    (``forge_nb.system.runtime.warm``), which are the kernel's still: :func:`stop_all` and its exit stop them."""
    return [m for m in _meshes.values() if m.state not in ("stopped", "parked")]


def get_mesh(name: str) -> Mesh:
    try:
        return _meshes[name]
    except KeyError:
        known = ", ".join(_meshes) or "none"
        raise KeyError(f"no mesh named {name!r}; this kernel holds: {known}") from None


def held_gpus() -> dict[str, list[int]]:
    """Mesh name -> the GPUs of the kernel's host it holds (running meshes only)."""
    return {m.name: m.gpu_ids for m in _meshes.values() if m.state == "running" and m.gpu_ids and m.host == "kernel"}


async def stop_all(timeout: float = 10.0) -> None:
    """Stop every mesh this kernel holds (newest first), kept ones included."""
    for mesh in reversed([m for m in _meshes.values() if m.state != "stopped"]):
        await mesh.stop(timeout)


def _release(mesh: Mesh) -> None:
    _meshes.pop(mesh.name, None)
    for actor_name in mesh._actor_names:
        _actor_mesh_owner.pop(actor_name, None)


def kill_everything() -> None:
    """Kill every process of every mesh the kernel holds, kept ones included, by signals: at exit (``atexit``,
    ``end_process``) the event loop may be gone."""
    pids = [p for m in list(_meshes.values()) for p in m.alive_pids()]
    kill_pids(pids, grace=3.0)
    leaders = {g: s for m in list(_meshes.values()) for g, s in m.leaders().items()}
    kill_groups(list(leaders), leaders)
    _meshes.clear()
