"""What ``srun`` starts on each node of a :class:`forge_nb.system.hosts.slurm.SlurmJob`: monarch's own worker bootstrap,
with the node's host name read as its SLURM node name.

monarch's batch script runs ``<python_exe> -c '<bootstrap>'``; forge_nb's ``python_exe`` is
``python -m forge_nb.system.hosts.slurm_worker``, so this module gets ``-c <bootstrap>`` as its arguments. The bootstrap
listens on ``tcp://{socket.gethostname()}:<port>`` while the kernel dials the name SLURM allocated
(``$SLURMD_NODENAME``); where the two differ the kernel could never reach the worker, so the worker
answers to the node's name. Everything else is monarch's code, run as it would be.
"""

from __future__ import annotations

import os
import socket
import sys


def main(argv: list[str]) -> None:
    if len(argv) < 2 or argv[0] != "-c":
        raise SystemExit("usage: python -m forge_nb.system.hosts.slurm_worker -c CODE (monarch's SlurmJob runs it)")
    node = os.environ.get("SLURMD_NODENAME")
    if node:
        socket.gethostname = lambda: node  # what the bootstrap advertises and binds: the name the kernel dials
    sys.argv = ["-c", *argv[2:]]
    exec(compile(argv[1], "<monarch worker bootstrap>", "exec"), {"__name__": "__main__"})


if __name__ == "__main__":
    main(sys.argv[1:])
