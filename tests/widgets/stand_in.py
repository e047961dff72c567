"""StandInRun: the Run's public surface over a real MetricsStore, for the widget tests.

The dashboard duck-types the Run (name, state, version, metrics, services, control methods,
hparams, episodes). ``StandInRun`` offers exactly that surface, backed by a real MetricsStore and,
where a test gives it one, a real Service; its control methods only record the call and move the
state the way the Run documents, so the widget tests need neither models nor a training loop.
The browser tests use the real Run (forge_nb.run) instead.
"""

from __future__ import annotations

import asyncio
from typing import Any

from forge_nb.metrics import MetricsStore


class StandInRun:
    def __init__(self, name: str = "test-run", services: dict[str, Any] | None = None):
        self.name = name
        self.state = "ready"
        self.error: str | None = None
        self.current_step = 0
        self.version = 0
        self.metrics = MetricsStore()
        self.services: dict[str, Any] = services or {}
        self.calls: list[tuple[str, Any]] = []
        self._hparams: dict[str, Any] = {"lr": 1e-5, "beta": 0.1, "temperature": 1.0, "max_tokens": 64}
        self._episodes: list[dict[str, Any]] = []

    @property
    def hparams(self) -> dict[str, Any]:
        return dict(self._hparams)

    def start(self) -> None:
        self.calls.append(("start", None))
        self.state = "running"

    def pause(self) -> None:
        self.calls.append(("pause", None))
        self.state = "paused"

    def resume(self) -> None:
        self.calls.append(("resume", None))
        self.state = "running"

    async def step(self, n: int = 1) -> None:
        self.calls.append(("step", n))
        for _ in range(n):
            await asyncio.sleep(0)
            self.train_step()

    async def stop(self) -> None:
        self.calls.append(("stop", None))
        self.state = "stopping"
        await asyncio.sleep(0.01)
        self.state = "stopped"

    def set(self, **changes: Any) -> None:
        unknown = set(changes) - set(self._hparams)
        if unknown:
            raise ValueError(f"run.set(): unknown hyperparameter(s) {sorted(unknown)}")
        self.calls.append(("set", changes))
        self._hparams.update(changes)
        self.metrics.event("set", changes=changes)

    def episodes(self, n: int = 50, version: int | None = None, min_reward: float | None = None,
                 max_reward: float | None = None) -> list[dict[str, Any]]:
        out = [e for e in self._episodes if (version is None or e["version"] == version)
               and (min_reward is None or e["reward"] >= min_reward)
               and (max_reward is None or e["reward"] <= max_reward)]
        return out[-n:]

    def train_step(self) -> dict[str, Any]:
        """Record one step of plausible values, and two episodes per prompt."""
        self.current_step += 1
        self.version += 1
        s = self.current_step
        for p in range(2):
            for k in range(2):
                self._episodes.append({
                    "prompt": f"what is {p} + {s % 3}?", "response": f"answer v{self.version} #{k}",
                    "target": str(p + s % 3), "reward": (s + k) % 2 * 1.0, "advantage": 0.5 - k,
                    "version": self.version, "episode_id": f"e{s}-{p}-{k}"})
        return self.metrics.record(s, {
            "reward/mean": 0.1 * s, "reward/min": 0.1 * s - 0.5, "reward/max": 0.1 * s + 0.5,
            "reward/format": 0.05 * s, "reward/correct": 0.02 * s, "loss": 1.0 / s, "kl": 0.01 * s,
            "entropy": 2.0 - 0.01 * s, "grad_norm": 1.5, "response_len/mean": 20.0 + s,
            "policy_age/mean": 0.5, "tokens_per_s/generate": 1000.0, "tokens_per_s/train": 800.0,
            "time/step_s": 0.3})
