"""The trainer actor's keyword arguments for a run: ``RunConfig.trainer`` as it is, plus the run's own settings.

The spawner calls :func:`trainer_actor_kwargs` and passes the result to ``RLTrainer`` (with ``model`` and
``pad_id``); the actor turns the TrainerConfig into its sections itself (``TrainerConfig.actor_sections``),
so no second shape of the trainer's configuration is built here.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from forge_nb.config._run import RunConfig


def trainer_actor_kwargs(cfg: RunConfig, *, checkpoint_folder: str | None, weights_namespace: str = "policy",
                         verified_checkpoint: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """``RLTrainer`` keyword arguments of ``cfg``'s trainer (besides ``model`` and ``pad_id``).

    ``trainer`` is ``cfg.trainer`` itself (its optimizer and training sections, loss, loss_config and its
    ``extra`` sections). The other sections carry what the run decides and TrainerConfig does not hold: the
    seed, the learning-rate warmup and no decay after it (the trainer's own default is torchtitan's decay, see
    ``LRSchedulerConfig``), the run's length (``loop.max_steps``, where a decay a YAML asks for ends), the
    checkpoint folder, and the sampling temperature (the trainer's logprobs are of the distribution the
    generator samples from). ``cfg.trainer.extra`` wins over the warmup and the checkpoint folder, as a YAML's
    ``trainer.checkpoint.folder`` does. ``weights_namespace``: the run's torchstore key namespace.
    ``verified_checkpoint``: the checkpoint folder a resume has just checked (``CheckpointConfig.verified``)::

        RLTrainer.options(procs=cfg.trainer.procs, with_gpus=cfg.trainer.with_gpus, mesh_name=...)
            .as_actor(model=model, pad_id=pad_id, **trainer_actor_kwargs(cfg, checkpoint_folder=folder))
    """
    checkpoint = {"folder": checkpoint_folder} if checkpoint_folder is not None else {}
    if checkpoint and verified_checkpoint is not None:
        checkpoint["verified"] = str(verified_checkpoint)
    return {
        "trainer": cfg.trainer,
        "training": {"seed": cfg.seed, "temperature": cfg.sampling().temperature,
                     **({"steps": cfg.loop.max_steps} if cfg.loop.max_steps else {})},
        "lr_scheduler": {"warmup_steps": cfg.loop.warmup_steps, "decay_ratio": 0.0},  # constant after the warmup
        "checkpoint": checkpoint,
        "weights_namespace": weights_namespace,
    }
