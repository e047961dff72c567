"""Reward functions and the contract for calling user reward functions safely.

A reward function is any callable `(prompt, response, target) -> float`, sync or async. `score` calls a
list of them and never raises on their account: a function that raises or returns something other
than a finite number (None, NaN, a bool, a string...) quarantines the episode, with a reason naming the
function and what it did. A quarantined episode is kept for inspection but gets advantage 0, because
"reward 0" from a crashed grader would silently teach the policy something false.

`MathReward` and `ThinkingReward` are the two reward functions of torchforge's GSM8K recipe.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
import numbers
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from forge_nb.rl.types import Episode

__all__ = [
    "MathReward",
    "RewardFn",
    "RewardResult",
    "ThinkingReward",
    "extract_answer",
    "reward_name",
    "score",
]

RewardFn = Callable[[str, str, Any], Any]
"""`(prompt, response, target) -> float`, or an async function returning a float."""

_ANSWER_TAG = re.compile(r"<answer>(.*?)</answer>", re.DOTALL | re.IGNORECASE)
_HASHES = re.compile(r"####\s*([^\n]+)")
_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")


def _last_boxed(text: str) -> str | None:
    """Content of the last `\\boxed{...}`, with nested braces balanced."""
    starts = list(_BOXED.finditer(text))
    if not starts:
        return None
    start = starts[-1].end()
    depth = 1
    for i in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    return None  # unbalanced: the model stopped mid-answer


def extract_answer(text: str) -> str | None:
    """The final answer in `text`: the last <answer>...</answer>, else the last \\boxed{...}, else the
    text after the last "####". A \\boxed{} inside the answer tag is unwrapped. None if none is found."""
    tagged = _ANSWER_TAG.findall(text)
    if tagged:
        inner = tagged[-1]
        boxed = _last_boxed(inner)
        return (boxed if boxed is not None else inner).strip()
    boxed = _last_boxed(text)
    if boxed is not None:
        return boxed.strip()
    hashes = _HASHES.findall(text)
    return hashes[-1].strip() if hashes else None


def _to_number(text: str) -> float | None:
    """Plain numbers only: "1,234", "$5", "3.5", "-2", "7/8", "50%" (as 50). None otherwise."""
    cleaned = re.sub(r"[$,\s]|\\\$|%$", "", text.strip()).rstrip(".")
    fraction = re.fullmatch(r"(-?\d+(?:\.\d+)?)/(\d+(?:\.\d+)?)", cleaned)
    try:
        if fraction:
            return float(fraction.group(1)) / float(fraction.group(2))
        return float(cleaned)
    except (ValueError, ZeroDivisionError):
        return None


def _math_verify_equal(answer: str, target: str) -> bool:
    try:
        from math_verify import parse, verify
    except ImportError:
        return False
    # math_verify times out with signal.alarm, which only works on the main thread; elsewhere (an actor
    # thread, a thread pool) run without its timeout rather than fail.
    limit = 5 if threading.current_thread() is threading.main_thread() else None

    def parsed(text: str) -> list[Any]:
        # extract_answer strips \boxed{} and math_verify reads bare LaTeX ("\sqrt{4}") only
        # between delimiters, so retry in $...$
        return parse(text, parsing_timeout=limit) or parse(f"${text}$", parsing_timeout=limit)

    try:
        gold, pred = parsed(target), parsed(answer)
        return bool(gold and pred and verify(gold, pred, timeout_seconds=limit))
    except Exception:  # a grader crash means "not shown equal", never a crashed rollout
        return False


@dataclass(kw_only=True)
class MathReward:
    """1.0 when the response's final answer equals the target, `partial_credit` when the target number
    appears elsewhere in the response, else 0.0.

    The answer is found by `extract_answer` (<answer> tags, \\boxed{}, "####"); a response that is just a
    number counts as its own answer. Equality: numerically within `tolerance` for plain numbers, else by
    math_verify (so "1/2" equals "0.5" and "\\frac{1}{2}") when installed and `use_math_verify`.
    """

    tolerance: float = 1e-6
    partial_credit: float = 0.1
    use_math_verify: bool = True

    def __post_init__(self) -> None:
        if not self.tolerance >= 0:
            raise ValueError(f"MathReward.tolerance must be >= 0, got {self.tolerance!r}")
        if not 0 <= self.partial_credit <= 1:
            raise ValueError(
                f"MathReward.partial_credit must be in [0, 1], got {self.partial_credit!r}; "
                "use 0 to disable it"
            )

    def equal(self, answer: str, target: str) -> bool:
        a, t = _to_number(answer), _to_number(target)
        if a is not None and t is not None:
            return math.isclose(a, t, rel_tol=self.tolerance, abs_tol=self.tolerance)
        if " ".join(answer.split()).lower() == " ".join(target.split()).lower():
            return True
        return self.use_math_verify and _math_verify_equal(answer, target)

    def __call__(self, prompt: str, response: str, target: Any) -> float:
        target_text = str(target)
        target_text = extract_answer(target_text) or target_text.strip()
        answer = extract_answer(response)
        if answer is None and _to_number(response) is not None:
            answer = response.strip()
        if answer is not None and self.equal(answer, target_text):
            return 1.0
        number = _to_number(target_text)
        if number is None or self.partial_credit == 0:
            return 0.0
        shown = str(int(number)) if number.is_integer() else str(number)
        # the target mentioned in the working (not in a wrong final answer) earns partial credit
        working = _ANSWER_TAG.sub("", response)
        return self.partial_credit if re.search(rf"(?<![\d.]){re.escape(shown)}(?!\.?\d)", working) else 0.0


@dataclass(kw_only=True)
class ThinkingReward:
    """`full_reward` for a non-empty <think>...</think> block, `partial_reward` for a think tag without
    a well-formed block, else 0.0 (torchforge's format reward). `tag` names another tag, as torchforge's
    `ThinkingReward(tag="思考")` does."""

    partial_reward: float = 0.2
    full_reward: float = 1.0
    tag: str = "think"

    def __post_init__(self) -> None:
        if not isinstance(self.tag, str) or not self.tag.strip():
            raise ValueError(f"ThinkingReward.tag must be a non-empty tag name such as 'think', got {self.tag!r}")
        name = re.escape(self.tag.strip())
        self._block = re.compile(rf"<\s*{name}\s*>(.*?)<\s*/\s*{name}\s*>", re.IGNORECASE | re.DOTALL)
        self._any_tag = re.compile(rf"<\s*/?\s*{name}\s*>", re.IGNORECASE)

    def __call__(self, prompt: str, response: str, target: Any = None) -> float:
        if any(block.strip() for block in self._block.findall(response)):
            return self.full_reward
        return self.partial_reward if self._any_tag.search(response) else 0.0


@dataclass
class RewardResult:
    """What `score` found: the mean reward, each function's reward, and why the episode is quarantined."""

    total: float
    """Mean over the reward functions; 0.0 when quarantined."""
    rewards: dict[str, float]
    """Reward per function that returned a valid number, keyed by `reward_name`."""
    quarantine: str | None = None

    def apply_to(self, episode: Episode) -> Episode:
        """Write reward, rewards and quarantine onto `episode` and return it."""
        episode.reward = self.total
        episode.rewards = dict(self.rewards)
        episode.quarantine = self.quarantine
        return episode


def reward_name(fn: Callable[..., Any]) -> str:
    """A readable name: the function's name, a callable object's class name, "lambda" for lambdas."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.isfunction(fn) or inspect.ismethod(fn) or inspect.isbuiltin(fn):
        name = fn.__qualname__ if inspect.ismethod(fn) else fn.__name__
        return "lambda" if name == "<lambda>" else name
    return type(fn).__name__


def _check(value: Any) -> tuple[float | None, str]:
    """(the reward, "") or (None, what was wrong)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and value.dtype != torch.bool:
        value = value.item()
    if value is None:
        return None, "returned None"
    if isinstance(value, bool):
        return None, f"returned the bool {value} (use 1.0 or 0.0)"
    if not isinstance(value, numbers.Real):
        return None, f"returned a non-numeric {type(value).__name__} ({value!r:.80})"
    number = float(value)
    if not math.isfinite(number):
        return None, f"returned the non-finite number {number}"
    return number, ""


async def score(reward_fns: Sequence[RewardFn], prompt: str, response: str, target: Any, *,
                timeout_s: float | None = None) -> RewardResult:
    """Call every reward function on one response; never raises because of them.

    Sync functions run on the calling thread (keep them fast, or make them async); async ones are
    awaited in order, each for at most ``timeout_s`` seconds (None: no limit): one that has not
    returned by then quarantines the episode. See the module docstring for the quarantine contract.
    """
    reward_fns = list(reward_fns)  # a cell may replace the caller's list while an async reward awaits
    if not reward_fns:
        raise ValueError("score() needs at least one reward function, e.g. [MathReward()]")
    names: list[str] = []
    for fn in reward_fns:
        base = reward_name(fn)
        name, k = base, 2
        while name in names:
            name, k = f"{base}_{k}", k + 1
        names.append(name)
    rewards: dict[str, float] = {}
    problems: list[str] = []
    for name, fn in zip(names, reward_fns, strict=True):
        try:
            value = fn(prompt, response, target)
            if inspect.isawaitable(value):
                async with asyncio.timeout(timeout_s):  # not wait_for: on 3.11 it can swallow a cancel
                    value = await value
        except TimeoutError:
            problems.append(f"reward function {name!r} did not return within {timeout_s:g} s (reward_timeout_s)")
            continue
        except Exception as err:
            problems.append(f"reward function {name!r} raised {type(err).__name__}: {err}")
            continue
        number, problem = _check(value)
        if number is None:
            problems.append(f"reward function {name!r} {problem}; it must return a finite float")
        else:
            rewards[name] = number
    if problems:
        return RewardResult(total=0.0, rewards=rewards, quarantine="; ".join(problems))
    return RewardResult(total=sum(rewards.values()) / len(rewards), rewards=rewards)
