"""Where meshes live: the kernel's host, or the hosts of a monarch job.

By default every mesh is spawned on the kernel's host (``this_host()``). After ::

    from monarch.job import ProcessJob          # or SlurmJob(...), KubernetesJob(...)
    await forge_nb.use_job(ProcessJob({"trainer": 1, "generators": 2}))

new meshes go to the job's hosts instead: the runtime asks :meth:`Cluster.place` for a host, spawns the
mesh's processes there through the host's ``HostMesh`` slice, and records which host it is on. Nothing
here launches a process itself: the job (monarch's ``monarch.job``) brings its hosts up, and ``ProcessJob``
simulates hosts on one machine (one worker process per host), which is how the tests run.

Placement: a service's replicas spread over the hosts (the host with the fewest meshes of the same owner,
then the fewest meshes); ``hosts="generators"`` (a service's ``hosts`` option, or ``services.<name>.hosts``
in a config) keeps a mesh on that host mesh of the job; ``hosts="kernel"`` on the kernel's host (the
torchstore volume lives there). GPUs are counted per host: each host's probe reports how many it has.

Health: monarch tells the kernel of a process that dies on a live host (the runtime's fault hook), but a
host that dies whole (its worker killed, its machine gone) leaves calls to it waiting for monarch's
supervision timeout (60 s) and reports nothing for meshes nobody calls (measured with ProcessJob). So
each host runs a probe, a one-process mesh with a :class:`~forge_nb.system.runtime.procinfo.ProcInfo` actor that the
kernel calls every ``PROBE_PERIOD_S``; a probe that fails, or misses ``PROBE_MISSES`` answers in a row, marks
the host lost (:attr:`Host.lost`), the runtime's watchdog fails every mesh on it (their services respawn
them on the hosts left), and placement skips it from then on. A job that can say its scheduler ended it
(``forge_nb.system.hosts.slurm.SlurmJob.describe``: ``scancel``, a time limit) is asked every ``JOB_CHECK_S``; then
every host is lost with that reason, so what fails next names the job.

Pids: a host whose probe runs on the kernel's machine and pid namespace
(:func:`~forge_nb.system.runtime.procinfo.machine`) is *local*: the runtime may watch and signal its processes'
pids, as for the kernel's own. On any other host it does neither (a pid there names nothing here) and relies on
monarch and the probe.

Considered: a launcher of our own (ssh, srun), which the job classes already are; pinging every mesh
instead of one probe per host (the calls grow with the meshes, and a respawn would still pick a dead host,
which holds no mesh and so looks the least loaded).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge_nb.system.hosts.gpus import JobEnded, ResourceError
from forge_nb.system.monarch_compat import await_maybe

__all__ = ["KERNEL", "Cluster", "Host", "current", "job_line", "lost", "one_host", "release_job", "use_job", "where"]

logger = logging.getLogger(__name__)

PROBE_PERIOD_S = 1.0
PROBE_TIMEOUT_S = 5.0
PROBE_MISSES = 2
JOB_CHECK_S = 2.0  #: how often a job that can say it ended (a SLURM job) is asked
SUSPECT_S = 30.0
KERNEL = "kernel"  #: ``hosts=KERNEL`` keeps a mesh on the kernel's host when a job is in use


@dataclass(kw_only=True, eq=False)
class Host:
    """One host of the job: a one-host slice of one of its host meshes."""

    name: str
    """``<host mesh>[<index>]``, e.g. ``generators[1]``: how tables, errors and ``Mesh.host`` name it."""
    group: str
    mesh: Any = field(repr=False)
    gpus: int = 0
    local: bool = False
    """The kernel can see and signal this host's pids (same machine, same pid namespace)."""
    lost: str | None = None
    """Why the host is taken as dead, or None while its probe answers."""
    failed_at: float = -1e9
    """When a mesh on it last failed (time.monotonic()): placement avoids it for ``SUSPECT_S`` after, as a
    dead host is found out by its probe only seconds later."""
    probe: Any = field(default=None, repr=False)
    probe_pid: int | None = None
    reaped: list[int] = field(default_factory=list)
    """Processes an earlier controller left on the host, ended when this kernel attached (``use_job``)."""
    probe_mesh: Any = field(default=None, repr=False)


