"""Hot-changeable hyperparameters: declared once, on the config field, read by the Run and by the trainer.

A field made with ``hot(default, where)`` may change while a run trains (``run.set(name=value)``, applied
at the next step boundary). ``where`` names the part that applies the change:

- "trainer": the trainer actor's ``set_hparams`` (the optimizer section's ``lr`` and ``weight_decay``, the
  training section's ``max_norm``: ``forge_nb.config.trainer_sections``), and every field of the run's loss (the
  loss classes are dataclasses: they declare their own fields);
- "sampling": the generators' per-request overrides (``SamplingConfig``: temperature, top_p, max_tokens);
- "run": the controller (``RunConfig.max_policy_age`` -> the replay buffer, ``TaskKnobs.difficulty`` -> the task).

``section=`` names the trainer section that holds the value inside the actor (``optimizer.lr``,
``training.max_norm``): the trainer's ``set_hparams`` and ``info()["hparams"]`` take exactly those names
plus the loss's fields. ``temperature`` is "sampling" and has a section too: the trainer's logprobs are of
the distribution the generator samples from, so a change goes to both.

A field whose value is a dict passed on to a library (``GeneratorConfig.sampling_params`` for vLLM,
``RunConfig.task_args`` for the task) names, in its metadata, the small dataclass that declares its hot
keys (``view=SamplingConfig``); a field whose value is a dataclass (``RunConfig.trainer``, its ``optimizer``) is
walked into. :func:`declared` walks a config tree from the top, so a new hot field
anywhere in RunConfig reaches ``run.set`` and the trainer without a list to update
(``forge_nb.config._changes`` reads the declarations for them). A change is validated by the declaring
dataclass itself (``check_change`` builds a copy with the new value), so each rule is written once as well.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field, fields, is_dataclass
from typing import Any

WHERE = ("trainer", "sampling", "run")
"""The parts of a run that apply hot changes."""


def hot(default: Any, where: str, *, section: str | None = None) -> Any:
    """A dataclass field that ``run.set`` may change between steps, applied by ``where``."""
    if where not in WHERE:
        raise ValueError(f"hot(where={where!r}): choose one of {WHERE}")
    return field(default=default, metadata={"hot": where, "section": section})


# -- the hot keys of dict-valued fields -----------------------------------------------------------------


@dataclass(kw_only=True)
class SamplingConfig:
    """The hot keys of ``GeneratorConfig.sampling_params`` (the rest of that dict goes to vLLM as given)."""

    temperature: float = hot(1.0, "sampling", section="training")
    """Sampling temperature; 0 is greedy sampling, which needs ``RunConfig.group_size=1`` (a group of greedy
    answers is one answer repeated). The trainer's logprobs divide the logits by it (by 1 at temperature 0)."""
    top_p: float = hot(1.0, "sampling")
    max_tokens: int | None = hot(None, "sampling")
    """Response budget of a request; None: the run's max_res_tokens."""

    def __post_init__(self) -> None:
        t, p, m = self.temperature, self.top_p, self.max_tokens
        if isinstance(t, bool) or not isinstance(t, int | float) or not t >= 0:
            raise ValueError(f"sampling temperature={t!r}: must be a number >= 0 (0 is greedy sampling; 1.0 "
                             "samples from the model's own distribution)")
        if isinstance(p, bool) or not isinstance(p, int | float) or not 0 < p <= 1:
            raise ValueError(f"sampling top_p={p!r}: must be a number in (0, 1] (1.0 keeps every token)")
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 1):
            raise ValueError(f"sampling max_tokens={m!r}: must be an integer >= 1, or None for max_res_tokens")

    @classmethod
    def of(cls, params: Mapping[str, Any]) -> SamplingConfig:
        """The hot keys of a ``sampling_params`` dict, validated (other keys are vLLM's to check)."""
        return cls(**{f.name: params[f.name] for f in fields(cls) if f.name in params})


@dataclass(kw_only=True)
class TaskKnobs:
    """The hot keys of a task: ``RunConfig.task_args`` builds the task, the live task holds the value."""

    difficulty: int | None = hot(None, "run")
    """The toy task's pattern length (tasks without one refuse the change)."""

    def __post_init__(self) -> None:
        d = self.difficulty
        if d is not None and (isinstance(d, bool) or not isinstance(d, int) or d < 1):
            raise ValueError(f"difficulty={d!r}: must be an integer >= 1")


# -- reading the declarations ---------------------------------------------------------------------------


@dataclass(frozen=True)
class HotField:
    """One declared hot field: its name, who applies it, and where it sits in RunConfig."""

    name: str
    where: str
    path: tuple[str, ...]
    """Attribute path from RunConfig; a key of a dict-valued field ends the path (sampling_params, temperature)."""
    section: str | None = None
    """The trainer section holding it in the actor ("optimizer", "training"), if the trainer holds it."""


def declared(cls: type, path: tuple[str, ...] = ()) -> dict[str, HotField]:
    """Every hot field declared in ``cls``'s tree (nested configs, and the views of dict-valued fields)."""
    found: dict[str, HotField] = {}
    for f in fields(cls):
        nested = f.metadata.get("view")
        if nested is None and f.default_factory is not dataclasses.MISSING and is_dataclass(f.default_factory):
            nested = f.default_factory  # a nested section such as RunConfig.trainer
        if nested is not None:
            for name, hf in declared(nested, (*path, f.name)).items():
                if name in found:
                    raise TypeError(f"hot field {name!r} is declared twice: {found[name].path} and {hf.path}")
                found[name] = hf
        elif "hot" in f.metadata:
            found[f.name] = HotField(f.name, f.metadata["hot"], (*path, f.name), f.metadata.get("section"))
    return found
