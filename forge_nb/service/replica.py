"""Replica: one copy of an actor on its own process mesh, with health, respawn and stats.

States::

    starting ──setup ok──> healthy ──process died / request hung──> recovering ──respawned──> healthy
        │                                                             │
        └──setup failed──> failed <── more than max_restarts in a row ┘         stop() ──> stopped

"In a row": a replica that served ``restart_reset_s`` since its last respawn starts a new count (and
its backoff starts over), so a long run survives any number of spread-out deaths.

A process death is learnt from the runtime (its pid watchdog or monarch's fault hook, both within a
second) and fails every request in flight on that replica at once with :class:`ReplicaDied`, so the
service can retry it elsewhere without waiting for monarch's own timeout. A request that outlives
``request_timeout`` counts the replica as hung: it is killed and respawned, and the late answer is
discarded. An exception raised by the endpoint's own code is the caller's business: it is returned
as the error and the replica stays healthy.

A replica that cannot come up raises :class:`ActorStartFailed` from ``start``: the user's exception
(from ``__init__`` or ``setup``) with its traceback text, or, when the process died instead, monarch's
whole report of the death (it carries the traceback of what killed it, when there is one).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from monarch.actor import ActorError

from forge_nb.service.errors import ActorStartFailed, ReplicaDied
from forge_nb.service.options import ActorClass, Options
from forge_nb.system.hosts.gpus import JobEnded
from forge_nb.system.processes.procs import kill_pids
from forge_nb.system.runtime import registry, spawning, warm

__all__ = ["STATES", "Replica", "ReplicaDied", "ReplicaStatus"]

logger = logging.getLogger(__name__)

STATES = ("starting", "healthy", "recovering", "failed", "stopped")


@dataclass(kw_only=True, slots=True)
class ReplicaStatus:
    """Plain data for tables and widgets."""

    service: str
    index: int
    state: str
    pids: list[int]
    in_flight: int
    served: int
    failures: int
    restarts: int
    latency_p50_ms: float | None
    latency_p95_ms: float | None
    last_error: str | None
    version: int | None
    host: str = "kernel"
    """The host its processes run on: "kernel", or a job's host (``forge_nb.system.hosts.cluster``)."""


