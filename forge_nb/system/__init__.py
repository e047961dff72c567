"""The floor everything stands on: processes, meshes, hosts and files of the machine.

Nothing here knows about runs, services or models. By concern, bottom up::

    diskspace      a full disk said as such (DiskFull)
    importpath     "package.module:Name" paths and optional packages, imported or a clear error
    dist_cache     this machine's cache folder; the installed distributions' packages, computed once there
    leases         a kernel-wide resource that starts on its first lease and stops on its last release
    local_http     an aiohttp application served on this machine's loopback (the fronts a run serves)
    monarch_compat bridges over monarch 0.7 behaviour
    processes/     this machine's processes: pids and kills, their output, what killed ones leave, their start
    hosts/         where meshes live: the kernel's host or a monarch job's (SLURM), and the GPUs each has
    runtime/       the only code that starts or stops monarch processes: spawn_mesh, the mesh registry, fault
                   hook and pid watchdog, the runtime's start and leases; the probe actor; meshes kept warm

The modules at this level are small leaves the folders and the floors above use. No ``__init__`` here imports
anything, so importing one module loads only what it needs. Public names (``forge_nb.spawn_mesh``,
``forge_nb.use_job``, ``forge_nb.SlurmJob``...) come from ``forge_nb``.
"""
