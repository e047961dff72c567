"""Versioned policy weights through TorchStore: the trainer pushes version v, generators load it.

Layout: policy version ``v`` lives under keys starting ``policy.v{v}/``, with Hugging Face parameter
names (what vLLM loads); a torchtitan trainer converts before pushing. torchstore's key index is a
trie split on ".", so listing goes by the ``policy`` component and filters.

Two transports behind the same three calls (``push_state_dict``, ``load_state_dict``, ``drop_version``):

* ``"torchstore"``: torchstore's state-dict path; every tensor travels as monarch messages (~0.25 GB/s
  on these machines, no RDMA NIC). Works across hosts.
* ``"shm"`` (the default when writer and readers share a host, which is every forge_nb run today):
  the writer lays the whole state dict out in one file under ``/dev/shm`` and stores only a small
  manifest in torchstore (``policy.v{v}/__shm__``: host, path, and each tensor's dtype, shape and
  offset). Readers map the file and get zero-copy tensor views, so a push is one host memcpy and a
  load is the copy into the model. ``bench/weight_sync.py`` measures both against plain memcpy.

The file is written under a temporary name and renamed before the manifest is stored, so a reader
never sees a partial version. ``drop_version`` deletes the manifest and keeps the file as a *spare*
for its writer's next push (at most ``SPARES`` per writer): filling a new tmpfs file costs about
twice a memcpy, because the kernel zeroes every page first, while a spare's pages are already there.
A reader holds a shared ``flock`` on the file while it reads (``load_state_dict``: as long as its
views are alive, since the lock lives with the mapping; ``open_version``: inside its ``with`` block),
and a writer reuses a spare only when it gets the exclusive lock, so a file is never rewritten under
a reader that still looks at it. Writers and ``open_version`` readers keep their mappings of the
files (which rotate through the spares), so later pushes and loads take no page faults.
Every function works in any process (kernel or actor): torchstore is reached through
``forge_nb._torchstore``, which carries the monarch-0.7 compatibility binding.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import functools
import logging
import mmap
import os
import socket
import warnings
import weakref
from pathlib import Path
from typing import Any

import torch

from forge_nb import runtime

logger = logging.getLogger(__name__)

PREFIX = "policy"
SHM_MANIFEST = "__shm__"
SPARES = 2  #: dropped shared-memory files kept per writer for its next pushes
_ALIGN = 64


def weights_key(version: int) -> str:
    return f"{PREFIX}.v{version}"


def shm_root() -> Path:
    return Path(os.environ.get("FORGE_NB_SHM_DIR", "/dev/shm/forge_nb"))


def _ts() -> Any:
    runtime.ensure_started()
    from forge_nb._torchstore import ts

    return ts


_store_mesh: runtime.Mesh | None = None


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
        _store_mesh = await runtime.spawn_mesh("torchstore", 1, owner="torchstore")
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
    """Stop the store ``initialize_store`` started (its versions dropped first); nothing if none is up."""
    global _store_mesh
    ts = _ts()
    if _store_mesh is None:
        return
    if _store_mesh.state != "running":
        await _forget_store()
        return
    try:
        for version in await stored_versions():
            await drop_version(version)
        await ts.shutdown()
        for spare in shm_root().glob("*-spare.*.bin"):  # nothing will be pushed to this store again
            spare.unlink(missing_ok=True)
    finally:
        ts.reset_client()
        if _store_mesh is not None:
            await _store_mesh.stop()
            _store_mesh = None


async def push_state_dict(state_dict: dict[str, torch.Tensor], version: int, transport: str = "auto",
                          dtype: torch.dtype | None = None) -> None:
    """Store ``state_dict`` (HF parameter names, full tensors, any device) as policy version ``version``;
    with ``dtype``, floating-point tensors are stored as that type (converted as they are copied in,
    so a trainer can pass its live float32 parameters: no temporary copy)."""
    if transport == "auto":
        transport = "shm" if shm_root().parent.is_dir() else "torchstore"
    ts = _ts()
    if transport == "shm":
        manifest = _write_shm(state_dict, version, dtype)
        await ts.put(f"{weights_key(version)}/{SHM_MANIFEST}", manifest)
    elif transport == "torchstore":
        await ts.put_state_dict({k: _as(v.detach(), dtype) for k, v in state_dict.items()}, weights_key(version))
    else:
        raise ValueError(f"transport={transport!r}: use 'auto', 'shm' or 'torchstore'")


async def load_state_dict(version: int) -> dict[str, torch.Tensor]:
    """Fetch policy ``version``; a KeyError names the versions that exist.

    With the shm transport the tensors are copy-on-write views of the mapped file, valid for as long
    as they are referenced (a consumer that writes to them changes its own copy). A reader that
    loads every version into a model should use :func:`open_version`, which is faster."""
    manifest, state_dict = await _fetch(version)
    return state_dict if manifest is None else _read_shm(manifest)


async def open_version(version: int) -> LoadedVersion:
    """Policy ``version`` to copy into a model inside ``with``; a KeyError names the versions that exist::

        with await weights.open_version(v) as state_dict:
            model.load_state_dict(state_dict)   # the views are valid inside the block only

    With the shm transport the views are read-only and come from a mapping this process keeps for the
    next versions written to the same file, so a load costs one copy with no page faults."""
    manifest, state_dict = await _fetch(version)
    return LoadedVersion(manifest, state_dict)


async def _fetch(version: int) -> tuple[dict[str, Any] | None, dict[str, torch.Tensor]]:
    """(the shm manifest, {}) or (None, the tensors through torchstore)."""
    ts = _ts()
    key = weights_key(version)
    try:
        if await ts.exists(f"{key}/{SHM_MANIFEST}"):
            return await ts.get(f"{key}/{SHM_MANIFEST}"), {}
        return None, await ts.get_state_dict(key)
    except Exception as e:
        have = await stored_versions()
        raise KeyError(f"policy version {version} is not in torchstore (stored: {have or 'none'})") from e


async def stored_versions() -> list[int]:
    keys = await _ts().keys(PREFIX)
    return sorted({int(k.split("/", 1)[0].split(".v", 1)[1]) for k in keys if "/" in k})


async def drop_version(version: int) -> int:
    """Delete every key (and shared-memory file) of ``version``; returns how many keys were deleted."""
    ts = _ts()
    keys = [k for k in await ts.keys(PREFIX) if k.startswith(weights_key(version) + "/")]
    for key in keys:
        if key.endswith(SHM_MANIFEST):
            manifest = await ts.get(key)
            _retire(Path(manifest["path"]))
        await ts.delete(key)
    return len(keys)


# -- the shared-memory transport ----------------------------------------------------------------------
# Files under shm_root(), each named after its writer's pid: "{pid}-policy.v{v}.bin" (a version),
# "{pid}-policy.v{v}.tmp" (being written) and "{pid}-spare.v{v}.bin" (a dropped version's file).


def remove_orphaned_shm() -> list[str]:
    """Delete shared-memory weight files whose writer process is gone (a killed kernel or trainer)."""
    from forge_nb._procs import remove_left_by_dead

    return [str(path) for path in remove_left_by_dead(shm_root())]


def stored_dtype(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """The type ``tensor`` is pushed as with ``push_state_dict(..., dtype=dtype)``."""
    return dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype


def _as(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    return tensor.to(stored_dtype(tensor, dtype))


def _write_shm(state_dict: dict[str, torch.Tensor], version: int, dtype: torch.dtype | None = None) -> dict[str, Any]:
    entries, offset = [], 0
    for name, tensor in state_dict.items():
        stored = stored_dtype(tensor, dtype)
        nbytes = tensor.numel() * stored.itemsize
        entries.append((name, str(stored).removeprefix("torch."), tuple(tensor.shape), offset, nbytes))
        offset += -(-nbytes // _ALIGN) * _ALIGN
    size = max(offset, 1)
    root = shm_root()
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{os.getpid()}-{weights_key(version)}.bin"
    tmp = path.with_suffix(".tmp")
    _forget_gone(_writer_maps, root.glob(f"{os.getpid()}-*"))
    fd = _take_spare(size, tmp)
    if fd is None:
        fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
        os.ftruncate(fd, size)
    try:
        inode = os.fstat(fd).st_ino
        buffer = _writer_maps.get(inode)
        if buffer is None:
            buffer = _writer_maps[inode] = _map(fd, size, mmap.MAP_SHARED)
        if any(t.is_cuda for t in state_dict.values()):
            _pin_for_cuda(buffer, read_only=False)
        for (_, stored, _, start, nbytes), tensor in zip(entries, state_dict.values(), strict=True):
            # one pass per tensor: from any device and dtype straight into the file's pages
            target, source = getattr(torch, stored), tensor.detach().reshape(-1)
            if source.is_cuda and source.dtype != target:
                # convert on the GPU, then one DMA: a mixed copy would bring float32 over and convert on the CPU
                source = source.to(target)
            buffer[start : start + nbytes].view(target).copy_(source)
        fcntl.flock(fd, fcntl.LOCK_UN)  # a reused spare was locked; readers may lock it from now on
        os.replace(tmp, path)
    finally:
        os.close(fd)
    return {"host": socket.gethostname(), "path": str(path), "entries": entries}


# This process's mappings of shared-memory files, by inode, kept while the file exists: a push into (or
# a load from) a file mapped before costs one copy, with no page-table set-up for its pages.
_writer_maps: dict[int, torch.Tensor] = {}
_reader_maps: dict[int, tuple[int, torch.Tensor]] = {}  # inode -> (its fd, to lock on; the mapping)


def _forget_gone(maps: dict[int, Any], paths: Any) -> None:
    """Drop the mappings of files that are gone (so their memory is freed)."""
    alive = set()
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            alive.add(path.stat().st_ino)
    for inode in [i for i in maps if i not in alive]:
        _release(maps, inode)


def _release(maps: dict[int, Any], inode: int) -> None:
    """Forget one kept mapping: unregister it from CUDA and close a reader's fd (the lock goes with it)."""
    entry = maps.pop(inode)
    fd, buffer = entry if isinstance(entry, tuple) else (None, entry)
    _unpin(buffer)
    if fd is not None:
        os.close(fd)


