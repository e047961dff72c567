"""RLTrainer in real monarch procs on CPU: steps, skipped steps, hparams, weight push, FSDP2, checkpoints.

One 1-proc mesh serves the module (transformers is imported there once); each test spawns fresh
trainer actors into it. The FSDP2 test adds a 2-proc mesh and compares with a 1-proc trainer.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_asyncio
import torch

from forge_nb import weights
from forge_nb.models import build_tiny_model
from forge_nb.rl import Completion, Episode, ForwardBackwardResult, TrainBatch, collate
from forge_nb.system.runtime import lifecycle, spawning

pytestmark = pytest.mark.timeout(120)
# The async tests share the module's event loop, on which the module's mesh was spawned.
on_module_loop = pytest.mark.asyncio(loop_scope="module")

METRIC_KEYS = {
    "loss", "kl", "entropy", "grad_norm", "clip/frac_low", "clip/frac_high", "tokens", "lr", "step", "skipped",
}


def make_batch(n: int = 4, advantages: list[float] | None = None, seed: int = 0) -> TrainBatch:
    """Episodes of varied prompt and response lengths (so padding is exercised), with ref logprobs."""
    g = torch.Generator().manual_seed(seed)
    advantages = advantages or [1.0, -1.0, 0.5, -0.5] * (n // 4 + 1)
    episodes = []
    for i in range(n):
        prompt = torch.randint(2, 10, (3 + i % 3,), generator=g)
        tokens = torch.randint(2, 10, (2 + i % 4,), generator=g)
        episodes.append(Episode(
            episode_id=str(i), pad_id=0, request_len=6, response_len=5,
            completion=Completion(prompt="p", text="t", prompt_ids=prompt, token_ids=tokens),
            ref_logprobs=-2 * torch.rand(len(tokens), generator=g), advantage=advantages[i],
        ))
    return collate(episodes)


def first(value_mesh: Any) -> Any:
    """Rank 0's answer of a ``.call()``."""
    return value_mesh.item(procs=0)


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], atol: float = 0.0) -> None:
    assert a.keys() == b.keys()
    for k in a:
        torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0 if atol == 0 else 1e-4,
                                   msg=lambda m, k=k: f"{k}: {m}")


