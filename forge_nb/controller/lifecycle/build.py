"""Assembling a run: ``build_run`` brings up its services and wires its parts; ``forge_nb.run`` wraps them.

``forge_nb.spawn`` (:func:`spawn_parts`: a new run directory) and ``forge_nb.resume`` (:func:`resume_parts`: an
existing one, from its last whole checkpoint) both come here, and ``forge_nb.Run`` is the thin front
over what :func:`build_run` returns, a :class:`RunParts`: every object of a run is made in this module, once.

Services start concurrently: the generator service, the trainer actor and, when asked for, the
reference service. A progress bar shows which are up. If any fails to start, the ones that did are
shut down and the error names the service and says what went wrong: nothing spawned is leaked.

Where the trainer can sample the rollouts (one proc; forge_nb's Generator and RLTrainer; no LoRA section), the run
is built once the trainer (and the reference) are up: its generators go on starting in the background while the
trainer answers ``run.policy.generate`` (``controller.lifecycle.stand_in``). Their start's error, if any, is raised
by the run's next rollout (the run stops with it) and by ``await run.policy.started()``.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import json
import logging
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from forge_nb import weights
from forge_nb.config import (
    RunConfig,
    from_saved,
    hot_fields,
    initial_hparams,
    trainer_actor_kwargs,
    trainer_hparam_sections,
)
from forge_nb.controller.context import RolloutContext
from forge_nb.controller.core import Controller, EpisodeFn
from forge_nb.controller.episodes import BaseInTrainer, generate_episode
from forge_nb.controller.hot import HotChanges
from forge_nb.controller.intake.ledger import Ledger
from forge_nb.controller.lifecycle.assembly import RunAssembly
from forge_nb.controller.lifecycle.on_base import (
    SharedBase,
    check_joinable,
    generator_sampling,
    join_base,
    share_services,
)
from forge_nb.controller.lifecycle.prestart import trainer_options
from forge_nb.controller.lifecycle.stand_in import StandInPolicy, stands_in
from forge_nb.controller.weight_sync import WeightSync
from forge_nb.metrics import MetricsStore
from forge_nb.models import TINY_PAD_ID, TRANSFORMERS_LOCK, TinyModelConfig, build_tiny_model, resolve_model
from forge_nb.rl import ReplayBuffer
from forge_nb.rundir import RunDir
from forge_nb.system.hosts import cluster
from forge_nb.system.importpath import import_path
from forge_nb.system.processes import proclogs, start_cores, startup_gc
from forge_nb.system.processes.leftovers import remove_leftovers
from forge_nb.system.runtime import lifecycle, spawning

logger = logging.getLogger(__name__)

JOB_FILE = "job.json"  #: in a run directory: where the job its services ran on is saved (use_job's cached_path)


@dataclass
class RunParts:
    """Everything :func:`build_run` made for one run; ``forge_nb.Run(parts)`` is the user's handle on it."""

    controller: Controller  # the loops, the step, the state; holds config, buffer, ledger, sync, hot, metrics, dir
    policy: Any
    trainer: Any
    ref_model: Any  # None without a reference model
    task: Any
    pad_id: int
    model: str  # the policy's path (a hub id, a folder, or the tiny model written into the run directory)
    assembly: RunAssembly  # what closes each part (the kernel log among them), in one order: Run.shutdown closes it
    base: SharedBase | None = None  # a LoRA run's: the generators and trainer process it shares (on_base)


