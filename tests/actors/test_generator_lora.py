"""A LoRA generator (vLLM's own LoRA on CPU) beside a LoRA trainer, both real: each version the trainer pushes is its
adapters alone, the generator serves them on the untouched base model, and its logprobs are the trainer's."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import pytest_asyncio
import torch

from forge_nb import weights
from forge_nb.models import build_tiny_model
from forge_nb.system.processes.procs import SOCKETS_ROOT
from forge_nb.system.runtime import lifecycle, spawning
from tests.actors.test_trainer import first, make_batch

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.heavy]

LORA = {"rank": 4, "alpha": 8}  # the default targets: every linear layer of the blocks, and the output layer
NAMESPACE = "lora-gen"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pair(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from forge_nb.actors.generator import Generator
    from forge_nb.actors.trainer import RLTrainer

    model = str(build_tiny_model(tmp_path_factory.mktemp("lora-gen") / "tiny"))
    lifecycle.ensure_started()
    await weights.initialize_store()
    gen_mesh = await spawning.spawn_mesh("lora-gen", 1)
    trainer_mesh = await spawning.spawn_mesh("lora-train", 1)
    try:
        generator = gen_mesh.spawn("gen", Generator, engine_args={"model": model}, weights_namespace=NAMESPACE,
                                   sampling_params={"n": 4, "max_tokens": 8, "temperature": 1.0}, lora=LORA)
        trainer = trainer_mesh.spawn("trainer", RLTrainer, model=model, optimizer={"lr": 5e-2}, lora=LORA,
                                     weights_namespace=NAMESPACE)
        await trainer.setup.call()
        await generator.setup.call_one()
        yield SimpleNamespace(generator=generator, trainer=trainer, pid=gen_mesh.pids[0], model=model)
    finally:
        await gen_mesh.stop()
        await trainer_mesh.stop()
        await weights.shutdown_store()


async def worst_gap(pair: Any) -> float:
    """The largest difference between the generator's logprob of a sampled token and the trainer's (adapters on)."""
    worst = 0.0
    for prompt in ("abcab", "h", "gfedc"):
        for c in await pair.generator.generate.call_one(prompt):
            tokens = torch.cat([c.prompt_ids, c.token_ids]).long()[None]
            theirs = first(await pair.trainer.forward.call(tokens, len(c.prompt_ids)))[0]
            worst = max(worst, float((theirs - c.logprobs).abs().max()))
    return worst


@pytest.mark.timeout(400)  # includes the module's engine start-up
async def test_the_generator_serves_each_pushed_adapter_with_the_trainer_s_logprobs(pair: Any) -> None:
    assert await worst_gap(pair) < 1e-5  # version 0: the base model (the adapters add nothing yet)
    batch = make_batch()
    step = 0
    for version in (1, 5):
        while step < version:
            await pair.trainer.train_step.call(batch)
            step += 1
        pushed = first(await pair.trainer.push_weights.call(version))
        assert await pair.generator.update_weights.call_one(version, manifest=pushed["manifest"]) == version
        gap = await worst_gap(pair)
        assert gap < 1e-5, f"version {version}: the generator's logprobs differ from the trainer's by {gap:.2e}"
        (c, *_) = await pair.generator.generate.call_one("abc")
        assert c.generator_version == version
    adapters = list((SOCKETS_ROOT / f"{pair.pid}-lora").iterdir())
    assert len(adapters) == 1, adapters  # the version it replaced was removed, from the engine and the disk


@pytest.mark.timeout(120)
async def test_a_full_model_version_is_refused_by_a_lora_generator(pair: Any) -> None:
    serving = await pair.generator.get_version.call_one()
    await weights.push_state_dict({"model.embed_tokens.weight": torch.zeros(4, 4)}, 77, namespace=NAMESPACE)
    with pytest.raises(Exception, match="holds no LoRA adapters"):
        await pair.generator.update_weights.call_one(77)
    assert await pair.generator.get_version.call_one() == serving  # the adapter it served stays
    (c, *_) = await pair.generator.generate.call_one("abc")
    assert c.generator_version == serving


OTHER = "lora-gen-b"  # a second run on the same base: other targets, another rank
OTHER_LORA = {"rank": 2, "alpha": 4, "target_modules": ["q_proj", "v_proj"]}


def other_run_model(model: str) -> Any:
    """The tiny model with OTHER's adapters, loaded here with peft: random (not zero) lora_B, so they change it."""
    from transformers import AutoModelForCausalLM

    from forge_nb.actors.training import lora
    from forge_nb.config.trainer_sections import LoraConfig

    module = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    lora.inject(module, LoraConfig(**OTHER_LORA))
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in module.named_parameters():
            if ".lora_" in name:
                p.copy_(torch.randn(p.shape, generator=generator) * 0.3)
    return module.eval()


