"""A multi-turn trajectory becomes one Episode whose loss sees the policy's tokens only."""

from __future__ import annotations

import pytest
import torch

from forge_nb.rl import assign_advantages, collate
from forge_nb.rl.trajectory import Trajectory


def _two_turns(max_tokens: int = 12) -> Trajectory:
    t = Trajectory(prompt="a", prompt_ids=[2], max_tokens=max_tokens)
    t.act("aa", [2, 2], [-0.5, -0.25], version=3)
    t.observe("b", [3], reward=0.5, done=False, info={"right": 2})
    t.act("bc", [3, 4], [-0.1, -2.0], version=2)
    t.observe("", [], reward=0.25, done=True)
    return t


def test_only_the_policy_s_tokens_are_trained_and_the_rest_is_context():
    t = _two_turns()
    assert t.context_ids == [2, 2, 2, 3, 3, 4] and t.done and t.room == 12 - 5
    ep = t.to_episode(pad_id=0, request_len=4)
    assert ep.completion.token_ids.tolist() == [2, 2, 3, 3, 4]
    assert ep.policy_mask.tolist() == [True, True, False, True, True]
    assert ep.completion.logprobs.tolist() == [-0.5, -0.25, 0.0, pytest.approx(-0.1), -2.0]
    assert ep.reward == 0.75 and ep.rewards == {"env": 0.75}
    assert ep.policy_version == 2  # the oldest turn's weights: the age the buffer must check
    assert [turn["action"] for turn in ep.completion.metadata["turns"]] == ["aa", "bc"]
    assert ep.completion.metadata["turns"][0]["info"] == {"right": 2}
    mask = ep.mask()
    assert mask.shape == (12,) and mask.tolist() == [True, True, False, True, True] + [False] * 7


def test_collate_masks_environment_tokens_in_the_batch():
    group = [_two_turns().to_episode(pad_id=0, request_len=4) for _ in range(2)]
    group[1].reward = 0.0
    assign_advantages(group)
    batch = collate(group)
    assert batch.response.shape == (2, 12) and batch.tokens.shape == (2, 16)
    assert batch.response_mask[0, :5].tolist() == [True, True, False, True, True]
    assert int(batch.response_mask.sum()) == 8
    assert batch.tokens[0, :4].tolist() == [0, 0, 0, 2]  # the first observation, left-padded


def test_an_observation_longer_than_the_room_left_is_cut_and_ends_the_trajectory():
    t = Trajectory(prompt="a", prompt_ids=[2], max_tokens=4)
    t.act("aa", [2, 2], None, version=None)
    t.observe("bcdef", [3, 4, 5, 6, 7], reward=0.0, done=False)
    assert t.done and t.room == 0 and t.turns[0].observation_ids == [3, 4]
    assert t.turns[0].info == {"truncated": True}
    ep = t.to_episode(pad_id=0)
    assert ep.policy_mask.tolist() == [True, True, False, False] and ep.policy_version is None
    with pytest.raises(ValueError, match="does not fit"):
        t.act("a", [2], None, version=0)


def test_a_dropped_trajectory_is_quarantined_with_its_reason():
    t = Trajectory(prompt="a", prompt_ids=[2], max_tokens=4)
    t.act("aa", [2, 2], [-1.0, -1.0], version=0)
    t.dropped = "environment step failed at turn 1: replica died"
    assert t.to_episode(pad_id=0).quarantine == t.dropped


def test_mistakes_are_refused_with_what_to_do():
    t = Trajectory(prompt="a", prompt_ids=[2], max_tokens=4)
    with pytest.raises(ValueError, match="observe\\(\\) before act\\(\\)"):
        t.observe("b", [3], 0.0, False)
    with pytest.raises(ValueError, match="1 logprobs for 2 action tokens"):
        t.act("aa", [2, 2], [-1.0], version=0)
    ep = _two_turns().to_episode(pad_id=0)
    with pytest.raises(ValueError, match="one flag per response token"):
        type(ep)(completion=ep.completion, policy_mask=torch.ones(3, dtype=torch.bool))
