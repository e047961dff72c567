"""The run configuration's dataclasses: one per component (generator, trainer, loop, reference) and RunConfig.

Each validates itself in ``__post_init__`` with a message naming the field, the value and the fix. Fields a
run may change while it trains are declared with ``hot(...)`` (see ``forge_nb.config._hot``). The
package's ``__init__`` re-exports them with the YAML reader and ``apply_overrides``.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from forge_nb.config._hot import SamplingConfig, TaskKnobs, hot
from forge_nb.config._rollout import RolloutConfig
from forge_nb.config.trainer_sections import (
    RUN_OWNED,
    VLLM_MAX_LORA_RANK,
    LoraConfig,
    OptimizerConfig,
    TrainingConfig,
    read_section,
)
from forge_nb.models import TinyModelConfig
from forge_nb.system.hosts.cluster import one_host

_IMPORT_PATH = re.compile(r"[A-Za-z_][\w.]*:[A-Za-z_][\w.]*")


def _positive_int(obj: Any, *names: str, minimum: int = 1) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ValueError(f"{type(obj).__name__}.{name}={value!r}: must be an integer >= {minimum}")


def _hosts(obj: Any) -> None:
    hosts = obj.hosts
    if not one_host(hosts):
        raise ValueError(f"{type(obj).__name__}.hosts={hosts!r}: a replica runs on one host: None or 1, or the "
                         "name of one of the job's host meshes (or 'kernel')")


def greedy_check(group_size: int, temperature: float) -> None:
    """Temperature 0 (greedy) and groups of one answer go together; a ValueError naming the fix otherwise."""
    if temperature == 0 and group_size > 1:
        raise ValueError(f"temperature=0 with group_size={group_size}: temperature 0 is greedy sampling, so the "
                         f"{group_size} answers of a group would be the same answer, with advantage 0 (nothing "
                         "to learn). Use a temperature > 0 (0.3 samples near-greedily), or spawn the run with "
                         "group_size=1 to sample greedily")
    if group_size < 2 and temperature != 0:
        raise ValueError(f"RunConfig.group_size={group_size}: GRPO compares a group of answers to one prompt; use "
                         f">= 2 (group_size=1 goes with greedy sampling, temperature 0, not temperature={temperature})")


@dataclass(kw_only=True)
class GeneratorConfig:
    """The vLLM generator service (``Generator`` / ``Policy``)."""

    num_replicas: int = 1
    procs: int = 1
    with_gpus: bool = False
    hosts: int | str | None = None
    """Where replicas run when a monarch job is in use (``forge_nb.use_job``): None or 1 (a host placement
    picks; replicas spread), the name of one of the job's host meshes, or "kernel"."""
    engine_args: dict[str, Any] = field(default_factory=dict)
    """vLLM engine arguments; ``model`` defaults to the run's model."""
    sampling_params: dict[str, Any] = field(default_factory=lambda: {"temperature": 1.0, "top_p": 1.0},
                                            metadata={"view": SamplingConfig})
    """vLLM sampling parameters; ``n`` and ``max_tokens`` default to the run's group size and max_res_tokens.
    Its hot keys (temperature, top_p, max_tokens) are declared and checked by ``SamplingConfig``."""

    def __post_init__(self) -> None:
        _positive_int(self, "num_replicas", "procs")
        _hosts(self)
        try:
            SamplingConfig.of(self.sampling_params)
        except ValueError as e:
            raise ValueError(f"GeneratorConfig.sampling_params: {e}") from None