async def gap_to(model: Any, completions: list[Any]) -> float:
    """The largest difference between the generator's logprob of a sampled token and ``model``'s, computed here."""
    from forge_nb.rl import aligned_logits, compute_logprobs

    worst = 0.0
    for c in completions:
        tokens = torch.cat([c.prompt_ids, c.token_ids]).long()[None]
        with torch.no_grad():
            response = tokens[:, len(c.prompt_ids):]
            theirs = compute_logprobs(aligned_logits(model(input_ids=tokens).logits, response.shape[1]), response)[0]
        worst = max(worst, float((theirs - c.logprobs).abs().max()))
    return worst


@pytest.mark.timeout(240)
async def test_a_second_run_on_the_base_is_served_its_own_adapter_beside_the_first(pair: Any) -> None:
    import asyncio

    from forge_nb.actors.training import lora

    gen = pair.generator
    with pytest.raises(Exception, match="add_adapter"):  # a namespace the generator was never given
        await gen.generate.call_one("abc", adapter=OTHER)
    with pytest.raises(Exception, match="max_lora_rank"):  # the engine was built for rank <= 8
        await gen.add_adapter.call_one(OTHER, {"rank": 16})
    await gen.add_adapter.call_one(OTHER, OTHER_LORA)
    ours = await gen.get_version.call_one()
    # before its first version the second run is served the base model (an adapter of zeros): the trainer's with
    # its adapters off
    for c in await gen.generate.call_one("abcab", adapter=OTHER):
        tokens = torch.cat([c.prompt_ids, c.token_ids]).long()[None]
        theirs = first(await pair.trainer.forward.call(tokens, len(c.prompt_ids), adapters=False))[0]
        assert float((theirs - c.logprobs).abs().max()) < 1e-5
        assert c.generator_version == 0

    model = other_run_model(pair.model)
    await weights.push_state_dict(lora.adapter_state_dict(model), 3, namespace=OTHER)
    assert await gen.update_weights.call_one(3, namespace=OTHER) == 3
    assert await gen.adapters.call_one() == {NAMESPACE: ours, OTHER: 3}  # the first run's version is untouched
    # the two runs' requests together, in one engine batch: each sampled with its own adapter
    mine, theirs = await asyncio.gather(gen.generate.call_one("gfedc"), gen.generate.call_one("gfedc", adapter=OTHER))
    assert {c.generator_version for c in mine} == {ours} and {c.generator_version for c in theirs} == {3}
    assert await gap_to(model, theirs) < 1e-4
    assert await worst_gap(pair) < 1e-5  # the first run's completions are still the trainer's

    await gen.drop_adapter.call_one(OTHER)
    with pytest.raises(Exception, match="add_adapter"):
        await gen.generate.call_one("abc", adapter=OTHER)
    assert [p.name for p in (SOCKETS_ROOT / f"{pair.pid}-lora").iterdir() if p.name.startswith(OTHER)] == []
    assert await gen.adapters.call_one() == {NAMESPACE: ours}
    more = [f"lora-gen-{i}" for i in range(3)]  # the engine holds adapters for four runs (max_loras 8: two each)
    for name in more:
        await gen.add_adapter.call_one(name, OTHER_LORA)
    with pytest.raises(Exception, match="max_loras"):
        await gen.add_adapter.call_one(OTHER, OTHER_LORA)
    for name in more:
        await gen.drop_adapter.call_one(name)
