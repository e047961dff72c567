"""A small actor the runtime spawns on every mesh (its pids) and on every job host (the host's probe)."""

import importlib
import os
import socket
import time
from pathlib import Path

from monarch.actor import Actor, endpoint


def machine() -> tuple[str, str, int]:
    """Which machine and pid namespace this process is in: (hostname, boot id, pid namespace inode).

    Two processes with the same answer can see, signal and wait for each other's pids; the hostname alone
    does not say that (containers on one machine share none of it but may share a name)."""
    boot = Path("/proc/sys/kernel/random/boot_id")
    return (socket.gethostname(), boot.read_text().strip() if boot.exists() else "",
            os.stat("/proc/self/ns/pid").st_ino if os.path.exists("/proc/self/ns/pid") else 0)


def _siblings() -> list[tuple[int, int]]:
    """(pid, process group) of every other live process this one's parent started."""
    from forge_nb.system.processes.procs import live_children

    found = []
    for child in live_children(os.getppid()):
        try:
            if child.pid != os.getpid():
                found.append((child.pid, os.getpgid(child.pid)))
        except OSError:  # gone meanwhile
            continue
    return found


def _end(processes: list[tuple[int, int]], grace_s: float) -> list[int]:
    from forge_nb.system.processes.procs import kill_groups, kill_pids

    kill_pids([pid for pid, _ in processes], grace=grace_s)
    kill_groups([group for pid, group in processes if group == pid])
    return sorted(pid for pid, _ in processes)


def _import_all(names: list[str]) -> float:
    """Import each of ``names``, "module" or "module:attribute" (an attribute its package loads on first use, as
    transformers' classes), transformers' scan of the installed packages answered from this machine's cache
    (``forge_nb.system.dist_cache``: 0.4 s in forge_nb's environment); the seconds it took."""
    from forge_nb.system import dist_cache

    began = time.perf_counter()
    with dist_cache.cached_packages_distributions():
        for name in names:
            module, _, attribute = name.partition(":")
            loaded = importlib.import_module(module)
            if attribute:
                getattr(loaded, attribute)
    return time.perf_counter() - began


class ProcInfo(Actor):
    """Answers with its pid, so the kernel can account for, and if need be kill, every proc; on a job's
    host it is also the host's probe (``forge_nb.system.hosts.cluster``)."""

    @endpoint
    async def pid(self) -> tuple[int, int]:
        """(pid, process group): the group also holds whatever this proc starts (e.g. vLLM's engine)."""
        return os.getpid(), os.getpgid(0)

    @endpoint
    async def reap_siblings(self, grace_s: float = 3.0) -> list[int]:
        """Kill every other process its parent (the host's monarch worker) started, with their process
        groups, and return their pids: the meshes a controller that died left on this host."""
        return _end(_siblings(), grace_s)

    @endpoint
    async def end(self, pids: list[int], grace_s: float = 3.0) -> list[int]:
        """Kill those of ``pids`` that are still processes of this host's worker, with their process groups
        (a mesh the kernel stopped, on a host where the kernel cannot signal), and return them."""
        return _end([(pid, group) for pid, group in _siblings() if pid in set(pids)], grace_s)

    @endpoint
    async def collect(self) -> int:
        """Free what this process's stopped actors left in reference cycles, and return how many objects went.
        The process froze what it held when its first actor was set up (``startup_gc.settle``: its imports, and
        that actor's engine or model too), and frozen cycles are never collected: unfreeze, collect, freeze
        what is left (the imports) again."""
        import gc

        gc.unfreeze()
        freed = gc.collect()
        gc.freeze()
        return freed

    @endpoint
    async def relog(self, log_file: str) -> None:
        """This process's output into ``log_file`` from now on (a kept process taken by another run)."""
        from forge_nb.system.processes.proclogs import output_to

        output_to(log_file)

    @endpoint
    async def preload(self, names: list[str]) -> float:
        """Import ``names`` (see :func:`_import_all`) and return the seconds it took: what the actor to be spawned
        here next imports, begun before it comes (``forge_nb.controller.lifecycle.prestart``). Each actor of a
        process runs in a thread of its own (the pid probe answers meanwhile), and transformers' lazy module fails
        an import made from two threads at once: the next actor must come after this answers.

        What the imports made is frozen out of the garbage collector's walks (``startup_gc.keep_what_is_loaded``):
        the full collection that ends the actor's setup (``startup_gc.settle``), on the first step's path, then
        walks what the setup made, not torch's and transformers' objects (0.15-0.3 s on two cores)."""
        from forge_nb.system.processes import startup_gc

        took = _import_all(names)
        startup_gc.keep_what_is_loaded()
        return took

    @endpoint
    async def parent(self) -> int:
        return os.getppid()

    @endpoint
    async def host(self) -> tuple[tuple[str, str, int], int]:
        """(:func:`machine`, the CUDA devices this host's processes can see)."""
        from forge_nb.system.hosts.gpus import visible

        return machine(), visible()
