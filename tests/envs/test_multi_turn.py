"""Multi-turn episodes: a real vLLM generator service plays trajectories against a real environment service.

One engine serves the module (the tiny model, built here). The run the episode function reads is a plain
namespace with the attributes it uses, so these tests exercise the episode function and the services, not
a whole run's loops.
"""

from __future__ import annotations

import asyncio
import itertools
import os
import signal
import string
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_asyncio
import torch

from forge_nb.actors.generator import Generator
from forge_nb.envs import EchoEnv, EnvPool, multi_turn_episode
from forge_nb.models import TinyModelConfig, build_tiny_model

pytestmark = [pytest.mark.asyncio(loop_scope="module"), pytest.mark.heavy]

ALPHABET = TinyModelConfig().alphabet
#: The module's model knows every printable character (the library environments write English), the
#: default alphabet first so that its letters keep their ids, and room for their longer prompts.
WIDE = TinyModelConfig(alphabet=ALPHABET + "".join(c for c in string.printable if c not in ALPHABET),
                       max_position_embeddings=1024)


def ids(text: str) -> list[int]:
    return [ALPHABET.index(ch) + 2 for ch in text]


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def policy(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from forge_nb.system.runtime import lifecycle

    model = build_tiny_model(tmp_path_factory.mktemp("multi-turn") / "tiny", WIDE)
    lifecycle.ensure_started()
    service = await Generator.options(num_replicas=1).as_service(
        model=str(model), sampling_params={"n": 1, "max_tokens": 8, "temperature": 1.0})
    try:
        yield SimpleNamespace(service=service, model=str(model))
    finally:
        await service.shutdown()


def fake_run(policy: Any, group_size: int = 4, max_res_tokens: int = 24) -> SimpleNamespace:
    """What an episode function reads of a Run."""
    config = SimpleNamespace(group_size=group_size, max_req_tokens=4, max_res_tokens=max_res_tokens,
                             advantage="grpo")
    return SimpleNamespace(config=config, policy=policy.service, model=policy.model, pad_id=0, ref_model=None,
                           sampling_overrides={})


@pytest.mark.timeout(300)  # includes the module's engine start-up
async def test_token_id_prompts_reach_the_engine_as_they_are(policy: Any) -> None:
    (c,) = await policy.service.generate.route(ids("abca"), n=1)
    assert c.prompt is None and c.prompt_ids.tolist() == ids("abca")
    (t,) = await policy.service.generate.route(torch.tensor(ids("ab")), n=1)
    assert t.prompt_ids.tolist() == ids("ab")
    for bad in ([], ["a"], torch.ones(2)):
        with pytest.raises(Exception, match="a string or token ids"):
            await policy.service.generate.route(bad)


@pytest.mark.timeout(180)
async def test_a_group_plays_whole_trajectories_trained_on_the_policy_s_tokens_only(policy: Any) -> None:
    env = await EnvPool.options(num_replicas=2).as_service(EchoEnv, turns=3, chars=3)
    try:
        play = multi_turn_episode(env, max_turns=5, turn_tokens=3)
        group = await play(fake_run(policy), {"seed": 7})
        assert len(group) == 4
        letters = EchoEnv(turns=3)
        first = letters.reset(7)
        for ep in group:
            turns = ep.completion.metadata["turns"]
            assert len(turns) == 3 and ep.completion.stop_reason == "done"  # EchoEnv ends after 3 turns
            assert [t["observation"] for t in turns] == [*letters.letters[1:], ""]
            assert ep.completion.prompt_ids.tolist() == ids(first) and ep.target == 7
            mask, logprobs = ep.policy_mask, ep.completion.logprobs
            tokens = ep.completion.token_ids.tolist()
            expected = EchoEnv(turns=3, chars=3)  # replays the actions: what the service's env object said
            expected.reset(7)
            pos = 0
            for turn in turns:
                action = turn["action"]
                k = int(mask[pos:].long().cumprod(0).sum())  # the action: the policy's tokens from here on
                assert 1 <= k <= 3
                assert (logprobs[pos:pos + k] <= 0).all() and torch.isfinite(logprobs[pos:pos + k]).all()
                assert turn["reward"] == pytest.approx(expected.step(action).reward)
                pos += k
                obs = ids(turn["observation"])
                assert tokens[pos:pos + len(obs)] == obs and not mask[pos:pos + len(obs)].any()
                assert (logprobs[pos:pos + len(obs)] == 0).all()
                pos += len(obs)
            assert pos == len(tokens)
            assert ep.reward == pytest.approx(sum(t["reward"] for t in turns)) and ep.quarantine is None
        assert sum(ep.advantage for ep in group) == pytest.approx(0.0, abs=1e-5)  # GRPO over whole trajectories
        opened = [await r.actor.open_trajectories.call_one() for r in env.replicas]
        assert opened == [0, 0], "finished trajectories left environment objects behind"
    finally:
        await env.shutdown()


@pytest.mark.timeout(180)
async def test_a_chat_model_plays_its_turns_in_its_chat_template_s_shape(policy: Any, tmp_path: Any) -> None:
    """The kernel frames the conversation with the model's chat template (here one written for the tiny
    model: role lines, <eos> ending a message) and the engine generates from those token ids: the whole
    trajectory, the policy's actions as generated, reads as the template renders the conversation."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(policy.model)
    tok.chat_template = ("{% for m in messages %}[{{ m.role }}]\n{{ m.content }}<eos>\n{% endfor %}"
                         "{% if add_generation_prompt %}[{{ 'assistant' }}]\n{% endif %}")
    tok.save_pretrained(tmp_path)  # the kernel's tokenizer; the engine keeps the model's own (same ids)
    env = await EnvPool.options(num_replicas=1).as_service(EchoEnv, turns=3, chars=2)
    try:
        play = multi_turn_episode(env, max_turns=3, turn_tokens=2, system_prompt="Echo twice.")
        run = fake_run(policy, max_res_tokens=200)
        group = await play(SimpleNamespace(**{**vars(run), "model": str(tmp_path)}), {"seed": 5})
        for ep in group:
            ids, mask = ep.completion.token_ids.tolist(), ep.policy_mask.tolist()
            actions = [[ids[i] for i, _ in run] for trained, run in itertools.groupby(enumerate(mask), lambda x: x[1])
                       if trained]  # the policy's tokens, action by action: the runs of the mask
            turns = ep.completion.metadata["turns"]
            assert len(actions) == len(turns) == 3
            conversation = [{"role": "system", "content": "Echo twice."},
                            {"role": "user", "content": ep.completion.prompt}]
            for action, turn in zip(actions, turns, strict=True):
                conversation.append({"role": "assistant",
                                     "content": tok.decode(action, skip_special_tokens=False).removesuffix("<eos>")})
                if turn["observation"]:
                    conversation.append({"role": "user", "content": turn["observation"]})
            whole = tok.decode(ep.completion.prompt_ids.tolist() + ids, skip_special_tokens=False)
            rendered = tok.apply_chat_template(conversation, tokenize=False)
            assert rendered in (whole + "\n", whole + "<eos>\n"), (whole, rendered)  # the last action is open
            assert whole.startswith("[system]\nEcho twice.<eos>\n[user]\n") and "[assistant]\n" in whole
    finally:
        await env.shutdown()


@pytest.mark.timeout(180)
async def test_an_environment_replica_killed_mid_trajectory_drops_its_trajectories_with_the_reason(
        policy: Any) -> None:
    from tests.actors_for_tests import SlowEchoEnv

    env = await EnvPool.options(num_replicas=2).as_service(SlowEchoEnv, delay_s=0.4, turns=6, chars=2)
    try:
        play = asyncio.ensure_future(multi_turn_episode(env, max_turns=6, turn_tokens=2)(
            fake_run(policy, group_size=4), {"seed": 3}))
        await asyncio.sleep(1.5)  # every trajectory is a turn or two in
        assert not play.done()
        os.kill(env.replicas[0].mesh.pids[0], signal.SIGKILL)
        group = await play
        dropped = [ep for ep in group if ep.quarantine]
        finished = [ep for ep in group if not ep.quarantine]
        assert dropped and finished, [ep.quarantine for ep in group]
        assert all(ep.quarantine.startswith("environment step failed at turn") for ep in dropped)
        assert all(len(ep.completion.metadata["turns"]) == 6 for ep in finished)
        assert all(ep.advantage == 0.0 for ep in dropped)  # never learned from
    finally:
        await env.shutdown()


@pytest.mark.timeout(180)
async def test_tool_calls_are_answered_by_the_sandboxed_coder_and_never_reach_the_environment(policy: Any) -> None:
    """The tiny model writes no JSON, so a parser of its own makes every action that starts with a letter or
    digit a call of the python tool: which turns are calls is up to the sampled policy, what happens to them
    is not."""
    from forge_nb.actors.coder import SandboxedPythonCoder
    from forge_nb.envs.tools import ToolCall, Tools, python_tool

    def alnum_first(action: str) -> ToolCall | None:
        return ToolCall("python", {"code": f"print({action!r}.upper())"}) if action[:1].isalnum() else None

    coder = await SandboxedPythonCoder.options(num_replicas=1).as_service(timeout_s=5.0)
    env = await EnvPool.options(num_replicas=1).as_service(EchoEnv, turns=3, chars=2)
    try:
        tools = Tools({"python": python_tool(coder)}, syntax="simple", parse=alnum_first)
        play = multi_turn_episode(env, max_turns=6, turn_tokens=2, tools=tools)
        groups = [await play(fake_run(policy, group_size=4, max_res_tokens=40), {"seed": s}) for s in range(3)]
        turns = [ep.completion.metadata["turns"] for group in groups for ep in group]
        calls = [t for ts in turns for t in ts if "tool" in t.get("info", {})]
        assert calls, "no action started with a letter or digit in 12 trajectories"
        for t in calls:  # the tool's output is the next observation, with no reward
            assert t["action"][:1].isalnum() and t["info"]["tool_ok"]
            assert t["observation"] == t["action"].upper().strip() + "\n" and t["reward"] == 0.0  # output stripped
        for ts in turns:  # the environment saw the other actions only: it ends after its 3 steps
            env_turns = [t for t in ts if "tool" not in t.get("info", {})]
            assert len(env_turns) == 3 or len(ts) == 6
            assert all(not t["action"][:1].isalnum() for t in env_turns)
        from forge_nb.controller.episodes import turn_metrics

        metrics = turn_metrics([ep for group in groups for ep in group])
        assert metrics["tools/success"] == 1.0 and metrics["tools/calls"] == pytest.approx(len(calls) / 12)
        assert metrics["turns/mean"] == pytest.approx(sum(map(len, turns)) / 12)
    finally:
        await env.shutdown()
        await coder.shutdown()


@pytest.mark.timeout(180)
@pytest.mark.parametrize("name", ["reasoning-gym", "textarena"])
async def test_library_environments_play_whole_episodes_with_the_policy(policy: Any, name: str) -> None:
    """The adapters' environments served by EnvPool, played by the real (untrained) policy: every trajectory
    runs until the environment ends it or its turns run out, and is trained as one episode."""
    from forge_nb.envs import ReasoningGymEnv, TextArenaEnv

    if name == "reasoning-gym":
        env = await EnvPool.options(num_replicas=2).as_service(ReasoningGymEnv, dataset="basic_arithmetic",
                                                                size=50, attempts=2)
        max_turns, said = 2, "That is not right. Try again."
    else:
        env = await EnvPool.options(num_replicas=2).as_service(TextArenaEnv, env_id="GuessTheNumber-v0")
        max_turns, said = 3, ""  # the game's own words: "higher", "lower", or why the move was invalid
    try:
        play = multi_turn_episode(env, max_turns=max_turns, turn_tokens=6)
        group = await play(fake_run(policy, group_size=3, max_res_tokens=400), {"seed": 11})
        prompts = {ep.completion.prompt for ep in group}
        assert len(prompts) == 1 and len(next(iter(prompts))) > 50  # one seed: the same task for the group
        for ep in group:
            turns = ep.completion.metadata["turns"]
            assert ep.quarantine is None and 1 <= len(turns) <= max_turns
            assert 0.0 <= ep.reward <= 1.0 and ep.policy_mask.sum() >= len(turns)
            if len(turns) > 1:  # the environment answered the first action and went on
                assert turns[0]["observation"].strip() and said in turns[0]["observation"], turns[0]
        opened = [await r.actor.open_trajectories.call_one() for r in env.replicas]
        assert opened == [0, 0]
    finally:
        await env.shutdown()
