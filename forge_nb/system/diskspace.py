"""A full disk, said as such: what was not written, where, how much space it needs, and what to do.

A write that fails for space surfaces deep in a stack as ``OSError: [Errno 28] No space left on device``
(or, from an actor on another process, as that text inside monarch's error). :func:`full_disk_as` turns it
into :class:`DiskFull`, whose message names the folder, what was not written, the free space and about how
much is needed; a checkpoint's pauses the run with it (``run.start()`` goes on once space is back). Metric rows
and events that cannot be written are kept in memory and written later (``forge_nb.metrics``).
"""

from __future__ import annotations

import errno
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

__all__ = ["DiskFull", "free_bytes", "full_disk_as", "is_no_space", "size_of"]


class DiskFull(OSError):
    """A write failed because the disk of its folder is full."""


def is_no_space(error: BaseException) -> bool:
    """Whether ``error`` (or what caused it, or an actor's error that quotes it) is a full disk."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(seen) or "Disk quota exceeded" in str(seen):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def free_bytes(path: str | Path) -> int:
    """Free space for the folder ``path`` (or the nearest folder above it that exists)."""
    path = Path(path)
    while not path.exists() and path != path.parent:
        path = path.parent
    return shutil.disk_usage(path).free


def size_of(path: str | Path) -> int:
    """Bytes under ``path`` (a file, or a folder's files); 0 when it is not there."""
    path = Path(path)
    if path.is_file():
        return path.stat().st_size
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def _mb(n: int) -> str:
    return f"{n / 2**20:.1f} MB"


@contextmanager
def full_disk_as(where: str | Path, what: str, needs: int) -> Iterator[None]:
    """Run the block; a full disk in it becomes :class:`DiskFull` naming ``where``, ``what`` was not written
    and the ``needs`` bytes it takes (an estimate: the last one of its kind; 0 when there is none)."""
    try:
        yield
    except DiskFull:
        raise
    except Exception as e:
        free = free_bytes(where)
        # torch.save says "basic_ios::clear: iostream error" on a full disk: no room left is the tell then
        if not is_no_space(e) and free >= max(needs, 2**20):
            raise
        need = f"; it needs about {_mb(needs)}" if needs else ""
        full = DiskFull(f"the disk of {where} is full: {what} was not written ({_mb(free)} free{need}). Free "
                        "space there (or give the run another run_dir), then run.start() (%forge_run) goes on "
                        "from where it stopped")
        full.errno = errno.ENOSPC
        raise full from e
