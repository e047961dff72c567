"""RunAssembly: what closes each part of one run, and the one order they close in.

``build_run`` (``forge_nb.controller.lifecycle.build``) makes a run's parts in the order they need each other: the
weights' namespace and the store, the services, then the run's records (its kernel log and metrics), its books
and its controller; the Run adds fronts (the OpenAI endpoint, the Tinker server) and exporters when a cell asks
for them. Each part is registered here as it is made, with what closes it and the phase it closes in.
:meth:`RunAssembly.close` runs the phases in :data:`PHASES` order:

- ``loops``: the controller's loops stop, so nothing new is asked of a part that is going;
- ``fronts``: the endpoints that reach the services (an agent's call must not find them gone);
- ``services``: the generators, the reference model, the trainer (their processes stop, or wait warm);
- ``weights``: the run's versions and its lease on the kernel's torchstore;
- ``records``: the controller's last state, what killed engines left on the machine, the exporters;
- ``log``: the run's kernel log, last, so the teardown itself is in it.

Within a phase parts close in the order they were registered. A part that fails to close is logged and the
others still close; the first failure is raised once all have run. A build that fails part-way closes what it
had made the same way, so a spawn that raises leaves nothing of itself behind.

Considered: ``contextlib.AsyncExitStack``, which closes newest first: the run's records are made after its
services but must outlive them, and fronts made last must go after the loops, so the order would be the
order in which a cell happened to ask for things; phases say it once.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["PHASES", "RunAssembly"]

logger = logging.getLogger(__name__)

#: The order a run's parts close in (see the module docstring).
PHASES = ("loops", "fronts", "services", "weights", "records", "log")

Closer = Callable[[], Awaitable[Any] | Any]


class RunAssembly:
    """The closers of one run's parts, by phase; :meth:`close` once."""

    def __init__(self, run: str):
        self.run = run
        self.closed = False
        self._closers: dict[str, list[tuple[str, Closer]]] = {phase: [] for phase in PHASES}

    def add(self, phase: str, what: str, close: Closer) -> None:
        """Register ``close`` (a function, sync or async) for the part ``what``, to run in ``phase``."""
        if phase not in self._closers:
            raise ValueError(f"phase={phase!r}: one of {PHASES}")
        if self.closed:
            raise RuntimeError(f"run {self.run!r} is shut down: {what} cannot join it")
        self._closers[phase].append((what, close))

    def parts(self) -> list[tuple[str, str]]:
        """(phase, part) in the order :meth:`close` closes them."""
        return [(phase, what) for phase in PHASES for what, _ in self._closers[phase]]

    async def close(self) -> None:
        """Close every registered part, phase by phase; the first failure is raised after the rest closed."""
        if self.closed:
            return
        self.closed = True
        first: Exception | None = None
        for phase in PHASES:
            for what, close in self._closers[phase]:
                try:
                    result = close()
                    if inspect.isawaitable(result):
                        await result
                except Exception as error:  # the others close all the same
                    logger.warning("run %s: closing %s (%s) failed: %s: %s", self.run, what, phase,
                                   type(error).__name__, error)
                    first = first or error
        if first is not None:
            raise first

    async def close_after_failure(self) -> None:
        """:meth:`close` for a build that failed part-way: every failure to close is logged, none raised, as the
        error that stopped the build is the one to report."""
        with contextlib.suppress(Exception):  # each was logged by close()
            await self.close()
