"""What runs under a process (psutil, through forge_nb.system.processes.procs; no helper process of our own that would
show up)."""

from __future__ import annotations

from forge_nb.system.processes import procs
from forge_nb.system.processes.procs import live_children


def children(root: int) -> set[int]:
    """Live child processes of ``root``."""
    return {p.pid for p in live_children(root)}


def descendants(root: int) -> dict[int, str]:
    """Every live process under ``root``, with the start of its command line."""
    return {pid: command[:120] for pid, command in procs.descendants(root).items()}
