"""RunView: what the widgets use of a ``forge_nb.Run``, as a Protocol, since the widgets never import the Run.

A widget's module stays light (no monarch, no torch, no service layer: ``tests/widgets/test_imports.py``), so it
cannot name the Run's class; a Run satisfies this Protocol as it is. What a run may lack, or what a run that shut
down no longer answers (``services``, ``version``, ``job``, ``hparams``, ``state``), the widgets read with
``getattr`` and a default, so they are not part of it.
"""

from __future__ import annotations

from typing import Any, Protocol

__all__ = ["RunView"]


class RunView(Protocol):
    """The run's name, directory and metric store, its episodes and logs, and its public controls."""

    @property
    def name(self) -> str: ...
    @property
    def dir(self) -> Any: ...  # a forge_nb.rundir.RunDir: ``dir.logs`` is the folder of its log files
    @property
    def metrics(self) -> Any: ...  # a forge_nb.metrics.MetricsStore: rows, events, subscribe()

    def episodes(self, n: int = 50, version: int | None = None, min_reward: float | None = None,
                 max_reward: float | None = None) -> list[dict[str, Any]]: ...
    def logs(self, service: str | None = None, index: int | None = None, n: int = 40,
             level: str | None = None) -> str: ...
    def set(self, **changes: Any) -> dict[str, Any]: ...
    def start(self) -> None: ...
    def pause(self) -> None: ...
    def resume(self) -> None: ...
    async def step(self, n: int = 1) -> list[dict[str, Any]]: ...
    async def stop(self, timeout: float = 120.0) -> None: ...
    async def shutdown(self) -> None: ...
