"""verifiers environments as episodes: real verifiers 0.4 rollouts through the run's OpenAI endpoint.

One engine serves the module: the wide tiny model, taught (``tests/agents/taught.py``) to answer the tool task's
prompt with a call of the python tool in the endpoint's ``simple`` syntax and, once the tool said "sandbox", with
"done"; it answers everything else with noise. The
endpoint (``forge_nb.agents.server``), the openai client, verifiers' Env, interception server, harness loop and
scoring, and the SandboxedPythonCoder service are all real; the run the episode function reads is a plain
namespace with the attributes it uses.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import pytest_asyncio

vf = pytest.importorskip("verifiers.v1")

from forge_nb.agents.verifiers_env import HARNESS_ID, local_env, verifiers_episode  # noqa: E402
from forge_nb.envs.tools import Tools, python_tool  # noqa: E402

on_module_loop = pytest.mark.asyncio(loop_scope="module")

TOOL_PROMPT = "T:"
CALL = "@python import socket;print(socket.gethostname())"  # bubblewrap's UTS namespace answers "sandbox"
DONE = "done"
MCP_PROMPT, MCP_CALL = "M:", "@calc_add 2 3"
#: (prompt, the reply verifiers scored, the reward it gave), appended by the tasks' @vf.reward functions
SCORED: list[tuple[str, str, float]] = []


class Row(vf.TaskData):
    pass


class LetterTask(vf.Task[Row]):
    @vf.reward
    async def letters(self, trace: vf.Trace) -> float:
        """The share of the reply's characters that are letters: anything, as long as verifiers computes it."""
        reply = trace.last_reply
        value = sum(c.isalpha() for c in reply) / max(len(reply), 1)
        SCORED.append((self.data.prompt_text, reply, value))
        return value


class Letters(vf.Taskset[LetterTask, vf.TasksetConfig]):
    def load(self) -> list[LetterTask]:
        return [LetterTask(Row(prompt=p), self.config.task) for p in ("ab", "cd", "ef")]


class ToolTask(vf.Task[Row]):
    @vf.reward
    async def used_the_sandbox(self, trace: vf.Trace) -> float:
        return float(any(m.content == "sandbox" for m in trace.tool_messages))


class ToolTasks(vf.Taskset[ToolTask, vf.TasksetConfig]):
    def load(self) -> list[ToolTask]:
        return [ToolTask(Row(prompt=TOOL_PROMPT), self.config.task)]


class McpTask(vf.Task[Row]):
    @classmethod
    def toolsets(cls, config: Any) -> list[Any]:
        from tests.agents.vf_tools import Calc

        return [Calc(vf.ToolsetConfig())]

    @vf.reward
    async def added(self, trace: vf.Trace) -> float:
        return float(any(m.content == "5" for m in trace.tool_messages))


class McpTasks(vf.Taskset[McpTask, vf.TasksetConfig]):
    def load(self) -> list[McpTask]:
        return [McpTask(Row(prompt=MCP_PROMPT), self.config.task)]


class RoundsConfig(vf.EnvConfig):
    player: vf.AgentConfig = vf.AgentConfig()


class Rounds(vf.Env[RoundsConfig]):
    """A multi-turn env in verifiers' shape (its TextArena env's): the env answers each reply as the user."""

    async def run(self, task: Any, agents: Any) -> None:
        async with agents.player.interaction(task) as talk:
            segment = await talk.turn()
            for said in ("again", "more"):
                if segment.terminated:
                    break
                segment = await talk.turn(said)
        talk.trace.record_reward("turns", talk.trace.num_turns / 3)


