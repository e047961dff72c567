"""agent_episode on a real run (vLLM generator, trainer, torchstore): an agent written against the OpenAI client
trains, and what the trainer gets is exactly what the engine saw and sampled.

The agent asks for ``return_token_ids`` (vLLM's extension) so that it can keep what the engine reported: each
call's prompt ids and sampled ids. The trainer's batch (``collate`` of the group the episode function built, as
the training loop makes it) must hold those ids as they are, with the loss mask on the sampled ones only.
"""

from __future__ import annotations

import math
from typing import Any

import openai
import pytest

import forge_nb
from forge_nb.agents import agent_episode
from forge_nb.magics._display import status_report
from forge_nb.recipes.agents import KEY_TOOLS, agent_keys
from forge_nb.rl import collate
from forge_nb.widgets.controls import render_status, run_summary
from forge_nb.widgets.explorer import render_episodes

pytestmark = [pytest.mark.heavy]

IDS = {"extra_body": {"return_token_ids": True}}


def recording_agent(seen: dict[str, list[tuple[list[int], list[int]]]]) -> Any:
    """Two calls that continue one conversation (a tool's answer or a user message between them), then a call
    that rewrites the history; returns a reward from the second answer. Records each call's ids by trajectory."""

    async def agent(client: Any, sample: dict[str, str]) -> float:
        calls = seen.setdefault(str(client.base_url).rstrip("/").split("/")[-2], [])

        async def ask(messages: list[Any], **kwargs: Any) -> Any:
            reply = await client.chat.completions.create(model=client.model, messages=messages, **IDS, **kwargs)
            calls.append((reply.prompt_token_ids, reply.choices[0].token_ids))
            return reply.choices[0].message

        messages: list[Any] = [{"role": "user", "content": sample["request"]}]
        first = await ask(messages, tools=KEY_TOOLS, max_tokens=2)
        messages.append(first)
        if first.tool_calls:
            messages += [{"role": "tool", "tool_call_id": c.id, "content": sample["target"]} for c in first.tool_calls]
        else:
            messages.append({"role": "user", "content": "ab"})
        second = await ask(messages, tools=KEY_TOOLS, max_tokens=2)
        await ask([{"role": "user", "content": "?" + sample["target"]}], max_tokens=1)  # history rewritten
        return float((second.content or "")[:1] == sample["target"])

    return agent


@pytest.mark.timeout(400)
async def test_the_trainer_gets_the_engine_s_own_tokens_and_trains(runtime: Any, tmp_path: Any) -> None:
    run = await forge_nb.spawn(agent_keys(name="agent-test", run_dir=str(tmp_path / "run"), group_size=4,
                                          batch_size=16), progress=False)
    try:
        await run.serve_openai(tool_parser="simple")
        seen: dict[str, list[tuple[list[int], list[int]]]] = {}
        episode_fn = agent_episode(recording_agent(seen))
        group = await episode_fn(run, run.task.sample())
        assert len(seen) == 4 and len(group) == 8  # 4 trajectories, 2 segments each (the history was rewritten)
        batch = collate(group)
        width = batch.request_len
        for row, episode in enumerate(group):
            calls = seen[episode.completion.metadata["trajectory"]]
            tokens, mask = batch.tokens[row].tolist(), batch.response_mask[row].tolist()
            prompt = [t for t in tokens[:width] if t != run.pad_id]  # the request, left-padded
            response = tokens[width:][:len(episode.completion.token_ids)]
            if episode.completion.metadata["segment"] == 0:
                (p1, s1), (p2, s2) = calls[0], calls[1]
                assert p2[:len(p1) + len(s1)] == p1 + s1  # the second prompt continues the first, token for token
                assert prompt == p1 and prompt + response == p2 + s2  # what the trainer reads is what was sampled
                between = len(p2) - len(p1) - len(s1)  # the tool's answer or the user's message
                assert mask[:len(response)] == [True] * len(s1) + [False] * between + [True] * len(s2)
                assert not any(mask[len(response):])
            else:
                p3, s3 = calls[2]
                assert prompt == p3 and response == s3 and mask[:len(s3)] == [True] * len(s3)
        by_trajectory: dict[str, set[float]] = {}
        for e in group:
            by_trajectory.setdefault(e.completion.metadata["trajectory"], set()).add(e.advantage)
        assert all(len(advantages) == 1 for advantages in by_trajectory.values())  # one advantage per trajectory

        plain = run.openai.client()
        with pytest.raises(openai.BadRequestError) as too_long:  # the run's engines hold 4 + 12 + 8 tokens
            await plain.chat.completions.create(model="agent-test", messages=[{"role": "user", "content": "?" * 30}])
        assert too_long.value.code == "context_length_exceeded" and "24 tokens" in too_long.value.message

        run.episode_fn = agent_episode(recording_agent({}))
        rows = await run.step(3)
        assert len(rows) == 3 and all(math.isfinite(r["loss"]) for r in rows)
        assert run.ledger()["balanced"]
        html = render_episodes(run.episodes(50))
        assert "&#9664; agent:" in html or "&#9664; tool " in html  # turn by turn, with what answered each action
        assert run.status()["openai"]["requests"] >= 3 * 16 * 3 // 2
        shown = render_status(run_summary(run))  # the dashboard's headline, and %forge_status's line
        assert f"OpenAI endpoint <code>{run.openai.url}</code>" in shown and "model <code>agent-test</code>" in shown
        assert repr(status_report(run.status())).count(f"OpenAI endpoint: {run.openai.url} (model 'agent-test')") == 1
    finally:
        await run.shutdown()
    assert not run.openai.serving
