"""The installed distributions' top-level packages (``importlib.metadata.packages_distributions()``), computed
once per environment and kept in this machine's cache folder.

transformers calls ``packages_distributions()`` when it is imported (``transformers/utils/import_utils.py``), and
the call reads the metadata of every installed distribution, and the RECORD of each one that has no
``top_level.txt``: 0.5-0.9 s of CPU on the project's 2-core machine in a venv of ~360 distributions. A generator's
process pays it in the serial chain of imports that a run's first step waits for
(:mod:`forge_nb.actors.engine.preimport`).

The answer depends only on what is installed where the interpreter looks, so :func:`cached_packages_distributions`
keys a JSON file on the Python version, ``sys.path``, and the metadata folders (``*.dist-info``, ``*.egg-info``) in
each of its folders with their modification times: installing, upgrading or removing a distribution adds, renames
or removes one (a reinstall of the same version makes it anew). Anything else written beside them leaves the key as
it was: ``sys.path`` starts with the current folder (a notebook's, where a run writes its files), and keying on
folders' own times, as importlib.metadata's lookup cache does, missed there whenever a file came or went (52 files
in a few hours of this project's tests). Listing the folders costs ~3 ms. A missing, unreadable or stale file is
computed again and written by rename, so concurrent processes never read half a file; the newest ``KEEP`` files
are kept. Considered: passing the kernel's answer to each process (a process's ``sys.path`` is its own), and
leaving transformers' import alone (the ~0.7 s is ~5% of that chain).
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import json
import os
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any


def cache_root() -> Path | None:
    """This machine's folder for forge_nb's caches: ``$FORGE_NB_CACHE_DIR``, by default ``~/.cache/forge_nb``;
    None when that variable is set empty (caching turned off)."""
    root = os.environ.get("FORGE_NB_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "forge_nb"))
    return Path(root) if root else None


KEEP = 16  #: cache files kept (one per environment and ``sys.path``); older ones are removed on a write
_METADATA = (".dist-info", ".egg-info")


def _key() -> str:
    """What ``packages_distributions()`` depends on: the interpreter's version, and the distributions' metadata
    folders (names and times) where it looks."""
    def found(entry: str) -> Any:
        place = entry or "."
        try:
            with os.scandir(place) as listing:
                return sorted((e.name, e.stat().st_mtime_ns) for e in listing if e.name.endswith(_METADATA))
        except NotADirectoryError:  # a zip file on the path
            return os.stat(place).st_mtime_ns
        except OSError:  # missing or unreadable (or a path hook's name): nothing found there
            return None

    places = [(entry, os.path.abspath(entry or "."), found(entry)) for entry in sys.path]
    return hashlib.sha256(json.dumps([sys.version, places]).encode()).hexdigest()[:24]


def _read(path: Path) -> dict[str, list[str]] | None:
    try:
        found = json.loads(path.read_text())
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _write(path: Path, mapping: Mapping[str, list[str]]) -> None:
    """Write by rename; a cache that cannot be written is only a cache."""
    scratch = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        scratch.write_text(json.dumps(dict(mapping)))
        os.replace(scratch, path)
    except OSError:
        scratch.unlink(missing_ok=True)
        return
    _prune(path.parent)


def _prune(folder: Path) -> None:
    """Remove all but the newest ``KEEP`` cache files (other environments' and older ``sys.path``'s)."""
    def age(file: Path) -> int:
        try:
            return file.stat().st_mtime_ns
        except OSError:
            return 0

    for old in sorted(folder.glob("*.json"), key=age, reverse=True)[KEEP:]:
        old.unlink(missing_ok=True)


@contextlib.contextmanager
def cached_packages_distributions() -> Iterator[None]:
    """Inside the block, ``importlib.metadata.packages_distributions()`` answers from the cache file (computing
    and writing it on a miss); each call gets its own copy. Outside, the function is the standard one again."""
    root = cache_root()
    if root is None:
        yield
        return
    path = root / "packages-distributions" / f"{_key()}.json"
    standard = importlib.metadata.packages_distributions
    known: dict[str, list[str]] | None = None

    def packages_distributions() -> Mapping[str, list[str]]:
        nonlocal known
        if known is None:
            known = _read(path)
        if known is None:
            known = {name: list(dists) for name, dists in standard().items()}
            _write(path, known)
        return {name: list(dists) for name, dists in known.items()}

    importlib.metadata.packages_distributions = packages_distributions  # type: ignore[assignment]
    try:
        yield
    finally:
        importlib.metadata.packages_distributions = standard