class Cluster:
    """A monarch job's hosts, their probes and the placement of new meshes on them."""

    def __init__(self, job: Any, hosts: list[Host]):
        self.job, self.hosts = job, hosts
        self.groups = sorted({h.group for h in hosts})
        self.cached_path: str | None = None  #: where the job is saved for a later kernel (use_job(path))
        self.described: dict[str, Any] = {}  #: what the job last said of itself (a SLURM job: id, state, nodes)
        self._watch: asyncio.Task[None] | None = None

    def __repr__(self) -> str:
        alive = [h.name for h in self.hosts if h.lost is None]
        return f"Cluster({type(self.job).__name__}, hosts={[h.name for h in self.hosts]}, alive={alive})"

    def find(self, name: str) -> Host | None:
        return next((h for h in self.hosts if h.name == name), None)

    def host(self, name: str) -> Host:
        found = self.find(name)
        if found is None:
            raise KeyError(f"no host {name!r} in the job; its hosts are {[h.name for h in self.hosts]}")
        return found

    def place(self, name: str, *, group: str | None, procs: int, with_gpus: bool, owner: str | None,
              meshes: Iterable[tuple[str, str | None, list[int]]]) -> Host:
        """The host for a new mesh ``name``; ``meshes`` are the running ones as (host, owner, gpu ids).
        ResourceError, saying why each host was passed over, when none can take it."""
        meshes = list(meshes)
        passed: list[str] = []
        fits: list[tuple[bool, int, int, int, Host]] = []
        for i, h in enumerate(self.hosts):
            if group is not None and h.group != group:
                continue
            if h.lost is not None:
                passed.append(f"{h.name} is lost ({h.lost})")
                continue
            free = len(self.gpu_ids(h, h.gpus, meshes))
            if with_gpus and free < procs:
                passed.append(f"{h.name} has {free} of {h.gpus} GPUs free")
                continue
            same = sum(1 for host, o, _ in meshes if host == h.name and owner is not None and o == owner)
            suspect = time.monotonic() - h.failed_at < SUSPECT_S
            fits.append((suspect, same, sum(1 for host, _, _ in meshes if host == h.name), i, h))
        if not fits and self.described.get("ended"):
            raise JobEnded(f"{self.described.get('scheduler', 'the').upper()} job {self.described.get('job_id')} "
                           f"ended ({self.described['ended']}), and its hosts with it: nothing can run there. "
                           "%forge_shutdown, allocate again (%forge_cluster ...) and %forge_attach the run "
                           "directory to go on from its last checkpoint")
        if not fits:
            where = f"host mesh {group!r}" if group else "the job"
            raise ResourceError(f"no host of {where} can take {name} ({procs} proc(s)"
                                f"{', with GPUs' if with_gpus else ''}): " + "; ".join(passed or ["it has no hosts"]))
        return min(fits, key=lambda f: f[:4])[4]

    def gpu_ids(self, host: Host, procs: int, meshes: Iterable[tuple[str, str | None, list[int]]]) -> list[int]:
        """The first ``procs`` GPUs of ``host`` that no running mesh there holds."""
        used = {g for h, _, ids in meshes if h == host.name for g in ids}
        return [g for g in range(host.gpus) if g not in used][:procs]

    def check_gpus(self, procs: int, name: str, meshes: Iterable[tuple[str, str | None, list[int]]]) -> None:
        """ResourceError unless the live hosts have ``procs`` free GPUs between them (each replica is
        placed on one host later, and fails there if none has enough)."""
        meshes = list(meshes)
        free = {h.name: len(self.gpu_ids(h, h.gpus, meshes)) for h in self.hosts if h.lost is None}
        if sum(free.values()) < procs:
            raise ResourceError(f"{name} asks for {procs} GPU(s) but the job's live hosts have {sum(free.values())} "
                                f"free ({', '.join(f'{h}: {n}' for h, n in free.items()) or 'no live host'}). "
                                "Ask for fewer, or stop a mesh first.")

    async def _watch_probes(self) -> None:
        misses = {h.name: 0 for h in self.hosts}

        async def probe(h: Host) -> None:
            try:
                await asyncio.wait_for(h.probe.pid.call_one(), PROBE_TIMEOUT_S)
                misses[h.name] = 0
            except TimeoutError:
                misses[h.name] += 1
                if misses[h.name] >= PROBE_MISSES:
                    self._lose(h, f"its probe did not answer {PROBE_MISSES} times in {PROBE_TIMEOUT_S:g} s")
            except Exception as e:  # monarch's supervision: the probe's process, or the host, is gone
                self._lose(h, f"its probe failed: {str(e).splitlines()[0][:200]}")

        checked = time.monotonic()
        while True:  # every host at once: one that hangs does not delay the others' checks
            await asyncio.sleep(PROBE_PERIOD_S)
            await asyncio.gather(*(probe(h) for h in self.hosts if h.lost is None))
            if hasattr(self.job, "describe") and time.monotonic() - checked > JOB_CHECK_S:
                checked = time.monotonic()
                try:
                    await self._check_job()
                except Exception as e:  # a scheduler that cannot say: the probes go on watching the hosts
                    logger.warning("could not ask the job how its scheduler sees it: %s", e)

    async def _check_job(self) -> None:
        """Ask the job how its scheduler sees it (``forge_nb.system.hosts.slurm.SlurmJob.describe``; kept for
        tables). A job the scheduler ended (``scancel``, a time limit) takes every host with it, and says so: what
        fails on them next names the job."""
        self.described = await asyncio.to_thread(self.job.describe)
        why = self.described.get("ended")
        if why is not None:
            for h in self.hosts:
                if h.lost is None or not h.lost.startswith("job "):
                    self._lose(h, f"job {self.described.get('job_id')} ended: {why}")

    def status(self) -> dict[str, Any]:
        """The job for tables: its kind, what its scheduler last said (id, state, nodes), and each host's
        state ("alive", or why it is lost)."""
        return {"kind": type(self.job).__name__, **self.described,
                "hosts": {h.name: h.lost or "alive" for h in self.hosts}}

    def _lose(self, host: Host, why: str) -> None:
        host.lost = why
        logger.warning("host %s is lost: %s; its meshes fail and respawn elsewhere", host.name, why)

    async def close(self, *, kill_job: bool = True) -> None:
        """Stop the probes and, with ``kill_job``, release the job's hosts (``job.kill()``: a SLURM
        allocation is given back, ProcessJob's workers end)."""
        if self._watch is not None:
            self._watch.cancel()
            with contextlib.suppress(BaseException):
                await self._watch
        for h in self.hosts:
            if h.probe_mesh is not None and h.lost is None:
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(await_maybe(h.probe_mesh.stop()), 10)
        if kill_job:
            await asyncio.to_thread(self.job.kill)


