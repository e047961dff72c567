"""What the Tinker API's clients train and sample: a training client is a LoRA run on the served run's base, a
sampling session names the weights it samples with.

``create_lora_training_client(base_model, rank)`` spawns a run onto the served run's base model
(``forge_nb.spawn(cfg, base=run)``: an adapter of the client's rank in the base trainer's process and a lane on its
generators; ``forge_nb.controller.lifecycle.on_base``). The run is a forge_nb run like any other: the dashboard,
``%forge_status`` and the rollout explorer show it; its loops are not started, the client's calls drive its trainer:

==================================== ================================================================================
``forward`` / ``forward_backward``   ``RLTrainer.forward_backward`` (gradients add up until the next ``optim_step``)
``optim_step``                       ``RLTrainer.optim_step``, then a step row of the run (``source/tinker``): the
                                     loss summed since the last step, the Datums' advantages, the gradient norm
``save_weights_for_sampler``         the adapter pushed as the run's next version and loaded on every generator
``save_state`` / ``load_state``      a checkpoint of adapter, optimizer and step in the run's directory
==================================== ================================================================================

Tinker's ``LoraConfig`` picks the layers: ``train_attn`` q/k/v/o, ``train_mlp`` gate/up/down, ``train_unembed`` the
LM head; ``alpha`` is twice the rank (forge_nb's default ratio: Tinker does not say its own). A sampling session holds
one version of one client's adapter (or the base model: a lane of its own whose adapter stays zero); the generators
keep each run's newest version only, so a session whose version was replaced is refused with a message saying so
rather than served other weights than it names.
"""

from __future__ import annotations

import dataclasses
import json
import secrets
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge_nb.controller.outside import publish_now, record_outside_step
from forge_nb.tinker.futures import Lane
from forge_nb.tinker.wire import TinkerRefusal, refusing

__all__ = ["BaseLane", "SamplingSession", "TrainingModel", "lora_section", "sampler_path", "state_path"]


def lora_section(lora: Any) -> dict[str, Any]:
    """forge_nb's ``trainer.lora`` section for Tinker's ``LoraConfig`` (None: the SDK's defaults, rank 32)."""
    rank = 32 if lora is None else lora.rank
    if rank < 1 or rank > 512:
        raise TinkerRefusal(f"lora_config.rank={rank}: 1 to 512")
    targets = []
    if lora is None or lora.train_attn:
        targets += ["q_proj", "k_proj", "v_proj", "o_proj"]
    if lora is None or lora.train_mlp:
        targets += ["gate_proj", "up_proj", "down_proj"]
    if lora is None or lora.train_unembed:
        targets.append("lm_head")
    if not targets:
        raise TinkerRefusal("lora_config: train_attn, train_mlp and train_unembed are all false; nothing would train")
    return {"rank": rank, "alpha": 2.0 * rank, "target_modules": targets}


def sampler_path(model_id: str, name: str) -> str:
    return f"tinker://{model_id}/sampler_weights/{name}"


def state_path(model_id: str, name: str) -> str:
    return f"tinker://{model_id}/weights/{name}"


@dataclass
class TrainingModel:
    """One training client: its run, the order of its calls, what its steps have added since the last one."""

    model_id: str
    run: Any
    lora: dict[str, Any]
    lane: Lane = field(default_factory=Lane)
    since_step: dict[str, float] = field(default_factory=dict)
    samplers: dict[str, int] = field(default_factory=dict)  # sampler path -> the version it holds

    @property
    def version(self) -> int:
        return self.run.version

    async def forward_backward(self, datums: list[dict[str, Any]], loss_fn: str, config: dict[str, float] | None,
                               backward: bool) -> dict[str, Any]:
        with refusing():  # the trainer's ValueError about these Datums is the caller's to fix
            result = await self.run.trainer.forward_backward.route(datums, loss_fn, config, backward=backward)
        if backward:
            add = self.since_step
            add["loss/sum"] = add.get("loss/sum", 0.0) + result["metrics"]["loss:sum"]
            add["datums"] = add.get("datums", 0.0) + len(datums)
            add["tokens"] = add.get("tokens", 0.0) + sum(len(d["tokens"]) for d in datums)
            for values in (d["inputs"].get("advantages") for d in datums):
                if values:
                    add["advantages/sum"] = add.get("advantages/sum", 0.0) + sum(values)
                    add["advantages/count"] = add.get("advantages/count", 0.0) + len(values)
        return result

    async def optim_step(self, adam: dict[str, float]) -> dict[str, float]:
        t0 = time.perf_counter()
        with refusing():
            metrics = await self.run.trainer.optim_step.route(**adam)
        done, self.since_step = self.since_step, {}
        row = {"loss": done.get("loss/sum", 0.0) / max(done.get("datums", 0.0), 1.0),
               "grad_norm": metrics["grad_norm:mean"], "lr": adam.get("learning_rate", 1e-4),
               "tokens": done.get("tokens", 0.0), "datums": done.get("datums", 0.0),
               "time/train_s": time.perf_counter() - t0, "skipped": metrics["skipped:sum"]}
        if done.get("advantages/count"):
            row["advantages/mean"] = done["advantages/sum"] / done["advantages/count"]
        record_outside_step(self.run.controller, row, "tinker")
        return metrics

    async def save_for_sampler(self) -> int:
        """Push the adapter as the run's next version, loaded on every generator; returns it."""
        return await publish_now(self.run.controller)

    async def save_state(self, name: str, root: Path) -> str:
        """A checkpoint of adapter, optimizer and step named ``name``, listed in ``root``'s index of saved states
        (``root``: the folder of the runs' directories); returns its Tinker path."""
        folder = Path(self.run.dir.path) / "tinker" / "weights" / name
        checkpoint = await self.run.trainer.save_checkpoint.route(None, str(folder))
        path = state_path(self.model_id, name)
        saved = _states(root)
        saved[path] = {"checkpoint": checkpoint, "lora": self.lora, "run": self.run.name}
        (root / STATES).write_text(json.dumps(saved, indent=1))
        return path

    async def load_state(self, path: str, optimizer: bool, root: Path) -> None:
        checkpoint = resolve_state(path, root)["checkpoint"]
        try:
            await self.run.trainer.load_checkpoint.route(checkpoint, optimizer=optimizer)
        except Exception as e:
            raise TinkerRefusal(f"load_state({path!r}): {getattr(e, 'exception', e)}") from None


