"""The kernel's torchstore, started and stopped: directly (``initialize_store`` / ``shutdown_store``) or leased
by runs and services (``lease_store`` / ``release_store``; see ``forge_nb.weights``)."""

from __future__ import annotations

import asyncio
import contextlib
import weakref

from forge_nb.system import runtime
from forge_nb.system.leases import Shared
from forge_nb.weights.shm import remove_orphaned_shm, remove_spares
from forge_nb.weights.versions import PREFIX, VERSION_KEY, drop_version, store_client

_store_mesh: runtime.Mesh | None = None
_store_leased = False  # whether the running store was started by a lease (its last release stops it)
_RUNTIME_HOLDER = "weights.store"
_store_locks: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, asyncio.Lock] = weakref.WeakKeyDictionary()


async def initialize_store() -> bool:
    """Start the kernel's torchstore (a controller and one storage volume). Kernel only; idempotent:
    returns True when this call started it, False when it was already running.

    The storage volume gets a process of the runtime's (left to itself, torchstore would spawn one
    the runtime does not know, which would outlive ``shutdown_store``)."""
    global _store_mesh
    loop = asyncio.get_running_loop()
    lock = _store_locks.setdefault(loop, asyncio.Lock())
    async with lock:  # services spawned side by side (asyncio.gather) each ask for the store
        # torchstore's first import (it imports torch.distributed.checkpoint: ~1.4 s, 2-3 s on a slow machine)
        # runs off the event loop: a run's services spawn their processes meanwhile (issue 34)
        ts = await asyncio.to_thread(store_client)
        remove_orphaned_shm()
        if _store_mesh is not None and _store_mesh.state != "running":
            await _forget_store()  # its volume was stopped (runtime.stop_all): the controller still says ready
        try:
            await ts.keys(PREFIX)
            return False  # already running
        except Exception:
            ts.reset_client()
        # on the kernel's host, whatever job is in use: its controller runs in the kernel
        _store_mesh = await runtime.spawn_mesh("torchstore", 1, owner="torchstore", hosts="kernel")
        await ts.initialize(mesh=_store_mesh.proc_mesh)
        return True


async def _forget_store() -> None:
    """Reset torchstore's controller (in this process) and client after its volume's process is gone."""
    global _store_mesh
    ts = store_client()
    with contextlib.suppress(Exception):  # teardown marks the controller uninitialised, then asks the dead volume
        await ts.shutdown()
    ts.reset_client()
    _store_mesh = None


async def shutdown_store() -> None:
    """Stop the store ``initialize_store`` started (every namespace's versions dropped first); nothing if
    none is up. Every lease on it ends too: a holder's later release is a no-op, and the next lease
    starts a new store."""
    global _store_mesh, _store_leased
    _store_leased = False
    STORE.forget_all()
    await runtime.release(_RUNTIME_HOLDER)
    ts = store_client()
    if _store_mesh is None:
        return
    if _store_mesh.state != "running":
        await _forget_store()
        return
    try:
        found = {m.groups() for m in map(VERSION_KEY.match, await ts.keys()) if m}
        for namespace, version in sorted(found):
            await drop_version(int(version), namespace=namespace)
        await ts.shutdown()
        remove_spares()
    finally:
        ts.reset_client()
        if _store_mesh is not None:
            await _store_mesh.stop()
            _store_mesh = None


def store_running() -> bool:
    """Whether the store this module started is up (its volume's process running)."""
    return _store_mesh is not None and _store_mesh.state == "running"


async def _start_leased() -> None:
    global _store_leased
    await runtime.lease(_RUNTIME_HOLDER)
    try:
        _store_leased = await initialize_store() or _store_leased
    except BaseException:
        await runtime.release(_RUNTIME_HOLDER)
        raise


async def _stop_leased() -> None:
    try:
        if _store_leased:
            await shutdown_store()
    finally:
        await runtime.release(_RUNTIME_HOLDER)


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
