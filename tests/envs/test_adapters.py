"""Adapters: reasoning-gym tasks and TextArena games as environments, each object in-process, then whole
episodes through real EnvPool services (2 replicas, monarch processes) with scripted players; no engine."""

from __future__ import annotations

import asyncio
import random
import re
import sys
import uuid
from collections.abc import Callable
from typing import Any

import pytest

from forge_nb.envs import EnvPool, ReasoningGymEnv, StepResult, TextArenaEnv
from forge_nb.envs.adapters import clean_action
from forge_nb.system.processes.procs import pid_alive

on_module_loop = pytest.mark.asyncio(loop_scope="module")

ARITHMETIC = {"dataset": "basic_arithmetic", "size": 50, "seed": 1}


def expected_answer(seed: int, dataset: str = "basic_arithmetic", size: int = 50, data_seed: int = 1) -> str:
    """What reasoning-gym itself says, built here: the replicas must pick the same entry for a seed."""
    import reasoning_gym

    return reasoning_gym.create_dataset(dataset, size=size, seed=data_seed)[seed % size]["answer"]


class Bisect:
    """A GuessTheNumber player: binary search on the game's "higher" / "lower" hints (sent without brackets:
    the adapter adds them)."""

    def __init__(self, lo: int = 1, hi: int = 20):
        self.lo, self.hi, self.guess = lo, hi, None

    def __call__(self, observation: str) -> str:
        if self.guess is not None:
            if "higher" in observation:
                self.lo = self.guess + 1
            elif "lower" in observation:
                self.hi = self.guess - 1
        self.guess = (self.lo + self.hi) // 2
        return str(self.guess)


def play_local(env: Any, seed: int, player: Callable[[str], str], max_steps: int = 20) -> tuple[str, list[StepResult]]:
    observation = first = env.reset(seed)
    results: list[StepResult] = []
    while not (results and results[-1].done) and len(results) < max_steps:
        results.append(env.step(player(observation)))
        observation = results[-1].observation
    return first, results


# -- cleaning actions ------------------------------------------------------------------------------------
def test_actions_lose_surrounding_whitespace_and_trailing_end_of_text_tokens() -> None:
    assert clean_action("  42 <|im_end|>") == "42"
    assert clean_action("42<|endoftext|>\n") == "42"
    assert clean_action("42</s>") == "42" and clean_action("\n[5]<|eot_id|><|end_of_text|> ") == "[5]"
    assert clean_action("a <|im_end|> b") == "a <|im_end|> b"  # only at the end


# -- reasoning-gym ---------------------------------------------------------------------------------------
def test_reasoning_gym_reset_picks_entry_seed_mod_size_and_says_how_to_answer() -> None:
    env = ReasoningGymEnv(**ARITHMETIC)
    first = env.reset(7)
    import reasoning_gym

    entry = reasoning_gym.create_dataset("basic_arithmetic", size=50, seed=1)[7]
    assert first == f"{entry['question']}\nAnswer with the final answer only.\n"
    assert env.reset(57) == first and env.index == 7  # seed % size
    assert ReasoningGymEnv(**ARITHMETIC, instruction="").reset(7) == f"{entry['question']}\n"
    assert env.reset(None) in {env.dataset[i]["question"] + "\nAnswer with the final answer only.\n"
                               for i in range(50)}


def test_reasoning_gym_builds_its_dataset_once_per_process_and_arguments() -> None:
    a, b = ReasoningGymEnv(**ARITHMETIC), ReasoningGymEnv(**ARITHMETIC, attempts=3)
    assert a.dataset is b.dataset  # one per process: EnvPool makes an environment object per trajectory
    assert ReasoningGymEnv("basic_arithmetic", size=50, seed=2).dataset is not a.dataset
    other = ReasoningGymEnv("basic_arithmetic", size=50, seed=1, min_terms=2, max_terms=2)
    assert other.dataset is not a.dataset and len(other.dataset) == 50