_current: Cluster | None = None


def current() -> Cluster | None:
    """The job new meshes are placed on, or None: the kernel's host."""
    return _current


def where(name: str, hosts: int | str | None, *, procs: int, with_gpus: bool, owner: str | None,
          meshes: list[tuple[str, str | None, list[int]]]) -> tuple[Host | None, list[int]]:
    """(the job host for a new mesh and its GPUs there) or (None, []): the kernel's host, whose GPUs the
    runtime counts itself. ``hosts``: None or 1 (anywhere), a host mesh of the job, or "kernel"."""
    check(hosts, name)
    job = _current if hosts != KERNEL else None
    if job is None:
        return None, []
    host = job.place(name, group=hosts if isinstance(hosts, str) else None, procs=procs, with_gpus=with_gpus,
                     owner=owner, meshes=meshes)
    return host, job.gpu_ids(host, procs, meshes) if with_gpus else []


def job_line(job: dict[str, Any]) -> str:
    """A job's :meth:`Cluster.status` in a line (``%forge_status``, ``%forge_cluster``, the dashboard): its
    scheduler's id, state and nodes, and which of its hosts are alive."""
    hosts = ", ".join(f"{name} {'alive' if why == 'alive' else 'LOST: ' + why}" for name, why in job["hosts"].items())
    if job.get("job_id") is None:
        return f"{job['kind']}: hosts {hosts}"
    return (f"{job.get('scheduler', '').upper()} job {job['job_id']}: {job['state']}, nodes "
            f"{', '.join(job.get('nodes') or [])}; hosts {hosts}")


