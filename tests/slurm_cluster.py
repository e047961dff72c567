"""A real SLURM on this machine for the tests: munge, one slurmctld and three slurmd daemons (Debian's
slurm-wlm 22.05, which scripts/setup.sh installs), under a temporary folder.

The three nodes are named 127.0.0.11-13: each is its own loopback address, so the monarch worker SLURM starts
on each node listens on its own ``<node>:22222`` (forge_nb's SlurmJob has workers answer to their node name).
``stop`` cancels every job, waits for the queue to empty (a killed slurmd does not end its job's steps), then
ends the daemons it started, by pid. The configuration is the one in ``shared/STACK.md`` ("SLURM on one
machine"), with its own ports so that it does not meet a SLURM the machine may run.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.waiting import until_sync

NODES = ["127.0.0.11", "127.0.0.12", "127.0.0.13"]


class Unavailable(Exception):
    """SLURM cannot run here; the message says why (tests skip with it)."""


@dataclass
class Slurm:
    folder: Path
    conf: Path
    daemons: list[subprocess.Popen] = field(default_factory=list)
    munged: int | None = None  #: the munged this fixture started (None: one was running)

    @property
    def env(self) -> dict[str, str]:
        """What a process needs to use this SLURM (a kernel's environment)."""
        return {"SLURM_CONF": str(self.conf)}

    def run(self, *argv: str) -> str:
        out = subprocess.run(argv, env={**os.environ, **self.env}, capture_output=True, text=True, timeout=30)
        if out.returncode:
            raise RuntimeError(f"{' '.join(argv)}: {out.stderr.strip()}")
        return out.stdout

    def jobs(self) -> list[str]:
        """The queue: 'id state nodes' per job."""
        return self.run("squeue", "-h", "-o", "%i %T %N").split("\n")[:-1]

    def stop(self) -> None:
        try:
            self.run("scancel", "--user", "root")
            until_sync(lambda: not self.jobs(), timeout=60)
        finally:
            for daemon in self.daemons:
                daemon.terminate()
            for daemon in self.daemons:
                try:
                    daemon.wait(10)
                except subprocess.TimeoutExpired:
                    daemon.kill()
            if self.munged is not None:
                with contextlib.suppress(OSError):
                    os.kill(self.munged, 15)


def start(folder: Path) -> Slurm:
    """SLURM with three idle nodes, or Unavailable saying why not."""
    missing = [tool for tool in ("slurmctld", "slurmd", "sbatch", "munged") if _tool(tool) is None]
    if missing:
        raise Unavailable(f"no {', '.join(missing)}: scripts/setup.sh installs slurm-wlm and munge (as root, with apt)")
    if os.getuid() != 0:
        raise Unavailable("SLURM's daemons here run as root (SlurmUser=root); not root")
    munged = _start_munge()
    host = socket.gethostname().split(".")[0]
    for sub in ("state", *(f"spool/{n}" for n in NODES)):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    conf = folder / "slurm.conf"
    conf.write_text("\n".join([
        "ClusterName=forgenb", f"SlurmctldHost={host}", "SlurmctldPort=16817", "SlurmUser=root",
        "AuthType=auth/munge", "CredType=cred/munge", "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none",
        "JobAcctGatherType=jobacct_gather/none", "AccountingStorageType=accounting_storage/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "ReturnToService=2", "KillWait=5",
        f"StateSaveLocation={folder}/state", f"SlurmdSpoolDir={folder}/spool/%n",
        f"SlurmctldPidFile={folder}/slurmctld.pid", f"SlurmdPidFile={folder}/slurmd-%n.pid",
        f"SlurmctldLogFile={folder}/slurmctld.log", f"SlurmdLogFile={folder}/slurmd-%n.log",
        f"NodeName=127.0.0.[11-13] NodeHostname={host} NodeAddr=127.0.0.1 Port=17001-17003 CPUs=2 RealMemory=6000",
        "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4", ""]))
    slurm = Slurm(folder, conf, munged=munged)
    env = {**os.environ, **slurm.env}
    quiet = dict(env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    slurm.daemons.append(subprocess.Popen([_tool("slurmctld"), "-D", "-i", "-f", str(conf)], **quiet))
    slurm.daemons += [subprocess.Popen([_tool("slurmd"), "-D", "-f", str(conf), "-N", n], **quiet) for n in NODES]
    try:
        if not until_sync(lambda: _idle(slurm) == len(NODES), timeout=30):
            raise Unavailable(f"SLURM's nodes did not come up in 30 s (sinfo: {_sinfo(slurm)!r}; logs in {folder})")
    except BaseException:
        slurm.stop()
        raise
    return slurm


def _tool(name: str) -> str | None:
    """Where a SLURM or munge program is (Debian puts the daemons in /usr/sbin, not on every PATH)."""
    return shutil.which(name) or next((str(p) for p in (Path("/usr/sbin") / name,) if p.exists()), None)


def _sinfo(slurm: Slurm) -> str:
    try:
        return slurm.run("sinfo", "-h", "-o", "%T %D")
    except (RuntimeError, subprocess.TimeoutExpired) as e:
        return str(e)


def _idle(slurm: Slurm) -> int:
    return sum(int(n) for state, n in (line.split() for line in _sinfo(slurm).splitlines() if " " in line)
               if state == "idle")


def _start_munge() -> int | None:
    """munged's pid if this started it; None when one runs already."""
    pidfile = Path("/run/munge/munged.pid")
    if pidfile.exists() and Path(f"/proc/{pidfile.read_text().strip()}").exists():
        return None
    Path("/run/munge").mkdir(parents=True, exist_ok=True)
    shutil.chown("/run/munge", "munge")
    out = subprocess.run(["runuser", "-u", "munge", "--", _tool("munged")], capture_output=True, text=True)
    if out.returncode:
        raise Unavailable(f"munged did not start: {out.stderr.strip()}")
    return int(pidfile.read_text().strip())