def differs(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return any(not torch.equal(a[k], b[k]) for k in a)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> Any:
    model = build_tiny_model(tmp_path_factory.mktemp("trainer") / "tiny")
    lifecycle.ensure_started()
    await weights.initialize_store()
    mesh = await spawning.spawn_mesh("trainer-t", 1)
    try:
        yield SimpleNamespace(mesh=mesh, model=str(model), tmp=tmp_path_factory)
    finally:
        await mesh.stop()
        await weights.shutdown_store()


async def spawn(mesh: Any, name: str, model: str, **kwargs: Any) -> Any:
    from forge_nb.actors.trainer import RLTrainer

    kwargs.setdefault("optimizer", {"lr": 1e-3})
    actor = mesh.spawn(name, RLTrainer, model=model, **kwargs)
    await actor.setup.call()
    return actor


@on_module_loop
async def test_steps_train_skip_nonfinite_and_push_hf_weights(env: Any) -> None:
    from transformers import AutoConfig, Qwen3ForCausalLM

    trainer = await spawn(env.mesh, "steps", env.model)
    batch = make_batch()
    initial = first(await trainer.state_dict.call())["model"]

    losses = []
    for i in range(3):
        result = first(await trainer.train_step.call(batch))
        assert isinstance(result, ForwardBackwardResult) and result.loss == result.metrics["loss"]
        metrics = result.metrics
        assert METRIC_KEYS <= metrics.keys(), sorted(METRIC_KEYS - metrics.keys())
        assert metrics["skipped"] == 0.0 and metrics["step"] == i + 1
        assert metrics["tokens"] == float(batch.response_mask.sum())
        losses.append(metrics["loss"])
    assert all(torch.isfinite(torch.tensor(losses)))
    trained = first(await trainer.state_dict.call())
    assert differs(initial, trained["model"])

    nan_batch = make_batch(advantages=[float("nan")] * 4)
    metrics = first(await trainer.train_step.call(nan_batch))
    assert metrics["skipped"] == 1.0 and metrics["skipped/nonfinite_loss"] == 1.0
    assert metrics["step"] == 3.0
    after = first(await trainer.state_dict.call())
    assert_same(trained["model"], after["model"])
    assert after["step"] == 3

    # The push holds the trainer's weights under Hugging Face names.
    pushed = first(await trainer.push_weights.call(1))
    assert pushed["version"] == 1.0
    loaded = await weights.load_state_dict(1)
    assert_same({k: v.cpu() for k, v in loaded.items()}, after["model"])
    hf = Qwen3ForCausalLM(AutoConfig.from_pretrained(env.model))
    hf.load_state_dict(loaded, strict=True)


def seed_grpo_loss(
    logits: torch.Tensor,
    response: torch.Tensor,
    ref_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    padding_mask: torch.Tensor,
    beta: float = 0.1,
) -> torch.Tensor:
    """torchforge's ``simple_grpo_loss`` (apps/grpo/main.py): whole-sequence logits first."""
    from forge_nb.rl import aligned_logits, compute_logprobs

    logprobs = compute_logprobs(aligned_logits(logits, response.shape[1]), response)
    kl = torch.exp(ref_logprobs - logprobs) - (ref_logprobs - logprobs) - 1
    per_token_loss = -(torch.exp(logprobs - logprobs.detach()) * advantages - beta * kl)
    return ((per_token_loss * padding_mask).sum(dim=1) / padding_mask.sum(dim=1).clamp(min=1.0)).mean()


@on_module_loop
async def test_seed_batch_form_and_seed_loss(env: Any) -> None:
    from forge_nb.rl import collate_seed

    # torchforge's apps/grpo passes (inputs, targets) lists, one pair per data-parallel rank, and a loss
    # that takes logits; forge_nb's GRPO is the same objective.
    g = torch.Generator().manual_seed(1)
    group = [Episode(
        episode_id=str(i), pad_id=0, request_len=6, response_len=5, advantage=float(i % 2) - 0.5,
        completion=Completion(prompt="p", text="t", prompt_ids=torch.randint(2, 10, (4,), generator=g),
                              token_ids=torch.randint(2, 10, (3,), generator=g)),
        ref_logprobs=-torch.rand(3, generator=g),
    ) for i in range(4)]
    inputs, targets = collate_seed([group])
    ours = await spawn(env.mesh, "seed-ours", env.model)
    seeds = await spawn(env.mesh, "seed-theirs", env.model, loss=seed_grpo_loss)
    a = first(await ours.train_step.call(inputs, targets))
    b = first(await seeds.train_step.call(inputs, targets))
    assert a["step"] == b["step"] == 1.0
    assert a["loss"] == pytest.approx(b["loss"], abs=1e-6) and a["grad_norm"] == pytest.approx(b["grad_norm"])


@on_module_loop
async def test_the_documents_optimizer_section_gets_torchtitans_other_defaults(env: Any) -> None:
    # rl_fundamentals_part1.md's RLTrainer: optimizer={"name": "AdamW", "lr": 1e-5}; under TorchForge the rest is
    # torchtitan's optimizer section as it stands (betas 0.9 and 0.95, eps 1e-8, weight decay 0.1), and its
    # lr_scheduler section: 200 warmup steps, then a decay to the end of training.steps (tests/test_lr_schedule.py)
    trainer = await spawn(env.mesh, "documents-optimizer", env.model, optimizer={"name": "AdamW", "lr": 1e-5})
    group = first(await trainer.state_dict.call())["optimizer"]["param_groups"][0]
    assert (group["lr"], group["betas"], group["eps"], group["weight_decay"]) == (1e-5, (0.9, 0.95), 1e-8, 0.1)
    rates = [first(await trainer.train_step.call(make_batch()))["lr"] for _ in range(2)]
    assert rates == pytest.approx([1e-5 / 200, 2e-5 / 200])
    with pytest.raises(Exception, match=r"optimizer\.beta2=1\.0: must be a number in \[0, 1\)"):
        await spawn(env.mesh, "documents-optimizer-bad", env.model, optimizer={"lr": 1e-5, "beta2": 1.0})


@on_module_loop
async def test_sft_steps(env: Any) -> None:
    trainer = await spawn(env.mesh, "sft", env.model)
    batch = make_batch()
    metrics = first(await trainer.sft_step.call(batch))
    assert metrics["skipped"] == 0.0 and metrics["step"] == 1.0
    assert metrics["tokens"] == float(batch.response_mask.sum()) and metrics["loss"] > 0

    # torchtitan's SFT convention: labels aligned with tokens, -100 ignored.
    tokens = batch.tokens
    labels = torch.full_like(tokens, -100)
    labels[:, :-1] = tokens[:, 1:]
    second = first(await trainer.sft_step.call({"tokens": tokens, "labels": labels}))
    assert second["step"] == 2.0 and second["tokens"] == float(tokens.numel() - len(tokens))


@on_module_loop
async def test_set_hparams_changes_between_steps_and_rejects_unknown(env: Any) -> None:
    trainer = await spawn(env.mesh, "hparams", env.model, lr_scheduler={"warmup_steps": 2})
    assert first(await trainer.train_step.call(make_batch()))["lr"] == pytest.approx(5e-4)  # warmup
    changed = first(await trainer.set_hparams.call(lr=2e-3, beta=0.0, max_norm=0.5))
    assert changed == {"lr": (1e-3, 2e-3), "beta": (0.1, 0.0), "max_norm": (1.0, 0.5)}
    metrics = first(await trainer.train_step.call(make_batch()))
    assert metrics["lr"] == pytest.approx(2e-3)
    assert first(await trainer.set_hparams.call(lr=2e-3)) == {}  # nothing changed
    with pytest.raises(Exception, match="unknown name"):
        await trainer.set_hparams.call(learning_rate=1.0)
    with pytest.raises(Exception, match="clip_eps"):
        await trainer.set_hparams.call(clip_eps=-1.0)  # the loss validates its own fields


@on_module_loop
async def test_a_trainer_built_from_the_run_config_trains_as_configured_and_pushes_to_its_namespace(env: Any) -> None:
    from forge_nb.actors.trainer import RLTrainer
    from forge_nb.config import GeneratorConfig, RunConfig, TrainerConfig, trainer_actor_kwargs

    cfg = RunConfig(trainer=TrainerConfig(optimizer={"lr": 1e-3, "weight_decay": 0.01}, training={"max_norm": 0.5},
                                          loss="dapo"),
                    generator=GeneratorConfig(sampling_params={"temperature": 0.8}), seed=3)
    kwargs = trainer_actor_kwargs(cfg, checkpoint_folder=None, weights_namespace="run-a")
    trainer = env.mesh.spawn("from-config", RLTrainer, model=env.model, **kwargs)
    await trainer.setup.call()
    info = first(await trainer.info.call())
    hp = info["hparams"]
    if not torch.cuda.is_available():  # the CPU is shared with vLLM's busy-waiting engines (training.policy_model)
        assert info["cpu_threads"] == int(os.environ.get("OMP_NUM_THREADS", "1"))
        assert info["flush_denormal"], "the steps compute with denormal floats (slow on CPU)"
    assert {k: hp[k] for k in ("lr", "max_norm", "weight_decay", "temperature", "clip_high")} == {
        "lr": 1e-3, "max_norm": 0.5, "weight_decay": 0.01, "temperature": 0.8, "clip_high": 0.28}
    assert first(await trainer.train_step.call(make_batch()))["lr"] == pytest.approx(1e-3)  # the optimizer's
    group = first(await trainer.state_dict.call())["optimizer"]["param_groups"][0]
    assert (group["betas"], group["weight_decay"]) == ((0.9, 0.95), 0.01)  # the section's: torchtitan's beta2
    changed = first(await trainer.set_hparams.call(lr=2e-3, temperature=1.0))
    assert changed == {"lr": (1e-3, 2e-3), "temperature": (0.8, 1.0)}
    assert first(await trainer.train_step.call(make_batch()))["lr"] == pytest.approx(2e-3)

    await trainer.push_weights.call(5)  # under the run's namespace, not the default "policy"
    assert await weights.stored_versions(namespace="run-a") == [5]
    assert 5 not in await weights.stored_versions()
    await weights.drop_version(5, namespace="run-a")

    wrong = env.mesh.spawn("from-config-twice", RLTrainer, model=env.model, trainer=cfg.trainer,
                           optimizer={"lr": 0.1})
    with pytest.raises(Exception, match=r"optimizer\.lr=0\.1: set TrainerConfig\.optimizer\.lr instead"):
        await wrong.setup.call()


@on_module_loop
async def test_gradient_accumulation_trains_what_one_whole_batch_trains(env: Any) -> None:
    # seq-mean aggregation: the mean of two micro-batches' losses, each weighted by its half of the rows, is
    # the whole batch's loss, so one accumulated step and one whole step move the weights the same way
    loss_config = {"agg": "seq-mean-token-mean", "beta": 0.0}
    whole = await spawn(env.mesh, "accum-whole", env.model, loss_config=loss_config)
    split = await spawn(env.mesh, "accum-split", env.model, loss_config=loss_config,
                        training={"gradient_accumulation_steps": 2})
    batch = make_batch(n=8)
    a, b = first(await whole.train_step.call(batch)), first(await split.train_step.call(batch))
    assert a.loss == pytest.approx(b.loss, abs=1e-5) and a["tokens"] == b["tokens"]
    assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-4)
    # float rounding differs between the two sums of gradients: ~1e-5 of a 0.1 step on the odd element
    assert_same(first(await whole.state_dict.call())["model"], first(await split.state_dict.call())["model"],
                atol=2e-5)
    with pytest.raises(Exception, match="gradient_accumulation_steps=3 does not divide"):
        await (await spawn(env.mesh, "accum-3", env.model, training={"gradient_accumulation_steps": 3})
               ).train_step.call(batch)


