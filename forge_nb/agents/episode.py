"""agent_episode: the user's own agent code, talking to the policy through an OpenAI client, as a GRPO group.

``run.episode_fn = agent_episode(agent)`` with ``async def agent(client, sample) -> float``: for each task
sample the run's rollout loops open ``group_size`` trajectories on the run's OpenAI endpoint
(:mod:`forge_nb.agents.server`, started on first use), run the agent once per trajectory with an
``openai.AsyncOpenAI`` bound to it (``client.model`` names the policy), and turn what the policy saw and wrote
into Episodes (:mod:`forge_nb.agents.recorder`): the policy's sampled tokens are trained, everything else in
the conversation (the prompt, the agent's messages, tool results) is context. The float the agent returns is
the trajectory's reward; advantages are group-relative over the group's trajectories (``run.config.advantage``),
and a trajectory whose conversation came in several segments trains each with the same advantage.

An agent that raises, or returns something other than a finite number, has its trajectory quarantined with
the reason (counted in the run's ledger, never learned from), as a failing reward function does; the other
trajectories of the group train. A trajectory in which the agent made no call has nothing to train and adds
no episode.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any

from forge_nb.controller.episodes import add_ref_logprobs
from forge_nb.rl import assign_advantages
from forge_nb.rl.types import Episode
from forge_nb.system.monarch_compat import await_maybe

logger = logging.getLogger(__name__)

__all__ = ["Agent", "agent_episode"]

Agent = Callable[[Any, dict[str, Any]], Awaitable[float]]
"""``async def agent(client: openai.AsyncOpenAI, sample: dict) -> reward``."""
EpisodeFn = Callable[[Any, dict[str, Any]], Awaitable[list[Episode]]]


def agent_episode(agent: Agent, *, max_tokens: int | None = None, timeout_s: float | None = None,
                  endpoint: Any = None) -> EpisodeFn:
    """An episode function running ``agent`` ``run.config.group_size`` times per sample (see the module docstring).

    ``max_tokens``: tokens a trajectory's conversation may add after its first prompt (answers, tool results and
    the agent's later messages together; default ``run.config.max_res_tokens``, which is also the trained
    response length). ``timeout_s``: how long one run of the agent may take (None: no limit). ``endpoint``: an
    :class:`~forge_nb.agents.OpenAIEndpoint` to use instead of the run's own."""
    if not callable(agent):
        raise TypeError(f"agent_episode({agent!r}): needs `async def agent(client, sample) -> float`")
    if max_tokens is not None and max_tokens < 1:
        raise ValueError(f"agent_episode(max_tokens={max_tokens}): a trajectory needs at least one token")

    async def episode(run: Any, sample: dict[str, Any]) -> list[Episode]:
        cfg = run.config
        served = endpoint or getattr(run, "openai", None) or await run.serve_openai()
        logs = [served.open_trajectory(max_tokens or cfg.max_res_tokens, request_len=cfg.max_req_tokens)
                for _ in range(cfg.group_size)]
        try:
            outcomes = await asyncio.gather(*(_play(agent, served.client(log), sample, timeout_s) for log in logs))
        finally:
            for log in logs:
                served.close_trajectory(log)
        members = []
        for log, (reward, error) in zip(logs, outcomes, strict=True):
            episodes = log.episodes(pad_id=run.pad_id, request_len=cfg.max_req_tokens, target=sample.get("target"))
            if not episodes:
                logger.warning("agent_episode: a trajectory made no call to the policy (%s); nothing to train",
                               error or f"reward {reward}")
                continue
            for e in episodes:
                e.reward, e.rewards, e.quarantine = reward, ({"agent": reward} if reward is not None else {}), error
            members.append(episodes)
        assign_advantages([m[-1] for m in members], method=cfg.advantage)
        for m in members:
            for e in m[:-1]:
                e.advantage = m[-1].advantage
        group = [e for m in members for e in m]
        if group:
            await add_ref_logprobs(run, group)
        return group

    episode.__name__ = episode.__qualname__ = f"agent_episode({getattr(agent, '__name__', 'agent')})"
    return episode


async def _play(agent: Agent, client: Any, sample: dict[str, Any], timeout_s: float | None
                ) -> tuple[float | None, str | None]:
    """One run of the agent: its reward, or None and why its trajectory must not be learned from."""
    try:
        async with asyncio.timeout(timeout_s):
            reward = await await_maybe(agent(client, sample))
    except TimeoutError:
        return None, f"the agent took longer than {timeout_s:g} s"
    except Exception as e:  # the user's code: its error is the trajectory's reason, the run goes on
        return None, f"the agent raised {type(e).__name__}: {e}"[:500]
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        return None, f"the agent returned {reward!r}; it must return the trajectory's reward, a finite number"
    return float(reward), None
