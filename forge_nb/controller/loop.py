"""Where a training step's batch comes from: the replay buffer (RL) or supervised examples (SFT).

A run has one training loop (``Controller._training_loop``): park at the step boundary, take a batch, train
it, publish the weights, record the step's row, count the step budget. RL and SFT differ only in where the
batch comes from and what its step books, so each is a source with the same methods:

===================  ============================================  ==========================================
method               RLBatches (the replay buffer)                 SFTBatches (``run.sft(examples)``)
===================  ============================================  ==========================================
``take()``           a batch of episodes, or None after waiting    the next batch of examples
                     for one (a "starved" event when it is long)
``train(batch)``     ``trainer.train_step``                        ``trainer.sft_step`` (its row: ``sft`` 1)
``settle(b, how)``   the ledger's step: trained, skipped_step,     nothing to book
                     trainer_died or failed_step
``row(batch)``       policy age, generation rate, buffer counters  nothing more
``after()``          lets rollouts refill the buffer (sync mode)   nothing
===================  ============================================  ==========================================

A source reads the Controller's public parts (buffer, versions, ledger, trainer, events); the Controller
alone counts steps, writes rows and states, and owns the step budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any

from forge_nb.controller.episodes import episode_metrics
from forge_nb.rl import collate
from forge_nb.rl.losses.mismatch import TOKEN_RATIOS

__all__ = ["Batch", "RLBatches", "SFTBatches", "loads_overlap", "would_be_too_old"]


@dataclass
class Batch:
    """What one step trains: the source's data, how many items it holds, and what its row adds."""

    data: Any
    size: int
    waited_s: float = 0.0
    """How long the loop waited for it (the row's ``time/wait_batch_s``)."""
    measured: dict[str, Any] = field(default_factory=dict)
    """Measured when it was taken (RL: the episodes' policy age against the version that trains them)."""


class RLBatches:
    """Batches of episodes from the run's replay buffer; the ledger books each step's episodes."""

    def __init__(self, ctl: Any):
        self.ctl = ctl
        self._waited_since, self._starved_reported = time.monotonic(), False

    async def take(self) -> Batch | None:
        ctl, loop_cfg = self.ctl, self.ctl.config.loop
        sampled = ctl.buffer.sample(curr_policy_version=ctl.sync.version)
        if sampled is None and ctl.gate.refill_expired(time.monotonic() - self._waited_since):
            sampled = self._what_it_has()
        if sampled is not None:
            if loop_cfg.mode != "sync":
                ctl.collect_allowed.set()  # a batch left the buffer: rollouts may refill it while we train
            episodes = [e for shard in sampled for e in shard]
            return Batch(episodes, len(episodes), time.monotonic() - self._waited_since,
                         episode_metrics(episodes, ctl.sync.version))
        ctl.training_idle.set()  # nothing sampled: waiting for a batch is a safe place to stop
        ctl.collect_allowed.set()  # stale episodes were just evicted: room for fresh ones
        waited = time.monotonic() - self._waited_since
        if not self._starved_reported and waited > loop_cfg.starved_after_s:
            ctl.metrics.event("starved", waited_s=round(waited, 1),
                              message="the trainer has waited for a batch; are the generators healthy?")
            self._starved_reported = True
        # wake up by the starvation deadline at the latest, so a trainer that waits forever says so
        patience = 1.0 if self._starved_reported else max(0.05, loop_cfg.starved_after_s - waited)
        if (refill_left := ctl.gate.refill_left(waited)) is not None:  # and by dynamic sampling's bound
            patience = min(patience, max(0.05, refill_left))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(patience):
                await ctl.batch_ready.wait()
        ctl.batch_ready.clear()
        return None

    def _what_it_has(self) -> Any:
        """Dynamic sampling refilled for longer than ``rollout.refill_timeout_s``: the usable episodes the buffer
        holds (a multiple of the trainer's procs), or None when there are none; a "refill_timeout" event says so."""
        ctl = self.ctl
        ctl.buffer.evict(ctl.sync.version)
        procs = ctl.config.trainer.procs
        n = len(ctl.buffer) // (procs * ctl.buffer.dp_size) * procs
        if n == 0:
            return None
        waited = time.monotonic() - self._waited_since
        limit = ctl.config.rollout.refill_timeout_s
        ctl.metrics.event("refill_timeout", step=ctl.step + 1, episodes=n * ctl.buffer.dp_size,
                          waited_s=round(waited, 1),
                          message=f"dynamic sampling: after refilling for {waited:.0f} s (rollout.refill_timeout_s="
                                  f"{limit}) the step trains on the {n} episodes it has of {ctl.config.batch_size}; "
                                  "most groups have equal rewards (the task may be saturated: raise its difficulty)")
        return ctl.buffer.sample(curr_policy_version=ctl.sync.version, batch_size=n)

    async def train(self, batch: Batch) -> dict[str, Any]:
        self.ctl.ledger.begin_step(batch.size)  # the ledger balances while the step runs, too
        results = await self.ctl.trainer.train_step.call(collate(batch.data))
        ratios = getattr(results[0], "rows", {}).get(TOKEN_RATIOS)
        if ratios is not None and len(ratios) == len(batch.data):  # the explorer's per-token view of each episode
            shown = {row["episode_id"]: row for row in self.ctl.recent}
            for episode, row_ratios in zip(batch.data, ratios, strict=True):
                if episode.episode_id in shown:
                    shown[episode.episode_id]["token_ratios"] = [round(float(r), 3) for r in row_ratios]
        return dict(results[0].metrics)

    def settle(self, batch: Batch, how: str) -> None:
        self.ctl.ledger.settle_step(how, batch.size)

    def row(self, batch: Batch) -> dict[str, Any]:
        ctl = self.ctl
        return {**batch.measured, "tokens_per_s/generate": ctl.generated_tokens_per_s(),
                **ctl.gate.row(batch.size, ctl.config.group_size),
                **{f"buffer/{name}": value for name, value in ctl.buffer.counters().items()}}

    def after(self) -> None:
        if self.ctl.config.loop.mode == "sync":
            self.ctl.collect_allowed.set()  # lockstep: the next batch is generated by the new weights
        self._waited_since, self._starved_reported = time.monotonic(), False


