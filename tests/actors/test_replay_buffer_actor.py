"""The seeds' ReplayBuffer actor: add/sample through call_one in another process, as TorchForge code does."""

from __future__ import annotations

import pytest
import torch

from forge_nb.actors.replay_buffer import ReplayBuffer
from forge_nb.rl import Completion, Episode
from forge_nb.system.runtime import registry

pytestmark = pytest.mark.timeout(120)


def _episode(version: int, i: int) -> Episode:
    completion = Completion(prompt="a", text="aaaa", prompt_ids=torch.tensor([2]), token_ids=torch.tensor([2, 2]),
                            logprobs=torch.tensor([-0.1, -0.2]), generator_version=version)
    return Episode(episode_id=f"e{version}-{i}", pad_id=0, request_len=2, response_len=4, target="aaaa",
                   completion=completion, reward=1.0, advantage=0.5)


async def test_seed_style_actor_buffer(runtime):
    buf = await ReplayBuffer.options(procs=1).as_actor(batch_size=2, max_policy_age=1, collate=None)
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
    assert registry.meshes() == []


async def test_a_killed_buffer_comes_back_from_its_snapshot_with_nothing_acknowledged_lost(runtime, tmp_path):
    import os
    import signal

    from forge_nb.service import ReplicaDied

    snapshot = tmp_path / "buffer.pt"
    buf = await ReplayBuffer.options(procs=1, restart_backoff=0.1).as_actor(
        batch_size=2, max_policy_age=1, snapshot_path=str(snapshot), collate=None)
    try:
        assert await buf.restored.call_one() is None  # a fresh buffer restored nothing
        acknowledged = 0
        for i in range(5):
            await buf.add.call_one(_episode(0, i))
            acknowledged += 1
        await buf.sample.call_one(curr_policy_version=0)  # 2 leave the buffer, 3 stay
        old = buf.replica.mesh.pids[0]
        os.kill(old, signal.SIGKILL)
        try:
            await buf.add.call_one(_episode(0, 99))  # waited for the respawned actor, and stored
            acknowledged += 1
        except ReplicaDied:  # reached the dying process: its caller knows it was not stored
            pass
        await buf.replica.wait_healthy(timeout=60)
        assert buf.replica.mesh.pids[0] != old
        restored = await buf.restored.call_one()
        assert restored["episodes"] == 3 and restored["counters"]["added"] == 5  # all 5 acknowledged adds
        assert restored["counters"]["sampled"] == 2
        assert (await buf.counters.call_one())["added"] == acknowledged  # nothing acknowledged is missing
        batch = await buf.sample.call_one(curr_policy_version=1)  # the restored episodes are usable
        assert {e.episode_id for e in batch[0]} <= {f"e0-{i}" for i in (*range(5), 99)}
    finally:
        await buf.shutdown()
