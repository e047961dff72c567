"""agent_episode: the user's own agent code, talking to the policy through an OpenAI client, as a GRPO group.

``run.episode_fn = agent_episode(agent)`` with ``async def agent(client, sample) -> float`` or a plain
``def agent(client, sample) -> float``: for each task sample the run's rollout loops open ``group_size``
trajectories on the run's OpenAI endpoint (:mod:`forge_nb.agents.server`, started on first use), run the agent
once per trajectory with a client bound to it (``client.model`` names the policy), and turn what the policy saw
and wrote into Episodes (:mod:`forge_nb.agents.recorder`): the policy's sampled tokens are trained, everything
else in the conversation (the prompt, the agent's messages, tool results) is context. The float the agent
returns is the trajectory's reward; advantages are group-relative over the group's trajectories
(``run.config.advantage``), and a trajectory whose conversation came in several segments trains each with the
same advantage (``run.episodes()`` rows carry its ``trajectory`` id and ``segment`` index).

**Async and synchronous agents.** An ``async def`` agent gets an ``openai.AsyncOpenAI`` and runs on the kernel's
event loop, beside the endpoint that answers it, as asyncio code shares a loop: it must not block (a
synchronous client or ``time.sleep`` inside ``async def`` would hold the loop that has to answer it). A plain
``def`` agent gets a synchronous ``openai.OpenAI`` and runs in a thread of a bounded pool (``SYNC_THREADS``),
so its blocking calls wait on the endpoint while the loop serves them; most agent code in the wild is
synchronous. Considered: serving the endpoint from a loop of its own thread. A request still has to reach the
policy service, whose routing, health and respawn live on the kernel's loop, so an agent blocking that loop
would still stall every answer; only moving the agent off the loop keeps the endpoint answering.

**Every trajectory counts.** An agent that raises, or returns something other than a finite number, has its
trajectory quarantined with the reason (counted in the run's ledger, never learned from), as a failing reward
function does; the other trajectories of the group train. A trajectory in which the agent made no call to the
policy (it failed before its first call: a typo in its code, a wrong model name, a first request the endpoint
refused) has nothing to train and is quarantined too, as one episode with no completion: the run's quarantine
watch sees it, and an agent that fails so every time pauses the run within a few groups, with the agent's own
exception (its type, message and the line of the agent's code) in the pause's message and, as its cause, in
the cell that waited.

**Later segments.** An agent that rewrites its history (a summary of what came before) starts a new segment
whose prompt is that history. ``later_prompt_tokens`` lets such a prompt be longer than the run's
``max_req_tokens``: the part past ``max_req_tokens`` is laid at the start of the segment's response as context
(read, not trained), so the trajectory's ``max_tokens`` must hold it too.
"""

from __future__ import annotations

import asyncio
import inspect
import math
import os
import sysconfig
import traceback
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from forge_nb.controller.context import EpisodeFn, RolloutContext
from forge_nb.controller.episodes import add_ref_logprobs
from forge_nb.rl import assign_advantages
from forge_nb.rl.types import Episode

__all__ = ["Agent", "SYNC_THREADS", "agent_episode"]

Agent = Callable[[Any, dict[str, Any]], Awaitable[float] | float]
"""``async def agent(client: openai.AsyncOpenAI, sample: dict) -> reward``, or a plain ``def`` taking an
``openai.OpenAI``."""

#: Synchronous agents of one ``agent_episode`` running at once (threads); more wait for a free thread. The
#: recipes keep rollout_loops x group_size trajectories in flight (32 for the agent recipe).
SYNC_THREADS = 64


