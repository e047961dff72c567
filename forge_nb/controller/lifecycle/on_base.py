"""Several LoRA runs on one base model: a run spawned onto another's base (``forge_nb.spawn(cfg, base=run)``) adds
its adapter to that run's generator service and trainer processes instead of spawning its own.

Every LoRA run's generator service and trainer are shared from the start (:func:`share_services`: the run holds a
``forge_nb.service.shared.Share`` of each), so that a later run can join them. A run that joins
(:func:`join_base`) gets:

- a lane on the generators (``Generator.add_adapter``): its versions load as its own adapter, its requests carry
  ``adapter=<its namespace>`` (the share adds it to ``generate`` and ``generate_many``, so ``policy.generate.route(
  prompt)`` in an episode function samples with this run's adapter alone), and a respawned replica gets its lane
  back and loads its current version (the share's catch-up hook, after the base run's);
- its own ``RLTrainer`` actor in the base trainer's process (``ActorHandle.start_on``, ``share_base=True``): its own
  adapter, optimizer, steps, hyperparameters, checkpoints and pushes, on the one copy of the base weights;
- everything else of its own, as any run: replay buffer, ledger, loops, metrics, hot values, run directory, the
  KL reference (the base in the trainer's process, its adapters off).

A run's shutdown is its share's: its adapter leaves the generators (``drop_adapter``) and the trainer's model
(``release``), and the shared services stop with the last run on them, whichever it is. A run that fails (its
reward function raises, it is stopped) leaves the others training. A generator replica that dies is respawned
with every run's adapter. The trainer process is the base run's: if it dies, the base run's trainer comes back as
any run's does, and the runs that joined it fail (their trainers lived in it; resume them onto a live base with
``forge_nb.resume(path, base=...)``).
"""

from __future__ import annotations

import contextlib
import dataclasses
from dataclasses import dataclass
from typing import Any

from forge_nb import weights
from forge_nb.config import RunConfig, trainer_actor_kwargs
from forge_nb.controller.weight_sync import WeightSync
from forge_nb.models import TinyModelConfig
from forge_nb.rundir import RunDir
from forge_nb.service.shared import SharedService

__all__ = ["SharedBase", "check_joinable", "generator_sampling", "join_base", "share_services"]


#: what a run on a base takes from the base run's processes, whatever its own config says: a run that asks for
#: other values is refused rather than silently given the base's
SHARED_SETTINGS = (("generator", "num_replicas"), ("generator", "procs"), ("generator", "with_gpus"),
                   ("generator", "hosts"), ("generator", "engine_args"), ("trainer", "procs"),
                   ("trainer", "with_gpus"), ("trainer", "hosts"))


@dataclass
class SharedBase:
    """What the runs on one base share: the generator service, the trainer's processes, the model."""

    policy: SharedService
    trainer: SharedService
    model: str  # the model's path, as the base run's services loaded it
    pad_id: int
    config: RunConfig  # the base run's

    @property
    def runs(self) -> list[str]:
        """The names of the runs on this base, in the order they came."""
        return self.policy.names


def share_services(cfg: RunConfig, services: dict[str, Any], *, model: str, pad_id: int
                   ) -> tuple[SharedBase, dict[str, Any]]:
    """A LoRA run's services as shares, and the base other runs can join."""
    policy, trainer = services["policy"], services["trainer"]
    base = SharedBase(SharedService(policy), SharedService(trainer), model, pad_id, cfg)
    mine = dict(services, policy=base.policy.share(cfg.name),
                trainer=base.trainer.share(cfg.name, leave=lambda: trainer.release.call()))
    return base, mine