#: the index of the states saved by training clients, in the folder of the runs' directories
STATES = "tinker_states.json"


def _states(root: Path) -> dict[str, Any]:
    """``root``'s index of saved states (empty before the first)."""
    index = root / STATES
    return json.loads(index.read_text()) if index.exists() else {}


def resolve_state(path: str, root: Path) -> dict[str, Any]:
    """What ``root``'s index says of the saved state ``path`` (``tinker://<model id>/weights/<name>``): its checkpoint
    folder and LoRA section; a TinkerRefusal when there is none (any more)."""
    if not path.startswith("tinker://") or "/weights/" not in path:
        raise TinkerRefusal(f"path {path!r}: a tinker://<model id>/weights/<name> path from save_state is needed")
    saved = _states(root)
    if path not in saved or not Path(saved[path]["checkpoint"]).exists():
        raise TinkerRefusal(f"path {path!r}: no such saved state (the index is {root / STATES})")
    return saved[path]


@dataclass
class SamplingSession:
    """What a sampling client samples with: a training client's adapter at one version, or the base model."""

    session_id: str
    model: TrainingModel | None  # None: the base model
    version: int

    @property
    def run(self) -> Any | None:
        return self.model.run if self.model is not None else None

    async def sample(self, prompt: list[int], overrides: dict[str, Any], base: BaseLane) -> list[Any]:
        if self.model is not None and self.model.version != self.version:
            raise TinkerRefusal(
                f"this sampling client holds version {self.version} of {self.model.model_id}, and the generators "
                f"now serve version {self.model.version}: forge_nb keeps each training client's newest weights "
                "only; use the sampling client of the newest save_weights_for_sampler")
        with refusing():  # the generator's ValueError about this prompt or these sampling values
            if self.model is None:
                return await base.generate(prompt, overrides)
            return await self.model.run.policy.generate.route(prompt, **overrides)


class BaseLane:
    """The base model alone on the served run's generators: a lane of its own whose adapter stays zero, added at the
    first request that needs it (it takes one of the generators' adapter slots) and to a respawned replica when a
    request finds it missing there."""

    def __init__(self, run: Any) -> None:
        self.run, self.namespace = run, f"{run.weights_namespace}-tinker-base"
        self._added = False

    async def generate(self, prompt: list[int], overrides: dict[str, Any]) -> list[Any]:
        generators = self.run.base.policy.service
        for attempt in range(2):
            if not self._added or attempt:
                with refusing("sampling the base model: "):
                    lora = dataclasses.asdict(self.run.config.trainer.lora)  # the served run's rank and targets
                    await generators.add_adapter.fanout(self.namespace, lora)
                self._added = True
            try:
                return await generators.generate.route(prompt, adapter=self.namespace, **overrides)
            except Exception as e:  # a replica respawned since: it serves the runs' lanes, not this one
                if attempt or not isinstance(getattr(e, "exception", e), KeyError):
                    raise
        raise AssertionError("unreachable")

    async def drop(self) -> None:
        if self._added:
            self._added = False
            await self.run.base.policy.service.drop_adapter.fanout(self.namespace)


def new_id(prefix: str) -> str:
    return f"{prefix}-{secrets.token_hex(4)}"
