"""Run configuration: dataclasses validated on creation, dotted overrides, and torchforge-shaped YAML.

A recipe is a Python function returning a :class:`RunConfig` (see ``forge_nb.recipes``). YAML in the
shape of torchforge's ``apps/grpo/*.yaml`` loads into the same dataclasses (:func:`from_yaml`), and
``key=value`` overrides (``trainer.lr=1e-5``) apply to either (:func:`apply_overrides`). Every
mistake a user can make raises ``ValueError`` naming the field, the value and the fix.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from forge_nb.models import TinyModelConfig


def _positive_int(obj: Any, *names: str, minimum: int = 1) -> None:
    for name in names:
        value = getattr(obj, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < minimum:
            raise ValueError(f"{type(obj).__name__}.{name}={value!r}: must be an integer >= {minimum}")


@dataclass(kw_only=True)
class GeneratorConfig:
    """The vLLM generator service (``Generator`` / ``Policy``)."""

    num_replicas: int = 1
    procs: int = 1
    with_gpus: bool = False
    engine_args: dict[str, Any] = field(default_factory=dict)
    """vLLM engine arguments; ``model`` defaults to the run's model."""
    sampling_params: dict[str, Any] = field(default_factory=lambda: {"temperature": 1.0, "top_p": 1.0})
    """vLLM sampling parameters; ``n`` and ``max_tokens`` default to the run's group size and max_res_tokens."""

    def __post_init__(self) -> None:
        _positive_int(self, "num_replicas", "procs")


@dataclass(kw_only=True)
class TrainerConfig:
    """The trainer actor (``RLTrainer``) and its loss."""

    procs: int = 1
    with_gpus: bool = False
    lr: float = 1e-5
    max_norm: float = 1.0
    loss: str = "grpo"
    """A name from ``forge_nb.rl.LOSSES`` (grpo, dr_grpo, dapo, cispo, gspo, sapo)."""
    loss_config: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the loss, e.g. {"beta": 0.04, "clip_eps": 0.2}."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Passed to ``RLTrainer`` unchanged (optimizer, training, checkpoint, parallelism sections)."""

    def __post_init__(self) -> None:
        _positive_int(self, "procs")
        if not (isinstance(self.lr, int | float) and self.lr > 0):
            raise ValueError(f"TrainerConfig.lr={self.lr!r}: must be a positive number (e.g. 1e-5)")
        from forge_nb.rl import LOSSES

        if self.loss not in LOSSES:
            raise ValueError(f"TrainerConfig.loss={self.loss!r}: unknown loss; choose one of {sorted(LOSSES)}")


@dataclass(kw_only=True)
class LoopConfig:
    """How rollouts and training interleave."""

    mode: str = "async"
    """"async": rollouts run ahead, bounded by max_policy_age; "sync": collect, train, update in lockstep."""
    rollout_loops: int = 2
    """Concurrent rollout loops (seeds' rollout_threads); one per generator replica is a good start."""
    max_steps: int | None = None
    """Stop after this many training steps (None: until stopped)."""
    warmup_steps: int = 0
    """Linear learning-rate warmup over the first steps."""
    eval_every: int = 0
    """Evaluate on held-out prompts every N steps (0: never)."""
    eval_prompts: int = 16
    checkpoint_every: int = 0
    """Save a trainer checkpoint and a buffer snapshot every N steps (0: never)."""
    starved_after_s: float = 60.0
    """Record a "starved" event when the trainer waits this long for a batch."""

    def __post_init__(self) -> None:
        if self.mode not in ("async", "sync"):
            raise ValueError(f"LoopConfig.mode={self.mode!r}: must be 'async' or 'sync'")
        _positive_int(self, "rollout_loops", "eval_prompts")
        _positive_int(self, "warmup_steps", "eval_every", "checkpoint_every", minimum=0)
        if self.max_steps is not None:
            _positive_int(self, "max_steps")