async def spawn_parts(cfg: RunConfig, *, episode_fn: EpisodeFn | None = None, progress: bool = True,
                      actors: dict[str, type] | None = None, base: SharedBase | None = None) -> RunParts:
    """What ``forge_nb.spawn`` does with its config: a new run directory for ``cfg``, then :func:`build_run` (on
    ``base`` when given). A run that never started leaves no directory behind (one given that existed stays)."""
    actors = _actor_classes(actors)
    if base is not None:
        check_joinable(cfg, base)
    else:
        _check_gpus(cfg)
    existed = cfg.run_dir is not None and Path(cfg.run_dir).exists()
    directory = RunDir.create(cfg.to_dict(), cfg.name, cfg.run_dir)
    job = cluster.current()
    if job is not None and job.cached_path:  # resume() in a new kernel re-attaches to it
        (directory.path / JOB_FILE).write_text(json.dumps({"cached_path": str(Path(job.cached_path).resolve())}))
    try:
        return await build_run(cfg, directory, episode_fn=episode_fn, progress=progress, actors=actors, base=base)
    except BaseException:
        if not existed:
            shutil.rmtree(directory.path, ignore_errors=True)
        raise


async def resume_parts(path: str | Path, *, episode_fn: EpisodeFn | None = None, progress: bool = True,
                       actors: dict[str, type] | None = None, base: SharedBase | None = None) -> RunParts:
    """What ``forge_nb.resume`` does (see there): the run directory's config and newest whole checkpoint,
    its job re-attached, :func:`build_run`, and the controller put back at the checkpoint's step."""
    directory = RunDir.open(path)
    cfg = from_saved({**directory.config, "run_dir": str(directory.path)})
    if base is not None:
        check_joinable(cfg, base)
    state, skipped = directory.checkpoint_to_resume()  # before anything spawns: CheckpointsDamaged if none whole
    saved = directory.path / JOB_FILE
    if cluster.current() is None and saved.exists():  # the run was on a job's hosts: back to them
        cached = json.loads(saved.read_text())["cached_path"]
        logger.info("resume %s: re-attaching to the job saved at %s", directory.path, cached)
        await cluster.use_job(cached, log_dir=directory.logs)
    parts = await build_run(cfg, directory, episode_fn=episode_fn, progress=progress, actors=_actor_classes(actors),
                            base=base)
    for what, why in skipped:
        logger.warning("resume %s: checkpoint %s skipped: %s", directory.path, what, why)
        parts.controller.metrics.event("checkpoint_skipped", path=what, reason=why,
                                       message=f"{Path(what).name} skipped ({why}); set aside as "
                                               f"{Path(what).name}.skipped")
    try:
        await parts.controller.resume_from(state)  # the controller writes the step, the rewind and resume events
    except BaseException:  # a resume that fails leaves nothing of itself running
        await parts.assembly.close_after_failure()
        raise
    return parts


def _actor_classes(actors: dict[str, type] | None) -> dict[str, type]:
    unknown = set(actors or {}) - {"policy", "trainer", "ref_model"}
    if unknown:
        raise ValueError(f"actors={sorted(unknown)}: the services whose class can be replaced are 'policy', "
                         "'trainer' and 'ref_model'")
    return dict(actors or {})


def _check_gpus(cfg: RunConfig) -> None:
    """Every GPU the run's services ask for, checked together before anything (the store included) spawns."""
    wanted = {"generator": cfg.generator.procs * cfg.generator.num_replicas if cfg.generator.with_gpus else 0,
              "trainer": cfg.trainer.procs if cfg.trainer.with_gpus else 0}
    ref = cfg.reference
    if cfg.use_reference and (cfg.trainer.with_gpus if ref.with_gpus is None else ref.with_gpus):
        wanted["reference"] = ref.procs * ref.num_replicas
    if sum(wanted.values()):
        asking = ", ".join(f"{name} {n}" for name, n in wanted.items() if n)
        spawning.check_gpus(sum(wanted.values()), f"run {cfg.name!r} ({asking})")


