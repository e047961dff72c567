"""SLURM allocations for the notebook: monarch's ``SlurmJob``, made to work with the SLURM a cluster runs.

``%forge_cluster slurm --nodes 3`` (or ``await forge_nb.use_job(forge_nb.system.hosts.slurm.SlurmJob({"hosts": 3}))``)
asks SLURM for nodes with ``sbatch``; each node runs one monarch worker, and forge_nb places the run's meshes on
them (``forge_nb.system.hosts.cluster``). :class:`SlurmJob` is monarch's job class (``monarch.job.SlurmJob``: the batch
script, the workers' bootstrap, ``scancel`` on release, the pickled state a later kernel re-attaches to) with
three differences, each a place where monarch 0.7 assumes more than clusters give:

* **Any SLURM's ``squeue --json``.** monarch reads the shape of SLURM 23.02 and later (``job_state`` a list,
  nodes under ``job_resources.nodes.allocation``) and relies on ``--job`` filtering. SLURM 22.05, still
  common (Debian 12's), gives ``job_state`` as a string, the nodes under ``job_resources.allocated_nodes``
  and ignores ``--job``: :func:`job_info` reads both and picks the job by its id.
* **Workers answer to their node's name.** The kernel dials each node by the name SLURM allocated
  (``tcp://<node>:<port>``), while monarch's worker listens on ``socket.gethostname()``. They agree where the
  node name is the host name; where they differ (several nodes on one machine, node names that are not host
  names) the worker is unreachable. The workers run through :mod:`forge_nb.system.hosts.slurm_worker`, which starts
  monarch's own bootstrap with the host name read as ``$SLURMD_NODENAME``.
* **A kernel whose host name is loopback.** monarch switches the process to ``TcpWithHostname``, which panics
  in the first monarch context where the host name resolves only to 127.x (a laptop, a container): there
  the kernel listens on ``TcpWithLocalhost`` instead (its nodes can then only be on the same machine).

Also: the job and its workers' step run with SLURM's ``--no-kill`` unless told otherwise, so a node that
fails ends its own worker, not the allocation nor the other nodes' workers, and its replicas respawn on the
nodes left (SLURM's default ends the whole step, and the run with it); a job SLURM holds for a reason
waiting cannot cure (more nodes than the partition has, ...) is cancelled with that reason instead of
waited on for ever; the job's logs (SLURM's ``slurm_<id>_*.out``,
monarch's messages) go to the kernel's log folder, not the notebook's folder and cell; and
:meth:`SlurmJob.describe` says the job's id, state and nodes for ``%forge_status``, ``%forge_cluster`` and
the dashboard, and whether SLURM ended it (``scancel``, its time limit): ``forge_nb.system.hosts.cluster``'s watch asks.

Considered: our own ``sbatch``/``srun`` launcher (monarch's job class is the cluster API the seeds use, and
its pickled state is what re-attaching needs); patching monarch (a fix here must work with the monarch a user
has); submitit and pyslurm (they launch Python functions, not monarch workers, and pyslurm must match the
cluster's SLURM build).
"""

from __future__ import annotations

import json
import logging
import shlex
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from monarch.job import SlurmJob as _MonarchSlurmJob

__all__ = ["SlurmJob", "SlurmRefused", "job_info"]

logger = logging.getLogger(__name__)

#: How long, and how often, a job SLURM shows only as COMPLETING is asked again for why it ended. COMPLETING
#: lasts until the job's processes are gone: ~0.1 s after ``scancel`` here, over 2 s once in CI (a job cancelled
#: as it started), and up to SLURM's KillWait (30 s by default) for processes that ignore SIGTERM. Past the bound
#: it is said as COMPLETING: the job has ended all the same.
COMPLETING_SETTLE_S, COMPLETING_WAIT_S = 10.0, 0.1
#: What a job in these states will not come back from (SLURM's terminal and leaving states).
ENDED = frozenset({"FAILED", "CANCELLED", "TIMEOUT", "PREEMPTED", "COMPLETED", "COMPLETING", "NODE_FAIL",
                   "OUT_OF_MEMORY", "DEADLINE", "BOOT_FAIL"})


#: Why SLURM holds a job that waiting will not start (``squeue``'s reason): forge_nb cancels it and says why.
NEVER_STARTS = {"PartitionNodeLimit": "more nodes than the partition has or allows",
                "PartitionTimeLimit": "a longer time than the partition allows",
                "PartitionConfig": "the partition cannot give what the job asks (nodes, GPUs, CPUs, memory)",
                "BadConstraints": "no node has what the job asks", "InvalidAccount": "an unknown account",
                "InvalidQOS": "an unknown QOS"}