# -- page-locking the mappings for copies to and from a GPU -------------------------------------------
# A copy between a GPU and pageable memory is staged by the driver through a small pinned buffer; once
# the mapping itself is registered (cudaHostRegister), the copy is one DMA at the host link's speed.
# Registration costs a pass over the pages, so it is done once per kept mapping, and only in processes
# that already use CUDA. FORGE_NB_PIN_SHM=0 turns it off (bench/weight_sync.py --device cuda compares).
_pinned: set[int] = set()  # data pointers of mappings registered with CUDA
_refused: set[int] = set()  # ... and of those CUDA refused: not asked again while they stay mapped


def _pin_for_cuda(buffer: torch.Tensor, read_only: bool) -> bool:
    """Register ``buffer`` (a whole mapping) with CUDA; False where it is not (off, no CUDA in use, or
    refused: then copies still work, through the driver's staging buffer)."""
    ptr = buffer.data_ptr()
    if ptr in _pinned:
        return True
    if ptr in _refused:
        return False
    if os.environ.get("FORGE_NB_PIN_SHM", "1") == "0" or not torch.cuda.is_initialized():
        return False
    if not _on_tmpfs(shm_root()):  # CUDA refuses writable mappings of files on disk (seen on an H100)
        return False
    cudart = torch.cuda.cudart()
    flags = 0x8 if read_only else 0x0  # cudaHostRegisterReadOnly: a reader's mapping is PROT_READ
    error = int(cudart.cudaHostRegister(ptr, buffer.numel(), flags))
    if error:
        _refused.add(ptr)
        _clear_cuda_error()
        logger.info("shared-memory weights are not page-locked for CUDA (cudaError %d); copies are staged", error)
        return False
    _pinned.add(ptr)
    return True