def test_a_right_answer_earns_1_and_ends_the_episode_however_it_is_wrapped() -> None:
    env = ReasoningGymEnv(**ARITHMETIC)
    answer = expected_answer(3)
    for action in (answer, f"  {answer} <|im_end|>", f"thinking...<answer>{answer}</answer><|endoftext|>"):
        env.reset(3)
        result = env.step(action)
        assert (result.reward, result.done, result.observation) == (1.0, True, "")
        assert result.info == {"answer": answer, "index": 3, "score": 1.0, "attempt": 1, "correct": True}


def test_one_attempt_a_wrong_answer_earns_0_and_ends_the_episode() -> None:
    env = ReasoningGymEnv(**ARITHMETIC)
    env.reset(4)
    result = env.step("definitely not a number")
    assert (result.reward, result.done) == (0.0, True)
    assert result.info["correct"] is False and result.info["score"] == 0.0
    assert result.info["answer"] == expected_answer(4)
    with pytest.raises(RuntimeError, match="ended"):
        env.step("again")


def test_attempts_make_a_single_turn_task_multi_turn_with_rewards_summing_to_at_most_1() -> None:
    env = ReasoningGymEnv(**ARITHMETIC, attempts=3)
    env.reset(5)
    wrong = [env.step("no"), env.step("still no")]
    assert all(r.observation == "\nThat is not right. Try again.\n" and not r.done and r.reward == 0.0 for r in wrong)
    assert [r.info["attempt"] for r in wrong] == [1, 2]
    right = env.step(wrong[0].info["answer"])  # the answer, learned from info
    assert (right.reward, right.done, right.info["attempt"]) == (1.0, True, 3)

    env.reset(5)
    out = [env.step("no"), env.step("no"), env.step("no")]
    assert [r.done for r in out] == [False, False, True] and sum(r.reward for r in out) == 0.0

    discounted = ReasoningGymEnv(**ARITHMETIC, attempts=2, discount=0.5)
    discounted.reset(5)
    results = [discounted.step("no"), discounted.step(expected_answer(5))]
    assert [r.reward for r in results] == [0.0, 0.5]  # a second-attempt success is worth less

    custom = ReasoningGymEnv(**ARITHMETIC, attempts=2, retry="Wrong.")
    custom.reset(5)
    assert custom.step("no").observation == "\nWrong.\n"


def test_reasoning_gym_mistakes_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="did you mean 'basic_arithmetic'"):
        ReasoningGymEnv("basic_arithmatic")
    with pytest.raises(ValueError, match="attempts must be >= 1"):
        ReasoningGymEnv(**ARITHMETIC, attempts=0)
    with pytest.raises(TypeError, match="bogus"):
        ReasoningGymEnv(**ARITHMETIC, bogus=1)  # the dataset's own config check
    with pytest.raises(RuntimeError, match="before reset"):
        ReasoningGymEnv(**ARITHMETIC).step("1")


def test_missing_libraries_name_the_extra_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)  # as if not installed
    monkeypatch.setitem(sys.modules, "textarena", None)
    with pytest.raises(ImportError, match=re.escape("pip install 'forge_nb[envs]'")):
        ReasoningGymEnv("basic_arithmetic", size=7)  # a dataset not built yet in this process
    with pytest.raises(ImportError, match=re.escape("pip install 'forge_nb[envs]'")):
        TextArenaEnv()


# -- TextArena -------------------------------------------------------------------------------------------
def test_guess_the_number_a_bisecting_player_wins_reward_1_seeing_only_new_text() -> None:
    env = TextArenaEnv()  # GuessTheNumber-v0: 1..20, 10 turns
    first, results = play_local(env, 11, Bisect())
    assert "You are playing Guess The Number" in first and first.endswith("Enter your guess.\n")
    assert results[-1].done and results[-1].reward == 1.0 and len(results) <= 5
    assert [r.reward for r in results[:-1]] == [0.0] * (len(results) - 1)
    assert results[-1].info["game_reward"] == 1.0 and results[-1].info["invalid_move"] is False
    assert "guessed the correct number" in results[-1].info["reason"]
    for turn, r in enumerate(results[:-1], start=1):  # just the hint: no prompt again, no history, no echo
        assert r.observation in ("\nThe target number is higher.\n", "\nThe target number is lower.\n")
        assert not r.done and r.info == {"turn": turn}
    with pytest.raises(RuntimeError, match="ended"):
        env.step("[3]")


