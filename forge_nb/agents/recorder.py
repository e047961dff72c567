"""TrajectoryLog: the calls an agent made under one trajectory, kept as the exact tokens the policy saw and wrote.

Every request to a trajectory's base URL (``/t/<id>/v1/...``) goes through its log. A request that continues
the conversation of the one before it (the same messages, then one of the answers it got, then new user or
tool messages) is given the previous prompt's token ids, the sampled ids of that answer, and only the new
messages rendered after them (:func:`forge_nb.envs.chat.after_action_ids`): no text the policy wrote is ever
tokenised again. Such a conversation is one *segment*, a :class:`~forge_nb.rl.trajectory.Trajectory`::

    prompt ids | answer 1 (sampled ids) | new messages 1 | answer 2 | ... | answer k
                 trained                  context          trained          trained

A request that does not continue it (the agent rewrote or summarised the history, or started another
conversation) starts a new segment from its own rendering. Tools that change between calls do not: templates
render them at the conversation's start, and the continued segment keeps the start the policy saw. Each
segment becomes an Episode, and every segment of a trajectory is trained with the trajectory's reward and
advantage (the agent's reward is for all it did); see :mod:`forge_nb.agents.episode`. ``/v1/completions``
calls work the same way on token ids: a prompt that starts with the previous prompt and one of its answers
continues the segment.

An answer with ``n > 1`` choices waits until the next request says which one the conversation kept; if none
follows, the first choice ends the segment.

Calls under one trajectory are answered one at a time, in arrival order (``lock``): a trajectory is one
conversation, and its next prompt depends on the answer before it.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from forge_nb.agents.protocol import ApiError
from forge_nb.rl.trajectory import Trajectory
from forge_nb.rl.types import Completion, Episode
from forge_nb.service import Affinity

__all__ = ["TrajectoryLog"]


@dataclass(slots=True)
class _Answered:
    """The last call of the open segment, until the next call says which of its choices was kept."""

    keys: list[str] | list[int] | str  # its messages' keys (chat), prompt ids or prompt text (completions)
    choices: list[Completion]
    replies: list[str]  # per choice: its message's key (chat) or its text (completions)
    infos: list[dict[str, Any]]


@dataclass(eq=False)
class TrajectoryLog:
    """One trajectory's segments; ``budget``: response tokens per segment, ``request_len``: the trained prompt
    width (the longest first prompt), ``later_request_len``: the longest prompt of a later segment, whose part
    past ``request_len`` is laid at the start of its response as context (default ``request_len``)."""

    budget: int
    request_len: int | None = None
    later_request_len: int | None = None
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    segments: list[Trajectory] = field(default_factory=list)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    affinity: Affinity = field(default_factory=Affinity)  # its calls go to one policy replica (prefix cache)
    sessions: list[str] = field(default_factory=list)  # X-Session-IDs bound to it (OpenAIEndpoint.bind_session)
    _answered: _Answered | None = None

    # -- before generating -----------------------------------------------------------------------

    def chat_prompt(self, keys: list[str], roles: list[str], *, render: Callable[[], list[int]],
                    after: Callable[[list[int], int], list[int]],
                    new_text: Callable[[int], str]) -> tuple[list[int], int]:
        """Prompt ids for a chat request whose messages have ``keys`` and ``roles``, and the response tokens it
        may use. ``render()`` renders the whole conversation, ``after(action_ids, i)`` the messages from ``i`` on
        after an answer, ``new_text(i)`` their text for the explorer."""
        last, start = self._answered, 0
        if last is not None and isinstance(last.keys, list):
            start = len(last.keys) + 1
        if (last is not None and len(keys) > start and keys[:start - 1] == last.keys
                and keys[start - 1] in last.replies and "assistant" not in roles[start:]):
            kept = last.replies.index(keys[start - 1])
            segment = self._keep(kept)
            ids = after(segment.turns[-1].action_ids, start)
            self._observe(segment, new_text(start), ids, last.infos[kept])
            return segment.context_ids, segment.room
        return self._new_segment(render(), new_text(0))

    def completion_prompt(self, prompt: str | list[int], *,
                          tokenize: Callable[[str], list[int]]) -> tuple[list[int], int]:
        """Prompt ids for a ``/v1/completions`` request under this trajectory, and the tokens it may use."""
        last = self._answered
        if last is not None and type(last.keys) is type(prompt):
            for kept, (choice, text) in enumerate(zip(last.choices, last.replies, strict=True)):
                if isinstance(prompt, str):
                    head = last.keys + text  # type: ignore[operator]
                    if len(prompt) > len(head) and prompt.startswith(head):
                        segment = self._keep(kept)
                        rest = prompt[len(head):]
                        self._observe(segment, rest, tokenize(rest), last.infos[kept])
                        return segment.context_ids, segment.room
                else:
                    head_ids = list(last.keys) + choice.token_ids.tolist()  # type: ignore[arg-type]
                    if len(prompt) > len(head_ids) and prompt[:len(head_ids)] == head_ids:
                        segment = self._keep(kept)
                        self._observe(segment, "", prompt[len(head_ids):], last.infos[kept])
                        return segment.context_ids, segment.room
        ids = tokenize(prompt) if isinstance(prompt, str) else list(prompt)
        return self._new_segment(ids, prompt if isinstance(prompt, str) else "")

    # -- after generating ------------------------------------------------------------------------

    def answered(self, keys: list[str] | list[int] | str, choices: list[Completion], replies: list[str],
                 infos: list[dict[str, Any]]) -> None:
        """Record a call's answer: its choices wait for the next call to say which was kept. ``infos``: per
        choice, what answers it (``{"tool": name, "tool_ok": ...}`` for tool calls; the agent otherwise)."""
        self._answered = _Answered(keys, list(choices), replies, [i or {"source": "agent"} for i in infos])

    def close(self) -> list[Trajectory]:
        """The segments with their last answer in (the first choice where several were given)."""
        if self._answered is not None:
            self._keep(0)
        return [s for s in self.segments if s.turns]

    def episodes(self, *, pad_id: int, request_len: int | None, target: Any = None) -> list[Episode]:
        """Each segment as an Episode (rewards and advantages are the caller's)."""
        episodes = []
        for i, segment in enumerate(self.close()):
            episode = segment.to_episode(pad_id=pad_id, request_len=request_len, target=target)
            episode.completion.metadata.update(trajectory=self.id, segment=i)  # type: ignore[union-attr]
            episodes.append(episode)
        return episodes

    # -- the segments ----------------------------------------------------------------------------

    def _keep(self, kept: int) -> Trajectory:
        """The open segment with choice ``kept`` of the last answer as its newest action."""
        last, self._answered = self._answered, None
        assert last is not None and self.segments
        segment = self.segments[-1]
        choice = last.choices[kept]
        segment.act(choice.text, choice.token_ids.tolist(),
                    None if choice.logprobs is None else choice.logprobs.tolist(), choice.generator_version)
        segment.turns[-1].info = dict(last.infos[kept])
        return segment

    def _observe(self, segment: Trajectory, text: str, ids: list[int], info: dict[str, Any]) -> None:
        if len(ids) >= segment.room:
            raise ApiError(400, f"this trajectory's conversation has used its token budget ({self.budget} tokens "
                           f"after the first prompt, answers and new messages together; {segment.room} were left "
                           f"for {len(ids)} tokens of new messages). Give the episode a larger budget "
                           "(agent_episode(max_tokens=...)) or end the conversation", code="context_length_exceeded")
        segment.observe(text, ids, 0.0, False, info)

    def _new_segment(self, prompt_ids: list[int], text: str) -> tuple[list[int], int]:
        if self._answered is not None:
            self._keep(0)
        width = self.request_len
        limit = max(width, self.later_request_len or 0) if width is not None and self.segments else width
        if limit is not None and len(prompt_ids) > limit:
            later = (" and a later segment's prompt (after the agent rewrote its history) at most "
                     f"{limit}" if self.segments else "")
            raise ApiError(400, f"the prompt has {len(prompt_ids)} tokens and a trained prompt at most {width} (the "
                           f"run's max_req_tokens){later}: raise max_req_tokens (for a summarising agent's later "
                           "prompts: agent_episode(later_prompt_tokens=...)), or shorten the prompt",
                           code="context_length_exceeded")
        head, lead = (prompt_ids[:width], prompt_ids[width:]) if width is not None else (prompt_ids, [])
        if len(lead) >= self.budget:
            raise ApiError(400, f"the prompt has {len(prompt_ids)} tokens: {len(lead)} past the trained prompt's "
                           f"{width} go to the segment's response, which holds {self.budget} in all, with no room "
                           "left for an answer; give the episode a larger budget (agent_episode(max_tokens=...))",
                           code="context_length_exceeded")
        segment = Trajectory(prompt=text, prompt_ids=list(head), max_tokens=self.budget, lead_ids=list(lead))
        self.segments.append(segment)
        return segment.context_ids, segment.room
