"""ReplayBuffer: policy age, on-policy progress, dp split, overflow, counters and exact resume."""

from __future__ import annotations

import pickle

import pytest
import torch

from forge_nb.rl import Completion, Episode, ReplayBuffer, TrainBatch, collate


def ep(eid: str, version: int) -> Episode:
    return Episode(
        episode_id=eid,
        pad_id=0,
        request_len=2,
        response_len=2,
        completion=Completion(
            prompt="p",
            text="t",
            prompt_ids=torch.tensor([1]),
            token_ids=torch.tensor([2]),
            generator_version=version,
        ),
        advantage=0.0,
    )


def ids(batch: list[list[Episode]]) -> list[list[str]]:
    return [[e.episode_id for e in rank] for rank in batch]


def test_sample_waits_for_a_full_batch_and_consumes_it() -> None:
    buf = ReplayBuffer(batch_size=2, max_policy_age=1)
    buf.add(ep("a", 0))
    assert buf.sample(curr_policy_version=0) is None
    buf.add(ep("b", 0))
    buf.add(ep("c", 0))
    batch = buf.sample(curr_policy_version=0)
    assert len(batch) == 1 and len(batch[0]) == 2
    assert len(buf) == 1  # sampled episodes leave the buffer
    assert {e.episode_id for e in batch[0]} | {e.episode_id for e in buf.episodes()} == {"a", "b", "c"}
    assert buf.counters() == {"added": 3, "sampled": 2, "evicted_stale": 0, "evicted_overflow": 0}


def test_dp_split_and_batch_size_override() -> None:
    buf = ReplayBuffer(batch_size=2, max_policy_age=0, dp_size=3)
    for i in range(7):
        buf.add(ep(f"e{i}", 5))
    assert buf.sample(5, batch_size=3) is None  # needs 3 * 3
    batch = buf.sample(5)
    assert [len(rank) for rank in batch] == [2, 2, 2]
    assert len({e for rank in ids(batch) for e in rank}) == 6
    assert len(buf) == 1


def test_stale_episodes_are_evicted_by_age() -> None:
    buf = ReplayBuffer(batch_size=1, max_policy_age=2)
    for v in range(5):
        buf.add(ep(f"v{v}", v))
    assert buf.evict(curr_policy_version=4) == 2  # v0, v1 are older than 2 versions
    assert [e.policy_version for e in buf.episodes()] == [2, 3, 4]
    assert buf.evictions() == [("v0", "stale"), ("v1", "stale")]
    assert buf.counters()["evicted_stale"] == 2
    batch = buf.sample(curr_policy_version=6)  # now only v4 is usable
    assert ids(batch) == [["v4"]]
    assert buf.counters()["evicted_stale"] == 4


def test_fully_on_policy_makes_progress() -> None:
    """max_policy_age=0: each step trains only on its own version's episodes, and never stalls,
    even when stragglers from the previous version arrive after the weight update."""
    buf = ReplayBuffer(batch_size=4, max_policy_age=0)
    for step in range(10):
        for i in range(2):  # stragglers from the last version
            buf.add(ep(f"late{step}-{i}", max(step - 1, 0)))
        batch = buf.sample(step)
        if step > 0:
            assert batch is None  # stragglers are evicted, not waited on
        for i in range(4):
            buf.add(ep(f"s{step}-{i}", step))
        batch = buf.sample(step)
        assert batch is not None, f"stalled at step {step}"
        assert all(e.policy_version == step for e in batch[0])
    assert buf.counters()["sampled"] == 40


def test_overflow_evicts_oldest() -> None:
    buf = ReplayBuffer(batch_size=2, max_policy_age=10, max_size=4)
    for i in range(6):
        buf.add(ep(f"e{i}", 0))
    assert [e.episode_id for e in buf.episodes()] == ["e2", "e3", "e4", "e5"]
    assert buf.evictions() == [("e0", "overflow"), ("e1", "overflow")]
    assert buf.counters()["evicted_overflow"] == 2


def test_overflow_drops_known_stale_episodes_first() -> None:
    buf = ReplayBuffer(batch_size=2, max_policy_age=1, max_size=4)
    buf.add(ep("fresh0", 3))
    assert buf.sample(3) is None  # the buffer now knows the trainer is at version 3
    buf.add(ep("old0", 1))
    buf.add(ep("old1", 1))
    buf.add(ep("fresh1", 3))
    buf.add(ep("fresh2", 3))
    assert [e.episode_id for e in buf.episodes()] == ["fresh0", "fresh1", "fresh2"]
    assert buf.counters()["evicted_stale"] == 2 and buf.counters()["evicted_overflow"] == 0


def test_collate_is_applied() -> None:
    buf = ReplayBuffer(
        batch_size=2, max_policy_age=0, dp_size=2, collate=lambda ranks: [collate(r) for r in ranks]
    )
    for i in range(4):
        buf.add(ep(f"e{i}", 0))
    batches = buf.sample(0)
    assert len(batches) == 2 and all(isinstance(b, TrainBatch) and len(b) == 2 for b in batches)


