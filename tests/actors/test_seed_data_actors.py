"""The documents' data-side actors in real monarch processes: DatasetActor, RewardActor (both forms),
ComputeAdvantages and the ReplayBuffer actor, called as the TorchForge documents call them."""

from __future__ import annotations

import json
import math

import pytest
import torch

from forge_nb.actors.replay_buffer import ReplayBuffer
from forge_nb.actors.training.batch import as_train_batch
from forge_nb.apps.grpo import ComputeAdvantages, DatasetActor, Episode, RewardActor
from forge_nb.data.rewards import MathReward, ThinkingReward
from forge_nb.models import build_tiny_model
from tests.actors_for_tests import ExactAnswerGrader, flaky_reward

pytestmark = pytest.mark.timeout(180)

ROWS = [
    {"question": "What is 2 + 2?", "answer": "2 + 2 = 4\n#### 4"},
    {"question": "What is 3 * 3?", "answer": "3 * 3 = 9\n#### 9"},
    {"question": "What is 10 - 7?", "answer": "10 - 7 = 3\n#### 3"},
]
TEMPLATE = (
    "{% for m in messages %}<{{ m['role'] }}>{{ m['content'] }}{% endfor %}"
    "{% if add_generation_prompt %}<assistant>{% endif %}"
)


@pytest.fixture
def chat_model(tmp_path):
    from transformers import AutoTokenizer

    path = build_tiny_model(tmp_path / "tiny")
    tokenizer = AutoTokenizer.from_pretrained(path)
    tokenizer.chat_template = TEMPLATE
    tokenizer.save_pretrained(path)
    return str(path)


async def test_dataset_actor_both_sample_forms_and_epochs(runtime, tmp_path, chat_model):
    data = tmp_path / "gsm8k.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    dataloader = await DatasetActor.options(procs=1).as_actor(
        path=str(data), revision="main", data_split="train", streaming=True, model=chat_model)
    try:
        prompt, target = await dataloader.sample.route()  # rl_workflows.md's form
        assert prompt.startswith("<system>") and prompt.endswith("<assistant>") and "<user>What is" in prompt
        sample = await dataloader.sample.call_one()  # rl_fundamentals_part1.md's form
        request, target2 = sample["request"], sample["target"]
        assert "<user>What is" in request
        third = await dataloader.sample.call_one()
        assert sorted([target, target2, third["target"]]) == ["3", "4", "9"]  # one epoch: each row once
        assert await dataloader.epoch.call_one() == 0
        assert (await dataloader.sample.call_one()).target in {"3", "4", "9"}
        assert await dataloader.epoch.call_one() == 1  # the data restarted, reshuffled
        assert await dataloader.pad_token.call_one() == 0
    finally:
        await dataloader.shutdown()


async def test_dataset_actor_without_chat_template_fails_with_the_fix(runtime, tmp_path):
    data = tmp_path / "d.jsonl"
    data.write_text(json.dumps(ROWS[0]) + "\n")
    model = build_tiny_model(tmp_path / "plain")
    (model / "chat_template.jinja").unlink()  # a tokenizer without a chat template (the tiny one has one)
    model = str(model)
    with pytest.raises(Exception, match="chat template"):
        await DatasetActor.options(procs=1).as_actor(path=str(data), model=model)


async def test_reward_service_mean_and_failing_functions(runtime):
    reward = await RewardActor.options(procs=1, num_replicas=1).as_service(
        reward_functions=[MathReward(), ThinkingReward(), ExactAnswerGrader(), flaky_reward])
    try:
        right = "<think>2 and 2</think><answer>4</answer>"
        value = await reward.evaluate_response.route(prompt="q", response=right, target="4")
        assert value == pytest.approx((1.0 + 1.0 + 0.0 + 1.0) / 4)  # the grader wants exactly "4"
        exact = await reward.evaluate_response.route(prompt="q", response="4", target="4")
        assert exact == pytest.approx((1.0 + 0.0 + 1.0 + 1.0) / 4)
        with pytest.raises(Exception, match="flaky_reward.*grader crashed"):
            await reward.evaluate_response.route(prompt="q", response="CRASH", target="4")
        with pytest.raises(Exception, match="flaky_reward.*non-finite"):
            await reward.evaluate_response.route(prompt="q", response="NAN", target="4")
        result = await reward.score.route(prompt="q", response="CRASH 4", target="4")
        assert result.total == 0.0 and "grader crashed" in result.quarantine
        assert result.rewards["ExactAnswerGrader"] == 0.0 and "flaky_reward" not in result.rewards
    finally:
        await reward.shutdown()


async def test_grading_subclass_deploys_alone(runtime):
    grader = await ExactAnswerGrader.options(procs=1, num_replicas=1).as_service()
    try:
        assert await grader.evaluate_response.route(prompt="q", response=" 9 ", target="9") == 1.0
        assert await grader.evaluate_response.route(prompt="q", response="8", target="9") == 0.0
    finally:
        await grader.shutdown()
    with pytest.raises(Exception, match="reward_functions"):
        await RewardActor.options(procs=1).as_actor()  # neither functions nor grade()


