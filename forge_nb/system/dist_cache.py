"""The installed distributions' top-level packages (``importlib.metadata.packages_distributions()``), computed
once per environment and kept in this machine's cache folder.

transformers calls ``packages_distributions()`` when it is imported (``transformers/utils/import_utils.py``), and
the call reads the metadata of every installed distribution, and the RECORD of each one that has no
``top_level.txt``: 0.5-0.9 s of CPU on the project's 2-core machine in a venv of ~360 distributions. A generator's
process pays it in the serial chain of imports that a run's first step waits for (:mod:`forge_nb.actors._vllm_import`).

The answer depends only on what is installed where the interpreter looks, so :func:`cached_packages_distributions`
keys a JSON file on the Python version, ``sys.path`` and the modification time of each of its folders (installing
or removing a distribution adds or removes a folder there; importlib.metadata's own lookup cache keys on the same
times). A missing, unreadable or stale file is computed again and written by rename, so concurrent processes
never read half a file. Considered: passing the kernel's answer to each process (a process's ``sys.path`` is its
own), and leaving transformers' import alone (the ~0.7 s is ~5% of that chain).
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


def cache_root() -> Path | None:
    """This machine's folder for forge_nb's caches: ``$FORGE_NB_CACHE_DIR``, by default ``~/.cache/forge_nb``;
    None when that variable is set empty (caching turned off)."""
    root = os.environ.get("FORGE_NB_CACHE_DIR", os.path.join(os.path.expanduser("~"), ".cache", "forge_nb"))
    return Path(root) if root else None


def _key() -> str:
    """What ``packages_distributions()`` depends on: the interpreter's version and where it finds distributions."""
    def mtime(entry: str) -> int:
        try:
            return os.stat(entry or ".").st_mtime_ns
        except OSError:
            return -1

    places = [(entry, os.path.abspath(entry or "."), mtime(entry)) for entry in sys.path]
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
