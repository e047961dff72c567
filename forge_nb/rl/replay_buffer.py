"""An in-memory replay buffer that hands the trainer batches of fresh-enough episodes.

Each episode is sampled at most once (torchforge's default `max_resample_count=0`): sampling removes it.
An episode produced by policy version v is usable at trainer version `curr` while
`curr - v <= max_policy_age`; older ones are evicted as "stale". When `max_size` is set, adding past it
evicts the oldest episodes as "overflow", after first dropping those already known to be stale.

This is a plain class with synchronous methods whose arguments pickle, so the same object can run in the
notebook process or be wrapped as an actor without changes.

Episodes built the documents' way (`Episode(prompt_ids=, response_ids=, reward=)`) carry neither a
policy version nor an advantage. `add` records the buffer's current version on such an episode (the
newest `curr_policy_version` seen by `sample`/`evict`, 0 before any), so its age counts from when it
entered the buffer; `sample` gives a missing advantage the reward minus the mean reward of the sampled
episodes (`forge_nb.rl.advantages.batch_baseline`). `sample()` without `curr_policy_version` evicts
nothing: every episode held is usable, whatever its age.

Deadlock note: with `max_policy_age=0` the trainer only learns from episodes of its current version.
That never deadlocks as long as generators pick up new weights, because nothing old blocks new episodes:
stale episodes are evicted on every `sample`, and `max_size` must hold at least one full batch.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Callable
from typing import Any

from forge_nb.rl.advantages import batch_baseline
from forge_nb.rl.types import Episode

__all__ = ["ReplayBuffer"]

_EVICTION_LOG_LEN = 1000


class ReplayBuffer:
    """Episodes waiting to be trained on.

    Args:
        batch_size: Episodes per data-parallel rank per `sample`.
        max_policy_age: How many trainer versions an episode may lag and still be used (0 = on-policy).
        dp_size: Data-parallel ranks; `sample` returns one list of `batch_size` episodes per rank.
        collate: Applied to the `dp_size` lists before `sample` returns them (e.g. `collate_seed`).
        max_size: Most episodes held; None for unbounded.
        seed: Seed of the sampling RNG (each buffer has its own; the global `random` is left alone).
    """

    def __init__(
        self,
        batch_size: int,
        max_policy_age: int,
        dp_size: int = 1,
        collate: Callable[[list[list[Episode]]], Any] | None = None,
        max_size: int | None = None,
        seed: int = 0,
    ) -> None:
        _check_int("batch_size", batch_size, 1, "use the number of episodes per trainer step, e.g. 8")
        _check_int("max_policy_age", max_policy_age, 0, "use 0 for fully on-policy training")
        _check_int("dp_size", dp_size, 1, "use 1 without data parallelism")
        if max_size is not None:
            _check_int(
                "max_size",
                max_size,
                batch_size * dp_size,
                "it must hold one full batch (batch_size * dp_size), or use None for no limit",
            )
        self.batch_size = batch_size
        self.max_policy_age = max_policy_age
        self.dp_size = dp_size
        self.collate = collate
        self.max_size = max_size
        self.seed = seed
        self._rng = random.Random(seed)
        self._episodes: deque[Episode] = deque()
        self._counters = {"added": 0, "sampled": 0, "evicted_stale": 0, "evicted_overflow": 0}
        self._evictions: deque[tuple[str, str]] = deque(maxlen=_EVICTION_LOG_LEN)
        # The newest trainer version seen in sample()/evict(): lets add() drop stale episodes before
        # evicting fresh ones for overflow.
        self._latest_version: int | None = None

    def __len__(self) -> int:
        return len(self._episodes)

    def __repr__(self) -> str:
        return (
            f"ReplayBuffer(len={len(self)}, batch_size={self.batch_size}, dp_size={self.dp_size}, "
            f"max_policy_age={self.max_policy_age}, max_size={self.max_size}, counters={self._counters})"
        )

    def add(self, episode: Episode) -> None:
        """Append one episode; may evict stale or, past `max_size`, the oldest episodes."""
        if not isinstance(episode, Episode):
            raise TypeError(f"ReplayBuffer.add() takes an Episode, got {type(episode).__name__}")
        completion = episode._require_completion()  # fail now, not at sample time
        if episode.advantage is None and episode.reward is None and episode.quarantine is None:
            raise ValueError(
                f"Episode {episode.episode_id!r} has neither a reward nor an advantage; score it first "
                "(Episode(reward=...) or forge_nb.rl.score) so the trainer has something to learn from"
            )
        if completion.generator_version is None:
            completion.generator_version = self._latest_version or 0
        self._episodes.append(episode)
        self._counters["added"] += 1
        if self.max_size is not None and len(self._episodes) > self.max_size:
            if self._latest_version is not None:
                self.evict(self._latest_version)
            while len(self._episodes) > self.max_size:
                self._drop(self._episodes.popleft(), "overflow")

    def sample(self, curr_policy_version: int | None = None, batch_size: int | None = None) -> Any:
        """Remove and return `dp_size` lists of `batch_size` usable episodes, or None if too few.

        Without `curr_policy_version` nothing is evicted as stale. Missing advantages are filled (see the
        module docstring). The result goes through `collate` when one was given.
        """
        batch_size = self.batch_size if batch_size is None else batch_size
        _check_int("batch_size", batch_size, 1, "pass None to use the buffer's batch_size")
        if curr_policy_version is not None:
            self.evict(curr_policy_version)
        total = batch_size * self.dp_size
        if len(self._episodes) < total:
            return None
        chosen = set(self._rng.sample(range(len(self._episodes)), k=total))
        picked = [ep for i, ep in enumerate(self._episodes) if i in chosen]
        self._rng.shuffle(picked)
        self._episodes = deque(ep for i, ep in enumerate(self._episodes) if i not in chosen)
        self._counters["sampled"] += total
        batch_baseline(picked)
        ranks = [picked[r * batch_size : (r + 1) * batch_size] for r in range(self.dp_size)]
        return ranks if self.collate is None else self.collate(ranks)

    def evict(self, curr_policy_version: int) -> int:
        """Drop episodes older than `max_policy_age` versions; returns how many were dropped."""
        if isinstance(curr_policy_version, bool) or not isinstance(curr_policy_version, int):
            raise TypeError(
                f"curr_policy_version must be an int (the trainer step), got {curr_policy_version!r}"
            )
        if self._latest_version is None or curr_policy_version > self._latest_version:
            self._latest_version = curr_policy_version
        keep: deque[Episode] = deque()
        dropped = 0
        for ep in self._episodes:
            if curr_policy_version - (ep.policy_version or 0) > self.max_policy_age:
                self._drop(ep, "stale")
                dropped += 1
            else:
                keep.append(ep)
        self._episodes = keep
        return dropped

    def clear(self) -> None:
        """Drop every episode without counting it as evicted."""
        self._episodes.clear()

    def counters(self) -> dict[str, int]:
        """Cumulative counts: added, sampled, evicted_stale, evicted_overflow."""
        return dict(self._counters)

    def episodes(self) -> list[Episode]:
        """The episodes currently held, oldest first (a copy of the list, not of the episodes)."""
        return list(self._episodes)

    def evictions(self) -> list[tuple[str, str]]:
        """The last evictions as (episode_id, reason), oldest first; reason is "stale" or "overflow"."""
        return list(self._evictions)

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to resume exactly: episodes, counters, RNG state and latest version."""
        return {
            "episodes": list(self._episodes),
            "counters": dict(self._counters),
            "evictions": list(self._evictions),
            "rng_state": self._rng.getstate(),
            "latest_version": self._latest_version,
            "seed": self.seed,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        missing = {"episodes", "counters", "rng_state"} - state.keys()
        if missing:
            raise ValueError(
                f"ReplayBuffer state is missing {sorted(missing)}; "
                "pass the dict from ReplayBuffer.state_dict()"
            )
        self._episodes = deque(state["episodes"])
        self._counters = {**{k: 0 for k in self._counters}, **state["counters"]}
        self._evictions = deque(state.get("evictions", ()), maxlen=_EVICTION_LOG_LEN)
        self._rng.setstate(state["rng_state"])
        self._latest_version = state.get("latest_version")
        self.seed = state.get("seed", self.seed)

    def _drop(self, episode: Episode, reason: str) -> None:
        self._counters[f"evicted_{reason}"] += 1
        self._evictions.append((episode.episode_id, reason))


def _check_int(name: str, value: Any, minimum: int, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ValueError(f"ReplayBuffer {name} must be an int >= {minimum}, got {value!r}; {hint}")
