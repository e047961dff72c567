"""RLTrainer: the actor that trains the policy (RL and SFT steps), pushes its weights and checkpoints it.

    trainer = mesh.spawn("trainer", RLTrainer, model="Qwen/Qwen3-1.7B", loss="grpo",
                         loss_config={"beta": 0.04}, optimizer={"lr": 1e-6},
                         checkpoint={"folder": "runs/r1/ckpt", "interval": 50})
    # or forge_nb's config as it is: RLTrainer, model=..., trainer=cfg.trainer, training={"seed": 0}
    await trainer.setup.call()
    result = await trainer.train_step.call(collate(episodes))    # every rank; a ForwardBackwardResult each
    await trainer.push_weights.call(version)

One step: each rank takes its contiguous slice of the batch, runs the policy (``training.policy_model``:
torchtitan where it can train, else transformers), and feeds per-token logprobs of the response to the
configured ``forge_nb.rl`` loss (``training.steps``, ``training.loss``); FSDP2 averages gradients over ranks (so
per-rank losses are averaged, as in torchforge), which are clipped and applied. A non-finite loss or gradient norm
on any rank skips the optimizer step on all of them and is reported (``skipped: 1.0`` plus
``skipped/nonfinite_loss`` or ``skipped/nonfinite_grad``), never raised: one bad batch should not end a
run that a notebook is steering. Endpoints that touch the model are collective over the trainer's ranks.

With a ``lora`` section (``RLTrainer(..., lora={"rank": 8})``, ``TrainerConfig.lora``) the trainer trains LoRA
adapters alone (``training.lora``: peft's layers on the transformers engine): the optimizer holds them, ``push_weights``
and ``state_dict`` carry them under peft's names, a checkpoint holds them (the base comes from the model's
files), ``forward(..., adapters=False)`` is the base model (the KL term's reference, in this process: a step whose
batch has no reference logprobs takes the base's), ``save_adapter(folder)`` writes them in peft's format and
``save_merged(folder)`` a whole model with them merged in.
Another run's LoRA trainer spawned into the same process with ``share_base=True`` trains its own adapter on that
model (no second copy of the base): each trainer keeps its own optimizer, steps, hyperparameters, pushes and
checkpoints, and its endpoints run with its adapter alone active (``training.lora.active``); ``release()`` takes its
adapter out when its run ends. ``forward_backward`` and ``optim_step`` are the Tinker API's two training calls.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from monarch.actor import endpoint

from forge_nb.actors.training import lora, sample, steps, tinker
from forge_nb.actors.training.config import hparams, model_source, trainer_arguments, with_hparams
from forge_nb.actors.training.loss import clip_and_step, loss_function
from forge_nb.actors.training.policy_model import (
    PolicyModel,
    default_port,
    device_for_rank,
    flushes_denormals,
    init_distributed,
    mesh_identity,
    reduce_metrics,
    response_logprobs,
)
from forge_nb.config import TrainerConfig
from forge_nb.config.trainer_sections import (
    SECTION_NAMES,
    TRAINER_SEED_SECTIONS,
    CheckpointConfig,
    LoraConfig,
    LRSchedulerConfig,
    OptimizerConfig,
    ParallelismConfig,
    TrainingConfig,
    read_section,
)
from forge_nb.rl import TrainBatch
from forge_nb.rl.types import Completions, ForwardBackwardResult, SeedBatch, TextTrainBatch
from forge_nb.service.actor import ForgeActor

__all__ = ["RLTrainer", "TitanTrainer"]

logger = logging.getLogger(__name__)


class RLTrainer(ForgeActor):
    """Trains the policy. Arguments are kept as given and validated by ``setup()``, where errors reach
    the caller (an exception in ``__init__`` would only kill the actor).

    Configure it with torchforge's sections (``optimizer=``, ``training=``, ``loss=``...), or with
    ``trainer=`` a ``TrainerConfig`` (``RunConfig.trainer``) as it is, the sections then adding only what
    the run decides (seed, warmup, checkpoint folder, sampling temperature). ``weights_namespace``: the
    torchstore key namespace ``push_weights`` writes under (one per run, so runs side by side never mix)."""

    needs_store = True  # push_weights / update_weights go through the kernel's torchstore

    def __init__(
        self,
        model: str | dict[str, Any],
        *,
        trainer: TrainerConfig | None = None,
        optimizer: dict[str, Any] | None = None,
        training: dict[str, Any] | None = None,
        loss: str | Callable[..., Any] | None = None,
        loss_config: dict[str, Any] | None = None,
        checkpoint: dict[str, Any] | None = None,
        parallelism: dict[str, Any] | None = None,
        lr_scheduler: dict[str, Any] | None = None,
        pad_id: int | None = None,
        weights_namespace: str = "policy",
        share_base: bool = False,
        **seed_sections: Any,
    ) -> None:
        sections = dict(optimizer=optimizer, training=training, checkpoint=checkpoint, parallelism=parallelism,
                        lr_scheduler=lr_scheduler, **seed_sections)
        self._args = dict(model=model, trainer=trainer, sections=sections, loss=loss, loss_config=loss_config,
                          pad_id=pad_id)
        self.weights_namespace = weights_namespace
        self.share_base = share_base  # a LoRA trainer on the model another LoRA trainer of this process loaded
        self.released = False
        self.step = 0
        self.policy: PolicyModel | None = None
        self.resumed: dict[str, Any] | None = None  # the checkpoint loaded last (info()["resumed"])
        self.sampler: sample.Sampler | None = None  # what generate samples with, made at its first call

    @endpoint
    async def setup(self) -> None:
        """Validate the configuration, join the process group, load and shard the model, maybe resume."""
        from forge_nb.models import resolve_model

        a = self._args
        sections, loss, loss_config = trainer_arguments(a["trainer"], a["sections"], a["loss"], a["loss_config"])
        unknown = set(sections) - set(SECTION_NAMES) - TRAINER_SEED_SECTIONS
        if unknown:
            raise ValueError(f"RLTrainer got unknown argument(s) {sorted(unknown)}")
        self.opt_cfg: OptimizerConfig = read_section(OptimizerConfig, "optimizer", sections.get("optimizer"))
        self.train_cfg: TrainingConfig = read_section(TrainingConfig, "training", sections.get("training"))
        self.sched_cfg: LRSchedulerConfig = read_section(LRSchedulerConfig, "lr_scheduler",
                                                         sections.get("lr_scheduler"))
        self.ckpt_cfg: CheckpointConfig = read_section(CheckpointConfig, "checkpoint", sections.get("checkpoint"))
        self.lora: LoraConfig | None = (None if sections.get("lora") is None else
                                        read_section(LoraConfig, "lora", sections["lora"]))
        parallelism: ParallelismConfig = read_section(ParallelismConfig, "parallelism", sections.get("parallelism"))
        self.loss_fn = loss_function(loss, loss_config)
        self.rank, self.world, shared = mesh_identity()
        parallelism.check_world(self.world)
        path = resolve_model(model_source(a["model"]))  # FileNotFoundError naming the model

        torch.manual_seed(self.train_cfg.seed)
        if self.share_base and (self.lora is None or self.world > 1):
            raise ValueError("share_base=True: a trainer trains on another's base model with a lora section and "
                             f"one proc (it has {'no lora section' if self.lora is None else f'{self.world} procs'})")
        if self.world > 1:
            port = parallelism.master_port or default_port(shared)
            device = device_for_rank(self.rank)
            init_distributed(self.rank, self.world, device, port, self.train_cfg.dist_timeout_s)
        if self.share_base:  # the model is in this process already: this run's adapters go beside the others'
            self.policy, self.fallback_reason = lora.shared_base(path)
        else:
            self.policy, self.fallback_reason = PolicyModel.load(path, self.train_cfg.engine, self.rank, a["pad_id"])
        self.base_model = path
        if self.lora is not None:
            if self.policy.engine != "transformers":
                raise ValueError(f"lora: the {self.policy.engine} engine does not take adapters yet; set "
                                 "training.engine='transformers' for a LoRA run")
            lora.inject(self.policy.module, self.lora, self.weights_namespace)
            if self.world == 1:
                lora.offer_base(path, self.policy, self.fallback_reason)
        if self.world > 1:
            self.policy.shard(self.world)
        trained = (lora.adapter_parameters(self.policy.module, self.weights_namespace) if self.lora is not None
                   else [p for p in self.policy.module.parameters() if p.requires_grad])
        self.optimizer = self.opt_cfg.build(trained)
        self.step = 0
        if self.ckpt_cfg.folder and self.ckpt_cfg.resume:
            self._load(None)

    # ------------------------------------------------------------------------------------------------
    # Steps

    @endpoint
    async def train_step(
        self, batch: TrainBatch | TextTrainBatch | SeedBatch | list[dict[str, Any]], targets: Any = None
    ) -> ForwardBackwardResult:
        """One RL step on ``batch``: a TrainBatch, torchforge's ``(inputs, targets)`` (as one SeedBatch or
        as two arguments), or the skill card's TextTrainBatch (per-token ``target_weights`` as advantages).

        With ``training.gradient_accumulation_steps = N`` the rank's rows are trained as N micro-batches
        whose gradients add up (each loss weighted by its share of the rows) before one optimizer step."""
        with self._adapter():
            start = time.perf_counter()
            return self._step(steps.rl_gradients(self, batch, targets), start)

    @endpoint
    async def sft_step(self, batch: TrainBatch | dict[str, torch.Tensor]) -> ForwardBackwardResult:
        """One supervised step: token-mean cross-entropy on the response tokens of a TrainBatch, or on
        ``labels`` (aligned with ``tokens``, -100 ignored) of a ``{"tokens", "labels"}`` dict."""
        with self._adapter():
            start = time.perf_counter()
            return self._step(steps.sft_gradients(self, batch), start)

    def _step(self, passes: steps.Gradients, start: float) -> ForwardBackwardResult:
        """Clip and step (or skip) on the gradients the step's passes left, then the step's metrics over ranks."""
        loss, metrics, tokens, reason = passes
        lr = self._lr()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        grad_norm = math.nan
        if reason:
            self.optimizer.zero_grad(set_to_none=True)
        else:
            grad_norm = clip_and_step(self.optimizer, self.train_cfg.max_norm)
            if not math.isfinite(grad_norm):  # the norm is global, so this too is the same on every rank
                reason = "nonfinite_grad"
        if reason:
            logger.warning("step %d skipped: %s (loss %s, grad norm %s)", self.step + 1, reason, loss.item(), grad_norm)
        else:
            self.step += 1
        mine = {"loss": float(loss), **metrics, "grad_norm": grad_norm, "tokens": float(tokens)}
        out = reduce_metrics(mine, self.world)
        out.update(lr=lr, step=float(self.step), skipped=float(bool(reason)))
        if reason:
            out[f"skipped/{reason}"] = 1.0
        out["time_s"] = time.perf_counter() - start
        if not reason and self.ckpt_cfg.interval and self.step % self.ckpt_cfg.interval == 0:
            self._save(self.step)
        return ForwardBackwardResult(loss=out["loss"], metrics=out)

    @endpoint
    async def forward_backward(self, datums: list[dict[str, Any]], loss_fn: str = "cross_entropy",
                               loss_fn_config: dict[str, Any] | None = None, *,
                               backward: bool = True) -> dict[str, Any]:
        """Tinker's ``forward_backward`` (``forward``: ``backward=False``) over ``datums`` (``{"tokens", "inputs"}``):
        gradients added until ``optim_step``; each Datum's target logprobs and the metrics (``training.tinker``)."""
        with self._adapter():
            return tinker.forward_backward(self, datums, loss_fn, loss_fn_config, backward)

    @endpoint
    async def optim_step(self, **adam_params: float) -> dict[str, float]:
        """The Tinker API's ``optim_step``: the gradients ``forward_backward`` added, applied with Tinker's
        ``AdamParams`` (``learning_rate``, ``beta1``, ``beta2``, ``eps``, ``weight_decay``, ``grad_clip_norm``)."""
        step = tinker.AdamStep(**adam_params)
        with self._adapter():
            metrics = tinker.optim_step(self.optimizer, step)
        self.step += 1 - int(metrics["skipped:sum"])
        return {**metrics, "step:max": float(self.step)}

    @endpoint
    async def set_hparams(self, **changes: Any) -> dict[str, tuple[Any, Any]]:
        """Change hyperparameters between steps: those declared hot with a trainer section on the config
        (lr, weight_decay, max_norm, temperature: ``forge_nb.config.trainer_hparam_sections``) and any field
        of the loss (beta, clip_eps, clip_low, clip_high, agg...). Returns {name: (old, new)} of what
        changed; unknown names or invalid values raise ValueError and change nothing."""
        before = hparams(self.opt_cfg, self.train_cfg, self.loss_fn)
        self.opt_cfg, self.train_cfg, self.loss_fn = with_hparams(self.opt_cfg, self.train_cfg, self.loss_fn, changes)
        for group in self.optimizer.param_groups:
            group["weight_decay"] = self.opt_cfg.weight_decay
        after = hparams(self.opt_cfg, self.train_cfg, self.loss_fn)
        return {k: (before[k], after[k]) for k in changes if before[k] != after[k]}

    # ------------------------------------------------------------------------------------------------
    # Weights, logprobs and checkpoints

    @endpoint
    async def push_weights(self, version: int, announce: bool = True) -> dict[str, Any]:
        """Store the whole policy (HF names, ``training.dtype``) in torchstore as ``version``. Every rank
        takes part in gathering the shards; rank 0 alone writes, and returns the shared-memory manifest
        under ``"manifest"`` (``update_weights(v, manifest=)`` then skips asking torchstore for it).

        ``announce=False``: the caller hands the manifest to every generator and puts it in torchstore
        itself (``weights.announce_version``; WeightSync does, in the background); ``"announced"`` says
        whether it is there already (always, when the tensors went through torchstore too)."""
        from forge_nb.weights import for_other_hosts, push_state_dict, stored_dtype

        start = time.perf_counter()
        dtype = self.train_cfg.torch_dtype
        state = self._weights()  # converted to `dtype` as it is written
        size = sum(t.numel() * stored_dtype(t, dtype).itemsize for t in state.values())
        manifest = None
        if self.rank == 0:
            manifest = await push_state_dict(state, version, dtype=dtype, namespace=self.weights_namespace,
                                             announce=announce)
        # pushed for other hosts, the manifest is in torchstore already (their readers ask it there)
        announced = announce or manifest is None or for_other_hosts(manifest)
        return {"version": float(version), "seconds": time.perf_counter() - start, "mb": size / 2**20,
                "manifest": manifest, "announced": announced}

    @endpoint
    async def forward(self, input_ids: torch.Tensor | TrainBatch, request_len: int | None = None, *,
                      adapters: bool = True) -> torch.Tensor:
        """Per-token logprobs [B, Lr] of the response part under the current policy (no gradient).
        ``adapters=False`` (a LoRA trainer): under the base model, its adapters off (the KL term's reference)."""
        if isinstance(input_ids, TrainBatch):
            input_ids, request_len = input_ids.tokens, input_ids.request_len
        if request_len is None:
            raise ValueError("forward(input_ids, request_len): say where the response starts")
        input_ids, request_len = self._policy().without_shared_padding(torch.as_tensor(input_ids), request_len)
        off = nullcontext() if adapters or self.lora is None else lora.adapters_off(self._policy().module)
        with self._adapter(), torch.no_grad(), self._autocast(), off:
            logits = self._policy().logits(input_ids, request_len)
            return response_logprobs(logits, input_ids, request_len, self.train_cfg.logits_temperature).cpu()

    @endpoint
    async def generate(self, prompt: str | list[int], **sampling: Any) -> Completions:
        """``n`` completions of ``prompt`` from the policy as it is now, sampled and returned as a Generator samples and
        returns them (``training.sample``): a run's rollouts while its generators start."""
        return sample.generate(self, [prompt], sampling)[0]

    @endpoint
    async def generate_many(self, prompts: list[Any], **sampling: Any) -> list[Completions]:
        """``generate`` of each prompt, sampled together: one forward a token for them all."""
        return sample.generate(self, prompts, sampling)

    @endpoint
    async def state_dict(self) -> dict[str, Any]:
        """Whole float32 weights (HF names), optimizer state and step on rank 0 (other ranks: {})."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        from forge_nb.actors.training import checkpoint

        policy = self._policy()
        weights = {k: v.detach().cpu().clone() for k, v in self._weights().items()}
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        with self._adapter(), checkpoint.keep_fresh(self.optimizer):
            optim = get_optimizer_state_dict(policy.module, self.optimizer, options=options)
        return {"model": weights, "optimizer": optim, "step": self.step} if self.rank == 0 else {}

    @endpoint
    async def save_adapter(self, folder: str) -> str:
        """A LoRA trainer's adapters as a peft adapter folder (``adapter_config.json`` naming the base model,
        ``adapter_model.safetensors``): ``peft.PeftModel.from_pretrained(base, folder)`` and vLLM's
        ``LoRARequest`` load it. Collective when sharded; rank 0 writes. Returns the folder."""
        if self.lora is None:
            raise ValueError("save_adapter: this trainer trains the whole model (no lora section); push_weights "
                             "or a checkpoint holds its weights")
        state = self._weights()
        if self.rank == 0:
            lora.save_adapter(folder, state, self.lora, self.base_model)
        return folder

    @endpoint
    async def save_merged(self, folder: str) -> str:
        """A LoRA trainer's policy as a whole model folder: the base model's files and its weights with the
        adapters merged in (``model.safetensors``), loadable as any checkpoint. Rank 0 writes (one proc: a
        sharded policy is gathered by ``save_adapter`` instead). Returns the folder."""
        if self.lora is None:
            raise ValueError("save_merged: this trainer trains the whole model (no lora section); push_weights or "
                             "a checkpoint holds its weights")
        if self._policy().sharded:
            raise ValueError("save_merged: the policy is sharded over the trainer's procs; save_adapter(folder) "
                             "writes the adapters, which peft merges with merge_and_unload()")
        with self._adapter():
            if self.rank == 0:
                lora.save_merged(folder, self._policy().module, self.base_model)
        return folder

    @endpoint
    async def save_checkpoint(self, step: int | None = None, folder: str | None = None) -> str:
        """Save model, optimizer and step as ``step_<step>`` (default: the current step) under ``folder`` (default:
        ``checkpoint.folder``, keeping its ``keep_last``); returns the checkpoint's folder."""
        return str(self._save(self.step if step is None else step, folder))

    def _save(self, step: int, folder: str | None = None) -> Path:
        from forge_nb.actors.training import checkpoint

        if not (folder or self.ckpt_cfg.folder):
            raise ValueError("no checkpoint folder: create the trainer with checkpoint={'folder': ...}")
        module, keep = self._policy().module, None if folder else self.ckpt_cfg.keep_last
        with self._adapter():  # the others' adapters frozen: the checkpoint holds this run's alone
            return checkpoint.save(folder or self.ckpt_cfg.folder, step, module, self.optimizer, {"step": self.step},
                                    keep)

    @endpoint
    async def load_checkpoint(self, path: str | None = None, optimizer: bool = True) -> int | None:
        """Load ``path``, or the latest complete checkpoint in ``checkpoint.folder``; returns the restored
        step, or None when the folder holds no complete checkpoint. Hyperparameters stay as configured
        (or as set_hparams left them). ``optimizer=False``: the weights alone (Tinker's ``load_state``)."""
        step = self._load(path)
        if not optimizer:
            self.optimizer.state.clear()
        return step

    def _load(self, path: str | None) -> int | None:
        from forge_nb.actors.training import checkpoint

        if (resumed := checkpoint.load_into(self, path)) is None:
            return None
        self.step, self.resumed = resumed["step"], resumed
        return self.step

    @endpoint
    async def info(self) -> dict[str, Any]:
        """Engine, why torchtitan was not used (if so), device, CPU threads, ranks, step, hyperparameters, the
        checkpoint loaded last (``resumed``: its path, step, and when its files were checked; None if none), and a
        LoRA trainer's ``adapters``: every run's adapter in its model (their weights namespaces)."""
        policy = self._policy()
        return {
            "engine": policy.engine, "fallback_reason": self.fallback_reason, "device": str(policy.device),
            "cpu_threads": torch.get_num_threads(), "flush_denormal": flushes_denormals(),
            "world_size": self.world, "rank": self.rank, "step": self.step,
            "hparams": hparams(self.opt_cfg, self.train_cfg, self.loss_fn), "resumed": self.resumed,
            "adapters": lora.adapter_names(policy.module) if self.lora is not None else [],
        }

    @endpoint
    async def release(self) -> None:
        """A LoRA trainer leaves the model it may share with other runs' trainers in this process: its adapter
        and optimizer go, the others train on (the base goes with the last adapter). Its endpoints refuse after."""
        if self.lora is not None and self.policy is not None:
            if lora.drop(self.policy.module, self.weights_namespace) == 0:
                lora.withdraw_base(self.policy)
            self.policy, self.released = None, True
            del self.optimizer

    @endpoint
    async def cleanup(self) -> None:
        """Leave the process group (before the mesh stops; a stopped proc leaves it anyway)."""
        if dist.is_initialized():
            dist.destroy_process_group()

    def _weights(self) -> dict[str, torch.Tensor]:
        """What a push moves: the whole policy (HF names), or a LoRA trainer's adapters (peft's names); the live
        tensors, on their device (read them before the next optimizer step). Collective when sharded."""
        policy = self._policy()
        if self.lora is None:
            return policy.hf_state_dict(copy=False, cpu=False)
        whole = policy.hf_state_dict(copy=False, cpu=False) if policy.sharded else None  # gathered on rank 0
        return {} if whole == {} else lora.adapter_state_dict(policy.module, whole, self.weights_namespace)

    def _adapter(self) -> AbstractContextManager[Any]:
        """A LoRA trainer's block: this run's adapter the model's active one (other runs' may share the model)."""
        return nullcontext() if self.lora is None else lora.active(self._policy().module, self.weights_namespace)

    def _policy(self) -> PolicyModel:
        if self.policy is None:
            if self.released:
                raise RuntimeError("this trainer released its adapter (release()): spawn another to train again")
            raise RuntimeError("the trainer is not set up: await trainer.setup.call() first")
        return self.policy

    def _autocast(self) -> AbstractContextManager[Any]:
        dtype = self.train_cfg.torch_dtype
        return nullcontext() if dtype == torch.float32 else torch.autocast(self._policy().device.type, dtype=dtype)

    def _lr(self) -> float:
        """The lr of the next optimizer step: ``optimizer.lr`` on torchtitan's schedule (``LRSchedulerConfig``)."""
        return self.opt_cfg.lr * self.sched_cfg.factor(self.step, self.train_cfg.steps)


TitanTrainer = RLTrainer
"""torchforge's name for the trainer actor."""
