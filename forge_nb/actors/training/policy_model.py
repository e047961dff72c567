"""The policy network the trainer and the reference model run: engine choice, loading, FSDP2, forward.

Two engines hold the same Qwen3 architecture:

* ``"torchtitan"``: torchtitan's model definition (``forge_nb.actors.training.titan``), where torchtitan can train
  (CUDA, and a torch that torchtitan 0.3 imports on);
* ``"transformers"``: ``AutoModelForCausalLM`` with sdpa attention, everywhere else (and for any
  architecture transformers knows).

``"auto"`` picks torchtitan where :func:`forge_nb.actors.training.titan.why_not_trainable` finds no reason
against it, and otherwise logs the reason once per process and uses transformers. Everything after
loading (FSDP2 sharding, the forward with left-padding masks, the full HF-named state dict) is shared, so
the CPU tests exercise the code the CUDA path runs.

Left padding: episodes left-pad prompts to a fixed ``request_len``. vLLM never saw those pads, so the
forward masks them and restarts positions at the first real token; the logprobs then match the
generator's instead of drifting with the amount of padding. Columns that are padding in every row of a batch
change nothing but the cost, so :meth:`PolicyModel.without_shared_padding` drops them before the forward
(as TRL pads a batch's prompts to its longest): the quickstart's one-token prompts, padded to 4, made its
training batches 8 columns wide where 5 hold every real token, and its training step ~2.5 ms (20%) slower.
"""

from __future__ import annotations

import json
import logging
import os
import zlib
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from forge_nb.actors.training.titan import TitanQwen3, why_not_trainable
from forge_nb.system import dist_cache

logger = logging.getLogger(__name__)

_logged_fallbacks: set[str] = set()


def device_for_rank(rank: int) -> torch.device:
    """``cuda:rank`` (the runtime gives a GPU mesh its GPUs in rank order) or the CPU."""
    if torch.cuda.is_available():
        return torch.device("cuda", rank % torch.cuda.device_count())
    return torch.device("cpu")


def choose_engine(requested: str, device: torch.device, model_type: str) -> tuple[str, str]:
    """(engine, why): the engine to load and, when "auto" fell back, the reason (else "").

    The reference model follows the trainer's rule even though torchtitan's forward would run on CPU:
    both actors then compute logprobs with the same numerics, and transformers imports faster there.
    """
    if requested == "transformers":
        return "transformers", ""
    reason = why_not_trainable(device, model_type)
    if requested == "torchtitan":
        if reason:
            raise RuntimeError(f"engine='torchtitan' cannot run here: {reason}. Use engine='auto'.")
        return "torchtitan", ""
    if reason is None:
        return "torchtitan", ""
    message = f"torchtitan is not used ({reason}); falling back to transformers (sdpa) + plain torch"
    if message not in _logged_fallbacks:  # once per process, however many models it loads
        _logged_fallbacks.add(message)
        (logger.warning if device.type == "cuda" else logger.info)(message)
    return "transformers", reason


def one_cpu_thread() -> None:
    """On CPU, one intra-op thread for this process unless ``OMP_NUM_THREADS`` says otherwise.

    The trainer and the reference model share the CPU with vLLM's engines, whose workers (pinned to cores)
    and engine cores busy-wait for a second after each message. With torch's default of one thread per
    core, a forward or backward waits at every parallel region for its thread on the busiest core: on 2
    cores the quickstart's ``train_step`` took ~50 ms most steps and ~1 s (a spin period) every few steps,
    2.4-2.8 steps/s overall; with one thread every step took 25-90 ms, 5.0 steps/s (bench/vs_trl.py,
    bench/HISTORY.md). vLLM drops its own CPU workers to one thread for the same reason."""
    if "OMP_NUM_THREADS" not in os.environ and torch.get_num_threads() != 1:
        logger.info("using 1 CPU thread (was %d): the CPU is shared with the generators' engines; "
                    "set OMP_NUM_THREADS to choose", torch.get_num_threads())
        torch.set_num_threads(1)


def flush_denormals() -> None:
    """On CPU, compute with denormal floats as zero (torch's ``set_flush_denormal``: x86's FTZ and DAZ) in this thread,
    the one the actor's steps run in.

    A long run's optimizer state and gradients drift into denormal range (below 1.2e-38 in float32), where every
    operation on them takes the CPU's slow path: the quickstart's ``train_step`` went from ~10.5 to 12-14 ms
    after ~4,000 steps (73 -> 45-65 steps/s) and stayed there; flushed, 10.7-11.4 ms to step 6,000. A value that
    small is zero to a model's update (Adam divides by the root of its second moment plus ``eps``, 1e-8)."""
    torch.set_flush_denormal(True)


def flushes_denormals() -> bool:
    """Whether this thread computes with denormal floats as zero (what ``info()`` reports)."""
    return torch.tensor(1e-39).mul(2.0).item() == 0.0


