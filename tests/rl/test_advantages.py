"""Group-relative and leave-one-out advantages against hand computations."""

from __future__ import annotations

import math

import pytest
import torch

from forge_nb.rl import Episode, assign_advantages, group_relative, leave_one_out


def test_group_relative_by_hand() -> None:
    adv = group_relative([1.0, 0.0, 0.0, 1.0])
    std = math.sqrt((4 * 0.25) / 3)  # unbiased, as the seed's torch.std
    expected = [0.5 / (std + 1e-4), -0.5 / (std + 1e-4), -0.5 / (std + 1e-4), 0.5 / (std + 1e-4)]
    assert adv.tolist() == pytest.approx(expected)
    assert group_relative([1.0, 0.0, 0.0, 1.0], scale_by_std=False).tolist() == pytest.approx(
        [0.5, -0.5, -0.5, 0.5]
    )
    assert group_relative([2.0, 4.0], eps=0.0).tolist() == pytest.approx(
        [-1 / math.sqrt(2), 1 / math.sqrt(2)]
    )


def test_group_relative_degenerate_groups() -> None:
    assert group_relative([3.0, 3.0, 3.0]).tolist() == [0.0, 0.0, 0.0]
    assert group_relative([5.0]).tolist() == [0.0]
    assert group_relative(torch.tensor([1, 2])).dtype == torch.float32
    assert group_relative(torch.tensor([1.0, 2.0], dtype=torch.float64)).dtype == torch.float64
    with pytest.raises(ValueError, match="1-D"):
        group_relative(torch.zeros(2, 2))


def test_leave_one_out_by_hand() -> None:
    adv = leave_one_out([1.0, 2.0, 3.0, 6.0])
    assert adv.tolist() == pytest.approx([1 - 11 / 3, 2 - 10 / 3, 3 - 3, 6 - 2])
    assert leave_one_out([4.0]).tolist() == [0.0]
    assert leave_one_out([1.0, 1.0]).tolist() == [0.0, 0.0]


def make_group(rewards: list[float | None], quarantined: set[int] = frozenset()) -> list[Episode]:
    group = []
    for i, r in enumerate(rewards):
        e = Episode(episode_id=str(i), pad_id=0, request_len=1, response_len=1, reward=r)
        if i in quarantined:
            e.quarantine = "reward function 'f' raised ValueError: boom"
        group.append(e)
    return group


def test_assign_advantages_writes_episodes() -> None:
    group = make_group([1.0, 0.0, 0.5])
    returned = assign_advantages(group)
    assert [e.advantage for e in group] == returned
    assert returned == pytest.approx(group_relative([1.0, 0.0, 0.5]).tolist())
    assign_advantages(group, "rloo")
    assert [e.advantage for e in group] == pytest.approx([0.75, -0.75, 0.0])
    assign_advantages(group, "dr_grpo")
    assert [e.advantage for e in group] == pytest.approx([0.5, -0.5, 0.0])


def test_quarantined_episodes_get_zero_and_stay_out_of_the_statistics() -> None:
    group = make_group([1.0, None, 0.0, 100.0], quarantined={1, 3})
    assign_advantages(group, scale_by_std=False)
    assert [e.advantage for e in group] == pytest.approx([0.5, 0.0, -0.5, 0.0])
    everyone_out = make_group([None, None], quarantined={0, 1})
    assert assign_advantages(everyone_out) == [0.0, 0.0]


def test_assign_advantages_errors() -> None:
    with pytest.raises(ValueError, match="no reward"):
        assign_advantages(make_group([1.0, None]))
    with pytest.raises(ValueError, match="unknown advantage method 'ppo'"):
        assign_advantages(make_group([1.0]), "ppo")  # type: ignore[arg-type]