async def build_run(cfg: RunConfig, directory: RunDir, *, episode_fn: EpisodeFn | None = None,
                    progress: bool = True, actors: dict[str, type] | None = None,
                    base: SharedBase | None = None) -> RunParts:
    """Bring up the services of ``cfg`` (a run directory already made) and wire a run's parts around them; with
    ``base``, the run's adapter on that base's services instead (:func:`build_on_base`)."""
    actors = actors or {}
    if base is not None:
        return await build_on_base(cfg, directory, base, episode_fn=episode_fn, actors=actors)
    task = make_task(cfg)
    model, pad_id, build = _model_source(cfg, task, directory)
    lifecycle.ensure_started()
    remove_leftovers()  # of runs killed before (a kernel restart): engine segments, sockets, weight files
    sync = WeightSync(weights.namespace_for(cfg.name))
    sync.claim()  # this run's key namespace, before anything is spawned
    assembly = RunAssembly(cfg.name)
    assembly.add("weights", "weights", sync.close)
    # Three things start at once: the torchstore (its lease), a thread that writes the tiny model, and the
    # services' processes (the generators import vLLM meanwhile). The services' setup, which loads the model
    # and moves weights, waits for the first two. Started together, the model's build brings the first step ~1.3 s
    # sooner on two cores, and the store's start and imports (2.5-4.5 s) overlap the services' own.
    opening = asyncio.ensure_future(sync.open())
    written = asyncio.ensure_future(asyncio.to_thread(build))
    ready = asyncio.gather(written, opening)  # the first error of the two, if any
    try:
        return await _start_services(cfg, directory, episode_fn, progress, task, model, pad_id, ready, sync,
                                     actors, assembly)
    except BaseException:  # nothing of a failed spawn stays behind: what it made closes as a run's parts do
        for started in (opening, written, ready):
            with contextlib.suppress(BaseException):  # the error that stopped the spawn is the one to report
                await started
        await assembly.close_after_failure()
        for cause in (written, opening):  # the model could not be written, the store not started: the cause
            if cause.done() and not cause.cancelled() and cause.exception() is not None:
                raise cause.exception() from None
        raise


