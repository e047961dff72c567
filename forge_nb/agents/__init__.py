"""Agents train too: an OpenAI-compatible endpoint in front of a run's policy, and agent code as episodes.

::

    agent code (yours, or a library's)        the kernel                                   policy service
      openai.AsyncOpenAI(base_url=/t/<id>/v1) ──> OpenAIEndpoint (aiohttp, 127.0.0.1, token)
        chat.completions.create(messages, tools)    messages -> token ids (chat template;      generate.route(ids)
                                                     a continued conversation reuses the ──────> (vLLM)
                                                     ids the policy saw and wrote)        <──── token ids, logprobs,
        <── message, tool_calls (parsed)  <──────── TrajectoryLog records the call              version
      return reward ─────────────────────────────> agent_episode: segments -> Episodes, GRPO advantages

- :class:`OpenAIEndpoint` (:mod:`~forge_nb.agents.server`): ``await run.serve_openai()`` or ``%forge_serve``.
- :func:`agent_episode` (:mod:`~forge_nb.agents.episode`): ``run.episode_fn = agent_episode(agent)``; an ``async def``
  agent gets an ``openai.AsyncOpenAI``, a plain ``def`` one an ``openai.OpenAI`` and a thread.
- :class:`TrajectoryLog` (:mod:`~forge_nb.agents.recorder`): how calls become token-exact segments.
"""

from forge_nb.agents.episode import Agent, agent_episode
from forge_nb.agents.recorder import TrajectoryLog
from forge_nb.agents.server import OpenAIEndpoint

__all__ = ["Agent", "OpenAIEndpoint", "TrajectoryLog", "agent_episode"]