async def test_compute_advantages_matches_torchforge(runtime):
    compute_advantages = await ComputeAdvantages.options(procs=1).as_actor()
    try:
        group = [Episode(prompt_ids=[1], response_ids=[2], reward=r) for r in (1.0, 0.0, 0.5)]
        advantages = await compute_advantages.compute.call_one(group)
        rewards = torch.tensor([[1.0, 0.0, 0.5]])
        expected = ((rewards - rewards.mean(1, keepdim=True)) / (rewards.std(1, keepdim=True) + 1e-4))[0]
        assert advantages == pytest.approx(expected.tolist(), abs=1e-6)
        assert group[0].advantage is None  # the caller's episodes are not changed
        assert await compute_advantages.compute.call_one(group[:1]) == [0.0]  # torchforge: NaN
    finally:
        await compute_advantages.shutdown()


async def test_replay_buffer_actor_as_the_documents_call_it(runtime):
    replay_buffer = await ReplayBuffer.options(procs=1).as_actor(batch_size=2, max_policy_age=1, dp_size=1)
    try:
        assert await replay_buffer.sample.call_one(curr_policy_version=0) is None  # `if batch is None`
        await replay_buffer.add.call_one(Episode(prompt_ids=[3, 4, 5], response_ids=[6], reward=1.0))
        await replay_buffer.add.route(Episode(prompt_ids=[3], response_ids=[6, 7], reward=0.0))
        batch = await replay_buffer.sample.call_one(curr_policy_version=1)
        inputs, targets = batch  # rl_fundamentals_part1.md
        assert len(inputs) == len(targets) == 1 and inputs[0]["tokens"].shape == (2, 5)
        assert targets[0]["ref_logprobs"] is None  # none given: said so, never zeros
        assert sorted(targets[0]["advantages"].flatten().tolist()) == [-0.5, 0.5]  # batch baseline
        train_batch = as_train_batch(batch)  # what RLTrainer.train_step(batch) does with it
        assert len(train_batch) == 2 and not train_batch.has_ref_logprobs
        assert train_batch.response_mask.sum().item() == 3

        for r in (1.0, 0.0, 1.0):
            await replay_buffer.add.route(Episode(prompt_ids=[3], response_ids=[6], reward=r))
        three = await replay_buffer.sample.route(curr_policy_version=1, batch_size=3)  # synchronous RL
        assert three.inputs[0]["tokens"].shape == (3, 2)
        assert await replay_buffer.sample.route() is None  # empty again
        for r in (1.0, 0.0):
            await replay_buffer.add.call_one(Episode(prompt_ids=[3], response_ids=[6], reward=r))
        assert await replay_buffer.sample.route(curr_policy_version=9) is None  # version 1 episodes: stale
        for r in (1.0, 0.0):
            await replay_buffer.add.call_one(Episode(prompt_ids=[3], response_ids=[6], reward=r))
        assert await replay_buffer.sample.route() is not None  # no version: nothing is stale
        counters = await replay_buffer.counters.call_one()
        assert (counters["added"], counters["sampled"], counters["evicted_stale"]) == (9, 7, 2)
    finally:
        await replay_buffer.shutdown()


async def test_replay_buffer_actor_splits_over_dp_ranks(runtime):
    replay_buffer = await ReplayBuffer.options(procs=1).as_actor(batch_size=2, max_policy_age=1, dp_size=2)
    try:
        for r in (1.0, 0.0, 0.5, 0.5):
            await replay_buffer.add.call_one(Episode(prompt_ids=[3], response_ids=[6], reward=r))
        inputs, targets = await replay_buffer.sample.call_one(curr_policy_version=0)
        assert len(inputs) == len(targets) == 2 and [i["tokens"].shape[0] for i in inputs] == [2, 2]
        advantages = torch.cat([t["advantages"] for t in targets]).flatten()
        assert math.isclose(advantages.sum().item(), 0.0, abs_tol=1e-6)  # one baseline over the sample
    finally:
        await replay_buffer.shutdown()


def test_grading_subclass_is_a_reward_function_in_the_kernel():
    from forge_nb.rl import score
    from forge_nb.rl.grading import RewardActor as GradingBase

    assert GradingBase is RewardActor  # the skill card's base class is the apps' RewardActor
    grader = ExactAnswerGrader()  # an Actor subclass instantiated in the kernel, no process
    assert grader("q", "4", "4") == 1.0 and grader("q", "4", {"answer": "5"}) == 0.0
    import asyncio

    result = asyncio.run(score([grader, MathReward()], "q", "4", "4"))
    assert result.rewards == {"ExactAnswerGrader": 1.0, "MathReward": 1.0}
    with pytest.raises(ValueError, match="grade"):
        ExactAnswerGrader(reward_functions=[MathReward()])
    with pytest.raises(ValueError, match="callables"):
        RewardActor(reward_functions=["MathReward"])
