"""ReferenceModel: a frozen copy of the initial policy that scores episodes for the KL penalty.

    ref = mesh.spawn("ref", ReferenceModel, model="Qwen/Qwen3-1.7B")
    await ref.setup.call()
    ref_logprobs = await ref.forward.call_one(input_ids, max_req_tokens, return_logprobs=True)  # [B, Lr]

It loads the model the way the trainer does (same engine choice, same masking of left padding, same
logprob arithmetic in float32), so before the first optimizer step its logprobs equal the trainer's. Each
proc holds a whole copy: replicas scale throughput (``as_service(num_replicas=...)``), and a request goes
to one proc (``.route`` / ``.call_one``), never through a collective.
"""

from __future__ import annotations

from typing import Any

import torch
from monarch.actor import endpoint

from forge_nb.actors.training.config import model_source
from forge_nb.actors.training.policy_model import PolicyModel, flushes_denormals, mesh_identity, response_logprobs
from forge_nb.config import REFERENCE_SECTIONS
from forge_nb.config.trainer_sections import TrainingConfig, read_section
from forge_nb.rl import TrainBatch
from forge_nb.service.actor import ForgeActor

__all__ = ["ReferenceModel"]

# Sections of torchforge's ref_model config that only torchtitan's engine reads.
_SEED_SECTIONS = REFERENCE_SECTIONS - {"training"}  # torchforge's, accepted and ignored


class ReferenceModel(ForgeActor):
    """Frozen policy (eval mode, no gradients). ``training`` takes ``dtype``, ``engine`` and
    ``temperature`` (the generator's sampling temperature) as RLTrainer's does."""

    def __init__(
        self,
        model: str | dict[str, Any],
        *,
        training: dict[str, Any] | None = None,
        pad_id: int | None = None,
        **seed_sections: Any,
    ) -> None:
        self._args: dict[str, Any] = {
            "model": model, "training": training, "pad_id": pad_id, "seed_sections": seed_sections,
        }
        self.policy: PolicyModel | None = None

    @endpoint
    async def setup(self) -> None:
        from forge_nb.models import resolve_model

        unknown = set(self._args["seed_sections"]) - _SEED_SECTIONS
        if unknown:
            raise ValueError(f"ReferenceModel got unknown argument(s) {sorted(unknown)}")
        self.config: TrainingConfig = read_section(TrainingConfig, "training", self._args["training"])
        path = resolve_model(model_source(self._args["model"]))
        rank, _, _ = mesh_identity()
        self.policy, self.fallback_reason = PolicyModel.load(
            path, self.config.engine, rank, pad_id=self._args["pad_id"]
        )
        self.policy.module.eval()
        self.policy.module.requires_grad_(False)

    @endpoint
    async def forward(
        self,
        input_ids: torch.Tensor | TrainBatch,
        max_req_tokens: int | None = None,
        return_logprobs: bool = True,
        *,
        request_len: int | None = None,
    ) -> torch.Tensor:
        """Logprobs [B, L - max_req_tokens] of ``input_ids[:, max_req_tokens:]`` (float32, CPU), or with
        ``return_logprobs=False`` the logits [B, L, V]. A TrainBatch brings its own request length.

        ``max_req_tokens`` has torchforge's meaning: every request is left-padded to that many columns, so
        the response starts there (``request_len`` is forge_nb's name for the same number)."""
        if self.policy is None:
            raise RuntimeError("the reference model is not set up: await ref.setup.call() first")
        if request_len is not None and max_req_tokens not in (None, request_len):
            raise ValueError(f"max_req_tokens={max_req_tokens} and request_len={request_len} name the same "
                             "column (where the response starts); pass one")
        start = request_len if request_len is not None else max_req_tokens
        if isinstance(input_ids, TrainBatch):
            input_ids, start = input_ids.tokens, input_ids.request_len
        input_ids = torch.as_tensor(input_ids)
        if input_ids.dim() == 1:
            input_ids = input_ids.unsqueeze(0)
        if start is None or not 0 < start < input_ids.shape[1]:
            raise ValueError(
                f"max_req_tokens={start!r} for input_ids of shape {tuple(input_ids.shape)}: the response "
                f"must start at a column between 1 and {input_ids.shape[1] - 1}. Left-pad each request to "
                "max_req_tokens and append the response (as forge_nb.rl.collate does), or pass a TrainBatch"
            )
        if return_logprobs:  # the logits keep the batch's width: they are returned whole
            input_ids, start = self.policy.without_shared_padding(input_ids, start)
        dtype = self.config.torch_dtype
        autocast = torch.autocast(self.policy.device.type, dtype=dtype, enabled=dtype != torch.float32)
        with torch.inference_mode(), autocast:
            logits = self.policy.logits(input_ids, start)
            if not return_logprobs:
                return logits.float().cpu()
            return response_logprobs(logits, input_ids, start, self.config.logits_temperature).cpu()

    @endpoint
    async def info(self) -> dict[str, Any]:
        """Engine, why torchtitan was not used (if so), device and CPU threads."""
        if self.policy is None:
            raise RuntimeError("the reference model is not set up: await ref.setup.call() first")
        return {
            "engine": self.policy.engine, "fallback_reason": self.fallback_reason,
            "device": str(self.policy.device), "cpu_threads": torch.get_num_threads(),
            "flush_denormal": flushes_denormals(),
        }
