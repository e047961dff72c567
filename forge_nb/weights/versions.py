"""Versions of a namespace's weights: push, announce, load or open, list and drop them (the transports are
described in ``forge_nb.weights``; the store they live in is ``forge_nb.weights.store``)."""

from __future__ import annotations

import hashlib
import logging
import os
import re
from typing import Any

import torch

from forge_nb.system.runtime import lifecycle
from forge_nb.weights.shm import (
    LoadedVersion,
    host_id,
    read_shm,
    retire,
    shm_root,
    stored_dtype,
    write_shm,
)

logger = logging.getLogger(__name__)


PREFIX = "policy"  #: the default namespace: the documents' code pushes and loads there
TRANSPORTS = ("shm", "torchstore", "shm+stream", "shm+torchstore")
SHM_MANIFEST = "__shm__"
_NAMESPACE = re.compile(r"[A-Za-z0-9_-]+")
VERSION_KEY = re.compile(r"([A-Za-z0-9_-]+)\.v(\d+)/")


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


def store_client() -> Any:
    """torchstore's client in this process (the runtime started first: monarch reads its settings then)."""
    lifecycle.ensure_started()
    from forge_nb.weights.torchstore import ts

    return ts


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
    ts = store_client()
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
    from forge_nb.weights import stream

    out: dict[str, Any] = {}
    try:
        out["stream"] = stream.server().offer(manifest["path"])
    except OSError as e:
        logger.warning("weights: no stream for readers on other hosts (%s: %s); they fetch through torchstore",
                       type(e).__name__, e)
    if not manifest["torchstore"]:
        try:
            out["publisher"] = stream.publisher()
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
    await store_client().put(f"{weights_key(version, namespace)}/{SHM_MANIFEST}", manifest)


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
    return os.path.basename(manifest.get("path", "")).endswith(f"-{weights_key(version, namespace)}.bin")


async def _fetch(version: int, namespace: str) -> tuple[dict[str, Any] | None, dict[str, torch.Tensor]]:
    """(the shm manifest, {}) or (None, the tensors through torchstore). A version pushed on another host
    for readers elsewhere comes as this host's copy (``forge_nb.weights.stream.host_copy``)."""
    key = weights_key(version, namespace)
    ts = store_client()
    try:
        if not await ts.exists(f"{key}/{SHM_MANIFEST}"):
            return None, await ts.get_state_dict(key)
        manifest = await ts.get(f"{key}/{SHM_MANIFEST}")
    except Exception as e:
        have = await stored_versions(namespace=namespace)
        raise KeyError(f"{namespace} version {version} is not in torchstore (stored: {have or 'none'})") from e
    if manifest["host"] == host_id() or not for_other_hosts(manifest):
        return manifest, {}  # not pushed for other hosts: reading it says so (_same_host)
    from forge_nb.weights.stream import host_copy

    return await host_copy(key, namespace, manifest), {}


def _parse(key: str) -> tuple[str, int]:
    """``"<namespace>.v<v>"`` -> (namespace, v)."""
    namespace, version = key.rsplit(".v", 1)
    return namespace, int(version)


async def stored_versions(*, namespace: str = PREFIX) -> list[int]:
    """The versions of ``namespace`` in torchstore, oldest first."""
    prefix = check_namespace(namespace) + ".v"
    keys = await store_client().keys(namespace)
    return sorted({_parse(k.split("/", 1)[0])[1] for k in keys if "/" in k and k.startswith(prefix)})


async def drop_version(version: int, *, namespace: str = PREFIX, manifest: dict[str, Any] | None = None,
                       stored: bool = True) -> int:
    """Delete every key (and shared-memory file) of ``version`` of ``namespace``; returns how many keys
    were deleted. Given the version's ``manifest`` (what ``push_state_dict`` returned) of a shm-only push,
    its one key goes without listing or reading the store first (one delete instead of four calls), and
    none at all with ``stored=False`` (pushed with ``announce=False`` and never announced: only its file)."""
    ts = store_client()
    key = weights_key(version, namespace)
    shm_key = f"{key}/{SHM_MANIFEST}"
    if _names(manifest, version, namespace) and not for_other_hosts(manifest):
        retire(manifest["path"])
        if not stored:
            return 0
        await ts.delete(shm_key)
        return 1
    keys = [k for k in await ts.keys(namespace) if k.startswith(key + "/")]
    if shm_key in keys:
        found = manifest if _names(manifest, version, namespace) else await ts.get(shm_key)
        await ts.delete(shm_key)  # first: from now on no reader finds it, and a Publisher putting it takes it back
        retire(found["path"])
        if "publisher" in found:  # its tensors may have been put for a reader since the listing
            keys = [k for k in await ts.keys(namespace) if k.startswith(key + "/")] + [shm_key]
    for k in keys:
        if k != shm_key:
            await ts.delete(k)
    return len(keys)
