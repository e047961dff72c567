"""Spawned processes write into log files, not into the kernel's cells, and the logs read back by level."""

from __future__ import annotations

import uuid

import pytest

from forge_nb.system import proclogs
from tests.actors_for_tests import Printer

pytestmark = pytest.mark.timeout(120)


async def test_a_mesh_writes_its_output_to_its_log_file_not_to_the_kernel(runtime, tmp_path, capfd):
    token = uuid.uuid4().hex
    mesh = await runtime.spawn_mesh("printer", 1, log_dir=tmp_path / "logs")
    try:
        printer = mesh.spawn("printer", Printer)
        await printer.say.call(token)
    finally:
        await mesh.stop()
    text = (tmp_path / "logs" / "printer.log").read_text()
    assert f"stdout {token}" in text and f"WARNING stderr {token}" in text and f"child-process {token}" in text
    out, err = capfd.readouterr()  # what reached this process's own stdout and stderr (a kernel's cells)
    assert token not in out and token not in err
    assert mesh.log_path == tmp_path / "logs" / "printer.log"


async def test_a_progress_bar_in_a_mesh_takes_no_semaphore_nor_tracker_process(runtime, tmp_path):
    """tqdm's default lock is a multiprocessing one, made at a process's first bar: a named semaphore in
    /dev/shm and, as the procs start processes with spawn, a resource tracker process to unlink it (one per
    proc, 13 MB; a killed kernel's reaper once took a tracker along before it could, leaving the semaphore).
    A proc's bars go to its own log file: a thread lock is enough, and nothing is left to clean."""
    token = uuid.uuid4().hex
    mesh = await runtime.spawn_mesh("bars", 1, log_dir=tmp_path / "logs")
    try:
        semaphores, children = await mesh.spawn("printer", Printer).bar.call_one(token)
    finally:
        await mesh.stop()
    assert semaphores == [] and not [c for c in children if "resource_tracker" in c], (semaphores, children)
    assert f"{token}: 100%" in (tmp_path / "logs" / "bars.log").read_text()  # the bar itself is drawn, in the log


async def test_a_mesh_outside_a_run_logs_into_the_kernels_private_folder(runtime):
    mesh = await runtime.spawn_mesh("printer", 1)
    try:
        assert mesh.log_path.parent == proclogs.default_log_dir()
        assert mesh.log_path.parent.stat().st_mode & 0o077 == 0
    finally:
        await mesh.stop()


def test_read_keeps_the_last_lines_or_those_of_a_level_with_tracebacks(tmp_path):
    (tmp_path / "run-policy-r0.log").write_text("\n".join([
        "INFO 11-23 loading model", "WARNING 11-23 RotaryEmbedding: Failed to load weights",
        "Traceback (most recent call last):", '  File "x.py", line 1, in <module>', "ValueError: boom",
        "INFO 11-23 done"]) + "\n")
    (tmp_path / "run-trainer-r0.log").write_text("step 1\nERROR the trainer said no\n")
    paths = sorted(tmp_path.glob("*.log"))
    assert proclogs.read(paths, n=2) == ["[run-trainer-r0] step 1", "[run-trainer-r0] ERROR the trainer said no"]
    errors = proclogs.read(paths, n=100, level="error")
    assert errors == ["[run-policy-r0] Traceback (most recent call last):",
                      '[run-policy-r0]   File "x.py", line 1, in <module>', "[run-policy-r0] ValueError: boom",
                      "[run-trainer-r0] ERROR the trainer said no"]
    assert "[run-policy-r0] WARNING 11-23 RotaryEmbedding: Failed to load weights" in proclogs.read(
        paths, n=100, level="warning")
    with pytest.raises(ValueError, match="level='debug'"):
        proclogs.read(paths, level="debug")
