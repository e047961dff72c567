"""A run's trainer processes started first, their imports begun at once, while the kernel imports its own.

Where the trainer samples the first rollouts (``stand_in``), the first step waits for the trainer's process: its
start, its imports of torch and transformers (~4-5 s on two cores), its model. Before the kernel can spawn
anything it imports torch and the run's modules itself (~2-3 s), so the two imports used to run one after the
other. ``forge_nb.spawn`` enters :func:`trainer_first` before it imports the run's modules: the trainer's mesh is
spawned as the run's trainer replica would spawn it (:func:`trainer_options`), its processes import what the
trainer will (:data:`PRELOAD`) as soon as they start, and the mesh waits among the kept meshes
(``forge_nb.system.runtime.warm``) under the replica's key, where the replica's start takes it as it takes a mesh
an earlier run left. A mesh still waiting when the block ends (the spawn failed or was interrupted, or the
replica asked for another shape) is stopped then; the kernel's exit stops it too.

Nothing starts where the replica would not take it: a trainer on GPUs, on a job's hosts or of the caller's own
class, a run on another's base, or a kept mesh of the same shape already waiting (a kernel's second run).

Considered: starting a trainer's process when the extension loads (``warm``'s docstring: a kernel that never
spawns pays its memory); starting the generators' processes early too (on two cores their import of vLLM would
take the core the trainer's and the kernel's imports use, and the first step does not wait for them).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

from forge_nb.system.runtime import spawning, warm

if TYPE_CHECKING:
    from forge_nb.config import RunConfig

__all__ = ["PRELOAD", "TRAINER_CLASS", "trainer_first", "trainer_options"]

logger = logging.getLogger(__name__)

#: The name of the trainer class whose replica takes the mesh (``forge_nb.actors.trainer.RLTrainer``): the first
#: part of the replica's key (``warm.shape``), named here so that this module imports no torch.
TRAINER_CLASS = "RLTrainer"
#: What the trainer's processes import before its actor comes: its module (torch with it), transformers' model and
#: tokenizer classes (its setup's and its sampling's), and torchstore (its weight pushes').
PRELOAD = ("forge_nb.actors.trainer", "transformers:AutoModelForCausalLM", "transformers:AutoTokenizer",
           "torchstore")
#: Seconds a started mesh waits for the replica at most (the block's end stops it sooner).
WAIT_S = 600.0


def trainer_options(cfg: RunConfig) -> dict[str, Any]:
    """The trainer replica's mesh options for ``cfg``: what its ``.options()`` gets, and its key is made of."""
    return {"procs": cfg.trainer.procs, "with_gpus": cfg.trainer.with_gpus, "hosts": cfg.trainer.hosts}


@contextlib.asynccontextmanager
async def trainer_first(cfg: RunConfig, *, actors: dict[str, type] | None = None,
                        base: Any = None) -> AsyncIterator[None]:
    """Within the block, ``cfg``'s trainer mesh is started and kept for its replica (see the module docstring);
    at its end, stopped if no replica took it. ``actors`` and ``base`` as ``forge_nb.spawn`` got them."""
    started, options = None, trainer_options(cfg)
    key = warm.shape(TRAINER_CLASS, **options, env={})
    if key is not None and "trainer" not in (actors or {}) and base is None and not warm.holds(key):
        up: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        started = warm.hold(key, _imported(f"{cfg.name}-trainer-early", options["procs"], up), WAIT_S)
        # until its processes answer (~0.3 s), not longer: the kernel's own import of torch holds the GIL through
        # long stretches (its libraries' loading), and monarch's messages to them, their imports' start among
        # them, would wait for it (1.2 s measured)
        await asyncio.wait([up, started], return_when=asyncio.FIRST_COMPLETED)
    try:
        yield
    finally:
        if started is not None and await warm.release(started):
            logger.info("the trainer's mesh started for run %s was not taken: stopped", cfg.name)


async def _imported(name: str, procs: int, up: asyncio.Future[None]) -> Any:
    """The mesh, once its processes imported :data:`PRELOAD` (``up`` set when they answer): the replica's actor
    must not come sooner, as two threads importing transformers at once fail ("cannot import name"), and each
    actor has a thread of its own."""
    mesh = await spawning.spawn_mesh(name, procs, preload=PRELOAD)
    up.set_result(None)
    try:
        took = await mesh.preloading
        logger.info("mesh %s: the trainer's imports done in %.1f s", name, max(s for _, s in took.items()))
    except asyncio.CancelledError:  # released before it was up (warm.release): nobody else will stop it
        await mesh.stop(timeout=5.0)
        raise
    except Exception as e:  # the replica's own start then reports what does not import, as it would have
        logger.info("mesh %s: the trainer's imports failed: %s", name, e)
    return mesh

