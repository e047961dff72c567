"""Versioned policy weights through TorchStore: a trainer pushes version v, generators load it.

Layout: version ``v`` of a namespace lives under keys starting ``<namespace>.v{v}/``, with Hugging Face
parameter names (what vLLM loads); a torchtitan trainer converts before pushing. The namespace is
``"policy"`` unless a caller names another: each run in a kernel has its own (:func:`namespace_for`),
so runs side by side never see, or drop, each other's versions. torchstore's key index is a trie
split on ".", so a namespace is one component (letters, digits, ``_`` and ``-``) and listing one
namespace's versions never reaches another's.

Two transports behind the same calls (``push_state_dict``, ``load_state_dict``/``open_version``,
``drop_version``):

* ``"torchstore"``: torchstore's state-dict path; every tensor travels as monarch messages (~0.25 GB/s
  on these machines, no RDMA NIC). Works across hosts.
* ``"shm"`` (the default on one host): one file per version under ``/dev/shm``, and only a small
  manifest (``<key>/__shm__``) in torchstore; see ``forge_nb._weights_shm``. ``bench/weight_sync.py``
  measures both.
* ``"shm+torchstore"`` (the default in a process placed on a job's host when the job has several,
  ``forge_nb.cluster``): both. Readers on the writer's host map its file; on any other host the first
  reader of a version fetches it through torchstore once and lays it out in that host's shared memory,
  where the host's other readers map it (:func:`_host_copy`; a host keeps only the newest version it
  copied). Which host a process is on: ``_weights_shm.host_id()``.

The store's life. The kernel's torchstore (a controller and one storage volume process) is started
either directly, ``await initialize_store()`` (tests, benches, a notebook's own cells) and stopped by
``await shutdown_store()``; or *leased*: ``await lease_store(holder)`` starts it for its first holder,
``await release_store(holder)`` stops it after the last one lets go (see ``forge_nb.leases``). Runs
and services whose actor class ``needs_store`` lease it, so a second run's shutdown never tears the
store down under the first. The last release stops the store only if a lease started it: a store
started directly stays until ``shutdown_store()``, which stops it whoever holds leases (the next
lease starts it again). While leased, the store holds a runtime lease (``runtime.lease``).

Every function works in any process (kernel or actor): torchstore is reached through
``forge_nb._torchstore``, which carries the monarch-0.7 compatibility binding.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import os
import re
import weakref
from pathlib import Path
from typing import Any

import torch

from forge_nb import runtime
from forge_nb._weights_shm import (
    SPARES,
    LoadedVersion,
    _pinned,  # noqa: F401  (this process's page-locked and kept mappings: tests look at them here)
    _reader_maps,  # noqa: F401
    host_id,
    read_shm,
    remove_orphaned_shm,
    remove_spares,
    retire,
    shm_root,
    stored_dtype,
    write_shm,
)
from forge_nb.leases import Shared

__all__ = [
    "PREFIX", "SPARES", "STORE", "LoadedVersion", "announce_version", "check_namespace", "drop_version",
    "handed_version", "initialize_store", "lease_store", "load_state_dict", "namespace_for", "open_version",
    "push_state_dict", "release_store", "remove_orphaned_shm", "shm_root", "shutdown_store", "store_holders",
    "store_running", "stored_dtype", "stored_versions", "weights_key",
]

PREFIX = "policy"  #: the default namespace: the documents' code pushes and loads there
SHM_MANIFEST = "__shm__"
_NAMESPACE = re.compile(r"[A-Za-z0-9_-]+")
_VERSION_KEY = re.compile(r"([A-Za-z0-9_-]+)\.v(\d+)/")


# -- namespaces -----------------------------------------------------------------------------------------


def check_namespace(namespace: str) -> str:
    """``namespace`` if it is one key component (``[A-Za-z0-9_-]+``); a ValueError that says what to use."""
    if not isinstance(namespace, str) or not _NAMESPACE.fullmatch(namespace):
        raise ValueError(
            f"weights namespace={namespace!r}: use letters, digits, '_' and '-' only (torchstore splits keys "
            f"on '.'); weights.namespace_for(name) makes one from any run name")
    return namespace


def namespace_for(run_name: str) -> str:
    """The weights namespace of run ``run_name``: ``"policy-" + name``, any other character replaced
    by ``_`` plus a short hash of the name, so distinct names never share a namespace."""
    if not isinstance(run_name, str) or not run_name:
        raise ValueError(f"run_name={run_name!r}: a run needs a non-empty name to get a weights namespace")
    safe = re.sub(r"[^A-Za-z0-9_-]", "_", run_name)
    if safe != run_name:
        safe += "-" + hashlib.sha1(run_name.encode()).hexdigest()[:8]
    return f"{PREFIX}-{safe}"


def weights_key(version: int, namespace: str = PREFIX) -> str:
    return f"{check_namespace(namespace)}.v{version}"


def _ts() -> Any:
    runtime.ensure_started()
    from forge_nb._torchstore import ts

    return ts


# -- the store's life -----------------------------------------------------------------------------------

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
        ts = _ts()
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
    ts = _ts()
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
    ts = _ts()
    if _store_mesh is None:
        return
    if _store_mesh.state != "running":
        await _forget_store()
        return
    try:
        found = {m.groups() for m in map(_VERSION_KEY.match, await ts.keys()) if m}
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


# -- versions -------------------------------------------------------------------------------------------


async def push_state_dict(state_dict: dict[str, torch.Tensor], version: int, transport: str = "auto",
                          dtype: torch.dtype | None = None, *, namespace: str = PREFIX,
                          announce: bool = True) -> dict[str, Any] | None:
    """Store ``state_dict`` (HF parameter names, full tensors, any device) as ``version`` of ``namespace``;
    with ``dtype``, floating-point tensors are stored as that type (converted as they are copied in,
    so a trainer can pass its live float32 parameters: no temporary copy).

    Returns the shared-memory manifest (None with the torchstore transport): a reader handed it opens the
    version with ``open_version(v, manifest=...)`` without asking torchstore where it is.

    ``announce=False`` leaves the shm manifest out of torchstore (only when the tensors are not in it
    too, i.e. ``manifest["torchstore"]`` is False): the caller hands it to every reader and puts it there
    later with :func:`announce_version`. Putting it was most of a push (5 of 8 ms on two busy cores)."""
    key = weights_key(version, namespace)
    if transport == "auto":
        transport = "shm" if shm_root().parent.is_dir() else "torchstore"
        if transport == "shm" and int(os.environ.get("FORGE_NB_JOB_HOSTS", "1")) > 1:
            transport = "shm+torchstore"  # readers may be on the job's other hosts
    if transport not in ("shm", "torchstore", "shm+torchstore"):
        raise ValueError(f"transport={transport!r}: use 'auto', 'shm', 'torchstore' or 'shm+torchstore'")
    ts = _ts()
    if "torchstore" in transport:  # before the manifest: a reader that sees the manifest finds the tensors too
        await ts.put_state_dict({k: v.detach().to(stored_dtype(v, dtype)) for k, v in state_dict.items()}, key)
    if "shm" in transport:
        manifest = write_shm(state_dict, key, dtype)
        manifest["torchstore"] = "torchstore" in transport
        if announce or manifest["torchstore"]:
            await announce_version(version, manifest, namespace=namespace)
        return manifest
    return None


async def announce_version(version: int, manifest: dict[str, Any], *, namespace: str = PREFIX) -> None:
    """Put a version's shm manifest in torchstore, where readers that were not handed it (and
    ``stored_versions``) find it: ``push_state_dict`` does, unless told ``announce=False``."""
    await _ts().put(f"{weights_key(version, namespace)}/{SHM_MANIFEST}", manifest)


async def load_state_dict(version: int, *, namespace: str = PREFIX) -> dict[str, torch.Tensor]:
    """Fetch ``version`` of ``namespace``; a KeyError names the versions that exist.

    With the shm transport the tensors are copy-on-write views of the mapped file, valid for as long
    as they are referenced (a consumer that writes to them changes its own copy). A reader that
    loads every version into a model should use :func:`open_version`, which is faster."""
    manifest, state_dict = await _fetch(version, namespace)
    return state_dict if manifest is None else read_shm(manifest)


async def open_version(version: int, *, namespace: str = PREFIX,
                       manifest: dict[str, Any] | None = None) -> LoadedVersion:
    """``version`` of ``namespace``, to copy into a model inside ``with``; a KeyError names the versions
    that exist::

        with await weights.open_version(v) as state_dict:
            model.load_state_dict(state_dict)   # the views are valid inside the block only

    With the shm transport the views are read-only and come from a mapping this process keeps for the
    next versions written to the same file, so a load costs one copy with no page faults. ``manifest``
    (what ``push_state_dict`` returned) saves asking torchstore, when it names this version on this host;
    if the version was dropped since, entering the block raises FileNotFoundError."""
    handed = handed_version(version, namespace, manifest)
    if handed is not None:
        return handed
    manifest, state_dict = await _fetch(version, namespace)
    return LoadedVersion(manifest, state_dict)


def handed_version(version: int, namespace: str, manifest: dict[str, Any] | None) -> LoadedVersion | None:
    """``open_version``'s answer from a handed manifest, with no await: None unless it names ``version`` of
    ``namespace`` in this host's shared memory."""
    return LoadedVersion(manifest, {}) if _names(manifest, version, namespace) else None


