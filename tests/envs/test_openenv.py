"""OpenEnvEnv: OpenEnv environments (written against openenv-core's real base classes, tests/openenv_envs.py)
in-process, then whole games through a real EnvPool service (2 replicas, monarch processes) with a scripted
player; no engine, no server, no network."""

from __future__ import annotations

import asyncio
import logging
import random
import re
import sys
from collections.abc import Callable
from typing import Any

import pytest
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State

from forge_nb.envs import EnvPool, OpenEnvEnv, StepResult
from forge_nb.envs.openenv_env import render_observation
from forge_nb.system.processes.procs import pid_alive
from tests.envs.test_adapters import Bisect, bisecting, play
from tests.openenv_envs import (
    AsyncBoardEnvironment,
    BoardObservation,
    GuessAction,
    GuessNumberEnvironment,
    GuessObservation,
    LimitedEnvironment,
    MoveAction,
    ShoutAction,
    ShoutEnvironment,
    ShoutObservation,
    guess_prompt_only,
    parse_move,
)

on_module_loop = pytest.mark.asyncio(loop_scope="module")


async def play_local(env: OpenEnvEnv, seed: int | None, player: Callable[[str], str],
                     max_steps: int = 20) -> tuple[str, list[StepResult]]:
    observation = first = await env.reset(seed)
    results: list[StepResult] = []
    while not (results and results[-1].done) and len(results) < max_steps:
        results.append(await env.step(player(observation)))
        observation = results[-1].observation
    return first, results


# -- in-process ------------------------------------------------------------------------------------------
@on_module_loop
async def test_default_to_action_fills_the_one_required_str_field_with_the_cleaned_text() -> None:
    env = OpenEnvEnv(GuessNumberEnvironment)
    assert (env.action_cls, env.field) == (GuessAction, "guess")  # from Environment[GuessAction, ...]
    await env.reset(3)
    secret = env.env.secret
    result = await env.step(f"  {secret} <|im_end|>")
    assert (result.reward, result.done, result.info) == (1.0, True, {"guesses": 1, "secret": secret})

    shout = OpenEnvEnv(ShoutEnvironment)  # not parameterized: the model comes from step's annotation
    assert (shout.action_cls, shout.field) == (ShoutAction, "message")  # volume is optional: not in the way
    await shout.reset()
    assert (await shout.step("hey</s>\n")).observation == "\nHEY\n"


@on_module_loop
async def test_a_guessing_game_reward_none_is_0_metadata_is_info_and_text_is_laid_out() -> None:
    env = OpenEnvEnv(GuessNumberEnvironment, max_number=20, turns=6)  # kwargs make the environment
    first, results = await play_local(env, 11, Bisect())
    assert first == "prompt: Guess a number between 1 and 20.\nguesses_left: 6\n"  # hint None: left out
    assert results[-1].done and results[-1].reward == 1.0 and 1 <= len(results) <= 5
    assert results[-1].info == {"guesses": len(results), "secret": env.env.secret}
    for turn, r in enumerate(results[:-1], start=1):  # reward None on the way: 0.0
        assert (r.reward, r.done, r.info) == (0.0, False, {"guesses": turn})
        assert re.fullmatch(rf"\nhint: (higher|lower)\nguesses_left: {6 - turn}\n", r.observation)
    assert "hint: correct" in results[-1].observation
    with pytest.raises(RuntimeError, match="ended"):
        await env.step("3")

    lost = OpenEnvEnv(GuessNumberEnvironment, turns=2)
    await lost.reset(11)
    wrong = lost.env.secret % 20 + 1
    out = [await lost.step(str(wrong)), await lost.step(str(wrong))]
    assert [(r.reward, r.done) for r in out] == [(0.0, False), (0.0, True)]
    with pytest.raises(RuntimeError, match="before reset"):
        await OpenEnvEnv(GuessNumberEnvironment).step("1")


@on_module_loop
async def test_the_seed_reaches_reset_when_it_takes_one(caplog: pytest.LogCaptureFixture) -> None:
    a, b = OpenEnvEnv(GuessNumberEnvironment), OpenEnvEnv(GuessNumberEnvironment)
    await a.reset(5)
    await b.reset(5)
    assert a.env.secret == b.env.secret == random.Random(5).randint(1, 20)
    assert len({(await a.reset(s), a.env.secret)[1] for s in range(8)}) > 1  # other seeds, other numbers

    board = OpenEnvEnv(AsyncBoardEnvironment, to_action=parse_move)  # reset_async's seed
    await board.reset(9)
    assert board.env.seed == 9

    with caplog.at_level(logging.WARNING, logger="forge_nb.envs.openenv_env"):
        shout = OpenEnvEnv(ShoutEnvironment)  # reset() takes no seed: not passed, warned about once
        assert not shout.takes_seed
        assert await shout.reset(1) == "Say something.\n"
        await OpenEnvEnv(ShoutEnvironment).reset(2)
    warned = [r.getMessage() for r in caplog.records if "takes no seed" in r.getMessage()]
    assert len(warned) <= 1  # once per process (an earlier test may have used it up)


