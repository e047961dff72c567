"""What RLTrainer's steps accept: TrainBatch, torchforge's (inputs, targets) lists, SFT dicts; rank slices.

Every rank receives the whole batch (``train_step.call(batch)``) and keeps a contiguous slice of rows, so
the caller never needs to know the trainer's world size; torchforge's per-rank lists are concatenated
first and sliced the same way (identical to picking ``inputs[rank]`` when there is one list per rank).
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any, TypeVar

import torch

from forge_nb.rl import TrainBatch
from forge_nb.rl.types import TextTrainBatch

__all__ = ["as_train_batch", "local_rows", "sft_labels"]

T = TypeVar("T", TrainBatch, TextTrainBatch, torch.Tensor)
B = TypeVar("B", TrainBatch, TextTrainBatch)

IGNORE = -100


def as_train_batch(batch: TrainBatch | list[dict[str, Any]], targets: Any = None) -> TrainBatch:
    """A TrainBatch from a TrainBatch, or from torchforge's ``collate`` output ``(inputs, targets)``."""
    if isinstance(batch, TrainBatch):
        if targets is not None:
            raise ValueError("train_step(batch): a TrainBatch carries its targets; pass it alone")
        return batch
    if isinstance(batch, tuple) and targets is None and len(batch) == 2:
        batch, targets = batch
    if not isinstance(batch, list) or not isinstance(targets, list) or len(batch) != len(targets):
        raise ValueError(
            "train_step takes a TrainBatch (forge_nb.rl.collate) or torchforge's (inputs, targets): two "
            f"lists of dicts of equal length; got {type(batch).__name__} and {type(targets).__name__}"
        )
    tokens = torch.cat([i["tokens"] for i in batch])
    response = torch.cat([t["response"] for t in targets])
    ref = [t.get("ref_logprobs") for t in targets]
    has_ref = all(r is not None for r in ref)
    return TrainBatch(
        tokens=tokens,
        response=response,
        response_mask=torch.cat([t["padding_mask"] for t in targets]).bool(),
        ref_logprobs=torch.cat([r.reshape(-1, response.shape[1]) for r in ref]) if has_ref
        else torch.zeros(response.shape),
        generator_logprobs=torch.zeros(response.shape),
        advantages=torch.cat([t["advantages"].reshape(-1, 1) for t in targets]).float(),
        policy_versions=torch.zeros(tokens.shape[0], dtype=torch.long),
        request_len=tokens.shape[1] - response.shape[1],
        has_ref_logprobs=has_ref,
        has_generator_logprobs=False,
    )


def local_rows(batch: T, rank: int, world: int, local_batch_size: int | None) -> T:
    """This rank's contiguous slice of the batch's rows; the rows must split evenly over the ranks."""
    n = len(batch)
    if n % world:
        raise ValueError(
            f"a batch of {n} rows cannot be split evenly over {world} trainer ranks; sample a multiple "
            f"of {world} episodes per step"
        )
    if local_batch_size is not None and n // world != local_batch_size:
        raise ValueError(
            f"training.local_batch_size={local_batch_size} but this batch gives each of the {world} rank(s) "
            f"{n // world} rows; sample {local_batch_size * world} episodes, or drop local_batch_size"
        )
    if world == 1:
        return batch
    rows = slice(rank * (n // world), (rank + 1) * (n // world))
    if isinstance(batch, torch.Tensor):
        return batch[rows]
    return _rows(batch, rows)


def micro_batches(batch: B, steps: int) -> list[B]:
    """``batch`` in ``steps`` contiguous micro-batches of equal size (gradient accumulation)."""
    n = len(batch)
    if n % steps:
        raise ValueError(
            f"training.gradient_accumulation_steps={steps} does not divide this rank's {n} rows; sample a "
            f"multiple of {steps} episodes per rank and step"
        )
    size = n // steps
    return [batch] if steps == 1 else [_rows(batch, slice(i * size, (i + 1) * size)) for i in range(steps)]


def _rows(batch: B, rows: slice) -> B:
    """The rows ``rows`` of a batch dataclass (every tensor field sliced on its first dimension)."""
    values = {f.name: getattr(batch, f.name) for f in fields(batch)}
    return type(batch)(**{k: v[rows] if isinstance(v, torch.Tensor) else v for k, v in values.items()})


def sft_labels(batch: TrainBatch | dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, int | None]:
    """(tokens, labels aligned with tokens, request_len) for a supervised step.

    ``labels[:, t]`` is the token position ``t`` should predict, or -100. A TrainBatch yields the response
    tokens under its mask; a dict passes ``tokens`` and ``labels`` through (torchtitan's SFT convention).
    """
    if isinstance(batch, TrainBatch):
        tokens, req = batch.tokens, batch.request_len
        labels = torch.full_like(tokens, IGNORE)
        target = batch.response.masked_fill(~batch.response_mask.bool(), IGNORE)
        labels[:, req - 1 : tokens.shape[1] - 1] = target
        return tokens, labels, req
    if isinstance(batch, dict) and {"tokens", "labels"} <= set(batch):
        tokens, labels = batch["tokens"], batch["labels"]
        if tokens.shape != labels.shape:
            raise ValueError(
                f"sft_step: tokens {tuple(tokens.shape)} and labels {tuple(labels.shape)} must have one shape; "
                "labels[:, t] is the token position t predicts (-100: ignored)"
            )
        return tokens, labels.long(), None
    raise ValueError(
        "sft_step takes a TrainBatch or a dict with 'tokens' and 'labels' [B, L] (labels shifted: "
        f"labels[:, t] = tokens[:, t + 1], -100 where ignored); got {type(batch).__name__}"
    )
