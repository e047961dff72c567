"""YAML in the TorchForge documents' shapes loads into RunConfig, every key honoured or refused by its dotted name."""

from __future__ import annotations

import re
import socket
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest

from forge_nb.config import REFERENCE_SECTIONS, from_yaml, trainer_actor_kwargs
from forge_nb.config.trainer_sections import LRSchedulerConfig, TrainingConfig, read_section

SEEDS = Path(__file__).resolve().parents[1].parent / "shared" / "seeds"
SKILL_CARD = SEEDS / "torchforge_skill_card.md"


def skill_card_yaml() -> dict[str, str]:
    """The skill card's ```yaml blocks, by their first line (``# config/grpo_math.yaml``...), read now."""
    if not SKILL_CARD.exists():
        pytest.skip(f"the TorchForge documents are not at {SEEDS}: this test reads their YAML blocks")
    blocks = re.findall(r"```yaml\n(.*?)```", SKILL_CARD.read_text(), re.S)
    return {block.splitlines()[0].strip(): block for block in blocks}


def grpo_math() -> str:
    return skill_card_yaml()["# config/grpo_math.yaml"]


def test_grpo_math_as_written_accumulates_gradients_over_micro_batches():
    cfg = from_yaml(grpo_math())  # training: batch_size 4, gradient_accumulation_steps 4
    assert cfg.batch_size == 16  # episodes per optimizer step
    assert cfg.trainer.training.gradient_accumulation_steps == 4
    with pytest.raises(ValueError, match=r"training\.gradient_accumulation_steps=0: an int >= 1"):
        from_yaml(grpo_math().replace("gradient_accumulation_steps: 4", "gradient_accumulation_steps: 0"))


def test_grpo_math_loads_with_every_key_in_the_run_config():
    text = re.sub(r"\n\s*gradient_accumulation_steps: 4", "", grpo_math())
    cfg = from_yaml(text)
    assert cfg.model == "Qwen/Qwen2.5-7B-Instruct"  # a hub id, resolved only at spawn
    assert cfg.task == "gsm8k" and cfg.task_args == {"path": "openai/gsm8k", "split": "train", "streaming": True}
    assert (cfg.batch_size, cfg.trainer.optimizer.lr, cfg.max_req_tokens + cfg.max_res_tokens) == (4, 1e-6, 4096)
    assert cfg.trainer.training.dtype == "bfloat16"
    assert cfg.generator.engine_args["dtype"] == cfg.reference.extra["training"]["dtype"] == "bfloat16"
    assert cfg.group_size == 8
    assert cfg.trainer.loss == "grpo"
    assert cfg.trainer.loss_config == {"beta": 0.1, "clip_low": 0.2, "clip_high": 0.28}
    # the sampling temperature, and the same temperature for the trainer's and the reference's logprobs (the run
    # passes its own to the trainer: trainer_actor_kwargs)
    assert cfg.generator.sampling_params["temperature"] == 0.7
    assert cfg.reference.extra["training"]["temperature"] == 0.7
    assert trainer_actor_kwargs(cfg, checkpoint_folder=None)["training"]["temperature"] == 0.7
    assert (cfg.generator.num_replicas, cfg.generator.procs, cfg.generator.with_gpus) == (1, 1, True)
    assert (cfg.trainer.procs, cfg.trainer.with_gpus) == (1, True)
    assert cfg.use_reference
    assert (cfg.reference.num_replicas, cfg.reference.procs, cfg.reference.with_gpus) == (1, 1, True)


def test_grpo_math_values_move_the_run_config():
    text = re.sub(r"\n\s*gradient_accumulation_steps: 4", "", grpo_math())
    text = text.replace("n_samples: 8", "n_samples: 5").replace("beta: 0.1 ", "beta: 0.3 ")
    generator = "generator:\n    procs: 1\n    num_replicas: "
    text = text.replace(generator + "1", generator + "3")
    cfg = from_yaml(text)
    assert (cfg.group_size, cfg.trainer.loss_config["beta"], cfg.generator.num_replicas) == (5, 0.3, 3)
    without_ref = re.sub(r"\n  ref_model:\n(    .*\n)+", "\n", text)
    with pytest.raises(ValueError, match=r"beta=0.3, which needs reference logprobs"):
        from_yaml(without_ref)  # services.ref_model is what turns the reference on