def _names(manifest: dict[str, Any] | None, version: int, namespace: str) -> bool:
    """Whether ``manifest`` is that of ``version`` of ``namespace`` in this host's shared memory."""
    if manifest is None or manifest.get("host") != host_id():
        return False
    return Path(manifest.get("path", "")).name.endswith(f"-{weights_key(version, namespace)}.bin")


async def _fetch(version: int, namespace: str) -> tuple[dict[str, Any] | None, dict[str, torch.Tensor]]:
    """(the shm manifest, {}) or (None, the tensors through torchstore)."""
    key = weights_key(version, namespace)
    ts = _ts()
    try:
        if await ts.exists(f"{key}/{SHM_MANIFEST}"):
            manifest = await ts.get(f"{key}/{SHM_MANIFEST}")
            if manifest["host"] == host_id() or not manifest.get("torchstore"):
                return manifest, {}  # not pushed for other hosts: reading it says so (_same_host)
            return await _host_copy(key, namespace), {}
        return None, await ts.get_state_dict(key)
    except Exception as e:
        have = await stored_versions(namespace=namespace)
        raise KeyError(f"{namespace} version {version} is not in torchstore (stored: {have or 'none'})") from e


async def _host_copy(key: str, namespace: str) -> dict[str, Any]:
    """The manifest of this host's copy of ``key``, pushed on another host: the first reader here fetches
    it through torchstore and lays it out in shared memory (under a lock on the folder, so once per host);
    the others wait for it and map it. Older copies of the namespace on this host are removed then. The
    copy's files are named after the reader that made them, so they go when it does (remove_orphaned_shm)."""
    root = shm_root()
    root.mkdir(parents=True, exist_ok=True)
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", host_id())
    fd = os.open(root, os.O_RDONLY)
    try:
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        for made in root.glob(f"*-{key}@{host}.json"):
            manifest = json.loads(made.read_text())
            if Path(manifest["path"]).exists():
                return manifest
        manifest = write_shm(await _ts().get_state_dict(key), f"{key}@{host}")
        manifest["fetched_by"] = os.getpid()
        local = root / f"{os.getpid()}-{key}@{host}.json"
        local.with_suffix(".tmp").write_text(json.dumps(manifest))
        local.with_suffix(".tmp").replace(local)
        for old in root.glob(f"*-{namespace}.v*@{host}.json"):  # this host needs the newest only
            if old != local:
                with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
                    Path(json.loads(old.read_text())["path"]).unlink(missing_ok=True)
                old.unlink(missing_ok=True)
        return manifest
    finally:
        os.close(fd)  # the lock goes with it


