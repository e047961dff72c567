"""A full disk under a run: the run directory on a small tmpfs of its own, filled to the last byte while the run
trains (light actors on real processes and a real torchstore; the trainer's checkpoint is a small file). The
run pauses with ``DiskFull`` (what was not written, where, the space it needs); room back and run.start()
goes on."""

from __future__ import annotations

import errno
import json
import os
import subprocess

import pytest

import forge_nb
from forge_nb.config import LoopConfig
from forge_nb.system.diskspace import DiskFull
from tests.controller.conftest import light_config
from tests.light_actors import LightGenerator, LightTrainer

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def small_disk(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(disk)], capture_output=True,
                             text=True)
    if mounted.returncode:
        pytest.skip(f"cannot mount a tmpfs here to fill ({mounted.stderr.strip() or 'mount failed'})")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def _fill(disk) -> os.PathLike:
    """Write a file until the disk has no byte left."""
    filler = disk / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * 65536)
        except OSError as e:
            assert e.errno == errno.ENOSPC
        try:
            while True:
                f.write(b"\0")
        except OSError:
            pass
    return filler


async def test_a_full_disk_pauses_the_run_saying_so_keeps_every_row_and_space_back_goes_on(runtime, small_disk):
    cfg = light_config(str(small_disk / "run"), "full", loop=LoopConfig(rollout_loops=2, checkpoint_every=3))
    run = await forge_nb.spawn(cfg, progress=False, actors={"policy": LightGenerator, "trainer": LightTrainer})
    try:
        await run.step(3)  # step 3's checkpoint: the size the next one needs
        filler = _fill(small_disk)
        with pytest.raises(DiskFull) as raised:
            await run.step(3)  # step 6 checkpoints
        said = str(raised.value)
        checkpoints = run.dir.checkpoints
        assert said.startswith(f"the disk of {checkpoints} is full: the checkpoint of version 6 was not written "
                               "(0.0 MB free; it needs about "), said
        assert "run.start() (%forge_run) goes on from where it stopped" in said
        assert run.state == "paused" and run.error == said  # paused with the reason, not failed
        assert run.current_step == 6 and not run._ctl.running  # step 6 counts; nothing trains on a full disk
        (event,) = [e for e in run.metrics.events if e["kind"] == "disk_full"]
        assert event["message"] == said
        rows_written = [json.loads(line)["step"] for line in (run.dir.path / "metrics.jsonl").read_text().splitlines()]
        assert rows_written == [1, 2, 3, 4, 5, 6][: len(rows_written)]  # whole lines (the file's last page)
        states = sorted(p.name for p in checkpoints.glob("state_*"))
        assert states == ["state_00000003.json", "state_00000003.pt"]  # nothing half-written of version 6

        filler.unlink()  # space is back
        run.start()
        rows = await run.step(3)
        assert [r["step"] for r in rows] == [7, 8, 9]
        assert run.metrics.unwritten == 0 and run.metrics.disk_full is None
        written = [json.loads(line)["step"] for line in (run.dir.path / "metrics.jsonl").read_text().splitlines()]
        assert written == [r["step"] for r in run.metrics.rows] == list(range(1, 10))  # nothing lost
        assert sorted(p.name for p in checkpoints.glob("state_*"))[-2:] == ["state_00000009.json", "state_00000009.pt"]
        assert run.ledger()["balanced"], run.ledger()
        state, skipped = run.dir.checkpoint_to_resume()
        assert state["version"] == 9 and skipped == []
    finally:
        await run.shutdown()


def test_rows_and_events_a_full_disk_refuses_wait_in_memory_and_are_written_when_space_returns(small_disk):
    from forge_nb.metrics import MetricsStore

    store = MetricsStore(small_disk / "run")
    store.record(1, {"loss": 1.0})
    filler = _fill(small_disk)
    for step in range(2, 1000):  # until the files' last pages are full too (tmpfs fills by pages)
        store.record(step, {"loss": 1.0})
        store.event("note", text="x" * 100)
        if store.unwritten >= 6:
            break
    assert store.disk_full and store.unwritten >= 6, (store.disk_full, store.unwritten)
    kept = store.unwritten
    lines = (small_disk / "run" / "metrics.jsonl").read_text().splitlines()
    assert all(json.loads(line)["step"] for line in lines)  # only whole lines in the file
    filler.unlink()
    store.record(step + 1, {"loss": 0.5})
    assert store.unwritten == 0 and store.disk_full is None and kept > 0
    written = [json.loads(line)["step"] for line in (small_disk / "run" / "metrics.jsonl").read_text().splitlines()]
    assert written == [r["step"] for r in store.rows] == list(range(1, step + 2))
    again = MetricsStore(small_disk / "run")  # what a resume reads back
    assert len(again.rows) == len(store.rows) and len(again.events) == len(store.events)
