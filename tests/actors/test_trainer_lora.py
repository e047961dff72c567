"""RLTrainer with LoRA in a real monarch proc on CPU: the adapters alone train, push and checkpoint; the base is the
KL term's reference in the same process; the adapter folder it writes is peft's (PeftModel loads it as trained)."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from forge_nb import weights
from forge_nb.actors.training.policy_model import real_token_mask
from forge_nb.rl import aligned_logits, compute_logprobs
from tests.actors import test_trainer as shared
from tests.actors.test_trainer import first, make_batch

pytestmark = [pytest.mark.timeout(180), pytest.mark.asyncio(loop_scope="module")]

LORA = {"rank": 4, "alpha": 8}
env = shared.env  # test_trainer's module-scoped fixture: a 1-proc mesh, the tiny model and torchstore


async def spawn(env: Any, name: str, **kwargs: Any) -> Any:
    return await shared.spawn(env.mesh, name, env.model, optimizer={"lr": 1e-2}, lora=LORA, **kwargs)


async def logprobs(trainer: Any, batch: Any, adapters: bool = True) -> torch.Tensor:
    return first(await trainer.forward.call(batch.tokens, batch.request_len, adapters=adapters))


def in_process(model: Any, batch: Any) -> torch.Tensor:
    """The response logprobs of a transformers (or peft) model loaded here, with the trainer's left-padding mask
    and positions."""
    tokens, width = batch.tokens, batch.request_len
    mask = real_token_mask(tokens, 0, width)
    with torch.no_grad():
        logits = model(input_ids=tokens, attention_mask=mask, position_ids=(mask.cumsum(1) - 1).clamp(min=0)).logits
    return compute_logprobs(aligned_logits(logits, tokens.shape[1] - width), tokens[:, width:])


async def test_the_adapters_alone_train_and_push_and_the_base_stays_the_reference(env: Any) -> None:
    trainer = await spawn(env, "lora-steps")
    batch = make_batch()
    base = await logprobs(trainer, batch, adapters=False)
    torch.testing.assert_close(await logprobs(trainer, batch), base)  # lora_B starts at 0: nothing added yet
    for _ in range(3):
        assert first(await trainer.train_step.call(batch)).metrics["skipped"] == 0.0
    trained = await logprobs(trainer, batch)
    assert not torch.allclose(trained, base)  # the policy moved ...
    torch.testing.assert_close(await logprobs(trainer, batch, adapters=False), base)  # ... and its base did not

    pushed = first(await trainer.push_weights.call(7))
    stored = await weights.load_state_dict(7)
    assert stored and all(".lora_A.weight" in k or ".lora_B.weight" in k for k in stored), sorted(stored)[:4]
    assert {k.split(".lora_")[0].rsplit(".", 1)[-1] for k in stored} == {
        "q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"}
    moved = sum(t.numel() * t.element_size() for t in stored.values())
    whole = sum(t.numel() * t.element_size() for t in load_file(Path(env.model) / "model.safetensors").values())
    assert pushed["mb"] * 2**20 == moved and moved < 0.15 * whole, (moved, whole)  # the adapters' bytes only
    assert first(await trainer.state_dict.call())["model"].keys() == stored.keys()


async def test_a_batch_without_reference_logprobs_is_trained_against_the_base(env: Any) -> None:
    # a LoRA run's episodes come without reference logprobs; two trainers alike (same seed, same adapters) train
    # the same batches, one given the base's logprobs as the episodes' reference, the other left to find them
    kl = {"loss": "grpo", "loss_config": {"beta": 0.5}}
    given, left = await spawn(env, "ref-given", **kl), await spawn(env, "ref-left", **kl)
    batch = make_batch()
    base = await logprobs(given, batch, adapters=False)
    with_base = dataclasses.replace(batch, ref_logprobs=base, has_ref_logprobs=True)
    without = dataclasses.replace(batch, ref_logprobs=torch.zeros_like(base), has_ref_logprobs=False)
    for step in range(3):
        a = first(await given.train_step.call(with_base)).metrics
        b = first(await left.train_step.call(without)).metrics
        assert a["skipped"] == b["skipped"] == 0.0
        for name in ("loss", "kl/k3", "grad_norm"):
            assert b[name] == pytest.approx(a[name], rel=1e-4, abs=1e-7), (step, name)
    assert a["kl/k3"] > 0  # the adapters moved the policy away from the base, and the KL term saw it


async def test_a_lora_checkpoint_holds_the_adapters_and_resumes(env: Any) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    folder = env.tmp.mktemp("lora-ckpt")
    trainer = await spawn(env, "lora-ckpt-a", checkpoint={"folder": str(folder)})
    batch = make_batch()
    for _ in range(2):
        await trainer.train_step.call(batch)
    path = first(await trainer.save_checkpoint.call())
    saved = FileSystemReader(path).read_metadata().state_dict_metadata
    model_keys = [k for k in saved if k.startswith("model.")]
    assert model_keys and all("lora_" in k for k in model_keys), model_keys[:4]  # no base weight in it
    resumed = await spawn(env, "lora-ckpt-b", checkpoint={"folder": str(folder)})
    assert first(await resumed.info.call())["step"] == 2
    torch.testing.assert_close(await logprobs(resumed, batch), await logprobs(trainer, batch))
    await trainer.train_step.call(batch)
    await resumed.train_step.call(batch)
    # one more step from the same state: the optimizer's moments came back too
    torch.testing.assert_close(await logprobs(resumed, batch), await logprobs(trainer, batch))


async def test_the_saved_adapter_loads_in_peft_as_it_was_trained(env: Any) -> None:
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    trainer = await spawn(env, "lora-export")
    batch = make_batch()
    for _ in range(2):
        await trainer.train_step.call(batch)
    folder = first(await trainer.save_adapter.call(str(env.tmp.mktemp("adapter"))))
    assert {p.name for p in Path(folder).iterdir()} == {"adapter_config.json", "adapter_model.safetensors"}
    model = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(env.model, dtype=torch.float32), folder)
    torch.testing.assert_close(in_process(model, batch), await logprobs(trainer, batch), atol=1e-5, rtol=1e-4)


async def test_the_merged_model_is_a_checkpoint_with_the_trained_policy(env: Any) -> None:
    from transformers import AutoModelForCausalLM

    trainer = await spawn(env, "lora-merged")
    batch = make_batch()
    for _ in range(2):
        await trainer.train_step.call(batch)
    folder = first(await trainer.save_merged.call(str(env.tmp.mktemp("merged"))))
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)  # no peft: a plain checkpoint
    assert not [n for n, _ in model.named_parameters() if "lora" in n]
    torch.testing.assert_close(in_process(model, batch), await logprobs(trainer, batch), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(await logprobs(trainer, batch, adapters=False),  # the trainer's base is untouched
                               await logprobs(await spawn(env, "lora-merged-base"), batch))


async def test_a_target_the_model_lacks_is_refused_with_its_layers(env: Any) -> None:
    from forge_nb.actors.trainer import RLTrainer

    actor = env.mesh.spawn("lora-bad", RLTrainer, model=env.model, lora={"target_modules": ["wq"]})
    with pytest.raises(Exception, match=r"lora.target_modules=\['wq'\].*q_proj"):
        await actor.setup.call()


async def test_two_runs_train_their_own_adapters_on_one_base_in_one_process(env: Any) -> None:
    from torch.distributed.checkpoint import FileSystemReader

    folder = env.tmp.mktemp("lora-shared")
    a = await spawn(env, "lora-base-a", weights_namespace="run-a")
    # another run's trainer in the same process, on a's model: other targets, another rank, its own optimizer
    b = await shared.spawn(env.mesh, "lora-base-b", env.model, optimizer={"lr": 1e-2}, weights_namespace="run-b",
                           lora={"rank": 2, "alpha": 4, "target_modules": ["q_proj", "v_proj"]}, share_base=True,
                           checkpoint={"folder": str(folder)})
    assert first(await b.info.call())["adapters"] == ["run-a", "run-b"]  # one model holds both
    batch = make_batch()
    base = await logprobs(a, batch, adapters=False)
    torch.testing.assert_close(await logprobs(b, batch), base)  # b's lora_B starts at 0

    for _ in range(3):
        assert first(await b.train_step.call(batch)).metrics["skipped"] == 0.0
    b_trained = await logprobs(b, batch)
    assert not torch.allclose(b_trained, base)
    torch.testing.assert_close(await logprobs(a, batch), base)  # b's steps left a's policy where it was
    for _ in range(2):
        await a.train_step.call(batch)
    a_trained = await logprobs(a, batch)
    assert not torch.allclose(a_trained, base) and not torch.allclose(a_trained, b_trained)
    torch.testing.assert_close(await logprobs(b, batch), b_trained)  # ... and a's left b's
    torch.testing.assert_close(await logprobs(b, batch, adapters=False), base)

    await b.push_weights.call(4)
    stored = await weights.load_state_dict(4, namespace="run-b")
    assert {k.split(".lora_")[0].rsplit(".", 1)[-1] for k in stored} == {"q_proj", "v_proj"}
    assert all(k.endswith((".lora_A.weight", ".lora_B.weight")) for k in stored), sorted(stored)[:2]

    path = first(await b.save_checkpoint.call())
    saved = [k for k in FileSystemReader(path).read_metadata().state_dict_metadata if k.startswith("model.")]
    assert saved and all(".run-b." in k for k in saved), saved[:4]  # b's adapter alone, not a's
    await b.train_step.call(batch)
    assert first(await b.load_checkpoint.call()) == 3
    torch.testing.assert_close(await logprobs(b, batch), b_trained)
    torch.testing.assert_close(await logprobs(a, batch), a_trained)

    await b.release.call()  # b's run ended: a trains on, alone on the model
    with pytest.raises(Exception, match="released"):
        await b.forward.call(batch.tokens, batch.request_len)
    assert first(await a.info.call())["adapters"] == ["run-a"]
    assert first(await a.train_step.call(batch)).metrics["skipped"] == 0.0


async def test_a_shared_base_needs_a_lora_trainer_of_that_model_in_the_process(env: Any) -> None:
    from forge_nb.actors.trainer import RLTrainer

    lonely = env.mesh.spawn("lora-no-base", RLTrainer, model=env.model, share_base=True)
    with pytest.raises(Exception, match="share_base=True: .*lora section"):
        await lonely.setup.call()
