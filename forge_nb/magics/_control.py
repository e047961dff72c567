"""``%forge_run`` and the other magics that drive and show the current run (each a line over the Run API)."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from forge_nb.controller.state import RunState
from forge_nb.magics import _display, _parse
from forge_nb.magics._runs import Runs

if TYPE_CHECKING:
    from forge_nb.run import Run

NAME_HELP = ("the run to act on (a run's name or a variable holding a Run); needed when several runs are live, "
             "else the one live run")


@magics_class
class ControlMagics(Magics):
    def __init__(self, shell: Any, runs: Runs, help_text: str = ""):
        super().__init__(shell)
        self.runs = runs
        self.help_text = help_text  # the package's table of magics (forge_nb.magics.help_text)
        self._sidecars: dict[str, Any] = {}  # run name -> its %forge_dashboard --side panel

    def _startable(self, name: str | None) -> Any:
        run = self.runs.get(name)
        if run.state == RunState.SHUT_DOWN:
            raise UsageError(f"run {run.name!r} is shut down; spawn a new one (%forge_spawn)")
        if run.state == RunState.FAILED:
            raise UsageError(f"run {run.name!r} failed: {run.error}. Fix the cause, then %forge_shutdown and "
                             f"%forge_attach {run.dir.path} continue from the last checkpoint")
        return run

    @magic_arguments()
    @argument("--steps", type=int, help="run exactly N training steps, then pause (the cell does not wait)")
    @argument("--name", help=NAME_HELP)
    @line_magic
    def forge_run(self, line: str) -> Coroutine[Any, Any, None]:
        """Start (or resume) the rollout and training loops in the background; the cell returns at once."""
        args = parse_argstring(self.forge_run, line)
        if args.steps is not None and args.steps < 1:
            raise UsageError(f"--steps {args.steps}: give a number of steps >= 1")
        return self._start(self._startable(args.name), args.steps)

    async def _start(self, run: Run, steps: int | None, *, resume: bool = False) -> None:
        if steps is None:  # %forge_run: no budget (one pending returns with its steps); %forge_resume keeps it
            if resume:
                run.resume()
            else:
                run.start()
            print(f"run {run.name!r} is running in the background ({run.config.loop.rollout_loops} rollout "
                  "loop(s) + training); %forge_status shows it, %forge_pause pauses")
        else:
            self.runs.step_in_background(run, steps)
            print(f"run {run.name!r}: {steps} step(s) in the background from step {run.current_step}, then it "
                  "pauses; %forge_status shows progress")

    @magic_arguments()
    @argument("--name", help=NAME_HELP)
    @line_magic
    def forge_resume(self, line: str) -> Coroutine[Any, Any, None]:
        """Resume the loops after %forge_pause or %forge_stop (a %forge_run --steps budget goes on)."""
        args = parse_argstring(self.forge_resume, line)
        return self._start(self._startable(args.name), None, resume=True)

    @magic_arguments()
    @argument("--name", help=NAME_HELP)
    @line_magic
    def forge_pause(self, line: str) -> None:
        """Pause at the next boundary: rollouts after their in-flight generation, training after its step."""
        run = self.runs.get(parse_argstring(self.forge_pause, line).name)
        run.pause()
        print(f"run {run.name!r} pauses at the next boundary (step {run.current_step} now); %forge_resume "
              "continues")

    @magic_arguments()
    @argument("n", type=int, nargs="?", default=1, help="training steps to run (default 1)")
    @argument("--name", help=NAME_HELP)
    @line_magic
    def forge_step(self, line: str) -> Coroutine[Any, Any, None]:
        """Run exactly N training steps and wait for them (the loops keep running; an interrupt stops the wait)."""
        args = parse_argstring(self.forge_step, line)
        if args.n < 1:
            raise UsageError(f"%forge_step {args.n}: give a number of steps >= 1")
        return self._step(self._startable(args.name), args.n)

    async def _step(self, run: Run, n: int) -> None:
        seen = len(run.metrics.events)  # a budget still pending (%forge_run --steps) returns: run.step's rule
        try:
            rows = await run.step(n)
        except asyncio.CancelledError:
            print(f"interrupted: run {run.name!r} keeps going and pauses after its {n} step(s); "
                  "%forge_pause pauses it now")
            raise
        events = run.metrics.events[seen:] if len(run.metrics.events) >= seen else run.metrics.events
        # a few lines whatever n is (150 rows would be ~3,700 px of cell); every row is in run.metrics
        display(_display.step_summary(rows, events, title=f"run {run.name!r}: {len(rows)} step(s), now paused"))

    @magic_arguments()
    @argument("--name", help=NAME_HELP)
    @line_magic
    def forge_stop(self, line: str) -> Coroutine[Any, Any, None]:
        """Stop the loops at a step boundary and wait for it; services stay up (%forge_run continues)."""
        run = self.runs.get(parse_argstring(self.forge_stop, line).name)
        return self._stop(run)

    async def _stop(self, run: Run) -> None:
        self.runs.cancel_stepping(run.name)
        await run.stop()
        print(f"run {run.name!r} stopped at step {run.current_step}; services are up: %forge_run continues, "
              "%forge_shutdown releases them")

    @magic_arguments()
    @argument("changes", nargs="+", metavar="KEY=VALUE", help="e.g. lr=1e-4 temperature=0.7")
    @argument("--name", help=NAME_HELP)
    @line_magic
    def forge_set(self, line: str) -> Coroutine[Any, Any, None]:
        """Change hyperparameters at the next step boundary (recorded as a "set" event); values are YAML."""
        args = parse_argstring(self.forge_set, line)
        changes = _parse.assignments(args.changes, example="lr=1e-4 temperature=0.7")
        return self._set(self.runs.get(args.name), changes)

    async def _set(self, run: Run, changes: dict[str, Any]) -> None:
        try:
            pending = run.set(**changes)
        except (ValueError, TypeError) as e:
            raise UsageError(str(e).replace("run.set()", "%forge_set")) from None
        when = "at the next step boundary" if run.state == RunState.RUNNING else "now (no step is running)"
        print(f"run {run.name!r}: {', '.join(f'{k}={v!r}' for k, v in pending.items())} applies {when}")

    @magic_arguments()
    @argument("--name", help=NAME_HELP)
    @line_magic
    def forge_status(self, line: str) -> None:
        """Services and replicas (state, pids, in flight, served, failures, restarts), loops, step, last values.

        With several live runs and no ``--name``: one line per run (``--name NAME`` shows one in full)."""
        from forge_nb.system.runtime import warm

        name = parse_argstring(self.forge_status, line).name
        live, kept = self.runs.live(), warm.summary()
        if name is None and len(live) > 1:
            rows = [{**run.status(), "variables": self.runs.variables(run)} for run in live]
            display(_display.runs_table(rows))
        elif name is not None or live or not kept:
            display(_display.status_report(self.runs.get(name).status()))
        if kept:
            print(kept)

    @magic_arguments()
    @argument("-n", type=int, default=20, help="how many (default 20)")
    @argument("--version", type=int, help="only episodes generated by this policy version")
    @argument("--min-reward", type=float, help="only episodes with at least this reward")
    @argument("--max-reward", type=float, help="only episodes with at most this reward")
    @argument("--turns", action="store_true", help="each episode turn by turn: action, observation or tool "
              "result, reward (multi-turn episodes)")
    @argument("--name", help=NAME_HELP)
    @line_magic
    def forge_episodes(self, line: str) -> None:
        """Recent episodes of the run (prompt, response, reward, advantage, version), newest last."""
        args = parse_argstring(self.forge_episodes, line)
        if args.n < 1:
            raise UsageError(f"-n {args.n}: give a number of episodes >= 1")
        run = self.runs.get(args.name)
        rows = run.episodes(args.n, version=args.version, min_reward=args.min_reward, max_reward=args.max_reward)
        if not rows:
            print(f"no episodes of run {run.name!r} match" + (" yet (%forge_run starts the rollouts)"
                                                              if run.current_step == 0 else ""))
            return
        display(_display.turns_report(rows) if args.turns else _display.episodes_table(rows))

    @magic_arguments()
    @argument("service", nargs="?", help="policy, trainer or ref_model, optionally with a replica: policy[1]; "
              "kernel: forge_nb's own records in the kernel (a failed loop's traceback)")
    @argument("-n", type=int, default=40, help="how many lines (default 40)")
    @argument("--level", choices=("warning", "error"), help="only warnings and errors, or errors (with tracebacks)")
    @argument("--name", help=NAME_HELP)
    @line_magic
    def forge_logs(self, line: str) -> None:
        """The last lines the run's processes wrote (vLLM, monarch, torch), which go to files, not to cells."""
        args = parse_argstring(self.forge_logs, line)
        if args.n < 1:
            raise UsageError(f"-n {args.n}: give a number of lines >= 1")
        run = self.runs.get(args.name)
        service, index = args.service, None
        if service is not None and (m := re.fullmatch(r"(\w+)\[(\d+)\]", service)):
            service, index = m.group(1), int(m.group(2))
        try:
            text = run.logs(service, index, n=args.n, level=args.level)
        except ValueError as e:
            raise UsageError(str(e)) from None
        print(text or f"nothing logged yet{' at level ' + args.level if args.level else ''} "
                      f"(the files are in {run.dir.logs})")

    @magic_arguments()
    @argument("--side", action="store_true",
              help="open it in a JupyterLab panel beside the notebook (the sidecar package) that stays in view "
                   "while cells run; in a front-end with no side panel it shows in the cell, saying why")
    @argument("--name", help=NAME_HELP)
    @line_magic
    def forge_dashboard(self, line: str) -> None:
        """The live dashboard of the run (controls, replica health, curves, episodes), and its snapshot.

        ``--side`` puts it in a JupyterLab tab beside the notebook through the maintained ``sidecar``
        extension (an ipywidgets Output that the lab docks), rather than in the cell where later output
        would scroll it away. It splits the main area (sidecar's ``anchor="split-right"``): JupyterLab's
        right sidebar, sidecar's default, opens ~250 px wide, too narrow for the controls and curves.
        Where the panel's view does not render (Notebook 7, VS Code, nbclassic), the page shows the
        dashboard in the cell with a line saying why (``forge_nb.widgets.placement``). Running it again
        for a run replaces that run's tab. Under it, the dashboard's static snapshot, kept current at the
        end of every cell for a saved or exported notebook (hidden where the live dashboard renders)."""
        args = parse_argstring(self.forge_dashboard, line)
        sidecar = _sidecar_class() if args.side else None
        run = self.runs.get(args.name)
        try:
            from forge_nb.widgets import dashboard
            from forge_nb.widgets.placement import place_beside
        except ImportError as e:
            raise UsageError(f"the dashboard is not installed ({e}); it needs forge_nb.widgets with ipywidgets, "
                             "anywidget and plotly (pip install 'forge-nb[notebook]')") from None
        if sidecar is not None and getattr(self.shell, "kernel", None) is None:  # a terminal IPython
            print(f"no side panel here: this IPython is not a Jupyter kernel, with no page to draw the dashboard "
                  f"of run {run.name!r} in; %forge_status shows the run")
            return
        view = dashboard(run)
        if sidecar is None:
            display(view)
            return
        old = self._sidecars.pop(run.name, None)
        if old is not None:
            old.close()  # its tab closes in the lab
        tab = f"dashboard: {run.name}"
        panel = sidecar(title=tab, anchor="split-right")
        self._sidecars[run.name] = panel
        display(place_beside(panel, view.widget, run.name, tab))
        view.snapshot.show()

    @line_magic
    def forge_help(self, line: str) -> None:
        """The table of %forge_* magics; ``%forge_spawn?`` shows one magic's options."""
        print(self.help_text)


def _sidecar_class() -> Any:
    """``sidecar.Sidecar``, or a UsageError that says how to install it."""
    try:
        from sidecar import Sidecar
    except ImportError:
        raise UsageError("%forge_dashboard --side needs the sidecar package (a JupyterLab side panel for widgets): "
                         "pip install 'sidecar>=0.8' (or 'forge-nb[notebook]'), restart the kernel and reload "
                         "the JupyterLab page; %forge_dashboard without --side shows it in the cell") from None
    return Sidecar
