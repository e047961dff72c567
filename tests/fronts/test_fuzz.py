"""Both fronts of a live LoRA run fuzzed with hypothesis: the Tinker server and the OpenAI endpoint each get a few
thousand hostile requests (``tests/fronts/hostile.py``) while the run trains on in the background, and slow clients
stall connections to both.

Each answer must be a 4xx in the front's own error shape (Tinker: ``{"error", "category"}``; OpenAI: ``{"error":
{"message", "type", ...}}``), never a 5xx, never later than ``ANSWER_S``. A 2xx is accepted where the strategy
could have drawn a valid request (``Hostile.may_pass``: a body of the route's own fields, few of them hostile; a
``forward_backward`` message, truncated ones too, as a cut at a field's end is a shorter valid message; ``GET
/v1/models``) and on the Tinker routes that read no body (heartbeats, telemetry, the client config: the server
answers them whatever comes). A Tinker request answered with a request id
has its future retrieved: a result, or the error shape with ``category`` "user", within ``FUTURE_S``. Afterwards
the run has trained on, its ledger balances, both fronts answer valid requests and their status counted the
refusals.

hypothesis runs derandomized with a fixed number of examples and no shrinking (each example is a round trip to a
live run): a failure prints the request that failed. The sync ``@given`` function runs in a thread, so the
module's event loop, on which the run and the OpenAI endpoint live, keeps turning while it sends.
"""

from __future__ import annotations

import asyncio
import time
from collections import Counter
from types import SimpleNamespace
from typing import Any

import httpx
import openai
import pytest
import pytest_asyncio
import tinker
from hypothesis import HealthCheck, Phase, given, settings
from openai.types import Completion
from openai.types.chat import ChatCompletion
from tinker import types

import forge_nb
from tests.fronts import hostile

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(420), pytest.mark.asyncio(loop_scope="module")]

LORA = {"trainer.lora": {"rank": 8, "alpha": 16}, "generator.num_replicas": 1}
TINKER_EXAMPLES = 2000
OPENAI_EXAMPLES = 1500
#: the longest any front may take to answer one request (a retrieval long-polls up to 20 s of it)
ANSWER_S = 45.0
#: the longest a Tinker call may take from its request id to its outcome
FUTURE_S = 90.0
#: the Tinker routes that read no body: the SDK's heartbeats, telemetry and config fetches, answered whatever comes
IGNORES_BODY = {"client/config", "client/dynamic_config", "session_heartbeat", "telemetry", "sessions/s-1/finish"}
FUZZ = settings(deadline=None, derandomize=True, database=None, phases=[Phase.explicit, Phase.generate],
                suppress_health_check=list(HealthCheck))


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def fronts(tmp_path_factory: pytest.TempPathFactory) -> Any:
    root = tmp_path_factory.mktemp("runs")
    run = await forge_nb.spawn(forge_nb.quickstart(name="fuzz", run_dir=str(root / "fuzz")), overrides=LORA,
                               progress=False)
    try:
        endpoint = await run.serve_openai()
        server = await run.serve_tinker()
        service = await asyncio.to_thread(tinker.ServiceClient, base_url=server.url, api_key=server.token)
        training = await service.create_lora_training_client(base_model=server.base_model, rank=8)
        sampler = await training.save_weights_and_get_sampling_client()
        (session_id,) = server.sessions
        log = endpoint.open_trajectory(budget=64)
        run.start()
        yield SimpleNamespace(run=run, endpoint=endpoint, server=server, training=training, sampler=sampler,
                              session_id=session_id, log=log, steps=run.current_step, tally={})
    finally:
        await run.shutdown()