def one_host(hosts: Any) -> bool:
    """Whether ``hosts`` is a placement's form: None or 1 (anywhere), or a host mesh's name (or "kernel")."""
    return hosts is None or (hosts == 1 and not isinstance(hosts, bool)) or (isinstance(hosts, str) and bool(hosts))


def check(hosts: int | str | None, name: str) -> None:
    """A clear error, before anything is spawned, unless ``hosts`` is a placement this kernel can make."""
    if not one_host(hosts):
        raise ResourceError(f"{name}: hosts={hosts!r}: a mesh spans one host (None or 1), or names the job's "
                            "host mesh to run on; meshes that span several hosts are not supported yet")
    if isinstance(hosts, str) and hosts != KERNEL:
        if _current is None:
            raise ValueError(f"{name}: hosts={hosts!r} names a job's host mesh, but no job is in use "
                             "(forge_nb.use_job, or %forge_cluster)")
        if hosts not in _current.groups:
            raise ValueError(f"{name}: hosts={hosts!r} is not a host mesh of the job; it has {_current.groups} "
                             f"(or hosts={KERNEL!r} for the kernel's host)")


def env(host: Host | None) -> dict[str, str]:
    """What a process learns of where it runs: its host (``FORGE_NB_HOST``; weights use it to tell same-host
    readers from others) and, while a job is in use, how many hosts its peers may be on, the kernel's
    included (``FORGE_NB_JOB_HOSTS``: more than one, and the weights it pushes are served to other hosts),
    and whether they are all on this machine (``FORGE_NB_JOB_LOCAL``)."""
    out = {"FORGE_NB_HOST": KERNEL if host is None else host.name}
    if _current is not None:
        out["FORGE_NB_JOB_HOSTS"] = str(len(_current.hosts) + 1)
        # all on the kernel's machine (ProcessJob): weight streams bind to loopback (forge_nb.weights.stream)
        out["FORGE_NB_JOB_LOCAL"] = "1" if all(h.local for h in _current.hosts) else "0"
    return out


def _find(host: str) -> Host | None:
    """The job's host named ``host``; None for the kernel's host, or when no job is in use."""
    return _current.find(host) if _current is not None else None


def note_failure(host: str) -> None:
    """A mesh on ``host`` failed (the runtime says so): placement avoids the host for a while."""
    found = _find(host)
    if found is not None:
        found.failed_at = time.monotonic()


async def unless_lost(host: str, awaitable: Any, what: str) -> Any:
    """``await awaitable``, unless the job's ``host`` is lost first (a call to a dead host waits for
    monarch's 60 s supervision timeout): then ResourceError."""
    task = asyncio.ensure_future(awaitable)
    while True:
        done, _ = await asyncio.wait({task}, timeout=0.5)
        if done:
            return task.result()
        why = lost(host)
        if why is not None:
            task.cancel()
            raise ResourceError(f"host {host} was lost before {what}: {why}")


async def end_on(host: str, pids: list[int]) -> list[int]:
    """Have the probe of the job's ``host`` kill ``pids`` there (those still its worker's processes);
    what it killed. Nothing on a lost host (gone with it) or the kernel's."""
    found = _find(host)
    if found is None or found.lost is not None or not pids:
        return []
    try:
        return await asyncio.wait_for(found.probe.end.call_one(pids), 30)
    except Exception as e:  # the host went meanwhile; the probe's watch will say so
        logger.warning("host %s: could not end processes %s: %s", host, pids, e)
        return []


