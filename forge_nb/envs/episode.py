"""multi_turn_episode: an episode function that plays a group of trajectories against an environment service.

``run.episode_fn = multi_turn_episode(env)`` (``env`` an :class:`~forge_nb.envs.EnvPool` service) makes the
run's rollout loops play episodes of several turns instead of single prompt -> completion groups; see the
package docstring for the exchange. Each trajectory gets at most ``run.config.max_res_tokens`` tokens after
its first observation (actions and observations together) and each action at most ``turn_tokens``. The
policy is sent token ids, so every turn sees exactly the tokens it was trained on, and the engine's prefix
cache can reuse the conversation so far. A chat model gets the conversation in its chat template's shape
(the observations as user messages, a system prompt if given; ``forge_nb.envs.chat``), a tiny local model
the text as it is.

With ``tools`` (:class:`~forge_nb.envs.tools.Tools`), an action that calls a tool is answered by the tool's
result, and the environment sees only the other actions.

A trajectory whose environment call fails mid-way (its replica died, the environment raised) is kept in the
group quarantined, with the reason: it is counted in the run's ledger and never learned from. A failure
before the first action (reset) fails the group, as a failing generate does.
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import uuid
from typing import Any

from forge_nb.controller.context import EpisodeFn, RolloutContext
from forge_nb.controller.episodes import add_ref_logprobs
from forge_nb.envs.chat import Framing
from forge_nb.envs.tools import Tools
from forge_nb.models import load_tokenizer
from forge_nb.rl import assign_advantages
from forge_nb.rl.trajectory import Trajectory
from forge_nb.rl.types import Episode

__all__ = ["multi_turn_episode"]


def multi_turn_episode(env: Any, *, max_turns: int = 8, turn_tokens: int | None = None,
                       tools: Tools | None = None, chat: bool | None = None, system_prompt: str | None = None,
                       chat_template_kwargs: dict[str, Any] | None = None) -> EpisodeFn:
    """An episode function (``async (run, sample) -> group``) playing ``run.config.group_size`` trajectories
    from one seed (``sample["seed"]`` if the task gives one, else a fresh one) for up to ``max_turns`` turns;
    with ``tools``, an action that calls a tool is answered by the tool instead of the environment.

    ``chat`` (None: the model's chat template if it frames messages; True: require one; False: raw text),
    ``system_prompt`` and ``chat_template_kwargs`` (e.g. ``{"enable_thinking": False}`` for Qwen3) say how
    the conversation is framed: :class:`~forge_nb.envs.chat.Framing`."""
    if max_turns < 1:
        raise ValueError(f"multi_turn_episode(max_turns={max_turns}): an episode needs at least one turn")
    if turn_tokens is not None and turn_tokens < 1:
        raise ValueError(f"multi_turn_episode(turn_tokens={turn_tokens}): an action needs at least one token")
    if system_prompt is not None and chat is False:
        raise ValueError("multi_turn_episode(system_prompt=..., chat=False): a system prompt needs chat framing")
    framings: dict[str, Framing] = {}  # per model: the probe of its template runs once

    async def episode(run: RolloutContext, sample: dict[str, Any]) -> list[Episode]:
        cfg = run.config
        seed = sample.get("seed", random.getrandbits(31))
        if run.model not in framings:
            framings[run.model] = Framing(load_tokenizer(run.model), chat=chat, system_prompt=system_prompt,
                                          template_kwargs=chat_template_kwargs)
        trajectories = await asyncio.gather(*(
            play(env, run, seed, max_turns=max_turns, turn_tokens=turn_tokens or cfg.max_res_tokens, tools=tools,
                 framing=framings[run.model])
            for _ in range(cfg.group_size)))
        group = [t.to_episode(pad_id=run.pad_id, request_len=cfg.max_req_tokens, target=seed) for t in trajectories]
        await add_ref_logprobs(run, group)
        assign_advantages(group, method=cfg.advantage)
        return group

    episode.__name__ = episode.__qualname__ = "multi_turn_episode"
    return episode


async def play(env: Any, run: RolloutContext, seed: int, *, max_turns: int, turn_tokens: int,
               tools: Tools | None = None, framing: Framing | None = None) -> Trajectory:
    """One trajectory: reset, then act and step until the environment is done, the turns are used up or
    the trajectory has no room left for another action."""
    framing = framing or Framing(load_tokenizer(run.model))
    tid = uuid.uuid4().hex
    # the trajectory's environment object lives on one replica; its generations go to one policy replica
    # too, whose prefix cache holds the conversation so far (it moves if that replica dies)
    async with env.session(), run.policy.session():
        first = await env.reset.route(tid, seed)
        trajectory = Trajectory(prompt=first, prompt_ids=framing.prompt_ids(first),
                                max_tokens=run.config.max_res_tokens)
        try:
            while len(trajectory.turns) < max_turns and not trajectory.done and trajectory.room > 0:
                limit = min(turn_tokens, trajectory.room)
                (action,) = await run.policy.generate.route(
                    trajectory.context_ids, **{**run.sampling_overrides, "n": 1, "max_tokens": limit})
                trajectory.act(action.text, action.token_ids.tolist(),
                               None if action.logprobs is None else action.logprobs.tolist(), action.generator_version)
                call = tools.parse(action.text) if tools is not None else None
                if call is not None:  # the tool answers; the environment never sees the call
                    answer = await tools.call(call)
                    observation = tools.content(answer) if framing.chat else tools.format(answer)
                    reward, finished = 0.0, False
                    info = {"tool": answer.call.name, "tool_ok": answer.ok}
                else:
                    try:
                        result = await env.step.route(tid, action.text)
                    except Exception as e:  # the environment, or its replica: this trajectory cannot go on
                        trajectory.dropped = f"environment step failed at turn {len(trajectory.turns)}: {e}"[:500]
                        break
                    observation, reward, finished = str(result.observation), result.reward, result.done
                    info = result.info
                ids = framing.observation_ids(trajectory.turns[-1].action_ids, observation, tool=call is not None)
                trajectory.observe(observation, ids, reward, finished, info)
        finally:
            with contextlib.suppress(Exception):  # a replica that died took the environment object with it
                await env.close.route(tid)
    return trajectory
