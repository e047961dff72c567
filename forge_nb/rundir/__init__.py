"""The run directory: config, metrics, events, trainer checkpoints, buffer snapshot and counters.

::

    runs/<name>-<time>/
      config.json       the RunConfig, as data (forge_nb.config.from_dict reads it back)
      metrics.jsonl     one line per training step      (forge_nb.metrics.MetricsStore)
      events.jsonl      one line per event
      checkpoints/      the trainer's torch.distributed.checkpoint folders (step_N, written then renamed,
                        each with its commit marker COMMITTED.json)
        state_N.pt      the run's side of checkpoint N: step, version, replay-buffer snapshot, hot changes,
        state_N.json    ledger, and which trainer checkpoint goes with it; its commit marker, written last
      model/            the locally built tiny model, when the config asks for "tiny"

A checkpoint is whole when its trainer folder and its run state both match their commit markers (sizes and
CRC-32s, ``forge_nb.rundir.commit``). :meth:`RunDir.checkpoint_to_resume` picks the newest whole one before
anything is spawned, and sets aside (renames ``*.skipped``) what is newer and damaged or uncommitted, so
neither the resumed trainer nor a respawned one loads it; ``resume`` records a ``checkpoint_skipped`` event
for each. Run directories from before the markers have one ``state.pt`` and unmarked trainer folders: they
are adopted as they are (markers written on resume, nothing checked).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from forge_nb.rundir.commit import MARKER, commit, commit_folder, verify, verify_folder
from forge_nb.system.diskspace import size_of


class RunDir:
    def __init__(self, path: str | Path):
        self.path = Path(path)
        #: The trainer checkpoint folder :meth:`checkpoint_to_resume` has just checked against its marker: the
        #: trainer's resume loads it without reading every byte again (``CheckpointConfig.verified``).
        self.verified_trainer_checkpoint: Path | None = None

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

    def save_state(self, version: int, trainer_checkpoint: str, **state: Any) -> Path:
        """The run's side of checkpoint ``version`` (the trainer's is ``trainer_checkpoint``), committed with
        its marker; older run states beyond the newest ``KEEP_STATES`` are removed."""
        self.checkpoints.mkdir(parents=True, exist_ok=True)
        path = self.checkpoints / f"state_{version:08d}.pt"
        tmp = path.with_name(path.name + ".tmp")
        try:
            torch.save({**state, "version": version, "trainer_checkpoint": str(trainer_checkpoint)}, tmp)
        except BaseException:
            tmp.unlink(missing_ok=True)  # a full disk leaves half a file: not kept
            raise
        os.replace(tmp, path)
        commit(self.checkpoints, [path.name], path.with_suffix(".json"), version=version,
               trainer_checkpoint=str(trainer_checkpoint))
        for old in self._states()[:-KEEP_STATES]:
            for leftover in (old, old.with_suffix(".json")):
                leftover.unlink(missing_ok=True)
        return path

    def checkpoint_bytes(self) -> int:
        """About what a checkpoint takes on disk: the newest one's trainer folder and run state (0: none yet)."""
        states, trainers = self._states(), _trainer_folders(self.checkpoints)
        return (size_of(states[-1]) if states else 0) + (size_of(trainers[-1]) if trainers else 0)

    def _here(self, trainer_checkpoint: str | Path) -> Path:
        """Where a trainer checkpoint recorded as ``trainer_checkpoint`` is now: in this directory's checkpoints
        folder when it is there by name (a run directory that was moved or copied), else where it was."""
        local = self.checkpoints / Path(trainer_checkpoint).name
        return local if local.exists() else Path(trainer_checkpoint)

    def _states(self) -> list[Path]:
        """The run states of the checkpoints, oldest first."""
        return sorted(self.checkpoints.glob("state_*.pt")) if self.checkpoints.is_dir() else []

    def checkpoint_to_resume(self) -> tuple[dict[str, Any] | None, list[tuple[str, str]]]:
        """The newest whole checkpoint's run state (None when the run never checkpointed), and what was
        skipped on the way: (what, why) for each newer checkpoint that is damaged or uncommitted, each set
        aside (renamed ``*.skipped``, its trainer folder too) so that no trainer loads it.
        ``CheckpointsDamaged``, with every checkpoint and why, when some exist and none is whole; nothing is
        renamed then."""
        states = self._states()
        legacy = self.path / "state.pt"
        if not states and legacy.exists():  # a run directory from before commit markers: adopted unchecked
            for folder in _trainer_folders(self.checkpoints):
                if (folder / ".metadata").exists() and not (folder / MARKER).exists():
                    commit_folder(folder, adopted=True)
            return load_plain(legacy), []
        skipped: list[tuple[Path, str]] = []
        chosen: dict[str, Any] | None = None
        for path in reversed(states):
            why = verify(self.checkpoints, path.with_suffix(".json"))
            if why is None:
                state = load_plain(path)
                trainer_checkpoint = self._here(state["trainer_checkpoint"])
                why = _trainer_checkpoint_damage(trainer_checkpoint)
                if why is None:
                    chosen = state
                    if trainer_checkpoint.is_dir():  # a committed folder, just checked (a custom trainer's file is not)
                        self.verified_trainer_checkpoint = trainer_checkpoint
                    break
            skipped.append((path, why))
        newest = int(chosen["version"]) if chosen is not None else -1
        with_state = {_version(p) for p, _ in skipped}
        skipped += [(folder, "no run state was committed for it (the run stopped while checkpointing)")
                    for folder in _trainer_folders(self.checkpoints)
                    if _version(folder) > newest and _version(folder) not in with_state]
        if chosen is None and skipped:
            raise CheckpointsDamaged(
                f"{self.path}: no whole checkpoint to resume from; " + "; ".join(
                    f"{p.name}: {why}" for p, why in skipped) + ". Nothing was spawned. Copy a whole checkpoint "
                "back, or move the checkpoints folder away to start from the initial weights")
        for path, _ in skipped:
            aside = [path, path.with_suffix(".json")] if path.suffix == ".pt" else [path]
            if path.suffix == ".pt":  # a run state: the trainer's checkpoint of the same version goes with it
                aside += [p for p in _trainer_folders(self.checkpoints) if _version(p) == _version(path)]
                trainer = _trainer_of(path)
                trainer = self._here(trainer) if trainer is not None else None
                if trainer is not None and not trainer.name.startswith("step_"):
                    aside.append(trainer)  # a custom trainer's file
            for item in aside:
                if item.exists():
                    item.rename(item.with_name(item.name + ".skipped"))
        return chosen, [(str(p), why) for p, why in skipped]

    def load_state(self) -> dict[str, Any] | None:
        """The newest committed run state (``checkpoint_to_resume`` checks the trainer's side too), or the
        ``state.pt`` of a run directory from before commit markers, or None. Loaded with ``weights_only=True``:
        tensors, plain data and forge_nb's episode types only, so a file someone put in the run directory
        cannot run code."""
        for path in reversed(self._states()):
            if verify(self.checkpoints, path.with_suffix(".json")) is None:
                return load_plain(path)
        legacy = self.path / "state.pt"
        return load_plain(legacy) if legacy.exists() else None


