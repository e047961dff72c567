"""RLTrainer's learning-rate schedule is torchtitan's: the same rate at every step as torchtitan's own
``LRSchedulersContainer`` (torchtitan 0.3, the version forge_nb installs) on a real torch optimizer.

Under TorchForge the trainer steps torchtitan's scheduler after every optimizer step, so the documents'
``RLTrainer(optimizer={"lr": 1e-5})`` trains with torchtitan's defaults: 200 warmup steps, then a linear decay
towards 0 at ``training.steps`` (10000). ``LRSchedulerConfig.factor`` computes the same without torchtitan
(which does not import everywhere forge_nb runs: its models need torch >= 2.13)."""

from __future__ import annotations

import pytest
import torch

from forge_nb.config.trainer_sections import LRSchedulerConfig, read_section

CASES = [
    {},  # torchtitan's defaults, on a run shorter than the warmup
    {"warmup_steps": 3},  # the decay over every step after the warmup
    {"warmup_steps": 0, "decay_type": "cosine"},
    {"warmup_steps": 2, "decay_ratio": 0.5, "decay_type": "sqrt", "min_lr_factor": 0.1},  # warmup, stable, decay
    {"warmup_steps": 4, "decay_ratio": 0.0},  # no decay: RunConfig's constant rate after its warmup
    {"warmup_steps": 5, "decay_ratio": 0.9},  # warmup and decay longer than the run: torchtitan shortens the decay
    {"warmup_steps": 1, "total_steps": 7},  # the schedule's own length, not training.steps
]


def torchtitan_rates(section: dict, steps: int) -> list[float]:
    """The lr torchtitan's scheduler gives each of ``steps`` optimizer steps of a base rate of 1."""
    from torchtitan.components.optimizer.lr_scheduler import LRSchedulersContainer

    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = LRSchedulersContainer.Config(**section).build(optimizers=[optimizer], training_steps=steps)
    rates = []
    for _ in range(steps):
        rates.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return rates


@pytest.mark.parametrize("section", CASES, ids=lambda s: ",".join(f"{k}={v}" for k, v in s.items()) or "defaults")
def test_every_steps_rate_is_torchtitans(section: dict) -> None:
    pytest.importorskip("torchtitan.components.optimizer.lr_scheduler")
    steps = 12
    config = read_section(LRSchedulerConfig, "lr_scheduler", section)
    ours = [config.factor(step, steps) for step in range(steps)]
    length = section.get("total_steps", steps)  # past it torchtitan's rate falls below 0; ours stays at its last
    assert ours[:length] == pytest.approx(torchtitan_rates(section, steps)[:length], abs=1e-12)
    assert ours[length:] == [ours[length - 1]] * (steps - length)
    assert len(set(ours)) > 1  # each case moves the rate somewhere


def test_the_documents_trainer_warms_up_then_decays_over_torchtitans_run_length() -> None:
    schedule = LRSchedulerConfig()  # RLTrainer's section when the documents give none
    assert schedule.factor(0, 10000) == pytest.approx(1 / 200)
    assert schedule.factor(199, 10000) == 1.0
    assert schedule.factor(5100, 10000) == pytest.approx(0.5, abs=1e-3)
    # an RL run may go past training.steps: it keeps the last step's rate (torchtitan's would fall below 0)
    assert schedule.factor(20000, 10000) == schedule.factor(9999, 10000) > 0


def test_torchtitans_older_name_and_bad_values() -> None:
    assert read_section(LRSchedulerConfig, "lr_scheduler", {"lr_min": 0.2}).min_lr_factor == 0.2
    for section, message in (({"decay_ratio": 1.5}, "decay_ratio=1.5"), ({"decay_type": "step"}, "decay_type"),
                             ({"min_lr_factor": -0.1}, "min_lr_factor"), ({"warmup_steps": 2.5}, "warmup_steps"),
                             ({"total_steps": 0}, "total_steps")):
        with pytest.raises(ValueError, match=message):
            read_section(LRSchedulerConfig, "lr_scheduler", section)
