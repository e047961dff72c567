"""The hosts meshes run on: the kernel's, or a monarch job's, and the GPUs each has.

Reading order, bottom up::

    gpus           how many GPUs this process sees and which are free; the errors a spawn gets before it starts
    cluster        where meshes live: the kernel's host or a monarch job's hosts (use_job, release_job), their probes
    slurm          monarch's SlurmJob made to work with the SLURM a cluster runs
    slurm_worker   what ``srun`` starts on each node: monarch's worker, answering to its node's name

This ``__init__`` imports none of them: importing one loads only what it needs.
"""