def test_state_dict_round_trip_resumes_exactly() -> None:
    def filled() -> ReplayBuffer:
        b = ReplayBuffer(batch_size=2, max_policy_age=1, max_size=6, seed=123)
        for i in range(8):
            b.add(ep(f"e{i}", i // 3))
        b.sample(2)
        return b

    original = filled()
    state = pickle.loads(pickle.dumps(original.state_dict()))  # it must survive a checkpoint
    resumed = ReplayBuffer(batch_size=2, max_policy_age=1, max_size=6, seed=999)
    resumed.load_state_dict(state)
    assert resumed.counters() == original.counters()
    assert resumed.evictions() == original.evictions()
    assert [e.episode_id for e in resumed.episodes()] == [e.episode_id for e in original.episodes()]
    for i in range(8, 14):
        original.add(ep(f"e{i}", 3))
        resumed.add(ep(f"e{i}", 3))
    assert ids(resumed.sample(3)) == ids(original.sample(3))
    assert ids(resumed.sample(3)) == ids(original.sample(3))
    assert resumed.counters() == original.counters()


def test_seeded_sampling_is_reproducible_and_seed_dependent() -> None:
    def run(seed: int) -> list[list[str]]:
        b = ReplayBuffer(batch_size=4, max_policy_age=0, seed=seed)
        for i in range(12):
            b.add(ep(f"e{i}", 0))
        return ids(b.sample(0))

    assert run(1) == run(1)
    assert run(1) != run(2)


def test_clear_and_len() -> None:
    buf = ReplayBuffer(batch_size=1, max_policy_age=0)
    buf.add(ep("a", 0))
    assert len(buf) == 1
    buf.clear()
    assert len(buf) == 0 and buf.counters()["added"] == 1


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"batch_size": 0, "max_policy_age": 0}, "batch_size"),
        ({"batch_size": 1, "max_policy_age": -1}, "max_policy_age"),
        ({"batch_size": 1, "max_policy_age": 0, "dp_size": 0}, "dp_size"),
        ({"batch_size": 4, "max_policy_age": 0, "dp_size": 2, "max_size": 7}, "max_size"),
    ],
)
def test_config_validation(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ReplayBuffer(**kwargs)


def test_add_rejects_non_episodes_and_incomplete_episodes() -> None:
    buf = ReplayBuffer(batch_size=1, max_policy_age=0)
    with pytest.raises(TypeError, match="Episode"):
        buf.add({"episode_id": "x"})  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no completion"):
        buf.add(Episode(episode_id="x", pad_id=0, request_len=1, response_len=1))


def test_documents_episodes_get_the_buffer_version_and_a_batch_baseline_advantage() -> None:
    buf = ReplayBuffer(batch_size=2, max_policy_age=1)
    assert buf.sample(curr_policy_version=3) is None  # the trainer is at version 3
    first = Episode(prompt_ids=[1], response_ids=[2], reward=1.0)
    buf.add(first)
    buf.add(Episode(prompt_ids=[1], response_ids=[3], reward=0.0))
    assert first.policy_version == 3  # age counts from when it entered the buffer
    batch = buf.sample(curr_policy_version=4)
    assert batch is not None  # not evicted as "version 0" stale
    assert sorted(e.advantage for e in batch[0]) == [-0.5, 0.5]  # reward - mean of the sample


def test_sample_without_a_version_evicts_nothing() -> None:
    buf = ReplayBuffer(batch_size=1, max_policy_age=0)
    buf.add(ep("old", 0))
    assert ids(buf.sample()) == [["old"]] and buf.counters()["evicted_stale"] == 0
    buf.add(ep("old2", 0))
    assert buf.sample(curr_policy_version=7) is None and buf.counters()["evicted_stale"] == 1


def test_batch_baseline_keeps_given_advantages_and_zeroes_quarantined() -> None:
    from forge_nb.rl.advantages import batch_baseline

    given = Episode(prompt_ids=[1], response_ids=[2], reward=5.0, advantage=0.25)
    bad = Episode(prompt_ids=[1], response_ids=[2], reward=0.0, quarantine="reward raised")
    a = Episode(prompt_ids=[1], response_ids=[2], reward=3.0)
    b = Episode(prompt_ids=[1], response_ids=[2], reward=1.0)
    assert batch_baseline([given, bad, a, b]) == 3
    assert (given.advantage, bad.advantage, a.advantage, b.advantage) == (0.25, 0.0, 1.0, -1.0)
    lone = Episode(prompt_ids=[1], response_ids=[2], reward=1.0)
    batch_baseline([lone])
    assert lone.advantage == 0.0


def test_add_refuses_an_episode_with_nothing_to_learn_from() -> None:
    buf = ReplayBuffer(batch_size=1, max_policy_age=0)
    with pytest.raises(ValueError, match="reward"):
        buf.add(Episode(prompt_ids=[1], response_ids=[2]))
