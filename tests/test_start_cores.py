"""While a run starts on too few cores, its generators' processes keep a core; every mask comes back after.

The tests narrow this process to two cores first (real masks, as a two-core machine has), so they behave the
same on a bigger machine; real monarch meshes stand for the generator and the trainer.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading

import pytest

import forge_nb
from forge_nb.config import GeneratorConfig
from forge_nb.system.processes import start_cores
from forge_nb.system.processes.procs import live_children
from forge_nb.system.runtime import spawning
from tests.controller.conftest import light_config
from tests.light_actors import LightGenerator, LightTrainer
from tests.waiting import waiter

pytestmark = [pytest.mark.timeout(180),
              pytest.mark.skipif(not hasattr(os, "sched_setaffinity") or len(os.sched_getaffinity(0)) < 2,
                                 reason="needs Linux CPU masks and two cores")]

_wait_for = waiter(timeout=30.0, interval=0.05)


def masks(pid: int) -> set[frozenset[int]]:
    """The distinct CPU masks of the threads of ``pid``."""
    found = set()
    for tid in os.listdir(f"/proc/{pid}/task"):
        with contextlib.suppress(OSError):
            found.add(frozenset(os.sched_getaffinity(int(tid))))
    return found


@pytest.fixture
def two_cores():
    """Every thread of this process on the first two of its cores, as on a two-core machine; then as before."""
    before = {int(tid): os.sched_getaffinity(int(tid)) for tid in os.listdir(f"/proc/{os.getpid()}/task")}
    whole = os.sched_getaffinity(0)
    cores = frozenset(sorted(os.sched_getaffinity(0))[:2])
    for tid in before:
        with contextlib.suppress(OSError):
            os.sched_setaffinity(tid, cores)
    yield cores
    for tid in os.listdir(f"/proc/{os.getpid()}/task"):
        with contextlib.suppress(OSError):
            os.sched_setaffinity(int(tid), before.get(int(tid), whole))


def test_it_applies_only_where_the_processes_outnumber_the_cores(two_cores, monkeypatch):
    assert start_cores.applies(processes=2, generator_processes=1) == two_cores
    assert start_cores.applies(processes=1, generator_processes=1) is None  # a core each, the kernel's too
    assert start_cores.applies(processes=3, generator_processes=2) is None  # no core left for the others
    assert start_cores.applies(processes=2, generator_processes=0) is None  # no generator to wait for
    monkeypatch.setenv("FORGE_NB_START_CORES", "0")
    assert start_cores.applies(processes=2, generator_processes=1) is None


async def test_the_generator_has_a_core_alone_until_the_block_ends(runtime, two_cores):
    kept, narrow = frozenset(sorted(two_cores)[:1]), frozenset(sorted(two_cores)[1:])
    own_mask = threading.Event()
    done = threading.Event()

    def pinned_by_its_owner() -> None:  # a thread that chose its own mask: left as it is
        os.sched_setaffinity(0, kept)
        own_mask.set()
        done.wait(60)

    thread = threading.Thread(target=pinned_by_its_owner, daemon=True)
    thread.start()
    own_mask.wait(10)
    kernel = os.getpid()
    async with start_cores.generators_first("t-cores-gen-r", processes=2, generator_processes=1):
        generator = await spawning.spawn_mesh("t-cores-gen-r0")
        other = await spawning.spawn_mesh("t-cores-trainer")
        assert await _wait_for(lambda: masks(other.pids[0]) == {narrow}), masks(other.pids[0])
        assert masks(generator.pids[0]) == {two_cores}  # widened at birth, then left alone
        assert masks(kernel) == {narrow, kept}  # every thread of this process but the one that chose its mask
    assert masks(kernel) == {two_cores, kept}
    for pid in (generator.pids[0], other.pids[0], *(c.pid for c in live_children(kernel, recursive=True))):
        assert masks(pid) == {two_cores}, pid
    done.set()
    thread.join(10)
    await generator.stop()
    await other.stop()


async def test_a_spawn_on_two_cores_keeps_a_core_for_its_generator_and_gives_every_mask_back(two_cores, tmp_path,
                                                                                             caplog):
    cfg = light_config(str(tmp_path), "light-cores", generator=GeneratorConfig(num_replicas=1))
    with caplog.at_level(logging.INFO, logger="forge_nb.system.processes.start_cores"):
        run = await forge_nb.spawn(cfg, progress=False, actors={"policy": LightGenerator, "trainer": LightTrainer})
    try:
        kept = sorted(two_cores)[:1]
        assert f"cores {kept} are kept for light-cores-policy-r*" in caplog.text
        for pid in (os.getpid(), *(c.pid for c in live_children(os.getpid(), recursive=True))):
            assert masks(pid) == {two_cores}, pid
        rows = await run.step(1)
        assert [r["step"] for r in rows] == [1]
    finally:
        await run.shutdown()
