"""Generator: a real vLLM CPU engine in a real monarch proc: completions, batching, weight updates, errors.

One engine serves the whole module (start-up ~50 s on two idle cores, minutes on busy ones); tests
that need a broken generator spawn a second, engine-less actor into the same process, where vLLM is
already imported.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest
import pytest_asyncio
import torch
from monarch.actor import ActorError

from forge_nb import weights
from forge_nb.actors.generator import Generator, Policy
from forge_nb.models import TinyModelConfig, build_tiny_model
from forge_nb.rl.types import Completion
from forge_nb.system.processes.procs import SOCKETS_ROOT
from forge_nb.system.runtime import lifecycle, spawning

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.heavy]

ALPHABET = TinyModelConfig().alphabet
SAMPLING = {"n": 4, "max_tokens": 12, "temperature": 1.0}
DOMINANT = "c"  # the token the modified weights make (almost) certain
DOMINANT_ID = ALPHABET.index(DOMINANT) + 2  # ids: <pad>=0, <eos>=1, then the alphabet


def ids(text: str) -> list[int]:
    return [ALPHABET.index(ch) + 2 for ch in text]


def descendants(pids: list[int]) -> list[psutil.Process]:
    found = []
    for pid in pids:
        try:
            found += psutil.Process(pid).children(recursive=True)
        except psutil.NoSuchProcess:
            pass
    return found


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def gen(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """One Generator with a running engine, torchstore started; everything stopped afterwards."""
    model = build_tiny_model(tmp_path_factory.mktemp("generator") / "tiny")
    lifecycle.ensure_started()
    await weights.initialize_store()
    mesh = await spawning.spawn_mesh("gen", 1)
    killed = SOCKETS_ROOT / "999999999"  # the socket folder of a generator process that was killed
    (killed / "sockets").mkdir(parents=True, exist_ok=True)
    try:
        actor = mesh.spawn("gen", Generator, engine_args={"model": str(model)}, sampling_params=SAMPLING)
        await actor.setup.call_one()
        yield SimpleNamespace(actor=actor, mesh=mesh, model=model, killed_sockets=killed)
    finally:
        engine_procs = descendants(mesh.pids)  # vLLM's EngineCore and worker, and whatever they started
        await mesh.stop()
        await weights.shutdown_store()
        gone, alive = psutil.wait_procs(engine_procs, timeout=20)
        assert not alive, f"vLLM processes outlived the generator's mesh: {alive}"
        assert not [pid for pid in mesh.pids if running(pid)], "the generator's process outlived its mesh"
        assert not (SOCKETS_ROOT / str(mesh.pids[0])).exists(), "a stopped generator left its vLLM sockets"


def running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def check_completion(c: Any, prompt: str, max_tokens: int) -> None:
    assert type(c) is Completion  # the generator's wire subclass arrives as a plain Completion
    assert c.prompt == prompt
    assert c.prompt_ids.tolist() == ids(prompt)
    n = len(c.token_ids)
    assert 1 <= n <= max_tokens
    assert c.logprobs is not None and c.logprobs.shape == (n,)
    assert torch.isfinite(c.logprobs).all() and (c.logprobs <= 0).all()
    assert c.stop_reason in ("stop", "length")
    assert (n == max_tokens) if c.stop_reason == "length" else (c.token_ids[-1].item() == 1)  # <eos>
    assert c.text == "".join(ALPHABET[t - 2] for t in c.token_ids.tolist() if t >= 2)


@pytest.mark.timeout(300)  # includes the module's engine start-up
async def test_generate_returns_n_completions_with_logprobs_and_version(gen: Any) -> None:
    completions = await gen.actor.generate.call_one("abcab")
    assert len(completions) == SAMPLING["n"]
    for c in completions:
        check_completion(c, "abcab", SAMPLING["max_tokens"])
        assert c.generator_version == 0
    assert await gen.actor.get_version.call_one() == 0
    assert Policy is Generator


@pytest.mark.timeout(60)
async def test_the_generators_logprobs_are_those_of_the_trainers_model(gen: Any) -> None:
    """The logprob of each sampled token is what transformers' forward of the same checkpoint gives (the
    trainer's model; float32 both): the policy ratio of an episode's first update starts at 1. Before the
    weights change (the tests below load others)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(gen.model, dtype=torch.float32).eval()
    worst = 0.0
    for prompt in ("abcab", "h", "gfedcbahg"):
        for c in await gen.actor.generate.call_one(prompt, max_tokens=12):
            tokens = torch.cat([c.prompt_ids, c.token_ids]).long()
            with torch.no_grad():
                logprobs = torch.log_softmax(hf(tokens[None]).logits[0].float(), -1)
            theirs = logprobs[len(c.prompt_ids) - 1 : -1].gather(-1, c.token_ids.long()[:, None])[:, 0]
            worst = max(worst, float((theirs - c.logprobs).abs().max()))
    assert worst < 1e-5, f"the generator's logprobs differ from the model's by up to {worst:.2e}"


