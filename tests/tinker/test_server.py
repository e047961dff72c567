"""The Tinker API on a live LoRA run, driven by the real ``tinker`` SDK (0.38.0) against the real server, a real vLLM
generator and real trainers: each training client is a run on the served run's base; its calls train, sample, save
and load there; what the server cannot take is refused in the SDK's error shape, the run untouched."""

from __future__ import annotations

import asyncio
import json
import math
import os
import signal
from pathlib import Path

import httpx
import pytest
import pytest_asyncio
import tinker
from tinker import types

import forge_nb
from forge_nb.magics._display import status_report
from forge_nb.tinker import threads
from tests.kernel_client import Kernel

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(600), pytest.mark.asyncio(loop_scope="module")]

LORA = {"trainer.lora": {"rank": 8, "alpha": 16}, "generator.num_replicas": 1}


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(tmp_path_factory):
    root = tmp_path_factory.mktemp("runs")
    run = await forge_nb.spawn(forge_nb.quickstart(name="tk-served", run_dir=str(root / "tk-served")),
                               overrides=LORA, progress=False)
    server = await run.serve_tinker()
    # constructed off the kernel's loop, as a script or a thread would (its constructor waits for the server)
    service = await asyncio.to_thread(tinker.ServiceClient, base_url=server.url, api_key=server.token)
    try:
        yield run, server, service
    finally:
        await run.shutdown()


def datum(tokens: list[int], **inputs: list[float]) -> types.Datum:
    """A Datum predicting ``tokens[1:]`` from ``tokens[:-1]``, with ``inputs`` (one value per predicted token)."""
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]),
                       loss_fn_inputs={"target_tokens": tokens[1:], **inputs})


@pytest_asyncio.fixture(loop_scope="module", autouse=True)
async def one_test_at_a_time_on_the_base(served):
    """Each test's training clients leave the base after it (the generators hold four runs' adapters)."""
    yield
    server = served[0].tinker
    for model_id in list(server.models):
        await server.close_client(model_id)


def model_of(server, training: tinker.TrainingClient):
    return server.models[training.model_id]


async def client(service: tinker.ServiceClient, server, rank: int = 8) -> tinker.TrainingClient:
    return await service.create_lora_training_client(base_model=server.base_model, rank=rank)


async def test_each_training_call_lands_on_a_run_of_its_own(served):
    run, server, service = served
    training = await client(service, server)
    model = server.models[training.model_id]
    assert model.run.base is run.base and model.run.name in run.base.runs  # a LoRA run on the served run's base
    info = training.get_info()  # the SDK waits here: the server answers it from its own thread
    assert (info.model_data.model_name, info.lora_rank, info.is_lora) == (server.base_model, 8, True)
    tokenizer = training.get_tokenizer()  # the tiny model's, loaded offline from the path the server gives
    ids = tokenizer.encode("abcdab")
    n = len(ids) - 1
    forward = await training.forward([datum(ids, weights=[1.0] * n)], "cross_entropy")
    logprobs = forward.loss_fn_outputs[0]["logprobs"].tolist()
    assert len(logprobs) == n and all(lp < 0 for lp in logprobs)
    assert forward.metrics["loss:sum"] == pytest.approx(-sum(logprobs), rel=1e-5)
    rl = {"logprobs": [lp - 0.1 for lp in logprobs], "advantages": [1.0, -1.0, 0.5, 0.0, 2.0][:n]}
    for loss_fn in ("cross_entropy", "importance_sampling", "ppo", "cispo", "dro"):
        inputs = {"weights": [1.0] * n} if loss_fn == "cross_entropy" else rl
        out = await training.forward_backward([datum(ids, **inputs)], loss_fn)
        assert math.isfinite(out.metrics["loss:sum"]), loss_fn
    custom = await training.forward_backward_custom(  # the SDK's own path: the loss runs here, on forward's logprobs
        [datum(ids, weights=[1.0] * n)], lambda data, lps: (-sum(lp.sum() for lp in lps), {"mine:sum": 1.0}))
    assert custom.metrics["mine:sum"] == 1.0
    rows_before = len(run.metrics.rows)
    step = await training.optim_step(types.AdamParams(learning_rate=1e-3))
    assert step.metrics["grad_norm:mean"] > 0
    (row,) = model.run.metrics.rows
    assert row["source/tinker"] == 1.0 and row["datums"] == 6 and row["advantages/mean"] == pytest.approx(0.5)
    assert len(run.metrics.rows) == rows_before  # the served run's own record is untouched
    assert model.run.name in server.status()["clients"].values()
    assert f"training clients {model.run.name}" in repr(status_report(run.status()))  # what %forge_status says
    after = await training.forward([datum(ids, weights=[1.0] * n)], "cross_entropy")
    assert after.metrics["loss:sum"] != forward.metrics["loss:sum"]  # the step changed the adapter