@on_module_loop
async def test_a_text_train_batch_trains_its_weighted_targets(env: Any) -> None:
    from forge_nb.rl import TextTrainBatch

    trainer = await spawn(env.mesh, "text", env.model, loss_config={"beta": 0.0})
    batch = make_batch()
    # the skill card's layout: targets are the inputs shifted left; weights are each row's advantage on
    # its response tokens and 0 elsewhere
    targets = torch.zeros_like(batch.tokens)
    targets[:, :-1] = batch.tokens[:, 1:]
    mask = torch.zeros(batch.tokens.shape, dtype=torch.bool)
    mask[:, batch.request_len - 1 : -1] = batch.response_mask
    text = TextTrainBatch(input_ids=batch.tokens, target_ids=targets, target_mask=mask,
                          target_weights=mask * batch.advantages)
    before = first(await trainer.state_dict.call())["model"]
    result = first(await trainer.train_step.call(text))
    assert result.metrics["skipped"] == 0.0 and result.metrics["tokens"] == float(mask.sum())
    assert differs(before, first(await trainer.state_dict.call())["model"])
    ref = await spawn(env.mesh, "text-ref", env.model, loss_config={"beta": 0.0})
    same = first(await ref.train_step.call(batch))  # the same rows as a TrainBatch: the same loss
    assert result.loss == pytest.approx(same.loss, abs=1e-5)


