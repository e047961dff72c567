"""RLTrainer's sections, one dataclass each: the one schema the config layer and the trainer both read.

The trainer takes torchforge's sections (``optimizer``, ``training``, ``lr_scheduler``, ``checkpoint``,
``parallelism``) as keyword arguments, or builds them from a ``TrainerConfig``; the reference model takes
``training``. :func:`read_section` turns a dict in forge_nb's or torchforge's shape into its dataclass and
validates it there, once. The load-time key tables (``TRAINER_SECTION_KEYS``) are derived from these
classes, so a YAML typo fails when the file loads, with the same names the trainer would accept.

torchforge's YAML (``apps/grpo/qwen3_1_7b.yaml``) passes torchtitan job sections to the trainer. Keys that
mean the same thing here are read (``data_parallel_shard_degree`` -> ``dp_shard``); keys that only steer
torchtitan's own engine (``seq_len``, ``gc_freq``, ...) are accepted and ignored, so a seed config loads
unchanged; anything else is a ValueError that lists the known names. torch is imported only where a value
needs it (the optimizer's class, the compute dtype), not by importing this module.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from forge_nb.config._hot import hot

__all__ = [
    "DECAY_TYPES",
    "DTYPES",
    "ENGINES",
    "MUST_BE_ONE",
    "RUN_OWNED",
    "SECTIONS",
    "SECTION_NAMES",
    "SEED_IGNORED",
    "TRAINER_SECTION_KEYS",
    "TRAINER_SEED_SECTIONS",
    "CheckpointConfig",
    "LORA_TARGETS",
    "LRSchedulerConfig",
    "LoraConfig",
    "OptimizerConfig",
    "ParallelismConfig",
    "TrainingConfig",
    "VLLM_MAX_LORA_RANK",
    "read_section",
    "section_keys",
]

DTYPES = ("bfloat16", "float16", "float32")
"""The trainer's ``training.dtype`` values (torch dtypes of the same names)."""
ENGINES = ("auto", "torchtitan", "transformers")
"""What trains the policy: torchtitan where it can, else transformers ("auto"), or either by name."""

#: Keys of torchforge/torchtitan sections that steer torchtitan's engine only: accepted and ignored.
SEED_IGNORED: dict[str, frozenset[str]] = {
    "optimizer": frozenset({"implementation", "early_step_in_backward"}),
    "training": frozenset({
        "seq_len", "gc_freq", "gc_debug", "global_batch_size", "mixed_precision_param",
        "mixed_precision_reduce", "enable_cpu_offload", "dataset", "dataset_path", "deterministic",
    }),
    "checkpoint": frozenset({
        "enable", "initial_load_path", "initial_load_in_hf", "last_save_in_hf", "async_mode",
        "initial_load_model_only", "export_dtype", "exclude_from_loading", "last_save_model_only",
    }),
    "parallelism": frozenset({"disable_loss_parallel", "enable_async_tensor_parallel", "fsdp_reshard_after_forward"}),
}
#: What a run decides for the trainer's sections, with the RunConfig field (a dotted path) that holds it: a
#: RunConfig's ``trainer.training`` leaves these at their defaults (``TrainerConfig`` refuses others), the run
#: passes its own values at spawn, and a YAML's ``trainer.training.steps`` sets ``loop.max_steps``.
RUN_OWNED: dict[str, dict[str, str]] = {
    "training": {"seed": "seed", "temperature": "generator.sampling_params.temperature", "steps": "loop.max_steps"},
}
_ALIASES = {"parallelism": {"data_parallel_shard_degree": "dp_shard"}, "lr_scheduler": {"lr_min": "min_lr_factor"}}
#: Degrees of parallelism forge_nb's trainer does not implement (it is FSDP only): accepted at 1.
MUST_BE_ONE = frozenset({
    "data_parallel_replicate_degree", "tensor_parallel_degree", "pipeline_parallel_degree",
    "context_parallel_degree", "expert_parallel_degree",
})


# Each section checks its values in __post_init__ with these three, so every bad value is reported the same
# way: "<section>.<key>=<value>: what it must be (a hint)". Booleans are neither numbers nor counts here.


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _positive(owner: str, name: str, value: float, *, allow_zero: bool = False, hint: str = "") -> None:
    if not _is_number(value) or not (value >= 0 if allow_zero else value > 0):
        raise ValueError(f"{owner}.{name}={value!r}: must be {'a number >= 0' if allow_zero else 'a positive number'}"
                         + (f" ({hint})" if hint else ""))


