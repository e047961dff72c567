"""The runs the magics know: by name, which one a magic without ``--name`` means, and who owns a variable.

Several runs can live in one kernel. The magics count as *live* every run that is not shut down:
those spawned or attached by the magics, and any Run the notebook holds in a variable (one made with
``run_a = await forge_nb.spawn(...)``); a Run held only by ``_`` names (IPython's output history)
does not count. A magic without ``--name`` acts on the only live run; with several it raises a
``UsageError`` that lists them, so a command never lands on a run the user did not mean. Binding
names is guarded the same way: a variable that holds a live run, or one of its services, is never
overwritten by another run (``check_variable``, ``claimable``).
"""

from __future__ import annotations

import asyncio
import logging
import weakref
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError

if TYPE_CHECKING:
    from forge_nb.run import Run

logger = logging.getLogger(__name__)

NO_RUN = ("no run yet: %forge_spawn quickstart spawns one (or a YAML path, 'module:function', or a "
          "variable holding a RunConfig); %forge_attach PATH brings back a run directory")

_registries: dict[int, Runs] = {}  # id(shell) -> its runs


class Runs:
    """Runs spawned or attached through the magics (the last one is current) plus the namespace's Runs."""

    def __init__(self, user_ns: dict[str, Any]):
        self.user_ns = user_ns
        self.by_name: dict[str, Any] = {}
        self.current: str | None = None
        # every run the magics bound and the notebook still holds, shut down ones too: their services'
        # names may be reused (weak: a run nobody holds is not kept alive for this)
        self.seen: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()
        # run name -> the task awaiting ``run.step(n)`` for ``%forge_run --steps n`` (a strong reference)
        self.stepping: dict[str, asyncio.Task[Any]] = {}

    @classmethod
    def of(cls, shell: Any) -> Runs:
        """The shell's registry; it outlives ``%reload_ext forge_nb``."""
        if id(shell) not in _registries or _registries[id(shell)].user_ns is not shell.user_ns:
            _registries[id(shell)] = cls(shell.user_ns)
        return _registries[id(shell)]

    def add(self, run: Run) -> None:
        self.by_name[run.name] = run
        self.seen[id(run)] = run
        self.current = run.name

    # -- which run ----------------------------------------------------------------------------------

    def live(self) -> list[Any]:
        """Runs not shut down: the magics' own, then those only the namespace holds (oldest first)."""
        found = {id(r): r for r in self.by_name.values()}
        for run in self._namespace_runs():
            found.setdefault(id(run), run)
        return [r for r in found.values() if r.state != "shut down"]

    def get(self, name: str | None = None) -> Any:
        """The run called ``name`` (a run's name or a variable holding a Run), else the only live one."""
        if name is not None:
            return self._named(name)
        live = self.live()
        if len(live) == 1:
            return live[0]
        if live:
            raise UsageError(self.choose(live))
        if self.current is not None:  # shut down: the magics say so when they act on it
            return self.by_name[self.current]
        raise UsageError(NO_RUN)

    def choose(self, live: list[Any], also: str = "") -> str:
        """The message of a magic given no ``--name`` while several runs are live."""
        first = live[0].name
        return (f"{len(live)} runs are live: {', '.join(self.label(r) for r in live)}; say which with --name NAME "
                f"(a run's name or a variable holding it), e.g. --name {first}{also}")

    def label(self, run: Run) -> str:
        """``'lr_hi' (run_b)``: the run's name and the variables that hold it."""
        names = self.variables(run)
        return f"{run.name!r}" + (f" ({', '.join(names)})" if names else "")

    def variables(self, run: Run) -> list[str]:
        return [k for k, v in list(self.user_ns.items()) if v is run and not k.startswith("_")]

    def _named(self, name: str) -> Any:
        from forge_nb.run import Run

        candidates = {id(r): r for r in [*self.by_name.values(), *self._namespace_runs()] if r.name == name}
        live = [r for r in candidates.values() if r.state != "shut down"]
        if len(live) > 1:
            held = ", ".join(self.label(r) for r in live)
            raise UsageError(f"{len(live)} live runs are named {name!r}: {held}; give --name the variable instead")
        if live:
            return live[0]
        if name in self.by_name:
            return self.by_name[name]
        if isinstance(self.user_ns.get(name), Run):
            return self.user_ns[name]
        if candidates:
            return next(iter(candidates.values()))
        known = ", ".join(self.label(r) for r in self.live()) or "none"
        raise UsageError(f"no run named {name!r} (live runs: {known}); "
                         "--name takes a run's name or a variable holding a Run")

    def _namespace_runs(self) -> list[Any]:
        from forge_nb.run import Run

        values = list(self.user_ns.items())
        runs = {id(v): v for k, v in values if isinstance(v, Run) and not k.startswith("_")}
        return list(runs.values())

    # -- names a new run may take -------------------------------------------------------------------

    def check_free(self, name: str) -> None:
        """A new run's name must not be a live run's: names select runs and their weights' namespace."""
        clash = [r for r in self.live() if r.name == name]
        if clash:
            raise UsageError(f"a run named {name!r} is already up ({clash[0].state}): {self.label(clash[0])}; "
                             f"%forge_shutdown --name {name} first, or give the new one another name with --name")

    def owner(self, value: Any) -> tuple[str, Any] | None:
        """``("run 'a'", run)`` or ``("the policy of run 'a'", run)`` if ``value`` is a live run or one
        of its services; None if it belongs to no live run."""
        for run in self.live():
            if value is run:
                return f"run {run.name!r}", run
            for service, handle in run.services.items():
                if value is handle:
                    return f"the {service} of run {run.name!r}", run
        return None

    def check_variable(self, var: str, flag: str = "-o") -> None:
        """Refuse (before anything is spawned) to bind ``var`` if it holds a live run or its service."""
        if var not in self.user_ns:
            return
        held = self.owner(self.user_ns[var])
        if held is not None:
            what, run = held
            raise UsageError(f"`{var}` holds {what}, which is still up; pick another variable with {flag} VAR "
                             f"(e.g. {flag} {var}_2), or %forge_shutdown --name {run.name} first")

    def claimable(self, var: str, run: Run) -> bool:
        """May ``var`` be bound to one of ``run``'s services? Yes if it is free, or holds a service of
        ``run`` itself or of a shut-down run (or any service whose replicas have all stopped); never
        if it holds anything else (another live run's service, or a value of the user's own)."""
        from forge_nb.service import Service

        if var not in self.user_ns:
            return True
        value = self.user_ns[var]
        if isinstance(value, Service) and all(r.state == "stopped" for r in value.replicas):
            return True
        for known in [run, *list(self.seen.values()), *self._namespace_runs()]:
            if (known is run or known.state == "shut down") and any(value is s for s in known.services.values()):
                return True
        return False

    # -- runs going away ----------------------------------------------------------------------------

    def forget(self, run: Run) -> None:
        if self.by_name.get(run.name) is run:
            del self.by_name[run.name]
        if self.current == run.name:
            self.current = next(reversed(self.by_name), None)
        self.cancel_stepping(run.name)

    def step_in_background(self, run: Run, n: int) -> None:
        """``run.step(n)`` as a task: the run pauses after ``n`` steps; the cell does not wait. A budget still
        pending is replaced as ``run.step`` replaces one (its task ends with the steps it got)."""
        task = asyncio.get_running_loop().create_task(run.step(n), name=f"forge_nb.{run.name}.magic_steps")
        task.add_done_callback(_log_failure)
        self.stepping[run.name] = task

    def cancel_stepping(self, name: str) -> None:
        """Stop waiting on the run's background budget (the run is stopped, started without one, shut down)."""
        task = self.stepping.pop(name, None)
        if task is not None and not task.done():
            task.cancel()


def _log_failure(task: asyncio.Task[Any]) -> None:
    if not task.cancelled() and task.exception() is not None:
        # the run records the failure itself (run.error, an "error" event, %forge_status)
        logger.warning("%s ended: %s", task.get_name(), task.exception())
