"""What comes up and goes down: %forge_spawn, %forge_attach, %%forge_config, %forge_meshes, %forge_shutdown."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, cell_magic, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring
from IPython.display import display

from forge_nb.magics import _display, _parse
from forge_nb.magics._runs import Runs

if TYPE_CHECKING:
    from forge_nb.run import Run

#: ``%forge_shutdown`` waits this long for every recorded process to exit.
EXIT_WAIT_S = 15.0


@magics_class
class SpawnMagics(Magics):
    def __init__(self, shell: Any, runs: Runs):
        super().__init__(shell)
        self.runs = runs

    @magic_arguments()
    @argument("recipe", nargs="?", help="quickstart, package.module:function, a .yaml path, or a variable "
                                        "holding a RunConfig; leave it out for a bare mesh (--procs N)")
    @argument("--name", help="the run's name (default: the config's); a bare mesh's name")
    @argument("--replicas", type=int, help="generator replicas (generator.num_replicas)")
    @argument("--procs", type=int, help="procs per generator replica (generator.procs); a bare mesh's procs")
    @argument("--gpus", action="store_true", help="give the generator and trainer (or the bare mesh) GPUs")
    @argument("--hosts", help="where a bare mesh runs: 1 (anywhere), a host mesh of the job in use "
                              "(%%forge_cluster), or kernel")
    @argument("--lora", type=int, metavar="RANK", help="train LoRA adapters of this rank (trainer.lora={rank: RANK})")
    @argument("--on", metavar="RUN", help="put the run on a live LoRA run's base: its adapter goes to that run's "
                                          "generators and trainer process instead of services of its own")
    @argument("--set", dest="sets", nargs="+", action="append", default=[], metavar="KEY=VALUE",
              help="config overrides with dotted keys, e.g. --set trainer.optimizer.lr=1e-5 loop.rollout_loops=2")
    @argument("--actor", dest="actors", nargs="+", action="append", default=[], metavar="SERVICE=CLASS",
              help="replace a service's actor class (policy, trainer, ref_model) by a ForgeActor with the same "
                   "endpoints: a variable or 'package.module:Class', e.g. --actor policy=MyGenerator")
    @argument("-o", "--output", metavar="VAR", help="variable for the Run (default: run) or the mesh; never one "
                                                    "that holds another live run")
    @line_magic
    def forge_spawn(self, line: str) -> Coroutine[Any, Any, None]:
        """Spawn a run's services from a recipe/YAML/RunConfig, or a bare process mesh with --procs N.

        The run is bound to ``run`` (or ``-o VAR``; a variable holding another live run is refused
        before anything spawns) and its services to ``policy``, ``trainer`` and ``ref_model`` where
        those names are free or hold a shut-down run's services; otherwise they stay ``VAR.policy``
        etc. The cell waits until every service is up (a progress bar shows which), or until the trainer is, where
        the trainer samples the rollouts while the generators finish starting (``forge_nb.spawn``).

        ``--lora 8 --on NAME``: a LoRA run on the base of the live LoRA run NAME (``forge_nb.spawn(cfg, base=)``).
        """
        args = parse_argstring(self.forge_spawn, line)
        sets = [item for group in args.sets for item in group]
        if args.lora is not None:  # before the --set ones, which win
            sets = [f"trainer.lora={{rank: {args.lora}}}", *sets]
        actor_specs = [item for group in args.actors for item in group]
        var = _parse.identifier(args.output) if args.output else None
        if args.recipe is None:
            if args.procs is None:
                raise UsageError("%forge_spawn needs a recipe (e.g. %forge_spawn quickstart) or, for a bare "
                                 "process mesh, --procs N -o NAME")
            if args.replicas is not None or sets or actor_specs or args.on:
                raise UsageError("--replicas, --set, --lora, --on and --actor configure a run; give a recipe first "
                                 "(%forge_spawn quickstart --replicas 2)")
            name = args.name or var or "mesh"
            if var is None and not name.isidentifier():
                raise UsageError(f"the mesh name {name!r} is not a variable name; add -o VAR to bind the mesh")
            self.runs.check_variable(var or name)
            return self._spawn_mesh(name, args.procs, args.gpus, args.hosts, var or name)
        if args.hosts is not None:
            raise UsageError("--hosts applies to a bare mesh (%forge_spawn --procs N --hosts H -o NAME); a run's "
                             "services are placed by their config (--set generator.hosts=generators)")
        if args.on and (args.replicas is not None or args.procs is not None or args.gpus):
            raise UsageError(f"--on {args.on}: the run uses that run's generators and trainer process; --replicas, "
                             "--procs and --gpus are theirs")
        if args.gpus:
            _require_gpus()
        cfg = _parse.resolve_config(args.recipe, self.shell.user_ns)
        if args.name:
            cfg = dataclasses.replace(cfg, name=args.name)
        cfg = _parse.apply(cfg, _parse.spawn_overrides(args.replicas, args.procs, args.gpus, sets))
        actors = _parse.actor_classes(actor_specs, self.shell.user_ns)
        self.runs.check_free(cfg.name)
        self.runs.check_variable(var or "run")
        return self._spawn_run(cfg, var or "run", actors, args.on)

    async def _spawn_run(self, cfg: Any, var: str, actors: dict[str, type], base: str | None = None) -> None:
        run = await _spawning().spawn(cfg, progress=True, actors=actors or None, base=base)
        self._bind(run, var)

    async def _spawn_mesh(self, name: str, procs: int, gpus: bool, hosts: str | None, var: str) -> None:
        from forge_nb.system.hosts.gpus import ResourceError
        from forge_nb.system.runtime import spawning

        try:
            mesh = await spawning.spawn_mesh(name, procs, gpus, owner="user",
                                             hosts=int(hosts) if hosts is not None and hosts.isdigit() else hosts)
        except (ValueError, ResourceError) as e:
            raise UsageError(str(e)) from None
        self.shell.user_ns[var] = mesh
        where = "" if mesh.host == "kernel" else f" on host {mesh.host}"
        print(f"mesh {mesh.name!r}: {mesh.procs} proc(s){where}, pids {mesh.pids}; bound to `{var}`. "
              f"{var}.spawn('name', ActorClass) puts an actor on it; %forge_meshes lists meshes")

    @magic_arguments()
    @argument("path", help="a run directory (runs/<name>-<time>)")
    @argument("-o", "--output", metavar="VAR", help="variable for the Run (default: run); never one that holds "
                                                    "another live run")
    @line_magic
    def forge_attach(self, line: str) -> Coroutine[Any, Any, None]:
        """Bring back a run from its directory (in a new kernel): services respawn, the last checkpoint loads.

        Binds the run and its services as %forge_spawn does (same rules for names already taken)."""
        args = parse_argstring(self.forge_attach, line)
        var = _parse.identifier(args.output) if args.output else "run"
        import json
        from pathlib import Path

        config = Path(args.path) / "config.json"
        if not config.is_file():
            raise UsageError(f"{args.path!r} is not a run directory (no config.json); runs are under runs/ "
                             "by default, or where run_dir pointed")
        try:
            name = json.loads(config.read_text()).get("name")
        except (OSError, ValueError, AttributeError):
            name = None  # resume reports a broken config itself
        if isinstance(name, str):
            self.runs.check_free(name)
        self.runs.check_variable(var)
        return self._attach(args.path, var)

    async def _attach(self, path: str, var: str) -> None:
        run = await _spawning().resume(path, progress=True)
        self._bind(run, var)

    def _bind(self, run: Run, var: str) -> None:
        """``var`` -> the run (checked free before spawning); each service -> its name where that name is
        free or held a shut-down run's service. Says truthfully what was bound and what was not."""
        free = {n: s for n, s in run.services.items() if self.runs.claimable(n, run)}
        taken = [n for n in run.services if n not in free]
        notes = [f"`{n}` still holds {_held(self.runs, self.shell.user_ns[n])}" for n in taken]
        self.runs.add(run)
        self.shell.user_ns[var] = run
        self.shell.user_ns.update(free)
        bound = ", ".join(f"`{n}`" for n in [var, *free])
        replicas = ", ".join(f"{n} x{len(getattr(s, 'replicas', [s]))}" for n, s in run.services.items())
        others = [n for n in run.base.runs if n != run.name] if run.base is not None else []
        if others:  # a LoRA run on one base: its services are shares of the base's
            replicas += f"; shared with {', '.join(map(repr, others))}"
        kept = ""
        if taken:
            kept = (f" Not rebound: {'; '.join(notes)}; this run's stay reachable as "
                    f"{', '.join(f'`{var}.{n}`' for n in taken)}.")
        live = len(self.runs.live())
        if live > 1:
            after = (f" {live} runs are live: the run magics need --name {run.name} for this one. Next: "
                     f"%forge_run --name {run.name} or %forge_step N --name {run.name}; %forge_status shows every run")
        else:
            after = " Next: %forge_run (background loops) or %forge_step N; %forge_status shows it"
        print(f"run {run.name!r} is up ({replicas}); bound to {bound}.{kept}{after}")

    @magic_arguments()
    @argument("-o", "--output", metavar="VAR", help="variable for the RunConfig (default: the cell's result)")
    @cell_magic
    def forge_config(self, line: str, cell: str) -> Any:
        """The cell's YAML (forge_nb keys or torchforge's apps/grpo shape) as a validated RunConfig."""
        args = parse_argstring(self.forge_config, line)
        cfg = _parse.config_cell(cell)
        if args.output:
            self.shell.user_ns[_parse.identifier(args.output)] = cfg
            print(f"RunConfig {cfg.name!r} -> `{args.output}`; %forge_spawn {args.output} spawns it")
            return None
        return cfg

    @line_magic
    def forge_meshes(self, line: str) -> None:
        """Every process mesh this kernel holds: name, procs, pids, state, GPUs, owner, failures; then the
        processes kept warm for the next run, if any (``forge_nb.system.runtime.warm``)."""
        if line.strip():
            raise UsageError("%forge_meshes takes no arguments")
        from forge_nb.system.runtime import registry, warm

        infos, kept = [m.info() for m in registry.meshes()], warm.summary()
        if infos:
            display(_display.meshes_table(infos))
        elif not kept:
            print("no meshes: %forge_spawn quickstart starts a run, %forge_spawn --procs N -o NAME a bare mesh")
        if kept:
            print(kept)

    @magic_arguments()
    @argument("--name", help="shut down only this run (a run's name or a variable holding a Run)")
    @argument("--all", dest="everything", action="store_true", help="every run and every mesh of the kernel")
    @line_magic
    def forge_shutdown(self, line: str) -> Coroutine[Any, Any, None]:
        """Stop loops, services and meshes, then check that every recorded process has exited (15 s).

        Without ``--name`` it stops the kernel's run and every mesh; with several live runs it refuses
        (it never stops a run nobody named): ``--name NAME`` stops one, ``--all`` stops everything. A run
        stopped by name leaves its processes warm, their imports done, for the kernel's next spawn (~1-2 s to its
        first step instead of 6-9; ``FORGE_NB_KEEP_WARM_S``, default 600 s, 0 for none); without ``--name`` they
        stop too."""
        args = parse_argstring(self.forge_shutdown, line)
        if args.name and args.everything:
            raise UsageError("give --name NAME (one run) or --all (every run and mesh), not both")
        if args.name:
            return self._shutdown(self.runs.get(args.name))
        live = self.runs.live()
        if len(live) > 1 and not args.everything:
            raise UsageError(self.runs.choose(live, also=", or --all to stop every run and mesh"))
        return self._shutdown(None)

    async def _shutdown(self, only: Any) -> None:
        """One run (``only``; its processes kept warm for the kernel's next run where they can be), or everything:
        ``forge_nb.shutdown_all()``, kept processes included."""
        from forge_nb.run import shutdown_all
        from forge_nb.system.runtime import warm

        known = [only] if only is not None else self.runs.live()
        for run in known:
            self.runs.cancel_stepping(run.name)
        if only is None:
            try:
                report = await shutdown_all(EXIT_WAIT_S)
            finally:
                for run in known:
                    self.runs.forget(run)
            if report.released_hosts:
                print(f"released the job's {report.released_hosts} host(s)")
            what, pids, left = f"{len(report.runs)} run(s) and {report.meshes} mesh(es)", report.pids, report.alive
        else:
            gone = await only.shutdown(wait_s=EXIT_WAIT_S)
            self.runs.forget(only)
            if gone.shared_with:  # its processes serve other runs on the same base: they stay
                print(f"shut down run {only.name!r}: its adapter left the generators and trainer process it shared "
                      f"with {', '.join(map(repr, gone.shared_with))}, which train on")
                return
            if gone.kept:  # forge_nb.system.runtime.warm: the next spawn of the kernel takes them
                print(f"shut down run {only.name!r}: its process(es) {gone.kept} are kept warm for the next run "
                      f"for {warm.keep_s() / 60:.0f} min (%forge_shutdown --all stops them now)")
            pids = gone.exited + gone.alive
            if not pids:
                return
            what, left = f"run {only.name!r}", gone.alive
        if left:
            raise RuntimeError(f"shut down {what}, but process(es) {left} are still alive after {EXIT_WAIT_S:.0f} s; "
                               f"kill them (kill -9 {' '.join(map(str, left))}) or restart the kernel")
        print(f"shut down {what}: all {len(pids)} process(es) exited ({', '.join(map(str, pids)) or 'none'})")
        others = _children(os.getpid())
        if others:
            print(f"{len(others)} other process(es) started by this kernel still run, not spawned through "
                  f"forge_nb.system.runtime: {', '.join(f'{p} ({c})' for p, c in others.items())}")


def _held(runs: Runs, value: Any) -> str:
    found = runs.owner(value)
    return found[0] if found is not None else f"your {type(value).__name__}"


def _require_gpus() -> None:
    from forge_nb.system.runtime import spawning

    if spawning.visible_gpus() == 0:
        raise UsageError("--gpus: this machine has no CUDA device; leave --gpus out to run on CPU")


def _children(root: int) -> dict[int, str]:
    """Live descendants of ``root`` -> the start of their command line."""
    from forge_nb.system.processes.procs import descendants

    return {pid: command[:80] for pid, command in descendants(root).items()}


def _spawning() -> Any:
    """``forge_nb.run`` (spawn, resume), imported after the runtime has set monarch's environment (see
    forge_nb.system.runtime.lifecycle)."""
    from forge_nb.system.runtime import lifecycle

    lifecycle.ensure_started()
    from forge_nb import run

    return run