@functools.cache
def _on_tmpfs(path: Path) -> bool:
    """Whether ``path`` lies on a tmpfs mount (the longest mount point that holds it); read once per path."""
    best, fstype = "", ""
    with open("/proc/self/mounts") as mounts:
        for line in mounts:
            point, kind = line.split()[1:3]
            if f"{path}/".startswith(point.rstrip("/") + "/") and len(point) > len(best):
                best, fstype = point, kind
    return fstype == "tmpfs"


def _unpin(buffer: torch.Tensor) -> None:
    """Unregister a mapping before it is unmapped (a no-op for one that was never registered)."""
    ptr = buffer.data_ptr()
    _refused.discard(ptr)
    if ptr in _pinned:
        _pinned.discard(ptr)
        torch.cuda.cudart().cudaHostUnregister(ptr)


def _clear_cuda_error() -> None:
    """Reset the CUDA runtime's last error after a refused registration: torch checks it after every
    kernel launch and would report it as that kernel's ("CUDA error: invalid argument")."""
    import ctypes

    with open("/proc/self/maps") as maps:  # the libcudart torch loaded (dlopen again: the same library)
        loaded = {line.split()[-1] for line in maps if "libcudart.so" in line}
    for path in sorted(loaded):
        with contextlib.suppress(OSError, AttributeError):
            ctypes.CDLL(path).cudaGetLastError()


def _take_spare(size: int, tmp: Path) -> int | None:
    """An open fd of one of this process's spare files of ``size`` bytes, locked and renamed to ``tmp``;
    None when there is none that no reader holds."""
    for spare in sorted(shm_root().glob(f"{os.getpid()}-spare.*.bin")):
        try:
            fd = os.open(spare, os.O_RDWR)
        except FileNotFoundError:  # removed meanwhile (shutdown_store)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(fd).st_size != size:  # the model changed shape: no use for it any more
                spare.unlink(missing_ok=True)
            else:
                os.replace(spare, tmp)
                return fd
        except (BlockingIOError, FileNotFoundError):  # a reader still maps it, or it was removed
            pass
        os.close(fd)
    return None


