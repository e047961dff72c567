"""The floor everything stands on: processes, meshes, hosts and files of the machine.

Nothing here knows about runs, services or models. Reading order, bottom up::

    procs          pids: alive, kill a process group, the reaper of a dead kernel, files of dead processes
    proclogs       where spawned processes' output goes (a log file per mesh) and reading it back
    gpus           how many GPUs this process sees and which are free
    diskspace      a full disk said as such (DiskFull)
    importpath     "package.module:Name" paths and optional packages, imported or a clear error
    dist_cache     this machine's cache folder; the installed distributions' packages, computed once there
    leases         a kernel-wide resource that starts on its first lease and stops on its last release
    monarch_compat bridges over monarch 0.7 behaviour
    cluster        where meshes live: the kernel's host or a monarch job's hosts (use_job, release_job)
    slurm          monarch's SlurmJob made to work with the SLURM a cluster runs (slurm_worker: what srun starts)
    runtime/       the only code that starts or stops monarch processes: spawn_mesh, the mesh registry, fault
                   hook and pid watchdog, the runtime's start and leases; the probe actor; meshes kept warm
    leftovers      what killed processes left (vLLM segments, sockets), found and removed
    start_cores    while meshes start on fewer cores than busy processes, some cores kept for the named ones

Public names (``forge_nb.spawn_mesh``, ``forge_nb.use_job``, ``forge_nb.SlurmJob``...) come from ``forge_nb``.
"""