def test_invalid_moves_are_answered_once_then_end_the_game_with_a_reward_in_0_1() -> None:
    env = TextArenaEnv("GuessTheNumber-v0", bracket_actions=False)
    env.reset(2)
    first = env.step("five")  # no [number]: the game's notice, one allowed
    assert not first.done and first.reward == 0.0 and "invalid move" in first.observation
    ended = env.step("six")
    assert ended.done and 0.0 <= ended.reward <= 1.0 and ended.info["invalid_move"] is True
    bracketed = TextArenaEnv()
    bracketed.reset(2)
    assert "The target number is" in bracketed.step("5").observation  # sent as [5]
    assert "The target number is" in bracketed.step("I guess [6]").observation  # has brackets: as it is


def test_a_seed_replays_a_game_and_the_process_random_state_is_left_alone() -> None:
    random.seed(123)
    expected_next = random.random()
    random.seed(123)
    a, b = TextArenaEnv(), TextArenaEnv()
    transcripts: list[list[str]] = [[a.reset(9)], [b.reset(9)]]
    players = [Bisect(), Bisect()]
    done = [False, False]
    while not all(done):  # interleaved, as trajectories on one replica are
        for i, env in enumerate((a, b)):
            if not done[i]:
                r = env.step(players[i](transcripts[i][-1]))
                transcripts[i].append(r.observation)
                done[i] = r.done
    assert transcripts[0] == transcripts[1]
    assert random.random() == expected_next
    numbers = set()
    for seed in range(6):
        player = Bisect()
        play_local(TextArenaEnv(), seed, player)
        numbers.add(player.guess)  # the winning guess: the secret number
    assert len(numbers) > 1  # other seeds, other numbers


def test_every_variant_is_read_bare_so_observations_match() -> None:
    firsts = {v: TextArenaEnv(v).reset(4) for v in ("GuessTheNumber-v0", "GuessTheNumber-v0-raw",
                                                    "GuessTheNumber-v0-train")}
    assert len(set(firsts.values())) == 1


def test_multi_player_and_unknown_games_are_refused_with_what_to_do() -> None:
    with pytest.raises(ValueError, match=r"single-player games.*'TicTacToe-v0' is not one.*GuessTheNumber-v0"):
        TextArenaEnv("TicTacToe-v0")
    with pytest.raises(ValueError, match="TwoPlayerState"):  # resets for one player, but has two seats
        TextArenaEnv("QuantumTicTacToe-v0")
    with pytest.raises(ValueError, match="did you mean 'GuessTheNumber-v0'"):
        TextArenaEnv("GuesTheNumber-v0")
    with pytest.raises(RuntimeError, match="before reset"):
        TextArenaEnv().step("[1]")


def test_games_that_need_nltk_data_say_so_offline() -> None:
    import nltk

    try:
        nltk.data.find("corpora/words")
        pytest.skip("this machine has NLTK's words corpus")
    except LookupError:
        pass
    with pytest.raises(RuntimeError, match=r"needs NLTK data.*words.*GuessTheNumber-v0"):
        TextArenaEnv("Wordle-v0")


def test_games_print_nothing_into_the_cell(capsys: pytest.CaptureFixture[str]) -> None:
    env = TextArenaEnv("RushHour-v0")  # prints "Generated puzzle in N attempts" as it sets up
    env.reset(0)
    env.step("[A+]")
    try:
        TextArenaEnv("Wordle-v0")  # offline: nltk.download's errors
    except RuntimeError:
        pass
    out, err = capsys.readouterr()
    assert (out, err) == ("", "")


def bisecting() -> Callable[[str, list[StepResult]], str]:
    """A fresh Bisect player in the shape ``play`` calls (the steps so far are not needed)."""
    player = Bisect()
    return lambda observation, _done: player(observation)


