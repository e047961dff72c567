"""Run: the user's handle on one experiment: controls, hot changes, metrics, episodes, checkpoint, shutdown.

``run = await forge_nb.spawn(cfg)`` brings the services up and returns a Run; then, from any cell::

    run.start() / run.pause() / run.resume()      loops in the background; the cell returns at once
    await run.step(n)                            exactly n training steps, then pause
    run.set(lr=3e-4, temperature=0.7)            applied at the next step boundary, recorded as an event
    run.metrics.frame(), run.episodes(20)        what happened
    await run.sft(examples) / await run.rl()     the same controls over supervised or RL steps
    run.export("tensorboard"), await run.checkpoint(), await run.stop(), await run.shutdown()

The loops, their events and counters belong to the run's ``Controller`` (``forge_nb.controller``);
its weight versions to a ``WeightSync`` with a key namespace of its own, so several runs train side
by side in one kernel; its books to a ``Ledger``. This class only delegates and validates.
Shutdown order: loops (at a step boundary), then services (generators, reference, trainer), then
the run's weights and its torchstore lease (the store stops when no run or service holds it).
"""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

from forge_nb import _proclogs as proclogs
from forge_nb import rundir
from forge_nb._leftovers import remove_leftovers
from forge_nb.config import RunConfig, check_change
from forge_nb.controller import Controller, EpisodeFn, HotChanges, Ledger, WeightSync, generate_episode
from forge_nb.controller.state import RunState
from forge_nb.metrics import MetricsStore
from forge_nb.rl import ReplayBuffer
from forge_nb.sft import SftData

logger = logging.getLogger(__name__)

__all__ = ["EpisodeFn", "Run"]