async def _start_services(cfg: RunConfig, directory: RunDir, episode_fn: EpisodeFn | None, progress: bool,
                          task: Any, model: str, pad_id: int, written: asyncio.Future[Any], sync: WeightSync,
                          actors: dict[str, type], assembly: RunAssembly) -> RunParts:
    from forge_nb.actors.generator import Generator
    from forge_nb.actors.reference_model import ReferenceModel
    from forge_nb.actors.trainer import RLTrainer

    Generator = actors.get("policy", Generator)  # noqa: N806 (a class, as in the seeds)
    RLTrainer = actors.get("trainer", RLTrainer)  # noqa: N806
    ReferenceModel = actors.get("ref_model", ReferenceModel)  # noqa: N806

    logs = str(directory.logs)  # the processes' output: %forge_logs / run.logs() read it, the cells stay quiet
    sampling = generator_sampling(cfg)
    engine_args = cfg.engine_args()
    policy_mesh = f"{cfg.name}-policy"  # its replicas' meshes are <policy_mesh>-r<index>
    generators = Generator.options(num_replicas=cfg.generator.num_replicas, procs=cfg.generator.procs,
                                   with_gpus=cfg.generator.with_gpus, hosts=cfg.generator.hosts, mesh_name=policy_mesh,
                                   log_dir=logs)
    generator_kwargs = {"model": model, "engine_args": engine_args, "sampling_params": sampling,
                        "weights_namespace": sync.namespace,
                        **({"lora": dataclasses.asdict(cfg.trainer.lora)} if cfg.trainer.lora else {})}
    stand_in = None
    if cfg.trainer.lora is None and stands_in(RLTrainer, cfg.trainer.procs, Generator):  # until they serve
        stand_in = StandInPolicy(generators.prepared_service(**generator_kwargs), sampling)
        stand_in.service.set_catch_up(sync.catch_up)  # each loads the run's newest version before it serves
        assembly.add("services", "policy", stand_in.shutdown)
        stand_in.begin(setup_after=written)
    starts: dict[str, Any] = {
        "trainer": _start(RLTrainer.options(**trainer_options(cfg), mesh_name=f"{cfg.name}-trainer", log_dir=logs),
                          written, {"model": model, "pad_id": pad_id, **trainer_actor_kwargs(
                              cfg, checkpoint_folder=str(directory.checkpoints), weights_namespace=sync.namespace,
                              verified_checkpoint=directory.verified_trainer_checkpoint)},
                          actor=True),
    }
    if stand_in is None:
        starts = {"policy": _start(generators, written, generator_kwargs), **starts}
    if cfg.use_reference:
        ref = cfg.reference
        with_gpus = cfg.trainer.with_gpus if ref.with_gpus is None else ref.with_gpus
        ref_training = {"temperature": cfg.sampling().temperature, **ref.extra.get("training", {})}
        starts["ref_model"] = _start(ReferenceModel.options(
            num_replicas=ref.num_replicas, procs=ref.procs, with_gpus=with_gpus, mesh_name=f"{cfg.name}-ref",
            hosts=cfg.trainer.hosts if ref.hosts is None else ref.hosts,
            log_dir=logs,
        ), written, {"model": model, **ref.extra, "training": ref_training})
    busy = (cfg.generator.num_replicas * cfg.generator.procs + cfg.trainer.procs
            + (cfg.reference.num_replicas * cfg.reference.procs if cfg.use_reference else 0))
    # On two cores the start's longest chain is what the first step waits for, and gets a core of its own: the
    # generators' import of vLLM and engine build, or the trainer's start when it stands in for them.
    longest = "policy" if stand_in is None else "trainer"
    first = f"{policy_mesh}-r" if stand_in is None else f"{cfg.name}-trainer-r"
    kept = cfg.generator.num_replicas * cfg.generator.procs if stand_in is None else cfg.trainer.procs
    async with start_cores.generators_first(first, processes=busy, generator_processes=kept) as first_up:
        starts[longest] = _then(starts[longest], first_up)
        services = await _start_all(starts, progress)
    if stand_in is not None and stand_in.error is not None:  # they failed before the trainer was up: so does the spawn
        for service in services.values():
            await service.shutdown()
        raise stand_in.failed() from stand_in.error
    if stand_in is not None:  # now the generators' start is the longest chain: their cores, until they serve
        stand_in.trainer = services["trainer"]
        stand_in.keep_cores(start_cores.generators_first(
            f"{policy_mesh}-r", processes=busy, generator_processes=cfg.generator.num_replicas * cfg.generator.procs,
            run_meshes=f"{cfg.name}-"))
        services = {"policy": stand_in, **services}
    base = None
    if cfg.trainer.lora is not None:  # its generators and trainer process can take other runs' adapters
        base, services = share_services(cfg, services, model=model, pad_id=pad_id)
    _add_services(assembly, services)
    hot = await _hot_values(cfg, services["trainer"], task)
    parts = _wire(cfg, directory, services, task=task, pad_id=pad_id, model=model, sync=sync, hot=hot,
                  episode_fn=episode_fn, assembly=assembly)
    parts.base = base
    return parts


def _add_services(assembly: RunAssembly, services: dict[str, Any]) -> None:
    """The services close generators first, then the reference model, then the trainer (a LoRA run's shares
    leave the base's processes instead). Generators with a stand-in were added as they began to start."""
    for name in ("policy", "ref_model", "trainer"):
        if name in services and not isinstance(services[name], StandInPolicy):
            assembly.add("services", name, services[name].shutdown)


async def build_on_base(cfg: RunConfig, directory: RunDir, base: SharedBase, *, episode_fn: EpisodeFn | None = None,
                        actors: dict[str, type] | None = None) -> RunParts:
    """A run of ``cfg`` on ``base``: its adapter on the base's generators and a trainer of its own in the base
    trainer's process (``on_base.join_base``), the rest of a run wired around them as for any run."""
    from forge_nb.actors.trainer import RLTrainer

    task = make_task(cfg)
    services, sync = await join_base(cfg, directory, base, trainer_cls=(actors or {}).get("trainer", RLTrainer))
    assembly = RunAssembly(cfg.name)
    assembly.add("weights", "weights", sync.close)
    _add_services(assembly, services)
    try:
        hot = await _hot_values(cfg, services["trainer"], task)
        parts = _wire(cfg, directory, services, task=task, pad_id=base.pad_id, model=base.model, sync=sync, hot=hot,
                      episode_fn=episode_fn, assembly=assembly)
    except BaseException:
        await assembly.close_after_failure()
        raise
    parts.base = base
    return parts


