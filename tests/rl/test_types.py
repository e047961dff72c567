"""Completion, Episode tensors, collate and the seed-compatible collate_seed."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
import torch

from forge_nb.rl import Completion, Episode, TrainBatch, collate, collate_seed
from forge_nb.rl.types import ForwardBackwardResult, SeedBatch, TextTrainBatch

PAD = 0


def completion(prompt_ids, token_ids, logprobs=None, version: int = 3) -> Completion:
    return Completion(
        prompt="p",
        text="t",
        prompt_ids=torch.tensor(prompt_ids),
        token_ids=torch.tensor(token_ids),
        logprobs=None if logprobs is None else torch.tensor(logprobs),
        generator_version=version,
    )


def episode(prompt_ids, token_ids, *, logprobs=None, ref=None, advantage=0.5, version=3, eid="e") -> Episode:
    return Episode(
        episode_id=eid,
        pad_id=PAD,
        request_len=4,
        response_len=3,
        target="x",
        completion=completion(prompt_ids, token_ids, logprobs, version),
        ref_logprobs=None if ref is None else torch.tensor(ref),
        advantage=advantage,
    )


def test_request_tensor_left_pads_and_left_truncates() -> None:
    assert episode([5, 6], [7]).request_tensor.tolist() == [PAD, PAD, 5, 6]
    assert episode([1, 2, 3, 4, 5, 6], [7]).request_tensor.tolist() == [3, 4, 5, 6]


def test_response_tensor_and_mask() -> None:
    short = episode([5], [7])
    assert short.response_tensor.tolist() == [7, PAD, PAD]
    assert short.response_mask.tolist() == [True, False, False]
    long = episode([5], [7, 8, 9, 10])
    assert long.response_tensor.tolist() == [7, 8, 9]
    assert long.response_mask.tolist() == [True, True, True]
    # pad id used as EOS by the generator: the generated EOS is still a real token
    eos_is_pad = episode([5], [7, PAD])
    assert eos_is_pad.response_mask.tolist() == [True, True, False]


def test_episode_conveniences_and_errors() -> None:
    ep = episode([5], [7], version=9)
    assert ep.policy_version == 9 and ep.prompt == "p" and ep.quarantine is None and ep.rewards == {}
    empty = Episode(episode_id="x", pad_id=0, request_len=2, response_len=2)
    assert empty.prompt is None
    with pytest.raises(ValueError, match="no completion"):
        empty.request_tensor  # noqa: B018
    with pytest.raises(ValueError, match="response_len"):
        Episode(episode_id="x", pad_id=0, request_len=2, response_len=0)
    restored = pickle.loads(pickle.dumps(ep))  # episodes travel between processes
    assert restored.response_tensor.tolist() == ep.response_tensor.tolist()


def test_completion_validation() -> None:
    c = Completion(prompt="p", text="t", prompt_ids=[1, 2], token_ids=[3])
    assert c.prompt_ids.dtype == torch.long and c.metadata == {} and c.generator_version is None
    with pytest.raises(ValueError, match="logprobs"):
        completion([1], [2, 3], logprobs=[-0.1])
    with pytest.raises(ValueError, match="1-D"):
        Completion(prompt="p", text="t", prompt_ids=torch.zeros(2, 2, dtype=torch.long), token_ids=[1])
    with pytest.raises(ValueError, match="generator_version"):
        Completion(prompt="p", text="t", prompt_ids=[1], token_ids=[1], generator_version="3")


def test_collate_shapes_and_values() -> None:
    episodes = [
        episode([5, 6], [7, 8], logprobs=[-0.5, -0.25], ref=[-1.0, -2.0, -3.0], advantage=1.5, version=2),
        episode([9], [4, 3, 2, 1], logprobs=[-0.1, -0.2, -0.3, -0.4], ref=[-1.0], advantage=-1.0, version=3),
    ]
    batch = collate(episodes)
    assert batch.tokens.tolist() == [[PAD, PAD, 5, 6, 7, 8, PAD], [PAD, PAD, PAD, 9, 4, 3, 2]]
    assert batch.response.tolist() == [[7, 8, PAD], [4, 3, 2]]
    assert batch.response_mask.tolist() == [[True, True, False], [True, True, True]]
    assert batch.response_mask.dtype == torch.bool
    torch.testing.assert_close(batch.ref_logprobs, torch.tensor([[-1.0, -2.0, -3.0], [-1.0, 0.0, 0.0]]))
    torch.testing.assert_close(
        batch.generator_logprobs, torch.tensor([[-0.5, -0.25, 0.0], [-0.1, -0.2, -0.3]])
    )
    torch.testing.assert_close(batch.advantages, torch.tensor([[1.5], [-1.0]]))
    assert batch.policy_versions.tolist() == [2, 3]
    assert batch.request_len == 4 and batch.response_len == 3 and len(batch) == 2
    assert batch.has_ref_logprobs and batch.has_generator_logprobs
    moved = batch.to("cpu")
    assert isinstance(moved, TrainBatch) and moved.request_len == 4


def assert_same_fields(back: object, sent: object) -> None:
    """Every dataclass field of ``back`` equals ``sent``'s: tensors of the same dtype and values, the rest by ==."""
    for f in dataclasses.fields(back):
        mine, theirs = getattr(sent, f.name), getattr(back, f.name)
        if isinstance(mine, torch.Tensor):
            assert theirs.dtype == mine.dtype and torch.equal(theirs, mine), f.name
        else:
            assert theirs == mine, f.name


