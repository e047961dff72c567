"""Process meshes from the notebook kernel: spawn, stop, registry, GPU checks, fault hook, clean-up.

This is the only module that starts or stops Monarch processes. The kernel is the single
controller: every mesh it spawns is recorded here, so that

* a dead process is *recorded* for the mesh's owner instead of killing the kernel. Monarch's
  default ``unhandled_fault_hook`` calls ``sys.exit(1)``, which reaches a notebook as a
  KeyboardInterrupt in whatever cell is running. We replace it the first time a mesh is spawned.
* a dead process is noticed within about half a second. Monarch's own supervision polls every 10 s
  unless ``HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY`` is in the environment when monarch is
  *imported* (setting it later has no effect; measured). We set it when we are first to import
  monarch, and in any case a watchdog task on the kernel's loop checks the recorded pids every
  ``WATCHDOG_PERIOD_S``, so detection never depends on import order.
* nothing outlives the kernel. Spawned procs are children of the kernel with PR_SET_PDEATHSIG; on a clean
  exit an ``atexit`` handler kills what still runs. (A job's hosts, ``forge_nb.system.cluster``, are the job's; their
  pids are watched only on this machine.) :func:`end_process` skips monarch's exit-time teardown.

Importing this module has no side effects; :func:`ensure_started` does the work, once.

Leases (:func:`lease` / :func:`release`, a ``forge_nb.system.leases.Shared``): services and the leased
torchstore hold the runtime under a holder id, and meshes they spawn carry that id as ``owner``. The
first lease starts the runtime (``ensure_started``); releasing a holder stops every mesh it still owns
(what a shutdown left behind, e.g. a respawn caught midway); the last release also ends the pid
watchdog when no mesh is left. What a lease does not cover: the process-wide start-up stays for the
life of the kernel (monarch cannot be un-imported, and its late failure reports still need our
hook), and meshes spawned without a lease (``%spawn``, tests) are the spawner's to stop.

One concept, hence near 500 lines: the kernel's registry of meshes and what keeps it true. Beside it:
process mechanics in ``procs``, GPU accounting in ``gpus``, job hosts and placement in ``cluster``.
"""

from __future__ import annotations

import asyncio
import atexit
import contextvars
import functools
import itertools
import logging
import os
import re
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from forge_nb.system import cluster, gpus
from forge_nb.system.gpus import ResourceError  # noqa: F401  (runtime.ResourceError, as before)
from forge_nb.system.leases import Shared
from forge_nb.system.monarch_compat import await_maybe, private_log_dir
from forge_nb.system.proclogs import bootstrap, default_log_dir, native_stderr_to
from forge_nb.system.procs import StoppedWatch, kill_groups, kill_pids, same_process, start_reaper, started, stop_reaper

logger = logging.getLogger(__name__)

#: Environment defaults applied before monarch starts (a user's own values win).
MONARCH_ENV_DEFAULTS = {
    # Notice a dead process in ~1 s instead of ~10 s.
    "HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY": "1s",
    # Weight dicts travel as single messages; torchstore sets the same on import.
    "HYPERACTOR_CODEC_MAX_FRAME_LENGTH": "910737418240",
    # A job's host that dies leaves messages queued to it; after this long monarch returns them, and a kernel
    # handed back an undeliverable message exits (measured: 30 s, the default, after a ProcessJob host died
    # mid-run, pytest was gone). The host's probe finds it lost within seconds (forge_nb.system.cluster).
    "HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT": "7d",
}

MeshState = str  # "running" | "failed" | "stopped" | "parked" (kept for a next run: forge_nb.system.warm)

#: How often the watchdog looks at every recorded pid (a /proc read each).
WATCHDOG_PERIOD_S = 0.25
#: A proc stopped (SIGSTOP) this long counts as hung: it is killed, and its service respawns it.
STOPPED_HANG_S = 2.0


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


# -- Start-up, once per process --------------------------------------------------------------------

_started = False
_start_lock = threading.Lock()


def ensure_started() -> None:
    """Apply monarch's environment defaults and install our fault hook and exit handler, once."""
    global _started
    with _start_lock:
        if _started:
            return
        if "monarch" in sys.modules:
            late = [k for k in MONARCH_ENV_DEFAULTS if k not in os.environ]
            if late:
                logger.info(
                    "monarch was imported before forge_nb started it, so %s does not apply; "
                    "forge_nb's pid watchdog still notices dead procs, but in-flight monarch calls to "
                    "them take ~10 s to fail. %%load_ext forge_nb first to avoid that.",
                    ", ".join(late),
                )
        for key, value in MONARCH_ENV_DEFAULTS.items():
            os.environ.setdefault(key, value)
        private_log_dir()  # monarch's log names every actor's socket: owner-only, before monarch writes it
        import monarch.actor

        with native_stderr_to(default_log_dir() / "monarch-start.log"):  # not a cell: where monarch logs
            monarch.actor.context()  # the first context starts monarch's runtime, which says so on descriptor 2
        monarch.actor.unhandled_fault_hook = _fault_hook
        atexit.register(_kill_everything)
        _started = True


