"""%forge_cluster: where the run's processes go: the kernel's host or a monarch job's hosts
(forge_nb.system.hosts.cluster)."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from forge_nb.magics import _parse

#: Where ``%forge_cluster`` saves the job unless told (monarch's own default), so a new kernel re-attaches.
DEFAULT_SAVE = ".monarch/job_state.pkl"


@magics_class
class ClusterMagics(Magics):
    @magic_arguments()
    @argument("job", nargs="?", help="slurm (nodes from SLURM, with --nodes), or a variable holding a monarch job "
              "(SlurmJob, KubernetesJob, ProcessJob, ...)")
    @argument("--nodes", nargs="+", metavar="N | MESH=N",
              help="slurm: how many nodes (one host mesh, 'hosts'), or nodes per host mesh: trainer=1 generators=2")
    @argument("--partition", help="slurm: the partition to ask (default: the cluster's)")
    @argument("--gpus-per-node", type=int, help="slurm: GPUs to ask on each node")
    @argument("--time", metavar="T", help="slurm: the job's time limit, e.g. 2:00:00 (default: the partition's)")
    @argument("--processes", nargs="+", metavar="MESH=HOSTS",
              help="a ProcessJob: hosts simulated on this machine, e.g. --processes trainer=1 generators=2")
    @argument("--attach", metavar="PATH", help="the job an earlier kernel saved at PATH (re-attach after a restart)")
    @argument("--save", metavar="PATH", default=DEFAULT_SAVE,
              help=f"where the job is saved for a later kernel (default {DEFAULT_SAVE})")
    @argument("--release", action="store_true", help="release the job's hosts (after %%forge_shutdown)")
    @line_magic
    def forge_cluster(self, line: str) -> Coroutine[Any, Any, None]:
        """Place the processes spawned from now on on a monarch job's hosts, or show where they go.

        Without arguments: the job's hosts (alive or lost, GPUs, meshes), or that everything runs on the
        kernel's host. A run spawned afterwards puts its services there (``hosts:`` of a service in its config
        names a host mesh of the job); ``%forge_shutdown`` releases the hosts."""
        args = parse_argstring(self.forge_cluster, line)
        given = [name for name, value in (("JOB", args.job), ("--processes", args.processes),
                                          ("--attach", args.attach), ("--release", args.release)) if value]
        if len(given) > 1:
            raise UsageError(f"give one of JOB, --processes, --attach or --release, not {' and '.join(given)}")
        slurm_only = [name for name, value in (("--nodes", args.nodes), ("--partition", args.partition),
                                               ("--gpus-per-node", args.gpus_per_node), ("--time", args.time))
                      if value is not None]
        if slurm_only and args.job != "slurm":
            raise UsageError(f"{', '.join(slurm_only)}: for %forge_cluster slurm (e.g. %forge_cluster slurm --nodes 3)")
        if args.release:
            return self._release()
        if args.attach:
            return self._use(args.attach, None)
        if args.processes:
            from monarch.job import ProcessJob

            sizes = _parse.assignments(args.processes, example="trainer=1 generators=2")
            bad = {k: v for k, v in sizes.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1}
            if bad:
                raise UsageError(f"--processes {bad}: each host mesh needs a whole number of hosts >= 1")
            return self._use(ProcessJob(sizes), args.save)
        if args.job == "slurm" and (args.nodes or "slurm" not in self.shell.user_ns):
            return self._use(_slurm_job(args), args.save)
        if args.job:
            job = self.shell.user_ns.get(args.job)
            if job is None or not hasattr(job, "state"):
                raise UsageError(f"{args.job!r} is not a variable holding a monarch job (monarch.job.SlurmJob(...), "
                                 "ProcessJob(...), ...)")
            return self._use(job, args.save)
        return self._show()

    async def _use(self, job: Any, save: str | None) -> None:
        from forge_nb.system.hosts import cluster

        if cluster.current() is not None:
            raise UsageError(f"a job is in use already ({cluster.current()}); %forge_cluster --release first")
        from forge_nb.system.hosts.slurm import SlurmRefused

        try:
            used = await cluster.use_job(job, cached_path=save)
        except (FileNotFoundError, SlurmRefused) as e:
            raise UsageError(str(e)) from None
        reaped = sum(len(h.reaped) for h in used.hosts)
        described = used.described
        if "job_id" in described:
            print(f"{described['scheduler'].upper()} job {described['job_id']} ({described['state']}) on "
                  f"{', '.join(described['nodes'])}")
        print(f"{len(used.hosts)} host(s) of the job in use: {', '.join(h.name for h in used.hosts)}"
              + (f"; ended {reaped} process(es) an earlier kernel left there" if reaped else "")
              + (f"; saved at {used.cached_path} (%forge_cluster --attach {used.cached_path} after a restart)"
                 if used.cached_path else ""))

    async def _show(self) -> None:
        from forge_nb.system.hosts import cluster
        from forge_nb.system.runtime import registry

        job = cluster.current()
        if job is None:
            print("no job in use: every process runs on the kernel's host (%forge_cluster --processes "
                  "trainer=1 generators=2 simulates hosts; %forge_cluster JOB takes a monarch job)")
            return
        meshes = registry.meshes()
        if job.described:
            print(cluster.job_line(job.status()))
        for h in job.hosts:
            names = [m.name for m in meshes if m.host == h.name]
            state = "alive" if h.lost is None else f"LOST ({h.lost})"
            print(f"{h.name:<16} {state:<8} gpus {h.gpus}  {'local pids' if h.local else 'remote'}  "
                  f"meshes: {', '.join(names) or 'none'}")

    async def _release(self) -> None:
        from forge_nb.system.hosts import cluster
        from forge_nb.system.runtime import registry

        job = cluster.current()
        if job is None:
            raise UsageError("no job is in use")
        on_job = [m.name for m in registry.meshes() if m.host != cluster.KERNEL]
        if on_job:
            raise UsageError(f"meshes still run on the job's hosts ({', '.join(on_job)}); %forge_shutdown first")
        await cluster.release_job()
        print(f"released the job's {len(job.hosts)} host(s)")


def _slurm_job(args: Any) -> Any:
    """``%forge_cluster slurm --nodes ...``: a forge_nb.SlurmJob, or a UsageError that says what to give."""
    if not args.nodes:
        raise UsageError("%forge_cluster slurm needs --nodes: a count (--nodes 3) or nodes per host mesh "
                         "(--nodes trainer=1 generators=2)")
    if len(args.nodes) == 1 and "=" not in args.nodes[0]:
        try:
            meshes = {"hosts": int(args.nodes[0])}
        except ValueError:
            raise UsageError(f"--nodes {args.nodes[0]}: give a whole number of nodes, or MESH=N pairs") from None
    else:
        meshes = _parse.assignments(args.nodes, example="trainer=1 generators=2")
    if args.gpus_per_node is not None and args.gpus_per_node < 0:
        raise UsageError(f"--gpus-per-node {args.gpus_per_node}: give 0 or more")
    import shutil

    if shutil.which("sbatch") is None:
        raise UsageError("no sbatch on this machine's PATH: %forge_cluster slurm runs where SLURM's commands do "
                         "(a login node), or give a monarch job: %forge_cluster JOB")
    from forge_nb.system.hosts.slurm import SlurmJob

    try:
        return SlurmJob(meshes, partition=args.partition, gpus_per_node=args.gpus_per_node or None,
                        time_limit=args.time)
    except ValueError as e:
        raise UsageError(str(e)) from None