def agent_episode(agent: Agent, *, max_tokens: int | None = None, timeout_s: float | None = None,
                  endpoint: Any = None, later_prompt_tokens: int | None = None) -> EpisodeFn:
    """An episode function running ``agent`` ``run.config.group_size`` times per sample (see the module docstring).

    ``max_tokens``: tokens a trajectory's conversation may add after its first prompt (answers, tool results and
    the agent's later messages together; default ``run.config.max_res_tokens``, which is also the trained
    response length). ``timeout_s``: how long one run of the agent may take (None: no limit; a synchronous agent
    that outlives it is left to finish in its thread, its trajectory closed). ``endpoint``: an
    :class:`~forge_nb.agents.OpenAIEndpoint` to use instead of the run's own. ``later_prompt_tokens``: the longest
    prompt of a segment after the first (default ``run.config.max_req_tokens``)."""
    if not callable(agent):
        raise TypeError(f"agent_episode({agent!r}): needs `async def agent(client, sample) -> float` (or a plain "
                        "def taking a synchronous openai.OpenAI)")
    for name, value in (("max_tokens", max_tokens), ("later_prompt_tokens", later_prompt_tokens)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"agent_episode({name}={value!r}): a positive number of tokens")
    # a plain def runs in these threads (started as needed, none before the first run)
    pool = None if _is_async(agent) else ThreadPoolExecutor(SYNC_THREADS, thread_name_prefix="forge_nb-agent")

    async def episode(run: RolloutContext, sample: dict[str, Any]) -> list[Episode]:
        cfg = run.config
        served = endpoint or run.openai or await run.openai_endpoint()
        budget = max_tokens or cfg.max_res_tokens
        logs = [served.open_trajectory(budget, request_len=cfg.max_req_tokens, later_request_len=later_prompt_tokens)
                for _ in range(cfg.group_size)]
        try:
            outcomes = await asyncio.gather(*(
                _play(agent, served.client(log) if pool is None else served.sync_client(log), sample, timeout_s, pool)
                for log in logs))
        finally:
            for log in logs:
                served.close_trajectory(log)
        members = []
        for log, (reward, reason, error) in zip(logs, outcomes, strict=True):
            episodes = log.episodes(pad_id=run.pad_id, request_len=cfg.max_req_tokens, target=sample.get("target"))
            if not episodes:  # nothing to train, but it counts: the quarantine watch sees a failing agent
                reason = reason or (f"the agent made no call to the policy: it returned {reward!r} without asking "
                                    "the model, so there is nothing to train")
                episodes = [Episode(pad_id=run.pad_id, request_len=cfg.max_req_tokens, response_len=budget,
                                    target=sample.get("target"))]
            for e in episodes:
                e.reward, e.rewards = reward, ({"agent": reward} if reward is not None else {})
                e.quarantine, e.quarantine_error = reason, error
            members.append(episodes)
        assign_advantages([m[-1] for m in members], method=cfg.advantage)  # quarantined ones get 0
        for m in members:
            for e in m[:-1]:
                e.advantage = m[-1].advantage
        group = [e for m in members for e in m]
        if trained := [e for e in group if e.quarantine is None]:
            await add_ref_logprobs(run, trained)
        return group

    episode.__name__ = episode.__qualname__ = f"agent_episode({getattr(agent, '__name__', 'agent')})"
    return episode


def _is_async(agent: Agent) -> bool:
    """``async def`` (or a partial of one, or an object whose ``__call__`` is one)."""
    return inspect.iscoroutinefunction(agent) or inspect.iscoroutinefunction(type(agent).__call__)


async def _play(agent: Agent, client: Any, sample: dict[str, Any], timeout_s: float | None,
                threads: ThreadPoolExecutor | None) -> tuple[float | None, str | None, BaseException | None]:
    """One run of the agent: its reward, or None, why its trajectory must not be learned from, and the exception
    behind that where there is one. ``threads``: run it there (a synchronous agent)."""
    try:
        async with asyncio.timeout(timeout_s):
            if threads is None:
                reward = await agent(client, sample)  # type: ignore[misc]
            else:
                reward = await asyncio.get_running_loop().run_in_executor(threads, agent, client, sample)
    except TimeoutError:
        return None, f"the agent took longer than {timeout_s:g} s", None
    except Exception as e:  # the user's code: its error is the trajectory's reason, the run goes on
        where = _user_line(e)
        return None, f"the agent raised {type(e).__name__}: {_said(e)}" + (f" ({where})" if where else ""), e
    if inspect.isawaitable(reward):
        if inspect.iscoroutine(reward):
            reward.close()
        return None, ("the agent returned an awaitable: a plain `def agent` runs in a thread with a synchronous "
                      "openai.OpenAI; make it `async def agent(client, sample)` to get an AsyncOpenAI"), None
    if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
        return None, f"the agent returned {reward!r}; it must return the trajectory's reward, a finite number", None
    return float(reward), None, None


_LIBRARIES = tuple({os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep,
                    *(sysconfig.get_paths()[k] + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib"))})


def _said(error: BaseException) -> str:
    """The exception's message, short: an openai client's error as the status and the endpoint's own words
    (its text is "Error code: 404 - {<the whole JSON body>}")."""
    body = getattr(error, "body", None)
    if isinstance(body, dict) and isinstance(body.get("message"), str) and hasattr(error, "status_code"):
        return f"{error.status_code} {body['message']}"[:300]
    return str(error)[:300]


def _user_line(error: BaseException) -> str:
    """The innermost line of the agent's own code in ``error``'s traceback, where the user reads it
    ("cell In[5], line 3: q = sample['question']", or "agent.py, line 3: ..."); "" if there is none."""
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        name = frame.filename
        if name.startswith(_LIBRARIES) or name.startswith("<frozen"):
            continue
        place = os.path.basename(name)
        try:
            from IPython import get_ipython

            shell = get_ipython()
            cell = shell.compile.format_code_name(name) if shell is not None else None
            if cell:
                place = f"cell {cell[1]}"
        except Exception:  # IPython absent or of another shape: the file's name will do
            pass
        return f"{place}, line {frame.lineno}" + (f": {frame.line.strip()[:120]}" if frame.line else "")
    return ""
