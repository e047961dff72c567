"""MathReward, ThinkingReward, answer extraction and the quarantine contract of score()."""

from __future__ import annotations

import asyncio
import functools
import threading

import pytest
import torch

from forge_nb.rl import Episode, MathReward, RewardResult, ThinkingReward, extract_answer, reward_name, score


@pytest.mark.parametrize(
    ("text", "answer"),
    [
        ("work... <answer> 42 </answer>", "42"),
        ("<answer>1</answer> then <answer>2</answer>", "2"),
        ("so the result is \\boxed{\\frac{1}{2}}.", "\\frac{1}{2}"),
        ("\\boxed{3} no wait \\boxed{4}", "4"),
        ("<answer>\\boxed{7}</answer>", "7"),
        ("She has 72 - 50 = 22 left.\n#### 22", "22"),
        ("no final answer here, 12", None),
        ("\\boxed{unfinished", None),
    ],
)
def test_extract_answer(text: str, answer: str | None) -> None:
    assert extract_answer(text) == answer


@pytest.mark.parametrize(
    ("response", "target", "reward"),
    [
        ("<answer>22</answer>", "22", 1.0),
        ("<answer>$1,200</answer>", "1200", 1.0),
        ("\\boxed{22}", "22", 1.0),
        ("#### 22", "22", 1.0),
        ("22", "22", 1.0),  # a bare number is its own answer
        ("<answer>22.0</answer>", "#### 22", 1.0),  # targets in GSM8K form work too
        ("<answer>23</answer>", "22", 0.0),
        ("I first got 22 <answer>23</answer>", "22", 0.1),  # the seed's partial credit
        ("I first got 122 <answer>23</answer>", "22", 0.0),  # 22 inside another number is no credit
        ("<answer>0.5</answer>", "1/2", 1.0),
        ("", "22", 0.0),
    ],
)
def test_math_reward(response: str, target: str, reward: float) -> None:
    assert MathReward()("prompt", response, target) == pytest.approx(reward)


def test_math_verify_decides_latex_equivalence() -> None:
    pytest.importorskip("math_verify")
    response = "<answer>\\frac{1}{2}</answer>"
    assert MathReward()("", response, "0.5") == 1.0
    assert MathReward()("", "\\boxed{\\frac{3}{4}}", "0.75") == 1.0
    assert MathReward()("", "\\boxed{\\sqrt{4}}", "2") == 1.0
    assert MathReward()("", "<answer>\\dfrac{1}{2}</answer>", "1/2") == 1.0
    # without math_verify the plain numeric path cannot see it: proves which path decided above
    assert MathReward(use_math_verify=False)("", response, "0.5") == 0.0
    assert MathReward()("", "\\boxed{\\frac{1}{3}}", "0.5") == 0.0


def test_math_reward_works_off_the_main_thread() -> None:
    """math_verify's default timeout uses signals, which fail in threads (actors, thread pools)."""
    pytest.importorskip("math_verify")
    results: list[float] = []
    worker = threading.Thread(target=lambda: results.append(MathReward()("", "\\boxed{\\frac{1}{2}}", "0.5")))
    worker.start()
    worker.join()
    assert results == [1.0]


def test_math_reward_validation() -> None:
    with pytest.raises(ValueError, match="partial_credit"):
        MathReward(partial_credit=2.0)
    assert MathReward(partial_credit=0.0)("", "I got 22 <answer>23</answer>", "22") == 0.0


@pytest.mark.parametrize(
    ("response", "reward"),
    [
        ("<think>12 * 6 = 72</think><answer>72</answer>", 1.0),
        ("< THINK >\nhmm\n</ think >", 1.0),
        ("<think>   </think>72", 0.2),  # empty thinking is only an attempt
        ("<think>never closed", 0.2),
        ("just 72", 0.0),
        ("", 0.0),
    ],
)
def test_thinking_reward(response: str, reward: float) -> None:
    assert ThinkingReward()("", response, None) == reward


def test_thinking_reward_custom_levels() -> None:
    assert ThinkingReward(partial_reward=0.0, full_reward=0.5)("", "<think>x</think>", None) == 0.5


