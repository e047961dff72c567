"""Versioned policy weights through TorchStore: a trainer pushes version v, generators load it.

Layout: version ``v`` of a namespace lives under keys starting ``<namespace>.v{v}/``, with Hugging Face
parameter names (what vLLM loads); a torchtitan trainer converts before pushing. The namespace is
``"policy"`` unless a caller names another: each run in a kernel has its own (:func:`namespace_for`),
so runs side by side never see, or drop, each other's versions. torchstore's key index is a trie
split on ".", so a namespace is one component (letters, digits, ``_`` and ``-``) and listing one
namespace's versions never reaches another's.

The transports behind the same calls (``push_state_dict``, ``load_state_dict``/``open_version``,
``drop_version``):

* ``"torchstore"``: torchstore's state-dict path; every tensor travels as monarch messages (~0.25 GB/s
  on these machines, no RDMA NIC). Works across hosts.
* ``"shm"`` (the default on one host): one file per version under ``/dev/shm``, and only a small
  manifest (``<key>/__shm__``) in torchstore; see ``forge_nb._weights_shm``. ``bench/weight_sync.py``
  measures both.
* ``"shm+stream"`` (the default in a process placed on a job's host when the job has several,
  ``forge_nb.cluster``): shm, and the writer's process serves the file over TCP. Readers on the writer's
  host map its file; on any other host the first reader of a version pulls it through one stream into
  that host's shared memory, where the host's other readers map it (a host keeps only the newest version
  it copied); a reader that cannot reach the stream has the writer put the tensors in torchstore and
  fetches them from there. See ``forge_nb._weights_stream``. Which host a process is on:
  ``_weights_shm.host_id()``.
* ``"shm+torchstore"``: the same, with the tensors put in torchstore by every push (readers that cannot
  reach the stream find them there at once; a push costs as much as a torchstore one).

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
import hashlib
import logging
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

logger = logging.getLogger(__name__)

__all__ = [
    "PREFIX", "SPARES", "STORE", "LoadedVersion", "announce_version", "check_namespace", "drop_version",
    "for_other_hosts", "handed_version", "initialize_store", "lease_store", "load_state_dict", "namespace_for",
    "open_version",
    "push_state_dict", "release_store", "remove_orphaned_shm", "shm_root", "shutdown_store", "store_holders",
    "store_running", "stored_dtype", "stored_versions", "weights_key",
]

PREFIX = "policy"  #: the default namespace: the documents' code pushes and loads there
TRANSPORTS = ("shm", "torchstore", "shm+stream", "shm+torchstore")
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
    """Store ``state_dict`` (HF parameter names, full tensors, any device) as ``version`` of ``namespace``
    (``transport``: see the module's docstring);
    with ``dtype``, floating-point tensors are stored as that type (converted as they are copied in,
    so a trainer can pass its live float32 parameters: no temporary copy).

    Returns the shared-memory manifest (None with the torchstore transport): a reader handed it opens the
    version with ``open_version(v, manifest=...)`` without asking torchstore where it is.

    ``announce=False`` leaves the shm manifest out of torchstore (only with ``transport="shm"``: readers
    on other hosts ask the store): the caller hands it to every reader and puts it there later with
    :func:`announce_version`. Putting it was most of a push (5 of 8 ms on two busy cores)."""
    key = weights_key(version, namespace)
    if transport == "auto":
        transport = "shm" if shm_root().parent.is_dir() else "torchstore"
        if transport == "shm" and int(os.environ.get("FORGE_NB_JOB_HOSTS", "1")) > 1:
            transport = "shm+stream"  # readers may be on the job's other hosts
    if transport not in TRANSPORTS:
        raise ValueError(f"transport={transport!r}: use 'auto' or one of {', '.join(map(repr, TRANSPORTS))}")
    ts = _ts()
    if "torchstore" in transport:  # before the manifest: a reader that sees the manifest finds the tensors too
        await ts.put_state_dict({k: v.detach().to(stored_dtype(v, dtype)) for k, v in state_dict.items()}, key)
    if "shm" not in transport:
        return None
    manifest = write_shm(state_dict, key, dtype)
    manifest["torchstore"] = "torchstore" in transport
    if transport != "shm":
        manifest |= _offer(manifest)
        if not (manifest["torchstore"] or "publisher" in manifest):  # no way to torchstore but this one
            await ts.put_state_dict(read_shm(manifest), key)
            manifest["torchstore"] = True
    if announce or transport != "shm":
        await announce_version(version, manifest, namespace=namespace)
    return manifest


def _offer(manifest: dict[str, Any]) -> dict[str, Any]:
    """What a manifest needs for readers on other hosts: this process's stream of the file, and its
    Publisher (torchstore's path, for a reader the stream does not reach); whichever can be had."""
    from forge_nb import _weights_stream

    out: dict[str, Any] = {}
    try:
        out["stream"] = _weights_stream.server().offer(manifest["path"])
    except OSError as e:
        logger.warning("weights: no stream for readers on other hosts (%s: %s); they fetch through torchstore",
                       type(e).__name__, e)
    if not manifest["torchstore"]:
        try:
            out["publisher"] = _weights_stream.publisher()
        except Exception as e:
            logger.warning("weights: no Publisher actor in this process (%s: %s); the tensors go through "
                           "torchstore with every push", type(e).__name__, e)
    return out


def for_other_hosts(manifest: dict[str, Any]) -> bool:
    """Whether readers on other hosts can fetch the version of ``manifest`` (its push was not shm-only)."""
    return bool(manifest.get("torchstore")) or "stream" in manifest or "publisher" in manifest


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
    """(the shm manifest, {}) or (None, the tensors through torchstore). A version pushed on another host
    for readers elsewhere comes as this host's copy (``forge_nb._weights_stream.host_copy``)."""
    key = weights_key(version, namespace)
    ts = _ts()
    try:
        if not await ts.exists(f"{key}/{SHM_MANIFEST}"):
            return None, await ts.get_state_dict(key)
        manifest = await ts.get(f"{key}/{SHM_MANIFEST}")
    except Exception as e:
        have = await stored_versions(namespace=namespace)
        raise KeyError(f"{namespace} version {version} is not in torchstore (stored: {have or 'none'})") from e
    if manifest["host"] == host_id() or not for_other_hosts(manifest):
        return manifest, {}  # not pushed for other hosts: reading it says so (_same_host)
    from forge_nb._weights_stream import host_copy

    return await host_copy(key, namespace, manifest), {}


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
    shm_key = f"{key}/{SHM_MANIFEST}"
    if _names(manifest, version, namespace) and not for_other_hosts(manifest):
        retire(Path(manifest["path"]))
        await ts.delete(shm_key)
        return 1
    keys = [k for k in await ts.keys(namespace) if k.startswith(key + "/")]
    if shm_key in keys:
        found = manifest if _names(manifest, version, namespace) else await ts.get(shm_key)
        await ts.delete(shm_key)  # first: from now on no reader finds it, and a Publisher putting it takes it back
        retire(Path(found["path"]))
        if "publisher" in found:  # its tensors may have been put for a reader since the listing
            keys = [k for k in await ts.keys(namespace) if k.startswith(key + "/")] + [shm_key]
    for k in keys:
        if k != shm_key:
            await ts.delete(k)
    return len(keys)