@on_module_loop
async def test_missing_model_is_reported_by_setup(env: Any) -> None:
    from forge_nb.actors.trainer import RLTrainer

    actor = env.mesh.spawn("missing", RLTrainer, model="/nowhere/no-such-model")
    with pytest.raises(Exception, match="no-such-model"):
        await actor.setup.call()


@on_module_loop
async def test_checkpoint_round_trip_and_incomplete_checkpoints_are_ignored(env: Any) -> None:
    folder = env.tmp.mktemp("ckpt")
    trainer = await spawn(env.mesh, "ckpt-a", env.model, checkpoint={"folder": str(folder), "interval": 2})
    batch = make_batch()
    await trainer.train_step.call(batch)
    assert not list(folder.iterdir())
    await trainer.train_step.call(batch)
    assert [p.name for p in folder.iterdir()] == ["step_00000002"]  # saved by the interval
    saved_at = Path(first(await trainer.save_checkpoint.call()))
    assert saved_at.name == "step_00000002" and (saved_at / ".metadata").exists()
    snapshot = first(await trainer.state_dict.call())

    # A crash mid-save leaves a .partial folder; a folder without its commit marker is no checkpoint either,
    # nor is one whose file was cut short after the write (a full disk, a bad copy).
    assert (saved_at / "COMMITTED.json").exists()
    (folder / "step_00000009.partial").mkdir()
    (folder / "step_00000009.partial" / "__0_0.distcp").write_bytes(b"half")
    (folder / "step_00000008").mkdir()
    shutil.copytree(saved_at, folder / "step_00000007")
    shard = next((folder / "step_00000007").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-7])

    await trainer.train_step.call(batch)
    assert differs(snapshot["model"], first(await trainer.state_dict.call())["model"])
    assert first(await trainer.load_checkpoint.call()) == 2
    restored = first(await trainer.state_dict.call())
    assert restored["step"] == 2
    assert_same(snapshot["model"], restored["model"])
    assert_same(_flat(snapshot["optimizer"]), _flat(restored["optimizer"]))

    # A new trainer on the same folder resumes in setup() and continues exactly like the original.
    resumed = await spawn(env.mesh, "ckpt-b", env.model, checkpoint={"folder": str(folder)})
    assert first(await resumed.info.call())["step"] == 2
    assert_same(snapshot["model"], first(await resumed.state_dict.call())["model"])
    a = first(await trainer.train_step.call(batch))
    b = first(await resumed.train_step.call(batch))
    assert a["step"] == b["step"] == 3.0 and a["loss"] == pytest.approx(b["loss"], abs=1e-6)

    with pytest.raises(Exception, match=r"is not a whole checkpoint \(no commit marker \(COMMITTED.json\)"):
        await trainer.load_checkpoint.call(str(folder / "step_00000009.partial"))
    with pytest.raises(Exception, match=rf"is not a whole checkpoint \({shard.name} is \d+ bytes; \d+ were written"):
        await trainer.load_checkpoint.call(str(folder / "step_00000007"))