async def test_score_mean_and_names() -> None:
    async def judge(prompt: str, response: str, target: str) -> float:
        return 0.5

    result = await score(
        [MathReward(), ThinkingReward(), judge], "q", "<think>a</think><answer>3</answer>", "3"
    )
    assert result == RewardResult(
        total=pytest.approx((1.0 + 1.0 + 0.5) / 3),
        rewards={"MathReward": 1.0, "ThinkingReward": 1.0, "judge": 0.5},
    )
    assert result.quarantine is None


async def test_score_accepts_numeric_types() -> None:
    result = await score([lambda p, r, t: 1, lambda p, r, t: torch.tensor(0.5)], "", "", "")
    assert result.quarantine is None
    assert result.rewards == {"lambda": 1.0, "lambda_2": 0.5}
    assert result.total == 0.75


def raises(prompt: str, response: str, target: str) -> float:
    raise KeyError("target")


async def async_raises(prompt: str, response: str, target: str) -> float:
    raise RuntimeError("judge offline")


@pytest.mark.parametrize(
    ("bad", "reason"),
    [
        (raises, "'raises' raised KeyError: 'target'"),
        (async_raises, "'async_raises' raised RuntimeError: judge offline"),
        (lambda p, r, t: float("nan"), "'lambda' returned the non-finite number nan"),
        (lambda p, r, t: float("inf"), "non-finite number inf"),
        (lambda p, r, t: None, "'lambda' returned None"),
        (lambda p, r, t: "1.0", "returned a non-numeric str ('1.0')"),
        (lambda p, r, t: True, "returned the bool True"),
        (lambda p, r, t: [1.0], "non-numeric list"),
    ],
)
async def test_score_quarantines_bad_reward_functions(bad, reason: str) -> None:
    result = await score([ThinkingReward(), bad], "prompt", "<think>x</think>", "t")
    assert result.quarantine is not None and reason in result.quarantine
    assert result.total == 0.0
    assert result.rewards == {"ThinkingReward": 1.0}  # the good function's score is still recorded


async def test_score_reports_every_failure_and_applies_to_episode() -> None:
    result = await score([raises, lambda p, r, t: None], "", "", "")
    assert "'raises'" in result.quarantine and "'lambda' returned None" in result.quarantine
    episode = result.apply_to(Episode(episode_id="e", pad_id=0, request_len=1, response_len=1))
    assert episode.quarantine == result.quarantine and episode.reward == 0.0 and episode.rewards == {}


async def test_score_needs_functions() -> None:
    with pytest.raises(ValueError, match="at least one reward function"):
        await score([], "", "", "")


def test_reward_name() -> None:
    def my_reward(p: str, r: str, t: str) -> float:
        return 0.0

    class Judge:
        def grade(self, p: str, r: str, t: str) -> float:
            return 0.0

    assert reward_name(my_reward) == "my_reward"
    assert reward_name(MathReward()) == "MathReward"
    assert reward_name(lambda p, r, t: 0.0) == "lambda"
    assert reward_name(functools.partial(my_reward, "p")) == "my_reward"
    assert reward_name(Judge().grade).endswith("Judge.grade")


async def test_score_uses_the_functions_it_was_called_with_when_the_list_changes_meanwhile() -> None:
    # A notebook cell replaces run.reward_fns[:] while a paused run's last rollout is still scoring.
    fns: list = []

    async def slow(prompt, response, target):
        await asyncio.sleep(0)
        fns.append(lambda p, r, t: 0.0)  # the cell's change lands while this reward awaits
        return 1.0

    fns.append(slow)
    result = await score(fns, "p", "r", None)
    assert result.quarantine is None and result.rewards == {"slow": 1.0}


def test_thinking_reward_with_another_tag() -> None:
    import pickle

    reward = ThinkingReward(tag="思考")
    assert reward("", "<思考>足します</思考>17", None) == 1.0
    assert reward("", "<think>x</think>", None) == 0.0 and reward("", "<思考>", None) == 0.2
    assert pickle.loads(pickle.dumps(reward))("", "<思考>x</思考>", None) == 1.0  # travels to reward actors
    with pytest.raises(ValueError, match="tag"):
        ThinkingReward(tag=" ")
