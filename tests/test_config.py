"""Configs: validation names the field and the fix; overrides; torchforge-shaped YAML loads."""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest

from forge_nb.config import (
    GeneratorConfig,
    LoopConfig,
    RunConfig,
    TrainerConfig,
    TrainingConfig,
    apply_overrides,
    from_dict,
    from_yaml,
)
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
    assert cfg.model == "tiny" and cfg.generator.num_replicas == 1 and cfg.loop.rollout_loops == 8
    assert not cfg.generator.with_gpus and not cfg.trainer.with_gpus
    assert from_dict(cfg.to_dict()) == cfg


def test_every_recipe_builds_and_reads_back_from_its_data(tmp_path):
    from forge_nb.recipes import gsm8k_qwen3, gsm8k_tiny, guess_the_number_qwen3, multi_turn_echo
    from forge_nb.recipes.agents import agent_keys

    made = [quickstart(), multi_turn_echo(), gsm8k_qwen3(), gsm8k_tiny(str(tmp_path / "rows.jsonl")),
            guess_the_number_qwen3(), agent_keys()]
    for cfg in made:
        assert from_dict(cfg.to_dict()) == cfg, cfg.name
    # the tiny recipes keep the AdamW they were tuned with; the GPU recipes torchtitan's, as TorchForge's files
    assert {c.name: (c.trainer.optimizer.lr, c.trainer.optimizer.weight_decay, c.trainer.optimizer.beta2)
            for c in made} == {
        "quickstart": (7e-4, 0.0, 0.999), "multi-turn": (5e-4, 0.0, 0.999), "gsm8k": (1e-6, 0.1, 0.95),
        "gsm8k-tiny": (1e-3, 0.0, 0.999), "guess-the-number": (1e-6, 0.1, 0.95), "agent": (7e-4, 0.0, 0.999)}


