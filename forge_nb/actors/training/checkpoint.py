"""Trainer checkpoints with torch.distributed.checkpoint: written aside, renamed when complete.

Layout inside the run's checkpoint folder::

    step_00000010/          complete: DCP shards + .metadata (trained parameters, optimizer, trainer state)
    step_00000020.partial/  being written, or left behind by a crash: never loaded, removed on the next save

DCP writes ``.metadata`` last, but a crash can still leave a folder that looks plausible, and a full disk or a
bad copy can damage a file after the fact. So rank 0 writes a commit marker (``COMMITTED.json``: every file's
size and CRC-32, ``forge_nb.rundir.commit``) before the rename, which is the commit point, and :func:`latest`
trusts only ``step_*`` folders whose files match their marker (:func:`check`), skipping damaged ones, or the
one its caller names as checked already (``forge_nb.resume`` checks before it spawns the trainer). Every
rank calls :func:`save` and :func:`load` (DCP is collective over the trainer's process group); rank 0
alone touches folder names, between barriers. The state dicts come from ``get_state_dict``, so a
checkpoint saved by N ranks loads on M.
"""

from __future__ import annotations

import logging
import re
import shutil
import warnings
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from forge_nb.rundir.commit import commit_folder, verify_folder

logger = logging.getLogger(__name__)

__all__ = ["check", "keep_fresh", "latest", "load", "load_into", "newest_intact", "save", "step_dir"]

_COMPLETE = re.compile(r"^step_(\d+)$")
#: What a checkpoint holds of the model: the parameters that train. All of them, or a LoRA trainer's adapters
#: alone (its frozen base comes from the model's own files at setup).
_TRAINED = StateDictOptions(ignore_frozen_params=True)
#: Loading them back: the frozen ones are not in the state dict, hence not strict; every trained one is (DCP
#: refuses a checkpoint that lacks a key it was asked for).
_TRAINED_BACK = StateDictOptions(ignore_frozen_params=True, strict=False)


def step_dir(folder: str | Path, step: int) -> Path:
    return Path(folder) / f"step_{step:08d}"


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


def _barrier() -> None:
    if dist.is_initialized():
        dist.barrier()