def _count(owner: str, name: str, value: Any, least: int, *, optional: bool = False, hint: str = "") -> None:
    """An int >= ``least`` (or None where ``optional``)."""
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"{owner}.{name}={value!r}: an int >= {least}" + (", or None" if optional else "")
                         + (f" ({hint})" if hint else ""))


def _fraction(owner: str, name: str, value: Any, *, below_one: bool = False, optional: bool = False,
              what: str = "a number", hint: str = "") -> None:
    """A number in [0, 1] (or [0, 1) where ``below_one``; or None where ``optional``)."""
    if value is None and optional:
        return
    if not _is_number(value) or not (0 <= value < 1 if below_one else 0 <= value <= 1):
        raise ValueError(f"{owner}.{name}={value!r}: {what} in [0, 1{')' if below_one else ']'}"
                         + (", or None" if optional else "") + (f" ({hint})" if hint else ""))


@dataclass(kw_only=True, slots=True)
class OptimizerConfig:
    """torchtitan's ``optimizer`` job section, which TorchForge's trainer reads, with torchtitan's defaults
    (betas 0.9 and 0.95, eps 1e-8, weight_decay 0.1): the documents' ``optimizer={"name": "AdamW", "lr": 1e-5}``
    and a torchforge YAML that names only ``lr`` and ``eps`` train here as under TorchForge. The one exception
    is ``lr``, torchtitan's 8e-4 being a pre-training rate: every torchforge file sets it. A RunConfig holds
    this section as it is (``TrainerConfig.optimizer``), with these defaults; forge_nb's recipes write the values
    they were tuned with (weight_decay 0, beta2 0.999). ``lr`` and ``weight_decay`` may change while a run trains
    (``run.set(lr=...)``)."""

    name: str = "AdamW"
    """A class of ``torch.optim`` (AdamW, Adam, SGD)."""
    lr: float = hot(1e-5, "trainer", section="optimizer")
    eps: float = 1e-8
    weight_decay: float = hot(0.1, "trainer", section="optimizer")
    beta1: float = 0.9
    beta2: float = 0.95

    def __post_init__(self) -> None:
        if self.name not in ("AdamW", "Adam", "SGD"):  # the usual ones need no torch to be known
            import torch

            if not isinstance(getattr(torch.optim, self.name, None), type):
                raise ValueError(f"optimizer.name={self.name!r}: not a torch.optim class; use 'AdamW'")
        _positive("optimizer", "lr", self.lr, hint="e.g. 1e-5")
        _positive("optimizer", "eps", self.eps)
        _positive("optimizer", "weight_decay", self.weight_decay, allow_zero=True, hint="0 turns it off")
        for name in ("beta1", "beta2"):
            _fraction("optimizer", name, getattr(self, name), below_one=True, what="must be a number", hint="e.g. 0.95")

    def build(self, params: Any) -> Any:
        """The ``torch.optim`` optimizer over ``params``. Adam(W) on plain CPU tensors uses torch's fused
        kernel: its default there is a Python loop over the parameters (1.0 ms a step for the quickstart's
        model, 0.27 fused); on GPUs torch's own default (foreach) stands, and so does anything sharded."""
        import torch

        params = list(params)
        cls = getattr(torch.optim, self.name)
        kwargs: dict[str, Any] = {"lr": self.lr, "weight_decay": self.weight_decay}
        if self.name.startswith("Adam"):
            kwargs.update(eps=self.eps, betas=(self.beta1, self.beta2))
            if params and all(type(p) is torch.nn.Parameter and p.device.type == "cpu" for p in params):
                kwargs["fused"] = True
        return cls(params, **kwargs)