@on_module_loop
async def test_custom_to_action_and_to_text_and_async_methods() -> None:
    env = OpenEnvEnv(AsyncBoardEnvironment, to_action=parse_move, size=2)  # the sync methods raise
    assert await env.reset() == 'board: ["..", ".."]\n'
    moves = [await env.step(m) for m in ("0,0", " 1,1<|im_end|>", "0,1", "1,0")]
    assert moves[1].observation == '\nboard: ["x.", ".x"]\nlast_move: 1,1\n'
    assert [(r.reward, r.done) for r in moves] == [(1.0, False)] * 3 + [(1.0, True)]  # reward True: 1.0

    guess = OpenEnvEnv("tests.openenv_envs:GuessNumberEnvironment", to_text=guess_prompt_only)
    assert await guess.reset(1) == "Guess a number between 1 and 20.\n"
    assert (await guess.step("0")).observation == "\nhigher\n"

    def fixed(_text: str) -> GuessAction:
        return GuessAction(guess="20")

    forced = OpenEnvEnv(GuessNumberEnvironment, to_action=fixed, to_text=lambda obs: f"[{obs.hint}]")
    await forced.reset(1)
    assert (await forced.step("whatever")).observation == f"\n[{'correct' if forced.env.secret == 20 else 'lower'}]\n"


@on_module_loop
async def test_actions_of_the_wrong_type_are_clear_errors() -> None:
    with pytest.raises(TypeError, match=r"MoveAction has fields \(row: int, col: int\), not exactly one required "
                                        r"str field.*pass to_action="):
        OpenEnvEnv(AsyncBoardEnvironment)
    with pytest.raises(TypeError, match="does not name its Action model.*pass to_action="):
        OpenEnvEnv(Unannotated)
    assert isinstance(OpenEnvEnv(Unannotated, to_action=lambda t: ShoutAction(message=t)).env, Unannotated)

    wrong = OpenEnvEnv(GuessNumberEnvironment, to_action=lambda t: ShoutAction(message=t))
    await wrong.reset(0)
    with pytest.raises(TypeError, match="to_action returned a ShoutAction; GuessNumberEnvironment.step takes "
                                        "GuessAction"):
        await wrong.step("1")
    untyped = OpenEnvEnv(GuessNumberEnvironment, to_action=lambda t: {"guess": t})
    await untyped.reset(0)
    with pytest.raises(TypeError, match="to_action returned a dict"):
        await untyped.step("1")

    limited = OpenEnvEnv(LimitedEnvironment)  # a constraint on the field: the model refuses long text
    await limited.reset()
    with pytest.raises(ValueError, match=r"LimitedAction refuses the action 'toolongword' \(word: String should "
                                         r"have at most 5 characters\)"):
        await limited.step("toolongword")
    assert (await limited.step("short")).reward == 1.0


