"""WeightSync: the only code that moves a run's policy weights: push, fan out, record, drop.

::

    trainer.push_weights(v) ──> torchstore "<namespace>.v<v>" ──> policy.update_weights.fanout(v)
                                   │                                  └─> each healthy replica: version = v
                                   └─ older versions dropped (except one a catching-up replica is reading)

Each run has its own key namespace (``weights.namespace_for(run name)``), so runs side by side in
one kernel never see or drop each other's versions; the trainer and generators of the run were
spawned with it (``weights_namespace=``). The run holds a torchstore lease for as long as it lives
(``open``/``close``): the store stops when the last run (or service) using it lets go.

A replica that (re)spawns loads the current version before it takes traffic (``catch_up``); while
it reads, that version is pinned so the steps going on meanwhile do not delete it mid-read.

Overlap (``publish(v, overlap=True)``, the async loop's way): the push is awaited, the generators'
load of ``v`` runs in the background while the trainer starts its next step, and the next publish
(or ``settle()``) waits for it first. At most one load is in flight and versions load in order. On two
CPU cores the load (fetch, reload into vLLM, its RPCs: ~70 ms of a ~130 ms quickstart step) was the
largest part of a step; the trainer needs none of it to train on episodes that may be
``max_policy_age`` versions old anyway. ``bench/vs_trl.py`` measures the effect. Deleting the older
versions after a load (a store call each, with the manifest the push returned) runs in the background in either mode:
the next push does not wait for it, ``settle()`` does, so a parked run holds one version.

Held versions (``publish(v, overlap=True, hold=True)``, the loop's way between two of ``loop.sync_interval``'s
loads): ``v`` becomes the run's version without a push or a load; the generators keep the one they have, and
``settle()`` (the run parks or evaluates) pushes and loads the newest first. On two CPU cores a load
every other step let one engine batch serve two steps (32 sequences instead of 16): ~20% more steps a second
for the quickstart (``bench/vs_trl.py``).

Handed manifests: when the generators' ``update_weights`` takes ``manifest=`` (forge_nb's Generator), each is
handed where the push left the version in shared memory and need not ask torchstore. When the trainer's
``push_weights`` also takes ``announce=`` (forge_nb's RLTrainer), it leaves the manifest's torchstore put to
this class, which does it in the background, in version order, before any deletion of that version and
before ``settle()`` returns: the put was 5 of a push's 8 ms, paid by every step. Such a version's
readers were all handed it, so the store need not name every one: at most one put per ``ANNOUNCE_EVERY_S``,
of the newest version, and ``settle()`` puts the run's version. A version pushed and dropped between two puts
never enters the store, and its deletion is its file's alone (no store call): on the quickstart's ~40 ms steps
the put and the delete of each version took about a third of the kernel's work a step. Actors written
as the documents write them get neither keyword and are called as the documents call them.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import time
from collections import Counter
from typing import Any

from forge_nb import weights

logger = logging.getLogger(__name__)
_live_namespaces: set[str] = set()  # of the WeightSyncs open in this kernel
#: At most one torchstore put of a handed manifest per this many seconds (the newest; see the module docstring).
ANNOUNCE_EVERY_S = 0.5


class WeightSync:
    """Weight versions of one run: ``version`` is the trainer's latest, ``pushed`` the latest in the store (the
    same unless ``version`` is held), and every healthy generator has ``version`` once ``settle()`` returned
    (publishing without ``overlap`` settles before returning)."""

    def __init__(self, namespace: str, *, lane: bool = False):
        self.namespace = namespace
        # a run on another run's base: its versions are a lane of the base's generators (update_weights(v,
        # namespace=)), whose replicas' `version` is the base run's to record
        self.lane = lane
        self.trainer: Any = None  # set by attach(), once the run's services are up
        self.policy: Any = None
        self.version = 0
        self.pushed = 0  #: the newest version pushed: ``version`` unless a publish held it
        self._loaded: asyncio.Event | None = None  # set when the generators' next load is recorded
        self._pinned: Counter[int] = Counter()
        self._claimed = False  # holds the namespace (claim)
        self._open = False  # holds the store's lease too (open)
        self._loading: asyncio.Future[float] | None = None  # the generators' load of ``version``, overlapped
        self._dropping: asyncio.Future[None] | None = None  # the older versions' deletion after a load
        self._pushing: int | None = None  # the version being pushed: in the store before ``version`` names it
        self._pushed: dict[int, dict[str, Any] | None] = {}  # versions pushed and not dropped: their manifests
        self._hand_manifests = False  # whether the generators' update_weights takes ``manifest=``
        self._announce_here = False  # whether the trainer leaves the manifest's torchstore put to us
        self._announcing: asyncio.Future[None] | None = None  # putting the latest handed manifest in the store
        self._pending: tuple[int, dict[str, Any]] | None = None  # the newest handed manifest not put yet
        self._unstored: set[int] = set()  # pushed versions whose manifest this class has not put (yet, or ever)
        self._announced_at = -math.inf  # when the last put began (time.monotonic())
        self.store_puts = 0  # manifests this class put in the store

    def claim(self) -> None:
        """Take the run's namespace (one run per namespace in a kernel): a ValueError, before anything is
        spawned, if a live run has it. ``open`` claims it too; spawning claims it first so that the store's
        start can overlap the services' (see ``forge_nb.controller.lifecycle.build``)."""
        if self._claimed:
            return
        if self.namespace in _live_namespaces:
            raise ValueError(f"weight namespace {self.namespace!r} is in use by a live run in this kernel; "
                             "give the new run another name (RunConfig.name / --name)")
        _live_namespaces.add(self.namespace)
        self._claimed = True

    async def open(self) -> None:
        """Claim the run's namespace and take its torchstore lease."""
        self.claim()
        await weights.lease_store(self.namespace)
        self._open = True

    def attach(self, trainer: Any, policy: Any) -> None:
        """The services whose weights this moves (spawned with ``weights_namespace=self.namespace``)."""
        self.trainer, self.policy = trainer, policy
        self._hand_manifests = _takes(policy, "update_weights", "manifest")
        self._announce_here = self._hand_manifests and _takes(trainer, "push_weights", "announce")

    async def close(self) -> None:
        """Drop every version of this run and release its lease (the store stops if it was the last)."""
        if self._claimed:
            _live_namespaces.discard(self.namespace)
            self._claimed = False
        if not self._open:
            return
        self._open = False
        with contextlib.suppress(Exception):  # a failed load does not keep the versions in the store
            await self.settle(current=False)
        try:
            for version in await weights.stored_versions(namespace=self.namespace):
                await weights.drop_version(version, namespace=self.namespace)
            for version in sorted(self._unstored & set(self._pushed)):  # never in the store: their files
                await weights.drop_version(version, namespace=self.namespace, manifest=self._pushed[version],
                                           stored=False)
            self._pushed.clear()
            self._unstored.clear()
        finally:
            await weights.release_store(self.namespace)

    async def publish(self, version: int, *, overlap: bool = False, hold: bool = False) -> dict[str, float]:
        """Push the trainer's weights as ``version``, load them on every generator, drop the older ones.

        With ``overlap`` the load runs in the background (see the module docstring); with ``hold`` too,
        ``version`` is only recorded as the run's: no push, no load, until a later publish or ``settle()``.
        Returns the timings: the push, and the generators' load of this version, or with ``overlap`` of the
        previous one if it was still in flight. A ``ReplicaDied`` from the push propagates (nothing was
        recorded), as does an error of the previous overlapped load."""
        if overlap and hold:
            self.version = version
            return {"weight_sync_s": 0.0}  # the step spent nothing on the weights (no push time to report)
        timings = await self._settle_load()
        t0 = time.perf_counter()
        self._pushing = version
        try:
            deferred = {"announce": False} if self._announce_here else {}
            pushed = await self.trainer.push_weights.call(version, **deferred)
        except BaseException:  # the trainer may have stored it before it died: drop_old lists it to be sure
            self._pushed.setdefault(version, None)
            raise
        finally:
            self._pushing = None
        timings["time/push_s"] = time.perf_counter() - t0
        timings["weights/pushed_mb"] = float(_rank0(pushed).get("mb", 0.0))  # a LoRA run's: its adapters alone
        self.version = self.pushed = version
        manifest = self._pushed[version] = _manifest(pushed)
        if manifest is not None and not _announced(pushed):
            self._announce(version, manifest)
        if overlap:
            self._loading = asyncio.ensure_future(self._load(version, manifest))
        else:
            timings["time/update_s"] = await self._load(version, manifest)
        timings["weight_sync_s"] = timings["time/push_s"] + timings.get("time/update_s", 0.0)
        return timings

    async def settle(self, *, current: bool = True) -> dict[str, float]:
        """Wait for an overlapped load to finish (its timing; empty when none was in flight; its error
        is raised here), then, with ``current``, push and load a held version, then wait for the older
        versions' deletion. Cancelling the caller cancels none of it."""
        try:
            timings = await self._settle_load()
            if current and self.pushed != self.version:
                timings = await asyncio.shield(self.publish(self.version))
            return timings
        finally:  # after a failed load too: close() then drops what is left
            if self._dropping is not None:
                await asyncio.shield(self._dropping)
            await self._put_pending_now()

    async def _settle_load(self) -> dict[str, float]:
        if self._loading is None:
            return {}
        try:
            took = await asyncio.shield(self._loading)
        finally:
            if self._loading.done():
                self._loading = None
        return {"time/update_s": took}

    async def next_load(self) -> None:
        """Return when the generators' next load has been recorded (``_record``)."""
        if self._loaded is None:
            self._loaded = asyncio.Event()
        await self._loaded.wait()

    async def _load(self, version: int, manifest: dict[str, Any] | None) -> float:
        t0 = time.perf_counter()
        await self.policy.update_weights.fanout(version, **self._handed(manifest))
        self._record(version)
        took = time.perf_counter() - t0
        # Deleting the older versions (store RPCs) is no part of the load the next push waits for.
        if self._dropping is None or self._dropping.done():
            self._dropping = asyncio.ensure_future(self._drop_quietly())
        return took

    def _announce(self, version: int, manifest: dict[str, Any]) -> None:
        """Put ``version``'s manifest in torchstore in the background, unless a put began less than
        ``ANNOUNCE_EVERY_S`` ago or is still running: then it waits for the next push, which supersedes it, or
        for ``settle()``. The generators were handed it, so no step waits for the store."""
        self._pending = (version, manifest)
        self._unstored.add(version)
        idle = self._announcing is None or self._announcing.done()
        if idle and time.monotonic() - self._announced_at >= ANNOUNCE_EVERY_S:
            self._announcing = asyncio.ensure_future(self._put_pending())

    async def _put_pending(self) -> None:
        if self._pending is None:
            return
        (version, manifest), self._pending = self._pending, None
        self._announced_at = time.monotonic()
        try:
            await weights.announce_version(version, manifest, namespace=self.namespace)
            self._unstored.discard(version)
            self.store_puts += 1
        except Exception as e:  # readers that were handed it have it; close() lists what the store holds
            logger.warning("putting version %s of %s in torchstore failed: %s: %s", version, self.namespace,
                           type(e).__name__, e)

    async def _put_pending_now(self) -> None:
        """The running put, then the newest manifest not put yet: the store names the run's version."""
        if self._announcing is not None:
            await asyncio.shield(self._announcing)
        if self._pending is not None:
            self._announcing = asyncio.ensure_future(self._put_pending())
            await asyncio.shield(self._announcing)

    def _handed(self, manifest: dict[str, Any] | None) -> dict[str, Any]:
        """``update_weights``' keyword arguments: where the version is (the generators need not ask
        torchstore), if the trainer said and the generators take it; else none, as the documents call it. A run
        on another's base (``lane``) names its lane too."""
        handed = {"manifest": manifest} if manifest is not None and self._hand_manifests else {}
        return {**handed, "namespace": self.namespace} if self.lane else handed

    async def _drop_quietly(self) -> None:
        try:
            await self.drop_old()
        except Exception as e:  # the next load's deletion tries again; close() drops everything
            logger.warning("dropping old weight versions of %s failed: %s: %s", self.namespace, type(e).__name__, e)

    def _record(self, version: int) -> None:
        """Every healthy replica holds ``version`` (``self.version`` was set at the push)."""
        for replica in [] if self.lane else self.policy.replicas:
            if replica.healthy:
                replica.version = version
        if self._loaded is not None:  # wake whoever waits for a newer version on the generators
            self._loaded.set()
            self._loaded = None

    async def drop_old(self) -> None:
        """Keep only the current version (and any a catching-up generator is loading). Only versions this
        run pushed are in its namespace, so the store is not listed (``close()`` lists it and drops all)."""
        if self._announcing is not None:  # a version is deleted after its manifest was put, never before
            await asyncio.shield(self._announcing)
        for version in sorted(self._pushed):
            if version not in (self.pushed, self._pushing) and self._pinned[version] <= 0:
                await weights.drop_version(version, namespace=self.namespace, manifest=self._pushed.pop(version),
                                           stored=version not in self._unstored)
                self._unstored.discard(version)

    async def catch_up(self, replica: Any) -> None:
        """A (re)spawned generator loads the current weights before it takes traffic: the newest version pushed,
        again if a push landed while it loaded (a load reaches healthy replicas only, and it is not one yet).

        A version held since (``loop.sync_interval``) stays for the next publish, and the buffer's
        ``max_policy_age`` governs what it generates until then."""
        loaded = 0
        while (version := self.pushed) != loaded:
            self._pinned[version] += 1
            try:
                await replica.actor.update_weights.call_one(version, **self._handed(self._pushed.get(version)))
            finally:
                self._pinned[version] -= 1
            loaded = version
        if not self.lane:
            replica.version = loaded


