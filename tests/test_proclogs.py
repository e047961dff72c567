"""Spawned processes write into log files, not into the kernel's cells, and the logs read back by level."""

from __future__ import annotations

import logging
import time
import uuid

import pytest

from forge_nb.system.processes import proclogs
from forge_nb.system.runtime import spawning
from tests.actors_for_tests import Printer

pytestmark = pytest.mark.timeout(120)


async def test_a_mesh_writes_its_output_to_its_log_file_not_to_the_kernel(runtime, tmp_path, capfd):
    token = uuid.uuid4().hex
    mesh = await spawning.spawn_mesh("printer", 1, log_dir=tmp_path / "logs")
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
    mesh = await spawning.spawn_mesh("bars", 1, log_dir=tmp_path / "logs")
    try:
        semaphores, children = await mesh.spawn("printer", Printer).bar.call_one(token)
    finally:
        await mesh.stop()
    assert semaphores == [] and not [c for c in children if "resource_tracker" in c], (semaphores, children)
    assert f"{token}: 100%" in (tmp_path / "logs" / "bars.log").read_text()  # the bar itself is drawn, in the log


async def test_a_mesh_outside_a_run_logs_into_the_kernels_private_folder(runtime):
    mesh = await spawning.spawn_mesh("printer", 1)
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


def _alike(logger: logging.Logger, i: int) -> None:
    logger.warning("trajectory %d: the agent raised KeyError: 'question'", i)  # one line of code, many records


def test_a_kernel_log_writes_a_few_of_many_alike_records_and_counts_the_rest(tmp_path):
    """A loop failing the same way thousands of times writes a bounded log; what was left out is counted."""
    logger = logging.getLogger("forge_nb.tests.flood")
    log = proclogs.KernelLog(tmp_path)
    try:
        for i in range(20_000):
            _alike(logger, i)
        logger.error("the run paused")  # another line: written
    finally:
        log.close()
    lines = log.path.read_text().splitlines()
    assert len(lines) == proclogs.REPEATS + 1, lines[:10]
    assert lines[-1].endswith("ERROR forge_nb.tests.flood: the run paused")
    assert not [line for line in lines if "[actor=" in line]  # monarch's actor prefix says nothing in a kernel


def test_the_next_record_of_a_line_says_how_many_alike_were_left_out(tmp_path):
    logger = logging.getLogger("forge_nb.tests.repeats")
    handler = logging.FileHandler(tmp_path / "repeats.log")
    handler.addFilter(proclogs.repeats_summarised(period_s=0.2))
    logger.addHandler(handler)
    try:
        for i in range(100):
            _alike(logger, i)
        time.sleep(0.3)  # the period is over: the line may write again
        _alike(logger, 100)
    finally:
        logger.removeHandler(handler)
        handler.close()
    text = (tmp_path / "repeats.log").read_text()
    assert text.count("the agent raised KeyError") == proclogs.REPEATS + 1
    assert f"(and {100 - proclogs.REPEATS} more like this from the same line, left out of this log)" in text


def test_monarch_s_actor_prefix_stays_off_the_kernel_log_s_handler(runtime, tmp_path):
    plain = logging.Handler()
    logging.getLogger("forge_nb.tests.prefix").addHandler(plain)  # monarch gives every new handler its filter
    log = proclogs.KernelLog(tmp_path)
    try:
        assert [f for f in plain.filters if type(f).__name__ == "_ActorFilter"]
        assert not [f for f in log.handler.filters if type(f).__name__ == "_ActorFilter"]
    finally:
        log.close()
        logging.getLogger("forge_nb.tests.prefix").removeHandler(plain)


def test_two_runs_kernel_logs_hold_their_own_records_and_the_kernel_wide_ones(tmp_path):
    """Both handlers sit on the kernel's shared loggers; each takes its run's records (those logged in its
    run_context) and the kernel-wide ones, never the other run's."""
    logs = {name: proclogs.KernelLog(tmp_path / name, name) for name in ("run-a", "run-b")}
    logger = logging.getLogger("forge_nb.controller.core")
    try:
        proclogs.run_context("run-a").run(logger.warning, "only run-a's")
        proclogs.run_context("run-b").run(logger.warning, "only run-b's")
        logger.warning("the kernel's, for both")
    finally:
        for log in logs.values():
            log.close()
    text = {name: log.path.read_text() for name, log in logs.items()}
    assert "only run-a's" in text["run-a"] and "only run-a's" not in text["run-b"]
    assert "only run-b's" in text["run-b"] and "only run-b's" not in text["run-a"]
    assert all("the kernel's, for both" in t for t in text.values())
