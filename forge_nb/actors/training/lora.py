"""LoRA on the trainer's policy: adapters injected with peft, trained alone, saved in peft's format.

:func:`inject` puts peft's LoRA layers (``peft.inject_adapter_in_model``) into the policy's linear layers named by
``LoraConfig.target_modules``; peft leaves only the adapters trainable, so the trainer's optimizer holds them alone
and a checkpoint (``checkpoint``, which leaves frozen parameters out) holds them alone. :func:`adapter_state_dict`
is what a push moves: the adapters' tensors under peft's names (``model.layers.0.self_attn.q_proj.lora_A.weight``).
:func:`adapters_off` runs a block on the base model (the KL term's reference, in the trainer's own process), and
:func:`with_base_reference` gives a training batch that came without reference logprobs the base's: a LoRA run's
episodes carry none, so the reference costs one forward of the batch at its step, not a call per group.
:func:`save_adapter` writes an adapter folder in peft's format, which ``peft.PeftModel.from_pretrained`` and
vLLM's ``LoRARequest`` load; :func:`save_merged` a whole model folder with the adapters merged into its weights.

Several runs on one base: each adapter is named after its run's weights namespace, and one model in one process
can hold several runs' adapters (``RLTrainer(..., share_base=True)`` takes the model another LoRA trainer of the
process loaded: :func:`offer_base` / :func:`shared_base`). :func:`active` makes one run's adapter the model's active
(and only trainable) one for a block, under a process-wide lock; :func:`adapter_parameters` are what that run's
optimizer holds; :func:`drop` takes a run's adapter out when the run ends.

Considered: hand-written LoRA layers (a few lines each, but then the format, the merge and every later peft fix
would be ours too) and ``peft.get_peft_model`` (it wraps the model in a ``PeftModel``, whose forward and names
differ from the plain model's that the rest of the trainer reads; ``inject_adapter_in_model`` changes the layers
in place and nothing else).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from forge_nb.config.trainer_sections import VLLM_MAX_LORA_RANK, LoraConfig

__all__ = ["active", "adapter_config", "adapter_names", "adapter_parameters", "adapter_state_dict", "adapters_off",
           "drop", "engine_lora_args", "inject", "merged_state_dict", "offer_base", "peft_config", "runs_served",
           "save_adapter", "save_merged", "shared_base", "with_base_reference", "withdraw_base", "write_adapter"]

#: The prefix peft's saved adapters carry (a PeftModel's own module path): vLLM's loader expects it.
PEFT_PREFIX = "base_model.model."


def peft_config(cfg: LoraConfig, base_model: str | None = None) -> Any:
    """peft's ``LoraConfig`` for ``cfg``."""
    import peft

    return peft.LoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                           target_modules=list(cfg.target_modules), base_model_name_or_path=base_model)


def inject(module: torch.nn.Module, cfg: LoraConfig, name: str = "default") -> None:
    """Adapters named ``name`` into ``module``'s target layers, in place; everything else frozen (another
    adapter already there stays as it is). A target the model lacks is a ValueError that lists the linear
    layers it has."""
    import peft

    try:
        with _ACTIVE:  # another run's trainer may be training on this model in this process
            peft.inject_adapter_in_model(peft_config(cfg), module, adapter_name=name)
    except ValueError as e:  # peft's NoMatchingPeftModuleError is one
        names = sorted({n.rsplit(".", 1)[-1] for n, m in module.named_modules() if isinstance(m, torch.nn.Linear)})
        raise ValueError(f"lora.target_modules={list(cfg.target_modules)}: {e} The model's linear layers are "
                         f"named {names}") from None
    missing = set(cfg.target_modules) - {n.rsplit(".", 1)[-1] for n, m in _tuner_layers(module, named=True)
                                         if name in getattr(m, "lora_A", {})}
    if missing:
        raise ValueError(f"lora.target_modules: {sorted(missing)} matched no layer of the model; leave them out")