def _rank0(pushed: Any) -> dict[str, Any]:
    """What rank 0 of the trainer returned from ``push_weights`` ({} when not a dict)."""
    first = next(iter(pushed), None)
    return first if isinstance(first, dict) else {}


def _manifest(pushed: Any) -> dict[str, Any] | None:
    """The shared-memory manifest of the push (None: none)."""
    manifest = _rank0(pushed).get("manifest")
    return manifest if isinstance(manifest, dict) else None


def _announced(pushed: Any) -> bool:
    """Whether the trainer put the manifest of its push in torchstore itself (one that does not say did)."""
    return _rank0(pushed).get("announced", True) is not False


def _takes(service: Any, name: str, keyword: str) -> bool:
    """Whether the service's endpoint ``name`` takes ``keyword``: forge_nb's Generator and RLTrainer take
    ``manifest=`` and ``announce=``; the documents' actors, and a user's, may not (given it, theirs would
    fail with a TypeError)."""
    endpoint = getattr(getattr(service, "actor_cls", None), name, None)  # the endpoint keeps its
    # function as ``_method`` (monarch's EndpointProperty and forge_nb's own endpoints alike)
    try:
        parameters = inspect.signature(getattr(endpoint, "_method", endpoint)).parameters.values()
    except (TypeError, ValueError):  # not a function (or none): call it as the documents do
        return False
    return any(p.name == keyword or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)