def test_a_batch_pickles_whole_through_numpy_and_keeps_what_numpy_cannot_hold() -> None:
    batch = collate([episode([5, 6], [7, 8], logprobs=[-0.5, -0.25], ref=[-1.0, -2.0], advantage=1.5, version=2),
                     episode([9], [4, 3], logprobs=[-0.1, -0.2], ref=[-1.0, -3.0], advantage=-1.0, version=3)])
    data = pickle.dumps(batch)
    assert b"torch._utils" not in data  # the tensors went as numpy arrays, not torch storages
    back = pickle.loads(data)
    assert isinstance(back, TrainBatch) and back.request_len == batch.request_len
    assert_same_fields(back, batch)
    back.advantages.mul_(2)  # the unpickled tensors are the receiver's own, writable
    # bfloat16 (no numpy dtype) and a tensor that requires grad go as torch pickles them
    odd = dataclasses.replace(batch, ref_logprobs=batch.ref_logprobs.bfloat16(),
                              advantages=batch.advantages.clone().requires_grad_())
    again = pickle.loads(pickle.dumps(odd))
    assert again.ref_logprobs.dtype == torch.bfloat16 and torch.equal(again.ref_logprobs, odd.ref_logprobs)
    assert again.advantages.requires_grad and torch.equal(again.advantages.detach(), odd.advantages.detach())


def test_a_wire_completion_arrives_as_a_plain_one_without_torch_storages() -> None:
    from forge_nb.rl.completion import WireCompletion

    sent = WireCompletion(text="cc", prompt_ids=[5, 6], token_ids=[7, 7], logprobs=[-0.5, -0.25], prompt="c",
                          stop_reason="stop", generator_version=3, metadata={"served_by": "trainer"})
    data = pickle.dumps(sent)
    assert b"torch._utils" not in data  # numpy arrays, not torch storages (what monarch pickles one at a time)
    back = pickle.loads(data)
    assert type(back) is Completion
    assert_same_fields(back, sent)


def test_collate_without_logprobs_flags_and_zeros() -> None:
    batch = collate([episode([5], [7])])
    assert not batch.has_ref_logprobs and not batch.has_generator_logprobs
    assert batch.ref_logprobs.abs().sum() == 0 and batch.generator_logprobs.abs().sum() == 0
    assert batch.ref_logprobs.shape == (1, 3)


def test_collate_errors() -> None:
    with pytest.raises(ValueError, match="no episodes"):
        collate([])
    with pytest.raises(ValueError, match="assign_advantages"):
        collate([episode([5], [7], advantage=None)])
    other = episode([5], [7])
    other.response_len = 5
    with pytest.raises(ValueError, match="max_res_tokens"):
        collate([episode([5], [7]), other])


def test_collate_seed_matches_the_seed_layout() -> None:
    ranks = [
        [episode([5], [7], ref=[-1.0, -1.0, -1.0], advantage=1.0, eid="a")],
        [episode([6], [8, 9], ref=[-2.0, -2.0, -2.0], advantage=-1.0, eid="b")],
    ]
    inputs, targets = collate_seed(ranks)
    assert len(inputs) == len(targets) == 2
    assert set(inputs[0]) == {"tokens"}
    assert set(targets[0]) == {"response", "ref_logprobs", "advantages", "padding_mask"}
    # one episode per rank: the seed's .squeeze() would have made ref_logprobs 1-D; we keep [b, Lr]
    assert targets[0]["ref_logprobs"].shape == (1, 3)
    assert targets[1]["padding_mask"].tolist() == [[True, True, False]]
    assert targets[1]["advantages"].tolist() == [[-1.0]]
    assert inputs[1]["tokens"].tolist() == [[PAD, PAD, PAD, 6, 8, 9, PAD]]