# -- Leases ----------------------------------------------------------------------------------------

async def _lease_start() -> None:
    ensure_started()


async def _lease_stop() -> None:
    if _watchdog is not None and not meshes():
        _watchdog.cancel()  # it would end by itself at its next look; a released runtime leaves no task


_leases = Shared("runtime", start=_lease_start, stop=_lease_stop)


async def lease(holder: str) -> None:
    """Hold the runtime for ``holder`` (a unique id; give it as ``owner`` to the meshes it spawns)."""
    await _leases.acquire(holder)


async def release(holder: str) -> None:
    """End ``holder``'s lease: stop the meshes it still owns; the last release ends the watchdog if no
    mesh is left. A holder that holds nothing: no-op."""
    if holder not in _leases.holders:
        return
    for mesh in [m for m in meshes() if m.owner == holder]:
        logger.info("mesh %s was left running by %s; stopping it", mesh.name, holder)
        await mesh.stop()
    await _leases.release(holder)


def lease_holders() -> frozenset[str]:
    """Who holds the runtime now."""
    return _leases.holders


# -- GPUs (the accounting lives in gpus; the registry says who holds which) -----------------------

visible_gpus = gpus.visible


def _held_gpus() -> dict[str, list[int]]:  # on the kernel's host
    return {m.name: m.gpu_ids for m in _meshes.values() if m.state == "running" and m.gpu_ids and m.host == "kernel"}


def check_gpus(procs: int, name: str) -> None:
    """Raise ResourceError unless ``procs`` GPUs are free for ``name`` (on the job's hosts if one is in use)."""
    job = cluster.current()
    if job is None:
        gpus.check(procs, name, _held_gpus())
    else:
        job.check_gpus(procs, name, [(m.host, m.owner, m.gpu_ids) for m in meshes()])


# -- Meshes ----------------------------------------------------------------------------------------

class Mesh:
    """A process mesh this kernel spawned, with its pids, state, GPUs and failures."""

    def __init__(self, name: str, procs: int, with_gpus: bool, gpu_ids: list[int], owner: str | None,
                 host: str = "kernel", local: bool = True):
        self.name, self.procs, self.with_gpus, self.gpu_ids, self.owner = name, procs, with_gpus, gpu_ids, owner
        self.host = host  # "kernel", or the job's host it runs on (forge_nb.system.cluster)
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
        self._reaper: Any = None  # kills the procs' groups if the kernel dies (see _procs.start_reaper)
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


def _log_path(name: str, log_dir: str | Path | None) -> Path:
    """Where the procs of the mesh ``name`` write their output."""
    return Path(log_dir or default_log_dir()) / f"{name}.log"


def _unique_name(name: str) -> str:
    if name not in _meshes:
        return name
    i = 2
    while f"{name}-{i}" in _meshes:
        i += 1
    return f"{name}-{i}"


async def spawn_mesh(name: str, procs: int = 1, with_gpus: bool = False, *, hosts: int | str | None = None,
                     env: dict[str, str] | None = None, owner: str | None = None,
                     log_dir: str | Path | None = None) -> Mesh:
    """Spawn ``procs`` processes as a monarch ProcMesh and record it: on the kernel's host, or on a host of
    the job in use (``forge_nb.use_job``; ``hosts`` names one of its host meshes, or "kernel").

    ``with_gpus`` gives the mesh ``procs`` free GPUs of its host (each proc sees them all through
    ``CUDA_VISIBLE_DEVICES``; rank r uses ``cuda:r``). Validation happens before anything is spawned.
    The procs' output goes to ``<log_dir>/<name>.log`` (default: ``proclogs.default_log_dir()``).
    """
    if not isinstance(procs, int) or isinstance(procs, bool) or procs < 1:
        raise ValueError(f"procs={procs!r}: a mesh needs at least one process (procs >= 1)")
    ensure_started()
    from monarch.actor import this_host

    name = _unique_name(name)
    running = [(m.host, m.owner, m.gpu_ids) for m in meshes()]
    host, gpu_ids = cluster.where(name, hosts, procs=procs, with_gpus=with_gpus, owner=owner, meshes=running)
    if host is None and with_gpus:
        gpu_ids = gpus.check(procs, f"mesh {name!r}", _held_gpus())
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
    _meshes[name] = mesh
    try:
        mesh.proc_mesh = (this_host() if host is None else host.mesh).spawn_procs(
            per_host={"procs": procs},
            name=name,
            bootstrap=functools.partial(bootstrap, proc_env, str(mesh.log_path)),
        )
        from forge_nb.system.procinfo import ProcInfo

        info = mesh.spawn("procinfo", ProcInfo)
        pids = await cluster.unless_lost(mesh.host, info.pid.call(), f"mesh {name!r} started")
        ranked = [value for _, value in sorted(pids.items(), key=lambda kv: kv[0].rank)]
        mesh.pids = [pid for pid, _ in ranked]
        if mesh.local:  # elsewhere a pid names nothing here: monarch and the host's probe watch those
            mesh.pgids, mesh.starts = [pgid for _, pgid in ranked], [started(pid) for pid, _ in ranked]
        if host is None:  # the kernel's children die with it; a job's processes belong to the job
            mesh._reaper = start_reaper(mesh.pgids, leaders=mesh.leaders())
        _start_watchdog(mesh._loop)
    except BaseException:
        await mesh.stop(timeout=5)
        raise
    return mesh