@dataclass(kw_only=True, slots=True)
class TrainingConfig:
    """torchtitan's ``training`` job section as the trainer reads it. In a RunConfig (``TrainerConfig.training``)
    the run decides ``seed``, ``temperature`` and ``steps`` (``RUN_OWNED``); the rest is the trainer's own.
    ``max_norm`` may change while a run trains."""

    max_norm: float = hot(1.0, "trainer", section="training")
    """Gradient clipping norm; 0 disables clipping (the norm is still measured and reported)."""
    dtype: str = "float32"
    """Compute dtype (autocast) and the dtype of pushed weights; parameters and optimizer stay float32."""
    local_batch_size: int | None = None
    """Episodes per rank and step, checked when given; None accepts any batch the ranks divide evenly."""
    engine: str = "auto"
    """"auto" (torchtitan where it can train, else transformers), "torchtitan" or "transformers"."""
    temperature: float = 1.0
    """Sampling temperature of the generator: logprobs are computed for logits / temperature (see
    ``logits_temperature`` for 0, greedy sampling)."""
    gradient_accumulation_steps: int = 1
    """Micro-batches per optimizer step: each rank's rows are split into this many, whose gradients add up."""
    steps: int = 10000
    """The run's length in optimizer steps, as torchtitan counts it: the learning rate's decay ends there
    (``lr_scheduler``); training goes on past it at the schedule's last rate."""
    seed: int = 0
    dist_timeout_s: float = 300.0
    """How long a collective waits for a missing rank before it raises."""

    def __post_init__(self) -> None:
        _positive("training", "max_norm", self.max_norm, allow_zero=True, hint="0 turns it off")
        _positive("training", "temperature", self.temperature, allow_zero=True)
        if self.dtype not in DTYPES:
            raise ValueError(f"training.dtype={self.dtype!r}: choose one of {sorted(DTYPES)}")
        if self.engine not in ENGINES:
            raise ValueError(f"training.engine={self.engine!r}: choose one of {list(ENGINES)}")
        for name in ("gradient_accumulation_steps", "steps"):
            _count("training", name, getattr(self, name), 1)
        _count("training", "local_batch_size", self.local_batch_size, 1, optional=True)

    @property
    def logits_temperature(self) -> float:
        """What logits are divided by before their logprobs: the sampling temperature, but 1 at temperature 0.
        Greedy sampling has no distribution of its own (it is the limit of dividing by a vanishing
        temperature: logprobs 0 or -inf), so the logprobs of greedy answers are those of the raw logits."""
        return self.temperature or 1.0

    @property
    def torch_dtype(self) -> Any:
        """``torch.float32`` / ``bfloat16`` / ``float16``."""
        import torch

        return getattr(torch, self.dtype)


DECAY_TYPES = ("linear", "sqrt", "cosine")


@dataclass(kw_only=True, slots=True)
class LRSchedulerConfig:
    """torchtitan's learning-rate schedule (its ``lr_scheduler`` section, as torchtitan 0.3 computes it), with
    its defaults: TorchForge's trainer steps it after every optimizer step, so the documents'
    ``RLTrainer(optimizer={"lr": 1e-5})`` warms up over 200 steps, then decays linearly towards 0 at
    ``training.steps`` (10000). A warmup, a stable rate, then the decay over the last ``decay_ratio`` of the
    steps (all of those after the warmup when None; none when 0). An RL run may train past ``training.steps``
    (torchtitan's loop stops there): it goes on at the last step's rate (torchtitan's would turn negative).
    RunConfig's runs pass ``decay_ratio=0`` and their own warmup (``LoopConfig.warmup_steps``): a constant rate
    after the warmup, what their recipes were tuned with."""

    warmup_steps: int = 200
    """Linear warmup from lr / warmup_steps to lr over the first optimizer steps."""
    decay_ratio: float | None = None
    """The share of ``training.steps`` the decay takes, at their end; None: every step after the warmup."""
    decay_type: str = "linear"
    """How the rate falls from lr towards ``min_lr_factor`` x lr: "linear", "sqrt" (1 - sqrt(progress)) or "cosine"."""
    min_lr_factor: float = 0.0
    """The rate's floor as a share of lr (``lr_min`` in torchtitan before 0.3, also accepted)."""
    total_steps: int | None = None
    """The schedule's length in optimizer steps; None: ``training.steps``."""

    def __post_init__(self) -> None:
        _count("lr_scheduler", "warmup_steps", self.warmup_steps, 0)
        _fraction("lr_scheduler", "decay_ratio", self.decay_ratio, optional=True, hint="None: decay after the warmup")
        if self.decay_type not in DECAY_TYPES:
            raise ValueError(f"lr_scheduler.decay_type={self.decay_type!r}: choose one of {list(DECAY_TYPES)}")
        _fraction("lr_scheduler", "min_lr_factor", self.min_lr_factor, what="a share of the lr")
        _count("lr_scheduler", "total_steps", self.total_steps, 1, optional=True, hint="None: training.steps")

    def factor(self, step: int, steps: int) -> float:
        """What lr is multiplied by for optimizer step ``step`` (0: the first) of a run of ``steps``
        (``training.steps``, unless ``total_steps`` says); ``tests/test_lr_schedule.py`` checks it against
        torchtitan's own scheduler."""
        steps = self.total_steps or steps
        warmup = min(self.warmup_steps, steps)
        decay = steps - warmup if self.decay_ratio is None else min(round(steps * self.decay_ratio), steps - warmup)
        decay_from = steps + 1 - decay  # torchtitan's warmup and stable steps, with its virtual last step
        step = min(step, steps - 1)
        if step < warmup:
            return (step + 1) / warmup
        if step < decay_from:
            return 1.0
        progress = (step + 1 - decay_from) / decay
        falls = {"linear": progress, "sqrt": math.sqrt(progress),
                 "cosine": 0.5 * (1.0 - math.cos(math.pi * progress))}[self.decay_type]
        return self.min_lr_factor + (1.0 - self.min_lr_factor) * (1.0 - falls)