class Replica:
    """One replica: spawns its mesh and actor, forwards calls, and recovers from process death."""

    def __init__(self, service: str, index: int, actor_cls: ActorClass, options: Options,
                 args: tuple[Any, ...], kwargs: dict[str, Any],
                 on_state: Callable[[Replica, str, str, str], None], *, owner: str | None = None):
        self.service, self.index = service, index
        self.owner = owner or service  # the ``owner`` of its meshes: its service's lease holder id
        self._cls, self._options, self._args, self._kwargs = actor_cls, options, args, kwargs
        self._on_state = on_state
        self.catch_up: Callable[[Replica], Awaitable[None]] | None = None
        self.setup_after: asyncio.Future[Any] | None = None  # the first setup waits for it (Service.start)
        self.host: Replica | None = None  # a guest's: the replica whose processes its actor runs in (start_on)
        self.state = "starting"
        self.mesh: registry.Mesh | None = None
        self.actor: Any = None
        self.in_flight = self.served = self.failures = self.restarts = 0
        self._streak = 0  # respawns since the replica last served restart_reset_s
        self._healthy_since: float | None = None
        self.last_error: str | None = None
        self.version: int | None = None
        self._latencies: deque[float] = deque(maxlen=256)
        self._dead = False
        self._death_report = ""  # the whole text of the last death (last_error keeps its first line)
        self._waiting: set[asyncio.Task[Any]] = set()  # tasks awaiting a request on this replica
        self._cancelled: set[asyncio.Task[Any]] = set()  # ... of which we cancelled (death)
        self._recovery: asyncio.Task[None] | None = None

    @property
    def name(self) -> str:
        return f"{self.service}[{self.index}]"

    @property
    def healthy(self) -> bool:
        return self.state == "healthy"

    # -- lifecycle ------------------------------------------------------------------------------

    async def start(self) -> None:
        """Spawn mesh and actor, run ``setup`` and the catch-up hook; healthy when all succeed."""
        self._dead = False
        self._death_report = ""
        base = self._options.mesh_name or self._cls.__name__.lower()
        if self.host is not None:  # a guest: one more actor in the host's processes, which it never stops
            if not self.host.healthy or self.host.mesh is None:
                raise ActorStartFailed(f"{self.name} cannot start on {self.host.name}: it is {self.host.state}",
                                       replica=self.name)
            self.mesh = self.host.mesh
        else:  # a process an earlier run of the kernel left warm, or new ones
            name, o = f"{base}-r{self.index}", self._options
            self.mesh = await warm.take(self._warm_shape(), name, self.owner, o.log_dir) or await spawning.spawn_mesh(
                name, o.procs, o.with_gpus, hosts=o.hosts, env=o.env, owner=self.owner, log_dir=o.log_dir)
        self.mesh.on_failure(self._process_died)
        self.actor = self.mesh.spawn(self._cls.__name__.lower(), self._cls.spawn_class(),
                                     *self._args, **self._kwargs)
        try:
            if self.setup_after is not None:  # e.g. the model setup loads, still being written by the kernel
                await self._race(asyncio.shield(self.setup_after), timeout=None)
                self.setup_after = None
            await self._race(self.actor.setup.call(), timeout=None)
        except ActorError as e:  # __init__ or setup raised: the user's exception, as it was raised
            exc = e.exception
            raise ActorStartFailed(
                f"{self.name} failed to start: {type(exc).__name__}: {exc}\n{e.exception_formatted}",
                replica=self.name, exception=exc, remote_traceback=e.exception_formatted,
            ) from exc
        except ReplicaDied as e:
            report = self._death_report or str(e)
            raise ActorStartFailed(f"{self.name} failed to start: its process died: {report}",
                                   replica=self.name, remote_traceback=report) from None
        if self.catch_up is not None:
            await self.catch_up(self)
        self._set_state("healthy", "ready")

    async def stop(self) -> None:
        """Stop serving; a healthy replica's processes are kept warm for the kernel's next run when they can be
        (``forge_nb.system.runtime.warm``), else stopped."""
        if self._recovery is not None and self._recovery is not asyncio.current_task():
            self._recovery.cancel()
        healthy = self.healthy
        self._set_state("stopped", "shut down")
        if healthy and self.host is None and self.mesh is not None and await warm.park(
                self.mesh, self.actor, self._warm_shape()):
            return
        await self._stop_mesh()

    def _warm_shape(self) -> tuple[Any, ...] | None:
        o = self._options
        return warm.shape(self._cls.__name__, o.procs, o.with_gpus, o.hosts, o.env)

    async def _stop_mesh(self) -> None:
        """Stop this replica's processes; a guest's are its host's, which stops them."""
        if self.mesh is not None and self.host is None:
            await self.mesh.stop()

    async def wait_healthy(self, timeout: float = 120.0) -> None:
        """Wait until this replica serves again; raise if it gave up (failed) or ``timeout`` passes."""
        deadline = time.monotonic() + timeout
        while not self.healthy:
            if self.state in ("failed", "stopped"):
                raise ReplicaDied(f"{self.name} is {self.state}: {self.last_error}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"{self.name} still {self.state} after {timeout:.0f} s: {self.last_error}")
            await asyncio.sleep(0.1)

    def _process_died(self, failure: registry.Failure) -> None:
        self._death_report = self._death_report or failure.message
        self._mark_dead(f"process died: {failure.message.splitlines()[0][:200]}")

    def _mark_dead(self, reason: str, cancel: bool = True) -> None:
        """Fail everything in flight now; a healthy replica goes on to recover in the background."""
        if self.state in ("failed", "stopped") or self._dead:
            return
        self.failures += 1
        self.last_error = reason
        self._dead = True
        if self._healthy_since is not None and time.monotonic() - self._healthy_since >= self._options.restart_reset_s:
            self._streak = 0  # it had served long enough: this death does not continue a crash loop
        self._healthy_since = None
        if cancel:
            for task in list(self._waiting):
                if task is not asyncio.current_task():
                    self._cancelled.add(task)
                    task.cancel(f"{self.name} died")
        if self.state == "healthy":  # during start() the caller of start() decides what follows
            self._set_state("recovering", reason)
            self._recovery = asyncio.get_running_loop().create_task(
                self._recover(), name=f"forge_nb.recover.{self.name}")

    async def _recover(self) -> None:
        """Respawn with exponential backoff; give up (failed) after ``max_restarts``."""
        while self.state == "recovering":
            if self._streak >= self._options.max_restarts:
                self._set_state("failed", f"gave up after {self._streak} restarts in a row: {self.last_error}")
                await self._stop_mesh()
                return
            await asyncio.sleep(self._options.restart_backoff * 2 ** self._streak)
            self.restarts += 1
            self._streak += 1
            await self._stop_mesh()
            try:
                await self.start()  # state stays "recovering" until it turns healthy
            except JobEnded as e:  # its hosts went with the job: no respawn can succeed, so none is tried again
                self.failures += 1
                self.last_error = str(e)[:300]
                self._set_state("failed", self.last_error)
                return
            except Exception as e:
                self.failures += 1
                self.last_error = f"respawn {self.restarts} failed: {type(e).__name__}: {e}"[:300]
                logger.warning("%s: %s", self.name, self.last_error)

    def _set_state(self, new: str, reason: str) -> None:
        old, self.state = self.state, new
        if new == "healthy":
            self._healthy_since = time.monotonic()
        if old != new:
            self._on_state(self, old, new, reason)

    # -- calls ----------------------------------------------------------------------------------

    async def call(self, endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                   all_ranks: bool = False) -> Any:
        """Send one request (to every proc, answers in rank order, if ``all_ranks``).

        Raises ``ReplicaDied`` if the process dies or hangs meanwhile. A replica of one proc is called with
        monarch's ``choose``, which on a mesh of one actor is ``call_one`` by another path: in monarch 0.7 each
        ``call_one`` or ``call`` leaves ~0.5-1.1 KB of native memory in the calling process (the kernel) that is
        never given back, ``choose`` ~20-60 B (20,000 calls of each to an echo actor), and a run makes several
        calls a step for as long as the kernel lives."""
        if not self.healthy:
            raise ReplicaDied(f"{self.name} is {self.state}")
        ep, one = getattr(self.actor, endpoint), self._options.procs == 1
        if one:
            request = ep.choose(*args, **kwargs)
        else:
            request = ep.call(*args, **kwargs) if all_ranks else ep.call_one(*args, **kwargs)
        self.in_flight += 1
        start = time.perf_counter()
        try:
            result = await self._race(request, self._options.request_timeout)
        finally:
            self.in_flight -= 1
        self._latencies.append(time.perf_counter() - start)
        self.served += 1
        if all_ranks:
            result = [result] if one else [v for _, v in sorted(result.items(), key=lambda kv: kv[0].rank)]
        return result

    async def _race(self, request: Awaitable[Any], timeout: float | None) -> Any:
        """Await ``request`` unless the replica dies first or it takes longer than ``timeout``.

        The hot path adds no task of its own: the calling task registers itself, and a death
        cancels it (see ``_mark_dead``), which we turn back into ``ReplicaDied`` here.
        """
        task = asyncio.current_task()
        assert task is not None
        self._waiting.add(task)
        try:
            async with asyncio.timeout(timeout):
                return await request
        except ActorError:
            raise  # the endpoint's own exception: the replica is fine
        except asyncio.CancelledError:
            if task not in self._cancelled:
                raise  # cancelled by its owner, not by us
            self._cancelled.discard(task)
            task.uncancel()
            raise ReplicaDied(f"{self.name}: {self.last_error}") from None
        except TimeoutError:
            self._mark_dead(f"request exceeded request_timeout={timeout}s: replica hung", cancel=False)
            self._kill_hung()
            raise ReplicaDied(f"{self.name}: no answer within request_timeout={timeout}s") from None
        except Exception as e:  # monarch's SupervisionError and friends: the process is gone
            self._death_report = self._death_report or str(e)
            self._mark_dead(f"{type(e).__name__}: {str(e).splitlines()[0][:200]}")
            raise ReplicaDied(f"{self.name}: {e}") from e
        finally:
            self._waiting.discard(task)

    def hung(self, reason: str) -> None:
        """Count the replica as hung: its requests in flight fail with ``ReplicaDied``, it is killed and respawned."""
        self._mark_dead(reason)
        self._kill_hung()

    def _kill_hung(self) -> None:
        """A hung process (e.g. SIGSTOP) never dies by itself: kill it so the mesh can be replaced."""
        if self.mesh is not None:
            kill_pids(self.mesh.alive_pids(), grace=0.0)

    # -- stats ----------------------------------------------------------------------------------

    def status(self) -> ReplicaStatus:
        lat = sorted(self._latencies)

        def pct(q: float) -> float | None:
            return round(1000 * lat[min(len(lat) - 1, int(q * len(lat)))], 2) if lat else None

        return ReplicaStatus(
            service=self.service, index=self.index, state=self.state,
            pids=list(self.mesh.pids) if self.mesh else [], in_flight=self.in_flight,
            served=self.served, failures=self.failures, restarts=self.restarts,
            latency_p50_ms=pct(0.5), latency_p95_ms=pct(0.95), last_error=self.last_error,
            version=self.version, host=self.mesh.host if self.mesh else "kernel",
        )
