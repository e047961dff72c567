"""The shared-memory transport of ``forge_nb.weights``: one file per pushed version under ``/dev/shm``.

The writer lays the whole state dict out in one file and stores only a small manifest in torchstore
(host, path, and each tensor's dtype, shape and offset). Readers map the file and get zero-copy tensor
views, so a push is one host memcpy and a load is the copy into the model. ``bench/weight_sync.py``
measures it against torchstore's own path and plain memcpy.

Files, each named after its writer's pid and the version's key (``<namespace>.v<v>``, so writers and
namespaces never collide): ``{pid}-{key}.bin`` (a version), ``{pid}-{key}.tmp`` (being written) and
``{pid}-{key}.spare`` (a dropped version's file, kept for its writer's next push, whatever its namespace).
The file is written under the temporary name and renamed before the manifest is stored, so a reader
never sees a partial version. A dropped file stays as a *spare* (at most ``SPARES`` per writer): filling
a new tmpfs file costs about twice a memcpy, because the kernel zeroes every page first, while a spare's
pages are already there. A reader holds a shared ``flock`` on the file while it reads (``read_shm``: as
long as its views are alive, since the lock lives with the mapping; ``LoadedVersion``: inside its
``with`` block), and a writer reuses a spare only when it gets the exclusive lock, so a file is never
rewritten under a reader that still looks at it. Writers and ``LoadedVersion`` readers keep their
mappings of the files (which rotate through the spares), so later pushes and loads take no page faults.
``write_file`` is that file machinery for any filler: ``write_shm`` copies tensors in, and a reader on
another host receives a version's bytes from its writer's stream (``forge_nb.weights.stream``).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import glob
import logging
import mmap
import os
import socket
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from forge_nb.system.processes.procs import remove_left_by_dead, weight_files_root

logger = logging.getLogger(__name__)

SPARES = 2  #: dropped shared-memory files kept per writer for its next pushes
_ALIGN = 64


def shm_root() -> Path:
    """Where the weight files are: ``FORGE_NB_SHM_DIR``, by default ``/dev/shm/forge_nb``."""
    return weight_files_root()


def host_id() -> str:
    """The host this process reads and writes shared memory on: the job host forge_nb placed it on
    (``FORGE_NB_HOST``, "kernel" for the kernel's own) on this machine. Hosts of a ``ProcessJob`` share one
    machine's /dev/shm, but each is a host of its own here, as it would be on a cluster."""
    return f"{os.environ.get('FORGE_NB_HOST', 'kernel')}@{socket.gethostname()}"


def remove_orphaned_shm() -> list[str]:
    """Delete shared-memory weight files whose writer process is gone (a killed kernel or trainer)."""
    return [str(path) for path in remove_left_by_dead(shm_root())]


def remove_spares() -> None:
    """Delete every writer's spare files, and the hosts' lock files of their copies (the store is going
    away: nothing will be pushed to it or copied from it again)."""
    for spare in [*shm_root().glob("*.spare"), *shm_root().glob("*.lock")]:
        spare.unlink(missing_ok=True)


def stored_dtype(tensor: torch.Tensor, dtype: torch.dtype | None) -> torch.dtype:
    """The type ``tensor`` is pushed as with ``push_state_dict(..., dtype=dtype)``."""
    return dtype if dtype is not None and tensor.is_floating_point() else tensor.dtype


def write_shm(state_dict: dict[str, torch.Tensor], key: str, dtype: torch.dtype | None = None) -> dict[str, Any]:
    """Lay ``state_dict`` out in this process's file for ``key`` (``<namespace>.v<v>``); its manifest."""
    entries, offset = [], 0
    for name, tensor in state_dict.items():
        stored = stored_dtype(tensor, dtype)
        nbytes = tensor.numel() * stored.itemsize
        entries.append((name, str(stored).removeprefix("torch."), tuple(tensor.shape), offset, nbytes))
        offset += -(-nbytes // _ALIGN) * _ALIGN

    def fill(buffer: torch.Tensor) -> None:
        if any(t.is_cuda for t in state_dict.values()):
            _pin_for_cuda(buffer, read_only=False)
        for (_, stored, _, start, nbytes), tensor in zip(entries, state_dict.values(), strict=True):
            # one pass per tensor: from any device and dtype straight into the file's pages
            target, source = getattr(torch, stored), tensor.detach().reshape(-1)
            if source.is_cuda and source.dtype != target:
                # convert on the GPU, then one DMA: a mixed copy would bring float32 over and convert on the CPU
                source = source.to(target)
            buffer[start : start + nbytes].view(target).copy_(source)

    path = write_file(key, max(offset, 1), fill)
    return {"host": host_id(), "path": str(path), "entries": entries}


def file_size(entries: list[Any]) -> int:
    """The size of the file a manifest's ``entries`` were laid out in (``write_shm``)."""
    return max([-(-(start + nbytes) // _ALIGN) * _ALIGN for *_, start, nbytes in entries] + [1])


_files_lock = threading.Lock()  # write_file runs in a thread for a stream (weights.stream), and in the loop


def write_file(key: str, size: int, fill: Callable[[torch.Tensor], None]) -> Path:
    """This process's file for ``key``, ``size`` bytes that ``fill(buffer)`` writes (``buffer``: a uint8 tensor
    over the whole file): a spare of that size or a new file, kept mapped, written under the temporary name
    and renamed when ``fill`` returns. If ``fill`` raises, the file and its mapping go: no partial version
    is ever left under a version's name."""
    root = shm_root()
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{os.getpid()}-{key}.bin"
    tmp = path.with_suffix(".tmp")
    with _files_lock:
        _forget_gone(_writer_maps, root.glob(f"{os.getpid()}-*"))
        fd = _take_spare(size, tmp)
        if fd is None:
            fd = os.open(tmp, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o600)
            os.ftruncate(fd, size)
        inode = os.fstat(fd).st_ino
        buffer = _writer_maps.get(inode)
        if buffer is None:
            buffer = _writer_maps[inode] = _map(fd, size, mmap.MAP_SHARED)
    try:
        try:
            fill(buffer)
        except BaseException:
            with _files_lock:
                _release(_writer_maps, inode)
            buffer = None  # the traceback keeps this frame: the mapping goes now, not with the error
            tmp.unlink(missing_ok=True)
            raise
        fcntl.flock(fd, fcntl.LOCK_UN)  # a reused spare was locked; readers may lock it from now on
        os.replace(tmp, path)
    finally:
        os.close(fd)
    return path


# This process's mappings of shared-memory files, by inode, kept while the file exists: a push into (or
# a load from) a file mapped before costs one copy, with no page-table set-up for its pages.
_writer_maps: dict[int, torch.Tensor] = {}
_reader_maps: dict[int, tuple[int, torch.Tensor]] = {}  # inode -> (its fd, to lock on; the mapping)


def _forget_gone(maps: dict[int, Any], paths: Any) -> None:
    """Drop the mappings of files that are gone (so their memory is freed); ``paths``: the folder's entries
    (``Path`` objects or ``os.DirEntry``s, whose ``stat()`` both follow a link)."""
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
    for spare in sorted(shm_root().glob(f"{os.getpid()}-*.spare")):
        try:
            fd = os.open(spare, os.O_RDWR)
        except FileNotFoundError:  # removed meanwhile (shutdown_store)
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if os.fstat(fd).st_size != size:  # the model changed shape: no use for it any more
                spare.unlink(missing_ok=True)
                if (inode := os.fstat(fd).st_ino) in _writer_maps:
                    _release(_writer_maps, inode)  # nor for our mapping of it
            else:
                os.replace(spare, tmp)
                return fd
        except (BlockingIOError, FileNotFoundError):  # a reader still maps it, or it was removed
            pass
        os.close(fd)
    return None


def retire(path: str | os.PathLike[str]) -> None:
    """A dropped version's file: keep it as a spare for its writer's next push, or delete it.

    The kernel drops a version every other step, so this works on strings, not ``Path`` objects: CPython 3.11's
    pathlib interns every part of a path it parses, and each version's file name is new, so the interpreter's
    table of interned strings took a slot a step, not reused until the table is rebuilt; after ~7,000 steps the
    rebuild doubled it (+1.9 MB in the kernel at once, ``bench/kernel_memory.py``)."""
    path = os.fspath(path)
    folder, name = os.path.split(path)
    writer = name.split("-", 1)[0]
    if len(glob.glob(os.path.join(glob.escape(folder), f"{glob.escape(writer)}-*.spare"))) >= SPARES:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        return
    with contextlib.suppress(FileNotFoundError):
        os.replace(path, os.path.splitext(path)[0] + ".spare")


class LoadedVersion:
    """What :func:`open_version` returns: ``with`` it to get the state dict (see there)."""

    def __init__(self, manifest: dict[str, Any] | None, state_dict: dict[str, torch.Tensor]):
        self.manifest, self.state_dict = manifest, state_dict
        self._locked: int | None = None

    def __enter__(self) -> dict[str, torch.Tensor]:
        if self.manifest is None:
            return self.state_dict
        _same_host(self.manifest)
        path = self.manifest["path"]  # a str: a Path would intern each version's new file name (see retire)
        inode = os.stat(path).st_ino  # FileNotFoundError: dropped
        if inode in _reader_maps and os.fstat(_reader_maps[inode][0]).st_nlink == 0:
            _release(_reader_maps, inode)  # a deleted file whose inode number came back
        if inode not in _reader_maps:
            with os.scandir(os.path.dirname(path)) as entries:
                _forget_gone(_reader_maps, entries)
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
    if manifest["host"] != host_id():
        raise RuntimeError(
            f"policy weights were pushed to shared memory on host {manifest['host']!r}, but this is "
            f"{host_id()!r}; push with transport='shm+stream' for readers on other hosts")


def read_shm(manifest: dict[str, Any]) -> dict[str, torch.Tensor]:
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
