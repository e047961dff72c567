"""RLTrainer's sections refuse a bad value when they are built, naming ``<section>.<key>=<value>`` and what it must
be; a boolean is not a count (``checkpoint.interval=True`` used to pass as 1)."""

from __future__ import annotations

import pytest

from forge_nb.config import TrainerConfig
from forge_nb.config.trainer_sections import (
    CheckpointConfig,
    LRSchedulerConfig,
    OptimizerConfig,
    TrainingConfig,
    read_section,
)

BAD = [
    (TrainingConfig, "training", {"steps": 0}, r"training\.steps=0: an int >= 1$"),
    (TrainingConfig, "training", {"steps": True}, r"training\.steps=True: an int >= 1$"),
    (TrainingConfig, "training", {"gradient_accumulation_steps": 1.0}, r"gradient_accumulation_steps=1\.0: an int"),
    (TrainingConfig, "training", {"local_batch_size": 0}, r"training\.local_batch_size=0: an int >= 1, or None$"),
    (TrainingConfig, "training", {"local_batch_size": True}, r"local_batch_size=True: an int >= 1, or None$"),
    (CheckpointConfig, "checkpoint", {"interval": -1}, r"checkpoint\.interval=-1: an int >= 0 \(0: only on request\)"),
    (CheckpointConfig, "checkpoint", {"interval": True, "folder": "ckpt"}, r"checkpoint\.interval=True: an int >= 0"),
    (CheckpointConfig, "checkpoint", {"keep_last": False}, r"checkpoint\.keep_last=False: an int >= 1, or None$"),
    (LRSchedulerConfig, "lr_scheduler", {"warmup_steps": -1}, r"lr_scheduler\.warmup_steps=-1: an int >= 0$"),
    (LRSchedulerConfig, "lr_scheduler", {"decay_ratio": True},
     r"decay_ratio=True: a number in \[0, 1\], or None \(None: decay after the warmup\)$"),
    (LRSchedulerConfig, "lr_scheduler", {"min_lr_factor": float("nan")},
     r"min_lr_factor=nan: a share of the lr in \[0, 1\]$"),
    (LRSchedulerConfig, "lr_scheduler", {"total_steps": 0},
     r"total_steps=0: an int >= 1, or None \(None: training\.steps\)$"),
    (OptimizerConfig, "optimizer", {"beta1": 1}, r"optimizer\.beta1=1: must be a number in \[0, 1\) \(e\.g\. 0\.95\)$"),
    (OptimizerConfig, "optimizer", {"beta2": "0.9"}, r"optimizer\.beta2='0\.9': must be a number in \[0, 1\)"),
]


@pytest.mark.parametrize(("cls", "name", "section", "message"), BAD,
                         ids=lambda v: str(v) if isinstance(v, dict) else "")
def test_a_bad_value_is_refused_by_its_name(cls: type, name: str, section: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        read_section(cls, name, section)


def test_the_edges_and_none_are_accepted() -> None:
    assert read_section(TrainingConfig, "training", {"local_batch_size": None, "steps": 1}).steps == 1
    assert read_section(CheckpointConfig, "checkpoint", {"interval": 0, "keep_last": None}).interval == 0
    schedule = read_section(LRSchedulerConfig, "lr_scheduler",
                            {"warmup_steps": 0, "decay_ratio": 1, "min_lr_factor": 0.0, "total_steps": None})
    assert (schedule.decay_ratio, schedule.min_lr_factor, schedule.total_steps) == (1, 0.0, None)
    assert read_section(OptimizerConfig, "optimizer", {"beta1": 0, "beta2": 0.999}).beta2 == 0.999


@pytest.mark.parametrize(("value", "says"), [
    ({"rank": 0}, "lora.rank=0: an int >= 1"), ({"rank": True}, "lora.rank=True: an int >= 1"),
    ({"alpha": 0}, "lora.alpha=0: must be a positive number"),
    ({"dropout": 1.0}, r"lora.dropout=1.0: a number in \[0, 1\)"),
    ({"target_modules": []}, r"lora.target_modules=\[\]: a list of module names"),
    ({"r": 8}, "lora has no setting 'r'"),
])
def test_a_bad_lora_value_names_the_setting(value, says):
    with pytest.raises(ValueError, match=says):
        TrainerConfig(lora=value)


def test_lora_reaches_the_trainer_s_section_and_yaml_checks_its_keys():
    from forge_nb.config import LoraConfig, from_yaml

    lora = TrainerConfig(lora={"rank": 4, "target_modules": ["q_proj", "v_proj"]}).lora
    assert lora == LoraConfig(rank=4, target_modules=("q_proj", "v_proj"))
    assert TrainerConfig(lora=lora).actor_sections()["lora"]["target_modules"] == ("q_proj", "v_proj")
    with pytest.raises(ValueError, match="set it as TrainerConfig.lora"):
        TrainerConfig(lora={"rank": 4}, extra={"lora": {"rank": 8}})
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['trainer.lora.rnk'\]"):
        from_yaml("trainer:\n  lora: {rnk: 4}\n")
    run = from_yaml("trainer:\n  lora: {rank: 4}\n  loss_config: {beta: 0.04}\n")  # the base is the reference
    assert run.trainer.lora.rank == 4 and not run.use_reference
    with pytest.raises(ValueError, match=r"trainer.lora.rank=16 is above the generators' max_lora_rank=8"):
        from_yaml("trainer:\n  lora: {rank: 16}\npolicy:\n  engine_args: {max_lora_rank: 8}\n")
    with pytest.raises(ValueError, match="enable_lora=False with trainer.lora"):
        from_yaml("trainer:\n  lora: {rank: 4}\npolicy:\n  engine_args: {enable_lora: false}\n")