@contextmanager
def _quiet() -> Iterator[None]:
    """DCP warns that it runs "in a single process" without a process group: a 1-proc trainer does."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


@contextmanager
def keep_fresh(optimizer: torch.optim.Optimizer) -> Iterator[None]:
    """Undo the state ``get_state_dict`` gives an optimizer that has not stepped yet.

    torch initialises an empty optimizer's state with a zero-lr step so that there is something to save;
    for Adam that leaves step=1 and zero moments, which makes the first real update ~25% smaller than it
    would have been. Reading or saving state must not change training, so we drop that state again.
    """
    fresh = not optimizer.state
    try:
        yield
    finally:
        if fresh:
            optimizer.state.clear()


def save(
    folder: str | Path,
    step: int,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    trainer_state: dict[str, Any],
    keep_last: int | None = None,
) -> Path:
    """Write a complete checkpoint of ``step`` (collective); returns its folder."""
    final = step_dir(folder, step)
    partial = final.with_name(final.name + ".partial")
    if _rank() == 0:
        partial.parent.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(partial, ignore_errors=True)  # a crash left it: never resume from half a write
    _barrier()
    with keep_fresh(optimizer):
        model_state, optim_state = get_state_dict(model, optimizer, options=_TRAINED)
    try:
        with _quiet():
            dcp.save(
                {"model": model_state, "optim": optim_state, "trainer": dict(trainer_state)},
                checkpoint_id=str(partial),
            )
    except BaseException:
        if _rank() == 0:  # a full disk: the half-written folder goes, and gives its space back
            shutil.rmtree(partial, ignore_errors=True)
        raise
    _barrier()
    if _rank() == 0:
        commit_folder(partial, step=step)
        if final.exists():  # the same step saved again: the new one wins
            shutil.rmtree(final)
        partial.rename(final)
        if keep_last:
            for old in _complete(folder)[:-keep_last]:
                shutil.rmtree(old[1], ignore_errors=True)
    _barrier()
    return final


def _complete(folder: str | Path) -> list[tuple[int, Path]]:
    root = Path(folder)
    if not root.is_dir():
        return []
    found = []
    for child in root.iterdir():
        match = _COMPLETE.match(child.name)
        if match and child.is_dir() and (child / ".metadata").exists():
            found.append((int(match.group(1)), child))
    return sorted(found)


def check(path: str | Path) -> str | None:
    """Why the checkpoint folder ``path`` cannot be loaded (a file missing, cut short or changed, no commit
    marker), or None when it is whole."""
    return verify_folder(path)


def newest_intact(folder: str | Path, verified: str | Path | None = None) -> tuple[Path | None, list[tuple[Path, str]]]:
    """The whole checkpoint with the highest step in ``folder`` (or None), and the newer ones skipped, with why.
    ``verified``: a folder the caller knows was just checked (``CheckpointConfig.verified``): not read again."""
    skipped: list[tuple[Path, str]] = []
    trusted = Path(verified).resolve() if verified is not None else None
    for _, path in reversed(_complete(folder)):
        why = None if path.resolve() == trusted else check(path)
        if why is None:
            return path, skipped
        skipped.append((path, why))
    return None, skipped


def latest(folder: str | Path, verified: str | Path | None = None) -> Path | None:
    """The whole checkpoint with the highest step in ``folder``, or None (damaged newer ones are logged);
    ``verified`` as in :func:`newest_intact`."""
    found, skipped = newest_intact(folder, verified)
    for path, why in skipped:
        logger.warning("checkpoint %s skipped: %s", path, why)
    return found


def load(
    path: str | Path, model: torch.nn.Module, optimizer: torch.optim.Optimizer, trainer_state: dict[str, Any], *,
    verified: bool = False,
) -> dict[str, Any]:
    """Load model and optimizer in place from a complete checkpoint (collective).

    ``trainer_state`` names the trainer entries to read (DCP loads only keys it is asked for) with
    defaults; returns it filled from the checkpoint. The folder is checked against its commit marker first
    (every byte read once more), unless ``verified``: :func:`latest` just did.
    """
    path = Path(path)
    why = None if verified else check(path)
    if why is not None:
        raise FileNotFoundError(
            f"{str(path)!r} is not a whole checkpoint ({why}); pass a step_* folder that save_checkpoint "
            "wrote, or path=None for the latest whole one"
        )
    model_state, optim_state = get_state_dict(model, optimizer, options=_TRAINED)
    state: dict[str, Any] = {"model": model_state, "optim": optim_state, "trainer": dict(trainer_state)}
    with _quiet():
        dcp.load(state, checkpoint_id=str(path))
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"],
                   options=_TRAINED_BACK)
    if not state["trainer"].get("step"):  # saved before any step: its optimizer state is keep_fresh's kind
        optimizer.state.clear()
    return dict(state["trainer"])


def on_rank0(rank: int, world: int, pick: Callable[[], Any]) -> Any:
    """``pick()`` on rank 0, its answer (or its error) sent to every rank: one rank reads a checkpoint's files
    to check them, not each rank of the trainer."""
    if world == 1 or not dist.is_initialized():
        return pick()
    box: list[Any] = [None]
    if rank == 0:
        try:
            box = [("ok", pick())]
        except Exception as e:
            box = [("error", f"{type(e).__name__}: {e}")]
    dist.broadcast_object_list(box, src=0, device=torch.device("cpu"))
    kind, value = box[0]
    if kind == "error":
        raise RuntimeError(f"rank 0 could not pick the checkpoint to resume: {value}")
    return value


def load_into(trainer: Any, path: str | None) -> dict[str, Any] | None:
    """``RLTrainer.load_checkpoint``: ``path``, or the latest complete checkpoint in the trainer's
    ``checkpoint.folder``, into its model and optimizer (its weight decay as configured); what was loaded
    (``info()["resumed"]``: path, step, and when its files were checked), or None when the folder holds none."""
    verified = path is None  # latest() checks what it finds against the commit marker: once is enough
    checked = "on loading"
    cfg = trainer.ckpt_cfg
    if path is None:
        if not cfg.folder:
            raise ValueError("no checkpoint folder: pass path=, or configure checkpoint={'folder': ...}")
        trusted, folder = cfg.verified, cfg.folder
        found = on_rank0(trainer.rank, trainer.world, lambda: latest(folder, trusted))
        if found is None:
            return None
        path = str(found)
        by_resume = trusted is not None and found.resolve() == Path(trusted).resolve()
        checked = "by the resume, before the trainer started" if by_resume else "by rank 0, before loading"
    with trainer._adapter():
        state = load(path, trainer._policy().module, trainer.optimizer, {"step": 0}, verified=verified)
    for group in trainer.optimizer.param_groups:  # the loaded param groups carry the old values
        group["weight_decay"] = trainer.opt_cfg.weight_decay
    logger.info("resumed from %s at step %d (checked %s)", path, int(state["step"]), checked)
    return {"path": path, "step": int(state["step"]), "checked": checked}
