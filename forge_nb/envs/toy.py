"""EchoEnv: a multi-turn environment that the CPU tiny model learns from scratch in minutes.

Each turn the environment shows one letter and the policy answers it repeated ``chars`` times ("c" ->
"ccc"); the next turn shows the next letter of the episode's sequence, ``turns`` turns in all. A turn's
reward is the fraction of the answer's characters that are right, divided by ``turns``, so an episode
earns between 0 and 1 and a random policy about 1 / (letters + 2) per character: GRPO has a signal from the
first step, as with the single-turn toy task. Every answer is made in the context of the turns before it
(the whole conversation is the prompt), so what is learned is the multi-turn skill "answer the last
observation", with the environment's letters masked out of the loss.
"""

from __future__ import annotations

import random

from forge_nb.actors.coder import StepResult

__all__ = ["EchoEnv"]


class EchoEnv:
    """See the module docstring; ``alphabet`` must be letters the tokenizer knows."""

    def __init__(self, turns: int = 3, chars: int = 3, alphabet: str = "abcdefgh"):
        if turns < 1 or chars < 1 or not alphabet:
            raise ValueError(f"EchoEnv(turns={turns}, chars={chars}, alphabet={alphabet!r}): turns and chars "
                             "must be >= 1 and the alphabet non-empty")
        self.turns, self.chars, self.alphabet = turns, chars, alphabet
        self.letters: list[str] = []
        self.turn = 0

    def reset(self, seed: int | None = None) -> str:
        rng = random.Random(seed)
        self.letters = [rng.choice(self.alphabet) for _ in range(self.turns)]
        self.turn = 0
        return self.letters[0]

    def step(self, action: str) -> StepResult:
        if not self.letters:
            raise RuntimeError("EchoEnv.step() before reset()")
        if self.turn >= self.turns:
            raise RuntimeError(f"EchoEnv: the episode ended after {self.turns} turns; reset() for another")
        want = self.letters[self.turn] * self.chars
        right = sum(a == b for a, b in zip(action, want, strict=False))
        self.turn += 1
        done = self.turn == self.turns
        return StepResult(observation="" if done else self.letters[self.turn], reward=right / self.chars / self.turns,
                          done=done, info={"want": want, "right": right})