def check_joinable(cfg: RunConfig, base: SharedBase) -> None:
    """Why ``cfg`` cannot run on ``base``, as a ValueError, before anything spawns."""
    base_name = base.config.name
    if cfg.trainer.lora is None:
        raise ValueError(f"base={base_name!r}: a run on another run's base trains LoRA adapters; set trainer.lora "
                         "(e.g. --set trainer.lora={rank: 8})")
    theirs, ours = base.config, cfg
    if (ours.model, _tiny(ours)) != (theirs.model, _tiny(theirs)):
        what = "its tiny model" if theirs.model == "tiny" else repr(theirs.model)
        raise ValueError(f"base={base_name!r}: that run's base is {what}, and this run names model={ours.model!r}"
                         f"{' with other tiny settings' if ours.model == theirs.model else ''}: a run on a base "
                         "trains on the base's model")
    pairs = {f"{part}.{name}": (getattr(getattr(ours, part), name), getattr(getattr(theirs, part), name))
             for part, name in SHARED_SETTINGS}
    differ = [f"{key}={mine!r} (the base's: {base!r})" for key, (mine, base) in pairs.items() if mine != base]
    if differ:
        raise ValueError(f"base={base_name!r}: {', '.join(differ)}: a run on a base uses the base's generator and "
                         "trainer processes as they are; drop those settings, or spawn this run on its own")
    if theirs.trainer.procs > 1:
        raise ValueError(f"base={base_name!r}: its trainer has {theirs.trainer.procs} procs; runs share a base's "
                         "trainer when it has one")
    if not base.policy.shares:
        raise ValueError(f"base={base_name!r}: the services of that base are shut down")


async def join_base(cfg: RunConfig, directory: RunDir, base: SharedBase, *, trainer_cls: type
                    ) -> tuple[dict[str, Any], WeightSync]:
    """``cfg``'s services on ``base``: a lane on its generators and a trainer in its trainer's process, as the
    run's shares, and the run's WeightSync (opened). Nothing is left behind if either fails."""
    from forge_nb.service.service import ActorHandle

    sync = WeightSync(weights.namespace_for(cfg.name), lane=True)
    await sync.open()
    namespace, lora = sync.namespace, dataclasses.asdict(cfg.trainer.lora)
    generators = base.policy.service
    trainer = None
    try:
        try:  # a rank or a room the generators lack: refused here, before the trainer spawns
            await generators.add_adapter.fanout(namespace, lora)
        except Exception as e:  # the refusal as the generator raised it, not monarch's wrapping of it
            refusal = getattr(e, "exception", None)
            if isinstance(refusal, ValueError):
                raise ValueError(str(refusal)) from None
            raise
        trainer = await ActorHandle.start_on(base.trainer.service, trainer_cls, {
            "model": base.model, "pad_id": base.pad_id, "share_base": True, **trainer_actor_kwargs(
                cfg, checkpoint_folder=str(directory.checkpoints), weights_namespace=namespace,
                verified_checkpoint=directory.verified_trainer_checkpoint)})
    except BaseException:
        with contextlib.suppress(Exception):  # the error that stopped the join is the one to report
            await _leave_generators(generators, namespace)
        await sync.close()
        raise

    async def rejoin(replica: Any) -> None:  # a respawned generator: this run's lane, then its current version
        await replica.actor.add_adapter.call_one(namespace, lora)
        await sync.catch_up(replica)

    # the generators' defaults are the base run's sampling: this run's goes with each of its requests
    adapter, sampling = {"adapter": namespace}, generator_sampling(cfg)
    policy = base.policy.share(cfg.name, leave=lambda: _leave_generators(generators, namespace), inject={
        "generate": adapter, "generate_many": adapter, "get_version": {"namespace": namespace}},
        defaults={"generate": sampling, "generate_many": sampling})
    policy.set_catch_up(rejoin)
    shares = {"policy": policy,
              "trainer": base.trainer.share(cfg.name, own=trainer, leave=lambda: trainer.release.call())}
    return shares, sync


def generator_sampling(cfg: RunConfig) -> dict[str, Any]:
    """The sampling a run's generators are spawned with (its groups' size, its response budget, its sampling
    params): a run on another's base sends them with each request, the caller's own overrides winning."""
    return {"n": cfg.group_size, "max_tokens": cfg.max_res_tokens, **cfg.generator.sampling_params}


def _tiny(cfg: RunConfig) -> TinyModelConfig | None:
    """The tiny model's settings of a run on it (None: the defaults), None for any other model."""
    return (cfg.tiny or TinyModelConfig()) if cfg.model == "tiny" else None


async def _leave_generators(generators: Any, namespace: str) -> None:
    await generators.drop_adapter.fanout(namespace)
