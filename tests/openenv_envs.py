"""Small OpenEnv environments written against openenv-core's real base classes, for tests/envs/test_openenv.py
(importable by module path: EnvPool's processes import them by name)."""

from __future__ import annotations

import asyncio
import random
from typing import Any
from uuid import uuid4

from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State
from pydantic import Field


# -- a number-guessing game: seeded, reward None until the end ------------------------------------------
class GuessAction(Action):
    guess: str = Field(..., description="a number, as text")


class GuessObservation(Observation):
    prompt: str = ""
    hint: str | None = None
    guesses_left: int = 0


class GuessNumberEnvironment(Environment[GuessAction, GuessObservation, State]):
    """Guess a number in [1, max_number] within ``turns`` guesses; hints "higher" / "lower". Reward None on
    the way (OpenEnv's "no reward this step"), 1.0 for a win and 0.0 for running out; metadata has the
    guess count and, at the end, the secret."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self, max_number: int = 20, turns: int = 6):
        super().__init__()
        self.max_number, self.turns = max_number, turns
        self._state = State()
        self.secret, self.guesses, self.closed = 0, 0, False

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> GuessObservation:
        self._state = State(episode_id=episode_id or str(uuid4()), step_count=0)
        self.secret, self.guesses = random.Random(seed).randint(1, self.max_number), 0
        return GuessObservation(prompt=f"Guess a number between 1 and {self.max_number}.",
                                guesses_left=self.turns)

    def step(self, action: GuessAction, timeout_s: float | None = None, **kwargs: Any) -> GuessObservation:
        self._state.step_count += 1
        self.guesses += 1
        try:
            guess = int(action.guess)
        except ValueError:
            guess = None
        won = guess == self.secret
        done = won or self.guesses >= self.turns
        hint = ("not a number" if guess is None else "correct" if won
                else "higher" if guess < self.secret else "lower")
        metadata: dict[str, Any] = {"guesses": self.guesses}
        if done:
            metadata["secret"] = self.secret
        return GuessObservation(hint=hint, guesses_left=self.turns - self.guesses, done=done,
                                reward=(1.0 if won else 0.0) if done else None, metadata=metadata)

    @property
    def state(self) -> State:
        return self._state

    def close(self) -> None:
        self.closed = True


# -- OpenEnv's echo template: reset() takes no seed, one str field each way -----------------------------
class ShoutAction(Action):
    message: str = Field(..., description="what to shout")
    volume: int = 1  # optional: the message stays the one required str field


class ShoutObservation(Observation):
    echoed: str = ""


class ShoutEnvironment(Environment):  # not parameterized: the Action model comes from step's annotation
    def __init__(self) -> None:
        super().__init__()
        self._state = State()

    def reset(self) -> ShoutObservation:  # type: ignore[override]
        print("ShoutEnvironment ready!")  # a library that prints: kept out of cells
        self._state = State(episode_id=str(uuid4()))
        return ShoutObservation(echoed="Say something.")

    def step(self, action: ShoutAction) -> ShoutObservation:  # type: ignore[override]
        self._state.step_count += 1
        return ShoutObservation(echoed=action.message.upper() * action.volume, done=self._state.step_count >= 2,
                                reward=len(action.message) / 10)

    @property
    def state(self) -> State:
        return self._state


# -- async overrides, and an Action model without a single text field -----------------------------------
class MoveAction(Action):
    row: int
    col: int


class BoardObservation(Observation):
    board: list[str] = Field(default_factory=list)
    last_move: str | None = None


class AsyncBoardEnvironment(Environment[MoveAction, BoardObservation, State]):
    """Places marks on a 3x3 board; only ``reset_async`` / ``step_async`` work (the sync ones raise), as an
    environment that does real async work might; the episode ends when the board is full."""

    def __init__(self, size: int = 3):
        super().__init__()
        self.size, self._state = size, State()
        self.board = ["." * size] * size
        self.seed: int | None = None

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> BoardObservation:
        raise AssertionError("the sync reset of an environment with reset_async was called")

    def step(self, action: MoveAction, timeout_s: float | None = None, **kwargs: Any) -> BoardObservation:
        raise AssertionError("the sync step of an environment with step_async was called")

    async def reset_async(self, seed: int | None = None, episode_id: str | None = None,
                          **kwargs: Any) -> BoardObservation:
        await asyncio.sleep(0)
        self.seed, self.board, self._state = seed, ["." * self.size] * self.size, State()
        return BoardObservation(board=list(self.board))

    async def step_async(self, action: MoveAction, timeout_s: float | None = None,
                         **kwargs: Any) -> BoardObservation:
        await asyncio.sleep(0)
        row = self.board[action.row]
        self.board[action.row] = row[:action.col] + "x" + row[action.col + 1:]
        self._state.step_count += 1
        return BoardObservation(board=list(self.board), last_move=f"{action.row},{action.col}",
                                done="." not in "".join(self.board), reward=True)

    @property
    def state(self) -> State:
        return self._state


def parse_move(text: str) -> MoveAction:
    """A to_action for AsyncBoardEnvironment: "row,col"."""
    row, col = (int(part) for part in text.split(","))
    return MoveAction(row=row, col=col)


def guess_prompt_only(observation: GuessObservation) -> str:
    """A to_text for GuessNumberEnvironment: just the hint (the prompt at reset)."""
    return observation.hint or observation.prompt


class LimitedAction(Action):
    word: str = Field(..., max_length=5)


class LimitedEnvironment(Environment[LimitedAction, ShoutObservation, State]):
    """Takes words of at most 5 characters: the Action model refuses longer text."""

    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> ShoutObservation:
        return ShoutObservation(echoed="A short word, please.")

    def step(self, action: LimitedAction, timeout_s: float | None = None, **kwargs: Any) -> ShoutObservation:
        return ShoutObservation(echoed=action.word, done=True, reward=1.0)

    @property
    def state(self) -> State:
        return State()