def adapter_state_dict(module: torch.nn.Module, whole: dict[str, torch.Tensor] | None = None,
                       name: str = "default") -> dict[str, torch.Tensor]:
    """The tensors of the adapter ``name`` under peft's names (without the adapter's name), as they are (no
    copy); taken from ``whole`` (the module's full state dict, gathered from its shards) when given."""
    from peft import get_peft_model_state_dict

    # the adapters alone: with the output layer among the targets peft would add its whole (frozen) weight
    return get_peft_model_state_dict(module, state_dict=whole, adapter_name=name, save_embedding_layers=False)


def adapter_parameters(module: torch.nn.Module, name: str) -> list[torch.nn.Parameter]:
    """The parameters of the adapter ``name``: what its optimizer holds (the model may hold other runs')."""
    return [p for layer in _tuner_layers(module) for attr in layer.adapter_layer_names
            if name in getattr(layer, attr) for p in getattr(layer, attr)[name].parameters()]


#: One adapter a time is active in a model several runs' trainers share (``active``).
_ACTIVE = threading.RLock()


@contextlib.contextmanager
def active(module: torch.nn.Module, name: str) -> Iterator[None]:
    """The block runs with the adapter ``name`` alone active (and trainable), other runs' adapters off; a layer
    without it is the base layer. Several trainers in one process share a model through this lock."""
    with _ACTIVE:
        for layer in _tuner_layers(module):
            layer.set_adapter(name)
        yield


def drop(module: torch.nn.Module, name: str) -> int:
    """Remove the adapter ``name`` from every layer holding it; returns how many adapters the model holds
    after (0: none is left)."""
    with _ACTIVE:
        left: set[str] = set()
        for layer in _tuner_layers(module):
            if name in layer.lora_A:
                layer.delete_adapter(name)
            left.update(layer.lora_A)
        return len(left)


def adapter_names(module: torch.nn.Module) -> list[str]:
    """The names of the adapters ``module`` holds, sorted."""
    return sorted({name for layer in _tuner_layers(module) for name in layer.lora_A})


def _tuner_layers(module: torch.nn.Module, named: bool = False) -> list[Any]:
    from peft.tuners.tuners_utils import BaseTunerLayer

    return [(n, m) if named else m for n, m in module.named_modules() if isinstance(m, BaseTunerLayer)]


#: model path -> (the policy, why not torchtitan): the base a LoRA trainer loaded in this process, which another
#: run's trainer spawned into the same process trains its adapters on (``RLTrainer(..., share_base=True)``).
_BASES: dict[str, tuple[Any, str | None]] = {}


def offer_base(path: str, policy: Any, fallback_reason: str | None) -> None:
    """Let later trainers in this process train their adapters on ``policy`` (the newest offer of a path wins)."""
    _BASES[path] = (policy, fallback_reason)


def shared_base(path: str) -> tuple[Any, str | None]:
    """The policy a LoRA trainer of this process loaded from ``path``; a ValueError when none did."""
    if path not in _BASES:
        raise ValueError(f"share_base=True: no LoRA trainer in this process holds {path!r} (it holds "
                         f"{sorted(_BASES) or 'none'}); spawn this trainer on the base run's trainer processes")
    return _BASES[path]


def withdraw_base(policy: Any) -> None:
    """``policy`` is no base to share any more (its last adapter is gone)."""
    for path in [p for p, (held, _) in _BASES.items() if held is policy]:
        del _BASES[path]


@contextlib.contextmanager
def adapters_off(module: torch.nn.Module) -> Iterator[None]:
    """The block runs on the base model: every adapter of ``module`` disabled, and enabled again after."""
    layers = _tuner_layers(module)
    for layer in layers:
        layer.enable_adapters(False)
    try:
        yield
    finally:
        for layer in layers:
            layer.enable_adapters(True)


