"""agent_episode on a real run (vLLM generator, trainer, torchstore), one run for the module: an agent written
against the OpenAI client trains, and what the trainer gets is exactly what the engine saw and sampled; an agent
that fails before its first call pauses the run with its own exception; a plain ``def`` agent with the
synchronous client trains without blocking the endpoint.

The first agent asks for ``return_token_ids`` (vLLM's extension) so that it can keep what the engine reported:
each call's prompt ids and sampled ids. The trainer's batch (``collate`` of the group the episode function built,
as the training loop makes it) must hold those ids as they are, with the loss mask on the sampled ones only.
"""

from __future__ import annotations

import math
import re
import threading
from typing import Any

import openai
import pytest
import pytest_asyncio

import forge_nb
from forge_nb.agents import agent_episode
from forge_nb.magics._display import status_report
from forge_nb.recipes.agents import KEY_TOOLS, agent_keys
from forge_nb.rl import collate
from forge_nb.widgets.controls import render_status, run_summary
from forge_nb.widgets.explorer import render_episodes

pytestmark = [pytest.mark.heavy, pytest.mark.asyncio(loop_scope="module")]

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


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def run(tmp_path_factory: pytest.TempPathFactory) -> Any:
    run = await forge_nb.spawn(agent_keys(name="agent-test", run_dir=str(tmp_path_factory.mktemp("agent") / "run"),
                                          group_size=4, batch_size=16), progress=False)
    try:
        await run.serve_openai(tool_parser="simple")
        yield run
    finally:
        await run.shutdown()
    assert not run.openai.serving


@pytest.mark.timeout(400)  # includes the module's spawn
async def test_the_trainer_gets_the_engine_s_own_tokens_and_trains(run: Any) -> None:
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
    rows_shown = run.episodes(50)
    segments: dict[str, set[int]] = {}
    for r in rows_shown:  # which episodes were one run of the agent, and in which order its segments came
        segments.setdefault(r["trajectory"], set()).add(r["segment"])
    assert {0, 1} in segments.values() and all(s <= {0, 1} for s in segments.values())
    html = render_episodes(rows_shown)
    assert "&#9664; agent:" in html or "&#9664; tool " in html  # turn by turn, with what answered each action
    assert f"trajectory {rows_shown[-1]['trajectory'][:8]}, segment {rows_shown[-1]['segment']}" in html
    assert run.status()["openai"]["requests"] >= 3 * 16 * 3 // 2
    shown = render_status(run_summary(run))  # the dashboard's headline, and %forge_status's line
    assert f"OpenAI endpoint <code>{run.openai.url}</code>" in shown and "model <code>agent-test</code>" in shown
    assert repr(status_report(run.status())).count(f"OpenAI endpoint: {run.openai.url} (model 'agent-test')") == 1


def _kernel_log_lines(run: Any) -> int:
    path = run.dir.logs / "kernel.log"
    return len(path.read_text().splitlines()) if path.exists() else 0


async def wrong_model(client: Any, sample: dict[str, str]) -> float:
    await client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": sample["request"]}])
    return 1.0


async def typo(client: Any, sample: dict[str, str]) -> float:
    question = sample["question"]  # the task's key is "request"
    await client.chat.completions.create(model=client.model, messages=[{"role": "user", "content": question}])
    return 1.0


@pytest.mark.timeout(200)
async def test_an_agent_failing_before_its_first_call_pauses_the_run_with_its_own_exception(run: Any) -> None:
    """No call, nothing to train: each such trajectory is still a quarantined episode, so the run pauses within a
    window of episodes with the agent's exception (and its line) in the cell that waited and in the event, names
    the cause in the window (not an earlier one) and the agent's fix, and the kernel log stays a few lines."""
    window = run._ctl.quarantine.window
    in_flight = run.config.loop.rollout_loops * run.config.group_size
    logged = _kernel_log_lines(run)
    for agent, error, says in ((wrong_model, openai.NotFoundError, "404 the model 'gpt-4o' does not exist here"),
                               (typo, KeyError, "KeyError: 'question' (test_agent_episode.py, line ")):
        await run.stop()  # the groups of the agent before are all in: the window holds this agent's episodes
        run.clear_buffer("the next agent's test")  # no step can be trained from what the agent before made
        before = run.ledger()["quarantined"]
        run.episode_fn = agent_episode(agent)
        with pytest.raises(RuntimeError) as paused:
            await run.step(1)
        message = str(paused.value)
        assert isinstance(paused.value.__cause__, error)  # the agent's own exception and traceback, under the pause
        first = re.search(r"so the run paused: \d+ x the agent raised (\w+)", message)
        assert first is not None and first.group(1) == error.__name__, message  # the cause now, named first
        assert says in message and "Fix the agent (run.episode_fn = agent_episode(" in message
        assert "reward_fns" not in message and run.state == "paused"
        assert message in [e["message"] for e in run.metrics.events if e["kind"] == "quarantine_pause"]
        assert run.ledger()["quarantined"] - before <= window + in_flight  # within a window's groups
    assert 'question = sample["question"]' in message  # the line of the user's code
    await run.stop()
    assert run.ledger()["balanced"]
    assert _kernel_log_lines(run) - logged <= 20  # the two pauses, not a line per trajectory


@pytest.mark.timeout(200)
async def test_a_synchronous_agent_with_the_synchronous_client_trains(run: Any) -> None:
    threads: set[str] = set()

    def agent(client: Any, sample: dict[str, str]) -> float:  # what most agent code looks like: no async
        assert isinstance(client, openai.OpenAI)
        reply = client.chat.completions.create(model=client.model, messages=[{"role": "user", "content": "?"}],
                                               tools=KEY_TOOLS, max_tokens=2, temperature=1.0)
        threads.add(threading.current_thread().name)
        return float(bool(reply.choices[0].message.tool_calls))

    run.episode_fn = agent_episode(agent)
    requests = run.openai.status()["requests"]
    rows = await run.step(2)  # a paused run (the test before) goes on with the new agent
    assert len(rows) == 2 and all(math.isfinite(r["loss"]) for r in rows)
    assert run.openai.status()["requests"] - requests >= 2 * 16  # every trajectory called the policy
    assert threads and all(name.startswith("forge_nb-agent") for name in threads)  # off the kernel's loop
    assert all(r["quarantine"] is None for r in run.episodes(16))
    assert run.ledger()["balanced"]