def _retire(path: Path) -> None:
    """A dropped version's file: keep it as a spare for its writer's next push, or delete it."""
    writer = path.name.split("-", 1)[0]
    if len(list(path.parent.glob(f"{writer}-spare.*.bin"))) >= SPARES:
        path.unlink(missing_ok=True)
        return
    with contextlib.suppress(FileNotFoundError):
        os.replace(path, path.with_name(path.name.replace("-policy.", "-spare.", 1)))


class LoadedVersion:
    """What :func:`open_version` returns: ``with`` it to get the state dict (see there)."""

    def __init__(self, manifest: dict[str, Any] | None, state_dict: dict[str, torch.Tensor]):
        self.manifest, self.state_dict = manifest, state_dict
        self._locked: int | None = None

    def __enter__(self) -> dict[str, torch.Tensor]:
        if self.manifest is None:
            return self.state_dict
        _same_host(self.manifest)
        path = Path(self.manifest["path"])
        inode = path.stat().st_ino  # FileNotFoundError: dropped
        if inode in _reader_maps and os.fstat(_reader_maps[inode][0]).st_nlink == 0:
            _release(_reader_maps, inode)  # a deleted file whose inode number came back
        if inode not in _reader_maps:
            _forget_gone(_reader_maps, path.parent.iterdir())
            fd = os.open(path, os.O_RDONLY)
            if os.fstat(fd).st_ino != inode:
                os.close(fd)
                raise FileNotFoundError(f"{path} was dropped while it was being opened")
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            view = mmap.mmap(fd, os.fstat(fd).st_size, flags=flags, prot=mmap.PROT_READ)
            with warnings.catch_warnings():  # read-only on purpose: a write would change every reader's weights
                warnings.filterwarnings("ignore", message="The given buffer is not writable")
                _reader_maps[inode] = (fd, torch.frombuffer(view, dtype=torch.uint8))
        fd, buffer = _reader_maps[inode]
        _pin_for_cuda(buffer, read_only=True)
        _lock_shared(fd, path)  # until __exit__: the writer will not reuse this file meanwhile
        self._locked = fd
        return _views(buffer, self.manifest)

    def __exit__(self, *exc: Any) -> None:
        if self._locked is not None:
            fcntl.flock(self._locked, fcntl.LOCK_UN)
            self._locked = None


def _lock_shared(fd: int, path: str | Path) -> None:
    """Take a shared lock on ``fd`` and check that it is still the file at ``path``: a drop renames the
    file away, and the writer may have reused it before the lock was taken (then FileNotFoundError,
    with the lock released)."""
    fcntl.flock(fd, fcntl.LOCK_SH)
    try:
        current = os.stat(path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        current = False
    if not current:
        fcntl.flock(fd, fcntl.LOCK_UN)
        raise FileNotFoundError(f"{path} was dropped while it was being opened")


def _views(buffer: torch.Tensor, manifest: dict[str, Any]) -> dict[str, torch.Tensor]:
    return {name: buffer[start : start + nbytes].view(getattr(torch, dtype)).view(shape)
            for name, dtype, shape, start, nbytes in manifest["entries"]}


def _same_host(manifest: dict[str, Any]) -> None:
    if manifest["host"] != socket.gethostname():
        raise RuntimeError(
            f"policy weights were pushed to shared memory on host {manifest['host']!r}, but this is "
            f"{socket.gethostname()!r}; push with transport='torchstore' for readers on other hosts")


def _read_shm(manifest: dict[str, Any]) -> dict[str, torch.Tensor]:
    _same_host(manifest)
    path = manifest["path"]
    fd = os.open(path, os.O_RDONLY)
    try:
        # The shared lock lasts as long as the mapping (which holds the open file): until every view
        # below is gone, the writer will not reuse this file for a later version.
        _lock_shared(fd, path)
        # MAP_PRIVATE: copy-on-write views, so nothing is copied until the model copies them in (and a
        # consumer that writes to them changes its own copy, never the file). Not pre-populated:
        # populating a writable private mapping would copy every page.
        view = mmap.mmap(fd, os.fstat(fd).st_size, flags=mmap.MAP_PRIVATE,
                         prot=mmap.PROT_READ | mmap.PROT_WRITE)
    finally:
        os.close(fd)
    return _views(torch.frombuffer(view, dtype=torch.uint8), manifest)


def _map(fd: int, size: int, sharing: int) -> torch.Tensor:
    """A uint8 tensor over ``size`` bytes of ``fd``, with every page allocated up front (MAP_POPULATE):
    one bulk call instead of a page fault per 4 KiB of a new tmpfs file."""
    flags = sharing | getattr(mmap, "MAP_POPULATE", 0)
    view = mmap.mmap(fd, size, flags=flags, prot=mmap.PROT_READ | mmap.PROT_WRITE)
    return torch.frombuffer(view, dtype=torch.uint8)