class Referee(vf.SingleAgentEnv):
    async def run(self, task: Any, agents: Any) -> None:
        await agents.agent.run(task)
        raise RuntimeError("the referee left")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def served(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The taught model behind a Generator service and the endpoint; a SandboxedPythonCoder service."""
    from forge_nb.actors.coder import SandboxedPythonCoder
    from forge_nb.actors.generator import Generator
    from forge_nb.agents import OpenAIEndpoint
    from forge_nb.system.runtime import lifecycle
    from tests.agents.taught import teach

    model = teach(tmp_path_factory.mktemp("verifiers") / "taught",
                  [(TOOL_PROMPT, CALL), (TOOL_PROMPT + CALL + "<eos>" + "sandbox", DONE), (MCP_PROMPT, MCP_CALL)])
    lifecycle.ensure_started()
    policy = await Generator.options(num_replicas=1).as_service(
        model=str(model), sampling_params={"n": 1, "max_tokens": 8, "temperature": 1.0})
    coder = await SandboxedPythonCoder.options(num_replicas=1).as_service(timeout_s=5.0)
    config = SimpleNamespace(group_size=3, max_req_tokens=16, max_res_tokens=160, advantage="grpo",
                             generator=SimpleNamespace(engine_args={}))
    run = SimpleNamespace(name="taught", model=str(model), config=config, policy=policy, version=0, pad_id=0,
                          ref_model=None, sampling_overrides={}, openai=None)
    endpoint = await OpenAIEndpoint.start(run, tool_parser="simple")
    try:
        yield SimpleNamespace(run=run, endpoint=endpoint, coder=coder)
    finally:
        await endpoint.stop()
        await coder.shutdown()
        await policy.shutdown()


@on_module_loop
@pytest.mark.heavy
@pytest.mark.timeout(300)  # includes the module's teaching and engine start-up
async def test_a_group_plays_verifiers_rollouts_through_the_endpoint_with_verifiers_rewards(served: Any) -> None:
    SCORED.clear()
    env = local_env(Letters)
    assert env.config.agent.harness.id == HARNESS_ID and env.config.agent.runtime.type == "subprocess"
    play = verifiers_episode(env, endpoint=served.endpoint, sampling={"max_tokens": 6})
    before = served.endpoint.requests
    group = await play(served.run, {"request": "ignored", "target": None, "vf_task": 1})
    assert served.endpoint.requests - before == 3  # one chat call per trajectory, each through the endpoint
    assert len(group) == 3 and len(SCORED) == 3
    assert {prompt for prompt, _, _ in SCORED} == {"cd"}  # vf_task 1 of the taskset, for the whole group
    scored = {reply: reward for _, reply, reward in SCORED}
    for ep in group:
        (turn,) = ep.completion.metadata["turns"]
        assert ep.quarantine is None and ep.completion.prompt == "cd"
        assert len(ep.completion.token_ids) > 0 and ep.policy_mask.all()  # what the policy wrote, recorded
        assert ep.reward == pytest.approx(scored[turn["action"].strip()])  # verifiers' reward of that reply
    assert sorted(ep.reward for ep in group) == pytest.approx(sorted(r for _, _, r in SCORED))
    assert sum(ep.advantage for ep in group) == pytest.approx(0.0, abs=1e-5)

    again = await play(served.run, {"request": "no vf_task: the env's own sampling"})
    assert len(again) == 3 and len({ep.completion.prompt for ep in again}) == 1  # one task per group

    # the env as an eval set: its tasks are the held-out prompts, each played as a group on version 0
    from forge_nb.controller.evaluate import evaluate_pinned

    SCORED.clear()
    values = await evaluate_pinned(served.run, [{"vf_task": 0}, {"vf_task": 1}], k=3, version=0, episode_fn=play)
    assert len(SCORED) == 6 and {prompt for prompt, _, _ in SCORED} == {"ab", "cd"}
    assert values["eval/avg@3"] == pytest.approx(sum(r for _, _, r in SCORED) / 6)
    assert 0 <= values["eval/pass@1"] <= values["eval/pass@2"] <= values["eval/pass@3"] <= 1


@on_module_loop
@pytest.mark.heavy
@pytest.mark.timeout(180)
async def test_the_model_s_tool_call_runs_in_the_sandboxed_coder(served: Any) -> None:
    ran: list[str] = []
    python = python_tool(served.coder)

    async def recorded(code: str | None = None, input: str | None = None) -> str:  # noqa: A002 (the call's name)
        ran.append(input or code or "")
        return await python(code=code, input=input)

    env = local_env(ToolTasks, agent=vf.AgentConfig(max_turns=4))
    play = verifiers_episode(env, tools=Tools({"python": recorded}), endpoint=served.endpoint,
                             sampling={"max_tokens": 60, "temperature": 0.0})
    group = await play(served.run, {"request": TOOL_PROMPT})
    assert len(group) == 3 and ran[:3] == [CALL.removeprefix("@python ")] * 3
    assert socket.gethostname() != "sandbox"
    for ep in group:
        first, last = ep.completion.metadata["turns"]
        assert first["action"] == CALL and first["info"] == {"tool": "python", "tool_ok": True}  # endpoint-parsed
        assert first["observation"] == "sandbox"  # the harness's tool message: the coder's output, in its sandbox
        assert last["action"] == DONE  # the model read the tool's answer and ended the rollout
        assert ep.quarantine is None and ep.reward == 1.0  # the task's reward read the same tool message


@on_module_loop
@pytest.mark.heavy
@pytest.mark.timeout(180)
async def test_a_multi_turn_env_plays_several_turns_in_one_trajectory(served: Any) -> None:
    env = local_env(Letters, env=Rounds)
    play = verifiers_episode(env, endpoint=served.endpoint, sampling={"max_tokens": 4})
    group = await play(served.run, {"request": "x", "vf_task": 0})
    assert len(group) == 3  # one segment per trajectory: each turn continued the conversation before it
    for ep in group:
        turns = ep.completion.metadata["turns"]
        assert [t["observation"] for t in turns] == ["again", "more", ""]
        assert ep.completion.prompt == "ab" and ep.reward == pytest.approx(1.0)  # Rounds' reward: 3 turns of 3
        mask = ep.policy_mask.int().tolist()
        assert sum(1 for a, b in zip([0, *mask], mask, strict=False) if b and not a) == 3  # 3 answers, trained


@on_module_loop
@pytest.mark.heavy
@pytest.mark.timeout(180)
@pytest.mark.filterwarnings("ignore:The 'initial' parameter is deprecated:DeprecationWarning")  # verifiers' MCP code
async def test_a_verifiers_toolset_answers_the_model_s_call_from_its_own_mcp_server(
        served: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """verifiers' own tools: the task's Toolset, an MCP server verifiers starts in its subprocess runtime (this
    interpreter, ``python -m tests.agents.vf_tools``, offline), which the harness calls over MCP."""
    root = str(Path(__file__).resolve().parents[2])
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p))
    env = local_env(McpTasks, agent=vf.AgentConfig(max_turns=3))
    play = verifiers_episode(env, endpoint=served.endpoint, sampling={"max_tokens": 16, "temperature": 0.0})
    group = await play(served.run, {"request": MCP_PROMPT})
    assert len(group) == 3
    for ep in group:
        first = ep.completion.metadata["turns"][0]
        assert first["action"] == MCP_CALL and first["info"] == {"tool": "calc_add", "tool_ok": True}
        assert first["observation"] == "5" and ep.quarantine is None and ep.reward == 1.0


@on_module_loop
@pytest.mark.heavy
@pytest.mark.timeout(180)
async def test_a_conversation_that_spends_the_trajectory_s_budget_ends_and_is_scored(served: Any) -> None:
    """8 tokens after the prompt: the first answer (at most 4) leaves too little room for "again" and the next
    answer, or for "more": the endpoint refuses that call, the rollout ends there, and verifiers scores it."""
    play = verifiers_episode(local_env(Letters, env=Rounds), endpoint=served.endpoint, sampling={"max_tokens": 4},
                             max_tokens=8)
    group = await play(served.run, {"request": "x", "vf_task": 0})
    assert len(group) == 3
    for ep in group:
        turns = ep.completion.metadata["turns"]
        assert ep.quarantine is None and 1 <= len(turns) < 3
        assert ep.reward == pytest.approx(len(turns) / 3)  # Rounds' reward counted the turns verifiers saw


@on_module_loop
@pytest.mark.heavy
@pytest.mark.timeout(180)
async def test_a_failed_verifiers_episode_quarantines_its_trajectory_with_the_reason(served: Any) -> None:
    play = verifiers_episode(local_env(Letters, env=Referee), endpoint=served.endpoint, sampling={"max_tokens": 4})
    group = await play(served.run, {"request": "x"})
    assert len(group) == 3
    for ep in group:
        assert ep.reward is None and "the referee left" in ep.quarantine


@pytest.mark.timeout(60)
def test_seats_that_would_leave_this_machine_and_non_envs_are_refused_with_the_fix() -> None:
    remote = vf.SingleAgentEnv(vf.SingleAgentEnvConfig(taskset={"id": local_env(Letters).config.taskset.id}))
    with pytest.raises(ValueError, match="runs in a 'prime' runtime.*local_env"):
        verifiers_episode(remote)
    with pytest.raises(ValueError, match="'bash' harness, which runs the model's commands on this machine"):
        verifiers_episode(local_env(Letters, agent=vf.AgentConfig(harness={"id": "bash"})))
    with pytest.raises(TypeError, match="local_env"):
        verifiers_episode(Letters)
    with pytest.raises(ValueError, match="num_tasks"):
        verifiers_episode(local_env(Letters), num_tasks=0)