@pytest.mark.timeout(60)
async def test_on_cpu_the_engine_runs_in_the_generator_process(gen: Any) -> None:
    """No EngineCore nor worker process below the actor (vLLM's own processes: test_generator_processes),
    and the socket folder a killed generator process left was removed when this one started."""
    from tests.procs import descendants

    vllm_procs = [cmd for cmd in descendants(gen.mesh.pids[0]).values() if "VLLM" in cmd or "vllm" in cmd]
    assert vllm_procs == [], vllm_procs
    assert not gen.killed_sockets.exists(), "the folder of a killed generator process was left behind"


@pytest.mark.timeout(60)
async def test_sampling_overrides_apply_per_call(gen: Any) -> None:
    greedy = [await gen.actor.generate.call_one("hgf", n=1, max_tokens=3, temperature=0.0) for _ in range(2)]
    for completions in greedy:
        assert len(completions) == 1
        check_completion(completions[0], "hgf", 3)
    assert greedy[0][0].token_ids.tolist() == greedy[1][0].token_ids.tolist()  # temperature 0 is greedy
    # Stop strings are matched in the text as it grows: vLLM detokenizes those requests itself
    # (elsewhere the Generator decodes each finished sample once, which check_completion's text checks).
    (stopped,) = await gen.actor.generate.call_one("hgf", n=1, max_tokens=6, stop=list(ALPHABET))
    assert stopped.text == "" and stopped.stop_reason == "stop"
    assert stopped.metadata["stop"] in (*ALPHABET, None)  # the letter that stopped it (None: <eos> came first)
    with pytest.raises(Exception, match=r"temprature.*did you mean 'temperature'.*Valid: .*max_tokens"):
        await gen.actor.generate.call_one("abc", temprature=0.5)
    with pytest.raises(Exception, match="n must be at least 1"):
        await gen.actor.generate.call_one("abc", n=0)


@pytest.mark.timeout(120)
async def test_concurrent_generates_batch_in_the_engine(gen: Any) -> None:
    prompts = ["".join(ALPHABET[(i + j) % len(ALPHABET)] for j in range(1 + i % 5)) for i in range(16)]
    # One sequence of 16 tokens per call: alone, each call takes 16 engine steps of its own.
    one_seq = {"n": 1, "max_tokens": 16, "ignore_eos": True}
    await gen.actor.generate.call_one(prompts[0], **one_seq)  # first use of these sampling settings
    before = await gen.actor.engine_steps.call_one()
    for p in prompts:
        await gen.actor.generate.call_one(p, **one_seq)
    one_by_one = await gen.actor.engine_steps.call_one() - before
    results = await asyncio.gather(*(gen.actor.generate.call_one(p, **one_seq) for p in prompts))
    together = await gen.actor.engine_steps.call_one() - before - one_by_one
    for prompt, completions in zip(prompts, results, strict=True):
        assert len(completions) == 1
        assert len(completions[0].token_ids) == 16
        assert completions[0].prompt == prompt and completions[0].prompt_ids.tolist() == ids(prompt)
    assert one_by_one == 16 * 16
    # sent at once, they share the engine's steps: 16 if all arrive before the first, a few more otherwise
    assert together < 16 * 16 / 4, f"16 concurrent calls took {together} engine steps"