def _tinker_answer(http: httpx.Client, req: hostile.Hostile) -> str:
    """Send ``req`` to the Tinker server, check its answer, follow its future; returns what came back."""
    r = http.request(req.method, req.path, headers=req.headers, content=req.body)
    assert r.status_code < 500, (r.status_code, r.text[-1500:])
    if r.status_code >= 400:
        body = r.json()
        assert isinstance(body["error"], str) and body["error"] and body["category"] == "user", body
        return str(r.status_code)
    route = req.path.removeprefix("/api/v1/")
    assert r.status_code == 200 and (req.may_pass or route in IGNORES_BODY), (r.status_code, r.text[:500])
    answer = r.json()
    if "request_id" not in answer:
        return "200"
    deadline = time.monotonic() + FUTURE_S
    while time.monotonic() < deadline:
        done = http.post("/api/v1/retrieve_future", json={"request_id": answer["request_id"]},
                         headers={"X-API-Key": req.headers["X-API-Key"]})
        assert done.status_code == 200, (done.status_code, done.text[:500])
        if done.headers["content-type"].startswith("application/x-protobuf"):
            return "200, future: a result"
        outcome = done.json()
        if outcome.get("type") == "try_again":
            continue
        if "error" in outcome:
            assert outcome["category"] == "user" and isinstance(outcome["error"], str), outcome
            return "200, future: refused"
        return "200, future: a result"
    raise AssertionError(f"{req!r}: its future was not done within {FUTURE_S} s")


def _openai_answer(http: httpx.Client, req: hostile.Hostile) -> str:
    r = http.request(req.method, req.path, headers=req.headers, content=req.body)
    assert r.status_code < 500, (r.status_code, r.text[-1500:])
    if r.status_code >= 400:
        error = r.json()["error"]
        assert isinstance(error["message"], str) and error["message"] and isinstance(error["type"], str), error
        return str(r.status_code)
    assert r.status_code == 200 and req.may_pass, (r.status_code, r.text[:500])
    if r.headers["content-type"].startswith("text/event-stream"):
        assert r.text.endswith("data: [DONE]\n\n"), r.text[-200:]
    elif req.path.endswith("/chat/completions"):
        ChatCompletion.model_validate(r.json())
    elif req.path.endswith("/completions"):
        Completion.model_validate(r.json())
    else:
        assert r.json()["object"] == "list"
    return "200"


async def _fuzz(name: str, strategy: Any, examples: int, answer: Any, http: httpx.Client) -> Counter[str]:
    """Draw ``examples`` requests of ``strategy`` and check each one's ``answer`` (in a thread); returns the tally
    of (kind, outcome)."""
    tally: Counter[str] = Counter()

    @settings(FUZZ, max_examples=examples)
    @given(strategy)
    def fuzz(req: hostile.Hostile) -> None:
        tally[f"{req.kind} -> {answer(http, req)}"] += 1

    started = time.monotonic()
    await asyncio.to_thread(fuzz)
    print(f"\n{name}: {sum(tally.values())} requests in {time.monotonic() - started:.0f} s")
    for key, n in sorted(tally.items()):
        print(f"  {n:5d}  {key}")
    return tally


async def test_the_tinker_server_answers_every_hostile_request_in_its_error_shape(fronts: Any) -> None:
    server = fronts.server
    before = server.status()
    strategy = hostile.tinker_requests(server.token, fronts.training.model_id, fronts.session_id, server.base_model)
    with httpx.Client(base_url=server.url, timeout=ANSWER_S) as http:
        tally = await _fuzz("Tinker", strategy, TINKER_EXAMPLES, _tinker_answer, http)
    refused = sum(n for key, n in tally.items() if key.split(" -> ")[-1].startswith("4"))
    after = server.status()
    assert after["refused"] - before["refused"] == refused, (before, after, refused)
    fronts.tally["tinker"] = tally


async def test_the_openai_endpoint_answers_every_hostile_request_in_its_error_shape(fronts: Any) -> None:
    endpoint = fronts.endpoint
    before = endpoint.status()
    strategy = hostile.openai_requests(endpoint.token, endpoint.model, fronts.log.id)
    with httpx.Client(base_url=endpoint.url.removesuffix("/v1"), timeout=ANSWER_S) as http:
        tally = await _fuzz("OpenAI", strategy, OPENAI_EXAMPLES, _openai_answer, http)
    refused = sum(n for key, n in tally.items() if key.split(" -> ")[-1].startswith("4"))
    after = endpoint.status()
    assert after["errors"] - before["errors"] == refused, (before, after, refused)
    fronts.tally["openai"] = tally


