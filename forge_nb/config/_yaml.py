"""YAML in torchforge's and the skill card's shapes, read into RunConfig's data with every key honoured or refused.

Three layouts load into the same RunConfig (they may be mixed):

* forge_nb's own: ``RunConfig.to_dict()``'s keys (``generator``, ``trainer.optimizer.lr``, ``loop``...);
* torchforge's ``apps/grpo/*.yaml``: ``local_batch_size`` -> batch_size, ``off_by_n`` -> max_policy_age,
  ``rollout_threads`` -> loop.rollout_loops, ``policy`` -> generator, ``trainer`` (torchtitan job
  sections: ``optimizer`` and ``training`` are TrainerConfig's own, with torchtitan's defaults; the training
  section's seed, temperature and steps set the run's), ``replay_buffer``, ``ref_model``, ``dataset``,
  ``metric_logging``, ``services``, ``actors``;
* the skill card's: ``training`` (batch_size, learning_rate, seq_len, dtype, sync_interval -> loop), ``grpo``
  (n_samples -> group_size, beta/clip_low/clip_high -> the loss, temperature -> sampling), top-level
  ``parallelism`` and ``services.generator/trainer/ref_model``.

A key is honoured when it sets a RunConfig field, or when it is handed unchanged to the component that
reads it: the trainer's other sections (``trainer.extra``, checked here against what RLTrainer takes), the
reference model's (``reference.extra``), vLLM's engine and sampling arguments, an exporter's options.
Keys that state what forge_nb does anyway are accepted at that value and refused at any other: a mesh
name equal to its section's name, one process without GPUs for work forge_nb does in the controller
process (rewards, advantages, the dataset, the replay buffer), parallelism degrees forge_nb does not
implement at 1, a checkpoint or tokenizer path naming the run's model. Anything else is a ValueError
naming the dotted key and what is accepted there, and so are two keys that set one field differently.
``training.seq_len`` is the prompt + response budget: without max_req_tokens / max_res_tokens it is split
in half between them, with them it must be large enough.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import yaml

from forge_nb.config._resolve import resolve
from forge_nb.config._run import RunConfig
from forge_nb.config._sections import AnyKey, model_name, same, section
from forge_nb.config._yaml_trainer import TrainerSections
from forge_nb.config.trainer_sections import MUST_BE_ONE

_TORCHFORGE = ("local_batch_size", "off_by_n", "rollout_threads", "metric_logging", "dataset", "policy",
               "replay_buffer", "ref_model", "services", "actors", "training", "grpo", "parallelism")
_DATA_FILES = (".json", ".jsonl")  # dataset.path endings read as local files (load_dataset("json", ...))
_IN_PROCESS = ("reward_actor", "dataset", "replay_buffer", "compute_advantages")


def load_yaml_text(text: str) -> dict[str, Any]:
    """RunConfig data (for ``from_dict``) from YAML text in any of the layouts above."""
    raw = yaml.safe_load(text) or {}
    if not isinstance(raw, dict):
        raise ValueError("the YAML must be a mapping of keys to values")
    return _Reader().read(resolve(raw, raw))


class _Reader(TrainerSections):
    """Puts each YAML key where it belongs in RunConfig's data."""

    def read(self, raw: dict[str, Any]) -> dict[str, Any]:
        own = {f.name for f in fields(RunConfig)}
        section(raw, "", own | set(_TORCHFORGE))
        for key, value in raw.items():
            if key == "model":
                self.put("model", model_name(value, key), key)
            elif key == "reference":
                self._reference(value)
            elif key in own and key != "trainer":
                self.put_tree(key, value, key)
        self._globals(raw)
        self._trainer(raw.get("trainer"))  # before grpo: clip_low/clip_high need a loss that takes them
        self._training(raw.get("training"))
        self._grpo(raw.get("grpo"))
        self._policy(raw.get("policy"))
        self._parallelism(raw.get("parallelism"))
        self._replay_buffer(raw.get("replay_buffer"))
        if "ref_model" in raw:
            self._ref_model(raw["ref_model"])
        self._placements(raw.get("services"), raw.get("actors"))
        self._metric_logging(raw.get("metric_logging"))
        if "dataset" in raw:
            self._dataset(raw["dataset"])
        self._check_budget()
        self._check_shapes()
        self._no_reference_no_kl(raw)
        self.lr_schedule_defaults()
        return self.out

    def _globals(self, raw: dict[str, Any]) -> None:
        for key, path in (("local_batch_size", "batch_size"), ("off_by_n", "max_policy_age"),
                          ("rollout_threads", "loop.rollout_loops")):
            if key in raw:
                self.put(path, raw[key], key)

    def _policy(self, value: Any) -> None:
        p = section(value, "policy", ("engine_args", "sampling_params"))
        for name in ("engine_args", "sampling_params"):
            for key, item in section(p.get(name), f"policy.{name}", AnyKey()).items():
                if (name, key) == ("engine_args", "model"):  # weights sync needs the trainer's model
                    self.put("model", model_name(item, "policy.engine_args.model"), "policy.engine_args.model")
                else:
                    self.put(f"generator.{name}.{key}", item, f"policy.{name}.{key}")

    def _parallelism(self, value: Any) -> None:
        # The skill card's top-level parallelism says how the model is split. forge_nb's trainer is FSDP only,
        # so tensor/pipeline degrees go to the generator's vLLM engine ("procs: 2 # 2 processes for TP=2") and
        # the shard degree to the trainer's FSDP; the other degrees are accepted at 1.
        p = section(value, "parallelism", MUST_BE_ONE | {"data_parallel_shard_degree"})
        for key, item in p.items():
            where = f"parallelism.{key}"
            if key == "tensor_parallel_degree":
                self.put("generator.engine_args.tensor_parallel_size", item, where)
            elif key == "pipeline_parallel_degree":
                self.put("generator.engine_args.pipeline_parallel_size", item, where)
            elif key == "data_parallel_shard_degree":
                self.put("trainer.extra.parallelism.dp_shard", item, where)
            else:
                same(where, item, 1, "forge_nb's trainer shards with FSDP only")

    def _replay_buffer(self, value: Any) -> None:
        b = section(value, "replay_buffer", ("batch_size", "max_policy_age", "dp_size"))
        for key in ("batch_size", "max_policy_age"):
            if key in b:
                self.put(key, b[key], f"replay_buffer.{key}")
        self.dp_size = b.get("dp_size")  # checked against the trainer's procs once those are known

    def _placements(self, services: Any, actors: Any) -> None:
        s = section(services, "services", ("policy", "generator", "trainer", "ref_model", *_IN_PROCESS))
        a = section(actors, "actors", ("trainer", *_IN_PROCESS))
        for group, entries in (("services", s), ("actors", a)):
            for name, value in entries.items():
                where = f"{group}.{name}"
                keys = ("procs", "with_gpus", "mesh_name", "hosts") + (("num_replicas",) if group == "services" else ())
                entry = section(value, where, keys)
                if "mesh_name" in entry:  # forge_nb names meshes <run>-<section>
                    same(f"{where}.mesh_name", entry.pop("mesh_name"), name,
                         "forge_nb names each mesh after its section")
                if name in _IN_PROCESS:
                    for key, expected in (("procs", 1), ("num_replicas", 1), ("with_gpus", False), ("hosts", 1)):
                        if key in entry:
                            same(f"{where}.{key}", entry[key], expected, f"forge_nb runs the {name} in the "
                                 "controller process (STYLE: no process for trivial work)")
                    continue
                target = {"policy": "generator", "ref_model": "reference"}.get(name, name)
                if name == "ref_model":
                    self.put("use_reference", True, where)
                if name == "trainer" and "num_replicas" in entry:
                    same(f"{where}.num_replicas", entry.pop("num_replicas"), 1,
                         "the trainer is one actor; use procs for data parallelism")
                for key, item in entry.items():
                    self.put(f"{target}.{key}", item, f"{where}.{key}")

    def _metric_logging(self, value: Any) -> None:
        m = section(value, "metric_logging", ("console", "wandb", "tensorboard", "trackio"))
        for kind, options in m.items():
            where = f"metric_logging.{kind}"
            options = dict(section(options, where, AnyKey()) if kind != "console" else
                           section(options, where, ("logging_mode", "reduce_across_ranks")))
            # forge_nb reduces each step's metrics once, over all ranks, before any logger sees them
            if "logging_mode" in options:
                same(f"{where}.logging_mode", options.pop("logging_mode"), "global_reduce",
                     "forge_nb reduces each step's metrics over all ranks")
            if "reduce_across_ranks" in options:
                same(f"{where}.reduce_across_ranks", options.pop("reduce_across_ranks"), True,
                     "forge_nb reduces each step's metrics over all ranks")
            if kind != "console":  # console: forge_nb always shows and records the metrics
                self.put_tree(f"exporters.{kind}", options, where)

    def _dataset(self, value: Any) -> None:
        d = section(value, "dataset", ("path", "revision", "data_split", "split", "streaming", "model"))
        if self.get("task") is None:
            self.put("task", "gsm8k", "dataset")
        elif self.get("task") == "toy":
            raise ValueError("dataset: task='toy' builds its own prompts; set task: gsm8k (or a module:function "
                             "task that takes path/split/...) or remove the dataset section")
        for key, item in d.items():
            where = f"dataset.{key}"
            if key == "path":
                local = isinstance(item, str) and item.endswith(_DATA_FILES)
                self.put(f"task_args.{'data_files' if local else 'path'}", item, where)
            elif key == "revision":  # torchforge passes it as load_dataset's second argument: the config name
                self.put("task_args.name", item, where)
            elif key in ("data_split", "split"):
                self.put("task_args.split", item, where)
            elif key == "model":  # the tokenizer whose chat template formats the prompts
                self.put("task_args.tokenizer", model_name(item, where), where)
            else:
                self.put(f"task_args.{key}", item, where)

    # -- checks across sections --------------------------------------------------------------------

    def _check_budget(self) -> None:
        budgets = self.seq_lens
        for key, value in budgets.items():
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise ValueError(f"{key}={value!r}: the prompt + response token budget, an integer >= 2")
        if not budgets:
            return
        key, budget = min(budgets.items(), key=lambda kv: kv[1])
        req, res = self.get("max_req_tokens"), self.get("max_res_tokens")
        if req is None and res is None:
            self.put("max_req_tokens", budget // 2, f"{key} (half)")
            self.put("max_res_tokens", budget - budget // 2, f"{key} (half)")
        elif req is None or res is None:
            given, other = ("max_res_tokens", "max_req_tokens") if req is None else ("max_req_tokens", "max_res_tokens")
            if budget - self.get(given) < 1:
                raise ValueError(f"{key}={budget} leaves no room beside {given}={self.get(given)}")
            self.put(other, budget - self.get(given), f"{key} - {given}")
        elif req + res > budget:
            raise ValueError(f"{key}={budget} < max_req_tokens + max_res_tokens = {req + res}; "
                             f"raise {key} or lower the token budgets")

    def _check_shapes(self) -> None:
        procs = self.get("trainer.procs", 1)
        dp = self.get("trainer.extra.parallelism.dp_shard")
        if dp not in (None, -1, procs):
            raise ValueError(f"{self.source['trainer.extra.parallelism.dp_shard']}={dp} but the trainer has "
                             f"procs={procs}: forge_nb shards over the trainer's procs; set its procs to {dp}")
        if self.dp_size is not None:
            same("replay_buffer.dp_size", self.dp_size, procs,
                 f"forge_nb splits each batch over the trainer's procs ({procs})")
        engine = self.get("generator.engine_args", {})
        tp = engine.get("tensor_parallel_size", 1) * engine.get("pipeline_parallel_size", 1)
        if {"tensor_parallel_size", "pipeline_parallel_size"} & set(engine) and self.get("generator.procs") is None:
            if tp > 1:
                self.put("generator.procs", tp, "tensor x pipeline parallel size")
        elif {"tensor_parallel_size", "pipeline_parallel_size"} & set(engine) and self.get("generator.procs") != tp:
            raise ValueError(f"generator procs={self.get('generator.procs')} but vLLM's tensor x pipeline parallel "
                             f"size is {tp}: each generator replica needs one proc per shard; make them equal")
        sampling = {k: self.get(f"generator.sampling_params.{k}") for k in ("n", "max_tokens", "temperature")}
        group, res = self.get("group_size", RunConfig.group_size), self.get("max_res_tokens", RunConfig.max_res_tokens)
        if sampling["n"] is not None and sampling["n"] != group:
            same("policy.sampling_params.n", sampling["n"], group, "GRPO samples group_size answers per prompt")
        if sampling["max_tokens"] is not None and sampling["max_tokens"] > res:
            raise ValueError(f"policy.sampling_params.max_tokens={sampling['max_tokens']} > max_res_tokens={res}: "
                             "longer responses would be cut in training; raise max_res_tokens")
        if sampling["temperature"] is not None and self.get("use_reference"):  # the run passes it to the trainer
            self.put("reference.extra.training.temperature", sampling["temperature"], "the sampling temperature")

    def _no_reference_no_kl(self, raw: dict[str, Any]) -> None:
        # torchforge's and the skill card's files scale the KL penalty only with a ref_model: one that
        # configures none ("Remove ref_model") trains without it, where RunConfig() would refuse GRPO's beta.
        from forge_nb.rl import LOSSES

        if set(raw) & set(_TORCHFORGE) and not self.get("use_reference") and \
                self.get("trainer.loss_config.beta") is None:
            loss = LOSSES.get(self.get("trainer.loss", "grpo"))
            if loss is not None and "beta" in {f.name for f in fields(loss)}:
                self.put("trainer.loss_config.beta", 0.0, "no ref_model")