@dataclass(kw_only=True, slots=True)
class CheckpointConfig:
    folder: str | None = None
    """Where checkpoints go (a folder of the run); None disables checkpointing."""
    interval: int = 0
    """Save every ``interval`` optimizer steps; 0 saves only when asked (``save_checkpoint``)."""
    resume: bool = True
    """At setup, load the latest complete checkpoint in ``folder`` when there is one."""
    keep_last: int | None = None
    """Delete all but the newest ``keep_last`` checkpoints after each save; None keeps all."""
    verified: str | None = None
    """A ``step_*`` folder checked against its commit marker just before this trainer starts (``forge_nb.resume``
    does, before it spawns anything): when it is the newest whole checkpoint, the resume loads it without reading
    every byte again. Any other folder is checked as usual."""

    def __post_init__(self) -> None:
        _count("checkpoint", "interval", self.interval, 0, hint="0: only on request")
        if self.interval and self.folder is None:
            raise ValueError(f"checkpoint.interval={self.interval} needs checkpoint.folder; set a run folder")
        _count("checkpoint", "keep_last", self.keep_last, 1, optional=True)


@dataclass(kw_only=True, slots=True)
class ParallelismConfig:
    dp_shard: int = -1
    """FSDP2 degree; forge_nb shards over all procs of the trainer's mesh (-1 or the proc count)."""
    master_port: int | None = None
    """Port of the trainer's process group; None derives one from the actor mesh's id."""
    seed_degrees: dict[str, int] = field(default_factory=dict)
    """torchforge's other parallelism degrees (tensor, pipeline...), as given; only 1 is accepted."""

    def __post_init__(self) -> None:
        if not isinstance(self.dp_shard, int) or (self.dp_shard < 1 and self.dp_shard != -1):
            raise ValueError(f"parallelism.dp_shard={self.dp_shard!r}: -1 (all procs) or the proc count")
        for name, degree in self.seed_degrees.items():
            if degree not in (1, -1):
                raise ValueError(
                    f"parallelism.{name}={degree}: forge_nb's trainer implements FSDP only; set it to 1 "
                    "and use dp_shard (= procs) for data parallelism"
                )

    def check_world(self, world: int) -> None:
        if self.dp_shard not in (-1, world):
            raise ValueError(
                f"parallelism.dp_shard={self.dp_shard} but the trainer runs on {world} proc(s); "
                f"set dp_shard=-1 or spawn it with procs={self.dp_shard}"
            )


#: The largest adapter rank vLLM serves (its ``max_lora_rank`` choices end there).
VLLM_MAX_LORA_RANK = 512
#: What LoRA adapts unless told otherwise: every linear layer of a Qwen3 (Llama-shaped) block, and the output layer
#: (``lm_head``). Without the output layer the quickstart's tiny model levels off near 0.5 at any rank (even 128, a
#: full-rank update of every block's layers); with it, 0.99 (bench/RESULTS.md). Its adapter is small beside the
#: layer (rank x (hidden + vocab)), and vLLM serves it (its LoRA logits processor).
LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head")