def _flat(optim_state: dict[str, Any]) -> dict[str, torch.Tensor]:
    """Optimizer state as {param.key: tensor}, steps included, for exact comparison."""
    out = {}
    for param, state in optim_state["state"].items():
        for key, value in state.items():
            out[f"{param}.{key}"] = torch.as_tensor(value).float()
    return out


@on_module_loop
async def test_fsdp_over_two_procs_matches_one_proc(env: Any) -> None:
    mesh2 = await spawning.spawn_mesh("trainer-fsdp", 2)
    try:
        folder = env.tmp.mktemp("ckpt-fsdp")
        sharded = await spawn(mesh2, "fsdp", env.model, checkpoint={"folder": str(folder)})
        single = await spawn(env.mesh, "fsdp-ref", env.model)
        await single.state_dict.call()  # reading state before the first step must not change training
        info = await sharded.info.call()
        assert [info.item(procs=r)["world_size"] for r in range(2)] == [2, 2]
        batch = make_batch(n=8)
        # Only rank 1's rows (4-7) are broken: every rank must skip, or FSDP's backward would hang.
        poisoned = make_batch(n=8, advantages=[1.0, -1.0, 0.5, -0.5] + [float("nan")] * 4)
        skipped = await sharded.train_step.call(poisoned)
        assert [skipped.item(procs=r)["skipped/nonfinite_loss"] for r in range(2)] == [1.0, 1.0]
        for _ in range(3):
            m2 = await sharded.train_step.call(batch)
            m1 = first(await single.train_step.call(batch))
            ranks = [{k: v for k, v in m2.item(procs=r).metrics.items() if k != "time_s"} for r in range(2)]
            assert ranks[0] == ranks[1]  # metrics are reduced over ranks
            assert first(m2)["loss"] == pytest.approx(m1["loss"], abs=1e-5)
            assert first(m2)["tokens"] == m1["tokens"]

        await sharded.push_weights.call(2)
        whole = {k: v.cpu() for k, v in (await weights.load_state_dict(2)).items()}
        expected = first(await single.state_dict.call())["model"]
        assert {k: v.shape for k, v in whole.items()} == {k: v.shape for k, v in expected.items()}
        assert_same(whole, expected, atol=1e-5)

        # A checkpoint written by 2 ranks loads on 1 (DCP reshards).
        saved = first(await sharded.save_checkpoint.call())
        # ... and back on both: rank 0 alone picks the newest whole one, checking its files; the other gets its answer
        restored = await sharded.load_checkpoint.call()
        assert [restored.item(procs=r) for r in range(2)] == [3, 3]
        info = await sharded.info.call()
        assert [info.item(procs=r)["resumed"] for r in range(2)] == [
            {"path": saved, "step": 3, "checked": "by rank 0, before loading"}] * 2
        resumed = await spawn(env.mesh, "fsdp-resume", env.model, checkpoint={"folder": str(folder)})
        assert first(await resumed.info.call())["step"] == 3
        assert_same(first(await resumed.state_dict.call())["model"], whole, atol=0)
        await sharded.cleanup.call()
    finally:
        await mesh2.stop()


