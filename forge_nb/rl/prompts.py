"""Prompts from a Hugging Face dataset, endlessly: the plain logic behind the documents' DatasetActor.

`PromptStream` loads a dataset with `datasets` (a hub id, a local folder, or a local .json/.jsonl/.csv/
.parquet file), turns each row into a `Sample` (request, target) and hands them out shuffled, reshuffling
at every epoch. Rows shaped like GSM8K (`question`, `answer`) go through `gsm8k_transform`, which applies
the tokenizer's chat template to forge_nb's GSM8K system prompt and the question; rows that already
have `request` and `target` pass through unchanged.

`Sample` is a named tuple that also indexes by name, so both of the documents' forms work:
`prompt, target = sample` and `sample["request"], sample["target"]` (a dict would unpack its keys).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

from forge_nb.rl.tasks import gsm8k_transform

__all__ = ["PromptStream", "Sample", "load_rows"]

_FILE_BUILDERS = {".json": "json", ".jsonl": "json", ".csv": "csv", ".parquet": "parquet"}


class Sample(NamedTuple):
    """One prompt and its target: unpacks as a pair and indexes by field name."""

    request: str
    target: str

    def __getitem__(self, key: Any) -> Any:  # type: ignore[override]
        if isinstance(key, str):
            if key not in self._fields:
                raise KeyError(f"{key!r}: a Sample has {list(self._fields)}")
            return getattr(self, key)
        return tuple.__getitem__(self, key)

    def keys(self) -> tuple[str, ...]:
        """The field names, so `dict(sample)` gives {"request": ..., "target": ...}."""
        return self._fields


def load_rows(path: str, revision: str | None = None, split: str = "train", streaming: bool = False) -> Any:
    """`datasets.load_dataset` for a hub id or a local folder/file; a clear ValueError when it fails.

    For a hub id, `revision` is passed as the config name, as torchforge's DatasetActor does ("main" for
    openai/gsm8k); for local data it is ignored.
    """
    try:
        import datasets
    except ImportError as err:
        raise ImportError("loading a dataset needs the 'datasets' package: pip install datasets") from err
    local = Path(path).expanduser()
    if local.is_file():
        builder = _FILE_BUILDERS.get(local.suffix.lower())
        if builder is None:
            raise ValueError(
                f"dataset file {str(local)!r}: unknown format {local.suffix!r}; use one of {sorted(_FILE_BUILDERS)}"
            )
        if split != "train":
            raise ValueError(f"a single dataset file has only the 'train' split, got data_split={split!r}")
        return datasets.load_dataset(builder, data_files=str(local), split=split, streaming=streaming)
    if local.is_dir():
        return datasets.load_dataset(str(local), split=split, streaming=streaming)
    try:
        return datasets.load_dataset(path, revision, split=split, streaming=streaming)
    except Exception as err:
        raise ValueError(
            f"could not load dataset {path!r} (config {revision!r}, split {split!r}): {type(err).__name__}: "
            f"{str(err)[:300]}. Without hub access, pass a local folder or a .jsonl file as path="
        ) from err


def _to_sample(row: dict[str, Any], tokenizer: Any | None) -> Sample:
    if "question" in row and "answer" in row:
        out = gsm8k_transform(row, tokenizer)
        return Sample(out["request"], out["target"])
    if "request" in row and "target" in row:
        return Sample(str(row["request"]), str(row["target"]))
    raise ValueError(
        f"dataset row has columns {sorted(row)}; expected GSM8K's 'question' and 'answer', or 'request' and "
        "'target'"
    )


class PromptStream:
    """Samples from a dataset forever, shuffled with `seed` and reshuffled each epoch."""

    def __init__(self, rows: Any, *, tokenizer: Any | None = None, seed: int = 0) -> None:
        self.rows = rows
        self.tokenizer = tokenizer
        self.seed = seed
        self.epoch = 0
        self._iterator = self._epoch_rows()

    def _epoch_rows(self) -> Iterator[dict[str, Any]]:
        if hasattr(self.rows, "__len__"):  # a map-style Dataset: shuffle the indices
            order = list(range(len(self.rows)))
            random.Random(f"{self.seed}-{self.epoch}").shuffle(order)
            return (self.rows[i] for i in order)
        shuffled = self.rows.shuffle(seed=self.seed, buffer_size=1000)  # an IterableDataset (streaming)
        shuffled.set_epoch(self.epoch)
        return iter(shuffled)

    def sample(self) -> Sample:
        """The next sample; at the end of the data the next epoch starts, reshuffled."""
        for _ in range(2):
            try:
                return _to_sample(next(self._iterator), self.tokenizer)
            except StopIteration:
                self.epoch += 1
                self._iterator = self._epoch_rows()
        raise ValueError("the dataset has no rows; pass a dataset with at least one example")