async def test_calls_in_flight_at_once_run_in_the_order_they_were_made(served):
    run, server, service = served
    training = await client(service, server)
    ids = training.get_tokenizer().encode("fghfgh")
    batch = [datum(ids, weights=[1.0] * (len(ids) - 1))]
    # submitted together, as the SDK pipelines them; awaited only afterwards
    adam = types.AdamParams(learning_rate=5e-2)
    calls = [training.forward(batch, "cross_entropy"), training.forward_backward(batch, "cross_entropy"),
             training.optim_step(adam), training.forward(batch, "cross_entropy"),
             training.forward_backward(batch, "cross_entropy"), training.optim_step(adam),
             training.forward(batch, "cross_entropy")]
    before, first, _, between, second, _, after = [await c for c in calls]
    loss = {name: out.metrics["loss:sum"] for name, out in
            {"before": before, "first": first, "between": between, "second": second, "after": after}.items()}
    # each call saw the steps submitted before it, and only those
    assert loss["first"] == pytest.approx(loss["before"], abs=1e-6)
    assert loss["second"] == pytest.approx(loss["between"], abs=1e-6)
    assert len({round(loss[k], 4) for k in ("before", "between", "after")}) == 3, loss
    assert [r["step"] for r in model_of(server, training).run.metrics.rows] == [1, 2]


async def test_the_sdk_and_the_trainer_agree_on_loss_and_gradient_norm(served):
    run, server, service = served
    training = await client(service, server)
    model = server.models[training.model_id]
    ids = training.get_tokenizer().encode("bcdefg")
    n = len(ids) - 1
    inputs = {"logprobs": [-2.0] * n, "advantages": [1.0, -0.5, 0.25, 1.5, -1.0][:n]}
    adam = types.AdamParams(learning_rate=5e-3, grad_clip_norm=0.0)
    start = await training.save_state("start")
    through_sdk = await training.forward_backward([datum(ids, **inputs)], "ppo")
    sdk_step = await training.optim_step(adam)
    await training.load_state_with_optimizer(start.path)  # the same weights and optimizer again
    plain = [{"tokens": ids[:-1], "inputs": {"target_tokens": ids[1:], **inputs}}]
    direct = await model.run.trainer.forward_backward.route(plain, "ppo", None)
    direct_step = await model.run.trainer.optim_step.route(**adam.model_dump())
    assert through_sdk.metrics["loss:sum"] == pytest.approx(direct["metrics"]["loss:sum"], abs=1e-6)
    assert sdk_step.metrics["grad_norm:mean"] == pytest.approx(direct_step["grad_norm:mean"], abs=1e-6)


