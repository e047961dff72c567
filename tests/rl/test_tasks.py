"""ToyTask gives GRPO a signal from a random policy; GSM8K loads through datasets from a local file."""

from __future__ import annotations

import random
import statistics
from pathlib import Path

import pytest

from forge_nb.rl import (
    Gsm8kTask,
    MathReward,
    PatternReward,
    ThinkingReward,
    ToyTask,
    gsm8k_transform,
    load_gsm8k,
)

SPECIALS = ["<pad>", "<eos>", "<bos>"]


def random_response(task: ToyTask, rng: random.Random) -> str:
    """What an untrained char-level model does: uniform over letters + specials, stopping at EOS."""
    vocab = list(task.alphabet) + SPECIALS
    out = []
    for _ in range(task.max_response_chars):
        token = rng.choice(vocab)
        if token == "<eos>":
            break
        out.append(token if len(token) == 1 else "")  # special tokens decode to nothing
    return "".join(out)


def group_rewards(task: ToyTask, rng: random.Random, group_size: int) -> list[float]:
    prompt = task.sample()
    (reward_fn,) = task.reward_fns
    return [
        reward_fn(prompt["request"], random_response(task, rng), prompt["target"]) for _ in range(group_size)
    ]


@pytest.mark.parametrize("difficulty", [1, 2])
def test_random_policy_earns_some_reward_and_grpo_has_signal(difficulty: int) -> None:
    task = ToyTask(difficulty=difficulty, seed=0)
    rng = random.Random(0)
    groups = [group_rewards(task, rng, group_size=8) for _ in range(500)]
    mean_reward = statistics.fmean(r for g in groups for r in g)
    assert 0.03 < mean_reward < 0.3, mean_reward
    # a group gives GRPO a gradient only when its rewards differ
    informative = sum(len(set(g)) > 1 for g in groups) / len(groups)
    assert informative > 0.8, informative


def test_perfect_and_partial_responses() -> None:
    task = ToyTask(response_chars=4)
    (reward_fn,) = task.reward_fns
    for prompt in task.eval_prompts(8):
        assert reward_fn(prompt["request"], prompt["target"], prompt["target"]) == 1.0
        assert (
            reward_fn(prompt["request"], prompt["target"] + "zzz", prompt["target"]) == 1.0
        )  # extra ignored
    assert reward_fn("c", "ccxc", "cccc") == 0.75
    assert reward_fn("c", "cc", "cccc") == 0.5
    assert reward_fn("c", "", "cccc") == 0.0
    assert PatternReward()("ab", "abab", "abab") == 1.0


def test_toy_task_shapes_and_alphabet() -> None:
    task = ToyTask(alphabet="xyz", response_chars=5, difficulty=2, seed=3)
    assert (task.max_request_chars, task.max_response_chars) == (2, 5)
    for _ in range(50):
        s = task.sample()
        assert len(s["request"]) == 2 and len(s["target"]) == 5
        assert s["target"] == (s["request"] * 3)[:5]  # the pattern continues
        assert set(s["request"] + s["target"]) <= set(task.alphabet)


def test_toy_task_is_seeded_and_eval_prompts_are_stable() -> None:
    a, b = ToyTask(seed=5, difficulty=3), ToyTask(seed=5, difficulty=3)
    first = a.eval_prompts(4)
    assert [a.sample() for _ in range(5)] == [b.sample() for _ in range(5)]
    assert a.eval_prompts(4) == first == b.eval_prompts(4)  # sampling does not move eval prompts
    assert [p["request"] for p in ToyTask().eval_prompts(10)] == list("abcdefghab")


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"alphabet": ""}, "alphabet"),
        ({"alphabet": "aa"}, "alphabet"),
        ({"response_chars": 0}, "response_chars"),
        ({"difficulty": 0}, "difficulty"),
    ],
)
def test_toy_task_validation(kwargs: dict, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        ToyTask(**kwargs)


def test_gsm8k_transform() -> None:
    row = {"question": "What is 2 + 2?", "answer": "2 + 2 = <<2+2=4>>4\n#### 4"}
    assert gsm8k_transform(row) == {"request": "What is 2 + 2?", "target": "4"}

    class ChatTokenizer:  # the one method the transform uses, as a chat tokenizer provides it
        def apply_chat_template(self, chat, tokenize: bool, add_generation_prompt: bool) -> str:
            assert not tokenize and add_generation_prompt
            return "".join(f"<{m['role']}>{m['content']}" for m in chat) + "<assistant>"

    formatted = gsm8k_transform(row, tokenizer=ChatTokenizer())["request"]
    assert (
        formatted.startswith("<system>") and "<user>What is 2 + 2?" in formatted and "<answer>" in formatted
    )
    with pytest.raises(ValueError, match="####"):
        gsm8k_transform({"question": "q", "answer": "no marker"})


def test_load_gsm8k_from_local_jsonl(gsm8k_fixture: Path, tmp_path: Path) -> None:
    rows = load_gsm8k(data_files=str(gsm8k_fixture), cache_dir=str(tmp_path))
    assert len(rows) == 5
    assert rows[0]["request"] == rows[0]["question"]
    assert [r["target"] for r in rows] == ["22", "80", "32", "38", "100"]


def test_gsm8k_task_epochs_and_rewards(gsm8k_fixture: Path, tmp_path: Path) -> None:
    task = Gsm8kTask(data_files=str(gsm8k_fixture), cache_dir=str(tmp_path), seed=1)
    first_epoch = [task.sample()["target"] for _ in range(5)]
    assert sorted(first_epoch) == sorted(["22", "80", "32", "38", "100"])  # each row once per epoch
    assert task.epoch == 1
    task.sample()
    assert task.epoch == 2
    assert [type(f) for f in task.reward_fns] == [MathReward, ThinkingReward]
    assert len(task.eval_prompts(3)) == 3 and len(task.eval_prompts(50)) == 5
    good = "<think>6 * 12 = 72, 72 - 50 = 22</think><answer>22</answer>"
    assert [f("", good, "22") for f in task.reward_fns] == [1.0, 1.0]
