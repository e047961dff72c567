"""What runs under a process (psutil; no helper process of our own that would show up)."""

from __future__ import annotations

import psutil

from forge_nb._procs import live_children


def children(root: int) -> set[int]:
    """Live child processes of ``root``."""
    return {p.pid for p in live_children(root)}


def descendants(root: int) -> dict[int, str]:
    """Every live process under ``root``, with the start of its command line."""
    found = {}
    for child in live_children(root, recursive=True):
        try:
            found[child.pid] = " ".join(child.cmdline())[:120]
        except psutil.Error:  # gone meanwhile
            continue
    return found
