"""RLTrainer.generate in a real monarch proc on CPU: completions as a Generator returns them, from the policy as it is.

A run's trainer answers its rollouts until the generators serve (``forge_nb.controller.lifecycle.stand_in``), so
what it samples must read as a Generator's: the prompt's ids, at most ``max_tokens`` sampled ids, the logprob of each
under the distribution it was drawn from (the trainer's own forward gives the same numbers), the version it was
sampled at; the run's sampling parameters honoured, and the others refused by name.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest
import pytest_asyncio
import torch
from monarch.actor import ActorError

from forge_nb import weights
from forge_nb.models import TinyModelConfig, build_tiny_model
from forge_nb.rl import Completion, Episode, collate
from forge_nb.system.runtime import lifecycle, spawning

pytestmark = pytest.mark.timeout(120)
on_module_loop = pytest.mark.asyncio(loop_scope="module")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def env(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from forge_nb.actors.trainer import RLTrainer

    model = build_tiny_model(tmp_path_factory.mktemp("sample") / "tiny", TinyModelConfig(alphabet="abc"))
    lifecycle.ensure_started()
    await weights.initialize_store()
    mesh = await spawning.spawn_mesh("trainer-sample", 1)
    try:
        trainer = mesh.spawn("sampler", RLTrainer, model=str(model), optimizer={"lr": 1e-2}, training={"seed": 3},
                             loss_config={"beta": 0.0})
        await trainer.setup.call()
        yield SimpleNamespace(trainer=trainer, model=str(model))
    finally:
        await mesh.stop()
        await weights.shutdown_store()


def one(value_mesh: Any) -> Any:
    return value_mesh.item(procs=0)


@on_module_loop
async def test_completions_read_as_a_generators_and_carry_the_policys_own_logprobs(env: Any) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(env.model)
    groups = one(await env.trainer.generate_many.call(["a", "abc"], n=4, max_tokens=4, temperature=1.0, top_p=1.0))
    assert [len(g) for g in groups] == [4, 4]
    for prompt, group in zip(["a", "abc"], groups, strict=True):
        for c in group:
            assert isinstance(c, Completion) and c.prompt == prompt and c.generator_version == 0
            assert c.prompt_ids.tolist() == tokenizer.encode(prompt)
            assert 1 <= len(c.token_ids) <= 4 and c.logprobs.shape == c.token_ids.shape
            assert (c.logprobs <= 0).all() and c.metadata["served_by"] == "trainer"
            stopped = c.token_ids[-1].item() == tokenizer.eos_token_id
            assert c.stop_reason == ("stop" if stopped else "length")
            assert stopped or len(c.token_ids) == 4
            kept = c.token_ids[:-1] if stopped else c.token_ids
            assert c.text == tokenizer.decode(kept, skip_special_tokens=True)
            # the trainer's forward of the same tokens: the logprobs the loss takes as the behaviour policy's
            ids = torch.cat([c.prompt_ids, c.token_ids])[None]
            forward = one(await env.trainer.forward.call(ids, len(c.prompt_ids)))
            torch.testing.assert_close(forward[0], c.logprobs, atol=1e-5, rtol=1e-5)
    # one prompt, as generate.route calls it
    single = one(await env.trainer.generate.call("ab", n=2, max_tokens=3))
    assert len(single) == 2 and all(len(c.token_ids) <= 3 for c in single)


@on_module_loop
async def test_sampling_parameters_are_honoured_and_others_refused_by_name(env: Any) -> None:
    greedy = one(await env.trainer.generate.call("ab", n=3, max_tokens=4, temperature=0.0))
    assert len({tuple(c.token_ids.tolist()) for c in greedy}) == 1  # the argmax, every sample
    top1 = one(await env.trainer.generate.call("ab", n=2, max_tokens=4, top_k=1))
    assert [c.token_ids.tolist() for c in top1] == [greedy[0].token_ids.tolist()] * 2
    assert torch.allclose(top1[0].logprobs, torch.zeros_like(top1[0].logprobs))  # all the mass on one token
    seeded = [one(await env.trainer.generate.call("a", n=4, max_tokens=4, seed=7)) for _ in range(2)]
    assert [c.token_ids.tolist() for c in seeded[0]] == [c.token_ids.tolist() for c in seeded[1]]
    long = one(await env.trainer.generate.call("a", n=4, max_tokens=3, ignore_eos=True))
    assert all(len(c.token_ids) == 3 and c.stop_reason == "length" for c in long)
    with pytest.raises(ActorError, match=r"not \['presence_penalty'\]"):
        await env.trainer.generate.call("a", presence_penalty=0.5)
    with pytest.raises(ActorError, match=r"top_p must be in \(0, 1\], got 1.5"):  # refused as vLLM refuses it
        await env.trainer.generate.call("a", top_p=1.5)


@on_module_loop
async def test_completions_carry_the_step_that_sampled_them(env: Any) -> None:
    group = one(await env.trainer.generate.call("abc", n=4, max_tokens=4))
    episodes = [Episode(episode_id=str(i), pad_id=0, request_len=4, response_len=4, completion=c, advantage=a)
                for i, (c, a) in enumerate(zip(group, [1.0, -1.0, 0.5, -0.5], strict=True))]
    result = one(await env.trainer.train_step.call(collate(episodes)))
    assert result.metrics["step"] == 1.0
    after = one(await env.trainer.generate.call("abc", n=1, max_tokens=2))
    assert after[0].generator_version == 1