class PolicyModel:
    """A causal LM on one device, maybe FSDP2-sharded, with a padding-aware forward and HF-named weights."""

    def __init__(self, path: str, engine: str, device: torch.device, pad_id: int | None):
        self.path, self.engine, self.device, self.pad_id = path, engine, device, pad_id
        self.sharded = False
        if device.type == "cuda":
            torch.cuda.set_device(device)  # NCCL and FSDP use the current device
        self._titan: TitanQwen3 | None = None
        if engine == "torchtitan":
            self._titan = TitanQwen3(path, device)
            self.module: torch.nn.Module = self._titan.module
        else:
            with dist_cache.cached_packages_distributions():  # transformers' import-time scan of the venv
                from transformers import AutoModelForCausalLM

            self.module = AutoModelForCausalLM.from_pretrained(
                path, dtype=torch.float32, attn_implementation="sdpa"
            ).to(device)

    @classmethod
    def load(cls, path: str, requested: str, rank: int, pad_id: int | None = None) -> tuple[PolicyModel, str]:
        """Load ``path`` (a resolved local folder) on this rank's device; returns (model, fallback reason)."""
        config = read_config(path)
        device = device_for_rank(rank)
        if device.type == "cpu":
            one_cpu_thread()
            flush_denormals()
        engine, reason = choose_engine(requested, device, config.get("model_type", ""))
        if pad_id is None:
            pad_id = _pad_id(path, config)
        return cls(path, engine, device, pad_id), reason

    def blocks(self) -> list[torch.nn.Module]:
        """The transformer blocks: FSDP2's unit of sharding."""
        if self._titan is not None:
            return self._titan.blocks()
        names = set(getattr(self.module, "_no_split_modules", None) or [])
        return [m for m in self.module.modules() if type(m).__name__ in names]

    def shard(self, world: int) -> None:
        """FSDP2 over every rank: each block, then the root (embeddings, norm, head)."""
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh(self.device.type, (world,))
        for block in self.blocks():
            fully_shard(block, mesh=mesh)
        fully_shard(self.module, mesh=mesh)
        self.sharded = True

    def logits(self, tokens: torch.Tensor, request_len: int | None = None,
               attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits [B, L, V] for ``tokens`` [B, L], with left padding masked (see the module docstring), or the
        positions ``attention_mask`` [B, L] says are real (1) when given."""
        tokens = tokens.to(self.device)
        if attention_mask is None:
            attention_mask = real_token_mask(tokens, self.pad_id, request_len)
        attention_mask = attention_mask.to(self.device)
        positions = (attention_mask.cumsum(1) - 1).clamp(min=0)
        if self._titan is not None:
            return self._titan.logits(tokens, positions)
        out = self.module(
            input_ids=tokens, attention_mask=attention_mask, position_ids=positions, use_cache=False
        )
        return out.logits

    def without_shared_padding(self, tokens: torch.Tensor, request_len: int) -> tuple[torch.Tensor, int]:
        """``tokens`` without the leading columns that are left padding in every row, and ``request_len`` less
        as many. The logits of the columns kept are those of the whole batch: a dropped column was masked in
        every row, and positions count real tokens only. torchtitan's batches keep their width: its
        FlexAttention is compiled for each sequence length it meets."""
        if self._titan is not None or self.pad_id is None or tokens.dim() != 2 or request_len <= 1:
            return tokens, request_len
        real = real_token_mask(tokens[:, :request_len], self.pad_id, request_len)
        drop = int(real.any(0).int().argmax())  # the first column a row needs (request_len - 1 at the latest)
        return (tokens[:, drop:], request_len - drop) if drop else (tokens, request_len)

    def hf_state_dict(self, copy: bool = True, cpu: bool = True) -> dict[str, torch.Tensor]:
        """Whole HF-named weights on the CPU. Collective when sharded: every rank must call it; rank 0 gets
        the weights, the others an empty dict. ``copy=False`` may return the live parameters themselves
        (read them before the next optimizer step); with ``cpu=False`` too, an unsharded model's stay on
        its device (a push converts them there and copies them out once)."""
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            state = get_model_state_dict(
                self.module, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
            )
        else:
            device = "cpu" if cpu else self.device
            state = {k: v.detach().to(device, copy=copy) for k, v in self.module.state_dict().items()}
        if self._titan is not None and state:
            state = self._titan.to_hf(state)
        return state


def read_config(path: str) -> dict[str, Any]:
    return json.loads((Path(path) / "config.json").read_text())


def read_generation_config(path: str) -> dict[str, Any]:
    """The model folder's ``generation_config.json`` ({} without one): its pad and EOS tokens."""
    generation = Path(path) / "generation_config.json"
    return json.loads(generation.read_text()) if generation.exists() else {}


def _pad_id(path: str, config: dict[str, Any]) -> int | None:
    if isinstance(config.get("pad_token_id"), int):
        return config["pad_token_id"]
    pad = read_generation_config(path).get("pad_token_id")
    if isinstance(pad, int):
        return pad
    logger.info("no pad_token_id in %s: left padding will not be masked (pass pad_id= to mask it)", path)
    return None


def real_token_mask(tokens: torch.Tensor, pad_id: int | None, request_len: int | None) -> torch.Tensor:
    """[B, L] long: 0 on the leading run of ``pad_id`` (left padding), 1 elsewhere.

    Only the request part can hold left padding; the column just before the response always counts as
    real, so a row whose prompt is all padding still predicts its first response token from something.
    """
    mask = torch.ones_like(tokens)
    if pad_id is None:
        return mask
    end = tokens.shape[1] if request_len is None else request_len
    if end <= 0:
        return mask
    seen = (tokens[:, :end] != pad_id).long().cumsum(1) > 0
    mask[:, :end] = seen.long()
    mask[:, end - 1] = 1
    return mask


def response_logprobs(
    logits: torch.Tensor, tokens: torch.Tensor, request_len: int, temperature: float = 1.0
) -> torch.Tensor:
    """Per-token logprobs [B, Lr] of the response columns ``tokens[:, request_len:]``, from the logits of the
    whole sequence."""
    from forge_nb.rl import aligned_logits, compute_logprobs

    response = tokens[:, request_len:].to(logits.device)
    return compute_logprobs(aligned_logits(logits, response.shape[1]), response, temperature=temperature)


def init_distributed(rank: int, world: int, device: torch.device, port: int, timeout_s: float) -> None:
    """Join the trainer's process group (gloo on CPU, NCCL for CUDA tensors plus gloo for CPU ones)."""
    if dist.is_initialized():  # torch allows one default group per process
        if (dist.get_rank(), dist.get_world_size()) != (rank, world):
            raise RuntimeError(
                f"this process already belongs to a process group of {dist.get_world_size()} ranks; "
                "spawn each sharded trainer on a mesh of its own"
            )
        return
    os.environ["MASTER_ADDR"] = "127.0.0.1"  # forge_nb meshes live on the kernel's host
    os.environ["MASTER_PORT"] = str(port)
    for key, value in {"RANK": rank, "WORLD_SIZE": world, "LOCAL_RANK": rank, "LOCAL_WORLD_SIZE": world}.items():
        os.environ[key] = str(value)
    backend = "cpu:gloo,cuda:nccl" if device.type == "cuda" else "gloo"
    kwargs: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
    try:
        dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=timeout_s), **kwargs)
    except RuntimeError as e:  # DistNetworkError (port in use) and DistStoreError (a rank never came) included
        raise RuntimeError(
            f"rank {rank}/{world} could not join the trainer's process group at 127.0.0.1:{port} ({e}); "
            "if the port is in use, pass parallelism={'master_port': <a free port>}"
        ) from e