@dataclass(kw_only=True)
class RunConfig:
    """Everything one experiment needs. Build one with a recipe or :func:`from_yaml`."""

    name: str = "run"
    model: str = "tiny"
    """A hub id, a local model folder, or "tiny" to build a small Qwen3 locally (see ``tiny``)."""
    tiny: TinyModelConfig | None = None
    task: str = "toy"
    """"toy" (CPU quickstart), "gsm8k", or "module:function" returning a task object."""
    task_args: dict[str, Any] = field(default_factory=dict)
    group_size: int = 8
    max_req_tokens: int = 16
    max_res_tokens: int = 8
    batch_size: int = 16
    """Episodes per training step (per data-parallel rank)."""
    max_policy_age: int = 1
    """An episode from version v is trainable while current - v <= max_policy_age (0: on-policy)."""
    advantage: str = "grpo"
    use_reference: bool = False
    """Score responses with a frozen ReferenceModel for the KL penalty (needed when beta > 0)."""
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    loop: LoopConfig = field(default_factory=LoopConfig)
    run_dir: str | None = None
    """Where config, metrics, events, checkpoints and the buffer snapshot go (default runs/<name>-<time>)."""
    seed: int = 0

    def __post_init__(self) -> None:
        _positive_int(self, "group_size", "max_req_tokens", "max_res_tokens", "batch_size")
        _positive_int(self, "max_policy_age", minimum=0)
        if self.group_size < 2:
            raise ValueError(f"RunConfig.group_size={self.group_size}: GRPO compares a group; use >= 2")
        from forge_nb.rl import ADVANTAGE_METHODS

        if self.advantage not in ADVANTAGE_METHODS:
            raise ValueError(f"RunConfig.advantage={self.advantage!r}: choose one of {sorted(ADVANTAGE_METHODS)}")
        from forge_nb.rl import make_loss

        try:
            loss = make_loss(self.trainer.loss, **self.trainer.loss_config)
        except (TypeError, ValueError) as e:
            raise ValueError(f"trainer.loss_config={self.trainer.loss_config!r} for loss "
                             f"{self.trainer.loss!r}: {e}") from None
        beta = getattr(loss, "beta", 0.0)
        if beta and not self.use_reference:
            raise ValueError(f"the {self.trainer.loss!r} loss has beta={beta}, which needs reference logprobs: "
                             "set use_reference=True (spawns a ReferenceModel) or trainer.loss_config.beta=0")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def from_dict(data: dict[str, Any]) -> RunConfig:
    """A RunConfig from plain data (the inverse of ``to_dict``); unknown keys are errors."""
    return _build(RunConfig, data, "")


def _build(cls: type, data: dict[str, Any], where: str) -> Any:
    known = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(data) - set(known)
    if unknown:
        raise ValueError(f"unknown key(s) {sorted(where + k for k in unknown)}; known here: {sorted(known)}")
    kwargs = {}
    for key, value in data.items():
        nested = {"generator": GeneratorConfig, "trainer": TrainerConfig, "loop": LoopConfig,
                  "tiny": TinyModelConfig}.get(key) if cls is RunConfig else None
        kwargs[key] = _build(nested, value, f"{where}{key}.") if nested and isinstance(value, dict) else value
    return cls(**kwargs)


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


def _split(item: str) -> tuple[str, Any]:
    if "=" not in item:
        raise ValueError(f"override {item!r}: write it as key=value, e.g. trainer.lr=1e-5")
    key, raw = item.split("=", 1)
    value = yaml.safe_load(raw)
    if isinstance(value, str) and re.fullmatch(r"[-+]?\d+(\.\d*)?[eE][-+]?\d+", value.strip()):
        value = float(value)  # YAML 1.1 reads 1e-5 (no dot) as a string
    return key.strip(), value


# -- torchforge-shaped YAML ------------------------------------------------------------------------

_REF = re.compile(r"\$\{([^${}]+)\}")  # an innermost ${...}


def from_yaml(source: str | Path) -> RunConfig:
    """Load a torchforge ``apps/grpo``-style YAML (a path or the text itself) into a RunConfig.

    Recognised: model, group_size, max_req_tokens, max_res_tokens, local_batch_size, off_by_n,
    rollout_threads, policy.{engine_args,sampling_params}, services.policy.{num_replicas,procs,with_gpus},
    trainer.optimizer.lr, trainer.training.{max_norm,steps}, trainer.loss, actors.trainer.{procs,with_gpus},
    replay_buffer.{batch_size,max_policy_age}, and forge_nb's own keys (name, task, loop, ...).
    ``${a.b}`` references and ``${sum:x,y}`` resolve as in OmegaConf.
    """
    text = Path(source).read_text() if _is_path(source) else str(source)
    raw = yaml.safe_load(text) or {}
    if not isinstance(raw, dict):
        raise ValueError("the YAML must be a mapping of keys to values")
    raw = _resolve(raw, raw)
    return from_dict(_translate(raw))


def _is_path(source: str | Path) -> bool:
    return isinstance(source, Path) or ("\n" not in source and source.endswith((".yaml", ".yml")))


