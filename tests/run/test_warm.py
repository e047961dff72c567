"""Processes kept warm between the runs of one kernel (``forge_nb.system.runtime.warm``): a run's second spawn takes the
first run's generator and trainer processes, trains in them with its own logs, and everything kept is stopped by
``forge_nb.shutdown_all()`` and by the kernel's exit; a kernel that loads the extension and exits leaves nothing."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest

import forge_nb
from forge_nb.system.processes.procs import pid_alive
from forge_nb.system.runtime import registry, warm
from tests.kernel_client import Kernel

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(600)]


async def pids_of(run: forge_nb.Run) -> dict[str, list[int]]:
    await run.policy.started()  # the trainer samples until its generators serve (stand_in); they start meanwhile
    return {name: [p for r in service.replicas for p in r.mesh.pids]
            for name, service in (("policy", run.policy), ("trainer", run.trainer))}


@pytest.mark.asyncio
async def test_a_second_run_trains_in_the_first_runs_processes_until_shutdown_all(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_NB_KEEP_WARM_S", "300")
    first = await forge_nb.spawn(forge_nb.quickstart(name="warm-a", run_dir=str(tmp_path / "a")), progress=False)
    try:
        await first.step(2)
        used = await pids_of(first)
    finally:
        gone = await first.shutdown()
    assert gone.kept == sorted(p for ps in used.values() for p in ps) and gone.exited == gone.alive == []
    assert "2 process(es) kept warm for the kernel's next run" in repr(gone)
    kept = {k["role"]: k["pids"] for k in warm.kept()}
    assert kept == {"Generator": used["policy"], "RLTrainer": used["trainer"]}, kept
    assert all(pid_alive(p) for ps in used.values() for p in ps)
    assert not {p for m in registry.meshes() for p in m.pids} & {p for ps in used.values() for p in ps}
    assert "kept warm for the next run" in warm.summary()

    second = await forge_nb.spawn(forge_nb.quickstart(name="warm-b", run_dir=str(tmp_path / "b")), progress=False)
    try:
        assert await pids_of(second) == used and warm.kept() == []  # the same processes, taken
        rows = await second.step(3)
        assert [r["step"] for r in rows] == [1, 2, 3] and second.ledger()["balanced"]
        logs = {p.name: p.read_text() for p in Path(second.dir.path, "logs").glob("*.log")}
        assert any("Generator" in name or "policy" in name for name in logs), sorted(logs)
        assert any("vLLM" in text or "vllm" in text for text in logs.values())  # its engine's log is the run's
    finally:
        await second.shutdown()
    assert len(warm.kept()) == 2
    # a kept process killed while it waits is not taken: its replica starts a new one
    os.kill(used["policy"][0], signal.SIGKILL)
    third = await forge_nb.spawn(forge_nb.quickstart(name="warm-c", run_dir=str(tmp_path / "c")), progress=False)
    try:
        now = await pids_of(third)
        assert now["trainer"] == used["trainer"] and now["policy"] != used["policy"]
        assert len(await third.step(1)) == 1
    finally:
        await third.shutdown()
    used["policy"] += now["policy"]
    await forge_nb.shutdown_all()
    assert warm.kept() == []
    deadline = time.monotonic() + 15
    while any(pid_alive(p) for ps in used.values() for p in ps) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert not [p for ps in used.values() for p in ps if pid_alive(p)]


@pytest.mark.asyncio
async def test_nothing_is_kept_with_keeping_off(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_NB_KEEP_WARM_S", "0")
    run = await forge_nb.spawn(forge_nb.quickstart(name="warm-off", run_dir=str(tmp_path / "r")), progress=False)
    try:
        used = await pids_of(run)
    finally:
        gone = await run.shutdown(wait_s=15)
    assert warm.kept() == [] and warm.summary() == ""
    assert gone.kept == gone.alive == [] and gone.exited == sorted(p for ps in used.values() for p in ps)
    deadline = time.monotonic() + 15
    while any(pid_alive(p) for ps in used.values() for p in ps) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    assert not [p for ps in used.values() for p in ps if pid_alive(p)]


def test_a_kernel_that_exits_leaves_no_process_behind(tmp_path):
    # one kernel loads the extension and exits; another spawns a run, shuts it down (its processes kept warm)
    # and exits: neither leaves a process
    import psutil

    kernel = Kernel(cwd=str(tmp_path), env={"FORGE_NB_KEEP_WARM_S": "300"})
    try:
        assert kernel.run("%load_ext forge_nb").status == "ok"
        started = {p.pid for p in psutil.Process(kernel.pid).children(recursive=True)}
    finally:
        kernel.shutdown()
    assert started == set()  # the extension starts no process of its own

    kernel = Kernel(cwd=str(tmp_path), env={"FORGE_NB_KEEP_WARM_S": "300"})
    try:
        code = f"""
%load_ext forge_nb
import forge_nb
from forge_nb.system.runtime import warm
run = await forge_nb.spawn(forge_nb.quickstart(name="warm-exit", run_dir={str(tmp_path / "r")!r}), progress=False)
await run.step(1)
"""
        reply = kernel.run(code, timeout=300)
        assert reply.status == "ok", reply.traceback or reply.streams
        reply = kernel.run("%forge_shutdown --name warm-exit", timeout=120)
        assert reply.status == "ok" and "are kept warm for the next run" in reply.stdout, reply.traceback or reply.text
        reply = kernel.run('print("KEPT", sorted(p for k in warm.kept() for p in k["pids"]))')
        kept = [int(p) for p in reply.stdout.split("KEPT", 1)[1].strip(" []\n").split(",")]
        assert len(kept) == 2 and all(pid_alive(p) for p in kept)
        status = kernel.run("%forge_status")
        assert "kept warm for the next run" in status.text, status.text
    finally:
        kernel.shutdown()
    deadline = time.monotonic() + 20
    while any(pid_alive(p) for p in kept) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not [p for p in kept if pid_alive(p)]
