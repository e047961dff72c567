"""The OpenAI-compatible endpoint with the real ``openai`` client, in front of a real vLLM generator service.

One service of two replicas serves the module: the tiny model, taught (tests/agents/taught.py) to answer
"What is 1+2?" with a hermes tool call and, once the tool said 3, with "The sum is 3.", so greedy answers are
known. The run the endpoint serves is a plain namespace with the attributes it reads. The replica-killing
test comes last: it leaves the service respawning.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio

from forge_nb.actors.generator import Generator
from forge_nb.agents import OpenAIEndpoint
from tests.agents.taught import teach

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.heavy]

QUESTION = "What is 1+2?"
CALL = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}</tool_call>'
ANSWER = "The sum is 3."
TOOLS = [{"type": "function", "function": {"name": "add", "description": "a + b", "parameters": {
    "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}}}]
GREEDY = {"temperature": 0.0, "max_tokens": 80}


def fake_run(service: Any, model: str) -> SimpleNamespace:
    """What the endpoint and agent_episode read of a Run."""
    config = SimpleNamespace(max_req_tokens=64, max_res_tokens=160, group_size=2, advantage="grpo",
                             generator=SimpleNamespace(engine_args={}))
    return SimpleNamespace(name="tiny", model=model, config=config, policy=service, sampling_overrides={},
                           version=0, pad_id=0, ref_model=None, openai=None)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from forge_nb.system.runtime import lifecycle

    model = teach(tmp_path_factory.mktemp("endpoint") / "tiny",
                  [(QUESTION, CALL), (QUESTION + CALL + "<eos>" + "3", ANSWER)])
    lifecycle.ensure_started()
    service = await Generator.options(num_replicas=2).as_service(model=str(model), sampling_params={"n": 1})
    endpoint = await OpenAIEndpoint.start(fake_run(service, str(model)))
    try:
        yield SimpleNamespace(endpoint=endpoint, service=service, client=endpoint.client(), model=str(model))
    finally:
        await endpoint.stop()
        await service.shutdown()


def tool_result(message: Any, content: str) -> list[dict[str, Any]]:
    """The assistant message as a client sends it back, and the tool's answer to its call."""
    return [message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": content}]


@pytest.mark.timeout(300)  # includes the module's engine start-up
async def test_models_chat_and_completions_answer_in_openai_s_shapes(served: Any) -> None:
    client = served.client
    models = await client.models.list()
    assert [m.id for m in models.data] == ["tiny"] and models.data[0].weight_version == 0  # type: ignore[attr-defined]
    chat = await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": QUESTION}],
                                                **GREEDY)
    assert chat.choices[0].message.content == CALL  # no tools asked for: the text as it is
    assert chat.choices[0].finish_reason == "stop" and chat.system_fingerprint == "forge_nb-v0"
    assert chat.usage.prompt_tokens == len(QUESTION) and chat.usage.completion_tokens == len(CALL) + 1  # + <eos>
    short = await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": QUESTION}],
                                                 max_completion_tokens=5, temperature=0.0)
    assert short.choices[0].message.content == CALL[:5] and short.choices[0].finish_reason == "length"
    text = await client.completions.create(model="tiny", prompt=QUESTION, max_tokens=11, temperature=0.0)
    assert text.choices[0].text == CALL[:11] and text.object == "text_completion"
    stopped = await client.completions.create(model="tiny", prompt=QUESTION, max_tokens=40, temperature=0.0,
                                              stop=['"add"'])
    assert stopped.choices[0].text == '<tool_call>{"name": ' and stopped.choices[0].finish_reason == "stop"