async def test_sampling_serves_the_saved_adapter_and_its_logprobs_match_the_trainer(served):
    run, server, service = served
    training = await client(service, server)
    tokenizer = training.get_tokenizer()
    prompt = tokenizer.encode("ab")
    greedy = types.SamplingParams(max_tokens=4, temperature=0.0, stop=[])
    before = await (await training.save_weights_and_get_sampling_client()).sample(
        types.ModelInput.from_ints(prompt), 1, greedy)  # an untrained adapter (its B is zero): the base model
    base = await service.create_sampling_client(base_model=server.base_model)
    assert (await base.sample(types.ModelInput.from_ints(prompt), 1, greedy)).sequences[0].tokens == \
        before.sequences[0].tokens
    letter = next(t for t in tokenizer.encode("defgh") if t not in before.sequences[0].tokens)
    target = [letter] * 4  # an answer the base model does not give
    sft = [datum(prompt + target, weights=[0.0] * (len(prompt) - 1) + [1.0] * len(target))]
    for _ in range(30):
        await training.forward_backward(sft, "cross_entropy")
        await training.optim_step(types.AdamParams(learning_rate=2e-2))
    sampler = await training.save_weights_and_get_sampling_client()
    after = await sampler.sample(types.ModelInput.from_ints(prompt), 1, greedy)
    assert after.sequences[0].tokens == target  # the new adapter answers
    assert (await base.sample(types.ModelInput.from_ints(prompt), 1, greedy)).sequences[0].tokens == \
        before.sequences[0].tokens  # the base model stays as it was
    shown = [e for e in model_of(server, training).run.episodes() if e.get("source") == "tinker"]
    assert shown[-1]["prompt"] == "ab" and shown[-1]["response"] == tokenizer.decode(target)  # in the explorer
    several = await sampler.sample(types.ModelInput.from_ints(prompt), 4,
                                   types.SamplingParams(max_tokens=4, temperature=1.0, seed=7, stop=[]))
    assert len(several.sequences) == 4
    seq = several.sequences[0]
    scored = await training.forward([datum(prompt + seq.tokens, weights=[1.0] * (len(prompt) + 3))],
                                    "cross_entropy")
    trainer_lps = scored.loss_fn_outputs[0]["logprobs"].tolist()[-len(seq.tokens):]
    assert trainer_lps == pytest.approx(seq.logprobs, abs=1e-3)
    prompt_lps = await sampler.compute_logprobs(types.ModelInput.from_ints(prompt + seq.tokens))
    assert prompt_lps[0] is None and prompt_lps[-len(seq.tokens):] == pytest.approx(seq.logprobs, abs=1e-3)
    await training.save_weights_and_get_sampling_client()  # a newer version replaces the one `sampler` holds
    with pytest.raises(tinker.RequestFailedError, match="newest weights only"):
        await sampler.sample(types.ModelInput.from_ints(prompt), 1, greedy)


async def test_samples_in_flight_when_a_generator_dies_each_complete_or_fail(served):
    run, server, service = served
    training = await client(service, server)
    sampler = await training.save_weights_and_get_sampling_client()
    prompt = types.ModelInput.from_ints(training.get_tokenizer().encode("abc"))
    params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=3, stop=[])
    (replica,) = run.policy.replicas
    killed = replica.mesh.pids[0]
    calls = [asyncio.ensure_future(sampler.sample(prompt, 4, params)) for _ in range(12)]
    await asyncio.sleep(0.2)
    os.kill(killed, signal.SIGKILL)
    done = await asyncio.wait_for(asyncio.gather(*calls, return_exceptions=True), 300)  # none hangs
    for outcome in done:
        assert isinstance(outcome, types.SampleResponse | tinker.RequestFailedError), outcome
    after = await asyncio.wait_for(sampler.sample(prompt, 2, params), 300)  # served by the respawned replica
    assert len(after.sequences) == 2 and replica.mesh.pids[0] != killed
    assert model_of(server, training).run.version in (await run.policy.adapters.fanout())[0].values()


async def test_what_the_server_cannot_take_is_refused_and_the_run_goes_on(served):
    run, server, service = served
    with pytest.raises(tinker.RequestFailedError, match="trains adapters on"):
        await service.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=8)
    training = await client(service, server)
    ids = training.get_tokenizer().encode("abcd")
    with pytest.raises(tinker.RequestFailedError, match="this server serves"):
        await training.forward_backward([datum(ids, weights=[1.0] * 3)], "dpo")
    with pytest.raises(tinker.RequestFailedError, match="has 2 values for 3 input tokens"):
        await training.forward_backward([datum(ids, weights=[1.0] * 2)], "cross_entropy")
    image = types.Datum(model_input=types.ModelInput(chunks=[types.ImageChunk(data=b"\x89PNG", format="png"),
                                                            types.EncodedTextChunk(tokens=ids[:-1])]),
                        loss_fn_inputs={"target_tokens": ids, "weights": [1.0] * 4})
    with pytest.raises(tinker.RequestFailedError, match="encoded text chunks only"):
        await training.forward_backward([image], "cross_entropy")
    with pytest.raises(tinker.BadRequestError, match="no sampler weights of that path"):  # a route without a future
        await training.create_sampling_client("tinker://nobody:train:0/sampler_weights/nope")
    with pytest.raises(tinker.RequestFailedError, match="no such saved state"):
        await training.load_state("tinker://nobody:train:0/weights/nope")
    async with httpx.AsyncClient() as http:
        no_key = await http.post(f"{server.url}/api/v1/create_session", json={})
        unknown = await http.post(f"{server.url}/api/v1/nothing", headers={"X-API-Key": server.token})
        garbled = await http.post(f"{server.url}/api/v1/forward_backward", content=b"\xff\x00garbage",
                                  headers={"X-API-Key": server.token})
    assert no_key.status_code == 401 and no_key.json()["category"] == "user"
    assert unknown.status_code == 404 and "error" in unknown.json()
    assert garbled.status_code == 400 and "ForwardBackwardRequest" in garbled.json()["error"]
    out = await training.forward_backward([datum(ids, weights=[1.0] * 3)], "cross_entropy")  # still training
    assert math.isfinite(out.metrics["loss:sum"])


