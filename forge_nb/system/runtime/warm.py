"""Processes kept warm between runs of one kernel, so that a run's second spawn does not start from nothing.

A run that shuts down leaves its replicas' processes here instead of stopping them: their actors stopped (a
generator's engine shut down, a trainer's model dropped), their imports done (vLLM, torch, transformers: most
of the 5-9 s from a spawn to the first step on two cores). The kernel's next replica of the same actor class
and shape takes one: its spawn skips the process start and the imports, and builds only its engine or model
(about 1 s for the quickstart). A kept process writes its output into the log of the run that took it.

What is kept: a healthy replica's mesh on the kernel's host, without GPUs, holding nothing but that replica's
actor (and the runtime's pid probe), that has served fewer than :data:`MAX_RUNS` runs; at most :data:`MAX_KEPT`
meshes, the oldest stopped when another comes; each for ``FORGE_NB_KEEP_WARM_S`` seconds (default :data:`KEEP_S`;
0 keeps nothing), then stopped.
``forge_nb.shutdown_all()`` (``%forge_shutdown --all``) and the kernel's exit stop them with every other mesh;
``%forge_status`` and ``%forge_meshes`` list them (:func:`kept`, :func:`summary`).

A mesh spawned for a replica not yet built waits here too (:func:`hold`: a run's trainer, started before the
kernel imports the run's modules, ``forge_nb.controller.lifecycle.prestart``); a replica of its key that comes
while it still starts waits for it.

Considered: starting processes when the extension loads, with the imports done before any spawn (a script or a
notebook that spawns in its first cell gains little, and a kernel that never spawns pays the memory), and
keeping a generator's engine itself for a next run of the same model (its weights, prefix cache and adapter
slots would have to be reset for the new run; the build it saves is ~0.5 s of the ~1 s left).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
import weakref
from collections.abc import Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forge_nb.system.hosts import cluster
from forge_nb.system.runtime import registry, spawning

__all__ = ["KEEP_S", "MAX_KEPT", "MAX_RUNS", "Kept", "hold", "holds", "keep_s", "kept", "park", "release", "shape",
           "summary", "take"]

logger = logging.getLogger(__name__)

#: Seconds a kept mesh waits for a run to take it, unless ``FORGE_NB_KEEP_WARM_S`` says otherwise.
KEEP_S = 600.0
#: The most meshes kept at once (a quickstart leaves two: its generator's and its trainer's).
MAX_KEPT = 4
#: The most runs one process serves before it is stopped rather than kept: each leaves a few MB behind
#: (measured with the quickstart: the trainer's process ~8 MB a run, the generator's ~3).
MAX_RUNS = 8


@dataclass
class Kept:
    """A mesh waiting for the next replica with the same ``key`` (:func:`shape`: its actor class first)."""

    mesh: registry.Mesh
    key: tuple[Any, ...]
    since: float
    stops_at: float
    timer: asyncio.TimerHandle | None = None

    @property
    def role(self) -> str:
        """The actor class its replica ran."""
        return self.key[0]


_kept: list[Kept] = []
#: A key -> the start of a mesh :func:`hold` keeps for it once started.
_starting: dict[tuple[Any, ...], asyncio.Task[registry.Mesh]] = {}
#: A mesh taken warm -> how many of its actors are the runtime's (pid probes) or its earlier runs' (stopped).
_before: weakref.WeakKeyDictionary[registry.Mesh, int] = weakref.WeakKeyDictionary()
#: A mesh taken warm -> how many runs it has served, this one included.
_runs: weakref.WeakKeyDictionary[registry.Mesh, int] = weakref.WeakKeyDictionary()


def keep_s() -> float:
    """How long a mesh is kept: ``FORGE_NB_KEEP_WARM_S`` (0: none), else :data:`KEEP_S`."""
    value = os.environ.get("FORGE_NB_KEEP_WARM_S", "")
    try:
        return max(0.0, float(value)) if value else KEEP_S
    except ValueError:
        logger.warning("FORGE_NB_KEEP_WARM_S=%r is no number of seconds; keeping meshes %g s", value, KEEP_S)
        return KEEP_S


def shape(role: str, procs: int, with_gpus: bool, hosts: Any, env: dict[str, str]) -> tuple[Any, ...] | None:
    """What a replica's mesh must match to be taken; None when such a mesh is never kept (GPUs, another
    host, a job in use)."""
    if with_gpus or hosts not in (None, 1, cluster.KERNEL) or cluster.current() is not None:
        return None
    return role, procs, tuple(sorted(env.items()))


async def park(mesh: registry.Mesh, actor: Any, key: tuple[Any, ...] | None) -> bool:
    """Keep ``mesh`` (``actor`` being the one actor of its replica) for a later replica of the same ``key``:
    stops the actor, keeps the processes. False (and nothing done) when it cannot be kept: the caller then
    stops the mesh as before."""
    if key is None or keep_s() <= 0 or mesh.state != "running" or not mesh.local or mesh.with_gpus:
        return False
    if mesh.failures or len(mesh.alive_pids()) != mesh.procs or len(mesh._actor_names) - _before.get(mesh, 1) != 1:
        return False  # a dead proc, or actors of another run besides the replica's (e.g. a guest's)
    if _runs.get(mesh, 1) >= MAX_RUNS:
        return False
    from forge_nb.system.runtime.procinfo import ProcInfo

    try:
        await asyncio.wait_for(actor.stop(), 10.0)
        # what the stopped actor held (an engine, a model) is freed now, not left to the next run's process
        freed = await asyncio.wait_for(mesh.spawn("procinfo", ProcInfo).collect.call(), 30.0)
    except Exception as e:  # an actor that will not stop, or a process that does not answer: no good to keep
        logger.info("mesh %s not kept: %s: %s", mesh.name, type(e).__name__, e)
        return False
    logger.debug("mesh %s: %d objects of its stopped actor collected", mesh.name, sum(n for _, n in freed.items()))
    mesh._listeners.clear()
    keep = keep_s()
    _keep(mesh, key, keep)
    while len(_kept) > MAX_KEPT:
        await _stop(_kept[0])
    logger.info("mesh %s kept warm for %g s (pids %s)", mesh.name, keep, mesh.pids)
    return True


def hold(key: tuple[Any, ...], starting: Coroutine[Any, Any, registry.Mesh], wait_s: float) -> asyncio.Task[Any]:
    """Keep the mesh ``starting`` (a coroutine not yet awaited that spawns it, and stops it if cancelled, as
    ``spawning.spawn_mesh`` does) gives, for a replica of ``key`` not yet built, ``wait_s`` seconds at most; the
    task that starts it (:func:`release` stops either)."""

    async def start() -> registry.Mesh:
        mesh = await starting
        _keep(mesh, key, wait_s)
        _runs[mesh] = 0  # its first replica is its first run
        return mesh

    task = asyncio.ensure_future(start())
    _starting[key] = task
    task.add_done_callback(lambda _: _starting.pop(key, None) if _starting.get(key) is task else None)
    return task


def holds(key: tuple[Any, ...] | None) -> bool:
    """Whether a mesh of ``key`` is kept or starting to be."""
    return key in _starting or any(e.key == key for e in _kept)


async def release(task: asyncio.Task[Any]) -> bool:
    """Stop the mesh of :func:`hold`'s ``task`` unless a replica took it (or it never started); whether it did."""
    if not task.done():
        task.cancel()  # the start stops what it spawned (see hold)
        with contextlib.suppress(BaseException):
            await task
        return True
    if task.cancelled() or task.exception() is not None:
        return False
    entry = next((e for e in _kept if e.mesh is task.result()), None)
    if entry is not None:
        await _stop(entry)
    return entry is not None