@dataclass(kw_only=True, slots=True)
class LoraConfig:
    """LoRA adapters trained instead of the whole model (peft's ``LoraConfig``: ``r``, ``lora_alpha``,
    ``lora_dropout``, ``target_modules``). Absent: the trainer trains every weight."""

    rank: int = 8
    """The adapters' rank (peft's ``r``)."""
    alpha: float = 16.0
    """The update is scaled by ``alpha / rank`` (peft's ``lora_alpha``)."""
    dropout: float = 0.0
    """Dropout on the adapters' input while training (peft's ``lora_dropout``)."""
    target_modules: tuple[str, ...] = LORA_TARGETS
    """Names of the linear layers that get an adapter (the last part of a module's name, as peft matches)."""

    def __post_init__(self) -> None:
        _count("lora", "rank", self.rank, 1, hint="e.g. 8")
        _positive("lora", "alpha", self.alpha, hint="e.g. 16, twice the rank")
        _fraction("lora", "dropout", self.dropout, below_one=True)
        targets = [self.target_modules] if isinstance(self.target_modules, str) else self.target_modules
        if not isinstance(targets, list | tuple) or not targets or not all(isinstance(t, str) and t for t in targets):
            raise ValueError(f"lora.target_modules={self.target_modules!r}: a list of module names, e.g. "
                             f"{list(LORA_TARGETS)}")
        self.target_modules = tuple(targets)


SECTIONS: dict[str, type] = {"optimizer": OptimizerConfig, "training": TrainingConfig,
                             "lr_scheduler": LRSchedulerConfig, "checkpoint": CheckpointConfig,
                             "parallelism": ParallelismConfig, "lora": LoraConfig}
"""RLTrainer's own sections (its other keyword sections are torchtitan's, accepted and ignored)."""
SECTION_NAMES = tuple(SECTIONS)

TRAINER_SEED_SECTIONS = frozenset({
    "job", "compile", "activation_checkpoint", "comm", "quantize", "memory_estimation", "float8",
    "state_dict_key", "use_dcp", "dcp_path", "debug", "validation",
})
"""torchtitan sections RLTrainer takes as keyword arguments (and ignores: they steer torchtitan's engine)."""


def _fields(cls: type) -> set[str]:
    return {f.name for f in fields(cls)} - {"seed_degrees"}


def section_keys(name: str) -> frozenset[str]:
    """Every key the section ``name`` takes: its fields, torchforge's aliases, and the seed keys it ignores."""
    extra = set(_ALIASES.get(name, {})) | (MUST_BE_ONE if name == "parallelism" else set())
    return frozenset(_fields(SECTIONS[name]) | SEED_IGNORED.get(name, frozenset()) | extra)


def read_section(cls: type, name: str, value: Mapping[str, Any] | Any | None) -> Any:
    """``cls`` from a dict (or an instance of ``cls``); unknown keys raise, seed-only keys are ignored."""
    if value is None:
        return cls()
    if isinstance(value, cls):
        return value
    if not isinstance(value, Mapping):
        raise ValueError(f"{name}={value!r}: pass a dict of {cls.__name__} fields")
    known = _fields(cls)
    kwargs: dict[str, Any] = {}
    seed_degrees: dict[str, int] = {}
    for key, item in value.items():
        key = _ALIASES.get(name, {}).get(key, key)
        if key in known:
            kwargs[key] = item
        elif name == "parallelism" and key in MUST_BE_ONE:
            seed_degrees[key] = item
        elif key not in SEED_IGNORED.get(name, frozenset()):
            raise ValueError(f"{name} has no setting {key!r}; known: {sorted(known)}")
    if seed_degrees:
        kwargs["seed_degrees"] = seed_degrees
    return cls(**kwargs)


TRAINER_SECTION_KEYS: dict[str, frozenset[str]] = {name: section_keys(name) for name in SECTIONS}
"""Every key of each RLTrainer section, for checking YAML when it loads (``forge_nb.config._yaml_trainer``)."""