def test_other_mistakes_are_clear_errors(monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(TypeError, match="NotAnEnv is not an openenv.core Environment"):
        OpenEnvEnv(NotAnEnv)
    with pytest.raises(TypeError, match="client for an OpenEnv server"):
        OpenEnvEnv(FakeEnvClient)
    with pytest.raises(ValueError, match=r"OpenEnvEnv\(environment\)='tests.openenv_envs:Nope': cannot import"):
        OpenEnvEnv("tests.openenv_envs:Nope")
    with pytest.raises(TypeError, match="unexpected keyword argument 'bogus'"):
        OpenEnvEnv(GuessNumberEnvironment, bogus=1)
    monkeypatch.setitem(sys.modules, "openenv.core.env_server", None)  # as if not installed
    with pytest.raises(ImportError, match=re.escape("openenv-core is needed for this environment: pip install "
                                                    "'forge_nb[envs]'")):
        OpenEnvEnv(GuessNumberEnvironment)


def test_default_rendering_of_observations() -> None:
    assert render_observation(ShoutObservation(echoed="hi", reward=1.0, done=True, metadata={"a": 1})) == "hi"
    assert render_observation(ShoutObservation()) == ""  # one field, empty
    assert render_observation(GuessObservation(prompt="p", hint="two\nlines", guesses_left=3)) == (
        "prompt: p\nhint:\ntwo\nlines\nguesses_left: 3")
    assert render_observation(BoardObservation(board=["x.", ".."], last_move=None)) == 'board: ["x.", ".."]'
    assert render_observation(MoveObservationLike(move=MoveAction(row=1, col=2), score=0.5)) == (
        'move: {"metadata": {}, "row": 1, "col": 2}\nscore: 0.5')


@on_module_loop
async def test_what_the_environment_prints_stays_out_of_the_cell_and_close_reaches_it(
        capsys: pytest.CaptureFixture[str]) -> None:
    env = OpenEnvEnv(ShoutEnvironment)  # prints on reset
    await env.reset()
    await env.step("x")
    assert capsys.readouterr() == ("", "")
    guess = OpenEnvEnv(GuessNumberEnvironment)
    await guess.reset(0)
    await guess.close()
    assert guess.env.closed


@on_module_loop
async def test_interleaved_async_environments_leave_stdout_alone() -> None:
    """An async method is not quieted: redirecting stdout across its awaits, interleaved with other
    trajectories', would leave stdout pointing at one of the buffers."""
    streams = (sys.stdout, sys.stderr)
    envs = [OpenEnvEnv(AsyncBoardEnvironment, to_action=parse_move) for _ in range(4)]
    await asyncio.gather(*(env.reset(i) for i, env in enumerate(envs)))
    results = await asyncio.gather(*(env.step("0,0") for env in envs))
    assert all(r.observation.startswith('\nboard: ["x..", "...", "..."]') for r in results)
    assert (sys.stdout, sys.stderr) == streams


class Unannotated(Environment):
    def reset(self, seed: int | None = None, episode_id: str | None = None, **kwargs: Any) -> ShoutObservation:
        return ShoutObservation(echoed="go")

    def step(self, action, timeout_s=None, **kwargs):  # no annotations: the Action model is unknown
        return ShoutObservation(echoed=str(action), done=True)

    @property
    def state(self) -> State:
        return State()


class NotAnEnv:
    def reset(self, seed: int | None = None) -> str:
        return ""


class FakeEnvClient:
    """Named like openenv's clients (EnvClient, GenericEnvClient), which need a server to construct."""


class MoveObservationLike(Observation):
    move: Action | None = None
    score: float = 0.0


# -- through an EnvPool service --------------------------------------------------------------------------


@on_module_loop
@pytest.mark.timeout(240)
async def test_guessing_games_through_an_env_pool_service() -> None:
    from forge_nb.system.runtime import lifecycle

    lifecycle.ensure_started()
    env = await EnvPool.options(num_replicas=2).as_service(
        OpenEnvEnv, environment="tests.openenv_envs:GuessNumberEnvironment", to_text=guess_prompt_only, turns=6)
    pids = [p for r in env.replicas for p in r.mesh.pids]
    try:
        seeds = [0, 0, 1, 2, 3, 3, 4, 5]
        played = await asyncio.gather(*(play(env, s, bisecting()) for s in seeds))
        for seed, (first, results) in zip(seeds, played, strict=True):
            secret = random.Random(seed).randint(1, 20)  # the replicas seeded the game with the trajectory's seed
            assert first == "Guess a number between 1 and 20.\n"
            assert [r.reward for r in results] == [0.0] * (len(results) - 1) + [1.0]  # won, rewarded at the end
            assert results[-1].done and len(results) <= 5
            assert results[-1].info == {"guesses": len(results), "secret": secret}
            assert all(r.observation in ("\nhigher\n", "\nlower\n") for r in results[:-1])
        transcripts = [[first, *(r.observation for r in results)] for first, results in played]
        assert transcripts[0] == transcripts[1] and transcripts[4] == transcripts[5]  # a seed replays its game
        local = await play_local(OpenEnvEnv(GuessNumberEnvironment, to_text=guess_prompt_only), 2, Bisect())
        assert transcripts[3] == [local[0], *(r.observation for r in local[1])]  # ... in this process too
        opened = [await r.actor.open_trajectories.call_one() for r in env.replicas]
        assert opened == [0, 0], "finished trajectories left environment objects behind"
    finally:
        await env.shutdown()
    assert not [p for p in pids if pid_alive(p)], "the service left processes running"
