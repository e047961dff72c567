"""How a run reads the hot declarations: which names ``run.set`` takes, their values, and whether a change is valid.

The declarations themselves are on the config fields (``forge_nb.config._hot``); this module walks them from
``RunConfig`` and adds the fields of the run's loss (all "trainer"). The Run calls :func:`hot_fields`,
:func:`initial_hparams` and :func:`check_change`, and sends :func:`trainer_changes` to the trainer; the
trainer actor takes the names of :func:`trainer_hparam_sections` (and its loss's fields).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from dataclasses import fields, is_dataclass
from typing import Any

from forge_nb.config._hot import HotField, TaskKnobs, declared
from forge_nb.config._run import RunConfig, greedy_check
from forge_nb.system.importpath import import_path


def declared_hot() -> dict[str, HotField]:
    """Every hot field declared in RunConfig's tree, by name."""
    return declared(RunConfig)


def trainer_hparam_sections() -> dict[str, str]:
    """What the trainer actor holds of the declared fields, by name: its section there ("optimizer", "training").

    ``RLTrainer.set_hparams`` accepts these names and the fields of its loss; ``info()["hparams"]`` reports them."""
    return {name: hf.section for name, hf in declared_hot().items() if hf.section is not None}


def loss_values(cfg: RunConfig) -> dict[str, Any]:
    """The fields of the run's loss with their configured values (a loss that is no dataclass has none)."""
    loss = _loss_object(cfg.trainer)
    return {f.name: getattr(loss, f.name) for f in fields(loss)} if loss is not None else {}


def _loss_object(trainer: Any) -> Any:
    """The loss ``trainer`` (a TrainerConfig) configures, when it is a dataclass instance; else None."""
    loss: Any = trainer.loss
    if isinstance(loss, str) and ":" in loss:
        loss = import_path(loss, label="trainer.loss")
        loss = loss(**trainer.loss_config) if isinstance(loss, type) else loss
    elif isinstance(loss, str):
        from forge_nb.rl import make_loss

        loss = make_loss(loss, **trainer.loss_config)
    return loss if is_dataclass(loss) and not isinstance(loss, type) else None


def hot_fields(cfg: RunConfig, loss_fields: Iterable[str] | None = None) -> dict[str, str]:
    """Every name ``run.set`` accepts for ``cfg``, mapped to the part that applies it ("trainer", "sampling", "run").

    ``loss_fields``: the names of the loss's fields (default: those of ``cfg.trainer.loss``, see
    :func:`loss_values`); all are "trainer". A loss field that shares a declared name is the declared one."""
    routes = {name: hf.where for name, hf in declared_hot().items()}
    names = loss_values(cfg) if loss_fields is None else loss_fields
    return routes | {name: "trainer" for name in names if name not in routes}


def initial_hparams(cfg: RunConfig, loss_values_: Mapping[str, Any] | None = None, *,
                    task: Any = None) -> dict[str, Any]:
    """The current value of every hot name of a run just spawned from ``cfg``.

    Sampling values are the generator's (``max_tokens`` defaults to ``max_res_tokens``); ``difficulty`` is
    the live task's, and absent when the task has none; the loss's values are ``loss_values_`` (default:
    built from the config)."""
    values: dict[str, Any] = {}
    sampling = cfg.sampling()
    for name, hf in declared_hot().items():
        if hf.path[:2] == ("generator", "sampling_params"):
            values[name] = getattr(sampling, name)
        elif hf.path[0] == "task_args":
            if hasattr(task, name):
                values[name] = getattr(task, name)
        else:
            node: Any = cfg
            for part in hf.path:
                node = getattr(node, part)
            values[name] = node
    loss = loss_values(cfg) if loss_values_ is None else loss_values_
    return values | {k: v for k, v in loss.items() if k not in values}


def check_change(cfg: RunConfig, name: str, value: Any, *, task: Any = None,
                 current: Mapping[str, Any] | None = None, loss_fields: Iterable[str] | None = None) -> None:
    """Raise ValueError (naming the value and the fix) if ``run.set(name=value)`` cannot apply to this run.

    ``task``: the run's task (``difficulty`` needs one that has it). ``current``: the run's current hot
    values, so a loss field is checked together with the loss's other fields as they are now."""
    routes = hot_fields(cfg, loss_fields)
    if name not in routes:
        raise ValueError(f"run.set(): unknown name(s) {[name]}; hot-changeable: {sorted(routes)}")
    if name == "max_tokens" and _is_int(value) and not 1 <= value <= cfg.max_res_tokens:
        raise ValueError(f"max_tokens={value}: must be between 1 and max_res_tokens={cfg.max_res_tokens} "
                         "(longer responses would be cut in training)")
    if name == "beta" and value and not cfg.use_reference and cfg.trainer.lora is None:  # LoRA: the base is it
        raise ValueError(f"beta={value}: the KL penalty needs reference logprobs and this run has no "
                         "ReferenceModel; spawn it with use_reference=True (or keep beta=0)")
    if name == "difficulty" and task is not None and not hasattr(task, "difficulty"):
        raise ValueError(f"difficulty: the task {type(task).__name__} has no difficulty to change")
    try:
        _rebuild(cfg, name, value, current or {})
    except (TypeError, ValueError) as e:
        raise ValueError(f"run.set({name}={value!r}): {e}") from None


def trainer_changes(changes: Mapping[str, Any], routes: Mapping[str, str]) -> dict[str, Any]:
    """The part of ``changes`` the trainer's ``set_hparams`` must get: its own names and the loss's, and
    ``temperature`` (a sampling change the trainer's logprobs follow)."""
    held = trainer_hparam_sections()
    return {k: v for k, v in changes.items() if routes.get(k) == "trainer" or k in held}


def _rebuild(cfg: RunConfig, name: str, value: Any, current: Mapping[str, Any]) -> None:
    """Build the declaring dataclass (or the loss) with ``name=value``: its own validation runs."""
    hf = declared_hot().get(name)
    if hf is None:  # a field of the loss, checked with the loss's other fields as they are now
        loss = _loss_object(cfg.trainer)
        if loss is not None:  # else a loss the trainer reported fields of checks them when it applies the change
            state = {f.name: current[f.name] for f in fields(loss) if f.name in current}
            dataclasses.replace(loss, **(state | {name: value}))
        return
    if hf.path[:2] == ("generator", "sampling_params"):
        sampling = dataclasses.replace(cfg.sampling(), **{name: value})
        greedy_check(cfg.group_size, sampling.temperature)  # group_size is fixed at spawn: n of every request
    elif hf.path[0] == "task_args":
        TaskKnobs(**{name: value})
    else:
        *parents, last = hf.path
        node: Any = cfg
        for part in parents:
            node = getattr(node, part)
        dataclasses.replace(node, **{last: value})


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