def _parse(key: str) -> tuple[str, int]:
    """``"<namespace>.v<v>"`` -> (namespace, v)."""
    namespace, version = key.rsplit(".v", 1)
    return namespace, int(version)


async def stored_versions(*, namespace: str = PREFIX) -> list[int]:
    """The versions of ``namespace`` in torchstore, oldest first."""
    prefix = check_namespace(namespace) + ".v"
    keys = await _ts().keys(namespace)
    return sorted({_parse(k.split("/", 1)[0])[1] for k in keys if "/" in k and k.startswith(prefix)})


async def drop_version(version: int, *, namespace: str = PREFIX, manifest: dict[str, Any] | None = None) -> int:
    """Delete every key (and shared-memory file) of ``version`` of ``namespace``; returns how many keys
    were deleted. Given the version's ``manifest`` (what ``push_state_dict`` returned) of a shm-only push,
    its one key goes without listing or reading the store first (one delete instead of four calls)."""
    ts = _ts()
    key = weights_key(version, namespace)
    if _names(manifest, version, namespace) and not manifest.get("torchstore"):
        retire(Path(manifest["path"]))
        await ts.delete(f"{key}/{SHM_MANIFEST}")
        return 1
    keys = [k for k in await ts.keys(namespace) if k.startswith(key + "/")]
    for k in keys:
        if k.endswith(SHM_MANIFEST):
            manifest = await ts.get(k)
            retire(Path(manifest["path"]))
        await ts.delete(k)
    return len(keys)
