"""Commit markers (forge_nb.rundir.commit) and the run directory's choice of checkpoint (RunDir.checkpoint_to_resume),
on files in a temporary folder; the same with a real trainer and real processes is in tests/run/test_run.py
and tests/actors/test_trainer.py."""

from __future__ import annotations

import pytest
import torch

from forge_nb.rundir import CheckpointsDamaged, RunDir
from forge_nb.rundir.commit import MARKER, commit, verify, verify_folder


def _folder(path, **files: bytes):
    path.mkdir(parents=True)
    for name, data in files.items():
        (path / name).write_bytes(data)
    return path


def test_a_marker_catches_a_missing_short_or_changed_file_and_its_own_absence(tmp_path):
    folder = _folder(tmp_path / "ck", **{"a.bin": b"x" * 1000, ".metadata": b"m"})
    assert verify_folder(folder) == f"no commit marker ({MARKER}): its write did not finish"
    commit(folder, ["a.bin", ".metadata"], folder / MARKER, step=3)
    assert verify_folder(folder) is None
    (folder / "a.bin").write_bytes(b"x" * 999 + b"y")  # same size, other bytes
    assert verify_folder(folder) == "a.bin does not hold what was written (its CRC-32 differs)"
    (folder / "a.bin").write_bytes(b"x" * 10)
    assert verify_folder(folder) == "a.bin is 10 bytes; 1000 were written"
    (folder / "a.bin").unlink()
    assert verify_folder(folder) == "a.bin is missing"
    (folder / MARKER).write_text("{not json")
    assert verify(folder, folder / MARKER).startswith(f"its commit marker {MARKER} is unreadable")


def _checkpoint(run: RunDir, version: int) -> None:
    trainer = _folder(run.checkpoints / f"step_{version:08d}", **{"__0_0.distcp": b"t" * 64, ".metadata": b"m"})
    commit(trainer, ["__0_0.distcp", ".metadata"], trainer / MARKER, step=version)
    run.save_state(version, str(trainer), step=version * 10, buffer={})


def test_the_newest_whole_checkpoint_is_chosen_and_what_is_newer_is_set_aside(tmp_path):
    run = RunDir.create({}, "r", str(tmp_path / "run"))
    for version in (1, 2, 3, 4):
        _checkpoint(run, version)
    assert sorted(p.name for p in run.checkpoints.glob("state_*.pt")) == [
        "state_00000002.pt", "state_00000003.pt", "state_00000004.pt"]  # the newest three are kept
    size = (run.checkpoints / "state_00000004.pt").stat().st_size
    (run.checkpoints / "state_00000004.pt").write_bytes(b"cut")  # the run's side of 4 damaged
    orphan = _folder(run.checkpoints / "step_00000005", **{".metadata": b"m"})  # the trainer's, no run state
    commit(orphan, [".metadata"], orphan / MARKER)
    assert run.verified_trainer_checkpoint is None
    state, skipped = run.checkpoint_to_resume()
    assert state["version"] == 3 and state["step"] == 30
    assert run.verified_trainer_checkpoint == run.checkpoints / "step_00000003"  # the trainer need not read it again
    damaged = f"state_00000004.pt is 3 bytes; {size} were written"
    assert skipped == [(str(run.checkpoints / "state_00000004.pt"), damaged),
                       (str(orphan), "no run state was committed for it (the run stopped while checkpointing)")]
    assert sorted(p.name for p in run.checkpoints.iterdir() if p.name.endswith(".skipped")) == [
        "state_00000004.json.skipped", "state_00000004.pt.skipped", "step_00000004.skipped", "step_00000005.skipped"]
    assert run.load_state()["version"] == 3


def test_a_run_directory_moved_elsewhere_resumes_from_its_own_checkpoints(tmp_path):
    run = RunDir.create({}, "r", str(tmp_path / "run"))
    _checkpoint(run, 1)
    (tmp_path / "run").rename(tmp_path / "moved")
    moved = RunDir.open(tmp_path / "moved")
    state, skipped = moved.checkpoint_to_resume()
    assert (state["version"], skipped) == (1, [])
    assert moved.verified_trainer_checkpoint == tmp_path / "moved" / "checkpoints" / "step_00000001"


def test_none_whole_refuses_with_each_and_renames_nothing(tmp_path):
    run = RunDir.create({}, "r", str(tmp_path / "run"))
    _checkpoint(run, 1)
    (run.checkpoints / "step_00000001" / "__0_0.distcp").unlink()
    before = sorted(p.name for p in run.checkpoints.iterdir())
    with pytest.raises(CheckpointsDamaged, match=r"state_00000001.pt: trainer checkpoint step_00000001: "
                                                 r"__0_0.distcp is missing\. Nothing was spawned"):
        run.checkpoint_to_resume()
    assert sorted(p.name for p in run.checkpoints.iterdir()) == before


def test_a_run_directory_from_before_markers_is_adopted_as_it_is(tmp_path):
    run = RunDir.create({}, "r", str(tmp_path / "run"))
    _folder(run.checkpoints / "step_00000002", **{"__0_0.distcp": b"t", ".metadata": b"m"})
    torch.save({"step": 20, "version": 2}, run.path / "state.pt")
    state, skipped = run.checkpoint_to_resume()
    assert (state["step"], skipped) == (20, [])
    assert verify_folder(run.checkpoints / "step_00000002") is None  # marked now: the trainer will load it
    assert RunDir.create({}, "fresh", str(tmp_path / "fresh")).checkpoint_to_resume() == (None, [])
