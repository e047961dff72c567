"""Configs: validation names the field and the fix; overrides; torchforge-shaped YAML loads."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from forge_nb.config import GeneratorConfig, LoopConfig, RunConfig, TrainerConfig, apply_overrides, from_dict, from_yaml
from forge_nb.recipes import quickstart

TORCHFORGE_GRPO = """
group_size: 8
local_batch_size: 16
max_req_tokens: 1024
max_res_tokens: 1024
model: "Qwen/Qwen3-1.7B"
off_by_n: 1
rollout_threads: 1
metric_logging:
  console: {logging_mode: global_reduce}
policy:
  engine_args: {model: "${model}", tensor_parallel_size: 1, enforce_eager: false}
  sampling_params: {n: "${group_size}", max_tokens: "${max_res_tokens}", temperature: 1.0, top_p: 1.0}
trainer:
  optimizer: {name: AdamW, lr: 1e-5, eps: 1e-8}
  training: {local_batch_size: "${local_batch_size}", seq_len: "${sum:${max_req_tokens},${max_res_tokens}}",
             max_norm: 1.0, steps: 1000000}
replay_buffer: {batch_size: "${local_batch_size}", max_policy_age: "${off_by_n}", dp_size: 1}
ref_model: {model: {name: qwen3}}
services:
  policy: {procs: 1, num_replicas: 2, with_gpus: true}
actors:
  trainer: {procs: 1, with_gpus: true}
"""


def test_quickstart_recipe_is_valid_and_cpu_only():
    cfg = quickstart()
    assert cfg.model == "tiny" and cfg.generator.num_replicas == 2
    assert not cfg.generator.with_gpus and not cfg.trainer.with_gpus
    assert from_dict(cfg.to_dict()) == cfg


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: RunConfig(group_size=1), r"group_size=1: GRPO compares a group"),
        (lambda: RunConfig(batch_size=0), r"RunConfig.batch_size=0: must be an integer >= 1"),
        (lambda: RunConfig(max_policy_age=-1), r"max_policy_age=-1"),
        (lambda: RunConfig(advantage="median"), r"advantage='median'.*grpo"),
        (lambda: GeneratorConfig(num_replicas=0), r"num_replicas=0"),
        (lambda: GeneratorConfig(procs=0), r"procs=0"),
        (lambda: TrainerConfig(loss="ppo2"), r"loss='ppo2': unknown loss; choose one of \['cispo'"),
        (lambda: TrainerConfig(lr=-1), r"lr=-1: must be a positive number"),
        (lambda: LoopConfig(mode="fast"), r"mode='fast': must be 'async' or 'sync'"),
        (lambda: RunConfig(trainer=TrainerConfig(loss_config={"beta": 0.1})), r"beta=0.1, which needs reference"),
        (lambda: RunConfig(trainer=TrainerConfig(loss_config={"nonsense": 1}, )), r"loss_config=.*nonsense"),
    ],
)
def test_bad_values_name_the_field_and_the_fix(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_overrides_are_typed_and_validated():
    cfg = apply_overrides(quickstart(), ["trainer.lr=3e-4", "loop.mode=sync", "generator.num_replicas=3"])
    assert (cfg.trainer.lr, cfg.loop.mode, cfg.generator.num_replicas) == (3e-4, "sync", 3)
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['trainer.lrr'\]"):
        apply_overrides(cfg, ["trainer.lrr=1"])
    with pytest.raises(ValueError, match="key=value"):
        apply_overrides(cfg, ["trainer.lr"])
    with pytest.raises(ValueError, match="num_replicas=0"):
        apply_overrides(cfg, {"generator.num_replicas": 0})


def test_torchforge_grpo_yaml_loads_into_the_same_dataclasses(tmp_path):
    path = tmp_path / "qwen3_1_7b.yaml"
    path.write_text(TORCHFORGE_GRPO)
    cfg = from_yaml(path)
    assert cfg.model == "Qwen/Qwen3-1.7B"
    assert (cfg.group_size, cfg.batch_size, cfg.max_policy_age) == (8, 16, 1)
    assert cfg.generator.num_replicas == 2 and cfg.generator.with_gpus and cfg.trainer.with_gpus
    assert cfg.generator.sampling_params["n"] == 8 and cfg.generator.sampling_params["max_tokens"] == 1024
    assert "model" not in cfg.generator.engine_args  # the run's model is used
    assert cfg.trainer.lr == 1e-5 and cfg.loop.max_steps == 1000000 and cfg.loop.rollout_loops == 1
    assert cfg.use_reference  # torchforge's recipe scores with a reference model


def test_yaml_errors_point_at_the_key():
    with pytest.raises(ValueError, match=r"unknown top-level key\(s\) \['polcy'\] \(did you mean 'policy'\?\)"):
        from_yaml("polcy: {}\n")
    with pytest.raises(ValueError, match=r"\$\{nope\}: no such key"):
        from_yaml("group_size: ${nope}\n")


def test_the_real_torchforge_yaml_if_present():
    repo = Path("/work/.mirror/meta-pytorch+torchforge/repo")
    if not repo.exists():
        pytest.skip("no torchforge checkout on this machine; the inline copy above covers the shape")
    text = subprocess.run(["git", "-C", str(repo), "show", "HEAD:apps/grpo/qwen3_1_7b.yaml"],
                          capture_output=True, text=True, check=True).stdout
    assert from_yaml(text).model == "Qwen/Qwen3-1.7B"


def test_forge_nb_style_sections_in_yaml_are_read_not_dropped():
    cfg = from_yaml("trainer: {lr: 5.0, procs: 3, loss_config: {beta: 0}}\ngenerator: {num_replicas: 3}\n")
    assert (cfg.trainer.lr, cfg.trainer.procs, cfg.generator.num_replicas) == (5.0, 3, 3)