def _resolve(node: Any, root: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        return {k: _resolve(v, root) for k, v in node.items()}
    if isinstance(node, list):
        return [_resolve(v, root) for v in node]
    while isinstance(node, str) and "${" in node:
        whole = _REF.fullmatch(node)
        if whole:  # a lone reference keeps its value's type
            return _lookup(whole.group(1), root)
        resolved = _REF.sub(lambda m: str(_lookup(m.group(1), root)), node)
        if resolved == node:
            raise ValueError(f"cannot resolve {node!r}")
        node = resolved
    return node


def _lookup(expr: str, root: dict[str, Any]) -> Any:
    if expr.startswith("sum:"):
        return sum(yaml.safe_load(p) for p in expr[4:].split(","))
    if expr.startswith("oc.env:"):
        import os

        name, _, default = expr[7:].partition(",")
        return os.environ.get(name, default)
    node: Any = root
    for part in expr.split("."):
        if not isinstance(node, dict) or part not in node:
            raise ValueError(f"${{{expr}}}: no such key in the YAML")
        node = node[part]
    return _resolve(node, root)


def _translate(raw: dict[str, Any]) -> dict[str, Any]:
    """torchforge's layout -> RunConfig's; forge_nb's own keys pass through."""
    raw = dict(raw)
    out: dict[str, Any] = {}
    for key in ("name", "model", "tiny", "task", "task_args", "group_size", "max_req_tokens", "max_res_tokens",
                "batch_size", "max_policy_age", "advantage", "use_reference", "run_dir", "seed", "loop"):
        if key in raw:
            out[key] = raw.pop(key)
    if "local_batch_size" in raw:
        out.setdefault("batch_size", raw.pop("local_batch_size"))
    if "off_by_n" in raw:
        out.setdefault("max_policy_age", raw.pop("off_by_n"))
    loop = dict(out.get("loop") or {})
    if "rollout_threads" in raw:
        loop.setdefault("rollout_loops", raw.pop("rollout_threads"))
    policy, services, actors = raw.pop("policy", {}) or {}, raw.pop("services", {}) or {}, raw.pop("actors", {}) or {}
    gen: dict[str, Any] = {k: v for k, v in policy.items() if k in ("engine_args", "sampling_params")}
    gen |= raw.pop("generator", None) or {}  # forge_nb's own section
    for k in ("num_replicas", "procs", "with_gpus"):
        if k in services.get("policy", {}):
            gen[k] = services["policy"][k]
    engine = gen.get("engine_args")
    if engine and engine.get("model") == out.get("model"):
        engine = gen["engine_args"] = {k: v for k, v in engine.items() if k != "model"}  # the run's model
    if gen:
        out["generator"] = gen
    trainer_raw = raw.pop("trainer", {}) or {}
    trainer: dict[str, Any] = {}
    if "lr" in trainer_raw.get("optimizer", {}):
        trainer["lr"] = float(trainer_raw["optimizer"]["lr"])
    if "max_norm" in trainer_raw.get("training", {}):
        trainer["max_norm"] = float(trainer_raw["training"]["max_norm"])
    if trainer_raw.get("training", {}).get("steps"):
        loop.setdefault("max_steps", int(trainer_raw["training"]["steps"]))
    for k in ("lr", "max_norm", "loss", "loss_config", "procs", "with_gpus", "extra"):  # forge_nb's own names
        if k in trainer_raw:
            trainer[k] = trainer_raw[k]
    for k in ("procs", "with_gpus"):
        if k in actors.get("trainer", {}):
            trainer[k] = actors["trainer"][k]
    if trainer:
        out["trainer"] = trainer
    if "ref_model" in raw:
        out.setdefault("use_reference", True)
    buffer = raw.pop("replay_buffer", {}) or {}
    if "batch_size" in buffer:
        out["batch_size"] = buffer["batch_size"]
    if "max_policy_age" in buffer:
        out["max_policy_age"] = buffer["max_policy_age"]
    if loop:
        out["loop"] = loop
    # Sections that configure torchforge machinery forge_nb replaces (provisioner, metric_logging,
    # ref_model, dataset, ...) are accepted and ignored; anything else is a likely typo.
    ignored = {"provisioner", "metric_logging", "ref_model", "dataset", "compute_advantages", "reward_actor",
               "training_threads"}
    unknown = set(raw) - ignored
    if unknown:
        raise ValueError(f"unknown top-level key(s) {sorted(unknown)} in the YAML")
    return out
