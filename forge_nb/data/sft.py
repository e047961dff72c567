"""Supervised fine-tuning data for ``Run.sft``: (request, response) text pairs -> the trainer's SFT batches.

A cell switches a run to SFT, trains with the usual controls, and switches back, e.g. as a warm start::

    await run.sft(examples)   # or run.sft() to imitate the task's own targets
    await run.step(20)        # 20 supervised steps: same metrics, weight pushes and versions as RL
    await run.rl()            # back to the rollout and training loops
    run.start()

Each row is laid out as the RL batches are: the request left-padded (or left-truncated) to
``max_req_tokens``, the response right-padded (or cut) to ``max_res_tokens``, so the generators see
the same shapes whichever loop trained the weights. ``labels[:, t]`` is the token position ``t``
predicts (``-100`` where nothing is learned: the request and the padding), as ``RLTrainer.sft_step``
takes it.
"""

from __future__ import annotations

import random
from collections.abc import Iterable
from typing import Any

import torch

IGNORE = -100

__all__ = ["SftData"]


class SftData:
    """An endless, shuffled stream of SFT batches from fixed examples or from a task's targets."""

    def __init__(self, tokenizer: Any, *, examples: Iterable[dict[str, Any]] | None, task: Any,
                 request_len: int, response_len: int, pad_id: int, batch_size: int, seed: int = 0):
        self.tokenizer, self.task = tokenizer, task
        self.request_len, self.response_len, self.pad_id = request_len, response_len, pad_id
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"sft batch_size={batch_size!r}: must be an integer >= 1")
        self.batch_size = batch_size
        self.examples = None if examples is None else [_pair(e, i) for i, e in enumerate(examples)]
        if self.examples == []:
            raise ValueError("run.sft(examples=[]): give at least one {'request': ..., 'response': ...} pair, "
                             "or no examples to imitate the task's targets")
        if self.examples is None and task is None:
            raise ValueError("run.sft(): this run has no task to take targets from; pass examples")
        self._rng = random.Random(seed)
        self._order: list[int] = []

    def __len__(self) -> int:
        """Distinct examples (0 when drawn from the task without end)."""
        return len(self.examples) if self.examples is not None else 0

    def next_batch(self) -> dict[str, torch.Tensor]:
        """``{"tokens": [B, L], "labels": [B, L]}`` with ``L = max_req_tokens + max_res_tokens``."""
        pairs = [self._next_pair() for _ in range(self.batch_size)]
        rows = [self._row(request, response) for request, response in pairs]
        return {"tokens": torch.stack([t for t, _ in rows]), "labels": torch.stack([lab for _, lab in rows])}

    def _next_pair(self) -> tuple[str, str]:
        if self.examples is None:
            return _pair(self.task.sample(), "task.sample()")
        if not self._order:  # one pass over the examples in a fresh order, then the next
            self._order = list(range(len(self.examples)))
            self._rng.shuffle(self._order)
        return self.examples[self._order.pop()]

    def _row(self, request: str, response: str) -> tuple[torch.Tensor, torch.Tensor]:
        req_ids = self.tokenizer(request, add_special_tokens=False)["input_ids"][-self.request_len:]
        res_ids = self.tokenizer(response, add_special_tokens=False)["input_ids"]
        eos = self.tokenizer.eos_token_id
        if eos is not None and len(res_ids) < self.response_len:
            res_ids = [*res_ids, eos]  # teach it to stop, where the answer leaves room
        res_ids = res_ids[: self.response_len]
        n_req, n_res = len(req_ids), len(res_ids)
        tokens = torch.full((self.request_len + self.response_len,), self.pad_id, dtype=torch.long)
        tokens[self.request_len - n_req : self.request_len] = torch.tensor(req_ids, dtype=torch.long)
        tokens[self.request_len : self.request_len + n_res] = torch.tensor(res_ids, dtype=torch.long)
        labels = torch.full_like(tokens, IGNORE)
        # position t predicts token t + 1: the last request column predicts the first response token
        first = self.request_len
        labels[first - 1 : first - 1 + n_res] = tokens[first : first + n_res]
        return tokens, labels


def _pair(example: Any, where: Any) -> tuple[str, str]:
    """(request, response) of an example: ``response`` if it has one, else its ``target`` as text."""
    if not isinstance(example, dict) or "request" not in example:
        raise ValueError(f"sft example {where}: expected a dict with 'request' and 'response' (or 'target'); "
                         f"got {example!r:.120}")
    response = example.get("response", example.get("target"))
    if not isinstance(example["request"], str) or not isinstance(response, str) or not response:
        raise ValueError(f"sft example {where}: 'request' and 'response' (or 'target') must be non-empty text; "
                         f"got request={example['request']!r:.60}, response={response!r:.60}")
    return example["request"], response
