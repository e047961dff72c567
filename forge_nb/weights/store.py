"""The kernel's torchstore, started and stopped: directly (``initialize_store`` / ``shutdown_store``) or leased
by runs and services (``lease_store`` / ``release_store``; see ``forge_nb.weights``).

The store lives in the kernel's process: its controller, as torchstore always places it, and its one storage
volume, with torchstore's ``ControllerStorageVolumes`` strategy (the volume is a singleton actor beside the
controller). A volume of its own process cost a third process in every run on one machine: ~350 MB and, on
two cores, ~4.5 s of CPU importing torch while a run starts, for a store that holds manifests
wherever a machine has shared memory (the weights go through it and through streams, ``forge_nb.weights.shm``;
only the torchstore transport puts tensors here, in the kernel's memory). Considered: a
volume process spawned by the runtime (the cost above), and torchstore's own spawn
(a process the runtime would not know, outliving ``shutdown_store``).
"""

from __future__ import annotations

import asyncio
import weakref

from forge_nb.system.leases import Shared
from forge_nb.system.runtime import lifecycle
from forge_nb.weights.shm import remove_orphaned_shm, remove_spares
from forge_nb.weights.versions import PREFIX, VERSION_KEY, drop_version, store_client

_store_up = False  # whether this module started the store and has not shut it down
_store_leased = False  # whether the running store was started by a lease (its last release stops it)
_RUNTIME_HOLDER = "weights.store"
_store_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


async def initialize_store() -> bool:
    """Start the kernel's torchstore (a controller and one storage volume, both in this process). Kernel only;
    idempotent: returns True when this call started it, False when it was already running."""
    global _store_up
    loop = asyncio.get_running_loop()
    lock = _store_locks.setdefault(loop, asyncio.Lock())
    async with lock:  # services spawned side by side (asyncio.gather) each ask for the store
        # torchstore's first import (it imports torch.distributed.checkpoint: ~1.4 s, 2-3 s on a slow machine)
        # runs off the event loop: a run's services spawn their processes meanwhile
        ts = await asyncio.to_thread(store_client)
        remove_orphaned_shm()
        try:
            await ts.keys(PREFIX)
            return False  # already running
        except Exception:
            ts.reset_client()
        from torchstore.strategy import ControllerStorageVolumes

        await ts.initialize(strategy=ControllerStorageVolumes())
        _store_up = True
        return True


async def shutdown_store() -> None:
    """Stop the store ``initialize_store`` started (every namespace's versions dropped first); nothing if
    none is up. Every lease on it ends too: a holder's later release is a no-op, and the next lease
    starts a new store."""
    global _store_up, _store_leased
    _store_leased = False
    STORE.forget_all()
    await lifecycle.release(_RUNTIME_HOLDER)
    if not _store_up:
        return
    ts = store_client()
    try:
        found = {m.groups() for m in map(VERSION_KEY.match, await ts.keys()) if m}
        for namespace, version in sorted(found):
            await drop_version(int(version), namespace=namespace)
        await ts.shutdown()  # the volume is emptied (torchstore resets a controller-held volume on teardown)
        remove_spares()
    finally:
        ts.reset_client()
        _store_up = False


def store_running() -> bool:
    """Whether the store this module started is up."""
    return _store_up


async def _start_leased() -> None:
    global _store_leased
    await lifecycle.lease(_RUNTIME_HOLDER)
    try:
        _store_leased = await initialize_store() or _store_leased
    except BaseException:
        await lifecycle.release(_RUNTIME_HOLDER)
        raise


async def _stop_leased() -> None:
    try:
        if _store_leased:
            await shutdown_store()
    finally:
        await lifecycle.release(_RUNTIME_HOLDER)


STORE = Shared("torchstore", start=_start_leased, stop=_stop_leased, alive=store_running)


async def lease_store(holder: str) -> None:
    """Lease the kernel's torchstore for ``holder`` (a run's or a service's unique id): started if down."""
    await STORE.acquire(holder)


async def release_store(holder: str) -> None:
    """End ``holder``'s lease; the last release stops the store if a lease started it. Unknown: no-op."""
    await STORE.release(holder)


def store_holders() -> frozenset[str]:
    """Who leases the store now."""
    return STORE.holders
