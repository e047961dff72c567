"""What killed processes leave on the machine, found and removed: vLLM's shared-memory segments and
rendezvous files, generator socket folders and weight files of processes that are gone.

A vLLM engine killed with SIGKILL cannot clean up: its ``/dev/shm/psm_*`` segments (each hundreds of
MB of apparent size), multiprocessing's named semaphores (``/dev/shm/sem.mp-*``, where its resource
tracker died with it) and the ``<tmp>/vllm_dist_*`` file of its torch.distributed rendezvous stay
until reboot. Their names say nothing of their owner, so a file counts as left over when no live
process maps it or holds it open (read from ``/proc``) and it is older than ``min_age_s`` (so one
being created right now by a starting engine is never taken). Folders and files named after a pid
(generator sockets, weight files) go when that pid is gone. The run calls :func:`remove_leftovers`
when it shuts down and when it spawns.

Most of it is gone before that: whoever kills an engine (``forge_nb.system.processes.procs.kill_groups``, and the
reaper of a killed kernel) removes the segments it mapped, and the reaper also the kernel's and its procs'
socket folders and weight files. This module is the fallback for what they cannot attribute (the
``vllm_dist_*`` files, open in no process) and for processes killed some other way.

Considered: letting each engine clean up after itself (a SIGKILLed process runs nothing) and
pointing vLLM's temporary files into a per-process folder (``psm_*`` names are fixed by Python's
``multiprocessing.shared_memory`` under ``/dev/shm``, whatever TMPDIR says).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path

from forge_nb.system.processes.procs import (
    SEGMENTS,
    SHM,
    SOCKETS_ROOT,
    files_in_use,
    remove_left_by_dead,
    weight_files_root,
)


def orphaned(patterns: list[tuple[Path, str]], min_age_s: float = 30.0) -> list[Path]:
    """Files matching ``(folder, glob)`` that no live process uses and that are older than ``min_age_s``."""
    now = time.time()
    candidates = []
    for folder, pattern in patterns:
        for path in folder.glob(pattern) if folder.is_dir() else []:
            try:
                if path.is_file() and path.stat().st_uid == os.getuid() and now - path.stat().st_mtime >= min_age_s:
                    candidates.append(path)
            except OSError:
                continue
    if not candidates:
        return []
    used = files_in_use()
    return [p for p in candidates if str(p) not in used]


def engine_patterns() -> list[tuple[Path, str]]:
    return [*((SHM, pattern) for pattern in SEGMENTS), (Path(tempfile.gettempdir()), "vllm_dist_*")]


def remove_leftovers(min_age_s: float = 30.0) -> dict[str, int]:
    """Remove what killed engines and generators left; returns how many of each kind went."""
    removed = {"engine files": 0}
    for path in orphaned(engine_patterns(), min_age_s):
        path.unlink(missing_ok=True)
        removed["engine files"] += 1
    removed["socket folders"] = len(remove_left_by_dead(SOCKETS_ROOT))
    removed["weight files"] = len(remove_left_by_dead(weight_files_root()))  # weights.shm.remove_orphaned_shm
    return removed
