"""This machine's processes: their pids, their output, what they leave behind, and how they start.

Reading order, bottom up::

    procs          pids: alive, kill a process group, the reaper of a dead kernel, files of dead processes
    startup_gc     no full garbage collections while a spawned process starts, nor over the kernel's heap in a run
    proclogs       where spawned processes' output goes (a log file per mesh) and reading it back
    leftovers      what killed processes left (vLLM segments, sockets), found and removed
    start_cores    while meshes start on fewer cores than busy processes, some cores kept for the named ones

This ``__init__`` imports none of them: importing one loads only what it needs.
"""