def default_port(shared_name: str) -> int:
    """A port every rank derives alike from a name they share (the actor mesh's id), in 10000-29999:
    below Linux's ephemeral range, so an outgoing connection never holds it by chance."""
    return 10000 + zlib.crc32(shared_name.encode()) % 20000


def mesh_identity() -> tuple[int, int, str]:
    """(rank, world size, a name all ranks of this actor mesh share) from monarch's context."""
    import math

    from monarch.actor import context, current_rank, current_size

    rank = current_rank().rank
    world = math.prod(current_size().values())
    # actor ids look like "trainer__trainer<uid>.trainer-0<pid>@..."; the part before the first "."
    # names the actor mesh, the same on every rank and new on every spawn.
    shared = str(context().actor_instance.actor_id).split(".", 1)[0]
    return rank, world, shared


def all_ranks(flag: bool, world: int) -> bool:
    """True when ``flag`` holds on every rank of the process group."""
    if world == 1:
        return flag
    failures = torch.tensor([0.0 if flag else 1.0])
    dist.all_reduce(failures)  # a CPU tensor: gloo carries it on CUDA machines too
    return failures.item() == 0


def reduce_metrics(values: dict[str, float], world: int) -> dict[str, float]:
    """Mean over ranks ("tokens": sum; per-row lists concatenated in rank order), by name, so ranks need not report
    the same keys."""
    if world == 1:
        return values
    gathered: list[dict[str, float]] = [{} for _ in range(world)]
    dist.all_gather_object(gathered, values)
    out: dict[str, Any] = {}
    for key in gathered[0]:
        xs = [g[key] for g in gathered if key in g]
        if isinstance(xs[0], list):
            out[key] = [row for x in xs for row in x]
        else:
            out[key] = sum(xs) if key == "tokens" else sum(xs) / len(xs)
    return out