def lost(host: str) -> str | None:
    """Why the job's host ``host`` is lost, or None (alive, or the kernel's host)."""
    found = _find(host)
    return None if found is None else found.lost


async def use_job(job: Any, *, cached_path: str | None = None, log_dir: str | Path | None = None,
                  reap: bool = True) -> Cluster:
    """Place the meshes spawned from now on on ``job``'s hosts (a ``monarch.job`` job: ``ProcessJob``,
    ``SlurmJob``, ``KubernetesJob``, ...). Brings the job up if it is not (``job.state(cached_path)``, which
    saves it there); a path instead of a job re-attaches to the job an earlier kernel saved there
    (monarch's ``job_load``). Starts a probe on each host, learns its GPUs and whether its pids are local,
    and (``reap``) ends what a controller that died left running on the hosts: a job has one controller.
    Meshes already running stay where they are."""
    global _current
    from forge_nb.system.processes.proclogs import bootstrap, default_log_dir
    from forge_nb.system.runtime.procinfo import ProcInfo, machine

    if _current is not None:
        raise RuntimeError(f"a job is already in use ({_current}); `await forge_nb.release_job()` first")
    if isinstance(job, str | Path):
        from monarch.job import job_load

        cached_path = str(cached_path or job)
        try:
            job = job_load(str(job))
        except FileNotFoundError:
            raise FileNotFoundError(f"no job was saved at {str(job)!r}; use_job(job, cached_path=...) saves "
                                    "one") from None
    state = await asyncio.to_thread(job.state, cached_path)
    logs = Path(log_dir or default_log_dir())
    logs.mkdir(parents=True, exist_ok=True)
    hosts = []
    for group, host_mesh in _host_meshes(state).items():
        for i in range(host_mesh.extent["hosts"]):
            hosts.append(Host(name=f"{group}[{i}]", group=group, mesh=host_mesh.slice(hosts=i)))
    kernel = machine()
    try:
        for h in hosts:
            h.probe_mesh = h.mesh.spawn_procs(
                per_host={"procs": 1}, name=f"probe-{h.group}-{h.name[len(h.group) + 1:-1]}",
                bootstrap=functools.partial(bootstrap, {}, str(logs / f"probe-{h.group}.log")))
            h.probe = h.probe_mesh.spawn("probe", ProcInfo)
            try:
                where, h.gpus = await asyncio.wait_for(h.probe.host.call_one(), 120)
            except Exception as e:
                raise ResourceError(f"host {h.name} of the job did not answer its probe: {e}") from e
            h.local = tuple(where) == kernel
            h.probe_pid = (await h.probe.pid.call_one())[0]
            if reap and not (h.local and await h.probe.parent.call_one() == os.getpid()):
                h.reaped = await h.probe.reap_siblings.call_one()
                if h.reaped:
                    logger.warning("host %s: ended %d process(es) an earlier controller left: %s", h.name,
                                   len(h.reaped), h.reaped)
    except BaseException:
        await Cluster(job, hosts).close(kill_job=False)
        raise
    cluster = Cluster(job, hosts)
    cluster.cached_path = cached_path
    if hasattr(job, "describe"):
        cluster.described = await asyncio.to_thread(job.describe)
    cluster._watch = asyncio.get_running_loop().create_task(cluster._watch_probes(), name="forge_nb.cluster.probes")
    _current = cluster
    logger.info("using %s", cluster)
    return cluster


async def release_job(*, kill_job: bool = True) -> None:
    """Stop placing meshes on the job (they go to the kernel's host again) and, with ``kill_job``,
    release its hosts. Stop the meshes on it first (``%forge_shutdown`` does both)."""
    global _current
    cluster, _current = _current, None
    if cluster is not None:
        await cluster.close(kill_job=kill_job)


def _host_meshes(state: Any) -> dict[str, Any]:
    """A JobState's host meshes by name (monarch 0.7 keeps them in ``_hosts``; attribute access only)."""
    return dict(state._hosts)