async def test_generate_many_answers_each_prompt_or_its_own_error(gen: Any) -> None:
    """The batch form a service sends for generate.route calls made together (``batched_endpoints``)."""
    long = "ab" * 1500  # tokenized in vLLM's pool (RENDER_HERE_CHARS), and longer than the model's context
    out = await gen.actor.generate_many.call_one(["abc", [10**6], "bcd", long], n=2, max_tokens=3)
    assert [c.prompt for c in out[0]] == ["abc", "abc"] and [c.prompt for c in out[2]] == ["bcd", "bcd"]
    assert all(len(c.token_ids) <= 3 for c in out[0] + out[2])
    assert isinstance(out[1], ActorError), out[1]  # the bad prompt's error, for its caller alone, as if alone
    assert "1000000" in str(out[1]), str(out[1])
    assert isinstance(out[3], ActorError) and "3000" in str(out[3]), str(out[3])


def dominant_state_dict(model: Path, token: str = DOMINANT) -> dict[str, torch.Tensor]:
    """The model's weights changed so that the next token is ``token`` whatever the context.

    With every o_proj and down_proj zero the residual stream is the embedding; with every embedding
    row ones, the final hidden state is norm(ones) * norm.weight = ones; lm_head then gives ``token`` a
    logit of 0.2 * hidden_size = 25.6 and every other token 0, so p(token) > 1 - 1e-9.
    """
    from safetensors.torch import load_file

    sd = load_file(str(model / "model.safetensors"))
    for name, tensor in sd.items():
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            tensor.zero_()
    sd["model.embed_tokens.weight"].fill_(1.0)
    sd["model.norm.weight"].fill_(1.0)
    sd["lm_head.weight"].zero_()
    sd["lm_head.weight"][ALPHABET.index(token) + 2] = 0.2
    return sd


@pytest.mark.timeout(150)
async def test_update_weights_waits_for_in_flight_requests_then_swaps(gen: Any) -> None:
    # The run's way, on this generator's first load: the manifest handed over before the controller has put it
    # in torchstore (WeightSync puts it in the background): the load must not ask the store for the version
    # (it did once, and refused "version 1 is not in torchstore (stored: none)" when the put was slow).
    manifest = await weights.push_state_dict(dominant_state_dict(gen.model), version=1, announce=False)
    assert await weights.stored_versions() == []
    # Sent in this order: the first four run on version 0 (in flight when the update arrives), the
    # update waits for them, and the last four wait for the update.
    before = [gen.actor.generate.call_one("abc", max_tokens=40) for _ in range(4)]
    update = gen.actor.update_weights.call_one(1, manifest=manifest)
    after = [gen.actor.generate.call_one("abc") for _ in range(4)]
    results = await asyncio.gather(*before, update, *after)
    old, new_version, new = results[:4], results[4], results[5:]

    assert new_version == 1
    assert await gen.actor.get_version.call_one() == 1
    old_tokens = [t for cs in old for c in cs for t in c.token_ids.tolist()]
    assert all(c.generator_version == 0 for cs in old for c in cs)
    assert old_tokens.count(DOMINANT_ID) < 0.5 * len(old_tokens)  # random weights: ~1/10 each
    for cs in new:
        for c in cs:
            assert c.generator_version == 1
            assert c.token_ids.tolist() == [DOMINANT_ID] * SAMPLING["max_tokens"]
            assert c.text == DOMINANT * SAMPLING["max_tokens"]
            assert (c.logprobs > -1e-3).all()
    await weights.announce_version(1, manifest)  # as the controller does after handing it


@pytest.mark.timeout(60)
async def test_update_through_torchstore_messages(gen: Any) -> None:
    """Not only the same-host shared-memory path: tensors sent as monarch messages reach the worker too."""
    await weights.push_state_dict(dominant_state_dict(gen.model, "f"), version=2, transport="torchstore")
    assert await gen.actor.update_weights.call_one(2) == 2
    (c,) = await gen.actor.generate.call_one("abc", n=1)
    assert c.generator_version == 2 and c.text == "f" * SAMPLING["max_tokens"]