def test_completion_with_the_skill_cards_four_fields() -> None:
    c = Completion(text="4", token_ids=[7, 1], logprobs=[-0.5, -0.1], metadata={"k": 1})
    assert c.prompt is None and c.prompt_ids.tolist() == [] and c.generator_version is None
    assert c.token_ids.dtype == torch.long and c.logprobs.tolist() == pytest.approx([-0.5, -0.1])
    with pytest.raises(TypeError):
        Completion("4", [7])  # keywords only: positional fields would silently shift meaning


def test_episode_the_documents_way() -> None:
    a = Episode(prompt_ids=torch.tensor([5, 6, 7]), response_ids=torch.tensor([8]), reward=1.0)
    b = Episode(prompt_ids=[5], response_ids=[8, 9], reward=0.0)
    assert a.episode_id != b.episode_id and a.pad_id == 0 and a.request_len is None
    assert a.prompt_ids.tolist() == [5, 6, 7] and a.response_ids.tolist() == [8]
    assert a.request_tensor.tolist() == [5, 6, 7] and a.response_mask.tolist() == [True]
    assert a.policy_version is None and a.advantage is None and a.reward == 1.0
    restored = pickle.loads(pickle.dumps(a))
    assert restored.response_ids.tolist() == [8] and restored.episode_id == a.episode_id
    assert dataclasses.replace(a, reward=2.0).reward == 2.0
    with pytest.raises(ValueError, match="response_ids"):
        Episode(prompt_ids=[1])
    with pytest.raises(ValueError, match="one of the two"):
        Episode(prompt_ids=[1], response_ids=[2], completion=completion([1], [2]))


def test_collate_pads_episodes_without_fixed_lengths_to_the_longest() -> None:
    a = Episode(prompt_ids=[5, 6, 7], response_ids=[8], reward=1.0, advantage=0.5)
    b = Episode(prompt_ids=[5], response_ids=[8, 9], reward=0.0, advantage=-0.5, pad_id=PAD)
    batch = collate([a, b])
    assert batch.request_len == 3 and batch.response_len == 2
    assert batch.tokens.tolist() == [[5, 6, 7, 8, PAD], [PAD, PAD, 5, 8, 9]]
    assert batch.response_mask.tolist() == [[True, False], [True, True]]
    assert batch.policy_versions.tolist() == [-1, -1]  # unknown, never passed off as version 0
    assert not batch.has_ref_logprobs and not batch.has_generator_logprobs


def test_collate_refuses_mixed_lengths_and_missing_prompts() -> None:
    free = Episode(prompt_ids=[5], response_ids=[8], advantage=0.0)
    with pytest.raises(ValueError, match="request_len"):
        collate([free, episode([5], [7])])
    with pytest.raises(ValueError, match="prompt ids"):
        collate([Episode(completion=Completion(text="t", token_ids=[1]), advantage=0.0)])


def test_collate_seed_says_when_reference_logprobs_are_missing() -> None:
    batch = collate_seed([[episode([5], [7], ref=[-1.0, -1.0, -1.0]), episode([6], [8])]])
    assert isinstance(batch, SeedBatch) and isinstance(batch, tuple)
    inputs, targets = batch  # the documents' unpacking
    assert targets[0]["ref_logprobs"] is None  # never zeros standing in for reference logprobs
    assert batch.inputs is inputs and inputs[0]["tokens"].shape == (2, 7)
    assert pickle.loads(pickle.dumps(batch)).targets[0]["advantages"].tolist() == [[0.5], [0.5]]


def test_skill_card_trainer_types() -> None:
    ids = torch.tensor([[1, 2, 3]])
    b = TextTrainBatch(input_ids=ids, target_ids=torch.tensor([[2, 3, 0]]),
                       target_mask=torch.tensor([[False, True, False]]), target_weights=torch.zeros(1, 3))
    assert b.target_ids.shape == b.input_ids.shape
    with pytest.raises(ValueError, match="target_weights"):
        TextTrainBatch(input_ids=ids, target_ids=ids, target_mask=ids.bool(), target_weights=torch.zeros(3))
    result = ForwardBackwardResult(loss=0.25, metrics={"kl": 0.01})
    assert result.loss == 0.25 and ForwardBackwardResult(loss=1.0).metrics == {}
