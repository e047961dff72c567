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
from forge_nb.system import runtime
from forge_nb.system.leftovers import SOCKETS_ROOT
from tests.actors.test_trainer import first, make_batch

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.heavy]

LORA = {"rank": 4, "alpha": 8}  # the default targets: every linear layer of the blocks, and the output layer
NAMESPACE = "lora-gen"


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def pair(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from forge_nb.actors.generator import Generator
    from forge_nb.actors.trainer import RLTrainer

    model = str(build_tiny_model(tmp_path_factory.mktemp("lora-gen") / "tiny"))
    runtime.ensure_started()
    await weights.initialize_store()
    gen_mesh = await runtime.spawn_mesh("lora-gen", 1)
    trainer_mesh = await runtime.spawn_mesh("lora-train", 1)
    try:
        generator = gen_mesh.spawn("gen", Generator, engine_args={"model": model}, weights_namespace=NAMESPACE,
                                   sampling_params={"n": 4, "max_tokens": 8, "temperature": 1.0}, lora=LORA)
        trainer = trainer_mesh.spawn("trainer", RLTrainer, model=model, optimizer={"lr": 5e-2}, lora=LORA,
                                     weights_namespace=NAMESPACE)
        await trainer.setup.call()
        await generator.setup.call_one()
        yield SimpleNamespace(generator=generator, trainer=trainer, pid=gen_mesh.pids[0])
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
