"""The seeds' ReplayBuffer actor: add/sample through call_one in another process, as TorchForge code does."""

from __future__ import annotations

import pytest
import torch

from forge_nb.actors.replay_buffer import ReplayBuffer
from forge_nb.rl import Completion, Episode

pytestmark = pytest.mark.timeout(120)


def _episode(version: int, i: int) -> Episode:
    completion = Completion(prompt="a", text="aaaa", prompt_ids=torch.tensor([2]), token_ids=torch.tensor([2, 2]),
                            logprobs=torch.tensor([-0.1, -0.2]), generator_version=version)
    return Episode(episode_id=f"e{version}-{i}", pad_id=0, request_len=2, response_len=4, target="aaaa",
                   completion=completion, reward=1.0, advantage=0.5)


async def test_seed_style_actor_buffer(runtime):
    buf = await ReplayBuffer.options(procs=1).as_actor(batch_size=2, max_policy_age=1)
    try:
        assert await buf.sample.call_one(curr_policy_version=0) is None
        for i in range(3):
            await buf.add.call_one(_episode(0, i))
        batch = await buf.sample.call_one(curr_policy_version=1)
        assert [len(shard) for shard in batch] == [2] and batch[0][0].completion.generator_version == 0
        assert await buf.sample.call_one(curr_policy_version=5) is None  # the third is now stale
        counters = await buf.counters.call_one()
        assert (counters["added"], counters["sampled"], counters["evicted_stale"]) == (3, 2, 1)
    finally:
        await buf.shutdown()


async def test_bad_arguments_reach_the_caller(runtime):
    with pytest.raises(RuntimeError, match="batch_size"):
        await ReplayBuffer.as_actor(batch_size=0, max_policy_age=1)
    assert runtime.meshes() == []