@pytest.mark.timeout(120)
async def test_tool_calls_come_back_parsed_and_the_tool_s_answer_continues_the_conversation(served: Any) -> None:
    """Under a trajectory the second call continues from the tokens of the first; the endpoint's own /v1 renders
    the whole conversation with the template, and the tiny model's drops the assistant's tool calls."""
    log = served.endpoint.open_trajectory(budget=160)
    client = served.endpoint.client(log)
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    first = await client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, **GREEDY)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.type == "function" and call.function.name == "add" and call.id.startswith("call_")
    assert json.loads(call.function.arguments) == {"a": 1, "b": 2}
    second = await client.chat.completions.create(model="tiny", messages=messages + tool_result(choice.message, "3"),
                                                  tools=TOOLS, **GREEDY)
    assert second.choices[0].message.content == ANSWER and not second.choices[0].message.tool_calls
    served.endpoint.close_trajectory(log)
    untouched = await served.client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS,
                                                            tool_choice="none", **GREEDY)
    assert untouched.choices[0].message.content == CALL and untouched.choices[0].message.tool_calls is None


@pytest.mark.timeout(120)
async def test_a_stream_carries_the_same_answer_as_a_whole_response(served: Any) -> None:
    client = served.client
    messages = [{"role": "user", "content": QUESTION}]
    stream = await client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, stream=True,
                                                  stream_options={"include_usage": True}, **GREEDY)
    chunks = [chunk async for chunk in stream]
    deltas = [c.choices[0].delta for c in chunks if c.choices]
    assert deltas[0].role == "assistant"
    calls = [call for d in deltas for call in d.tool_calls or []]
    assert [c.function.name for c in calls] == ["add"] and json.loads(calls[0].function.arguments) == {"a": 1, "b": 2}
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(CALL) + 1
    text_stream = await client.completions.create(model="tiny", prompt=QUESTION, max_tokens=11, temperature=0.0,
                                                  stream=True)
    assert "".join([c.choices[0].text async for c in text_stream]) == CALL[:11]


@pytest.mark.timeout(120)
async def test_n_choices_with_their_logprobs(served: Any) -> None:
    client = served.client
    chat = await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "abc"}], n=3,
                                                max_tokens=6, temperature=1.0, logprobs=True, top_logprobs=2)
    assert [c.index for c in chat.choices] == [0, 1, 2]
    lengths = [len(c.logprobs.content) for c in chat.choices]
    assert sum(lengths) == chat.usage.completion_tokens and all(1 <= n <= 6 for n in lengths)
    for choice in chat.choices:
        tokens = choice.logprobs.content
        assert "".join(t.token for t in tokens).replace("<eos>", "") == choice.message.content
        assert all(t.logprob <= 0 and len(t.top_logprobs) == 2 for t in tokens)
        assert all(t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob >= t.logprob - 1e-6 or
                   t.token in {a.token for a in t.top_logprobs} for t in tokens)
    ids = await client.completions.create(model="tiny", prompt=[5, 6, 7], max_tokens=4, n=2, logprobs=1,
                                          temperature=1.0, extra_body={"return_token_ids": True})
    assert len(ids.choices) == 2 and ids.usage.prompt_tokens == 3
    for choice in ids.choices:
        assert len(choice.logprobs.token_logprobs) == len(choice.token_ids) == len(choice.logprobs.tokens)  # type: ignore


@pytest.mark.timeout(120)
async def test_bad_requests_get_openai_errors_and_the_policy_serves_on(served: Any) -> None:
    client, endpoint = served.client, served.endpoint
    with pytest.raises(openai.NotFoundError) as unknown:
        await client.chat.completions.create(model="gpt-4o", messages=[{"role": "user", "content": "a"}])
    assert unknown.value.code == "model_not_found" and "'tiny'" in unknown.value.message
    with pytest.raises(openai.BadRequestError) as too_long:
        await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a"}], max_tokens=5000)
    assert too_long.value.code == "context_length_exceeded" and "1024" in too_long.value.message
    with pytest.raises(openai.BadRequestError) as bad_n:
        await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "a"}], n=0)
    assert bad_n.value.param == "n"
    with pytest.raises(openai.BadRequestError) as bad_role:
        await client.chat.completions.create(model="tiny", messages=[{"role": "robot", "content": "a"}])
    assert "robot" in bad_role.value.message
    headers = {"Authorization": f"Bearer {endpoint.token}", "Content-Type": "application/json"}
    async with httpx.AsyncClient() as http:
        raw = await http.post(f"{endpoint.url}/chat/completions", content=b"{not json", headers=headers)
    assert raw.status_code == 400 and raw.json()["error"]["code"] == "invalid_json"
    assert set(raw.json()["error"]) == {"message", "type", "param", "code"}
    fine = await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": QUESTION}],
                                                **GREEDY)
    assert fine.choices[0].message.content == CALL
    assert [r.state for r in served.service.status()] == ["healthy", "healthy"]