KEEP_STATES = 3  #: run states kept: a damaged newest checkpoint falls back to one of these


class CheckpointsDamaged(RuntimeError):
    """A run directory holds checkpoints and none of them is whole."""


def _trainer_folders(checkpoints: Path) -> list[Path]:
    if not checkpoints.is_dir():
        return []
    return sorted(p for p in checkpoints.iterdir() if p.is_dir() and p.name.startswith("step_")
                  and p.name[5:].isdigit())


def _trainer_checkpoint_damage(path: Path) -> str | None:
    """Why the trainer's checkpoint ``path`` cannot be loaded: a committed folder (RLTrainer's) is verified
    against its marker; any other kind (a file of a custom trainer) has to be there."""
    if path.is_dir() or path.name.startswith("step_"):
        why = verify_folder(path)
        return None if why is None else f"trainer checkpoint {path.name}: {why}"
    return None if path.exists() else f"trainer checkpoint {path.name} is not there"


def _version(path: Path) -> int:
    """N of ``state_N.pt`` or ``step_N``."""
    return int(path.name.split("_")[1].split(".")[0])


def _trainer_of(state_path: Path) -> Path | None:
    try:
        return Path(json.loads(state_path.with_suffix(".json").read_text())["trainer_checkpoint"])
    except (OSError, ValueError, KeyError):
        return None


def load_plain(path: str | Path) -> Any:
    """``torch.load`` of a file forge_nb wrote (a run state, a buffer snapshot) without unpickling code."""
    from forge_nb.rl import Completion, Episode

    with torch.serialization.safe_globals([Episode, Completion]):
        return torch.load(path, weights_only=True)