def job_info(job_id: str) -> dict[str, Any] | None:
    """Job ``job_id`` as ``squeue --json`` shows it, in the shape monarch reads (``job_state`` a list of
    states, nodes in ``job_resources.nodes.allocation[].name``), from old and new SLURM alike; None when the
    queue does not hold it (it ended and left, or never was)."""
    out = subprocess.run(["squeue", "--json", "--jobs", str(job_id)], capture_output=True, text=True, check=True)
    for job in json.loads(out.stdout or "{}").get("jobs", []):
        if str(job.get("job_id")) == str(job_id):  # SLURM 22.05 lists every job whatever --jobs says
            return _normalized(job)
    return None


def why_ended(states: list[str]) -> str | None:
    """Why SLURM ended a job in ``states`` (``squeue``'s ``job_state`` list), or None while it runs or waits.
    COMPLETING only says that its processes are still being ended: beside a reason, the reason alone is said."""
    ended = set(ENDED.intersection(states))
    if len(ended) > 1:
        ended.discard("COMPLETING")
    return ", ".join(sorted(ended)) or None


def settled_job_info(job_id: str) -> dict[str, Any] | None:
    """:func:`job_info`, asked again while SLURM shows the job only as COMPLETING (``scancel`` leaves it so until
    its processes are gone, before CANCELLED), every ``COMPLETING_WAIT_S`` for at most ``COMPLETING_SETTLE_S``."""
    info = job_info(job_id)
    give_up = time.monotonic() + COMPLETING_SETTLE_S
    while info is not None and info["job_state"] == ["COMPLETING"] and time.monotonic() < give_up:
        time.sleep(COMPLETING_WAIT_S)
        info = job_info(job_id)
    return info


def _normalized(job: dict[str, Any]) -> dict[str, Any]:
    state = job.get("job_state") or []
    resources = dict(job.get("job_resources") or {})
    nodes = resources.get("nodes")
    if not isinstance(nodes, dict):  # SLURM < 23.02: "nodes" is a host list string like "n[1-3]"
        nodes = {"allocation": [{"name": n["nodename"]} for n in resources.get("allocated_nodes") or []]}
    return {**job, "job_state": [state] if isinstance(state, str) else list(state),
            "job_resources": {**resources, "nodes": nodes}}


def _loopback_only() -> bool:
    """Whether this machine's host name resolves to loopback addresses only (monarch's TcpWithHostname panics)."""
    try:
        addresses = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        return True
    return all(a.startswith("127.") or a == "::1" for a in addresses)


def _choose_transport() -> None:
    if _loopback_only():
        from monarch._rust_bindings.monarch_hyperactor.channel import ChannelTransport
        from monarch.config import configure

        configure(default_transport=ChannelTransport.TcpWithLocalhost)


def _quiet(log_dir: Path) -> None:
    """monarch's job modules print to the kernel's stderr (the cell) through handlers of their own: to a file."""
    try:
        log_dir.mkdir(parents=True, exist_ok=True)
        handler = logging.FileHandler(log_dir / "job.log")
    except OSError:  # a re-attaching kernel on a machine without the first one's folder: monarch's handlers stay
        return
    handler.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s %(message)s"))
    for name in ("monarch._src.job.job", "monarch._src.job.slurm"):
        job_logger = logging.getLogger(name)
        for old in list(job_logger.handlers):
            if isinstance(old, logging.StreamHandler) and not isinstance(old, logging.FileHandler):
                job_logger.removeHandler(old)
        if not any(isinstance(h, logging.FileHandler) for h in job_logger.handlers):
            job_logger.addHandler(handler)


class SlurmRefused(RuntimeError):
    """SLURM would not take the job (an unknown partition, more nodes than it has, a bad time limit...)."""


