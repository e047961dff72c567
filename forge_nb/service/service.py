"""Service: replicas of one actor class behind ``route`` / ``fanout`` / ``session``; ActorHandle for one.

Routing: ``route`` sends to the healthy replica with the fewest requests in flight, round-robin
among ties. Inside ``async with svc.session():`` the first routed call picks a replica and later
calls stick to it; if it dies, the session moves. A request whose replica dies (or hangs past
``request_timeout``) is retried once on another healthy replica, so a training loop sees one
answer. With no healthy replica, ``route`` waits up to ``route_wait_timeout`` for a respawn.

``fanout`` sends to every healthy replica and returns their answers in replica order; a replica
that dies meanwhile is left out (it runs the catch-up hook when it comes back, which is how
generators load the current weights after a respawn). So is one that stays silent
``fanout_grace_s`` after another answered: it counts as hung and is restarted, so that one hung
generator cannot hold up every weight sync (and with it training) until ``request_timeout``. An
exception raised by the endpoint's code reaches the caller unchanged and never marks a replica dead.

``ActorHandle`` (from ``.as_actor()``) is a one-replica service whose adverbs are monarch's
``call_one`` / ``call``; requests to an actor are never retried (actors hold state). The documents also
``route`` to actors (``trainer.train_step.route(batch)``): one replica is trivially routed, so an actor's
``route`` is its ``call_one`` (every proc's answers, as a service's ``route``, when it has several), and
its ``fanout`` is ``[route()]``, a one-replica service's answer list.

Failures: whatever means "the replica is gone" is an ``ActorFailure`` (see ``errors``): ``ReplicaDied``
once retries are used up (at once for an actor), ``NoHealthyReplica``, ``ActorStartFailed``.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import itertools
import logging
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from forge_nb.service.coalesce import Coalescer
from forge_nb.service.errors import ActorStartFailed, NoHealthyReplica, ReplicaDied
from forge_nb.service.options import ActorClass, Options
from forge_nb.service.replica import Replica, ReplicaStatus
from forge_nb.system.hosts import cluster
from forge_nb.system.hosts.gpus import ResourceError
from forge_nb.system.runtime import lifecycle, spawning

__all__ = ["ActorHandle", "Affinity", "NoHealthyReplica", "Service", "ServiceEvent"]

logger = logging.getLogger(__name__)

#: service id -> the Affinity of the session the current task is in.
_SESSIONS: contextvars.ContextVar[dict[int, Affinity] | None] = contextvars.ContextVar(
    "forge_nb_sessions", default=None)
_ids = itertools.count()


@dataclass(slots=True)
class Affinity:
    """The replica a session's calls stick to (None until its first call). ``session()`` makes a fresh one;
    hand the same one to several ``session(affinity)`` blocks to keep calls that arrive separately (the
    requests of one trajectory to the OpenAI endpoint) on one replica."""

    replica: int | None = None


@dataclass(kw_only=True, slots=True)
class ServiceEvent:
    """A replica changed state (starting, healthy, recovering, failed, stopped)."""

    service: str
    replica: int
    old: str
    new: str
    reason: str
    time: float = field(default_factory=time.time)


class Service:
    """Replicas of ``actor_cls``, each on its own mesh. Endpoints: ``svc.<endpoint>.route(...)``."""

    def __init__(self, actor_cls: ActorClass, options: Options, args: tuple[Any, ...],
                 kwargs: dict[str, Any], name: str | None = None):
        self.name = name or actor_cls.__name__
        self.actor_cls = actor_cls
        self.options = options
        self._endpoints = set(actor_cls.endpoint_names())
        self._adverbs: dict[str, Any] = {}
        self._id = next(_ids)
        self.holder = f"{self.name}#{self._id}"
        """This service's id in the kernel: its lease holder name and its meshes' ``owner``."""
        self.replicas = [Replica(self.name, i, actor_cls, options, args, kwargs, self._state_changed,
                                 owner=self.holder) for i in range(options.num_replicas)]
        self.events: deque[ServiceEvent] = deque(maxlen=1000)
        self._subscribers: list[Callable[[ServiceEvent], None]] = []
        self._changed = asyncio.Event()
        self._rr = 0
        #: endpoint -> what gathers its concurrent route() calls (``forge_nb.service.coalesce``)
        self.coalescers = {name: Coalescer(self, name, batch) for name, batch in batched_endpoints(actor_cls).items()
                           if options.procs == 1}

    @classmethod
    async def start(cls, actor_cls: ActorClass, options: Options, args: tuple[Any, ...],
                    kwargs: dict[str, Any], *, setup_after: asyncio.Future[Any] | None = None) -> Service:
        """Spawn every replica concurrently; if any fails to start, stop them all and raise its error.

        GPUs for every replica are checked first. The service leases the runtime, and a class that moves
        weights (``needs_store``) leases the kernel's torchstore too (starting it if it is down: the
        documents' code never starts it itself), both until ``shutdown``. ``setup_after``: the replicas'
        processes and actors start at once, their ``setup`` once it is done (its error fails the start)."""
        svc = cls.prepare(actor_cls, options, args, kwargs)
        await svc.begin(setup_after=setup_after)
        return svc

    @classmethod
    def prepare(cls, actor_cls: ActorClass, options: Options, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> Service:
        """:meth:`start` in two halves: the service, its hosts and GPUs checked, its replicas not started (all
        "starting"); ``await svc.begin()`` starts them. A caller may hold the service, and set its catch-up hook
        and subscribers, before any replica serves (a run whose trainer stands in for its generators meanwhile)."""
        cluster.check(options.hosts, actor_cls.__name__)
        if options.with_gpus:
            spawning.check_gpus(options.procs * options.num_replicas,
                               f"{actor_cls.__name__} ({options.num_replicas} replica(s) x {options.procs} procs)")
        return cls(actor_cls, options, args, kwargs)

    async def begin(self, *, setup_after: asyncio.Future[Any] | None = None) -> None:
        """Start the replicas of a service from :meth:`prepare` (see :meth:`start`); a failure stops them all."""
        actor_cls = self.actor_cls
        try:
            await lifecycle.lease(self.holder)
        except BaseException:
            await self._release()
            raise
        if actor_cls.needs_store:
            # the store starts (if it is down) while the replicas' processes do; their setup waits for it
            from forge_nb import weights

            leasing = asyncio.ensure_future(weights.lease_store(self.holder))
            setup_after = asyncio.gather(*(x for x in (setup_after, leasing) if x is not None))
            setup_after.add_done_callback(lambda f: f.cancelled() or f.exception())  # the replicas report it
        for replica in self.replicas:
            replica.setup_after = setup_after
        results = await asyncio.gather(*(r.start() for r in self.replicas), return_exceptions=True)
        errors = [(r, e) for r, e in zip(self.replicas, results, strict=True) if isinstance(e, BaseException)]
        if errors:
            if actor_cls.needs_store:
                with contextlib.suppress(BaseException):  # held before shutdown releases it, or never
                    await leasing
            await self.shutdown()
            replica, error = errors[0]
            if isinstance(error, ActorStartFailed | ResourceError):
                # the first names the user's exception and carries its traceback text; the second says
                # what the machine lacks, before anything was spawned
                raise error
            raise ActorStartFailed(f"{replica.name} failed to start: {type(error).__name__}: {error}",
                                   replica=replica.name, exception=error) from error

    # -- the user's surface -----------------------------------------------------------------------

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_") or name not in self.__dict__.get("_endpoints", ()):
            known = ", ".join(sorted(self.__dict__.get("_endpoints", ()))) or "none"
            raise AttributeError(f"{type(self).__name__} {self.__dict__.get('name')!r} has no endpoint "
                                 f"{name!r}; its endpoints: {known}")
        endpoint = self.__dict__["_adverbs"].get(name)
        if endpoint is None:  # made once per name: `svc.ep` sits on the hot path of every request
            endpoint = self.__dict__["_adverbs"][name] = self._endpoint(name)
        return endpoint

    def _endpoint(self, name: str) -> Any:
        return ServiceEndpoint(self, name)

    @contextlib.asynccontextmanager
    async def session(self, affinity: Affinity | None = None) -> AsyncIterator[None]:
        """Calls routed inside stick to one replica (and move if it dies); ``affinity`` carries that replica
        from one ``session`` block to the next (see :class:`Affinity`)."""
        token = _SESSIONS.set({**(_SESSIONS.get() or {}), self._id: affinity or Affinity()})
        try:
            yield
        finally:
            _SESSIONS.reset(token)

    def status(self) -> list[ReplicaStatus]:
        return [r.status() for r in self.replicas]

    def subscribe(self, callback: Callable[[ServiceEvent], None]) -> Callable[[], None]:
        """``callback(event)`` on every replica state change, on the kernel's event loop; returns an
        unsubscribe function."""
        self._subscribers.append(callback)
        return lambda: self._subscribers.remove(callback) if callback in self._subscribers else None

    def set_catch_up(self, hook: Callable[[Replica], Awaitable[None]] | None) -> None:
        """Run ``await hook(replica)`` on a respawned replica before it takes traffic."""
        for r in self.replicas:
            r.catch_up = hook

    async def shutdown(self) -> None:
        """Stop every replica, then release this service's leases (the store stops with its last user)."""
        try:
            await asyncio.gather(*(r.stop() for r in self.replicas), return_exceptions=True)
        finally:
            await self._release()

    async def _release(self) -> None:
        try:
            if self.actor_cls.needs_store:
                from forge_nb import weights

                await weights.release_store(self.holder)
        finally:
            await lifecycle.release(self.holder)

    def __repr__(self) -> str:
        states = ", ".join(r.state for r in self.replicas)
        return f"<{type(self).__name__} {self.name}: {len(self.replicas)} replica(s) [{states}]>"

    # -- routing --------------------------------------------------------------------------------

    async def _route(self, endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any],
                     retry: bool = True, all_ranks: bool = False) -> Any:
        sessions = _SESSIONS.get() or {}
        in_session = self._id in sessions
        tried: set[int] = set()
        deaths = 0
        while True:
            sticky = sessions[self._id].replica if in_session else None
            replica = self._pick_now(tried, sticky) or await self._wait_for_replica(tried, sticky)
            if in_session:
                sessions[self._id].replica = replica.index
            try:
                return await replica.call(endpoint, args, kwargs, all_ranks=all_ranks)
            except ReplicaDied:
                # Once on each other replica, and when every one has died under it (all killed at once),
                # once more on the first to come back; a request that kills whatever runs it stops there.
                deaths += 1
                if not retry or deaths > len(self.replicas):
                    raise
                tried.add(replica.index)
                logger.info("%s.%s: %s died mid-request; retrying elsewhere",
                            self.name, endpoint, replica.name)

    def _pick_now(self, avoid: set[int], sticky: int | None) -> Replica | None:
        """The sticky replica if healthy; else the least loaded healthy one not in ``avoid`` (round robin
        among ties), or any healthy one when all are in ``avoid``; None when none is healthy."""
        replicas = self.replicas
        if sticky is not None and replicas[sticky].state == "healthy":
            return replicas[sticky]
        tied: list[Replica] = []
        least = -1
        for fallback in (False, True):  # first without the replicas to avoid, then with them
            for r in replicas:
                if r.state != "healthy" or (r.index in avoid and not fallback):
                    continue
                if not tied or r.in_flight < least:
                    tied, least = [r], r.in_flight
                elif r.in_flight == least:
                    tied.append(r)
            if tied:
                self._rr += 1
                return tied[self._rr % len(tied)]
            if not avoid:
                return None
        return None

    async def _wait_for_replica(self, avoid: set[int], sticky: int | None) -> Replica:
        """The first replica to become healthy, within ``route_wait_timeout``; NoHealthyReplica if none."""
        deadline = time.monotonic() + self.options.route_wait_timeout
        while True:
            replica = self._pick_now(avoid, sticky)
            if replica is not None:
                return replica
            if all(r.state in ("failed", "stopped") for r in self.replicas):
                raise NoHealthyReplica(self._down_message("and none is coming back"))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise NoHealthyReplica(self._down_message(
                    f"and none recovered within route_wait_timeout={self.options.route_wait_timeout}s"))
            changed = self._changed
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(changed.wait(), remaining)

    def _down_message(self, tail: str) -> str:
        states = "; ".join(f"{r.name} {r.state} ({r.last_error})" for r in self.replicas)
        return f"service {self.name!r} has no healthy replica {tail}: {states}"

    async def _fanout(self, endpoint: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> list[Any]:
        healthy = [r for r in self.replicas if r.healthy] or [await self._wait_for_replica(set(), None)]
        all_ranks = self.options.procs > 1
        calls = {asyncio.ensure_future(r.call(endpoint, args, kwargs, all_ranks)): r for r in healthy}
        try:
            await self._bound_stragglers(endpoint, calls)
        finally:
            for task in calls:  # the caller was cancelled: so are the requests it made
                task.cancel()
        results = [task.exception() or task.result() for task in calls]
        for r in results:
            if isinstance(r, BaseException) and not isinstance(r, ReplicaDied):
                raise r
        return [r for r in results if not isinstance(r, ReplicaDied)]

    async def _bound_stragglers(self, endpoint: str, calls: dict[asyncio.Future[Any], Replica]) -> None:
        """Wait for every call; once one replica has answered, a replica still silent ``fanout_grace_s``
        later (or four times the first answer's time, if longer) is counted as hung (see ``Options``)."""
        grace = self.options.fanout_grace_s
        pending, start = set(calls), time.perf_counter()
        while pending and grace is not None:
            done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
            if any(task.exception() is None for task in done):  # an answer, not a death
                break
        if pending and grace is not None:
            bound = max(grace, 4 * (time.perf_counter() - start))
            _, late = await asyncio.wait(pending, timeout=bound)
            for task in late:
                calls[task].hung(f"no answer to {endpoint}.fanout() {bound:.1f} s after another replica's: hung")
        if pending:
            await asyncio.wait(pending)

    def _state_changed(self, replica: Replica, old: str, new: str, reason: str) -> None:
        event = ServiceEvent(service=self.name, replica=replica.index, old=old, new=new, reason=reason)
        self.events.append(event)
        self._changed.set()
        self._changed = asyncio.Event()
        for callback in list(self._subscribers):
            try:
                callback(event)
            except Exception:
                logger.exception("a subscriber of service %s raised", self.name)


class ActorHandle(Service):
    """One replica, from ``.as_actor()``: ``await actor.ep.call_one(...)`` / ``.call(...)``."""

    @classmethod
    async def start(cls, actor_cls: ActorClass, options: Options, args: tuple[Any, ...],
                    kwargs: dict[str, Any], *, setup_after: asyncio.Future[Any] | None = None) -> ActorHandle:
        handle = await super().start(actor_cls, options, args, kwargs, setup_after=setup_after)
        assert isinstance(handle, ActorHandle)
        return handle

    @classmethod
    async def start_on(cls, host: ActorHandle, actor_cls: ActorClass, kwargs: dict[str, Any]) -> ActorHandle:
        """One more actor in the processes of ``host`` (an actor of one replica): several runs' trainers on one
        base model (``forge_nb.controller.lifecycle.on_base``). Its stop leaves the processes to ``host``; it is never
        respawned (a death of the processes is the host's to deal with)."""
        handle = cls(actor_cls, dataclasses.replace(host.options, max_restarts=0), (), kwargs)
        handle.replica.host = host.replica
        await lifecycle.lease(handle.holder)
        try:
            if actor_cls.needs_store:
                from forge_nb import weights

                await weights.lease_store(handle.holder)
            await handle.replica.start()
        except BaseException:
            await handle.shutdown()
            raise
        return handle

    def _endpoint(self, name: str) -> Any:
        return ActorEndpoint(self, name)

    @property
    def replica(self) -> Replica:
        return self.replicas[0]


def batched_endpoints(actor_cls: ActorClass) -> dict[str, str]:
    """The class's ``batched_endpoints`` (endpoint -> its batch form), checked: both must be endpoints. A
    pair is left out where a subclass overrides the single endpoint below the class that wrote the batch
    form (``class Mine(Generator)`` with its own ``generate``): the batch form would bypass the override."""
    declared = dict(getattr(actor_cls, "batched_endpoints", None) or {})
    names = set(actor_cls.endpoint_names())
    wrong = sorted(f"{one} -> {many}" for one, many in declared.items() if one not in names or many not in names)
    if wrong:
        raise TypeError(f"{actor_cls.__name__}.batched_endpoints names what is not an endpoint: {', '.join(wrong)}")

    def written_in(name: str) -> type:
        return next(c for c in actor_cls.__mro__ if name in vars(c))

    return {one: many for one, many in declared.items() if issubclass(written_in(many), written_in(one))}


class ServiceEndpoint:
    """``svc.<endpoint>``: the adverbs of a service."""

    def __init__(self, service: Service, name: str):
        self._service, self._name = service, name

    async def route(self, *args: Any, **kwargs: Any) -> Any:
        """Send to one healthy replica (least loaded; sticky inside a session). Concurrent calls of an endpoint
        the actor class batches go out together (``forge_nb.service.coalesce``)."""
        svc = self._service
        coalescer = svc.coalescers.get(self._name)
        if coalescer is not None and len(args) == 1 and svc._id not in (_SESSIONS.get() or {}):
            return await coalescer.route(args[0], kwargs)
        return await svc._route(self._name, args, kwargs, all_ranks=svc.options.procs > 1)

    async def fanout(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Send to every healthy replica; their answers in replica order."""
        return await self._service._fanout(self._name, args, kwargs)

    def _wrong(self, adverb: str) -> Any:
        raise AttributeError(
            f"{self._service.name}.{self._name}.{adverb}(): {self._service.name} is a service; use "
            f".route() for one replica or .fanout() for all (.{adverb}() is for actors from .as_actor())"
        )

    def call_one(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrong("call_one")

    def call(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrong("call")

    def choose(self, *args: Any, **kwargs: Any) -> Any:
        return self._wrong("choose")


class ActorEndpoint:
    """``actor.<endpoint>``: the adverbs of an actor (one replica, never retried)."""

    def __init__(self, handle: ActorHandle, name: str):
        self._handle, self._name = handle, name

    async def call_one(self, *args: Any, **kwargs: Any) -> Any:
        if self._handle.options.procs > 1:
            raise ValueError(f"{self._handle.name}.{self._name}.call_one(): the actor has "
                             f"{self._handle.options.procs} procs; use .call() to reach them all")
        return await self._handle._route(self._name, args, kwargs, retry=False)

    async def call(self, *args: Any, **kwargs: Any) -> list[Any]:
        """Every proc of the actor; answers in rank order."""
        return await self._handle._route(self._name, args, kwargs, retry=False, all_ranks=True)

    async def route(self, *args: Any, **kwargs: Any) -> Any:
        """As a service's ``route`` with its one replica: ``call_one``, or every proc's answers in rank order
        when the actor has several procs. Never retried: a death raises ``ReplicaDied`` (an ActorFailure)."""
        handle = self._handle
        return await handle._route(self._name, args, kwargs, retry=False, all_ranks=handle.options.procs > 1)

    async def fanout(self, *args: Any, **kwargs: Any) -> list[Any]:
        """As a service's ``fanout`` with its one replica: ``[route(...)]``."""
        return [await self.route(*args, **kwargs)]
