"""The YAML reader's trainer-side sections: torchforge's ``trainer`` and ``ref_model``, the skill card's
``training`` and ``grpo``, and forge_nb's own ``reference``. See :mod:`forge_nb.config._yaml`."""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from forge_nb.config._run import REFERENCE_SECTIONS, SECTION_OF, ReferenceConfig, TrainerConfig
from forge_nb.config._sections import Tree, model_name, number, same, section
from forge_nb.config.trainer_sections import (
    DTYPES,
    MUST_BE_ONE,
    RUN_OWNED,
    TRAINER_SECTION_KEYS,
    TRAINER_SEED_SECTIONS,
    LRSchedulerConfig,
    _count,
)


class TrainerSections(Tree):
    """Reads the sections that configure RLTrainer, its loss and the ReferenceModel."""

    def __init__(self) -> None:
        super().__init__()
        self.seq_lens: dict[str, Any] = {}
        """Every prompt + response budget (seq_len) given, by key; checked once max_*_tokens are known."""
        self.dp_size: Any = None
        """replay_buffer.dp_size, checked against the trainer's procs."""
        self.lr_schedule_given = False
        """Whether the file has a ``trainer.lr_scheduler`` section (:meth:`lr_schedule_defaults`)."""

    def _trainer(self, value: Any) -> None:
        own = {f.name for f in fields(TrainerConfig)}
        t = section(value, "trainer", own | {"model"} | set(TRAINER_SECTION_KEYS) | TRAINER_SEED_SECTIONS,
                    refused={k: f"write it in its section, trainer.{where}.{k}" for k, where in SECTION_OF.items()})
        for key, item in t.items():
            where = f"trainer.{key}"
            if key == "extra":  # forge_nb's name for the same sections
                self._trainer_parts(section(item, where, set(TRAINER_SECTION_KEYS) | TRAINER_SEED_SECTIONS), where)
            elif key == "lora":  # TrainerConfig's own field, in a section's shape: its keys checked as one's
                self.put_tree(where, section(item, where, TRAINER_SECTION_KEYS["lora"]), where)
            elif key in own and key not in TRAINER_SECTION_KEYS:
                self.put_tree(where, item, where)
            elif key == "model":  # torchtitan's {name, flavor, hf_assets_path}: name/flavor are read from config.json
                item = section(item, where, ("name", "flavor", "hf_assets_path"))
                if "hf_assets_path" in item:
                    self.put("model", model_name(item["hf_assets_path"], f"{where}.hf_assets_path"), where)
            else:
                self._trainer_parts({key: item}, "trainer")

    def _trainer_parts(self, parts: dict[str, Any], prefix: str) -> None:
        for key, item in parts.items():
            where = f"{prefix}.{key}"
            if key in TRAINER_SECTION_KEYS:
                self._trainer_section(key, section(item, where, TRAINER_SECTION_KEYS[key]), "trainer", where)
            else:  # RLTrainer takes these torchtitan sections as keyword arguments and leaves them to torchtitan
                if key == "compile":
                    same(f"{where}.enable", section(item, where, ("enable",)).get("enable", False), False,
                         "forge_nb does not torch.compile the trainer")
                self.put_tree(f"trainer.extra.{key}", item, where)

    def _trainer_section(self, name: str, items: dict[str, Any], part: str, where: str) -> None:
        """One of RLTrainer's (``part`` "trainer") or ReferenceModel's ("reference") sections: what the run
        decides goes to the run's fields, the trainer's optimizer and training sections to TrainerConfig's,
        the rest to the part's ``extra``."""
        trainer = part == "trainer"
        if where == "trainer.lr_scheduler":
            self.lr_schedule_given = True
        for key, value in items.items():
            dotted = f"{where}.{key}"
            if trainer and key in RUN_OWNED.get(name, {}):  # training.steps -> loop.max_steps ...
                self.put(RUN_OWNED[name][key], number(value, dotted, float if key == "temperature" else int), dotted)
            elif trainer and (name, key) == ("lr_scheduler", "warmup_steps"):
                self.put("loop.warmup_steps", value, dotted)
            elif (name, key) == ("training", "seq_len"):
                self.seq_lens[dotted] = value
            elif (name, key) == ("checkpoint", "initial_load_path"):  # forge_nb starts from the run's model
                self.put("model", model_name(value, dotted), dotted)
            elif (name, key) == ("checkpoint", "initial_load_in_hf"):
                same(dotted, value, True, "forge_nb loads the initial weights from the model's HF checkpoint")
            elif name == "parallelism" and key in MUST_BE_ONE:
                same(dotted, value, 1, "forge_nb's trainer and reference model shard with FSDP only")
            else:
                if (name, key) == ("training", "dtype"):
                    self._dtype(value, dotted)
                held = trainer and name in ("optimizer", "training")  # TrainerConfig's own sections
                self.put(f"{part}.{'' if held else 'extra.'}{name}."
                         f"{'dp_shard' if key == 'data_parallel_shard_degree' else key}", value, dotted)

    def lr_schedule_defaults(self) -> None:
        """Under TorchForge a ``trainer.lr_scheduler`` section without ``decay_ratio`` decays the rate after its
        warmup to the end of ``training.steps`` (the run's ``loop.max_steps``; torchtitan's 10000 when the file
        has none), where RunConfig keeps it constant: such a file's decay_ratio is put at torchtitan's value.
        Called once every section is read: a value set anywhere else in the file wins. (The optimizer section
        needs nothing of the kind: ``TrainerConfig.optimizer`` has torchtitan's defaults.)"""
        unset = object()
        if self.lr_schedule_given and self.get("trainer.extra.lr_scheduler.decay_ratio", unset) is unset:
            self.put("trainer.extra.lr_scheduler.decay_ratio", LRSchedulerConfig().decay_ratio,
                     "trainer.lr_scheduler (torchtitan's default)")

    def _dtype(self, value: Any, key: str) -> None:
        if value not in DTYPES:
            raise ValueError(f"{key}={value!r}: choose one of {list(DTYPES)}")

    def _training(self, value: Any) -> None:
        t = section(value, "training", ("batch_size", "learning_rate", "seq_len", "dtype",
                                        "gradient_accumulation_steps", "entropy_coef", "sync_interval"))
        steps = t.get("gradient_accumulation_steps", 1)
        _count("training", "gradient_accumulation_steps", steps, 1)  # before it multiplies the batch size
        if "batch_size" in t:  # the micro-batch: a step trains batch_size x gradient_accumulation_steps episodes
            batch = t["batch_size"]
            self.put("batch_size", batch * steps if isinstance(batch, int) else batch, "training.batch_size")
        if steps != 1:
            self.put("trainer.training.gradient_accumulation_steps", steps,
                     "training.gradient_accumulation_steps")
        if "entropy_coef" in t:  # the skill card's "add entropy bonus": a field of forge_nb's losses
            self.put("trainer.loss_config.entropy_coef", number(t["entropy_coef"], "training.entropy_coef"),
                     "training.entropy_coef")
        if "sync_interval" in t:  # the skill card's "reduce sync frequency": the loop's (RunConfig checks it)
            self.put("loop.sync_interval", t["sync_interval"], "training.sync_interval")
        if "learning_rate" in t:
            self.put("trainer.optimizer.lr", number(t["learning_rate"], "training.learning_rate"),
                     "training.learning_rate")
        if "seq_len" in t:
            self.seq_lens["training.seq_len"] = t["seq_len"]
        if "dtype" in t:  # one dtype for the run: trainer compute and pushed weights, the generator, the reference
            self._dtype(t["dtype"], "training.dtype")
            for path in ("trainer.training.dtype", "generator.engine_args.dtype",
                         "reference.extra.training.dtype"):
                self.put(path, t["dtype"], "training.dtype")

    def _grpo(self, value: Any) -> None:
        g = section(value, "grpo", ("n_samples", "beta", "clip_low", "clip_high", "temperature"))
        if "n_samples" in g:
            self.put("group_size", g["n_samples"], "grpo.n_samples")
        if "beta" in g:
            self.put("trainer.loss_config.beta", g["beta"], "grpo.beta")
        if "temperature" in g:
            self.put("generator.sampling_params.temperature", g["temperature"], "grpo.temperature")
        if "clip_low" in g or "clip_high" in g:
            self._clip(g.get("clip_low"), g.get("clip_high"))

    def _clip(self, low: Any, high: Any) -> None:
        from forge_nb.rl import LOSSES

        loss = self.get("trainer.loss", "grpo")
        with_clip = sorted(k for k, cls in LOSSES.items() if {"clip_low", "clip_high"} <= {f.name for f in fields(cls)})
        if loss in LOSSES and loss not in with_clip:  # an unknown loss is RunConfig's to report
            raise ValueError(f"grpo.clip_low={low!r}, grpo.clip_high={high!r}: the {loss!r} loss takes no clip "
                             f"range; remove them or set trainer.loss to one of {with_clip}")
        for key, value in (("clip_low", low), ("clip_high", high)):
            if value is not None:
                self.put(f"trainer.loss_config.{key}", value, f"grpo.{key}")

    def _ref_model(self, value: Any) -> None:
        self.put("use_reference", True, "ref_model")
        r = section(value, "ref_model", ("model", "training", "compile", "parallelism", "checkpoint", "with_gpus"))
        for key, item in r.items():
            where = f"ref_model.{key}"
            if key == "with_gpus":
                self.put("reference.with_gpus", item, where)
            elif key == "model":
                item = section(item, where, ("name", "flavor", "hf_assets_path"))
                if "hf_assets_path" in item:  # the reference is the run's initial model
                    self.put("model", model_name(item["hf_assets_path"], f"{where}.hf_assets_path"), where)
            elif key == "compile":
                same(f"{where}.enable", section(item, where, ("enable",)).get("enable", False), False,
                     "forge_nb does not torch.compile the reference model")
                self.put_tree(f"reference.extra.{key}", item, where)
            else:
                items = section(item, where, TRAINER_SECTION_KEYS[key])
                if key == "parallelism" and items.get("data_parallel_shard_degree", 1) != 1:
                    same(f"{where}.data_parallel_shard_degree", items["data_parallel_shard_degree"], 1,
                         "each reference proc holds a whole copy; scale it with services.ref_model.num_replicas")
                self._trainer_section(key, items, "reference", where)

    def _reference(self, value: Any) -> None:
        """forge_nb's own ``reference`` section; its ``extra`` is checked as the ref_model's sections are."""
        for key, item in section(value, "reference", {f.name for f in fields(ReferenceConfig)}).items():
            where = f"reference.{key}"
            if key != "extra":
                self.put(where, item, where)
                continue
            for name, part in section(item, where, REFERENCE_SECTIONS).items():
                sub = f"{where}.{name}"
                if name in TRAINER_SECTION_KEYS:
                    self._trainer_section(name, section(part, sub, TRAINER_SECTION_KEYS[name]), "reference", sub)
                else:
                    self.put_tree(f"reference.extra.{name}", part, sub)
