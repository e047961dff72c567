"""What runs under a process, read from /proc (no helper process of our own that would show up)."""

from __future__ import annotations

import os

from forge_nb._procs import stat_fields


def _children_by_parent() -> dict[int, list[int]]:
    """Live (non-zombie) processes by parent pid."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = stat_fields(entry)
            except OSError:
                continue
            if fields[0] != "Z":
                children.setdefault(int(fields[1]), []).append(int(entry))
    return children


def children(root: int) -> set[int]:
    """Live child processes of ``root``."""
    return set(_children_by_parent().get(root, []))


def descendants(root: int) -> dict[int, str]:
    """Every live process under ``root``, with the start of its command line."""
    children = _children_by_parent()
    found, todo = {}, list(children.get(root, []))
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/cmdline") as f:
                found[pid] = f.read().replace("\0", " ")[:120]
        except OSError:
            continue
        todo += children.get(pid, [])
    return found
