"""GPU accounting for the runtime: how many devices this process sees, which are free, and the clear
error a spawn gets before anything starts when there are too few.

The runtime owns the registry of meshes; it passes in which GPUs its running meshes hold (mesh name ->
device ids), so this module keeps no state. CUDA is never initialised here (``device_count`` only).
"""

from __future__ import annotations


class ResourceError(RuntimeError):
    """The machine cannot provide what a spawn asked for (GPUs, hosts). Nothing was spawned."""


class JobEnded(ResourceError):
    """The job's scheduler ended it (``scancel``, a time limit): nothing can be spawned on its hosts again, so a
    replica that died with them is not respawned."""


def visible() -> int:
    """How many CUDA devices this process can see (0 without CUDA). Does not initialise CUDA."""
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a dependency
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def free(held: dict[str, list[int]]) -> list[int]:
    """The visible GPUs that none of ``held`` (mesh name -> its GPUs) holds."""
    used = {g for ids in held.values() for g in ids}
    return [g for g in range(visible()) if g not in used]


def check(procs: int, name: str, held: dict[str, list[int]]) -> list[int]:
    """The first ``procs`` free GPUs for ``name``; ResourceError, saying what to do, when there are fewer."""
    total = visible()
    if total == 0:
        raise ResourceError(
            f"{name} asks for {procs} GPU(s) (with_gpus=True) but this machine has no CUDA "
            "device (torch.cuda.is_available() is False). Use with_gpus=False to run on CPU."
        )
    available = free(held)
    if procs > len(available):
        holders = ", ".join(f"{mesh}: {ids}" for mesh, ids in held.items() if ids)
        raise ResourceError(
            f"{name} asks for {procs} GPU(s) but {len(available)} of the {total} visible are free"
            + (f" (in use by {holders})" if holders else "")
            + ". Ask for fewer procs, or stop a mesh first."
        )
    return available[:procs]