# -- through EnvPool services ----------------------------------------------------------------------------
async def play(env: Any, seed: int, player: Callable[[str, list[StepResult]], str],
               max_steps: int = 20) -> tuple[str, list[StepResult]]:
    """One trajectory against the service, as multi_turn_episode plays it (a session, then close)."""
    tid = uuid.uuid4().hex
    async with env.session():
        observation = first = await env.reset.route(tid, seed)
        results: list[StepResult] = []
        try:
            while not (results and results[-1].done) and len(results) < max_steps:
                results.append(await env.step.route(tid, player(observation, results)))
                observation = results[-1].observation
        finally:
            await env.close.route(tid)
    return first, results


async def stop(env: Any) -> None:
    pids = [p for r in env.replicas for p in r.mesh.pids]
    await env.shutdown()
    assert not [p for p in pids if pid_alive(p)], "the service left processes running"


@on_module_loop
@pytest.mark.timeout(240)
async def test_reasoning_gym_episodes_through_an_env_pool_service() -> None:
    from forge_nb.system.runtime import lifecycle

    lifecycle.ensure_started()
    env = await EnvPool.options(num_replicas=2).as_service(ReasoningGymEnv, **ARITHMETIC, attempts=2)
    try:
        def right(seed: int) -> Callable[[str, list[StepResult]], str]:
            return lambda _obs, _done: expected_answer(seed)  # computed here: same entry in every process

        def retry(_obs: str, done: list[StepResult]) -> str:
            return done[-1].info["answer"] if done else "wrong"

        def wrong(_obs: str, _done: list[StepResult]) -> str:
            return "wrong <|im_end|>"

        seeds = range(9)
        players = [right(s) if s % 3 == 0 else retry if s % 3 == 1 else wrong for s in seeds]
        played = await asyncio.gather(*(play(env, s, p) for s, p in zip(seeds, players, strict=True)))
        for seed, (first, results) in zip(seeds, played, strict=True):
            assert first.endswith("\nAnswer with the final answer only.\n")
            assert results[-1].done and sum(r.reward for r in results) in (0.0, 1.0)
            assert all(r.info["answer"] == expected_answer(seed) for r in results)
            rewards = [r.reward for r in results]
            assert rewards == ([1.0] if seed % 3 == 0 else [0.0, 1.0] if seed % 3 == 1 else [0.0, 0.0]), seed
            if seed % 3 == 1:
                assert results[0].observation == "\nThat is not right. Try again.\n"
        opened = [await r.actor.open_trajectories.call_one() for r in env.replicas]
        assert opened == [0, 0], "finished trajectories left environment objects behind"
    finally:
        await stop(env)


@on_module_loop
@pytest.mark.timeout(240)
async def test_guess_the_number_games_through_an_env_pool_service() -> None:
    from forge_nb.system.runtime import lifecycle

    lifecycle.ensure_started()
    env = await EnvPool.options(num_replicas=2).as_service(TextArenaEnv, env_id="GuessTheNumber-v0")
    try:
        seeds = [0, 0, 1, 2, 3, 3]
        played = await asyncio.gather(*(play(env, s, bisecting()) for s in seeds))
        for first, results in played:
            assert "You are playing Guess The Number" in first
            assert [r.reward for r in results] == [0.0] * (len(results) - 1) + [1.0]  # won, rewarded at the end
            assert results[-1].done and len(results) <= 5
            assert all(r.observation.count("\n") == 2 and "Guess The Number" not in r.observation
                       for r in results[:-1])  # one new line a turn, never the history again
        transcripts = [[first, *(r.observation for r in results)] for first, results in played]
        assert transcripts[0] == transcripts[1] and transcripts[4] == transcripts[5]  # a seed replays its game
        local = play_local(TextArenaEnv(), 1, Bisect())  # ... in this process too
        assert transcripts[2] == [local[0], *(r.observation for r in local[1])]
        opened = [await r.actor.open_trajectories.call_one() for r in env.replicas]
        assert opened == [0, 0]
    finally:
        await stop(env)