def _keep(mesh: registry.Mesh, key: tuple[Any, ...], wait_s: float) -> None:
    mesh.state = "parked"  # not among registry.meshes(); still among the kernel's, which its exit kills
    now = time.monotonic()
    entry = Kept(mesh, key, now, now + wait_s)
    entry.timer = asyncio.get_running_loop().call_later(wait_s, lambda: asyncio.ensure_future(_stop(entry)))
    _kept.append(entry)


async def take(key: tuple[Any, ...] | None, name: str, owner: str | None,
               log_dir: str | Path | None) -> registry.Mesh | None:
    """A kept mesh of ``key``, renamed ``name`` (or the next free name like it), owned by ``owner``, its
    processes' output going to ``<log_dir>/<name>.log`` from now on; None when none is kept."""
    if key in _starting:  # started for this replica, not up yet; one that failed or was released leaves the
        await asyncio.wait({_starting[key]})  # replica to spawn its own (wait: neither error reaches it)
    _prune()
    for entry in [e for e in _kept if e.key == key]:
        _forget(entry)
        mesh = entry.mesh
        if len(mesh.alive_pids()) != mesh.procs:  # killed while it waited
            await mesh.stop(timeout=2.0)
            continue
        spawning.adopt(mesh, name, owner, log_dir)
        from forge_nb.system.runtime.procinfo import ProcInfo

        try:
            await mesh.spawn("procinfo", ProcInfo).relog.call(str(mesh.log_path))
        except Exception as e:  # the proc is not answering: start afresh
            logger.info("kept mesh %s not taken: %s", name, e)
            await mesh.stop(timeout=2.0)
            continue
        _before[mesh], _runs[mesh] = len(mesh._actor_names), _runs.get(mesh, 1) + 1
        logger.info("mesh %s taken warm (pids %s, kept %.0f s)", name, mesh.pids, time.monotonic() - entry.since)
        return mesh
    return None


def kept() -> list[dict[str, Any]]:
    """The meshes kept now: their role (actor class), pids, name and the seconds until they stop."""
    _prune()
    now = time.monotonic()
    return [{"role": e.role, "pids": list(e.mesh.pids), "mesh": e.mesh.name,
             "stops_in_s": max(0.0, e.stops_at - now)} for e in _kept]


def summary() -> str:
    """One line on the meshes kept now ("" when none), for ``%forge_status`` and ``%forge_meshes``."""
    held = kept()
    if not held:
        return ""
    what = ", ".join(f"{k['role']} (pid {', '.join(map(str, k['pids']))})" for k in held)
    soonest = min(k["stops_in_s"] for k in held)
    return (f"kept warm for the next run: {what}; the first stops in {soonest / 60:.0f} min "
            "(%forge_shutdown --all stops them now; FORGE_NB_KEEP_WARM_S=0 keeps none)")


def _prune() -> None:
    """Forget the kept meshes something else stopped (``registry.stop_all``, the kernel's teardown)."""
    for entry in [e for e in _kept if e.mesh.state != "parked"]:
        _forget(entry)


def _forget(entry: Kept) -> None:
    """``entry`` is no longer kept (taken, stopped, or stopped by someone else): out of the list, its timer off."""
    if entry in _kept:
        _kept.remove(entry)
    if entry.timer is not None:
        entry.timer.cancel()


async def _stop(entry: Kept) -> None:
    _forget(entry)
    await entry.mesh.stop(timeout=5.0)