class SFTBatches:
    """Batches of the run's supervised examples (``run.sft``); every step's weights are published too."""

    def __init__(self, ctl: Any):
        self.ctl = ctl

    async def take(self) -> Batch:
        return Batch(self.ctl.sft_data.next_batch(), 0)

    async def train(self, batch: Batch) -> dict[str, Any]:
        results = await self.ctl.trainer.sft_step.call(batch.data)
        return {**results[0].metrics, "sft": 1.0}

    def settle(self, batch: Batch, how: str) -> None:
        pass

    def row(self, batch: Batch) -> dict[str, Any]:
        return {}

    def after(self) -> None:
        pass


def loads_overlap(ctl: Any) -> bool:
    """Whether the generators load a version while the next step trains (``WeightSync.publish(overlap=True)``):
    in async mode with ``max_policy_age >= 1``; only then are versions held between ``loop.sync_interval``'s loads."""
    return ctl.config.loop.mode == "async" and ctl.buffer.max_policy_age >= 1


def would_be_too_old(ctl: Any, generating: int) -> bool:
    """With ``loop.sync_interval`` > 1 (generators keep a version for several steps, and rollouts running
    ahead on it made episodes evicted unused: 30% of the quickstart's): whether a group a rollout
    loop starts now would reach ``max_policy_age`` by its training step, estimated as the trainer's version
    plus the batches buffered or ``generating`` ahead of it, minus the oldest version a generator holds, with
    one step of slack for the buffer's random sampling. Such a group waits for the next load."""
    if ctl.config.loop.sync_interval == 1 or not loads_overlap(ctl):
        return False  # every step's version loads
    held = min((r.version or 0 for r in ctl.policy.replicas if r.healthy), default=ctl.sync.pushed)
    ahead = (len(ctl.buffer) + generating) // ctl.config.batch_size
    return ctl.sync.version + ahead - held > ctl.buffer.max_policy_age - 1