class Run:
    """Services, loops, metrics and controls of one experiment (see the module docstring)."""

    def __init__(self, config: RunConfig, *, policy: Any, trainer: Any, ref_model: Any, task: Any,
                 reward_fns: list[Any], pad_id: int, directory: rundir.RunDir, sync: WeightSync,
                 hot_routes: dict[str, str], hot_values: dict[str, Any], episode_fn: EpisodeFn | None = None,
                 model: str | None = None):
        self.config, self.name = config, config.name
        self.policy, self.trainer, self.ref_model = policy, trainer, ref_model
        self.task, self.reward_fns, self.pad_id = task, reward_fns, pad_id
        self.dir, self.model = directory, model
        self.exporters: list[Any] = []
        self.openai: Any = None  # the OpenAI-compatible endpoint, once serve_openai() started it
        self._kernel_log = proclogs.KernelLog(directory.logs)  # forge_nb's own records: to a file, not cells
        self.metrics = MetricsStore(directory.path)
        self.replay_buffer = ReplayBuffer(batch_size=config.batch_size, max_policy_age=config.max_policy_age,
                                          seed=config.seed)
        self._ledger = Ledger(self.replay_buffer)
        self._hot = HotChanges(hot_routes, hot_values, check=self._check_change, trainer=trainer,
                               buffer=self.replay_buffer, task=task,
                               record=lambda changes: self.metrics.event("set", step=self.current_step,
                                                                         changes=changes),
                               refused=self._change_refused, policy=policy)
        sync.attach(trainer, policy)
        self._sync = sync
        self._ctl = Controller(self, config=config, trainer=trainer, policy=policy, task=task,
                               buffer=self.replay_buffer, ledger=self._ledger, sync=sync, hot=self._hot,
                               metrics=self.metrics, directory=directory, episode_fn=episode_fn or generate_episode)
        policy.set_catch_up(sync.catch_up)
        for name, service in self.services.items():
            service.subscribe(lambda e, name=name: self.metrics.event(
                "replica", service=name, replica=e.replica, old=e.old, new=e.new, reason=e.reason))

    # -- what cells, widgets and magics read -----------------------------------------------------

    @property
    def services(self) -> dict[str, Any]:
        found = {"policy": self.policy, "trainer": self.trainer, "ref_model": self.ref_model}
        return {k: v for k, v in found.items() if v is not None}

    @property
    def state(self) -> RunState:
        """"ready", "running", "paused", "stopped", "failed" or "shut down" (a str; transitions:
        ``forge_nb.controller.state``)."""
        return self._ctl.state

    @property
    def error(self) -> str | None:
        """The error that stopped the run ("<loop>: <type>: <message>"), until it is started again."""
        return self._ctl.error

    @property
    def mode(self) -> str:
        return self._ctl.mode

    @property
    def current_step(self) -> int:
        return self._ctl.step

    @property
    def version(self) -> int:
        """The weight version every healthy generator has."""
        return self._sync.version

    @property
    def weights_namespace(self) -> str:
        """This run's torchstore key namespace (its versions are ``<namespace>.v<N>``)."""
        return self._sync.namespace

    @property
    def training_idle(self) -> Any:
        """An asyncio.Event set while no training step is in flight."""
        return self._ctl.training_idle

    @property
    def episode_fn(self) -> EpisodeFn:
        """``async def fn(run, sample) -> list[Episode]`` the rollout loops call; assign to replace it."""
        return self._ctl.episode_fn

    @episode_fn.setter
    def episode_fn(self, fn: EpisodeFn) -> None:
        if not callable(fn):
            raise TypeError(f"run.episode_fn = {fn!r}: needs `async def fn(run, sample) -> list[Episode]`")
        self._ctl.episode_fn = fn

    @property
    def sampling_overrides(self) -> dict[str, Any]:
        """Sampling parameters ``run.set`` changed (temperature, top_p, max_tokens), for ``generate``."""
        return self._hot.sampling

    @property
    def hparams(self) -> dict[str, Any]:
        """Current values of the hot-changeable hyperparameters (pending changes not yet applied)."""
        return dict(self._hot.values)

    @property
    def pending(self) -> dict[str, Any]:
        """Changes ``set`` queued for the next step boundary."""
        return dict(self._hot.pending)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "state": self.state, "error": self.error, "step": self.current_step,
                "version": self.version, "mode": self.mode, "buffer": len(self.replay_buffer),
                "loops": self._ctl.loops(), "services": {n: s.status() for n, s in self.services.items()},
                "last": self.metrics.last(), "pending": self.pending, "run_dir": str(self.dir.path),
                "health": self.health, "ledger": self.ledger(), "job": self.job,
                "openai": self.openai.status() if self.openai is not None else None}

    @property
    def job(self) -> dict[str, Any] | None:
        """The monarch job the run's hosts come from (``forge_nb.cluster.Cluster.status``: a SLURM job's id,
        state and nodes, each host alive or why lost), or None: everything runs on the kernel's host."""
        from forge_nb import cluster

        job = cluster.current()
        return job.status() if job is not None else None

    @property
    def health(self) -> str:
        """"ok"; "degraded" while some replica is not healthy; "down" while a service has none healthy."""
        states = {name: [r.state for r in svc.replicas] for name, svc in self.services.items()}
        if any("healthy" not in s for s in states.values()):
            return "down"
        return "ok" if all(st == "healthy" for s in states.values() for st in s) else "degraded"

    def ledger(self) -> dict[str, Any]:
        """Where every accepted episode went; ``balanced`` says the books add up (``forge_nb.controller.ledger``)."""
        return self._ledger.books()

    def episodes(self, n: int = 50, version: int | None = None, min_reward: float | None = None,
                 max_reward: float | None = None) -> list[dict[str, Any]]:
        """The most recent episodes (newest last), optionally filtered by version and reward."""
        rows = [r for r in self._ctl.recent
                if (version is None or r["version"] == version)
                and (min_reward is None or (r["reward"] is not None and r["reward"] >= min_reward))
                and (max_reward is None or (r["reward"] is not None and r["reward"] <= max_reward))]
        return rows[-n:]

    def logs(self, service: str | None = None, index: int | None = None, n: int = 40,
             level: str | None = None) -> str:
        """The last ``n`` lines its processes wrote (vLLM, monarch, torch: they go to ``<run_dir>/logs``,
        not to the cells): of one service ("policy", "trainer", "ref_model") and replica ``index``, of
        the kernel's forge_nb records ("kernel": a failed loop's traceback, for one), or of all;
        ``level="warning"`` or ``"error"`` keeps only those (and an error's traceback)."""
        meshes = {"policy": "policy", "trainer": "trainer", "ref_model": "ref", "kernel": "kernel"}
        if service is not None and service != "kernel" and service not in self.services:
            raise ValueError(f"service={service!r}: this run has {sorted(self.services)} (and 'kernel', "
                             "forge_nb's own records in the kernel)")
        if service == "kernel":
            return "\n".join(proclogs.read([self.dir.logs / proclogs.KERNEL_LOG], n, level))
        base = f"{self.name}-{meshes[service]}" + (f"-r{index}" if index is not None else "") if service else ""
        paths = [p for p in self.dir.logs.glob("*.log")
                 if not base or p.stem == base or p.stem.startswith(base + "-")]
        return "\n".join(proclogs.read(paths, n, level))

    def __repr__(self) -> str:
        return f"<Run {self.name!r} {self.state}: step {self.current_step}, version {self.version}>"

    # -- control ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Start (or resume) the loops in the background; the cell returns at once."""
        self._ctl.start()

    resume = start

    def pause(self) -> None:
        """Stop at the next boundary: rollouts after their in-flight generation, training after its step."""
        self._ctl.pause()

    async def step(self, n: int = 1) -> list[dict[str, Any]]:
        """Run exactly ``n`` training steps, then pause; returns their metric rows."""
        if not isinstance(n, int) or isinstance(n, bool) or n < 1:
            raise ValueError(f"step(n={n!r}): n must be an integer >= 1")
        first = await self._ctl.run_steps(n)
        return self.metrics.rows[first:]

    async def stop(self, timeout: float = 120.0) -> None:
        """Stop the loops at a step boundary (services stay up; ``start()`` continues)."""
        await self._ctl.stop(timeout)

    def set(self, **changes: Any) -> dict[str, Any]:
        """Queue hyperparameter changes for the next step boundary; returns what is pending.

        A wrong name or value raises and queues nothing. While no step runs, the boundary is now."""
        pending = self._hot.queue(changes)
        if not self._ctl.running:
            asyncio.get_running_loop().create_task(self._hot.apply(), name=f"forge_nb.{self.name}.set")
        return pending

    async def apply_changes(self) -> None:
        """Apply the queued changes now (the training loop does it between steps)."""
        await self._hot.apply()

    def _check_change(self, name: str, value: Any) -> None:
        """Whether ``name=value`` can apply to this run (``forge_nb.config.check_change`` says why not)."""
        check_change(self.config, name, value, task=self.task, current=self._hot.values,
                     loss_fields=[n for n, where in self._hot.routes.items() if where == "trainer"])

    def _change_refused(self, changes: dict[str, Any], reason: str) -> None:
        logger.warning("run %s: run.set(%s) was refused and not applied: %s", self.name, changes, reason)
        self.metrics.event("set_refused", step=self.current_step, changes=changes, reason=reason[:500])
        # the cell that called run.set returned long ago: one line where the user looks, the run trains on
        print(f"forge_nb: run {self.name!r}: run.set({_kwargs(changes)}) was refused and rolled back; the run "
              f"trains on with the old values. Why: {reason[:300]}", file=sys.stderr)  # one line (HotChanges)

    def clear_buffer(self, reason: str) -> int:
        """Drop every buffered episode, counted in the ledger and recorded as an event."""
        return self._ctl.clear_buffer(reason)

    async def checkpoint(self) -> str:
        """Trainer checkpoint, buffer snapshot and the run's counters, in the run directory."""
        return await self._ctl.checkpoint()

    def export(self, kind: str, **options: Any) -> Any:
        """Also send this run's metrics (history first) to "tensorboard", "trackio" or "wandb"; see
        ``forge_nb.exporters``. Returns the exporter (``.close()`` stops it; shutdown closes it)."""
        from forge_nb import exporters

        exporter = exporters.export(self.metrics, kind, run_dir=self.dir.path, run_name=self.name,
                                    config=self.config.to_dict(), **options)
        self.exporters.append(exporter)
        return exporter

    async def serve_openai(self, *, port: int = 0, tool_parser: Any = "hermes", request_timeout_s: float = 600.0,
                           chat_template_kwargs: dict[str, Any] | None = None) -> Any:
        """Serve this run's policy as an OpenAI-compatible endpoint on 127.0.0.1 (``forge_nb.agents``); returns it
        (``.url``, ``.token``, ``.client()``). Served once: a second call returns the same endpoint. It stops
        with the run. ``tool_parser``: how the model writes tool calls, "hermes" (Qwen3 and most open models),
        "simple" (a line "@name argument", the tiny models) or a function."""
        if self.state == "shut down":
            raise RuntimeError(f"run {self.name!r} is shut down; spawn a new run and serve that one")
        if self.openai is None or not self.openai.serving:
            from forge_nb.agents import OpenAIEndpoint

            self.openai = await OpenAIEndpoint.start(self, port=port, tool_parser=tool_parser,
                                                     request_timeout_s=request_timeout_s,
                                                     chat_template_kwargs=chat_template_kwargs)
            self.metrics.event("openai", url=self.openai.url, model=self.openai.model)
        return self.openai

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
        await self._ctl.switch("sft")
        self._ctl.sft_data = data
        self.metrics.event("mode", mode="sft", examples=len(data) or "task", batch_size=data.batch_size)

    async def rl(self) -> None:
        """Switch back from SFT to the RL loops (after ``sft()``); ``start()`` or ``step(n)`` then runs them."""
        await self._ctl.switch("rl")
        self._ctl.sft_data = None
        self.metrics.event("mode", mode="rl")

    async def shutdown(self) -> None:
        """Stop loops, then services, then this run's weights; afterwards no process of this run is left.
        Other runs in the kernel go on: the torchstore they share stops only with its last user."""
        if self.state == "shut down":
            return
        await self.stop()
        try:
            if self.openai is not None:  # nothing may reach the policy once its services stop
                await self.openai.stop()
            for service in (self.policy, self.ref_model, self.trainer):
                if service is not None:
                    await service.shutdown()
        finally:
            await self._sync.close()
            self._ctl.shut_down()
            removed = remove_leftovers(min_age_s=5.0)  # what engines killed during the run could not clean
            if any(removed.values()):
                logger.info("run %s: removed what killed processes left: %s", self.name, removed)
            for exporter in self.exporters:
                exporter.close()
            self._kernel_log.close()


def _kwargs(changes: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in changes.items())