@pytest.mark.timeout(60)
async def test_a_request_without_the_token_is_refused(served: Any) -> None:
    endpoint = served.endpoint
    async with httpx.AsyncClient() as http:
        bare = await http.get(f"{endpoint.url}/models")
        wrong = await http.post(f"{endpoint.url}/chat/completions", headers={"Authorization": "Bearer nope"},
                                json={"model": "tiny", "messages": [{"role": "user", "content": "a"}]})
    assert bare.status_code == wrong.status_code == 401
    assert bare.json()["error"]["code"] == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        await openai.AsyncOpenAI(base_url=endpoint.url, api_key="nope", max_retries=0).models.list()
    assert endpoint.host == "127.0.0.1"


@pytest.mark.timeout(120)
async def test_a_trajectory_s_calls_are_recorded_as_the_exact_tokens(served: Any) -> None:
    endpoint = served.endpoint
    log = endpoint.open_trajectory(budget=160)
    client = endpoint.client(log)
    extra = {"extra_body": {"return_token_ids": True}}
    messages: list[Any] = [{"role": "user", "content": QUESTION}]
    first = await client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, **GREEDY, **extra)
    messages += tool_result(first.choices[0].message, "3")
    second = await client.chat.completions.create(model="tiny", messages=messages, tools=TOOLS, **GREEDY, **extra)
    sampled = [first.choices[0].token_ids, second.choices[0].token_ids]  # type: ignore[attr-defined]
    prompts = [first.prompt_token_ids, second.prompt_token_ids]  # type: ignore[attr-defined]
    # the second prompt is the first one, the first answer's sampled ids, then the tool's message
    tokenizer = endpoint.tokenizer
    assert prompts[1] == prompts[0] + sampled[0] + tokenizer("3", add_special_tokens=False)["input_ids"]
    rewritten = [{"role": "user", "content": "Summary: add gave 3. " + QUESTION}]
    await client.chat.completions.create(model="tiny", messages=rewritten, max_tokens=4)
    endpoint.close_trajectory(log)
    first_segment, second_segment = log.close()
    assert first_segment.prompt_ids == prompts[0]
    assert [t.action_ids for t in first_segment.turns] == sampled
    assert first_segment.turns[0].info == {"tool": "add", "tool_ok": True}
    assert second_segment.prompt_ids == tokenizer("Summary: add gave 3. " + QUESTION,
                                                  add_special_tokens=False)["input_ids"]
    with pytest.raises(openai.NotFoundError) as closed:
        await client.chat.completions.create(model="tiny", messages=messages, max_tokens=2)
    assert closed.value.code == "trajectory_not_found"


@pytest.mark.timeout(120)
async def test_a_later_segment_s_prompt_may_be_longer_than_the_trained_prompt(served: Any) -> None:
    """A summarising agent's later prompt beyond the trained prompt width: refused with the fix by default; with
    ``later_request_len`` its tail is laid at the start of the response as context, so the trainer reads exactly
    the tokens the engine saw and sampled."""
    endpoint, width = served.endpoint, len(QUESTION)
    summary = "Summary: add gave 3. " + QUESTION
    summary_ids = endpoint.tokenizer(summary, add_special_tokens=False)["input_ids"]
    asked = {"model": "tiny", "max_tokens": 3, "temperature": 0.0, "extra_body": {"return_token_ids": True}}
    strict = endpoint.open_trajectory(budget=160, request_len=width)
    await endpoint.client(strict).chat.completions.create(messages=[{"role": "user", "content": QUESTION}], **asked)
    with pytest.raises(openai.BadRequestError) as refused:
        await endpoint.client(strict).chat.completions.create(messages=[{"role": "user", "content": summary}], **asked)
    assert "agent_episode(later_prompt_tokens=...)" in refused.value.message
    endpoint.close_trajectory(strict)

    log = endpoint.open_trajectory(budget=160, request_len=width, later_request_len=64)
    client = endpoint.client(log)
    await client.chat.completions.create(messages=[{"role": "user", "content": QUESTION}], **asked)
    later = await client.chat.completions.create(messages=[{"role": "user", "content": summary}], **asked)
    endpoint.close_trajectory(log)
    assert later.prompt_token_ids == summary_ids  # type: ignore[attr-defined]  # the engine saw it whole
    sampled = later.choices[0].token_ids  # type: ignore[attr-defined]
    _, second = log.episodes(pad_id=0, request_len=width)
    lead = len(summary_ids) - width
    assert second.request_ids().tolist() == summary_ids[:width]
    assert second.completion.token_ids.tolist() == summary_ids[width:] + sampled
    assert second.mask().tolist()[:lead + len(sampled)] == [False] * lead + [True] * len(sampled)


