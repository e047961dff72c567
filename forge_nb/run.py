"""Run: the user's handle on one experiment: controls, hot changes, metrics, episodes, checkpoint, shutdown.

``run = await forge_nb.spawn(cfg)`` brings the services up and returns a Run; then, from any cell::

    run.start() / run.pause() / run.resume()      loops in the background; the cell returns at once
    await run.step(n)                            exactly n training steps, then pause
    run.set(lr=3e-4, temperature=0.7)            applied at the next step boundary, recorded as an event
    run.metrics.frame(), run.episodes(20)        what happened
    await run.sft(examples) / await run.rl()     the same controls over supervised or RL steps
    run.export("tensorboard"), await run.checkpoint(), await run.stop(), await run.shutdown()

A Run is a front: ``forge_nb.controller.lifecycle.build`` makes every part of a run (``build_run``) and this class
only delegates and validates. The loops, their events, counters and state belong to the run's
``Controller`` (``forge_nb.controller``); its weight versions to a ``WeightSync`` with a key namespace of
its own, so several runs train side by side in one kernel; its books to a ``Ledger``. Episode functions get the
run's ``RolloutContext`` (``forge_nb.controller.context``), which reads the same as the Run for what a rollout
uses (``run.policy``, ``run.reward_fns``, ``run.sampling_overrides``...); the Run itself stays on its floor.
Shutdown order (``forge_nb.controller.lifecycle.assembly``): loops (at a step boundary), endpoints, services
(generators, reference, trainer), the run's weights and its torchstore lease (the store stops when no run or
service holds it), its records, its kernel log.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Any

from forge_nb.config import RunConfig, load
from forge_nb.controller import EpisodeFn
from forge_nb.controller.lifecycle import prestart
from forge_nb.controller.lifecycle.teardown import RunShutdown, ShutdownReport, run_gone, shutdown_kernel
from forge_nb.controller.state import RunState
from forge_nb.system.processes import proclogs

if TYPE_CHECKING:
    from forge_nb.controller.lifecycle.build import RunParts

logger = logging.getLogger(__name__)

__all__ = ["EpisodeFn", "Run", "ShutdownReport", "live_runs", "resume", "shutdown_all", "spawn"]

_LIVE: dict[str, Run] = {}  # the kernel's runs that are not shut down, by name (their names are unique)


def live_runs() -> list[Run]:
    """The runs of this kernel that are not shut down, oldest first."""
    return list(_LIVE.values())


async def shutdown_all(wait_s: float = 15.0) -> ShutdownReport:
    """The kernel-wide teardown: every live run (loops, endpoints, services, weights: ``Run.shutdown``, oldest
    first), then every other mesh of the kernel, then a wait of up to ``wait_s`` for their processes to exit,
    then the hosts of a monarch job in use (``forge_nb.use_job``), which would stay held otherwise
    (``forge_nb.controller.lifecycle.teardown``). A run whose shutdown raises does not keep the others or the
    meshes up: its error is raised after the rest is done."""
    runs = live_runs()
    return await shutdown_kernel([run.shutdown for run in runs], [run.name for run in runs], wait_s)


async def spawn(config: RunConfig | str | Path, *, overrides: list[str] | dict[str, Any] | None = None,
                episode_fn: EpisodeFn | None = None, progress: bool = True,
                actors: dict[str, type] | None = None, base: Run | str | None = None) -> Run:
    """Spawn every service of ``config`` (a RunConfig, a YAML path or YAML text) and return the Run, or, where the
    trainer can sample the rollouts until the generators serve, once it is up (``controller.lifecycle.stand_in``).

    ``actors`` replaces the class of a service ("policy", "trainer", "ref_model") by another
    ForgeActor with the same endpoints and constructor keywords, e.g. your own generator.

    ``base``: a live LoRA run (or its name) whose base model this run shares: a LoRA run of ``config`` adds its
    adapter to that run's generators and trainer process instead of spawning its own, and keeps everything
    else of a run to itself (``forge_nb.controller.lifecycle.on_base``)."""
    cfg, shared = load(config, overrides), _base_of(base)
    async with prestart.trainer_first(cfg, actors=actors, base=shared):  # its processes import while we do
        from forge_nb.controller.lifecycle.build import spawn_parts  # torch and the run's modules: ~2 s

        run = Run(await spawn_parts(cfg, episode_fn=episode_fn, progress=progress, actors=actors, base=shared))
    for kind, options in run.config.exporters.items():  # e.g. a YAML's metric_logging section
        run.export(kind, **options)
    return run


async def resume(path: str | Path, *, episode_fn: EpisodeFn | None = None, progress: bool = True,
                 actors: dict[str, type] | None = None, base: Run | str | None = None) -> Run:
    """Respawn the services of a run directory and continue from its last complete checkpoint (on the
    hosts of the job it ran on, re-attached if this kernel uses none: ``forge_nb.system.hosts.cluster``).

    The trainer loads its latest complete checkpoint, the generators load those weights, the replay
    buffer and hot changes come back from the snapshot, and the metric history stays. Steps recorded
    after the checkpoint are shown as a "rewind" event: they are trained again. ``actors`` as for
    :func:`spawn` (the classes the run was spawned with).

    Checkpoints are checked against their commit markers first (``RunDir.checkpoint_to_resume``): a newer
    one that is damaged or uncommitted is set aside with a ``checkpoint_skipped`` event that names its file
    and why, and the run resumes from the newest whole one; with none whole, ``CheckpointsDamaged`` lists
    them all and nothing is spawned. ``base`` as for :func:`spawn`: a run that trained on another's base goes
    on on a live one (its adapter's checkpoint loads into its trainer there).
    """
    from forge_nb.controller.lifecycle.build import resume_parts

    return Run(await resume_parts(path, episode_fn=episode_fn, progress=progress, actors=actors,
                                  base=_base_of(base)))


def _base_of(base: Run | str | None) -> Any:
    """The shared base of the live run ``base`` (a Run or its name), or a ValueError that says why there is none."""
    if base is None:
        return None
    run = _LIVE.get(base) if isinstance(base, str) else base
    if not isinstance(run, Run) or _LIVE.get(run.name) is not run:
        raise ValueError(f"base={getattr(base, 'name', base)!r}: no live run of that name in this kernel (live: "
                         f"{sorted(_LIVE) or 'none'})")
    if run.base is None:
        raise ValueError(f"base={run.name!r}: that run trains the whole model (no trainer.lora), so it has no base to "
                         "share; spawn it with trainer.lora, or spawn this run on its own")
    return run.base


class Run:
    """Services, loops, metrics and controls of one experiment (see the module docstring)."""

    def __init__(self, parts: RunParts):
        ctl = parts.controller
        self._ctl, self._hot, self._sync, self._ledger = ctl, ctl.hot, ctl.sync, ctl.ledger
        self._rollout = ctl.context  # what episode functions get: reward functions and endpoint live there
        self._assembly = parts.assembly  # what closes each part of the run, in one order (shutdown)
        self.config, self.name, self.dir, self.metrics = ctl.config, ctl.config.name, ctl.dir, ctl.metrics
        self.policy, self.trainer, self.ref_model = parts.policy, parts.trainer, parts.ref_model
        _LIVE[self.name] = self
        self.task, self.pad_id = parts.task, parts.pad_id
        self.model, self.replay_buffer = parts.model, ctl.buffer
        self.base = parts.base  # a LoRA run's: the generators and trainer process it shares with runs on it
        self.exporters: list[Any] = []
        self.tinker: Any = None  # the Tinker API, once serve_tinker() started it
        self._rollout.serve_openai_with(self.serve_openai)  # an agent's episode starts the endpoint on first use

    # -- what cells, widgets and magics read -----------------------------------------------------

    @property
    def services(self) -> dict[str, Any]:
        """The run's services by name; a LoRA run's ``ref_model`` is the trainer's base model, not a service."""
        from forge_nb.controller.episodes import BaseInTrainer

        found = {"policy": self.policy, "trainer": self.trainer, "ref_model": self.ref_model}
        return {k: v for k, v in found.items() if v is not None and not isinstance(v, BaseInTrainer)}

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
        """``async def fn(run, sample) -> list[Episode]`` the rollout loops call, ``run`` being the run's
        ``RolloutContext`` (``forge_nb.controller.context``: the Run's policy, config, rewards... under the Run's
        names); assign to replace it."""
        return self._ctl.episode_fn

    @episode_fn.setter
    def episode_fn(self, fn: EpisodeFn) -> None:
        if not callable(fn):
            raise TypeError(f"run.episode_fn = {fn!r}: needs `async def fn(run, sample) -> list[Episode]`")
        self._ctl.episode_fn = fn

    @property
    def sampling_overrides(self) -> dict[str, Any]:
        """Sampling parameters ``run.set`` changed (temperature, top_p, max_tokens), for ``generate``."""
        return self._rollout.sampling_overrides

    @property
    def reward_fns(self) -> list[Any]:
        """The reward functions the run's episodes score with; assign a list to replace them (the next group
        scores with it)."""
        return self._rollout.reward_fns

    @reward_fns.setter
    def reward_fns(self, fns: list[Any]) -> None:
        self._rollout.reward_fns = list(fns)

    @property
    def openai(self) -> Any:
        """The OpenAI-compatible endpoint, once ``serve_openai()`` started it; else None."""
        return self._rollout.openai

    async def openai_endpoint(self) -> Any:
        """The endpoint an agent's episode talks to, started on first use with ``serve_openai()``'s defaults: as
        on the ``RolloutContext``, so a package episode function (``agent_episode(agent)(run, sample)``) also
        plays on the Run itself."""
        return await self._rollout.openai_endpoint()

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
                "shares_base_with": [n for n in self.base.runs if n != self.name] if self.base else [],
                "openai": self.openai.status() if self.openai is not None else None,
                "tinker": self.tinker.status() if self.tinker is not None else None}

    @property
    def job(self) -> dict[str, Any] | None:
        """The monarch job the run's hosts come from (``forge_nb.system.hosts.cluster.Cluster.status``: a SLURM
        job's id, state and nodes, each host alive or why lost), or None: everything runs on the kernel's host."""
        from forge_nb.system.hosts import cluster

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
        """Where every accepted episode went; ``balanced`` says the books add up
        (``forge_nb.controller.intake.ledger``)."""
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
        """Start the loops in the background, without a step budget, until ``pause()`` or ``stop()``; the cell
        returns at once. A ``step(n)`` still pending returns now with the steps it got."""
        self._ctl.drop_budget()
        self._ctl.start()

    def resume(self) -> None:
        """Go on after ``pause()`` or ``stop()``; a ``step(n)`` still pending goes on with the steps it has left."""
        self._ctl.start()

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
        """Queue hyperparameter changes for the next step boundary (now, while no step runs); returns what is
        pending. A wrong name or value raises and queues nothing."""
        pending = self._hot.queue(changes)
        if not self._ctl.running:
            asyncio.get_running_loop().create_task(self._hot.apply(self._ctl.step), name=f"forge_nb.{self.name}.set")
        return pending

    async def apply_changes(self) -> None:
        """Apply the queued changes now (the training loop does it between steps)."""
        await self._hot.apply(self._ctl.step)

    def clear_buffer(self, reason: str) -> int:
        """Drop every buffered episode, counted in the ledger and recorded as an event."""
        return self._ctl.clear_buffer(reason)

    async def evaluate(self, prompts: Any = None, *, k: int = 1, version: int | None = None, n: int | None = None,
                       temperature: float | None = None, correct_at: float = 1.0,
                       episode_fn: EpisodeFn | None = None) -> dict[str, Any]:
        """``k`` answers to each held-out prompt from generators that all hold one weight version, scored by the run's
        reward functions: avg@k and unbiased pass@1, 2, 4 .. k (an answer passes with reward >= ``correct_at``).

        ``prompts``: None (``n``, default ``loop.eval_prompts``, of the task's held-out prompts), a task, or a list of
        ``{"request", "target"}`` dicts or prompt strings. ``version``: the run's current one (None), the only one a run
        keeps; another is refused. k=1 answers greedily, k > 1 samples at the run's temperature (or ``temperature``).
        ``episode_fn``: each prompt is a sample it plays as one group (k is the run's group size), scored as it scores;
        ``episode_fn=verifiers_episode(env)`` with ``prompts=[{"vf_task": i} for i in range(16)]`` evaluates on a
        verifiers environment's tasks.
        A running run parks at a step boundary for it and goes on after; an "eval" event keeps the values (drawn by
        the dashboard over the step that trained the version; ``forge_nb.controller.evaluate``)."""
        from forge_nb.controller.evaluate import evaluate_run

        return await evaluate_run(self._ctl, prompts, k=k, version=version, n=n, temperature=temperature,
                                  correct_at=correct_at, episode_fn=episode_fn)

    async def checkpoint(self) -> str:
        """Trainer checkpoint, buffer snapshot and the run's counters, in the run directory."""
        return await self._ctl.checkpoint()

    def export(self, kind: str, **options: Any) -> Any:
        """Also send this run's metrics (history first) to "tensorboard", "trackio" or "wandb"; see
        ``forge_nb.metrics.exporters``. Returns the exporter (``.close()`` stops it; shutdown closes it)."""
        from forge_nb.metrics import exporters

        exporter = exporters.export(self.metrics, kind, run_dir=self.dir.path, run_name=self.name,
                                    config=self.config.to_dict(), **options)
        self.exporters.append(exporter)
        self._assembly.add("records", f"{kind} exporter", exporter.close)
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

            self._rollout.openai = await OpenAIEndpoint.start(self._rollout, port=port, tool_parser=tool_parser,
                                                              request_timeout_s=request_timeout_s,
                                                              chat_template_kwargs=chat_template_kwargs)
            self._assembly.add("fronts", "OpenAI endpoint", self.openai.stop)  # nothing may reach the services after
            self.metrics.event("openai", url=self.openai.url, model=self.openai.model)
        return self.openai

    async def serve_tinker(self, *, port: int = 0) -> Any:
        """Serve the Tinker API on 127.0.0.1 (``forge_nb.tinker``): ``tinker.ServiceClient(base_url=server.url,
        api_key=server.token)``; each training client is a LoRA run on this run's base. Returns the server (served
        once; it stops with the run). This run must train LoRA adapters (trainer.lora)."""
        self._ctl.require_not_shut_down()
        if self.tinker is None or not self.tinker.serving:
            from forge_nb.tinker import TinkerServer

            self.tinker = await TinkerServer.start(
                self, lambda cfg, overrides: spawn(cfg, overrides=overrides, base=self, progress=False), port=port)
            self._assembly.add("fronts", "Tinker server", self.tinker.stop)  # its clients' runs leave the base first
            self.metrics.event("tinker", url=self.tinker.url, base_model=self.tinker.base_model)
        return self.tinker

    @property
    def controller(self) -> Any:
        """The run's Controller, for fronts that drive the run's trainer themselves (``forge_nb.tinker``)."""
        return self._ctl

    async def sft(self, examples: list[dict[str, Any]] | None = None, *, batch_size: int | None = None) -> None:
        """Switch to supervised fine-tuning (torchforge's apps/sft on the same trainer), e.g. a warm start.
        ``examples``: ``{"request": ..., "response": ...}`` pairs (``target`` stands in for ``response``);
        None imitates the task's own targets. The loops stop at a step boundary; then ``start()``,
        ``step(n)``, ``pause()``, ``set(lr=...)`` and ``stop()`` drive SFT steps, which record metric rows
        with ``sft=1`` and push their weights to the generators like RL steps. ``await run.rl()`` switches back.
        """
        from transformers import AutoTokenizer

        from forge_nb.data.sft import SftData

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

    async def shutdown(self, wait_s: float = 0.0) -> RunShutdown:
        """Stop loops, then fronts, then services, then this run's weights, then its records
        (``forge_nb.controller.lifecycle.assembly``); afterwards none of its processes serves it: each is stopped,
        kept warm for the kernel's next run (``forge_nb.system.runtime.warm``; ``shutdown_all`` and the kernel's
        exit stop those), or left to the runs on the same base. Other runs in the kernel go on: the torchstore
        they share stops only with its last user. Waits up to ``wait_s`` for the stopped processes to exit; the
        report says which went which way (``forge_nb.controller.lifecycle.teardown.RunShutdown``)."""
        if self.state == "shut down":
            return RunShutdown(self.name, [], [], [], [])
        pids = [p for service in self.services.values() for r in service.status() for p in r.pids]
        try:
            await self._assembly.close()
        finally:
            if _LIVE.get(self.name) is self:
                del _LIVE[self.name]
        return await run_gone(self.name, pids, self.base.runs if self.base is not None else [], wait_s)

