"""What killed processes leave on the machine, found and removed: vLLM's shared-memory segments, and the
generator folders and weight files of processes that are gone.

A vLLM engine killed with SIGKILL cannot clean up: its ``/dev/shm/psm_*`` segments (each hundreds of
MB of apparent size) and multiprocessing's named semaphores (``/dev/shm/sem.mp-*``, where its resource
tracker died with it) stay until reboot. Their names are fixed by Python (``multiprocessing.shared_memory``,
whatever TMPDIR says) and say nothing of their owner, so such a file counts as left over only when no live
process maps it or holds it open (read from ``/proc``) and it is older than ``min_age_s`` (so one being
created right now by a starting engine is never taken): a live process's files, another kernel's included,
are never touched. Folders and files named after a pid go when that pid is gone: a generator's own folder
(vLLM's sockets, and the engine's torch.distributed rendezvous file, which vLLM would put in the machine's
temporary folder, open in no process and named by nobody: ``forge_nb.actors.generator`` points it into the
folder) and weight files. The run calls :func:`remove_leftovers` when it shuts down and when it spawns.

Most of it is gone before that: whoever kills an engine (``forge_nb.system.processes.procs.kill_groups``, and the
reaper of a killed kernel) removes the segments it mapped, and the reaper also the kernel's and its procs'
folders and weight files. This module is the fallback for processes killed some other way.

Considered: letting each engine clean up after itself (a SIGKILLed process runs nothing) and sweeping the
machine's temporary folder for ``vllm_dist_*`` files unused for a while (which took another kernel's
rendezvous file while its engine was still starting).
"""

from __future__ import annotations

import os
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
    """The files of engines that only use tells apart: shared-memory segments and named semaphores."""
    return [(SHM, pattern) for pattern in SEGMENTS]


def remove_leftovers(min_age_s: float = 30.0) -> dict[str, int]:
    """Remove what killed engines and generators left; returns how many of each kind went."""
    removed = {"engine files": 0}
    for path in orphaned(engine_patterns(), min_age_s):
        path.unlink(missing_ok=True)
        removed["engine files"] += 1
    removed["socket folders"] = len(remove_left_by_dead(SOCKETS_ROOT))
    removed["weight files"] = len(remove_left_by_dead(weight_files_root()))  # weights.shm.remove_orphaned_shm
    return removed