def test_distributed_yaml_splits_the_generator_and_shards_the_trainer():
    cfg = from_yaml(skill_card_yaml()["# config/distributed.yaml"])
    assert cfg.model == "meta-llama/Meta-Llama-3.1-8B-Instruct"
    assert cfg.generator.engine_args == {"tensor_parallel_size": 2, "pipeline_parallel_size": 1}
    assert (cfg.generator.procs, cfg.trainer.procs, cfg.trainer.extra["parallelism"]) == (2, 2, {"dp_shard": 2})
    assert not cfg.use_reference and cfg.trainer.loss_config == {"beta": 0.0}  # no ref_model: no KL penalty


def test_the_common_issue_snippets_load_or_name_what_is_unsupported():
    blocks = skill_card_yaml()
    no_ref = from_yaml(blocks["# Reduce service requirements"])
    assert not no_ref.use_reference and no_ref.generator.with_gpus and no_ref.trainer.with_gpus
    cpu_ref = from_yaml(blocks["ref_model:"])
    assert cpu_ref.use_reference and cpu_ref.reference.with_gpus is False
    smaller = from_yaml(blocks["# Reduce batch size"])
    assert (smaller.group_size, smaller.max_req_tokens, smaller.max_res_tokens) == (4, 1024, 1024)
    with pytest.raises(ValueError, match=r"beta=0.2, which needs reference logprobs: set use_reference=True"):
        from_yaml(blocks["# Increase KL penalty"])  # as written, without a reference model
    solutions = from_yaml(blocks["# Increase KL penalty"] + "\nref_model: {model: {name: qwen3}}\n")
    assert solutions.trainer.loss_config == {"beta": 0.2, "entropy_coef": 0.01}
    with pytest.raises(ValueError, match=r"entropy_coef must be a finite number >= 0, got -1"):
        from_yaml("training: {entropy_coef: -1}")


# Written for this test with the keys of torchforge's apps/grpo/qwen3_1_7b.yaml (other values).
QWEN3_SHAPED = """
group_size: 4
local_batch_size: 6
max_req_tokens: 96
max_res_tokens: 32
model: "Qwen/Qwen3-0.6B"
off_by_n: 2
rollout_threads: 3
metric_logging:
  wandb: {project: forge-test, group: "g_${oc.env:FORGE_TEST_USER,nobody}", logging_mode: global_reduce}
  console: {logging_mode: global_reduce}
dataset: {path: "openai/gsm8k", revision: "main", data_split: "test", streaming: false, model: "${model}"}
policy:
  engine_args: {model: "${model}", tensor_parallel_size: 1, pipeline_parallel_size: 1, enforce_eager: true}
  sampling_params: {n: "${group_size}", max_tokens: "${max_res_tokens}", temperature: 0.9, top_p: 0.95}
trainer:
  model: {name: qwen3, flavor: 0.6B, hf_assets_path: "hf://${model}"}
  optimizer: {name: AdamW, lr: 2e-5, eps: 1e-7}
  lr_scheduler: {warmup_steps: 3}
  training: {local_batch_size: "${local_batch_size}", seq_len: "${sum:${max_req_tokens},${max_res_tokens}}",
             max_norm: 0.5, steps: 40, dtype: bfloat16, gc_freq: 2}
  compile: {enable: false}
  parallelism: {data_parallel_replicate_degree: 1, data_parallel_shard_degree: 1, tensor_parallel_degree: 1,
                pipeline_parallel_degree: 1, context_parallel_degree: 1, expert_parallel_degree: 1,
                disable_loss_parallel: true}
  checkpoint: {enable: true, folder: ./ckpt, initial_load_path: "hf://${model}", initial_load_in_hf: true,
               last_save_in_hf: true, interval: 7, async_mode: disabled}
  activation_checkpoint: {mode: selective, selective_ac_option: op}
replay_buffer: {batch_size: "${local_batch_size}", max_policy_age: "${off_by_n}",
                dp_size: "${trainer.parallelism.data_parallel_shard_degree}"}
ref_model:
  model: {name: qwen3, flavor: 0.6B, hf_assets_path: "hf://${model}"}
  training: {seq_len: "${trainer.training.seq_len}", dtype: bfloat16, gc_freq: 2}
  compile: {enable: false}
  parallelism: {data_parallel_replicate_degree: 1, data_parallel_shard_degree: 1, tensor_parallel_degree: 1,
                pipeline_parallel_degree: 1, context_parallel_degree: 1, expert_parallel_degree: 1}
  checkpoint: {enable: true, initial_load_path: "hf://${model}", initial_load_in_hf: true}
services:
  policy: {procs: "${policy.engine_args.tensor_parallel_size}", num_replicas: 2, mesh_name: policy, with_gpus: true}
  ref_model: {procs: 1, num_replicas: 2, mesh_name: ref_model, with_gpus: true}
  reward_actor: {procs: 1, num_replicas: 1, mesh_name: reward_actor, with_gpus: false}
actors:
  dataset: {procs: 1, with_gpus: false, mesh_name: dataset}
  trainer: {procs: 1, with_gpus: true, mesh_name: trainer}
  replay_buffer: {procs: 1, with_gpus: false, mesh_name: replay_buffer}
  compute_advantages: {procs: 1, with_gpus: false, mesh_name: compute_advantages}
"""