async def test_pausing_a_clients_run_holds_its_calls_until_it_resumes(served):
    run, server, service = served
    training = await client(service, server)
    model = server.models[training.model_id]
    ids = training.get_tokenizer().encode("abc")
    model.run.pause()
    call = asyncio.ensure_future(training.forward_backward([datum(ids, weights=[1.0] * 2)], "cross_entropy"))
    await asyncio.sleep(2.0)
    assert not call.done() and server.status()["in_flight"] == {"forward_backward": 1}
    model.run.resume()
    assert math.isfinite((await asyncio.wait_for(call, 60)).metrics["loss:sum"])


async def test_a_cell_blocked_on_a_call_gets_an_error_that_says_why_not_a_hang(served, monkeypatch):
    run, server, service = served
    training = await client(service, server)
    ids = training.get_tokenizer().encode("abc")
    monkeypatch.setattr(threads, "BLOCKED_S", 1.0)
    # .result() on the kernel's own thread: the loop the work needs is the one this call blocks
    with pytest.raises(tinker.RequestFailedError, match="await the SDK's calls"):
        training.forward_backward([datum(ids, weights=[1.0] * 2)], "cross_entropy").result(timeout=120)


async def test_a_saved_state_resumes_its_optimizer_in_a_fresh_kernel(served, tmp_path):
    run, server, service = served
    training = await client(service, server)
    ids = training.get_tokenizer().encode("cdecde")
    batch = [datum(ids, weights=[1.0] * (len(ids) - 1))]
    adam = types.AdamParams(learning_rate=1e-2)
    await training.forward_backward(batch, "cross_entropy")
    await training.optim_step(adam)  # the optimizer holds moments now
    saved = await training.save_state("mid")
    await training.forward_backward(batch, "cross_entropy")
    await training.optim_step(adam)
    expected = (await training.forward(batch, "cross_entropy")).metrics["loss:sum"]
    with pytest.raises(tinker.RequestFailedError, match="still open"):  # its adapter is that open client's
        await service.create_training_client_from_state_with_optimizer(saved.path)
    await server.close_client(training.model_id)
    # another kernel, another served run in the same runs' folder: the state's path is all it is given
    root = Path(run.dir.path).parent
    kernel = Kernel(cwd=str(tmp_path))
    try:
        code = f"""
import asyncio, forge_nb, tinker
from tinker import types
run = await forge_nb.spawn(forge_nb.quickstart(name="tk-fresh", run_dir={str(root / "tk-fresh")!r}),
                           overrides={LORA!r}, progress=False)
server = await run.serve_tinker()
service = await asyncio.to_thread(tinker.ServiceClient, base_url=server.url, api_key=server.token)
batch = [types.Datum(model_input=types.ModelInput.from_ints({ids[:-1]!r}),
                     loss_fn_inputs={{"target_tokens": {ids[1:]!r}, "weights": {[1.0] * (len(ids) - 1)!r}}})]
losses = []
for make in (service.create_training_client_from_state_with_optimizer, service.create_training_client_from_state):
    resumed = await make({saved.path!r})
    await resumed.forward_backward(batch, "cross_entropy")
    await resumed.optim_step(types.AdamParams(learning_rate=1e-2))
    losses.append((await resumed.forward(batch, "cross_entropy")).metrics["loss:sum"])
    await server.close_client(resumed.model_id)
await run.shutdown()
print("LOSSES", losses)
"""
        reply = await asyncio.to_thread(kernel.run, code, 300)
        assert reply.status == "ok", reply.traceback or reply.streams
        with_moments, without = json.loads(reply.stdout.split("LOSSES", 1)[1].strip())
    finally:
        await asyncio.to_thread(kernel.shutdown_runs_and_close)
    assert with_moments == pytest.approx(expected, abs=1e-5)
    assert abs(without - expected) > 1e-4  # load_state without the optimizer: a fresh optimizer steps differently