def meshes() -> list[Mesh]:
    """Every mesh this kernel spawned and has not stopped, oldest first; not those kept for a next run
    (``forge_nb.system.warm``), which are the kernel's still: :func:`stop_all` and its exit stop them."""
    return [m for m in _meshes.values() if m.state not in ("stopped", "parked")]


def adopt(mesh: Mesh, name: str, owner: str | None, log_dir: str | Path | None) -> None:
    """A kept mesh (``forge_nb.system.warm``) running again, as ``name`` (or the next free name like it), for
    ``owner``, its output to ``<log_dir>/<name>.log`` (the procs are told by the caller)."""
    _meshes.pop(mesh.name, None)
    mesh.name, mesh.owner, mesh.state, mesh.created = _unique_name(name), owner, "running", time.time()
    mesh.log_path = _log_path(mesh.name, log_dir)
    _meshes[mesh.name] = mesh
    _start_watchdog(asyncio.get_running_loop())


def get_mesh(name: str) -> Mesh:
    try:
        return _meshes[name]
    except KeyError:
        known = ", ".join(_meshes) or "none"
        raise KeyError(f"no mesh named {name!r}; this kernel holds: {known}") from None


async def stop_all(timeout: float = 10.0) -> None:
    """Stop every mesh this kernel holds (newest first), kept ones included."""
    for mesh in reversed([m for m in _meshes.values() if m.state != "stopped"]):
        await mesh.stop(timeout)


def _release(mesh: Mesh) -> None:
    _meshes.pop(mesh.name, None)
    for actor_name in mesh._actor_names:
        _actor_mesh_owner.pop(actor_name, None)


# -- Faults ----------------------------------------------------------------------------------------

def _fault_hook(failure: Any) -> None:
    """Replaces monarch's hook: record the failure for the mesh's owner; never raise."""
    try:
        actor_mesh = str(getattr(failure, "mesh_name", "") or "")
        base = actor_mesh.rsplit("-", 1)[0]
        mesh = _actor_mesh_owner.get(base)
        message = str(failure)
        if mesh is None:
            unattributed_failures.append(message[:500])
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


_watchdog: asyncio.Task[None] | None = None


def _start_watchdog(loop: asyncio.AbstractEventLoop) -> None:
    global _watchdog
    if _watchdog is None or _watchdog.done() or _watchdog.get_loop() is not loop:
        _watchdog = loop.create_task(_watch_pids(), name="forge_nb.system.runtime.watchdog")


_stopped = StoppedWatch(STOPPED_HANG_S)


async def _watch_pids() -> None:
    """Record a failure for any running mesh whose recorded proc has exited, or whose job host was lost;
    ends with the meshes."""
    while True:
        running = [m for m in list(_meshes.values()) if m.state in ("running", "failed") and m.pids]
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


def _ranks_in(message: str) -> list[int]:
    """monarch does not always fill ``crashed_ranks``; its message names the point, e.g. {'procs': 1/2}."""
    return sorted({int(r) for r in re.findall(r"\{'procs': (\d+)/\d+\}", message)})


def _kill_everything() -> None:
    """atexit: the event loop may be gone, so go straight to signals."""
    pids = [p for m in list(_meshes.values()) for p in m.alive_pids()]
    kill_pids(pids, grace=3.0)
    leaders = {g: s for m in list(_meshes.values()) for g, s in m.leaders().items()}
    kill_groups(list(leaders), leaders)
    _meshes.clear()


def end_process(status: int) -> NoReturn:
    """End this process now with exit status ``status``: kill every mesh it still holds, flush the
    output, and skip Python's exit-time teardown. For programs whose exit status matters (the test
    runner, scripts); a notebook kernel does not need it.

    Why: monarch 0.7 shuts its client down in an ``atexit`` handler. A controller it keeps in this
    process (the one behind ``get_or_spawn_controller``, torchstore's) then tells its subscribers that
    it stopped; a subscriber that was SIGKILLed earlier (a replica that died) can make that notice loop
    until its TTL expires, and the failure that follows reaches a client that is already gone, so
    monarch calls ``exit(1)``. Nothing is printed: only monarch's log says "failed to send supervision
    event to actor ... Crash the process". It happens after the program's work is done, now and then,
    and turns a passing run into exit status 1.
    """
    try:
        _kill_everything()
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    finally:
        os._exit(status)


