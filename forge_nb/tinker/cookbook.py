"""A forge_nb task as tinker-cookbook's RL environment types, so the cookbook's own training loop
(``tinker_cookbook.rl.train.main``) trains on it through a run's Tinker API, unchanged.

``TaskExamplesBuilder`` is the same task for the cookbook's supervised loop (``tinker_cookbook.supervised.train``):
Datums of request and target, the loss on the target's tokens.

``TaskDatasetBuilder(model_path=..., ...)`` is the ``dataset_builder`` of the cookbook's ``rl.train.Config``: each batch
holds ``batch_size`` groups, each group ``group_size`` single-turn environments on one example of the task
(``forge_nb.rl.ToyTask`` by default: the quickstart's letter patterns). An environment's observation is the request's
tokens, its stop condition the tokenizer's end of sequence, and its reward the task's reward functions' mean on the
decoded answer, as forge_nb's own episodes score it.

The builders are plain data (the model's folder, the task's fields, examples), as the cookbook asks of them (they
may be pickled to rollout workers); the tokenizer is loaded once per process from the folder.

This module imports ``tinker_cookbook`` (not a dependency of forge_nb: ``scripts/setup.sh`` installs it for the
suite and the example notebook) and is not imported by ``forge_nb.tinker``.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import chz
import tinker
from tinker_cookbook.rl.types import Env, EnvGroupBuilder, RLDataset, RLDatasetBuilder, StepResult
from tinker_cookbook.supervised.types import SupervisedDataset, SupervisedDatasetBuilder

from forge_nb.models import load_tokenizer
from forge_nb.rl import ToyTask

__all__ = ["TaskDataset", "TaskDatasetBuilder", "TaskEnv", "TaskGroupBuilder", "TaskExamples",
           "TaskExamplesBuilder"]


class TaskEnv(Env):
    """One episode: the request's tokens in, the task's reward for the answer out."""

    def __init__(self, task: ToyTask, example: dict[str, str], model_path: str) -> None:
        self.task, self.example, self.tokenizer = task, example, load_tokenizer(model_path)

    async def initial_observation(self) -> tuple[tinker.ModelInput, list[int]]:
        tokens = self.tokenizer.encode(self.example["request"], add_special_tokens=False)
        stop = [self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else []
        return tinker.ModelInput.from_ints(tokens), stop

    async def step(self, action: list[int], *, extra: Any = None) -> StepResult:
        answer = self.tokenizer.decode(action, skip_special_tokens=True)
        fns = self.task.reward_fns
        reward = sum(fn(self.example["request"], answer, self.example["target"]) for fn in fns) / len(fns)
        return StepResult(reward=reward, episode_done=True, next_observation=tinker.ModelInput.from_ints([]),
                          next_stop_condition=[], metrics={"reward": reward})


@dataclass(frozen=True)
class TaskGroupBuilder(EnvGroupBuilder):
    """``group_size`` environments on one example (GRPO's group)."""

    task: ToyTask
    example: dict[str, str]
    model_path: str
    group_size: int

    async def make_envs(self) -> Sequence[Env]:
        return [TaskEnv(self.task, self.example, self.model_path) for _ in range(self.group_size)]

    def logging_tags(self) -> list[str]:
        return ["forge_nb_task"]


class TaskDataset(RLDataset):
    """``n_batches`` batches of ``batch_size`` groups; batch ``i``'s examples are the same whenever it is asked for."""

    def __init__(self, task: ToyTask, model_path: str, batch_size: int, group_size: int, n_batches: int) -> None:
        self.task, self.model_path = task, model_path
        self.batch_size, self.group_size, self.n_batches = batch_size, group_size, n_batches

    def get_batch(self, index: int) -> Sequence[EnvGroupBuilder]:
        rng = random.Random(f"{self.task.seed}-{index}")
        return [TaskGroupBuilder(self.task, self.task._example(rng), self.model_path, self.group_size)
                for _ in range(self.batch_size)]

    def __len__(self) -> int:
        return self.n_batches


@chz.chz
class TaskDatasetBuilder(RLDatasetBuilder):
    """The cookbook's dataset builder for the quickstart's task (``ToyTask``'s fields) on the model in
    ``model_path`` (a served run's ``server.base_model`` for its tiny model)."""

    model_path: str
    batch_size: int = 4
    group_size: int = 8
    n_batches: int = 40
    alphabet: str = "abcdefgh"
    response_chars: int = 4
    difficulty: int = 1
    seed: int = 0

    async def __call__(self) -> tuple[RLDataset, RLDataset | None]:
        return TaskDataset(_toy_task(self), self.model_path, self.batch_size, self.group_size, self.n_batches), None


class TaskExamples(SupervisedDataset):
    """``n_batches`` batches of ``batch_size`` Datums: a request's tokens, then its target's, weighted 1 (the
    request's predictions 0); batch ``i``'s examples are the same whenever it is asked for."""

    def __init__(self, task: ToyTask, model_path: str, batch_size: int, n_batches: int) -> None:
        self.task, self.tokenizer = task, load_tokenizer(model_path)
        self.batch_size, self.n_batches = batch_size, n_batches

    def get_batch(self, index: int) -> list[tinker.Datum]:
        rng = random.Random(f"sft-{self.task.seed}-{index}")
        datums = []
        for _ in range(self.batch_size):
            example = self.task._example(rng)
            request = self.tokenizer.encode(example["request"], add_special_tokens=False)
            target = self.tokenizer.encode(example["target"], add_special_tokens=False)
            tokens = request + target
            datums.append(tinker.Datum(
                model_input=tinker.ModelInput.from_ints(tokens[:-1]),
                loss_fn_inputs={"target_tokens": tokens[1:],
                                "weights": [0.0] * (len(request) - 1) + [1.0] * len(target)}))
        return datums

    def set_epoch(self, seed: int = 0) -> None:  # batches are drawn by index: nothing to shuffle
        pass

    def __len__(self) -> int:
        return self.n_batches


@chz.chz
class TaskExamplesBuilder(SupervisedDatasetBuilder):
    """The cookbook's supervised dataset builder for the quickstart's task on the model in ``model_path``."""

    model_path: str
    batch_size: int = 16
    n_batches: int = 20
    alphabet: str = "abcdefgh"
    response_chars: int = 4
    difficulty: int = 1
    seed: int = 0

    def __call__(self) -> tuple[SupervisedDataset, SupervisedDataset | None]:
        return TaskExamples(_toy_task(self), self.model_path, self.batch_size, self.n_batches), None


def _toy_task(builder: Any) -> ToyTask:
    """The task a builder's fields name."""
    return ToyTask(alphabet=builder.alphabet, response_chars=builder.response_chars, difficulty=builder.difficulty,
                   seed=builder.seed)