@pytest.mark.timeout(120)
async def test_a_session_bound_to_a_trajectory_records_calls_to_the_endpoint_s_own_url(served: Any) -> None:
    """A relay that keeps one client for many rollouts (verifiers') calls the endpoint's one URL with the rollout's
    ``X-Session-ID``: bound to a trajectory, those calls are its; other sessions' are not."""
    endpoint, client = served.endpoint, served.client
    asked = {"model": "tiny", "messages": [{"role": "user", "content": QUESTION}], "max_tokens": 3, "temperature": 0.0}
    log = endpoint.open_trajectory(budget=160)
    endpoint.bind_session("trace-1", log)
    await client.chat.completions.create(**asked, extra_headers={"X-Session-ID": "trace-1"})
    await client.chat.completions.create(**asked, extra_headers={"X-Session-ID": "trace-2"})  # nobody's
    endpoint.close_trajectory(log)
    (segment,) = log.close()
    assert len(segment.turns) == 1
    assert segment.prompt_ids == endpoint.tokenizer(QUESTION, add_special_tokens=False)["input_ids"]
    with pytest.raises(ValueError, match="no open trajectory"):
        endpoint.bind_session("trace-3", log)
    after = await client.chat.completions.create(**asked, extra_headers={"X-Session-ID": "trace-1"})
    assert after.choices[0].message.content  # the closed trajectory's session is forgotten: a plain call


@pytest.mark.timeout(120)
async def test_the_synchronous_client_answers_from_a_thread(served: Any) -> None:
    client = served.endpoint.sync_client()
    assert isinstance(client, openai.OpenAI) and client.model == "tiny"
    reply = await asyncio.to_thread(client.chat.completions.create, model="tiny",
                                    messages=[{"role": "user", "content": QUESTION}], **GREEDY)
    assert reply.choices[0].message.content == CALL


@pytest.mark.timeout(240)
async def test_a_replica_killed_mid_request_leaves_no_request_hanging(served: Any) -> None:
    """Each request in flight when a generator replica dies completes (retried on the other replica) or gets an
    error: none hangs."""
    client = served.client
    calls = [asyncio.ensure_future(client.chat.completions.create(  # 600 tokens each: in flight when it dies
        model="tiny", messages=[{"role": "user", "content": f"abc{i}"}], max_tokens=600, temperature=1.0,
        extra_body={"ignore_eos": True})) for i in range(8)]
    await asyncio.sleep(0.5)
    victim = next(r for r in served.service.replicas if r.in_flight)
    os.kill(victim.mesh.pids[0], signal.SIGKILL)
    async with asyncio.timeout(180):
        results = await asyncio.gather(*calls, return_exceptions=True)
    answered = [r for r in results if not isinstance(r, BaseException)]
    failed = [r for r in results if isinstance(r, BaseException)]
    assert all(isinstance(e, openai.APIStatusError) for e in failed), failed
    assert answered, failed  # the retries on the other replica went through
    after = await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": QUESTION}],
                                                 **GREEDY)
    assert after.choices[0].message.content == CALL
