"""Controller: the loops of one run, their events and counters, as named asyncio tasks in the kernel.

The loops' picture and backpressure: ``forge_nb.controller``'s docstring; states: ``forge_nb.controller.state``;
checkpoints, resumes and rewinds: ``forge_nb.controller.checkpoints`` (the ``Checkpoints`` base class).

Rules: a paused run stops rollouts after their in-flight generation and training after its step. Nothing
cancels a training step in flight: ``stop()`` waits until the training loop is parked at a boundary
(``training_idle``), then cancels every loop. A loop that raises or returns stops the run with its name and
error (``_loop_done``): ``error`` keeps it, an "error" event records it, the other loops stop as ``stop()``
stops them. A full disk at a checkpoint pauses the run with ``DiskFull`` (a "disk_full" event). A trainer
that dies is respawned by its service with its last complete checkpoint, and the run rewinds to it, visibly.
Only the controller (and ``controller.outside``) writes ``step``, state and ledger; ``WeightSync`` the version."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from forge_nb.controller.checkpoints import Checkpoints
from forge_nb.controller.context import EpisodeFn, RolloutContext
from forge_nb.controller.episodes import episode_row
from forge_nb.controller.evaluate import eval_step
from forge_nb.controller.hot import HotChanges
from forge_nb.controller.intake.dynamic import GroupGate
from forge_nb.controller.intake.ledger import Ledger
from forge_nb.controller.intake.quarantine import QuarantineWatch
from forge_nb.controller.loop import Batch, RLBatches, SFTBatches, loads_overlap, would_be_too_old
from forge_nb.controller.state import RunState, transition
from forge_nb.controller.weight_sync import WeightSync
from forge_nb.metrics import MetricsStore
from forge_nb.rl import Episode, ReplayBuffer
from forge_nb.service import ReplicaDied
from forge_nb.service.errors import last_line
from forge_nb.system.diskspace import DiskFull
from forge_nb.system.processes.proclogs import run_context

logger = logging.getLogger(__name__)


class Controller(Checkpoints):
    """Loops, events and counters of one run (see the module docstring)."""

    def __init__(self, *, context: RolloutContext, trainer: Any, buffer: ReplayBuffer, ledger: Ledger,
                 sync: WeightSync, hot: HotChanges, metrics: MetricsStore, directory: Any, episode_fn: EpisodeFn):
        self.context = context  # what episode functions receive: the run's config, policy, task, rewards, ...
        self.config, self.trainer, self.policy, self.task = context.config, trainer, context.policy, context.task
        self.buffer, self.ledger, self.sync, self.hot = buffer, ledger, sync, hot
        self.metrics, self.dir, self.episode_fn = metrics, directory, episode_fn
        self.name, self.state, self.error, self.mode, self.step = context.name, RunState.READY, None, "rl", 0
        self.sft_data: Any = None
        self.recent: deque[dict[str, Any]] = deque(maxlen=2000)
        self.quarantine = QuarantineWatch(window=max(32, 4 * self.config.batch_size))
        self.gate = GroupGate(self.config.rollout, ledger)  # what a finished group passes (controller.dynamic)
        self._cleanup: asyncio.Task[None] | None = None  # stops the loops of a run that failed
        self._tasks: dict[str, asyncio.Task[None]] = {}
        self._running = asyncio.Event()
        self.collect_allowed, self.batch_ready = asyncio.Event(), asyncio.Event()
        self.collect_allowed.set()
        self.training_idle = asyncio.Event()  # set while the training loop is between steps
        self._steps_left: int | None = None  # run_steps' budget, and its waiter
        self._steps_waiter: asyncio.Future[None] | None = None
        self._rewound_to: list[int] = []  # the version each rewind went back to, in order
        self._generating = 0  # episodes the rollout loops are generating now
        self._gen_tokens, self._gen_since = 0, time.monotonic()
        self._trainer_failures_seen = self._trainer_failures()

    # -- control ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start (or resume) the loops in the background."""
        self.require_not_shut_down()
        if self._cleanup is not None and not self._cleanup.done():  # failed loops still stopping: start after
            self._cleanup.add_done_callback(lambda _: self.start())
            return
        if self.error is not None:  # the user fixed the cause (e.g. replaced run.episode_fn): go on
            self.metrics.event("restart", after_error=self.error)
            self.error = None
            self.quarantine.reset()
        loop = asyncio.get_running_loop()
        wanted: dict[str, Callable[[], Awaitable[None]]] = {}  # "outside": no loops (controller.outside)
        if self.mode == "sft":
            wanted = {"sft": self._training_loop}
        elif self.mode == "rl":
            wanted = {"train": self._training_loop} | {
                f"rollout{i}": (lambda i=i: self._rollout_loop(i)) for i in range(self.config.loop.rollout_loops)}
        for name, make in wanted.items():
            if name not in self._tasks or self._tasks[name].done():
                task = loop.create_task(make(), name=f"forge_nb.{self.name}.{name}", context=run_context(self.name))
                task.add_done_callback(self._loop_done)
                self._tasks[name] = task
        self.set_state(RunState.RUNNING)
        self._running.set()

    def pause(self) -> None:
        self._running.clear()
        if self.state is RunState.RUNNING:
            self.set_state(RunState.PAUSED)

    async def run_steps(self, n: int) -> int:
        """Run exactly ``n`` training steps, then pause (a step already in flight is not one of them); returns
        the index in ``metrics.rows`` of the first. One rule for a budget still pending (``run.step``,
        ``%forge_step``, ``%forge_run --steps``, the dashboard): the new one replaces it at the step boundary,
        and the older call returns then with the steps it got; ``drop_budget`` (``run.start()``) ends it
        without a new one. Pausing keeps it: ``run.resume()`` goes on with the steps it has left."""
        self.pause()
        await self.no_step_in_flight()
        self.drop_budget()  # a pending one returns with the steps it got
        first, self._steps_left = len(self.metrics.rows), n
        self._steps_waiter = asyncio.get_running_loop().create_future()
        self.start()
        await self._steps_waiter
        return first

    def drop_budget(self) -> None:
        """No step budget from now on: a pending ``run_steps`` returns with the steps it got (the same rule as
        a new budget replacing it) and the loops train on until paused or stopped (``run.start()``)."""
        self._steps_left = None
        if self._steps_waiter is not None and not self._steps_waiter.done():
            self._steps_waiter.set_result(None)

    async def stop(self, timeout: float = 120.0) -> None:
        """Stop the loops at a step boundary (services stay up; ``start()`` continues)."""
        self.pause()
        try:
            await self.no_step_in_flight(timeout)
        except TimeoutError:
            logger.warning("run %s: the training step did not finish in %ss; cancelling it", self.name, timeout)
        await self._cancel_loops()  # cancels synchronously, before its first await: no step can start
        try:
            await self.sync.settle()  # a weight load still in flight (the loop parked waiting for a batch)
        except Exception as error:  # the next publish loads the generators again; recorded, not raised
            self.metrics.event("weight_load_failed", error=f"{type(error).__name__}: {error}"[:300])
        self._report_quarantine()  # what was quarantined since the last report, now that nothing runs
        if self.state is not RunState.FAILED:
            self.set_state(RunState.STOPPED)

    async def switch(self, mode: str) -> None:
        """Stop the loops (at a step boundary) and make ``mode`` ("rl", "sft" or "outside") the next start's."""
        self.require_not_shut_down()
        if any(not t.done() for t in self._tasks.values()):
            await self.stop()
        self._tasks.clear()
        self.mode = mode

    def loops(self) -> dict[str, str]:
        return {n: ("running" if not t.done() else "done") for n, t in self._tasks.items()}

    def require_not_shut_down(self) -> None:
        if self.state is RunState.SHUT_DOWN:
            raise RuntimeError(f"run {self.name!r} is shut down; spawn a new one (forge_nb.spawn)")

    def set_state(self, state: RunState) -> None:
        """The run's state, if ``forge_nb.controller.state`` allows the move; a "state" event records it."""
        state = transition(self.state, state)
        if state != self.state:
            self.state = state
            self.metrics.event("state", state=state.value)

    def shut_down(self) -> None:
        """The run's services are gone (``Run.shutdown``): nothing can start it again."""
        self.set_state(RunState.SHUT_DOWN)

    @property
    def running(self) -> bool:
        return self._running.is_set()

    # -- rollouts --------------------------------------------------------------------------------

    async def _rollout_loop(self, index: int) -> None:
        """Sample a prompt, make a group, hand it over; forever, pausing when the run pauses."""
        while True:
            await self._running.wait()
            await self.collect_allowed.wait()
            if would_be_too_old(self, self._generating):
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.sync.next_load(), 1.0)  # re-checked at least once a second
                continue
            sample = self.task.sample()
            rewinds = len(self._rewound_to)
            self._generating += self.config.group_size
            try:
                group = await self.episode_fn(self.context, sample)
            finally:
                self._generating -= self.config.group_size
            self.accept(self.gate.admit(group), rewinds_before=rewinds)

    def accept(self, group: list[Episode], rewinds_before: int | None = None) -> None:
        """A finished group: quarantined episodes are counted and dropped, the rest buffered.

        ``rewinds_before``: the rewinds when the group's generation began; episodes of weights a rewind since
        then took back (versions above the one it went back to, whose numbers come again) end ``rolled_back``."""
        taken_back = min(self._rewound_to[rewinds_before:], default=None) if rewinds_before is not None else None
        for episode in group:
            completion = episode.completion
            self._gen_tokens += len(completion.token_ids) if completion is not None else 0
            self.recent.append(episode_row(episode))
            self.ledger.accept()
            self.quarantine.note(episode.quarantine, episode.quarantine_error)
            if episode.quarantine:
                self.ledger.end("quarantined")
            elif taken_back is not None and (episode.policy_version or 0) > taken_back:
                self.ledger.end("rolled_back")
            else:
                self.buffer.add(episode)
        if len(self.buffer) >= self.buffer_limit:
            self.collect_allowed.clear()
        self.batch_ready.set()
        if self.quarantine.due():
            self._report_quarantine()
        if (why := self.quarantine.overwhelmed()) is not None and self._running.is_set():
            self._report_quarantine()
            self._stop_with(why.message, event="quarantine_pause", error=why.error())

    def _report_quarantine(self) -> None:
        """One "quarantine" event per interval: episodes per reason and the last message of each."""
        if (report := self.quarantine.flush()) is not None:
            self.metrics.event("quarantine", **report)

    def _stop_with(self, message: str, event: str, error: BaseException | None = None) -> None:
        """Pause the run because of ``message`` (kept in ``error``); a waiting ``run.step(n)`` raises ``error``/it."""
        self.error = message
        logger.error("run %s paused: %s", self.name, message)
        self.metrics.event(event, message=message)
        self.pause()
        self._tell(f"run {self.name!r} paused: {message}", error=error or message)

    def _tell(self, line: str, error: str | BaseException) -> None:
        """What stopped the run reaches the user: a waiting ``run.step(n)`` raises ``error`` (its cell shows
        it); with nobody waiting (after ``run.start()``), ``line`` is printed once, to the cell's stderr."""
        if self._steps_waiter is not None and not self._steps_waiter.done():
            self._steps_left = None
            self._steps_waiter.set_exception(error if isinstance(error, BaseException) else RuntimeError(error))
        else:
            print(f"forge_nb: {line}", file=sys.stderr)

    @property
    def buffer_limit(self) -> int:
        """Episodes buffered before rollouts wait: one batch in sync mode, max_policy_age + 1 in async."""
        return self.config.batch_size * (1 if self.config.loop.mode == "sync" else self.buffer.max_policy_age + 1)

    def clear_buffer(self, reason: str) -> int:
        """Drop every buffered episode, counted in the ledger and recorded as an event."""
        n = len(self.buffer)
        self.ledger.end("cleared", n)
        self.buffer.clear()
        self.metrics.event("buffer_cleared", episodes=n, reason=reason)
        return n

    # -- training --------------------------------------------------------------------------------

    async def _training_loop(self) -> None:
        """Take a batch, train it, publish the weights, record the step; one step at a time. One loop for RL
        and SFT: only where batches come from differs (``forge_nb.controller.loop``)."""
        source = SFTBatches(self) if self.mode == "sft" else RLBatches(self)
        try:
            while True:
                if not await self._step_boundary():
                    continue
                batch = await source.take()
                if batch is None:
                    continue
                recorded = await self._train_one_step(source, batch)
                source.after()
                if recorded and await self._step_budget_spent():
                    continue
                if (most := self.config.loop.max_steps) is not None and self.step >= most:
                    self.metrics.event("done", message=f"reached loop.max_steps={most}")
                    self.pause()
        finally:  # cancelled mid-step or failed: either way no step is in flight any more
            self.training_idle.set()

    async def _step_boundary(self) -> bool:
        """Between steps: park (``training_idle`` set, so ``stop()`` may cancel the loop) until the run
        is running; from then on a step may be in flight, so ``stop()`` waits for it instead. A trainer
        that died meanwhile rewinds the run first (False: start over); otherwise the queued hot changes
        are applied and the step may begin (True), unless the run was paused meanwhile (False: park again;
        ``resume(); pause()`` in one cell wakes the loop after ``_running`` was cleared: no step begins)."""
        if not self._running.is_set():
            await self._settle()  # parked, the generators have the run's version (run.version)
        self.training_idle.set()
        while not self._running.is_set():
            await self._running.wait()
        self.training_idle.clear()
        if self._trainer_failures() != self._trainer_failures_seen:
            await self.recover_trainer("the trainer's process died between steps")
            return False
        await self.hot.apply(self.step)
        return self._running.is_set()

    async def _train_one_step(self, source: RLBatches | SFTBatches, batch: Batch) -> bool:
        """train -> WeightSync.publish, with the step's metrics recorded; False when the step was lost with
        the trainer's process (nothing recorded: the run rewound)."""
        t0 = time.perf_counter()
        try:
            out = await source.train(batch)
        except ReplicaDied as error:  # the step is lost with its process; rewind to the last checkpoint
            source.settle(batch, "trainer_died")
            await self.recover_trainer(str(error))
            return False
        except Exception:  # the trainer raised: the run stops with this error (_loop_done)
            source.settle(batch, "failed_step")
            raise
        t1 = time.perf_counter()
        trained = not self._skipped(out)
        source.settle(batch, "trained" if trained else "skipped_step")
        if trained and not await self._publish(out):
            return False
        out.update(source.row(batch))
        await self._record_step(out, t0, t1, batch.waited_s)
        return True

    def _skipped(self, out: dict[str, Any]) -> bool:
        """Whether the trainer skipped the step (non-finite loss or gradient); records a "skip" event if so."""
        if not out.get("skipped"):
            return False
        reason = next((k.split("/", 1)[1] for k in out if k.startswith("skipped/")), "non-finite")
        self.metrics.event("skip", step=self.step + 1, reason=reason, loss=out.get("loss"))
        return True

    async def _publish(self, out: dict[str, Any]) -> bool:
        """The next version to every generator (in async mode loaded while the next step trains: WeightSync);
        False when the trainer died before its push (the run has then rewound to its last checkpoint)."""
        try:
            version = self.sync.version + 1
            out.update(await self.sync.publish(version, overlap=loads_overlap(self),
                                               hold=version % self.config.loop.sync_interval != 0))
        except ReplicaDied as error:  # trained but not pushed: the checkpoint is the truth
            await self.recover_trainer(str(error))
            return False
        return True

    async def _record_step(self, out: dict[str, Any], t0: float, t1: float, wait_s: float) -> None:
        """Count the step, record its row, then the periodic work (evaluation, checkpoint)."""
        self.step += 1
        if "step" in out:  # the trainer's own count of optimizer steps: it goes back with a rewind, ours does not
            out["trainer/step"] = out.pop("step")
        out.update({"time/wait_batch_s": wait_s, "time/train_s": t1 - t0, "time/step_s": time.perf_counter() - t0,
                    "version": self.sync.version, "buffer/size": len(self.buffer)})
        out["tokens_per_s/train"] = (out.get("tokens") or 0) / max(t1 - t0, 1e-9)
        every = self.config.loop
        if every.eval_every and self.step % every.eval_every == 0:  # this step's version, settled and pinned
            out.update(await eval_step(self, self._settle))  # in the step's row, on disk as in memory
        self.metrics.record(self.step, out)
        if self.quarantine.due():
            self._report_quarantine()
        if every.checkpoint_every and self.step % every.checkpoint_every == 0:
            try:
                await self.checkpoint()
            except DiskFull as full:  # the step counts; the run waits for room, then run.start() goes on
                self._stop_with(str(full), event="disk_full", error=full)

    async def _step_budget_spent(self) -> bool:
        """After each step: True when ``run_steps(n)``'s budget ran out: the run pauses, the weights load."""
        if self._steps_left is None:
            return False
        self._steps_left -= 1
        if self._steps_left > 0:
            return False
        self._steps_left = None
        self.pause()
        await self._settle()
        if self._steps_waiter is not None and not self._steps_waiter.done():
            self._steps_waiter.set_result(None)
        return True

    async def _settle(self) -> None:
        """The generators get the run's version (``WeightSync.settle``); a trainer that died before it pushed a
        held version is left to the next step boundary, which rewinds the run to its last checkpoint."""
        try:
            await self.sync.settle()
        except ReplicaDied as e:
            logger.warning("run %s: the trainer died before pushing version %s: %s", self.name, self.sync.version, e)

    def generated_tokens_per_s(self) -> float:
        """Tokens generated per second since the last call (each step's row)."""
        now = time.monotonic()
        rate = self._gen_tokens / max(now - self._gen_since, 1e-9)
        self._gen_tokens, self._gen_since = 0, now
        return rate

    # -- stopping --------------------------------------------------------------------------------

    async def no_step_in_flight(self, timeout: float | None = None) -> None:
        """Return once the training loop is parked between steps (or not running); TimeoutError after ``timeout``.
        Re-checked at every wake-up. Cancelling a step in flight would lose its episodes and the version."""
        training = self._tasks.get("sft" if self.mode == "sft" else "train")
        deadline = None if timeout is None else time.monotonic() + timeout
        while training is not None and not training.done() and not self.training_idle.is_set():
            left = None if deadline is None else max(deadline - time.monotonic(), 0.0)
            async with asyncio.timeout(left):
                await self.training_idle.wait()

    def _loop_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error, name = task.exception(), task.get_name()
        if self.state is RunState.FAILED:  # the run already stopped with the first failure; this one is logged
            logger.info("run %s: loop %s also raised after the run failed: %r", self.name, name, error)
            return
        if error is None:
            error = RuntimeError(f"loop {name} returned; loops run until stopped")
        self.error = f"{name}: {type(error).__name__}: {error}"
        logger.error("run %s stopped: loop %s raised", self.name, name, exc_info=error)  # to its kernel.log
        self.metrics.event("error", loop=name, error=self.error)
        self._running.clear()
        self.set_state(RunState.FAILED)
        self._tell(f"run {self.name!r} stopped: loop {name} raised {type(error).__name__}: {last_line(error)}\n"
                   "  fix the cause, then run.start() (%forge_run); the traceback: run.logs('kernel') "
                   "(%forge_logs kernel)", error=self.error)
        self._cleanup = asyncio.get_running_loop().create_task(self._stop_after_failure(),
                                                               name=f"forge_nb.{self.name}.cleanup")

    async def _stop_after_failure(self) -> None:
        """The other loops stop as ``stop()`` stops them: a step in flight finishes (and is counted) first."""
        try:
            await self.no_step_in_flight(timeout=120.0)
        finally:
            await self._cancel_loops()

    async def _cancel_loops(self) -> None:
        """Cancel the loops and wait until they are done; one that swallowed the cancellation (a user's
        episode function; asyncio.wait_for on 3.11) is cancelled again rather than waited for forever."""
        tasks = [t for t in self._tasks.values() if not t.done() and t is not asyncio.current_task()]
        while tasks:
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks, timeout=5.0)
            tasks = [t for t in tasks if not t.done()]
            if tasks:
                logger.warning("run %s: %s did not stop when cancelled; cancelling again", self.name,
                               [t.get_name() for t in tasks])
