"""Spawning a process mesh from the kernel: where it goes, which GPUs it gets, its environment and log file,
its pids; and a kept mesh adopted again by a new owner.

This and :func:`forge_nb.system.runtime.registry.Mesh.stop` are the only places that start or stop monarch
processes. Every mesh spawned here is recorded in the registry and watched by the pid watchdog
(``forge_nb.system.runtime.faults``) before :func:`spawn_mesh` returns; the first spawn starts the runtime
(``forge_nb.system.runtime.lifecycle``). Validation (procs, hosts, GPUs) happens before anything is spawned.
"""

from __future__ import annotations

import asyncio
import functools
import time
from pathlib import Path

from forge_nb.system.hosts import cluster, gpus
from forge_nb.system.processes.proclogs import bootstrap, default_log_dir
from forge_nb.system.processes.procs import start_reaper, started
from forge_nb.system.runtime import faults, registry
from forge_nb.system.runtime.lifecycle import ensure_started
from forge_nb.system.runtime.registry import Mesh

# -- GPUs (the accounting lives in gpus; the registry says who holds which) -----------------------

visible_gpus = gpus.visible


def check_gpus(procs: int, name: str) -> None:
    """Raise ResourceError unless ``procs`` GPUs are free for ``name`` (on the job's hosts if one is in use)."""
    job = cluster.current()
    if job is None:
        gpus.check(procs, name, registry.held_gpus())
    else:
        job.check_gpus(procs, name, [(m.host, m.owner, m.gpu_ids) for m in registry.meshes()])


# -- Spawn -----------------------------------------------------------------------------------------

def _log_path(name: str, log_dir: str | Path | None) -> Path:
    """Where the procs of the mesh ``name`` write their output."""
    return Path(log_dir or default_log_dir()) / f"{name}.log"


async def spawn_mesh(name: str, procs: int = 1, with_gpus: bool = False, *, hosts: int | str | None = None,
                     env: dict[str, str] | None = None, owner: str | None = None,
                     log_dir: str | Path | None = None, preload: tuple[str, ...] = ()) -> Mesh:
    """Spawn ``procs`` processes as a monarch ProcMesh and record it: on the kernel's host, or on a host of
    the job in use (``forge_nb.use_job``; ``hosts`` names one of its host meshes, or "kernel").

    ``with_gpus`` gives the mesh ``procs`` free GPUs of its host (each proc sees them all through
    ``CUDA_VISIBLE_DEVICES``; rank r uses ``cuda:r``). Validation happens before anything is spawned.
    The procs' output goes to ``<log_dir>/<name>.log`` (default: ``proclogs.default_log_dir()``).
    ``preload``: modules the procs import as soon as they start (``ProcInfo.preload``; ``mesh.preloading`` is its
    answer, the seconds it took), sent with the pid probe, before this waits for anything.
    """
    if not isinstance(procs, int) or isinstance(procs, bool) or procs < 1:
        raise ValueError(f"procs={procs!r}: a mesh needs at least one process (procs >= 1)")
    ensure_started()
    from monarch.actor import this_host

    name = registry.unique_name(name)
    running = [(m.host, m.owner, m.gpu_ids) for m in registry.meshes()]
    host, gpu_ids = cluster.where(name, hosts, procs=procs, with_gpus=with_gpus, owner=owner, meshes=running)
    if host is None and with_gpus:
        gpu_ids = gpus.check(procs, f"mesh {name!r}", registry.held_gpus())
    proc_env = dict(env or {})
    proc_env.update(cluster.env(host))
    if with_gpus:
        proc_env["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, gpu_ids))
    else:
        proc_env.setdefault("CUDA_VISIBLE_DEVICES", "")
    mesh = Mesh(name, procs, with_gpus, gpu_ids, owner, *((host.name, host.local) if host else ()))
    mesh.log_path = _log_path(name, log_dir)  # the procs' output, not the cell
    mesh.log_path.parent.mkdir(parents=True, exist_ok=True)
    mesh._loop = asyncio.get_running_loop()
    registry.record(mesh)
    try:
        mesh.proc_mesh = (this_host() if host is None else host.mesh).spawn_procs(
            per_host={"procs": procs},
            name=name,
            bootstrap=functools.partial(bootstrap, proc_env, str(mesh.log_path)),
        )
        from forge_nb.system.runtime.procinfo import ProcInfo

        info = mesh.spawn("procinfo", ProcInfo)
        if preload:
            mesh.preloading = asyncio.ensure_future(mesh.spawn("preload", ProcInfo).preload.call(list(preload)))
        pids = await cluster.unless_lost(mesh.host, info.pid.call(), f"mesh {name!r} started")
        ranked = [value for _, value in sorted(pids.items(), key=lambda kv: kv[0].rank)]
        mesh.pids = [pid for pid, _ in ranked]
        if mesh.local:  # elsewhere a pid names nothing here: monarch and the host's probe watch those
            mesh.pgids, mesh.starts = [pgid for _, pgid in ranked], [started(pid) for pid, _ in ranked]
        if host is None:  # the kernel's children die with it; a job's processes belong to the job
            mesh._reaper = start_reaper(mesh.pgids, leaders=mesh.leaders())
        faults.start_watchdog(mesh._loop)
    except BaseException:
        await mesh.stop(timeout=5)
        raise
    return mesh


def adopt(mesh: Mesh, name: str, owner: str | None, log_dir: str | Path | None) -> None:
    """A kept mesh (``forge_nb.system.runtime.warm``) running again, as ``name`` (or the next free name like it),
    for ``owner``, its output to ``<log_dir>/<name>.log`` (the procs are told by the caller)."""
    registry.rename(mesh, name)
    mesh.owner, mesh.state, mesh.created = owner, "running", time.time()
    mesh.log_path = _log_path(mesh.name, log_dir)
    faults.start_watchdog(asyncio.get_running_loop())
