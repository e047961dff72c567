"""A multi-turn trajectory as one trainable Episode: the policy's tokens trained, the environment's only read.

A trajectory starts from a prompt; each turn appends what the policy generated (its token ids and their
logprobs under the generator) and then what the environment answered (tokenized by the caller, with the
turn's reward). As an :class:`~forge_nb.rl.types.Episode` it is one response after the prompt::

    prompt | action 1 | observation 1 | action 2 | observation 2 | ... | action k
             trained    context         trained    context               trained

A prompt longer than the run's trained prompt width keeps its tail at the response's start (``lead_ids``,
context like an observation). ``Episode.policy_mask`` is True on the action tokens only, so the loss, the KL
term and the entropy see the policy's own tokens; logprobs of context tokens are 0 (masked out). The reward
is the sum of the turns' rewards. The policy version is the oldest turn's: the age the replay buffer checks is
that of the stalest tokens. ``completion.metadata["turns"]`` keeps each turn's text, reward and environment
info for the rollout explorer.

Pure PyTorch: the episode function that drives generation and the environment service lives in
``forge_nb.envs``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

import torch

from forge_nb.rl.types import Completion, Episode

__all__ = ["Trajectory", "Turn"]


@dataclass(kw_only=True, slots=True)
class Turn:
    """One turn: the policy's action, then the environment's answer (empty on the last turn)."""

    action: str
    action_ids: list[int]
    action_logprobs: list[float]
    version: int | None
    observation: str = ""
    observation_ids: list[int] = field(default_factory=list)
    reward: float = 0.0
    info: dict[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class Trajectory:
    """The turns of one episode after ``prompt_ids``, within ``max_tokens`` response tokens."""

    prompt: str
    prompt_ids: list[int]
    max_tokens: int
    lead_ids: list[int] = field(default_factory=list)
    """Context at the start of the response, before the first action (read, never trained): the part of a
    prompt longer than the run's trained prompt width (an agent's summarised history)."""
    turns: list[Turn] = field(default_factory=list)
    done: bool = False
    dropped: str | None = None
    """Why this trajectory must not be learned from (an environment replica died mid-way...), or None."""

    @property
    def response_ids(self) -> list[int]:
        return self.lead_ids + [t for turn in self.turns for t in (*turn.action_ids, *turn.observation_ids)]

    @property
    def context_ids(self) -> list[int]:
        """What the policy sees at its next turn: the prompt and every turn so far."""
        return self.prompt_ids + self.response_ids

    @property
    def room(self) -> int:
        """Response tokens left for the next action."""
        return self.max_tokens - len(self.response_ids)

    @property
    def reward(self) -> float:
        return sum(turn.reward for turn in self.turns)

    def act(self, text: str, token_ids: list[int], logprobs: list[float] | None, version: int | None) -> Turn:
        """Record the policy's action of this turn (logprobs None: unknown, recorded as 0)."""
        if len(token_ids) > self.room:
            raise ValueError(f"an action of {len(token_ids)} tokens does not fit: {self.room} of the trajectory's "
                             f"{self.max_tokens} response tokens are left")
        logprobs = list(logprobs) if logprobs is not None else [0.0] * len(token_ids)
        if len(logprobs) != len(token_ids):
            raise ValueError(f"{len(logprobs)} logprobs for {len(token_ids)} action tokens")
        turn = Turn(action=text, action_ids=list(token_ids), action_logprobs=logprobs, version=version)
        self.turns.append(turn)
        return turn

    def observe(self, text: str, token_ids: list[int], reward: float, done: bool,
                info: dict[str, Any] | None = None) -> None:
        """Record the environment's answer to the last action; an answer longer than the room left is cut
        (and the trajectory ends: the policy could not answer it)."""
        if not self.turns:
            raise ValueError("observe() before act(): the environment answers an action")
        turn = self.turns[-1]
        turn.reward, turn.info = float(reward), dict(info or {})
        self.done = bool(done)
        if done:
            return
        room = self.room
        if len(token_ids) >= room:
            self.done = True
            turn.info["truncated"] = True
        turn.observation, turn.observation_ids = text, list(token_ids)[:max(room, 0)]

    def to_episode(self, *, pad_id: int, request_len: int | None = None, target: Any = None) -> Episode:
        """The trajectory as one Episode (see the module docstring); advantages come later, per group."""
        ids: list[int] = list(self.lead_ids)
        mask: list[bool] = [False] * len(ids)
        logprobs: list[float] = [0.0] * len(ids)
        for turn in self.turns:
            ids += turn.action_ids + turn.observation_ids
            mask += [True] * len(turn.action_ids) + [False] * len(turn.observation_ids)
            logprobs += turn.action_logprobs + [0.0] * len(turn.observation_ids)
        versions = [t.version for t in self.turns if t.version is not None]
        completion = Completion(
            text="".join(t.action + t.observation for t in self.turns), token_ids=ids, logprobs=logprobs,
            prompt=self.prompt, prompt_ids=self.prompt_ids, generator_version=min(versions) if versions else None,
            stop_reason="done" if self.done else "turns",
            metadata={"turns": [{"action": t.action, "observation": t.observation, "reward": t.reward,
                                 "version": t.version, **({"info": t.info} if t.info else {})}
                                for t in self.turns]})
        episode = Episode(episode_id=uuid.uuid4().hex, pad_id=pad_id, request_len=request_len,
                          response_len=self.max_tokens, target=target, completion=completion,
                          policy_mask=torch.tensor(mask, dtype=torch.bool))
        episode.reward = self.reward
        episode.rewards = {"env": self.reward}
        episode.quarantine = self.dropped
        return episode