class SlurmJob(_MonarchSlurmJob):
    """``monarch.job.SlurmJob`` for any SLURM release and any node naming (see the module's docstring).

    ``meshes`` maps host mesh names to node counts, e.g. ``{"trainer": 1, "generators": 2}``; the other
    arguments are monarch's (``partition``, ``gpus_per_node``, ``time_limit``, ``slurm_args``, ...).
    ``python_exe`` defaults to the kernel's interpreter, which the nodes must be able to run (a shared
    file system, or the same environment at the same path); ``log_dir`` to the kernel's log folder.
    ``no_kill`` (default True): a node that fails takes its own worker, not the job (``sbatch --no-kill``)
    nor the other nodes' workers (``srun --no-kill --kill-on-bad-exit=0``; monarch's script runs
    ``srun <python_exe> -c ...``, so these go in front of the interpreter); False is SLURM's default."""

    def __init__(self, meshes: dict[str, int], *, python_exe: str | None = None, log_dir: str | None = None,
                 no_kill: bool = True, **kwargs: Any) -> None:
        from forge_nb.system.processes.proclogs import default_log_dir

        bad = {k: v for k, v in meshes.items() if not isinstance(v, int) or isinstance(v, bool) or v < 1}
        if not meshes or bad:
            raise ValueError(f"SlurmJob({meshes!r}): give each host mesh a whole number of nodes >= 1")
        logs = Path(log_dir or default_log_dir() / "slurm")
        _quiet(logs)
        python_exe = python_exe or f"{shlex.quote(sys.executable)} -m forge_nb.system.hosts.slurm_worker"
        slurm_args = list(kwargs.pop("slurm_args", ()))
        if no_kill:
            slurm_args.append("--no-kill")
            python_exe = f"--no-kill --kill-on-bad-exit=0 {python_exe}"
        super().__init__(meshes, python_exe=python_exe, log_dir=str(logs), slurm_args=slurm_args, **kwargs)
        _choose_transport()

    def __setstate__(self, state: dict[str, Any]) -> None:  # job_load in a later kernel
        _quiet(Path(state.get("_log_dir") or "."))
        super().__setstate__(state)
        _choose_transport()

    def _submit_slurm_job(self, num_nodes: int, client_script: str | None = None) -> str:
        try:
            return super()._submit_slurm_job(num_nodes, client_script)
        except RuntimeError as e:
            if not str(e).startswith("Failed to submit SLURM job"):
                raise
            said = "; ".join(line.strip() for line in str(e).split(":", 1)[1].strip().splitlines())
            raise SlurmRefused(f"sbatch refused the job ({num_nodes} node(s)"
                               + (f", partition {self._partition}" if self._partition else "")
                               + (f", {self._gpus_per_node} GPU(s) a node" if self._gpus_per_node else "")
                               + (f", time {self._time_limit}" if self._time_limit else "")
                               + f"): {said}. `sinfo` lists the partitions and their nodes") from None

    def _get_job_info_json(self, job_id: str) -> dict[str, Any] | None:
        """monarch polls this while the job waits to start: a job that can never start is cancelled and
        refused here (``SlurmRefused`` with SLURM's reason), and the first wait for nodes is said once, in the
        cell."""
        try:
            info = job_info(job_id)
        except (subprocess.CalledProcessError, json.JSONDecodeError, OSError) as e:
            logger.warning("squeue could not tell job %s's state: %s", job_id, getattr(e, "stderr", None) or e)
            return None
        reason = (info or {}).get("state_reason") or ""
        if info is not None and "PENDING" in info["job_state"]:
            if reason in NEVER_STARTS:
                self._kill()  # scancel: monarch cancels only when this is found while it waits for the nodes
                raise SlurmRefused(f"SLURM job {job_id} can never start ({reason}: {NEVER_STARTS[reason]}); it was "
                                   "cancelled. `sinfo` lists the partitions and their nodes")
            if reason and not getattr(self, "_said_pending", False):
                self._said_pending = True
                print(f"SLURM job {job_id} is pending ({reason}); the cell returns when its nodes run",
                      file=sys.stdout, flush=True)
        return info

    @property
    def job_id(self) -> str | None:
        return self._resolved_job_id()

    def describe(self) -> dict[str, Any]:
        """The job as tables show it: scheduler, id, state, nodes, and ``ended``: why SLURM ended it (its state:
        ``CANCELLED``, ``TIMEOUT``, ...; or that it left the queue), None while it runs or waits. A failing
        ``squeue`` is not an answer: state "unknown", not ended. It blocks (see :func:`settled_job_info`): callers
        on an event loop run it in a thread."""
        job_id = self.job_id
        out: dict[str, Any] = {"scheduler": "slurm", "job_id": job_id, "nodes": list(self._all_hostnames)}
        if job_id is None:
            return {**out, "state": "released", "ended": "it was never submitted, or was released"}
        try:
            info = settled_job_info(job_id)
        except (subprocess.CalledProcessError, json.JSONDecodeError, OSError) as e:
            return {**out, "state": f"unknown (squeue: {getattr(e, 'stderr', None) or e})", "ended": None}
        if info is None:
            return {**out, "state": "gone from the queue", "ended": "it left SLURM's queue"}
        return {**out, "state": ", ".join(info["job_state"]), "ended": why_ended(info["job_state"])}