def test_the_multi_turn_gpu_recipe_fits_its_episodes():
    """GuessTheNumber's 10 guesses of at most 32 tokens, with the hints and chat framing between them, fit the
    recipe's response budget; the episode settings are ones multi_turn_episode takes."""
    from forge_nb.envs import multi_turn_episode
    from forge_nb.recipes import GUESS_EPISODE, guess_the_number_qwen3

    cfg = guess_the_number_qwen3()
    assert cfg.model == "Qwen/Qwen3-1.7B" and cfg.generator.with_gpus and cfg.trainer.with_gpus
    assert GUESS_EPISODE["max_turns"] * (GUESS_EPISODE["turn_tokens"] + 40) <= cfg.max_res_tokens
    assert from_dict(cfg.to_dict()) == cfg and callable(multi_turn_episode(object(), **GUESS_EPISODE))


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
        (lambda: TrainerConfig(optimizer={"lr": -1}),
         r"TrainerConfig\.optimizer\.lr=-1: must be a positive number \(e\.g\. 1e-5\)"),
        (lambda: TrainerConfig(optimizer={"learning_rate": 1}),
         r"TrainerConfig\.optimizer has no setting 'learning_rate'"),
        (lambda: TrainerConfig(training={"seed": 3}),
         r"TrainerConfig\.training\.seed=3: the run sets it from its seed; set that instead"),
        (lambda: TrainerConfig(training={"steps": 50}),
         r"training\.steps=50: the run sets it from its loop\.max_steps"),
        (lambda: LoopConfig(mode="fast"), r"mode='fast': must be 'async' or 'sync'"),
        (lambda: RunConfig(max_policy_age=1, loop=LoopConfig(sync_interval=2)),
         r"sync_interval=2 with max_policy_age=1: .*evicted as too old; set max_policy_age >= sync_interval"),
        (lambda: RunConfig(trainer=TrainerConfig(loss_config={"beta": 0.1})), r"beta=0.1, which needs reference"),
        (lambda: RunConfig(trainer=TrainerConfig(loss_config={"nonsense": 1}, )), r"loss_config=.*nonsense"),
    ],
)
def test_bad_values_name_the_field_and_the_fix(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_overrides_are_typed_and_validated():
    cfg = apply_overrides(quickstart(), ["trainer.optimizer.lr=3e-4", "loop.mode=sync", "generator.num_replicas=3"])
    assert (cfg.trainer.optimizer.lr, cfg.loop.mode, cfg.generator.num_replicas) == (3e-4, "sync", 3)
    assert cfg.trainer.optimizer.weight_decay == 0.0  # the recipe's other optimizer values stay
    with pytest.raises(ValueError, match=r"unknown key\(s\) \['trainer.lr'\]; trainer.lr is trainer.optimizer.lr"):
        apply_overrides(cfg, ["trainer.lr=1"])
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
    assert cfg.trainer.optimizer.lr == 1e-5 and cfg.loop.max_steps == 1000000 and cfg.loop.rollout_loops == 1
    assert cfg.use_reference  # torchforge's recipe scores with a reference model


def test_a_run_directory_with_flat_trainer_settings_resumes_with_them_in_their_sections():
    from forge_nb.config import from_saved

    data = quickstart().to_dict()  # a config.json as forge_nb wrote it while the settings were TrainerConfig's fields
    del data["trainer"]["optimizer"], data["trainer"]["training"]
    data["trainer"] |= {"lr": 3e-4, "weight_decay": 0.0, "beta2": 0.999, "max_norm": 0.5,
                        "extra": {"training": {"dtype": "bfloat16", "temperature": 1.0}}}
    cfg = from_saved(data)
    opt, training = cfg.trainer.optimizer, cfg.trainer.training
    assert (opt.lr, opt.weight_decay, opt.beta2, training.max_norm, training.dtype) == (3e-4, 0.0, 0.999, 0.5,
                                                                                      "bfloat16")
    assert cfg.trainer.extra == {}
    assert from_saved(cfg.to_dict()) == cfg  # today's files read as they are
    with pytest.raises(ValueError, match=r"trainer\.lr is trainer\.optimizer\.lr"):
        from_dict(data)


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
    cfg = from_yaml("trainer: {optimizer: {lr: 5.0}, procs: 3, loss_config: {beta: 0}}\ngenerator: {num_replicas: 3}\n")
    assert (cfg.trainer.optimizer.lr, cfg.trainer.procs, cfg.generator.num_replicas) == (5.0, 3, 3)
    with pytest.raises(ValueError, match=r"trainer\.lr: write it in its section, trainer\.optimizer\.lr"):
        from_yaml("trainer: {lr: 5.0}\n")


# -- hot-changeable fields: declared once, on the field --------------------------------------------------


def _hot_fields_of_every_config_class() -> dict[str, str]:
    """Every field of a dataclass in forge_nb.config declared hot, found by scanning the module, not RunConfig."""
    import dataclasses

    import forge_nb.config as config

    found = {}
    for obj in vars(config).values():
        if isinstance(obj, type) and dataclasses.is_dataclass(obj):
            found |= {f.name: f.metadata["hot"] for f in dataclasses.fields(obj) if "hot" in f.metadata}
    return found


def test_the_run_gets_exactly_the_fields_declared_hot_and_the_trainer_the_same_names():
    from forge_nb.actors.training.config import hparams
    from forge_nb.config import hot_fields, trainer_changes
    from forge_nb.config.trainer_sections import OptimizerConfig, TrainingConfig
    from forge_nb.rl import LOSSES, make_loss

    declared = _hot_fields_of_every_config_class()
    assert {"lr", "weight_decay", "max_norm", "temperature", "top_p", "max_tokens", "max_policy_age",
            "difficulty"} <= declared.keys()
    assert hot_fields(quickstart(), loss_fields=()) == declared  # none forgotten, none invented
    for name, cls in LOSSES.items():
        cfg = RunConfig(trainer=TrainerConfig(loss=name, loss_config={"beta": 0.0}))
        routes = hot_fields(cfg)
        loss_names = {f for f in routes if f not in declared}
        assert loss_names == {f.name for f in __import__("dataclasses").fields(cls)} - declared.keys(), name
        assert {routes[f] for f in loss_names} == {"trainer"}
        # the trainer's set_hparams / info()["hparams"] names: its routed names, plus temperature (its logprobs)
        trainer_names = hparams(OptimizerConfig(), TrainingConfig(), make_loss(name, beta=0.0)).keys()
        assert set(trainer_names) == set(trainer_changes(dict.fromkeys(routes), routes)), name
        assert set(trainer_names) == {n for n, w in routes.items() if w == "trainer"} | {"temperature"}


def test_a_hot_field_declared_in_a_nested_section_is_found_without_a_list_to_update():
    from dataclasses import dataclass, field

    from forge_nb.config import hot
    from forge_nb.config._hot import declared

    @dataclass
    class Inner:
        warmup: int = hot(0, "run")
        cold: int = 1

    @dataclass
    class Outer:
        inner: Inner = field(default_factory=Inner)
        knobs: dict = field(default_factory=dict, metadata={"view": Inner})

    with pytest.raises(TypeError, match="'warmup' is declared twice"):
        declared(Outer)
    del Outer.__dataclass_fields__["knobs"]
    assert {n: (h.where, h.path) for n, h in declared(Outer).items()} == {"warmup": ("run", ("inner", "warmup"))}
    with pytest.raises(ValueError, match=r"hot\(where='gpu'\)"):
        hot(0, "gpu")


def test_initial_hparams_are_the_configured_values():
    from forge_nb.config import initial_hparams
    from forge_nb.rl import ToyTask

    cfg = apply_overrides(quickstart(), {"trainer.optimizer.lr": 2e-4, "trainer.optimizer.weight_decay": 0.01,
                                         "max_policy_age": 2,
                                         "generator.sampling_params": {"temperature": 0.8}})
    values = initial_hparams(cfg, task=ToyTask(difficulty=2))
    assert {k: values[k] for k in ("lr", "weight_decay", "max_norm", "temperature", "top_p", "max_tokens",
                                   "max_policy_age", "difficulty", "beta")} == {
        "lr": 2e-4, "weight_decay": 0.01, "max_norm": 1.0, "temperature": 0.8, "top_p": 1.0,
        "max_tokens": cfg.max_res_tokens, "max_policy_age": 2, "difficulty": 2, "beta": 0.0}
    assert "difficulty" not in initial_hparams(cfg, task=object())  # a task without one
    assert initial_hparams(cfg, {"beta": 0.5})["beta"] == 0.5  # the loss's values as the trainer reports them


CHANGE_ERRORS = [
    ("lr", -1, r"run\.set\(lr=-1\): optimizer\.lr=-1: must be a positive number"),
    ("weight_decay", -0.1, r"optimizer\.weight_decay=-0\.1: must be a number >= 0"),
    ("max_norm", "big", r"training\.max_norm='big'"),
    ("max_tokens", 99, r"max_tokens=99: must be between 1 and max_res_tokens=4 \(longer responses"),
    ("max_tokens", 0, r"max_tokens=0: must be between 1 and max_res_tokens=4"),
    ("temperature", 0, r"run\.set\(temperature=0\): temperature=0 with group_size=4: temperature 0 is greedy "
                       r"sampling.* a temperature > 0 .* group_size=1"),
    ("temperature", -0.5, r"temperature=-0\.5: must be a number >= 0"),
    ("top_p", 1.5, r"top_p=1\.5: must be a number in \(0, 1\]"),
    ("max_policy_age", -1, r"max_policy_age=-1: must be an integer >= 0"),
    ("difficulty", 0, r"difficulty=0: must be an integer >= 1"),
    ("beta", 0.1, r"beta=0\.1: the KL penalty needs reference logprobs .* use_reference=True"),
    ("clip_eps", -1.0, r"run\.set\(clip_eps=-1\.0\): .*clip_eps"),
    ("learning_rate", 1.0, r"unknown name\(s\) \['learning_rate'\]; hot-changeable: \[.*'lr'"),
]


@pytest.mark.parametrize(("name", "value", "message"), CHANGE_ERRORS, ids=[f"{n}={v}" for n, v, _ in CHANGE_ERRORS])
def test_check_change_names_the_value_and_the_fix(name, value, message):
    from forge_nb.config import check_change

    with pytest.raises(ValueError, match=message):
        check_change(quickstart(), name, value)


def test_check_change_accepts_what_the_run_can_apply():
    from forge_nb.config import check_change
    from forge_nb.rl import Gsm8kTask, ToyTask

    cfg = quickstart()
    for name, value in [("lr", 1e-4), ("weight_decay", 0.0), ("max_norm", 0.0), ("max_tokens", cfg.max_res_tokens),
                        ("temperature", 0.7), ("top_p", 0.9), ("max_policy_age", 0), ("beta", 0.0),
                        ("clip_eps", 0.3), ("agg", "token-mean")]:
        check_change(cfg, name, value)
    check_change(cfg, "difficulty", 2, task=ToyTask())
    with pytest.raises(ValueError, match="the task Gsm8kTask has no difficulty to change"):
        check_change(cfg, "difficulty", 2, task=Gsm8kTask.__new__(Gsm8kTask))
    dapo = RunConfig(trainer=TrainerConfig(loss="dapo"))
    check_change(dapo, "clip_low", 0.1)
    with pytest.raises(ValueError, match="clip_"):  # checked with the loss's other fields as they are now
        check_change(dapo, "clip_low", -0.5, current={"clip_high": 0.28})


def test_the_trainer_config_reaches_the_actor_as_it_is():
    from forge_nb.config import trainer_actor_kwargs

    cfg = apply_overrides(quickstart(), {"trainer.training.max_norm": 0.5, "loop.warmup_steps": 3, "seed": 7,
                                         "trainer.training.dtype": "bfloat16"})
    kwargs = trainer_actor_kwargs(cfg, checkpoint_folder="/tmp/ckpt", weights_namespace="a")
    assert kwargs["trainer"] is cfg.trainer and kwargs["weights_namespace"] == "a"
    run_sections = {k: v for k, v in kwargs.items() if k not in ("trainer", "weights_namespace")}
    sections = cfg.trainer.actor_sections(run_sections)
    assert sections == {  # the trainer's own sections as the config holds them, the run's values over its fields
        "optimizer": {"name": "AdamW", "lr": 7e-4, "eps": 1e-8, "weight_decay": 0.0, "beta1": 0.9, "beta2": 0.999},
        "training": dataclasses.asdict(TrainingConfig()) | {"seed": 7, "temperature": 1.0, "max_norm": 0.5,
                                                            "dtype": "bfloat16"},
        "lr_scheduler": {"warmup_steps": 3, "decay_ratio": 0.0},  # constant after the warmup, not torchtitan's decay
        "checkpoint": {"folder": "/tmp/ckpt"},
    }
    # a YAML's trainer.checkpoint.folder (in extra) wins over the run's folder, as before
    yaml_cfg = from_yaml("trainer: {checkpoint: {folder: ./ckpt}, optimizer: {lr: 2e-5, weight_decay: 0.1},\n"
                         "          loss_config: {beta: 0}}\n")
    assert (yaml_cfg.trainer.optimizer.lr, yaml_cfg.trainer.optimizer.weight_decay) == (2e-5, 0.1)
    assert yaml_cfg.trainer.actor_sections({"checkpoint": {"folder": "/run"}})["checkpoint"] == {"folder": "./ckpt"}


def test_a_field_is_set_once_and_sampling_values_are_checked_at_config_time():
    with pytest.raises(ValueError, match=r"extra\['optimizer'\]: set it as TrainerConfig\.optimizer \(the field\)"):
        TrainerConfig(extra={"optimizer": {"lr": 1e-3}})
    with pytest.raises(ValueError, match=r"sampling_params: sampling temperature=-1: must be a number >= 0"):
        GeneratorConfig(sampling_params={"temperature": -1})
    with pytest.raises(ValueError, match=r"max_tokens=9 > max_res_tokens=8"):
        RunConfig(max_res_tokens=8, generator=GeneratorConfig(sampling_params={"max_tokens": 9}),
                  trainer=TrainerConfig(loss_config={"beta": 0.0}))


def _greedy(group_size: int, temperature: float) -> RunConfig:
    return RunConfig(group_size=group_size, batch_size=4, trainer=TrainerConfig(loss_config={"beta": 0.0}),
                     generator=GeneratorConfig(sampling_params={"temperature": temperature}))


def test_temperature_zero_is_greedy_sampling_with_groups_of_one():
    from forge_nb.config import check_change, trainer_actor_kwargs

    greedy = _greedy(1, 0)
    assert greedy.sampling().temperature == 0
    assert trainer_actor_kwargs(greedy, checkpoint_folder="/tmp/c", weights_namespace="a")["training"][
        "temperature"] == 0
    with pytest.raises(ValueError, match=r"temperature=0 with group_size=4: .*Use a temperature > 0 .*group_size=1"):
        _greedy(4, 0)
    with pytest.raises(ValueError, match=r"group_size=1: GRPO compares a group.*not temperature=0\.7"):
        _greedy(1, 0.7)
    check_change(greedy, "temperature", 0)
    with pytest.raises(ValueError, match=r"run\.set\(temperature=0\.7\): RunConfig\.group_size=1"):
        check_change(greedy, "temperature", 0.7)
    assert from_dict(greedy.to_dict()) == greedy


def test_the_trainer_divides_logits_by_one_at_temperature_zero():
    from forge_nb.config.trainer_sections import TrainingConfig

    assert TrainingConfig(temperature=0).logits_temperature == 1.0
    assert TrainingConfig(temperature=0.5).logits_temperature == 0.5
    with pytest.raises(ValueError, match=r"training\.temperature=-1: must be a number >= 0"):
        TrainingConfig(temperature=-1)