async def _stall(port: int, head: bytes) -> asyncio.StreamWriter:
    """A client that sends ``head`` (headers, maybe part of a body) and then nothing."""
    _, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(head)
    await writer.drain()
    return writer


def _heads(path: str, auth: str) -> list[bytes]:
    start = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n{auth}\r\nContent-Type: application/json\r\n"
    return [start.encode(),  # headers, unfinished
            (start + "Content-Length: 100000\r\n\r\n").encode() + b'{"model": "',  # a body, unfinished
            (start + "Transfer-Encoding: chunked\r\n\r\n").encode() + b"10\r\n{\"mod"]  # a chunk, unfinished


async def test_stalled_clients_hold_up_neither_front_nor_the_run(fronts: Any) -> None:
    run, endpoint, server = fronts.run, fronts.endpoint, fronts.server
    stalled = []
    for port, path, auth in [(endpoint.port, "/v1/chat/completions", f"Authorization: Bearer {endpoint.token}"),
                             (server.port, "/api/v1/forward_backward", f"X-API-Key: {server.token}"),
                             (server.port, "/api/v1/create_model", f"X-API-Key: {server.token}")]:
        for head in _heads(path, auth) * 10:
            stalled.append(await _stall(port, head))
    steps = run.current_step
    async with httpx.AsyncClient(timeout=ANSWER_S) as http:
        models = await http.get(f"{endpoint.url}/models", headers={"Authorization": f"Bearer {endpoint.token}"})
        capabilities = await http.get(f"{server.url}/api/v1/get_server_capabilities",
                                      headers={"X-API-Key": server.token})
    assert models.status_code == 200 and capabilities.status_code == 200
    chat = await endpoint.client().chat.completions.create(model=endpoint.model, max_tokens=3,
                                                           messages=[{"role": "user", "content": "ab"}])
    assert isinstance(chat.choices[0].message.content, str)
    ids = [1, 2, 3, 4]
    out = await fronts.training.forward([_datum(ids)], "cross_entropy")
    assert len(out.loss_fn_outputs[0]["logprobs"].tolist()) == 3
    deadline = time.monotonic() + 60
    while run.current_step < steps + 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert run.current_step >= steps + 2, "the run did not train while clients stalled"
    # a body cut short by the client's end of stream: a 4xx in the error shape, or the connection closed
    for port, path, auth in [(endpoint.port, "/v1/completions", f"Authorization: Bearer {endpoint.token}"),
                             (server.port, "/api/v1/forward_backward", f"X-API-Key: {server.token}")]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(_heads(path, auth)[1])
        writer.write_eof()
        head = await asyncio.wait_for(reader.read(200), ANSWER_S)
        assert head == b"" or head.startswith(b"HTTP/1.1 4"), head
        writer.close()
    for writer in stalled:
        writer.close()