async def _hot_values(cfg: RunConfig, trainer: Any, task: Any) -> tuple[dict[str, str], dict[str, Any]]:
    """Where each hot value of the run goes, and their values: the loss's fields as the trainer reports them."""
    reported = (await trainer.info.call())[0]["hparams"]
    loss = {k: v for k, v in reported.items() if k not in trainer_hparam_sections()}
    return hot_fields(cfg, loss), initial_hparams(cfg, loss, task=task)


def _wire(cfg: RunConfig, directory: RunDir, services: dict[str, Any], *, task: Any, pad_id: int, model: str,
          sync: WeightSync, hot: tuple[dict[str, str], dict[str, Any]], episode_fn: EpisodeFn | None,
          assembly: RunAssembly) -> RunParts:
    """The run's parts around its started services: log, metrics, buffer, books, hot changes, the controller,
    each registered with ``assembly`` as it is made."""
    policy, trainer = services["policy"], services["trainer"]
    kernel_log = proclogs.KernelLog(directory.logs, cfg.name)  # forge_nb's own records: to a file, not the cells
    assembly.add("log", "kernel log", kernel_log.close)
    metrics = MetricsStore(directory.path)
    buffer = ReplayBuffer(batch_size=cfg.batch_size, max_policy_age=cfg.max_policy_age, seed=cfg.seed)
    ledger = Ledger(buffer)
    routes, values = hot
    changes = HotChanges(cfg, routes, values, trainer=trainer, buffer=buffer, task=task, metrics=metrics,
                         policy=policy)
    sync.attach(trainer, policy)
    ref_model = services.get("ref_model")
    if ref_model is None and cfg.trainer.lora is not None:  # the base model, in the trainer: its adapters off
        ref_model = BaseInTrainer(trainer)
    context = RolloutContext(config=cfg, task=task, policy=policy, ref_model=ref_model, model=model, pad_id=pad_id,
                             hot=changes, sync=sync)
    controller = Controller(context=context, trainer=trainer, buffer=buffer, ledger=ledger, sync=sync, hot=changes,
                            metrics=metrics, directory=directory, episode_fn=episode_fn or generate_episode)
    assembly.add("loops", "loops", controller.stop)
    assembly.add("records", "state", controller.shut_down)
    assembly.add("records", "leftovers", lambda: _remove_leftovers(cfg.name))
    # while the run trains, the kernel's full collections skip what it holds now (its imports: 0.1 s each)
    assembly.add("records", "the kernel's heap frozen", startup_gc.hold_kernel_heap())
    if not sync.lane:  # a run on another's base set its own (on_base: its lane first, then its version)
        policy.set_catch_up(sync.catch_up)
    if isinstance(policy, StandInPolicy):
        policy.when_started(lambda p: _generators_started(p, metrics))
    for name, service in services.items():
        service.subscribe(lambda e, name=name: metrics.event(
            "replica", service=name, replica=e.replica, old=e.old, new=e.new, reason=e.reason))
    return RunParts(controller=controller, policy=policy, trainer=trainer, ref_model=ref_model,
                    task=task, pad_id=pad_id, model=model, assembly=assembly)


def _generators_started(policy: StandInPolicy, metrics: MetricsStore) -> None:
    """The event that says the generators serve (the version they loaded) or failed, and the trainer's groups before."""
    groups = policy.trainer_groups
    if policy.error is not None:
        metrics.event("generators_failed", trainer_groups=groups, error=str(policy.failed())[:300],
                      message=f"{policy.failed()}; the run's next rollout raises it")
        return
    version = min((r.version or 0 for r in policy.replicas if r.healthy), default=0)
    metrics.event("generators_up", version=version, trainer_groups=groups,
                  message=f"the generators serve version {version}; the trainer sampled the {groups} groups before")


