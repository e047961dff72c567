"""Rows: a run's per-step rows as a list that does not grow in memory with the run.

A run records a row of ~50 values every step, for as long as the kernel lives: as Python dicts that is ~6 KB a
step, a gigabyte a week. ``Rows`` holds in memory the last ``keep`` rows and any row its file does not hold yet
(a full disk keeps them back: ``MetricsStore``), and for every older row only where its line starts in the run
directory's ``metrics.jsonl`` (8 bytes); an older row is read back from there when asked for. It is a
``Sequence``: ``len``, indexing, slices, iteration and ``reversed`` as on the list it replaces, so
``run.metrics.rows``, the dashboard and the exporters read it as before. Reading the whole history (a dashboard
opened mid-run, ``run.metrics.frame()``) parses the file once, ~10 ms per thousand rows.

Without a file (a store with no run directory) every row stays in memory, as before.

Considered: the rows as numpy columns (~9 bytes per value with a mask for absent ones, ~0.45 MB per thousand
steps of the quickstart's 50 values, and every value a float64 where the file keeps what was recorded); pandas
chunks (the same, and a dependency on every append); a file per metric. The file is already written, whole and
in order, for ``forge_nb.resume``: reading it back costs nothing while the run trains.
"""

from __future__ import annotations

import json
import logging
from array import array
from collections import deque
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import IO, Any, overload

__all__ = ["KEEP", "Rows"]

logger = logging.getLogger(__name__)

#: rows held in memory whatever the run's length (the newest): what a dashboard, a step's caller and the status read
KEEP = 1000

Row = dict[str, Any]


class Rows(Sequence[Row]):
    """The rows of one run, the last ``keep`` in memory and the older ones in ``path`` (see the module docstring)."""

    def __init__(self, path: Path | None = None, keep: int = KEEP) -> None:
        self._path, self._keep = path, keep
        self._offsets = array("q")  # where row i's line starts in the file, for every row the file holds
        self._mem: dict[int, Row] = {}  # the rows in memory: the last `keep`, and those the file lacks yet
        self._n = 0
        if path is not None and path.exists():
            self._index(path)

    def _index(self, path: Path) -> None:
        """Where each whole line of ``path`` starts, and the last ``keep`` rows parsed; a damaged line (cut by a
        crash mid-write) is skipped with a warning, as the history always was."""
        tail: deque[tuple[int, Row]] = deque(maxlen=self._keep)
        offset = 0
        with path.open("rb") as f:
            for line in f:
                if line.strip():
                    try:
                        row = json.loads(line)
                    except json.JSONDecodeError:
                        logger.warning("skipping a damaged line in %s", path)
                    else:
                        self._offsets.append(offset)
                        tail.append((self._n, row))
                        self._n += 1
                offset += len(line)
        self._mem = dict(tail)

    # -- growing ------------------------------------------------------------------------------------

    def append(self, row: Row) -> None:
        """A new row, held in memory until its file holds it (``written``)."""
        self._mem[self._n] = row
        self._n += 1
        self._evict()

    def written(self, offsets: list[int]) -> None:
        """The file now holds the next ``len(offsets)`` rows not yet in it, their lines starting at ``offsets``."""
        self._offsets.extend(offsets)
        self._evict()

    def _evict(self) -> None:
        if self._path is None:
            return
        oldest = min(self._n - self._keep, len(self._offsets))  # older than the last `keep`, and in the file
        for i in range(self._n - len(self._mem), oldest):  # the rows in memory are always the last ones, in a run
            del self._mem[i]

    @property
    def in_memory(self) -> int:
        """How many rows are held as dicts (at most ``keep`` plus those a full disk keeps back)."""
        return len(self._mem)

    # -- reading ------------------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._n

    @overload
    def __getitem__(self, index: int) -> Row: ...

    @overload
    def __getitem__(self, index: slice) -> list[Row]: ...

    def __getitem__(self, index: int | slice) -> Row | list[Row]:
        if isinstance(index, slice):
            return list(self._rows(range(*index.indices(self._n))))
        if index < 0:
            index += self._n
        if not 0 <= index < self._n:
            raise IndexError(f"row {index} of {self._n}")
        (row,) = self._rows([index])
        return row

    def __iter__(self) -> Iterator[Row]:
        return self._rows(range(self._n))

    def __reversed__(self) -> Iterator[Row]:
        return self._rows(range(self._n - 1, -1, -1))

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"<Rows {self._n} ({len(self._mem)} in memory){f' in {self._path}' if self._path else ''}>"

    def _rows(self, indices: Sequence[int] | range) -> Iterator[Row]:
        """The rows at ``indices``, in that order: from memory, or read back from the file (opened once)."""
        f: IO[bytes] | None = None
        try:
            for i in indices:
                row = self._mem.get(i)
                if row is None:
                    if f is None:
                        assert self._path is not None
                        f = self._path.open("rb")
                    f.seek(self._offsets[i])
                    row = json.loads(f.readline())
                yield row
        finally:
            if f is not None:
                f.close()