async def test_what_the_fuzz_found_is_refused_in_each_front_s_shape(fronts: Any) -> None:
    """The cases the fuzz found, each once a 5xx or a failure of the run's ("server") rather than a refusal."""
    endpoint, server = fronts.endpoint, fronts.server
    bearer, key = {"Authorization": f"Bearer {endpoint.token}"}, {"X-API-Key": server.token}
    async with httpx.AsyncClient(timeout=ANSWER_S) as http:
        # the generator's ValueError about a sampling value reaches the kernel inside monarch's ActorError: was a 500
        for wrong in [{"stop": ""}, {"min_tokens": 9}]:
            r = await http.post(f"{endpoint.url}/completions", headers=bearer,
                                json={"model": endpoint.model, "prompt": "ab", "max_tokens": 2, **wrong})
            assert r.status_code == 400 and r.json()["error"]["code"] == "invalid_value", r.text
        r = await http.post(f"{endpoint.url}/completions", headers=bearer,  # ids vLLM refuses: refused before it
                            json={"model": endpoint.model, "prompt": [1, -3], "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", r.text
        # a body that is JSON but no object: was aiohttp's plain-text 500
        r = await http.post(f"{server.url}/api/v1/unload_model", headers=key, content=b"[1, null]")
        assert r.status_code == 400 and r.json()["category"] == "user", r.text
        refused = server.status()["refused"]  # a handler's own 404 was not counted
        r = await http.post(f"{server.url}/api/v1/retrieve_future", headers=key, json={"request_id": "nothing"})
        assert r.status_code == 404 and server.status()["refused"] == refused + 1
    prompt = types.ModelInput.from_ints([1, 2])
    for params, message in [(types.SamplingParams(max_tokens=2, stop=""), "stop cannot contain an empty string"),
                            (types.SamplingParams(max_tokens=2, stop=[""]), "stop cannot contain an empty string")]:
        with pytest.raises(tinker.RequestFailedError, match=message) as refusal:  # was category "server"
            await fronts.sampler.sample(prompt, 1, params)
        assert refusal.value.category == types.RequestErrorCategory.User
    (replica,) = fronts.run.policy.replicas
    pid, prompt = replica.mesh.pids[0], types.ModelInput.from_ints([1, 6, 3])
    for _ in range(3):  # prompt logprobs beside the run's rollouts failed vLLM's step, and killed the generator
        await asyncio.gather(*[fronts.sampler.compute_logprobs(prompt) for _ in range(3)])
    with pytest.raises(tinker.RequestFailedError, match="prompt_logprobs with n=2") as refusal:  # so did these
        await fronts.sampler.sample(prompt, 2, types.SamplingParams(max_tokens=2), include_prompt_logprobs=True)
    assert refusal.value.category == types.RequestErrorCategory.User
    assert replica.mesh.pids[0] == pid and fronts.run.error is None
    for tokens, message in [([1, 10], "token id 10 is outside"), ([1] * 16, "the generators' context is 16")]:
        with pytest.raises(tinker.BadRequestError, match=message):  # vLLM's refusals came back as "server"
            await fronts.sampler.sample(types.ModelInput.from_ints(tokens), 1, types.SamplingParams(max_tokens=2))
    long = [1] * 100_000  # attention grows as n²: 10k tokens held the trainer (the served run's too) 4.4 s here
    for tokens, message in [([1, 10, 2], "token id 10 is outside"), (long, "99999 tokens; the model takes 256")]:
        with pytest.raises(tinker.RequestFailedError, match=message) as refusal:  # the first: the trainer's IndexError
            await fronts.training.forward([_datum(tokens)], "cross_entropy")
        assert refusal.value.category == types.RequestErrorCategory.User


def _datum(tokens: list[int]) -> types.Datum:
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], "weights": [1.0] * (len(tokens) - 1)})


async def test_after_the_fuzz_the_run_trained_on_and_both_fronts_still_serve(fronts: Any) -> None:
    run, endpoint, server = fronts.run, fronts.endpoint, fronts.server
    assert run.current_step > fronts.steps and run.error is None and run.health == "ok"
    ledger = run.ledger()
    assert ledger["balanced"], ledger
    out = await fronts.training.forward_backward([_datum([1, 2, 3, 4])], "cross_entropy")
    assert out.metrics["loss:sum"] > 0
    step = await fronts.training.optim_step(types.AdamParams(learning_rate=1e-3))
    assert step.metrics["grad_norm:mean"] > 0
    sampler = await fronts.training.save_weights_and_get_sampling_client()
    sample = await sampler.sample(types.ModelInput.from_ints([1, 2]), 2, types.SamplingParams(max_tokens=3))
    assert len(sample.sequences) == 2
    chat = await endpoint.client().chat.completions.create(model=endpoint.model, max_tokens=3,
                                                           messages=[{"role": "user", "content": "abc"}])
    assert chat.choices[0].finish_reason in ("stop", "length")
    with pytest.raises(openai.BadRequestError):
        await endpoint.client().completions.create(model=endpoint.model, prompt=[], max_tokens=2)
    status = server.status()
    assert status["refused"] > 0 and status["clients"] == {fronts.training.model_id: server.models[
        fronts.training.model_id].run.name}
    await run.stop()
    assert run.ledger()["balanced"] and run.ledger()["in_step"] == 0, run.ledger()
    total = {front: sum(t.values()) for front, t in fronts.tally.items()}
    print(f"\nrequests: {total}; steps during the module: {run.current_step - fronts.steps}")