@dataclass(kw_only=True)
class TrainerConfig:
    """The trainer actor (``RLTrainer``), its loss, and its sections as the trainer reads them.

    ``optimizer`` and ``training`` are the trainer's own section dataclasses (``forge_nb.config.trainer_sections``),
    with their defaults (torchtitan's, as under TorchForge), or their fields as dicts: ``TrainerConfig(optimizer={
    "lr": 7e-4, "weight_decay": 0.0, "beta2": 0.999})``. A dotted override names the same path
    (``trainer.optimizer.lr=1e-5``); ``run.set(lr=...)`` takes the field's own name."""

    procs: int = 1
    with_gpus: bool = False
    hosts: int | str | None = None
    """As ``GeneratorConfig.hosts``."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """The optimizer (AdamW; lr 1e-5, weight_decay 0.1, betas 0.9 and 0.95); ``lr`` and ``weight_decay`` are hot."""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    """Gradient clipping (``max_norm``, hot), compute dtype, engine, gradient accumulation; the run sets the
    section's seed, temperature and steps from its own fields (``RUN_OWNED``), so they stay unset here."""
    loss: str | Callable[..., Any] = "grpo"
    """A name from ``forge_nb.rl.LOSSES`` (grpo, dr_grpo, dapo, cispo, gspo, sapo), ``"package.module:Name"``
    (a loss class built with ``loss_config``, or a callable), or a loss object such as the skill card's
    ``CustomLoss()``. A run directory records an object as its class's path, which ``resume`` imports."""
    loss_config: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the loss, e.g. {"beta": 0.04, "clip_eps": 0.2}."""
    lora: LoraConfig | None = None
    """Train LoRA adapters instead of the whole model: a ``forge_nb.config.LoraConfig`` or its fields as a dict
    (``{"rank": 8, "alpha": 16}``; YAML ``trainer.lora``). None: every weight trains."""
    extra: dict[str, Any] = field(default_factory=dict)
    """RLTrainer's other sections in torchforge's shape (lr_scheduler, checkpoint, parallelism, and torchtitan's
    own, which it ignores), merged over what the run passes by ``actor_sections``."""

    def __post_init__(self) -> None:
        _positive_int(self, "procs")
        _hosts(self)
        for name in ("optimizer", "training", "lora"):
            if name in self.extra:
                raise ValueError(f"TrainerConfig.extra[{name!r}]: set it as TrainerConfig.{name} (the field), not in "
                                 "extra")
        try:
            self.optimizer = read_section(OptimizerConfig, "optimizer", self.optimizer)
            self.training = read_section(TrainingConfig, "training", self.training)
            if self.lora is not None:
                self.lora = read_section(LoraConfig, "lora", self.lora)
        except ValueError as e:
            raise ValueError(f"TrainerConfig.{e}") from None
        unset = TrainingConfig()
        for name, owner in RUN_OWNED["training"].items():
            if (value := getattr(self.training, name)) != getattr(unset, name):
                raise ValueError(f"TrainerConfig.training.{name}={value!r}: the run sets it from its {owner}; set that "
                                 f"instead and leave training.{name} out")
        from forge_nb.rl import LOSSES

        if callable(self.loss):
            if self.loss_config:
                raise ValueError(f"TrainerConfig.loss_config={self.loss_config!r} with a loss object: configure the "
                                 "object through its constructor and set loss_config={}")
            return
        if isinstance(self.loss, str) and _IMPORT_PATH.fullmatch(self.loss):
            return
        if self.loss not in LOSSES:
            raise ValueError(f"TrainerConfig.loss={self.loss!r}: unknown loss; choose one of {sorted(LOSSES)}, "
                             "a 'package.module:Name' path, or pass a loss object")

    def actor_sections(self, base: dict[str, Any] | None = None) -> dict[str, Any]:
        """RLTrainer's keyword sections in torchforge's shape: ``optimizer`` and ``training`` as held here, with
        ``base``'s (the run's own settings, e.g. {"training": {"seed": 0}}) over the training section's
        run-owned fields, then ``extra`` over ``base``'s other sections. RLTrainer(trainer=...) calls it in its
        setup."""
        sections: dict[str, Any] = {k: dict(v) if isinstance(v, dict) else v for k, v in (base or {}).items()}
        sections["optimizer"] = dataclasses.asdict(self.optimizer)
        sections["training"] = dataclasses.asdict(self.training) | sections.get("training", {})
        for key, value in self.extra.items():
            sections[key] = {**sections.get(key, {}), **value} if isinstance(value, dict) else value
        if self.lora is not None:
            sections["lora"] = dataclasses.asdict(self.lora)
        return sections


@dataclass(kw_only=True)
class LoopConfig:
    """How rollouts and training interleave."""

    mode: str = "async"
    """"async": rollouts run ahead, bounded by max_policy_age; "sync": collect, train, update in lockstep."""
    rollout_loops: int = 2
    """Concurrent rollout loops (seeds' rollout_threads); one per generator replica is a good start."""
    sync_interval: int = 1
    """Load the trainer's weights into the generators every N steps (the skill card's
    ``training.sync_interval``); in between they keep generating with the version they hold, and that version
    is pushed when the run parks or evaluates. Async mode with ``max_policy_age >= N``; sync mode and an on-policy
    run (``max_policy_age=0``) load every step's."""
    max_steps: int | None = None
    """Stop after this many training steps (None: until stopped)."""
    warmup_steps: int = 0
    """Linear learning-rate warmup over the first steps."""
    eval_every: int = 0
    """Evaluate on held-out prompts every N steps (0: never)."""
    eval_prompts: int = 16
    eval_k: int = 1
    """Answers per held-out prompt at each evaluation: 1 is greedy (``eval/reward``); k > 1 samples k at the run's
    temperature and reports avg@k and pass@1, 2, 4 .. k (``forge_nb.controller.evaluate``)."""
    checkpoint_every: int = 0
    """Save a trainer checkpoint and a buffer snapshot every N steps (0: never)."""
    starved_after_s: float = 60.0
    """Record a "starved" event when the trainer waits this long for a batch."""

    def __post_init__(self) -> None:
        if self.mode not in ("async", "sync"):
            raise ValueError(f"LoopConfig.mode={self.mode!r}: must be 'async' or 'sync'")
        _positive_int(self, "rollout_loops", "eval_prompts", "eval_k", "sync_interval")
        _positive_int(self, "warmup_steps", "eval_every", "checkpoint_every", minimum=0)
        if self.max_steps is not None:
            _positive_int(self, "max_steps")


REFERENCE_SECTIONS = frozenset({"training", "parallelism", "checkpoint", "compile", "comm", "job",
                                "activation_checkpoint"})
"""The keyword arguments of ``ReferenceModel`` besides ``model`` and ``pad_id``."""


@dataclass(kw_only=True)
class ReferenceConfig:
    """The frozen ``ReferenceModel`` service, spawned when ``RunConfig.use_reference`` is set."""

    num_replicas: int = 1
    procs: int = 1
    with_gpus: bool | None = None
    """None: placed like the trainer."""
    hosts: int | str | None = None
    """None: on the trainer's ``hosts``."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Passed to ``ReferenceModel`` unchanged: its ``training`` section (dtype, engine, temperature) and
    torchforge's ref_model sections it accepts."""

    def __post_init__(self) -> None:
        _positive_int(self, "num_replicas", "procs")
        _hosts(self)
        unknown = set(self.extra) - REFERENCE_SECTIONS
        if unknown:
            raise ValueError(f"ReferenceConfig.extra has unknown section(s) {sorted(unknown)}; "
                             f"ReferenceModel takes {sorted(REFERENCE_SECTIONS)}")


@dataclass(kw_only=True)
class RunConfig:
    """Everything one experiment needs. Build one with a recipe or :func:`from_yaml`."""

    name: str = "run"
    model: str = "tiny"
    """A hub id, a local model folder, or "tiny" to build a small Qwen3 locally (see ``tiny``)."""
    tiny: TinyModelConfig | None = None
    task: str = "toy"
    """"toy" (CPU quickstart), "gsm8k", or "module:function" returning a task object."""
    task_args: dict[str, Any] = field(default_factory=dict, metadata={"view": TaskKnobs})
    """Keyword arguments of the task; its hot keys (difficulty) are declared by ``TaskKnobs``."""
    group_size: int = 8
    """Answers sampled per prompt, compared with each other (GRPO). 1 only with greedy sampling
    (temperature 0): a group of one has advantage 0, so such a run trains through the loss's other terms
    only, and shows how the greedy policy fares."""
    max_req_tokens: int = 16
    max_res_tokens: int = 8
    batch_size: int = 16
    """Episodes per training step (per data-parallel rank)."""
    max_policy_age: int = hot(1, "run")
    """An episode from version v is trainable while current - v <= max_policy_age (0: on-policy)."""
    advantage: str = "grpo"
    use_reference: bool = False
    """Score responses with a frozen ReferenceModel for the KL penalty (needed when beta > 0)."""
    reward_timeout_s: float = 60.0
    """An async reward function that has not returned after this long quarantines its episode."""
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """What happens to finished groups before they train: dynamic sampling, overlong answers."""
    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    """Where and how the ReferenceModel runs (used only with use_reference)."""
    exporters: dict[str, dict[str, Any]] = field(default_factory=dict)
    """Metric exporters to attach at spawn, by kind with their options: {"wandb": {"project": "grpo"}}
    (see ``forge_nb.metrics.exporters``)."""
    run_dir: str | None = None
    """Where config, metrics, events, checkpoints and the buffer snapshot go (default runs/<name>-<time>)."""
    seed: int = 0

    def __post_init__(self) -> None:
        _positive_int(self, "group_size", "max_req_tokens", "max_res_tokens", "batch_size")
        _positive_int(self, "max_policy_age", minimum=0)
        if self.loop.mode == "async" and 1 <= self.max_policy_age < self.loop.sync_interval:
            raise ValueError(f"loop.sync_interval={self.loop.sync_interval} with max_policy_age={self.max_policy_age}: "
                             f"the generators keep each version for {self.loop.sync_interval} steps, so their "
                             "episodes would be evicted as too old; set max_policy_age >= sync_interval")
        if isinstance(self.reward_timeout_s, bool) or not isinstance(self.reward_timeout_s, int | float) \
                or not self.reward_timeout_s > 0:
            raise ValueError(f"RunConfig.reward_timeout_s={self.reward_timeout_s!r}: must be a number of seconds > 0")
        max_tokens = self.sampling().max_tokens
        if max_tokens > self.max_res_tokens:
            raise ValueError(f"generator.sampling_params max_tokens={max_tokens} > max_res_tokens="
                             f"{self.max_res_tokens}: longer responses would be cut in training; lower it or "
                             "raise max_res_tokens")
        greedy_check(self.group_size, self.sampling().temperature)
        self.rollout.check_budget(max_tokens)
        from forge_nb.rl import ADVANTAGE_METHODS

        if self.advantage not in ADVANTAGE_METHODS:
            raise ValueError(f"RunConfig.advantage={self.advantage!r}: choose one of {sorted(ADVANTAGE_METHODS)}")
        from forge_nb.metrics.exporters import EXPORTERS

        for kind, options in self.exporters.items():
            if kind not in EXPORTERS or not isinstance(options, dict):
                raise ValueError(f"RunConfig.exporters[{kind!r}]={options!r}: use a kind of {list(EXPORTERS)} "
                                 "mapped to its options, e.g. {'wandb': {'project': 'grpo'}}")
        if self.trainer.lora is not None:
            _check_lora(self)
        from forge_nb.rl import LOSSES, make_loss

        loss: Any = self.trainer.loss  # a path or an object is checked where it is imported: the trainer
        if isinstance(loss, str) and loss in LOSSES:
            try:
                loss = make_loss(loss, **self.trainer.loss_config)
            except (TypeError, ValueError) as e:
                raise ValueError(f"trainer.loss_config={self.trainer.loss_config!r} for loss "
                                 f"{self.trainer.loss!r}: {e}") from None
        beta = getattr(loss, "beta", 0.0)
        if beta and not self.use_reference and self.trainer.lora is None:  # a LoRA run's base is its reference
            raise ValueError(f"the {self.trainer.loss!r} loss has beta={beta}, which needs reference logprobs: "
                             "set use_reference=True (spawns a ReferenceModel) or trainer.loss_config.beta=0 (or "
                             "train LoRA adapters, trainer.lora: the base model in the trainer is the reference)")

    def sampling(self) -> SamplingConfig:
        """The generator's hot sampling values, with the run's defaults filled in (max_tokens = max_res_tokens)."""
        sampling = SamplingConfig.of(self.generator.sampling_params)
        if sampling.max_tokens is None:
            sampling.max_tokens = self.max_res_tokens
        return sampling

    def engine_args(self) -> dict[str, Any]:
        """The generators' vLLM engine arguments: a context of a request, a response and a little slack, and the
        run's seed, under ``generator.engine_args``."""
        return {"max_model_len": self.max_req_tokens + self.max_res_tokens + 8, "seed": self.seed,
                **self.generator.engine_args}

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        loss = self.trainer.loss
        if callable(loss):  # a loss object is data only as its class's import path
            cls = loss if isinstance(loss, type) else type(loss)
            data["trainer"]["loss"] = f"{cls.__module__}:{cls.__qualname__}"
        return data


def _check_lora(cfg: RunConfig) -> None:
    """A LoRA run's generators can serve its adapters: LoRA left on in their engine, room for the rank."""
    lora, engine = cfg.trainer.lora, cfg.generator.engine_args
    if engine.get("enable_lora") is False:
        raise ValueError("generator.engine_args.enable_lora=False with trainer.lora: the generators serve each version "
                         "as an adapter; leave enable_lora unset")
    limit = engine.get("max_lora_rank", VLLM_MAX_LORA_RANK)
    if lora.rank > limit:
        raise ValueError(f"trainer.lora.rank={lora.rank} is above the generators' max_lora_rank={limit}: lower the "
                         "rank, or leave generator.engine_args.max_lora_rank unset (forge_nb sizes it to the rank)")


def from_dict(data: dict[str, Any]) -> RunConfig:
    """A RunConfig from plain data (the inverse of ``to_dict``); unknown keys are errors."""
    return _build(RunConfig, data, "")


#: Trainer settings that live in a section, by name. A run directory written by an older forge_nb holds them as flat
#: ``trainer`` keys (``trainer.lr``): :func:`from_saved` reads them into their sections; anywhere else the error
#: names the section (``trainer.lr is trainer.optimizer.lr``).
SECTION_OF = {"lr": "optimizer", "weight_decay": "optimizer", "beta2": "optimizer", "max_norm": "training"}


def from_saved(data: dict[str, Any]) -> RunConfig:
    """:func:`from_dict` for a run directory's ``config.json``, including one whose trainer settings are flat
    keys (``"trainer": {"lr": ...}``) or sit in ``trainer.extra``: they are read into their sections, without
    the training section's run-owned values (the run passes its own, which such a file copied there)."""
    if "trainer" not in data:
        return from_dict(data)
    trainer = dict(data["trainer"])
    extra = dict(trainer.get("extra") or {})
    for where in ("optimizer", "training"):
        if where in extra:
            trainer[where] = {**extra.pop(where), **trainer.get(where, {})}
    for name, where in SECTION_OF.items():
        if name in trainer:
            trainer[where] = {**trainer.get(where, {}), name: trainer.pop(name)}
    if "training" in trainer:
        trainer["training"] = {k: v for k, v in trainer["training"].items() if k not in RUN_OWNED["training"]}
    return from_dict({**data, "trainer": {**trainer, "extra": extra}})


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(known)
    if unknown:
        moved = [f"{where}{k} is {where}{SECTION_OF[k]}.{k}" for k in sorted(unknown)
                 if cls is TrainerConfig and k in SECTION_OF]
        raise ValueError(f"unknown key(s) {sorted(where + k for k in unknown)}; "
                         + (f"{'; '.join(moved)}" if moved else f"known here: {sorted(known)}"))
    kwargs = {}
    for key, value in data.items():
        nested = {"generator": GeneratorConfig, "trainer": TrainerConfig, "loop": LoopConfig, "rollout": RolloutConfig,
                  "reference": ReferenceConfig, "tiny": TinyModelConfig}.get(key) if cls is RunConfig else None
        kwargs[key] = _build(nested, value, f"{where}{key}.") if nested and isinstance(value, dict) else value
    return cls(**kwargs)
