"""Run configuration: dataclasses validated on creation, dotted overrides, and torchforge-shaped YAML.

A recipe is a Python function returning a :class:`RunConfig` (see ``forge_nb.recipes``). YAML in the
shape of torchforge's ``apps/grpo/*.yaml`` loads into the same dataclasses (:func:`from_yaml`), and
``key=value`` overrides (``trainer.optimizer.lr=1e-5``) apply to either (:func:`apply_overrides`). Every
mistake a user can make raises ``ValueError`` naming the field, the value and the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from forge_nb.config._actor_args import trainer_actor_kwargs
from forge_nb.config._changes import (
    check_change,
    hot_fields,
    initial_hparams,
    loss_values,
    trainer_changes,
    trainer_hparam_sections,
)
from forge_nb.config._hot import SamplingConfig, TaskKnobs, hot
from forge_nb.config._resolve import FLOAT
from forge_nb.config._rollout import RolloutConfig
from forge_nb.config._run import (
    REFERENCE_SECTIONS,
    GeneratorConfig,
    LoopConfig,
    ReferenceConfig,
    RunConfig,
    TrainerConfig,
    from_dict,
    from_saved,
)
from forge_nb.config.trainer_sections import LoraConfig, OptimizerConfig, TrainingConfig

__all__ = [
    "REFERENCE_SECTIONS", "GeneratorConfig", "LoopConfig", "LoraConfig", "OptimizerConfig", "ReferenceConfig",
    "RolloutConfig", "RunConfig", "SamplingConfig", "TaskKnobs", "TrainerConfig", "TrainingConfig",
    "apply_overrides", "check_change", "from_dict", "from_saved", "from_yaml", "hot", "hot_fields", "initial_hparams",
    "load", "loss_values", "trainer_actor_kwargs", "trainer_changes", "trainer_hparam_sections",
]


def apply_overrides(cfg: RunConfig, overrides: list[str] | dict[str, Any]) -> RunConfig:
    """A copy of ``cfg`` with ``key=value`` overrides (dotted keys, YAML values) applied and re-validated."""
    items = overrides.items() if isinstance(overrides, dict) else [_split(o) for o in overrides]
    data = cfg.to_dict()
    for key, value in items:
        node = data
        *path, last = key.split(".")
        for part in path:
            if not isinstance(node.get(part), dict):
                raise ValueError(f"override {key!r}: {part!r} is not a section of the config")
            node = node[part]
        if last not in node and not isinstance(node, dict):
            raise ValueError(f"override {key!r}: no such key")
        node[last] = value
    return from_dict(data)


def load(config: RunConfig | str | Path, overrides: list[str] | dict[str, Any] | None = None) -> RunConfig:
    """The RunConfig a spawn gets as ``config`` (a RunConfig, a YAML path or YAML text), with ``overrides``."""
    cfg = config if isinstance(config, RunConfig) else from_yaml(config)
    return apply_overrides(cfg, overrides) if overrides else cfg


def _split(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ValueError(f"override {item!r}: write it as key=value, e.g. trainer.optimizer.lr=1e-5")
    key, raw = item.split("=", 1)
    value = yaml.safe_load(raw)
    if isinstance(value, str) and FLOAT.fullmatch(value.strip()):
        value = float(value)  # YAML 1.1 reads 1e-5 (no dot) as a string
    return key.strip(), value


# -- torchforge-shaped YAML ------------------------------------------------------------------------


def from_yaml(source: str | Path) -> RunConfig:
    """Load YAML (a path or the text itself) into a RunConfig: forge_nb's own layout, torchforge's
    ``apps/grpo/*.yaml`` layout, or the skill card's (``training``/``grpo``/``services.generator``...).

    Every key is honoured or refused: an unknown key anywhere is a ValueError naming its dotted path and
    what is accepted there. ``${a.b}``, ``${sum:x,y}`` and ``${oc.env:NAME,default}`` resolve as in
    OmegaConf. Nothing is downloaded: a hub model id is resolved when the run spawns.
    See :mod:`forge_nb.config._yaml` for what each torchforge key becomes.
    """
    from forge_nb.config._yaml import load_yaml_text

    text = Path(source).read_text() if _is_path(source) else str(source)
    return from_dict(load_yaml_text(text))


def _is_path(source: str | Path) -> bool:
    return isinstance(source, Path) or ("\n" not in source and source.endswith((".yaml", ".yml")))