def test_qwen3_shaped_yaml_loads_every_key(monkeypatch):
    def no_network(*args, **kwargs):
        raise AssertionError("loading a config must not touch the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    monkeypatch.setenv("FORGE_TEST_USER", "ada")
    cfg = from_yaml(QWEN3_SHAPED)
    assert cfg.model == "Qwen/Qwen3-0.6B"
    assert (cfg.group_size, cfg.batch_size, cfg.max_policy_age, cfg.loop.rollout_loops) == (4, 6, 2, 3)
    assert cfg.task == "gsm8k"
    assert cfg.task_args == {"path": "openai/gsm8k", "name": "main", "split": "test", "streaming": False,
                             "tokenizer": "Qwen/Qwen3-0.6B"}
    assert cfg.exporters == {"wandb": {"project": "forge-test", "group": "g_ada"}}
    assert cfg.generator.engine_args == {"tensor_parallel_size": 1, "pipeline_parallel_size": 1, "enforce_eager": True}
    assert cfg.generator.sampling_params == {"n": 4, "max_tokens": 32, "temperature": 0.9, "top_p": 0.95}
    assert (cfg.generator.num_replicas, cfg.generator.procs, cfg.generator.with_gpus) == (2, 1, True)
    opt, training = cfg.trainer.optimizer, cfg.trainer.training
    assert (opt.lr, training.max_norm, cfg.loop.max_steps, cfg.loop.warmup_steps) == (2e-5, 0.5, 40, 3)
    # the file names lr and eps; the rest are torchtitan's defaults, as under TorchForge
    assert (opt.name, opt.eps, opt.weight_decay, opt.beta2) == ("AdamW", 1e-7, 0.1, 0.95)
    assert (training.local_batch_size, training.dtype) == (6, "bfloat16")  # gc_freq: torchtitan's, ignored
    extra = cfg.trainer.extra
    assert "optimizer" not in extra and "training" not in extra
    assert extra["parallelism"] == {"dp_shard": 1, "disable_loss_parallel": True}
    assert extra["checkpoint"] == {"enable": True, "folder": "./ckpt", "last_save_in_hf": True, "interval": 7,
                                   "async_mode": "disabled"}
    assert extra["compile"] == {"enable": False}
    assert extra["activation_checkpoint"] == {"mode": "selective", "selective_ac_option": "op"}
    assert extra["lr_scheduler"] == {"decay_ratio": None}  # torchtitan's: decay after the warmup
    assert (cfg.trainer.procs, cfg.trainer.with_gpus) == (1, True)
    assert cfg.use_reference and (cfg.reference.num_replicas, cfg.reference.with_gpus) == (2, True)
    assert cfg.reference.extra["training"] == {"dtype": "bfloat16", "gc_freq": 2, "temperature": 0.9}


def test_a_torchforge_optimizer_section_leaves_the_rest_at_torchtitans_defaults():
    no_kl = "loss_config: {beta: 0}"
    torchforge = from_yaml(f"trainer: {{optimizer: {{name: AdamW, lr: 1e-5, eps: 1e-8}}, {no_kl}}}")
    assert (torchforge.trainer.optimizer.weight_decay, torchforge.trainer.optimizer.beta2) == (0.1, 0.95)
    named = from_yaml(f"trainer: {{optimizer: {{lr: 1e-5, weight_decay: 0.01, beta2: 0.98}}, {no_kl}}}")
    assert (named.trainer.optimizer.weight_decay, named.trainer.optimizer.beta2) == (0.01, 0.98)
    # forge_nb's "extra" spelling of the same section, and the skill card's learning rate: the same defaults
    assert from_yaml(f"trainer: {{extra: {{optimizer: {{eps: 1e-7}}}}, {no_kl}}}").trainer.optimizer.beta2 == 0.95
    assert from_yaml(f"training: {{learning_rate: 1e-5}}\ntrainer: {{{no_kl}}}").trainer.optimizer.weight_decay == 0.1
    with pytest.raises(ValueError, match=r"trainer\.weight_decay: write it in its section"):
        from_yaml(f"trainer: {{weight_decay: 0.0, {no_kl}}}")
    with pytest.raises(ValueError, match=r"beta2=1.5: must be a number in \[0, 1\)"):
        from_yaml(f"trainer: {{optimizer: {{beta2: 1.5}}, {no_kl}}}")


def test_a_torchforge_lr_scheduler_section_decays_as_torchtitan_and_forge_nbs_own_warmup_does_not():
    from forge_nb.config import trainer_actor_kwargs

    def schedule(text: str) -> tuple[Any, int]:
        cfg = from_yaml(text + "\n  loss_config: {beta: 0}\n")
        sections = cfg.trainer.actor_sections(trainer_actor_kwargs(cfg, checkpoint_folder=None))
        return (read_section(LRSchedulerConfig, "lr_scheduler", sections["lr_scheduler"]),
                read_section(TrainingConfig, "training", sections["training"]).steps)

    titan, steps = schedule("trainer:\n  lr_scheduler: {warmup_steps: 2}\n  training: {steps: 100}")
    assert (titan.warmup_steps, titan.decay_ratio, steps) == (2, None, 100)
    assert titan.factor(51, steps) == pytest.approx(0.5)  # halfway down the decay, as under TorchForge
    ratio, _ = schedule("trainer:\n  lr_scheduler: {warmup_steps: 2, decay_ratio: 0.25, decay_type: cosine}")
    assert (ratio.decay_ratio, ratio.decay_type) == (0.25, "cosine")  # the file's own values
    own, steps = schedule("loop: {warmup_steps: 2, max_steps: 100}\ntrainer:")  # forge_nb's shape: constant
    assert (own.decay_ratio, steps) == (0.0, 100) and own.factor(99, steps) == 1.0


MISSPELT = [
    ("polcy: {}", "polcy"),
    ("grpo: {n_sample: 4}", "grpo.n_sample"),
    ("training: {learning_rat: 1.0e-5}", "training.learning_rat"),
    ("services: {genrator: {procs: 1}}", "services.genrator"),
    ("services: {generator: {num_replica: 2}}", "services.generator.num_replica"),
    ("parallelism: {tensor_paralel_degree: 2}", "parallelism.tensor_paralel_degree"),
    ("policy: {engine_arg: {}}", "policy.engine_arg"),
    ("trainer: {optimizer: {lrr: 1}}", "trainer.optimizer.lrr"),
    ("trainer: {training: {max_nrm: 1}}", "trainer.training.max_nrm"),
    ("trainer: {parallelism: {tensor_paralel_degree: 1}}", "trainer.parallelism.tensor_paralel_degree"),
    ("trainer: {checkpoint: {intervl: 1}}", "trainer.checkpoint.intervl"),
    ("trainer: {model: {hf_asset_path: x}}", "trainer.model.hf_asset_path"),
    ("trainer: {compile: {enabled: false}}", "trainer.compile.enabled"),
    ("trainer: {extra: {optimzer: {}}}", "trainer.extra.optimzer"),
    ("trainer: {extra: {training: {dtyp: float32}}}", "trainer.extra.training.dtyp"),
    ("ref_model: {training: {dtyp: bfloat16}}", "ref_model.training.dtyp"),
    ("ref_model: {checkpoint: {initial_load_pth: x}}", "ref_model.checkpoint.initial_load_pth"),
    ("reference: {extra: {training: {dtyp: float32}}}", "reference.extra.training.dtyp"),
    ("reference: {num_replica: 2}", "reference.num_replica"),
    ("replay_buffer: {max_policy_ag: 1}", "replay_buffer.max_policy_ag"),
    ("dataset: {pth: data.jsonl}", "dataset.pth"),
    ("metric_logging: {consol: {}}", "metric_logging.consol"),
    ("metric_logging: {console: {logging_mod: global_reduce}}", "metric_logging.console.logging_mod"),
    ("actors: {trainer: {proc: 1}}", "actors.trainer.proc"),
    ("actors: {dataset: {with_gpu: false}}", "actors.dataset.with_gpu"),
    ("generator: {num_replica: 2}", "generator.num_replica"),
    ("loop: {mod: sync}", "loop.mod"),
]


@pytest.mark.parametrize(("text", "key"), MISSPELT, ids=[k for _, k in MISSPELT])
def test_a_misspelt_key_is_refused_by_its_dotted_name_with_what_is_accepted(text, key):
    refused = rf"unknown (top-level )?key\(s\) \['{re.escape(key)}'\].*(accepted|known here)"
    with pytest.raises(ValueError, match=refused):
        from_yaml(text + "\n")


def test_services_hosts_place_a_run_on_a_job_s_host_meshes():
    """TorchForge's ``services.<name>.hosts`` (a count, or here also a host mesh of the job in use)."""
    cfg = from_yaml("services:\n  policy: {num_replicas: 2, hosts: generators}\n  ref_model: {hosts: 1}\n"
                    "actors:\n  trainer: {hosts: trainer}\n  dataset: {hosts: 1}\n")
    assert (cfg.generator.hosts, cfg.trainer.hosts, cfg.reference.hosts) == ("generators", "trainer", 1)
    with pytest.raises(ValueError, match=r"GeneratorConfig.hosts=2: a replica runs on one host"):
        from_yaml("services: {policy: {hosts: 2}}\n")
    with pytest.raises(ValueError, match=r"actors\.dataset\.hosts"):
        from_yaml("actors: {dataset: {hosts: data}}\n")


REFUSED_VALUES = [
    ("trainer: {parallelism: {tensor_parallel_degree: 2}}", r"trainer\.parallelism\.tensor_parallel_degree=2: .*FSDP"),
    ("services: {reward_actor: {num_replicas: 2}}", r"services\.reward_actor\.num_replicas=2: .*controller process"),
    ("services: {policy: {mesh_name: gen}}", r"services\.policy\.mesh_name='gen'"),
    ("services: {trainer: {num_replicas: 2}}", r"services\.trainer\.num_replicas=2: the trainer is one actor"),
    ("metric_logging: {console: {logging_mode: per_rank_reduce}}", r"console\.logging_mode='per_rank_reduce'"),
    ("trainer: {compile: {enable: true}}", r"trainer\.compile\.enable=True: forge_nb does not torch.compile"),
    ("ref_model: {compile: {enable: true}}", r"ref_model\.compile\.enable=True"),
    ("replay_buffer: {dp_size: 2}", r"replay_buffer\.dp_size=2: .*trainer's procs \(1\)"),
    ("parallelism: {data_parallel_shard_degree: 2}", r"parallelism\.data_parallel_shard_degree=2 but the trainer has"),
    ("model: A/b\ntrainer: {checkpoint: {initial_load_path: hf://C/d}}", r"both set model"),
    ("trainer: {checkpoint: {initial_load_in_hf: false}}", r"initial_load_in_hf=False"),
    ("local_batch_size: 8\ntraining: {batch_size: 4}", r"training\.batch_size=4 and local_batch_size=8 both set"),
    ("max_req_tokens: 80\nmax_res_tokens: 40\ntraining: {seq_len: 100}", r"training\.seq_len=100 < max_req"),
    ("training: {learning_rate: fast}", r"training\.learning_rate='fast': must be a number"),
    ("training: {dtype: fp8}", r"training\.dtype='fp8': choose one of"),
    ("trainer: {loss: sapo}\ngrpo: {clip_low: 0.1, clip_high: 0.3}", r"'sapo' loss takes no clip range"),
    ("group_size: 8\npolicy: {sampling_params: {n: 4}}", r"policy\.sampling_params\.n=4: GRPO samples"),
    ("max_res_tokens: 8\npolicy: {sampling_params: {max_tokens: 64}}", r"max_tokens=64 > max_res_tokens=8"),
    ("task: toy\ndataset: {path: x.jsonl}", r"dataset: task='toy' builds its own prompts"),
    ("use_reference: false\nref_model: {}", r"both set use_reference"),
    ("training: {sync_interval: 10}", r"loop\.sync_interval=10 with max_policy_age=1: .*>= sync_interval"),
    ("training: {sync_interval: 0}", r"sync_interval=0: must be an integer >= 1"),
]


@pytest.mark.parametrize(("text", "message"), REFUSED_VALUES, ids=[t for t, _ in REFUSED_VALUES])
def test_a_value_forge_nb_cannot_honour_is_refused_naming_the_key(text, message):
    with pytest.raises(ValueError, match=message):
        from_yaml(text + "\n")


def test_mapped_values_that_forge_nb_honours():
    cfg = from_yaml("training: {seq_len: 64}\nmax_res_tokens: 16\ngrpo: {clip_low: 0.25, clip_high: 0.25}\n"
                    "trainer: {loss: dr_grpo}\ndataset: {path: /data/gsm8k.jsonl, split: test}\n")
    assert (cfg.max_req_tokens, cfg.max_res_tokens) == (48, 16)
    assert cfg.trainer.loss_config == {"clip_low": 0.25, "clip_high": 0.25, "beta": 0.0}
    assert cfg.task == "gsm8k" and cfg.task_args == {"data_files": "/data/gsm8k.jsonl", "split": "test"}
    assert from_yaml("training: {gradient_accumulation_steps: 1}\n").batch_size == 16  # 1 is what forge_nb does
    # the skill card's "reduce sync frequency": the generators load every 10th step's weights
    assert from_yaml("training: {sync_interval: 10}\nmax_policy_age: 10\n").loop.sync_interval == 10


def test_the_yaml_loader_the_trainer_and_the_reference_read_one_schema():
    """Every key the loader lets through, the trainer's section reads (forge_nb.config.trainer_sections)."""
    from forge_nb.actors import reference_model, trainer
    from forge_nb.config import trainer_sections as ts

    assert trainer.TRAINER_SEED_SECTIONS is ts.TRAINER_SEED_SECTIONS
    assert reference_model._SEED_SECTIONS | {"training"} == REFERENCE_SECTIONS
    for name, cls in ts.SECTIONS.items():
        defaults = {f.name: getattr(cls(), f.name) for f in fields(cls)}
        for key in ts.TRAINER_SECTION_KEYS[name]:
            value = defaults.get(key, -1 if key == "data_parallel_shard_degree" else 1)
            ts.read_section(cls, name, {key: value})  # an ignored seed key, an alias, a degree of 1, a field
        with pytest.raises(ValueError, match=f"{name} has no setting 'nope'"):
            ts.read_section(cls, name, {"nope": 1})
        with pytest.raises(ValueError, match=rf"unknown key\(s\) \['trainer\.{name}\.nope'\]"):
            from_yaml(f"trainer:\n  {name}: {{nope: 1}}\n")


def test_forge_config_cell_uses_the_same_loader():
    from IPython.core.error import UsageError

    from forge_nb.magics._parse import config_cell

    assert config_cell(QWEN3_SHAPED.replace("${oc.env:FORGE_TEST_USER,nobody}", "x")).model == "Qwen/Qwen3-0.6B"
    with pytest.raises(UsageError, match=r"unknown key\(s\) \['grpo\.n_sample'\]"):
        config_cell("grpo: {n_sample: 4}\n")


def test_a_yaml_trainer_reaches_the_actor_sections_as_configured():
    from forge_nb.actors.training import config as tc
    from forge_nb.config import trainer_actor_kwargs
    from forge_nb.config import trainer_sections as ts

    cfg = from_yaml(QWEN3_SHAPED.replace("${oc.env:FORGE_TEST_USER,nobody}", "x"))
    kwargs = trainer_actor_kwargs(cfg, checkpoint_folder="/runs/r/ckpt")
    run_sections = {k: kwargs[k] for k in ts.SECTION_NAMES if k in kwargs}
    sections, loss, loss_config = tc.trainer_arguments(kwargs["trainer"], run_sections, None, None)
    opt = ts.read_section(ts.OptimizerConfig, "optimizer", sections["optimizer"])
    training = ts.read_section(ts.TrainingConfig, "training", sections["training"])
    ckpt = ts.read_section(ts.CheckpointConfig, "checkpoint", sections["checkpoint"])
    sched = ts.read_section(ts.LRSchedulerConfig, "lr_scheduler", sections["lr_scheduler"])
    assert (opt.lr, opt.eps, training.max_norm, training.temperature, training.dtype) == (
        2e-5, 1e-7, 0.5, 0.9, "bfloat16")
    assert (ckpt.folder, ckpt.interval, sched.warmup_steps) == ("./ckpt", 7, 3)  # the YAML's folder wins
    # torchtitan's schedule of the file: 3 warmup steps, then a linear decay to the end of its 40 steps
    assert (sched.decay_ratio, training.steps) == (None, 40)
    assert [round(sched.factor(step, training.steps), 3) for step in (0, 2, 3, 20, 39)] == [
        0.333, 1.0, 1.0, 0.541, 0.027]  # torchtitan 0.3 gives these (tests/test_lr_schedule.py)
    assert set(sections) - set(ts.SECTION_NAMES) == {"compile", "activation_checkpoint"}  # torchtitan's, ignored
    assert (loss, loss_config) == (cfg.trainer.loss, cfg.trainer.loss_config)
    with pytest.raises(ValueError, match=r"trainer= and optimizer\.lr=0\.1: set TrainerConfig\.optimizer\.lr instead"):
        tc.trainer_arguments(cfg.trainer, {"optimizer": {"lr": 0.1}}, None, None)
    with pytest.raises(ValueError, match=r"trainer= and training\.dtype='float16': set TrainerConfig\.training\.dtype"):
        tc.trainer_arguments(cfg.trainer, {"training": {"dtype": "float16", "seed": 1}}, None, None)
    with pytest.raises(ValueError, match=r"trainer= and loss=/loss_config="):
        tc.trainer_arguments(cfg.trainer, {}, "grpo", None)
    with pytest.raises(TypeError, match=r"pass a forge_nb.config.TrainerConfig"):
        tc.trainer_arguments({"lr": 1.0}, {}, None, None)  # type: ignore[arg-type]
