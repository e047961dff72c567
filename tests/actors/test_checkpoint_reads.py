"""A checkpoint's files are read once to check them before a load, not once per caller that checks.

``checkpoint.latest`` checks the folder it picks against its commit marker (a CRC-32 of every file); the
trainer's resume then loads that folder with ``verified=True``, so a resumed trainer reads the checkpoint twice
(check, then DCP's load) instead of three times. A path the user names is still checked before it loads."""

from __future__ import annotations

import collections
import importlib
from pathlib import Path

import torch

from forge_nb.actors.training import checkpoint

commit = importlib.import_module("forge_nb.rundir.commit")  # the module (forge_nb.rundir's `commit` is its function)


def _model_and_optimizer() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(8, 8)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.ones(2, 8)).sum().backward()
    optimizer.step()
    return model, optimizer


def _count_reads(monkeypatch) -> collections.Counter[str]:
    """How many times each file's bytes are read to check it (``commit.digest``), from now on."""
    reads: collections.Counter[str] = collections.Counter()
    digest = commit.digest

    def counted(path):
        reads[str(path)] += 1
        return digest(path)

    monkeypatch.setattr(commit, "digest", counted)
    return reads


def test_latest_then_load_checks_each_file_once_and_a_named_path_is_checked(tmp_path, monkeypatch):
    saved_model, optimizer = _model_and_optimizer()
    checkpoint.save(tmp_path, 1, saved_model, optimizer, {"step": 1})
    reads = _count_reads(monkeypatch)
    model, fresh = _model_and_optimizer()
    found = checkpoint.latest(tmp_path)
    state = checkpoint.load(found, model, fresh, {"step": 0}, verified=True)
    assert state["step"] == 1 and torch.equal(model.weight, saved_model.weight)
    files = sorted(str(p) for p in found.rglob("*") if p.is_file() and p.name != commit.MARKER)
    assert sorted(reads) == files and set(reads.values()) == {1}

    reads.clear()
    checkpoint.load(found, model, fresh, {"step": 0})  # a path named by the caller: checked first
    assert sorted(reads) == files and set(reads.values()) == {1}


def test_a_folder_the_resume_just_checked_is_not_read_again_and_a_newer_one_is(tmp_path, monkeypatch):
    """What ``CheckpointConfig.verified`` names (``forge_nb.resume`` checked it before spawning the trainer) is
    taken as whole; any other folder, here a newer one that appeared since, is checked as before."""
    model, optimizer = _model_and_optimizer()
    for step in (1, 2):
        checkpoint.save(tmp_path, step, model, optimizer, {"step": step})
    first, second = checkpoint.step_dir(tmp_path, 1), checkpoint.step_dir(tmp_path, 2)
    reads = _count_reads(monkeypatch)

    assert checkpoint.latest(tmp_path, verified=second) == second
    assert not reads  # nothing of it read again

    assert checkpoint.latest(tmp_path, verified=first) == second  # the newest is another: it is checked
    assert {str(p.parent) for p in map(Path, reads)} == {str(second)}

    shard = next(second.glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[:-1])  # damaged after the resume's check named the older one
    reads.clear()
    assert checkpoint.latest(tmp_path, verified=first) == first  # second: found cut short by its size
    assert not {str(p.parent) for p in map(Path, reads)} & {str(first)}  # first: trusted, not read