def test_torchforge_trainer_sections_load_and_mistakes_name_the_fix() -> None:
    from forge_nb.actors.training.config import model_source
    from forge_nb.config.trainer_sections import (
        CheckpointConfig,
        OptimizerConfig,
        ParallelismConfig,
        TrainingConfig,
        read_section,
    )

    # The trainer section of torchforge's apps/grpo/qwen3_1_7b.yaml
    assert model_source({"name": "qwen3", "flavor": "1.7B", "hf_assets_path": "hf://Qwen/Qwen3-1.7B"}) == (
        "Qwen/Qwen3-1.7B"
    )
    opt = read_section(OptimizerConfig, "optimizer", {"name": "AdamW", "lr": 1e-5, "eps": 1e-8})
    assert (opt.lr, opt.eps) == (1e-5, 1e-8)
    training = read_section(TrainingConfig, "training", {
        "local_batch_size": 16, "seq_len": 2048, "max_norm": 1.0, "steps": 1000000, "dtype": "bfloat16", "gc_freq": 1,
    })
    assert training.torch_dtype == torch.bfloat16 and training.local_batch_size == 16
    par = read_section(ParallelismConfig, "parallelism", {
        "data_parallel_replicate_degree": 1, "data_parallel_shard_degree": 2, "tensor_parallel_degree": 1,
        "pipeline_parallel_degree": 1, "context_parallel_degree": 1, "expert_parallel_degree": 1,
        "disable_loss_parallel": True,
    })
    assert par.dp_shard == 2
    with pytest.raises(ValueError, match="procs=2"):
        par.check_world(1)
    ckpt = read_section(CheckpointConfig, "checkpoint", {
        "enable": True, "folder": "./checkpoint", "initial_load_path": "hf://Qwen/Qwen3-1.7B",
        "initial_load_in_hf": True, "last_save_in_hf": True, "interval": 500, "async_mode": "disabled",
    })
    assert (ckpt.folder, ckpt.interval) == ("./checkpoint", 500)

    with pytest.raises(ValueError, match="tensor_parallel_degree=2"):
        read_section(ParallelismConfig, "parallelism", {"tensor_parallel_degree": 2})
    with pytest.raises(ValueError, match="no setting 'learning_rate'"):
        read_section(OptimizerConfig, "optimizer", {"learning_rate": 1e-5})
    with pytest.raises(ValueError, match="training.dtype='fp8'"):
        read_section(TrainingConfig, "training", {"dtype": "fp8"})
