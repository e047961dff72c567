"""The runs the magics know: by name, the current one, and the waiters of ``%forge_run --steps``."""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from IPython.core.error import UsageError

logger = logging.getLogger(__name__)

NO_RUN = ("no run yet: %forge_spawn quickstart spawns one (or a YAML path, 'module:function', or a "
          "variable holding a RunConfig); %forge_attach PATH brings back a run directory")


_registries: dict[int, Runs] = {}  # id(shell) -> its runs


class Runs:
    """Runs spawned or attached through the magics; the last one is current."""

    def __init__(self, user_ns: dict[str, Any]):
        self.user_ns = user_ns
        self.by_name: dict[str, Any] = {}
        self.current: str | None = None
        # run name -> the task awaiting ``run.step(n)`` for ``%forge_run --steps n`` (a strong reference)
        self.stepping: dict[str, asyncio.Task[Any]] = {}

    @classmethod
    def of(cls, shell: Any) -> Runs:
        """The shell's registry; it outlives ``%reload_ext forge_nb``."""
        if id(shell) not in _registries or _registries[id(shell)].user_ns is not shell.user_ns:
            _registries[id(shell)] = cls(shell.user_ns)
        return _registries[id(shell)]

    def add(self, run: Any) -> None:
        self.by_name[run.name] = run
        self.current = run.name

    def check_free(self, name: str) -> None:
        run = self.by_name.get(name)
        if run is not None and run.state != "shut down":
            raise UsageError(f"a run named {name!r} is already up ({run.state}); %forge_shutdown --name {name} "
                             "first, or give the new one another name with --name")

    def get(self, name: str | None = None) -> Any:
        """The run called ``name`` (a run name or a variable holding a Run), else the current one."""
        from forge_nb.run import Run

        if name is not None:
            if name in self.by_name:
                return self.by_name[name]
            if isinstance(self.user_ns.get(name), Run):
                return self.user_ns[name]
            known = ", ".join(self.by_name) or "none"
            raise UsageError(f"no run named {name!r} (runs the magics know: {known}); "
                             "--name takes a run's name or a variable holding a Run")
        if self.current is not None:
            return self.by_name[self.current]
        found = [v for v in self.user_ns.values()
                 if isinstance(v, Run) and v.state != "shut down" and not self._is_hidden(v)]
        if len(found) == 1:  # a run made with `run = await forge_nb.spawn(...)`
            return found[0]
        if found:
            raise UsageError(f"{len(found)} runs are in the namespace and none was spawned by the magics; "
                             "say which with --name VARIABLE")
        raise UsageError(NO_RUN)

    def _is_hidden(self, value: Any) -> bool:
        names = [k for k, v in self.user_ns.items() if v is value]
        return all(k.startswith("_") for k in names)

    def live(self, include_namespace: bool = False) -> list[Any]:
        """Runs not shut down; with ``include_namespace``, also those made with ``forge_nb.spawn`` directly."""
        found = list(self.by_name.values())
        if include_namespace:
            from forge_nb.run import Run

            found += [v for v in self.user_ns.values() if isinstance(v, Run)]
        return [r for r in {id(r): r for r in found}.values() if r.state != "shut down"]

    def forget(self, run: Any) -> None:
        if self.by_name.get(run.name) is run:
            del self.by_name[run.name]
        if self.current == run.name:
            self.current = next(reversed(self.by_name), None)
        self.cancel_stepping(run.name)

    def step_in_background(self, run: Any, n: int) -> None:
        """``run.step(n)`` as a task: the run pauses after ``n`` steps; the cell does not wait."""
        self.cancel_stepping(run.name)
        task = asyncio.get_running_loop().create_task(run.step(n), name=f"forge_nb.{run.name}.magic_steps")
        task.add_done_callback(_log_failure)
        self.stepping[run.name] = task

    def cancel_stepping(self, name: str) -> None:
        """A newer ``step(n)`` replaces the run's step budget; the older waiter would never be woken."""
        task = self.stepping.pop(name, None)
        if task is not None and not task.done():
            task.cancel()


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        # the run records the failure itself (run.error, an "error" event, %forge_status)
        logger.warning("%s ended: %s", task.get_name(), task.exception())
