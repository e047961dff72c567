"""The runtime: process meshes from the notebook kernel, the only code that starts or stops monarch processes.

The kernel is the single controller: every mesh it spawns is recorded, watched and stopped here. Reading order,
bottom up::

    registry       what a mesh is (pids, state, GPUs, failures) and the kernel's record of them: meshes(), stop_all
    faults         what notices a dead process: monarch's fault hook, replaced, and the pid watchdog
    lifecycle      started once per process (monarch's environment, the hook, the exit handler), leases, end_process
    spawning       spawn_mesh: placement, GPUs, environment, log file, pids; a kept mesh adopted again
    procinfo       the small actor on every mesh (its pids) and job host (the host's probe)
    warm           processes kept warm between runs of one kernel

This ``__init__`` imports none of them: importing one loads only what it needs.
"""