def _remove_leftovers(run: str) -> None:
    """What engines killed during the run could not clean (``forge_nb.system.processes.leftovers``)."""
    removed = remove_leftovers(min_age_s=5.0)
    if any(removed.values()):
        logger.info("run %s: removed what killed processes left: %s", run, removed)


def _start(configured: Any, written: asyncio.Future[Any], kwargs: dict[str, Any], *, actor: bool = False) -> Any:
    """``configured.as_service(**kwargs)`` (``.as_actor`` with ``actor``), whose replicas' processes start
    now and their setup once ``written`` (the model) is done."""
    from forge_nb.service.service import ActorHandle, Service

    return (ActorHandle if actor else Service).start(configured, configured._options, (), kwargs, setup_after=written)


async def _then(started: Any, done: Callable[[], None]) -> Any:
    """``await started``, then ``done()`` (whether it started or failed)."""
    try:
        return await started
    finally:
        done()


async def _start_all(starts: dict[str, Any], progress: bool) -> dict[str, Any]:
    bar = _progress(len(starts)) if progress else None
    names = list(starts)

    async def one(name: str) -> Any:
        result = await starts[name]
        if bar is not None:
            bar.set_postfix_str(f"{name} up")
            bar.update(1)
        return result

    results = await asyncio.gather(*(one(n) for n in names), return_exceptions=True)
    if bar is not None:
        bar.close()
    failed = [(n, r) for n, r in zip(names, results, strict=True) if isinstance(r, BaseException)]
    if failed:
        for result in results:
            if not isinstance(result, BaseException):
                await result.shutdown()
        name, error = failed[0]
        raise RuntimeError(f"service {name!r} failed to start: {error}") from error
    return dict(zip(names, results, strict=True))


def _progress(total: int) -> Any:
    from tqdm.auto import tqdm

    return tqdm(total=total, desc="spawning services", unit="service")


def make_task(cfg: RunConfig) -> Any:
    """The task object named by ``cfg.task``: "toy", "gsm8k" or "package.module:function"."""
    from forge_nb.rl import Gsm8kTask, ToyTask

    if cfg.task == "toy":
        args = {"response_chars": cfg.max_res_tokens, "seed": cfg.seed, **cfg.task_args}
        if cfg.tiny is not None:
            args.setdefault("alphabet", cfg.tiny.alphabet)
        return ToyTask(**args)
    if cfg.task == "gsm8k":
        return Gsm8kTask(**{"seed": cfg.seed, **cfg.task_args})
    if ":" in cfg.task:
        return import_path(cfg.task, label="task")(**cfg.task_args)
    raise ValueError(f"task={cfg.task!r}: use 'toy', 'gsm8k', or 'package.module:function' returning a task")


def _model_source(cfg: RunConfig, task: Any, directory: RunDir) -> tuple[str, int, Callable[[], Any]]:
    """The model's path, its pad token id, and what writes it there (nothing for a hub id or a folder)."""
    if cfg.model != "tiny":
        model = resolve_model(cfg.model)
        return model, _pad_id(model), lambda: None
    tiny = cfg.tiny or TinyModelConfig(alphabet=getattr(task, "alphabet", TinyModelConfig().alphabet))
    missing = set(getattr(task, "alphabet", "")) - set(tiny.alphabet)
    if missing:
        raise ValueError(f"tiny.alphabet={tiny.alphabet!r} lacks the task's characters {sorted(missing)}")
    return str(directory.model), TINY_PAD_ID, lambda: build_tiny_model(directory.model, tiny)


def _pad_id(model: str) -> int:
    with TRANSFORMERS_LOCK:  # another spawn may be building its tiny model in a thread
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(model)
    pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
    if pad is None:
        raise ValueError(f"the tokenizer of {model!r} has neither a pad nor an eos token")
    return int(pad)