def with_base_reference(policy: Any, batch: Any, temperature: float) -> Any:
    """``batch`` (a TrainBatch) with the base model's logprobs of its responses as its reference logprobs, when it
    came without them: one no-grad forward of the whole batch with every adapter off. The base never changes, so
    these are the values a per-episode reference call at rollout time would have given."""
    if batch.has_ref_logprobs:
        return batch
    from forge_nb.actors.training.policy_model import response_logprobs

    with torch.no_grad(), adapters_off(policy.module):
        logits = policy.logits(batch.tokens, batch.request_len)
        ref = response_logprobs(logits, batch.tokens, batch.request_len, temperature).float()
    return dataclasses.replace(batch, ref_logprobs=ref, has_ref_logprobs=True)


def adapter_config(cfg: LoraConfig, base_model: str) -> dict[str, Any]:
    """The adapter_config.json of ``cfg``'s adapters on ``base_model``, as peft writes it."""
    return json.loads(json.dumps(peft_config(cfg, base_model).to_dict(), default=list))


def save_adapter(folder: str | Path, state: dict[str, torch.Tensor], cfg: LoraConfig, base_model: str) -> Path:
    """``state`` (:func:`adapter_state_dict`'s names) as a peft adapter folder: ``adapter_config.json`` naming
    ``base_model``, and ``adapter_model.safetensors``."""
    return write_adapter(folder, state, adapter_config(cfg, base_model))


def write_adapter(folder: str | Path, state: dict[str, torch.Tensor], config: dict[str, Any]) -> Path:
    """``state`` and ``config`` (:func:`adapter_config`) as a peft adapter folder."""
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
    save_file({PEFT_PREFIX + k: v.detach().to("cpu").contiguous() for k, v in state.items()},
              str(folder / "adapter_model.safetensors"))
    return folder


def merged_state_dict(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The model's weights with the active adapter merged into them (``W + B A * alpha / rank``), under the plain
    model's names (a copy on the CPU); the module is left as it was."""
    layers = _tuner_layers(module)
    for layer in layers:
        layer.merge()
    try:
        return {k.replace(".base_layer.", "."): v.detach().to("cpu", copy=True)
                for k, v in module.state_dict().items() if ".lora_" not in k}
    finally:
        for layer in layers:
            layer.unmerge()


def save_merged(folder: str | Path, module: torch.nn.Module, base_model: str) -> Path:
    """A whole model folder: ``base_model``'s files (config, tokenizer) and the merged weights as
    ``model.safetensors``, which transformers and vLLM load as any checkpoint."""
    import shutil

    from safetensors.torch import save_file

    folder, base = Path(folder), Path(base_model)
    folder.mkdir(parents=True, exist_ok=True)
    for item in base.iterdir():
        if item.is_file() and item.suffix != ".safetensors" and not item.name.endswith(".safetensors.index.json"):
            shutil.copy2(item, folder / item.name)
    save_file({k: v.contiguous() for k, v in merged_state_dict(module).items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})
    return folder


#: The ranks vLLM's LoRA kernels are built for (``vllm.config.lora.MaxLoRARanks``).
VLLM_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)


#: The runs one LoRA generator serves by default (``engine_lora_args``): each needs room for two adapters.
RUNS_PER_BASE = 4


def engine_lora_args(cfg: LoraConfig) -> dict[str, Any]:
    """vLLM engine arguments that let a generator serve ``cfg``'s adapters: LoRA on, room for ``RUNS_PER_BASE``
    runs' adapters (each run's version serving and the one loading), the smallest of vLLM's ranks that holds
    ``cfg.rank``."""
    fits = [r for r in VLLM_RANKS if r >= cfg.rank]
    if not fits:
        raise ValueError(f"lora.rank={cfg.rank}: vLLM serves adapters of rank <= {VLLM_MAX_LORA_RANK}")
    return {"enable_lora": True, "max_loras": 2 * RUNS_PER_BASE, "max_lora_rank": fits[0]}


def runs_served(engine_args: dict[str, Any]) -> int:
    """How many runs' adapters an engine with these (LoRA) arguments holds at once: two adapters each."""
    slots = min(int(engine_args.get("max_loras", 1)), int(engine_args.get("max_cpu_loras") or 10**9))
    return max(1, slots // 2)
