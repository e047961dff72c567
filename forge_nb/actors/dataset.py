"""DatasetActor: the documents' prompt source, a thin shell over ``forge_nb.rl.prompts.PromptStream``.

As in torchforge's apps/grpo::

    dataloader = await DatasetActor.options(procs=1).as_actor(
        path="openai/gsm8k", revision="main", data_split="train", streaming=True, model="Qwen/Qwen3-1.7B")
    prompt, target = await dataloader.sample.route()          # the documents' two forms both work
    sample = await dataloader.sample.call_one(); sample["request"], sample["target"]

``path`` is a hub id (which needs network: offline, the error says to pass a local path) or a local
folder or .json/.jsonl/.csv/.parquet file. ``model`` (a hub id in the local cache, or a model folder)
gives the tokenizer whose chat template formats GSM8K questions; it must have a chat template. forge_nb's
own Run samples its Task in the kernel instead.
"""

from __future__ import annotations

from typing import Any

from monarch.actor import endpoint

from forge_nb.rl.prompts import PromptStream, Sample, load_rows
from forge_nb.service.actor import ForgeActor

__all__ = ["DatasetActor"]


class DatasetActor(ForgeActor):
    """Prompts from a Hugging Face dataset, with the chat template of ``model``'s tokenizer applied.

    Args:
        path: Hub id or local folder/file of the dataset.
        revision: For a hub id, the dataset config ("main" for openai/gsm8k); ignored for local data.
        data_split: The split to read.
        streaming: Read the dataset as a stream instead of loading it.
        model: Hub id or local folder of the model whose tokenizer formats the prompts.
        seed: Seed of the shuffling (torchforge's is unseeded).
    """

    def __init__(self, path: str = "openai/gsm8k", revision: str | None = "main", data_split: str = "train",
                 streaming: bool = False, model: str = "Qwen/Qwen3-1.7B", seed: int = 0) -> None:
        self.path, self.revision, self.data_split = path, revision, data_split
        self.streaming, self.model, self.seed = streaming, model, seed
        self._stream: PromptStream | None = None
        self._tokenizer: Any = None

    @endpoint
    async def setup(self) -> None:
        from transformers import AutoTokenizer

        from forge_nb.models import resolve_model

        self._tokenizer = AutoTokenizer.from_pretrained(resolve_model(self.model))
        if getattr(self._tokenizer, "chat_template", None) is None:
            raise ValueError(
                f"the tokenizer of model={self.model!r} has no chat template, which DatasetActor applies to "
                "each prompt; use a chat model, or set tokenizer.chat_template and save_pretrained it"
            )
        rows = load_rows(self.path, self.revision, self.data_split, self.streaming)
        self._stream = PromptStream(rows, tokenizer=self._tokenizer, seed=self.seed)

    @endpoint
    async def sample(self) -> Sample:
        """The next (request, target); it also indexes as ``sample["request"]``, ``sample["target"]``."""
        if self._stream is None:
            raise RuntimeError("DatasetActor is not set up; spawn it with .as_actor(), which runs setup()")
        return self._stream.sample()

    @endpoint
    async def pad_token(self) -> int:
        """The tokenizer's pad id, or its EOS id when it has no pad token (torchforge's choice)."""
        pad = self._tokenizer.pad_token_id
        return self._tokenizer.eos_token_id if pad is None else pad

    @endpoint
    async def epoch(self) -> int:
        """How many times the data was read through."""
        return 0 if self._stream is None else self._stream.epoch
