"""The run directory: config, metrics, events, trainer checkpoints, buffer snapshot and counters.

::

    runs/<name>-<time>/
      config.json       the RunConfig, as data (forge_nb.config.from_dict reads it back)
      metrics.jsonl     one line per training step      (forge_nb.metrics.MetricsStore)
      events.jsonl      one line per event
      checkpoints/      the trainer's torch.distributed.checkpoint folders (step_N, written then renamed)
      state.pt          step, version, replay-buffer snapshot, hot changes (written then renamed)
      model/            the locally built tiny model, when the config asks for "tiny"

Files written whole (state.pt) go to a temporary name first and are renamed, so a crash mid-write
leaves the previous complete snapshot in place.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)

    @classmethod
    def create(cls, config_data: dict[str, Any], name: str, base: str | None) -> RunDir:
        path = Path(base) if base else Path("runs") / f"{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        path.mkdir(parents=True, exist_ok=True)
        run_dir = cls(path.resolve())
        (run_dir.path / "config.json").write_text(json.dumps({**config_data, "run_dir": str(run_dir.path)},
                                                             indent=2, default=str))
        return run_dir

    @classmethod
    def open(cls, path: str | Path) -> RunDir:
        run_dir = cls(Path(path).resolve())
        if not (run_dir.path / "config.json").exists():
            raise FileNotFoundError(f"{str(run_dir.path)!r} is not a forge_nb run directory (no config.json)")
        return run_dir

    @property
    def config(self) -> dict[str, Any]:
        path = self.path / "config.json"
        try:
            return json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{str(path)!r} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno}); it is "
                             "the run's configuration as spawned: restore it from a copy, or spawn a new run") from None

    @property
    def checkpoints(self) -> Path:
        return self.path / "checkpoints"

    @property
    def logs(self) -> Path:
        """The output of the run's processes, one file per mesh."""
        return self.path / "logs"

    @property
    def model(self) -> Path:
        return self.path / "model"

    def save_state(self, **state: Any) -> None:
        tmp = self.path / "state.pt.tmp"
        torch.save(state, tmp)
        os.replace(tmp, self.path / "state.pt")

    def load_state(self) -> dict[str, Any] | None:
        """The last checkpoint's state, or None. Loaded with ``weights_only=True``: tensors, plain data and
        forge_nb's episode types only, so a file someone put in the run directory cannot run code."""
        path = self.path / "state.pt"
        return load_plain(path) if path.exists() else None


def load_plain(path: str | Path) -> Any:
    """``torch.load`` of a file forge_nb wrote (a run state, a buffer snapshot) without unpickling code."""
    from forge_nb.rl import Completion, Episode

    with torch.serialization.safe_globals([Episode, Completion]):
        return torch.load(path, weights_only=True)
