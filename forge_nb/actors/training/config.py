"""RLTrainer's arguments: a ``TrainerConfig`` or torchforge's sections, and the hyperparameters it changes.

The sections themselves (one dataclass each, their keys and checks) are ``forge_nb.config.trainer_sections``,
the one schema the YAML loader and the actors read. The trainer takes ``RunConfig.trainer`` (a
``TrainerConfig``) as it is, or torchforge's sections as keyword arguments (``trainer_arguments``). Which
of its values ``set_hparams`` changes is declared on the sections' fields (``forge_nb.config.hot``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields, is_dataclass, replace
from typing import Any

from forge_nb.config import TrainerConfig, trainer_hparam_sections
from forge_nb.config.trainer_sections import RUN_OWNED, OptimizerConfig, TrainingConfig

__all__ = ["hparams", "model_source", "trainer_arguments", "with_hparams"]


def model_source(model: str | Mapping[str, Any]) -> str:
    """A hub id or folder from ``model``: a string, or torchforge's {"hf_assets_path": "hf://org/name"}."""
    if isinstance(model, str):
        return model
    if isinstance(model, Mapping) and isinstance(model.get("hf_assets_path"), str):
        path = model["hf_assets_path"]
        return path.removeprefix("hf://")
    raise ValueError(
        f"model={model!r}: pass a hub id ('Qwen/Qwen3-1.7B'), a local folder, or "
        "{'hf_assets_path': 'hf://Qwen/Qwen3-1.7B'}"
    )


def trainer_arguments(
    trainer: TrainerConfig | None, sections: Mapping[str, Any], loss: str | Callable[..., Any] | None,
    loss_config: Mapping[str, Any] | None,
) -> tuple[dict[str, Any], str | Callable[..., Any], Mapping[str, Any] | None]:
    """(sections, loss, loss_config) of RLTrainer's arguments: as given (torchforge's shape), or from a
    ``TrainerConfig`` over the given sections, which then carry only what the run decides (the training
    section's ``RUN_OWNED`` fields, the warmup, the checkpoint folder)."""
    given = {k: v for k, v in sections.items() if v is not None}
    if trainer is None:
        return given, "grpo" if loss is None else loss, loss_config
    if not isinstance(trainer, TrainerConfig):
        raise TypeError(f"RLTrainer(trainer={trainer!r}): pass a forge_nb.config.TrainerConfig (e.g. cfg.trainer), "
                        "or leave trainer out and pass torchforge's sections (optimizer=, training=, ...)")
    if loss is not None or loss_config is not None:
        raise ValueError("RLTrainer got trainer= and loss=/loss_config=: the TrainerConfig names the loss; "
                         "set TrainerConfig.loss and .loss_config instead")
    for where in ("optimizer", "training"):  # the TrainerConfig holds these; the run adds only what it owns
        for name, value in (given.get(where) or {}).items():
            if name not in RUN_OWNED.get(where, {}):
                raise ValueError(f"RLTrainer got trainer= and {where}.{name}={value!r}: set "
                                 f"TrainerConfig.{where}.{name} instead (one place for each setting)")
    return trainer.actor_sections(given), trainer.loss, trainer.loss_config


def hparams(opt: OptimizerConfig, train: TrainingConfig, loss_fn: Any) -> dict[str, Any]:
    """Every hyperparameter ``set_hparams`` can change, with its current value: the fields declared hot with a
    trainer section (``forge_nb.config.trainer_hparam_sections``), then the loss's fields."""
    held = {"optimizer": opt, "training": train}
    values = {name: getattr(held[where], name) for name, where in trainer_hparam_sections().items()}
    if is_dataclass(loss_fn):
        values |= {f.name: getattr(loss_fn, f.name) for f in fields(loss_fn) if f.name not in values}
    return values


def with_hparams(
    opt: OptimizerConfig, train: TrainingConfig, loss_fn: Any, changes: Mapping[str, Any]
) -> tuple[OptimizerConfig, TrainingConfig, Any]:
    """New (optimizer, training, loss) with ``changes`` applied and validated; the inputs stay untouched."""
    known = hparams(opt, train, loss_fn)
    unknown = set(changes) - set(known)
    if unknown:
        raise ValueError(f"set_hparams got unknown name(s) {sorted(unknown)}; known: {sorted(known)}")
    held = trainer_hparam_sections()
    opt = replace(opt, **{k: v for k, v in changes.items() if held.get(k) == "optimizer"})
    train = replace(train, **{k: v for k, v in changes.items() if held.get(k) == "training"})
    for_loss = {k: v for k, v in changes.items() if k not in held}
    if for_loss:
        loss_fn = replace(loss_fn, **for_loss)  # the loss's __post_init__ validates its fields
    return opt, train, loss_fn
