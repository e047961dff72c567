"""Run: one experiment's services and loops, driven from notebook cells.

``run = await forge_nb.spawn(cfg)`` brings the services up concurrently (with a progress bar) and
returns a Run; then, from any cell: ``run.start()``, ``run.pause()``, ``run.resume()``,
``await run.step(n)``, ``run.set(lr=3e-4, temperature=0.7)`` (applied at the next step boundary,
recorded as an event), ``run.metrics.frame()``, ``run.episodes(20)``, ``await run.stop()``,
``await run.shutdown()``; ``await run.sft(examples)`` / ``await run.rl()`` switch the same controls
between supervised and RL steps (``forge_nb.sft``); ``run.export("tensorboard")`` also sends the
metrics elsewhere (``forge_nb.exporters``).

The Run is the only owner of background tasks: one training loop and ``loop.rollout_loops`` rollout
loops (``forge_nb.loops``), named ``forge_nb.<run>.<loop>``, held by strong references. A loop that
raises stops the run: the error is kept in ``run.error``, recorded as an event and logged. Neither
that nor ``stop()`` ever cancels a training step in flight (``_no_step_in_flight``). Shutdown
order: loops (at a step boundary), then services (generators, reference, trainer), then torchstore.

This module is longer than most because it is the single place where the run's state changes; the
loops, the spawning (``forge_nb.spawning``) and the run directory (``forge_nb.rundir``) live apart.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter, deque
from collections.abc import Awaitable, Callable
from typing import Any

from forge_nb import loops, rundir
from forge_nb.config import RunConfig
from forge_nb.metrics import MetricsStore
from forge_nb.rl import Episode, ReplayBuffer
from forge_nb.sft import SftData

logger = logging.getLogger(__name__)

EpisodeFn = Callable[["Run", dict[str, Any]], Awaitable[list[Episode]]]

#: Hyperparameters ``run.set`` changes between steps, by where they apply. The trainer's own names
#: (lr, weight_decay, max_norm and its loss's fields) come from ``trainer.info()`` at spawn.
SAMPLING_HPARAMS = ("temperature", "top_p", "max_tokens")
RUN_HPARAMS = ("max_policy_age", "difficulty")


class Run:
    """Services, loops, metrics and controls of one experiment (see the module docstring)."""

    def __init__(self, config: RunConfig, *, policy: Any, trainer: Any, ref_model: Any, task: Any,
                 reward_fns: list[Any], pad_id: int, directory: rundir.RunDir,
                 episode_fn: EpisodeFn | None = None, hparams: dict[str, Any] | None = None,
                 trainer_hparams: tuple[str, ...] = ("lr", "max_norm"), model: str | None = None):
        self.config, self.name = config, config.name
        self.policy, self.trainer, self.ref_model = policy, trainer, ref_model
        self.task, self.reward_fns, self.pad_id = task, reward_fns, pad_id
        self.dir, self.model = directory, model
        self.mode = "rl"  # or "sft" (see sft())
        self.sft_data: SftData | None = None
        self.exporters: list[Any] = []
        self.episode_fn: EpisodeFn = episode_fn or loops.generate_episode
        self.metrics = MetricsStore(directory.path)
        self.replay_buffer = ReplayBuffer(batch_size=config.batch_size, max_policy_age=config.max_policy_age,
                                          seed=config.seed)
        self.state, self.error = "ready", None
        self.current_step = self.version = 0
        self.sampling_overrides: dict[str, Any] = {}
        self._hparams = dict(hparams or {})
        self.trainer_hparams = tuple(n for n in trainer_hparams if n != "temperature")
        self._pending: dict[str, Any] = {}
        self._apply_lock = asyncio.Lock()
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._running = asyncio.Event()
        self.collect_allowed, self.batch_ready = asyncio.Event(), asyncio.Event()
        self.collect_allowed.set()
        self.training_idle = asyncio.Event()  # set while the training loop is between steps
        self._steps_left: int | None = None
        self._steps_waiter: asyncio.Future[None] | None = None
        self._recent: deque[dict[str, Any]] = deque(maxlen=2000)
        self._pinned: Counter[int] = Counter()  # weight versions a respawned generator is loading
        self._rewound_to: list[int] = []  # the version each rewind went back to, in order
        # Where every accepted episode ended up (see ledger()); the buffer counts its own part.
        # ``in_step`` is not an end: the episodes of the training step in flight, until it settles them.
        self._ledger = dict.fromkeys(("accepted", "quarantined", "trained", "skipped_step", "failed_step",
                                      "trainer_died", "rolled_back", "cleared", "in_step"), 0)
        self._gen_tokens, self._gen_since = 0, time.monotonic()
        self._trainer_failures_seen = self._trainer_failures()
        policy.set_catch_up(self._catch_up)
        for name, service in self.services.items():
            service.subscribe(lambda e, name=name: self.metrics.event(
                "replica", service=name, replica=e.replica, old=e.old, new=e.new, reason=e.reason))

    # -- what the widgets and magics read ------------------------------------------------------

    @property
    def services(self) -> dict[str, Any]:
        found = {"policy": self.policy, "trainer": self.trainer, "ref_model": self.ref_model}
        return {k: v for k, v in found.items() if v is not None}

    @property
    def hparams(self) -> dict[str, Any]:
        """Current values of the hot-changeable hyperparameters (pending changes not yet applied)."""
        return dict(self._hparams)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.state, "error": self.error, "step": self.current_step,
                "version": self.version, "mode": self.mode, "buffer": len(self.replay_buffer),
                "loops": {n: ("running" if not t.done() else "done") for n, t in self._tasks.items()},
                "services": {n: s.status() for n, s in self.services.items()}, "last": self.metrics.last(),
                "pending": dict(self._pending), "run_dir": str(self.dir.path), "health": self.health,
                "ledger": self.ledger()}

    @property
    def health(self) -> str:
        """"ok"; "degraded" while some replica is not healthy; "down" while a service has none healthy."""
        states = {name: [r.state for r in svc.replicas] for name, svc in self.services.items()}
        if any("healthy" not in s for s in states.values()):
            return "down"
        return "ok" if all(st == "healthy" for s in states.values() for st in s) else "degraded"

    def ledger(self) -> dict[str, Any]:
        """Where every accepted episode went. ``balanced`` says the books add up, at any moment:
        accepted = quarantined + trained + skipped_step + failed_step + trainer_died + rolled_back + cleared
        + evicted + buffered + in_step (the batch of the training step in flight; 0 between steps)."""
        counts = {**self._ledger, **{k: v for k, v in self.replay_buffer.counters().items() if k != "added"},
                  "buffered": len(self.replay_buffer)}
        ends = sum(v for k, v in counts.items() if k not in ("accepted", "sampled"))
        return {**counts, "balanced": counts["accepted"] == ends}

    def clear_buffer(self, reason: str) -> int:
        """Drop every buffered episode, counted in the ledger and recorded as an event."""
        n = len(self.replay_buffer)
        self._ledger["cleared"] += n
        self.replay_buffer.clear()
        self.metrics.event("buffer_cleared", episodes=n, reason=reason)
        return n

    def count(self, outcome: str, n: int) -> None:
        """Record that ``n`` episodes ended as ``outcome`` (a key of the ledger)."""
        self._ledger[outcome] += n

    def settle_step(self, outcome: str, n: int) -> None:
        """The step in flight with ``n`` episodes ended as ``outcome``: they leave ``in_step`` for it."""
        self._ledger["in_step"] -= n
        self._ledger[outcome] += n

    def episodes(self, n: int = 50, version: int | None = None, min_reward: float | None = None,
                 max_reward: float | None = None) -> list[dict[str, Any]]:
        """The most recent episodes (newest last), optionally filtered by version and reward."""
        rows = [r for r in self._recent
                if (version is None or r["version"] == version)
                and (min_reward is None or (r["reward"] is not None and r["reward"] >= min_reward))
                and (max_reward is None or (r["reward"] is not None and r["reward"] <= max_reward))]
        return rows[-n:]

    def __repr__(self) -> str:
        return f"<Run {self.name!r} {self.state}: step {self.current_step}, version {self.version}>"

    # -- control --------------------------------------------------------------------------------

    def start(self) -> None:
        """Start (or resume) the loops in the background; the cell returns at once."""
        self._require_not_shut_down()
        if self.state == "failed":  # the user fixed the cause (e.g. replaced run.episode_fn): go on
            self.metrics.event("restart", after_error=self.error)
            self.error = None
        loop = asyncio.get_running_loop()
        if self.mode == "sft":
            wanted = {"sft": lambda: loops.sft_loop(self)}
        else:
            wanted = {"train": lambda: loops.training_loop(self)} | {
                f"rollout{i}": (lambda i=i: loops.rollout_loop(self, i))
                for i in range(self.config.loop.rollout_loops)}
        for name, make in wanted.items():
            if name not in self._tasks or self._tasks[name].done():
                task = loop.create_task(make(), name=f"forge_nb.{self.name}.{name}")
                task.add_done_callback(self._loop_done)
                self._tasks[name] = task
        self._set_state("running")
        self._running.set()

    resume = start

    def pause(self) -> None:
        """Stop at the next boundary: rollouts after their in-flight generation, training after its step."""
        self._running.clear()
        if self.state == "running":
            self._set_state("paused")

    async def step(self, n: int = 1) -> list[dict[str, Any]]:
        """Run exactly ``n`` training steps, then pause; returns their metric rows."""
        if not isinstance(n, int) or n < 1:
            raise ValueError(f"step(n={n!r}): n must be an integer >= 1")
        self.pause()  # a step already in flight finishes first and is not one of the n
        await self._no_step_in_flight()
        first = len(self.metrics.rows)
        self._steps_left = n
        self._steps_waiter = asyncio.get_running_loop().create_future()
        self.start()
        await self._steps_waiter
        return self.metrics.rows[first:]

    def step_budget_spent(self) -> bool:
        """Called by the training loop after each step: True when ``step(n)``'s budget just ran out."""
        if self._steps_left is None:
            return False
        self._steps_left -= 1
        if self._steps_left > 0:
            return False
        self._steps_left = None
        self.pause()
        if self._steps_waiter is not None and not self._steps_waiter.done():
            self._steps_waiter.set_result(None)
        return True

    async def stop(self, timeout: float = 120.0) -> None:
        """Stop the loops at a step boundary (services stay up; ``start()`` continues)."""
        self.pause()
        try:
            await self._no_step_in_flight(timeout)
        except TimeoutError:
            logger.warning("run %s: the training step did not finish in %ss; cancelling it", self.name, timeout)
        await self._cancel_loops()  # cancels synchronously, before its first await: no step can start
        if self.state not in ("failed",):
            self._set_state("stopped")

    def export(self, kind: str, **options: Any) -> Any:
        """Also send this run's metrics (history first) to "tensorboard", "trackio" or "wandb"; see
        ``forge_nb.exporters``. Returns the exporter (``.close()`` stops it; shutdown closes it)."""
        from forge_nb import exporters

        exporter = exporters.export(self.metrics, kind, run_dir=self.dir.path, run_name=self.name,
                                    config=self.config.to_dict(), **options)
        self.exporters.append(exporter)
        return exporter

    async def sft(self, examples: list[dict[str, Any]] | None = None, *, batch_size: int | None = None) -> None:
        """Switch to supervised fine-tuning (torchforge's apps/sft on the same trainer), e.g. a warm start.

        ``examples``: ``{"request": ..., "response": ...}`` pairs (``target`` stands in for ``response``);
        None imitates the task's own targets. The loops stop at a step boundary; then ``start()``,
        ``step(n)``, ``pause()``, ``set(lr=...)`` and ``stop()`` drive SFT steps, which record metric rows
        with ``sft=1`` and push their weights to the generators like RL steps. ``await run.rl()`` switches back.
        """
        from transformers import AutoTokenizer

        if self.model is None:
            raise RuntimeError(f"run {self.name!r} was built without its model path; spawn it with forge_nb.spawn")
        data = SftData(AutoTokenizer.from_pretrained(self.model), examples=examples, task=self.task,
                       request_len=self.config.max_req_tokens, response_len=self.config.max_res_tokens,
                       pad_id=self.pad_id, batch_size=batch_size or self.config.batch_size, seed=self.config.seed)
        await self._switch("sft")
        self.sft_data = data
        self.metrics.event("mode", mode="sft", examples=len(data) or "task", batch_size=data.batch_size)

    async def rl(self) -> None:
        """Switch back from SFT to the RL loops (after ``sft()``); ``start()`` or ``step(n)`` then runs them."""
        await self._switch("rl")
        self.sft_data = None
        self.metrics.event("mode", mode="rl")

    async def _switch(self, mode: str) -> None:
        self._require_not_shut_down()
        if any(not t.done() for t in self._tasks.values()):
            await self.stop()
        self._tasks.clear()
        self.mode = mode

    async def shutdown(self) -> None:
        """Stop loops, then services, then torchstore; afterwards no process of this run is left."""
        if self.state == "shut down":
            return
        await self.stop()
        from forge_nb import weights

        for service in (self.policy, self.ref_model, self.trainer):
            if service is not None:
                await service.shutdown()
        await weights.shutdown_store()
        self._set_state("shut down")
        for exporter in self.exporters:
            exporter.close()

    def set(self, **changes: Any) -> dict[str, Any]:
        """Queue hyperparameter changes for the next step boundary; returns what is pending."""
        known = (*self.trainer_hparams, *SAMPLING_HPARAMS, *RUN_HPARAMS)
        unknown = sorted(set(changes) - set(known))
        if unknown:
            raise ValueError(f"run.set(): unknown name(s) {unknown}; hot-changeable: {sorted(known)}")
        if "max_tokens" in changes and not 1 <= int(changes["max_tokens"]) <= self.config.max_res_tokens:
            raise ValueError(f"max_tokens={changes['max_tokens']}: must be between 1 and max_res_tokens="
                             f"{self.config.max_res_tokens} (longer responses would be cut in training)")
        if changes.get("beta") and self.ref_model is None:
            raise ValueError(f"beta={changes['beta']}: the KL penalty needs reference logprobs and this run has no "
                             "ReferenceModel; spawn it with use_reference=True (or keep beta=0)")
        if "difficulty" in changes and not hasattr(self.task, "difficulty"):
            raise ValueError(f"difficulty: the task {type(self.task).__name__} has no difficulty to change")
        self._pending.update(changes)
        if not self._running.is_set():  # no step is running: the boundary is now
            asyncio.get_running_loop().create_task(self.apply_changes(), name=f"forge_nb.{self.name}.set")
        return dict(self._pending)

    async def apply_changes(self) -> None:
        """Apply queued changes (called by the training loop between steps); records a "set" event.

        Serialized: a step never starts while changes queued before it are still being applied."""
        async with self._apply_lock:
            await self._apply_pending()

    async def _apply_pending(self) -> None:
        if not self._pending:
            return
        changes, self._pending = self._pending, {}
        trainer_part = {k: v for k, v in changes.items() if k in self.trainer_hparams}
        if trainer_part:
            await self.trainer.set_hparams.call(**trainer_part)
        for key in SAMPLING_HPARAMS:
            if key in changes:
                self.sampling_overrides[key] = changes[key]
        if "max_policy_age" in changes:
            self.replay_buffer.max_policy_age = int(changes["max_policy_age"])
        if "difficulty" in changes:
            self.task.difficulty = int(changes["difficulty"])
        self._hparams.update(changes)
        self.metrics.event("set", step=self.current_step, changes=changes)

    # -- called by the loops --------------------------------------------------------------------

    async def wait_until_running(self) -> None:
        await self._running.wait()

    @property
    def rewinds(self) -> int:
        """How many times the run has rewound to a checkpoint; a rollout notes it before generating."""
        return len(self._rewound_to)

    def accept(self, group: list[Episode], rewinds_before: int | None = None) -> None:
        """A finished group: quarantined episodes are recorded and dropped, the rest buffered.

        ``rewinds_before``: ``run.rewinds`` when the group's generation began. Episodes made by weights
        a rewind since then took back (versions above the one it went back to) are dropped as
        ``rolled_back``. The version number alone cannot tell: during a weight update the generators
        already updated make version v+1 while the run still says v, and after a rewind the numbers
        are used again by the new weights."""
        taken_back = min(self._rewound_to[rewinds_before:], default=None) if rewinds_before is not None else None
        for episode in group:
            completion = episode.completion
            self._gen_tokens += len(completion.token_ids) if completion is not None else 0
            self._recent.append({
                "episode_id": episode.episode_id, "prompt": completion.prompt if completion else None,
                "response": completion.text if completion else None, "target": episode.target,
                "reward": episode.reward, "advantage": episode.advantage, "version": episode.policy_version,
                "quarantine": episode.quarantine})
            self._ledger["accepted"] += 1
            if episode.quarantine:
                self._ledger["quarantined"] += 1
                self.metrics.event("quarantine", episode_id=episode.episode_id, reason=episode.quarantine)
            elif taken_back is not None and (episode.policy_version or 0) > taken_back:
                self._ledger["rolled_back"] += 1
            else:
                self.replay_buffer.add(episode)
        if len(self.replay_buffer) >= self.buffer_limit:
            self.collect_allowed.clear()
        self.batch_ready.set()

    @property
    def buffer_limit(self) -> int:
        """Episodes buffered before rollouts wait: one batch in sync mode, max_policy_age + 1 in async."""
        batch = self.config.batch_size
        return batch if self.config.loop.mode == "sync" else batch * (self.replay_buffer.max_policy_age + 1)

    def set_version(self, version: int) -> None:
        self.version = version
        for replica in self.policy.replicas:
            if replica.healthy:
                replica.version = version

    async def drop_old_weights(self) -> None:
        """Keep only the current version in torchstore (and any a catching-up generator is loading)."""
        from forge_nb import weights

        for version in await weights.stored_versions():
            if version != self.version and self._pinned[version] <= 0:
                await weights.drop_version(version)

    def take_generated_tokens_per_s(self) -> float:
        now = time.monotonic()
        rate = self._gen_tokens / max(now - self._gen_since, 1e-9)
        self._gen_tokens, self._gen_since = 0, now
        return rate

    async def after_step(self) -> None:
        every = self.config.loop
        if every.eval_every and self.current_step % every.eval_every == 0:
            values = await loops.evaluate(self, every.eval_prompts)
            self.metrics.event("eval", **values)
            self.metrics.rows[-1].update(values)
        if every.checkpoint_every and self.current_step % every.checkpoint_every == 0:
            await self.checkpoint()

    async def checkpoint(self) -> str:
        """Trainer checkpoint, buffer snapshot and the run's counters, in the run directory."""
        path = (await self.trainer.save_checkpoint.call(self.version))[0]
        self.dir.save_state(step=self.current_step, version=self.version, buffer=self.replay_buffer.state_dict(),
                            hparams=self._hparams, ledger=dict(self._ledger), mode=self.mode)
        self.metrics.event("checkpoint", path=path, version=self.version)
        return path

    async def recover_trainer_if_it_died(self) -> bool:
        """Called by the training loops before each step. A trainer process that died between steps is
        respawned by its service with its last complete checkpoint, and a later call would succeed
        without a word: the run must rewind to that checkpoint all the same. True if it did."""
        if self._trainer_failures() == self._trainer_failures_seen:
            return False
        await self.recover_trainer("the trainer's process died between steps")
        return True

    def _trainer_failures(self) -> int:
        return sum(r.failures for r in self.trainer.replicas)

    async def recover_trainer(self, reason: str) -> None:
        """The trainer died mid-step. Its service respawns it and it loads its last complete checkpoint
        (or its initial weights); the run rewinds to that point, visibly, and goes on."""
        self.metrics.event("trainer_died", step=self.current_step, reason=reason[:300])
        info = (await self.trainer.info.call())[0]  # waits for the respawned, restored trainer
        self._trainer_failures_seen = self._trainer_failures()
        state = self.dir.load_state() or {"step": 0, "version": 0}
        from_step, from_version = self.current_step, self.version
        self.current_step, self.version = int(state["step"]), int(info["step"])
        self._rewound_to.append(self.version)
        self.clear_buffer("made by weights the rewind took back")
        await self.trainer.push_weights.call(self.version)
        await self.policy.update_weights.fanout(self.version)
        self.set_version(self.version)
        await self.drop_old_weights()
        self.metrics.event("rewind", from_step=from_step, to_step=self.current_step, from_version=from_version,
                           version=self.version, message="the trainer restarted from its last complete checkpoint")

    async def _catch_up(self, replica: Any) -> None:
        """A (re)spawned generator loads the current weights before it takes traffic.

        Training goes on meanwhile, and each step drops the older versions from torchstore; the version
        being loaded is pinned (``drop_old_weights`` keeps it) so it is not deleted mid-read. The replica
        may come back a few versions behind: the next step's weight sync brings it current, and the
        buffer's ``max_policy_age`` governs what it generates until then."""
        version = self.version
        if version > 0:
            self._pinned[version] += 1
            try:
                await replica.actor.update_weights.call_one(version)
            finally:
                self._pinned[version] -= 1
        replica.version = version

    # -- internals ------------------------------------------------------------------------------

    async def _no_step_in_flight(self, timeout: float | None = None) -> None:
        """Return once the training loop is parked between steps (or not running); TimeoutError after
        ``timeout``. Re-checked after every wake-up, with no await between the last check and the return:
        the loop may start a step between the event being set and this task running. Cancelling a step in
        flight would lose its episodes from the ledger and could leave the trainer an optimizer step ahead
        of the run's version."""
        training = self._training_task()
        deadline = None if timeout is None else time.monotonic() + timeout
        while training is not None and not training.done() and not self.training_idle.is_set():
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            await asyncio.wait_for(self.training_idle.wait(), left)

    def _require_not_shut_down(self) -> None:
        if self.state in ("stopping", "shut down"):
            raise RuntimeError(f"run {self.name!r} is {self.state}; spawn a new one (forge_nb.spawn)")

    def _training_task(self) -> asyncio.Task[None] | None:
        return self._tasks.get("sft" if self.mode == "sft" else "train")

    def _set_state(self, state: str) -> None:
        if state != self.state:
            self.state = state
            self.metrics.event("state", state=state)

    def _loop_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        name = task.get_name()
        if error is None:
            error = RuntimeError(f"loop {name} returned; loops run until stopped")
        self.error = f"{name}: {type(error).__name__}: {error}"
        logger.error("run %s stopped: loop %s raised", self.name, name, exc_info=error)
        self.metrics.event("error", loop=name, error=self.error)
        self._running.clear()
        self._set_state("failed")
        if self._steps_waiter is not None and not self._steps_waiter.done():
            self._steps_waiter.set_exception(RuntimeError(self.error))
        asyncio.get_running_loop().create_task(self._stop_after_failure(), name=f"forge_nb.{self.name}.cleanup")

    async def _stop_after_failure(self) -> None:
        """The other loops stop as ``stop()`` stops them: a training step in flight finishes (and is
        counted) before anything is cancelled."""
        try:
            await self._no_step_in_flight(timeout=120.0)
        finally:
            await self._cancel_loops()

    async def _cancel_loops(self) -> None:
        tasks = [t for t in self._tasks.values() if not t.done() and t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
