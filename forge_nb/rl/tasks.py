"""Tasks: where prompts, targets and reward functions come from. A toy task for CPU, and GSM8K.

`ToyTask` is built so that a tiny, randomly initialised character-level model learns it in minutes:
the prompt is a short pattern of letters ("c", or "ab" at difficulty 2) and the answer continues the
pattern for `response_chars` characters ("cccc", "abab"). The reward is the fraction of those characters
that are right, so even a random policy earns something (about 1 / vocabulary size per character) and
GRPO has a signal from step 0: in a group of 8 random responses of 4 characters, some nearly always
score above others. At difficulty 1 the answer is "repeat the last character", learnable by a bigram;
higher difficulties need attention to the prompt.

`Gsm8kTask` is torchforge's recipe: GSM8K questions, targets after "####", scored by `MathReward` and
`ThinkingReward`. `datasets` is imported only when GSM8K is loaded.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass, field
from typing import Any, Protocol

from forge_nb.rl.rewards import MathReward, RewardFn, ThinkingReward

__all__ = [
    "GSM8K_SYSTEM_PROMPT",
    "Gsm8kTask",
    "PatternReward",
    "Task",
    "ToyTask",
    "gsm8k_transform",
    "load_gsm8k",
]

_GSM8K_HUB_PATH = "openai/gsm8k"
GSM8K_SYSTEM_PROMPT = (
    "Do your reasoning between <think> and </think> tags. "
    "Then give only the final answer between <answer> and </answer> tags; "
    "answers outside them are not scored."
)


class Task(Protocol):
    """What a training loop needs from a task."""

    @property
    def reward_fns(self) -> list[RewardFn]: ...

    def sample(self) -> dict[str, str]:
        """One training prompt: {"request": ..., "target": ...}."""
        ...

    def eval_prompts(self, n: int) -> list[dict[str, str]]:
        """The same n prompts on every call, for comparable evaluations."""
        ...


@dataclass(kw_only=True)
class PatternReward:
    """Fraction of the target's characters that the response gets right, position by position.

    Characters past `len(target)` are ignored and missing ones count as wrong."""

    def __call__(self, prompt: str, response: str, target: Any) -> float:
        target = str(target)
        if not target:
            return 0.0
        return sum(r == t for r, t in zip(response, target, strict=False)) / len(target)


@dataclass(kw_only=True)
class ToyTask:
    """Continue a letter pattern: "b" -> "bbbb"; at difficulty 2, "ab" -> "abab"."""

    alphabet: str = "abcdefgh"
    """The letters prompts and answers use; all the characters a tokenizer needs for this task."""
    response_chars: int = 4
    """Answer length K; the reward counts the first K characters of the response."""
    difficulty: int = 1
    """Pattern length in the prompt. Raise it as the model learns (a curriculum): 1 is a bigram's job."""
    seed: int = 0
    _rng: random.Random = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if not self.alphabet or len(set(self.alphabet)) != len(self.alphabet):
            raise ValueError(
                f"ToyTask.alphabet must be non-empty with distinct characters, got {self.alphabet!r}; "
                "e.g. 'abcdefgh'"
            )
        for name in ("response_chars", "difficulty"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"ToyTask.{name} must be an int >= 1, got {value!r}")
        self._rng = random.Random(self.seed)

    @property
    def max_request_chars(self) -> int:
        return self.difficulty

    @property
    def max_response_chars(self) -> int:
        return self.response_chars

    @property
    def reward_fns(self) -> list[RewardFn]:
        return [PatternReward()]

    def target_for(self, request: str) -> str:
        """The pattern continued for `response_chars` characters."""
        return (request * (self.response_chars // len(request) + 1))[: self.response_chars]

    def _example(self, rng: random.Random) -> dict[str, str]:
        request = "".join(rng.choice(self.alphabet) for _ in range(self.difficulty))
        return {"request": request, "target": self.target_for(request)}

    def sample(self) -> dict[str, str]:
        return self._example(self._rng)

    def eval_prompts(self, n: int) -> list[dict[str, str]]:
        """n fixed prompts; at difficulty 1 every letter in turn, so each is evaluated equally often."""
        if self.difficulty == 1:
            letters = [self.alphabet[i % len(self.alphabet)] for i in range(n)]
            return [{"request": c, "target": self.target_for(c)} for c in letters]
        rng = random.Random(f"eval-{self.seed}")  # independent of, and not advancing, the training stream
        return [self._example(rng) for _ in range(n)]


def gsm8k_transform(
    row: dict[str, Any], tokenizer: Any | None = None, system_prompt: str = GSM8K_SYSTEM_PROMPT
) -> dict[str, str]:
    """A GSM8K row {"question", "answer"} -> {"request", "target"}; target is the text after "####".

    With a `tokenizer` the request is the chat-formatted system + user prompt, as in torchforge's seed;
    without one it is the bare question (format it where the tokenizer lives).
    """
    question, answer = row["question"], row["answer"]
    if "####" not in answer:
        raise ValueError(f"GSM8K answer has no '#### <number>' line: {answer[-80:]!r}")
    target = answer.rsplit("####", 1)[1].strip()
    if tokenizer is None:
        return {"request": question, "target": target}
    chat = [{"role": "system", "content": system_prompt}, {"role": "user", "content": question}]
    request = tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=True)
    return {"request": request, "target": target}


def load_gsm8k(
    path: str = _GSM8K_HUB_PATH,
    split: str = "train",
    name: str | None = "main",
    data_files: str | list[str] | None = None,
    *,
    tokenizer: Any | None = None,
    streaming: bool = False,
    cache_dir: str | None = None,
) -> Any:
    """GSM8K through `datasets.load_dataset`, with "request" and "target" columns added.

    `data_files` loads local GSM8K-format jsonl/json files instead of the hub (path and name are then
    ignored unless you give another builder as `path`).
    """
    try:
        import datasets
    except ImportError as err:
        raise ImportError("load_gsm8k needs the 'datasets' package: pip install 'forge-nb[rl]'") from err
    if data_files is not None and path == _GSM8K_HUB_PATH:
        path, name = "json", None
    dataset = datasets.load_dataset(
        path, name, split=split, data_files=data_files, streaming=streaming, cache_dir=cache_dir
    )
    return dataset.map(functools.partial(gsm8k_transform, tokenizer=tokenizer))


@dataclass(kw_only=True)
class Gsm8kTask:
    """GSM8K prompts, reshuffled every epoch, scored by MathReward and ThinkingReward."""

    path: str = _GSM8K_HUB_PATH
    split: str = "train"
    name: str | None = "main"
    data_files: str | list[str] | None = None
    tokenizer: Any | None = None
    """Optional chat tokenizer; see `gsm8k_transform`."""
    cache_dir: str | None = None
    seed: int = 0
    _rows: Any = field(default=None, init=False, repr=False, compare=False)
    _order: list[int] = field(default_factory=list, init=False, repr=False, compare=False)
    _epoch: int = field(default=0, init=False, repr=False, compare=False)

    @property
    def rows(self) -> Any:
        """The mapped `datasets.Dataset`, loaded on first use."""
        if self._rows is None:
            self._rows = load_gsm8k(
                self.path,
                self.split,
                self.name,
                self.data_files,
                tokenizer=self.tokenizer,
                cache_dir=self.cache_dir,
            )
            if len(self._rows) == 0:
                raise ValueError(f"GSM8K split {self.split!r} from {self.data_files or self.path!r} is empty")
        return self._rows

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def reward_fns(self) -> list[RewardFn]:
        return [MathReward(), ThinkingReward()]

    def sample(self) -> dict[str, str]:
        if not self._order:
            self._order = list(range(len(self.rows)))
            random.Random(f"{self.seed}-{self._epoch}").shuffle(self._order)
            self._epoch += 1
        row = self.rows[self._order.pop()]
        return {"request": row["request"], "target": row["target"]}

    def eval_prompts(self, n: int) -> list[dict[str, str]]:
        rows = self.rows.select(range(min(n, len(self.rows))))
        return [{"request": r["request"], "target": r["target"]} for r in rows]