@pytest.mark.timeout(60)
async def test_a_handed_manifest_is_loaded_unless_it_names_another_version(gen: Any) -> None:
    """What the trainer's push returns, handed to update_weights (the run's way): no torchstore lookup."""
    g_manifest = await weights.push_state_dict(dominant_state_dict(gen.model, "g"), version=3)
    await weights.push_state_dict(dominant_state_dict(gen.model, "h"), version=4)
    assert await gen.actor.update_weights.call_one(3, manifest=g_manifest) == 3
    (c,) = await gen.actor.generate.call_one("abc", n=1)
    assert c.generator_version == 3 and c.text == "g" * SAMPLING["max_tokens"]
    # version 3's manifest says nothing of version 4: version 4 is looked up in torchstore
    assert await gen.actor.update_weights.call_one(4, manifest=g_manifest) == 4
    (c,) = await gen.actor.generate.call_one("abc", n=1)
    assert c.generator_version == 4 and c.text == "h" * SAMPLING["max_tokens"]


@pytest.mark.timeout(60)
async def test_bad_updates_are_refused_and_generation_goes_on(gen: Any) -> None:
    version = await gen.actor.get_version.call_one()
    with pytest.raises(Exception, match=r"policy version 7 is not in torchstore \(stored: \[.*\]\)"):
        await gen.actor.update_weights.call_one(7)
    titan_names = {"tok_embeddings.weight": torch.zeros(10, 128), "norm.weight": torch.ones(128)}
    await weights.push_state_dict(titan_names, version=8)
    with pytest.raises(Exception, match=r"does not match the model.*tok_embeddings.*Hugging Face name"):
        await gen.actor.update_weights.call_one(8)
    with pytest.raises(Exception, match="version must be an int >= 0"):
        await gen.actor.update_weights.call_one(-1)
    assert await gen.actor.get_version.call_one() == version
    completions = await gen.actor.generate.call_one("ab", n=1)
    assert completions[0].generator_version == version


@pytest.mark.timeout(90)
async def test_user_mistakes_reach_the_caller_with_a_fix(gen: Any) -> None:
    def spawn(name: str, **kwargs: Any) -> Any:
        return gen.mesh.spawn(name, Generator, **kwargs)

    missing = "/nonexistent/forge-nb-model"
    with pytest.raises(Exception, match=f"model '{missing}' not found"):
        await spawn("nomodel", model=missing).setup.call_one()
    with pytest.raises(Exception, match="the Generator needs a model"):
        await spawn("nothing").setup.call_one()
    with pytest.raises(Exception, match=r"unknown vLLM sampling parameter\(s\) \['temprature'\].*Valid: "):
        await spawn("badsampling", model=str(gen.model), sampling_config={"temprature": 1.0}).setup.call_one()
    with pytest.raises(Exception, match=r"unknown vLLM engine argument.*'enforce_eagr' -> 'enforce_eager'"):
        await spawn("badengine", engine_args={"model": str(gen.model), "enforce_eagr": True}).setup.call_one()
    with pytest.raises(Exception, match=r"model=.* but engine_args\['model'\]="):
        await spawn("twice", model="a", engine_args={"model": "b"}).setup.call_one()
    with pytest.raises(Exception, match=r"generate\(\) before setup\(\)"):
        await spawn("early", model=str(gen.model)).generate.call_one("abc")
    with pytest.raises(Exception, match=r"namespace='a\.b'.*namespace_for\(name\)"):
        await spawn("badspace", model=str(gen.model), weights_namespace="a.b").setup.call_one()


@pytest.mark.timeout(240)  # a second engine starts
async def test_a_generator_loads_from_its_own_weights_namespace(gen: Any) -> None:
    """Two runs in one kernel: a generator spawned with ``weights_namespace`` sees its run's versions only."""
    other = gen.mesh.spawn("gen-ns", Generator, engine_args={"model": str(gen.model)}, sampling_params=SAMPLING,
                           weights_namespace="policy-other")
    await other.setup.call_one()
    await weights.push_state_dict(dominant_state_dict(gen.model, "f"), version=5, namespace="policy-other")
    await weights.push_state_dict(dominant_state_dict(gen.model), version=6)  # the default namespace's
    with pytest.raises(Exception, match=r"policy-other version 6 is not in torchstore \(stored: \[5\]\)"):
        await other.update_weights.call_one(6)
    assert await other.update_weights.call_one(5) == 5
    (c,) = await other.generate.call_one("abc", n=1)
    assert c.generator_version == 5 and c.text == "f" * SAMPLING["max_tokens"]
    await weights.drop_version(5, namespace="policy-other")
    await weights.drop_version(6)
