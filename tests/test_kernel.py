"""The kernel as single controller: a dead actor never takes the kernel down; nothing outlives it."""

from __future__ import annotations

import os
import signal
import time

import pytest

from forge_nb.system.processes.procs import pid_alive
from tests.kernel_client import Kernel

pytestmark = pytest.mark.timeout(240)

SPAWN = """
from forge_nb.system.runtime import spawning
from tests.actors_for_tests import Sleeper
mesh = await spawning.spawn_mesh("kernel-test", procs=2)
sleeper = mesh.spawn("sleeper", Sleeper)
await sleeper.sleep.call(0)
print("PIDS", *mesh.pids)
"""


def _pids(reply) -> list[int]:
    line = next(line for line in reply.stdout.splitlines() if line.startswith("PIDS"))
    return [int(p) for p in line.split()[1:]]


def _gone(pids: list[int], within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not any(pid_alive(p) for p in pids):
            return True
        time.sleep(0.2)
    return False



@pytest.fixture
def kernel():
    k = Kernel()
    yield k
    k.shutdown(now=True)


def test_actor_killed_while_a_cell_waits_does_not_kill_the_kernel(kernel):
    spawned = kernel.run(SPAWN)
    assert spawned.status == "ok", spawned
    victim, survivor = _pids(spawned)
    kernel_pid = kernel.pid

    waiting = kernel.submit("await sleeper.slice(procs=0).sleep.call_one(60)")
    kernel.wait_busy(waiting)
    time.sleep(0.5)
    os.kill(victim, signal.SIGKILL)
    reply = kernel.collect(waiting, timeout=60)
    assert reply.status == "error" and "SupervisionError" in reply.error, reply

    after = kernel.run("print('alive', 1 + 1, mesh.state, len(mesh.failures) >= 1)")
    assert after.status == "ok" and "alive 2 failed True" in after.stdout, after
    assert kernel.pid == kernel_pid and kernel.is_alive()
    # The other proc still answers from the same kernel.
    again = kernel.run("print(await sleeper.slice(procs=1).sleep.call_one(0.1))")
    assert again.status == "ok" and "0.1" in again.stdout, again
    assert pid_alive(survivor)


def test_actor_killed_while_the_kernel_is_idle_is_recorded_not_fatal(kernel):
    spawned = kernel.run(SPAWN)
    victim = _pids(spawned)[1]
    os.kill(victim, signal.SIGKILL)
    time.sleep(3)
    after = kernel.run("print('failures', len(mesh.failures), mesh.failures[0].ranks)")
    assert after.status == "ok" and "failures 1 [1]" in after.stdout, after


@pytest.mark.parametrize("now", [False, True], ids=["restart", "restart-now"])
def test_no_process_survives_a_kernel_restart(kernel, now):
    pids = _pids(kernel.run(SPAWN))
    assert all(pid_alive(p) for p in pids)
    kernel.restart(now=now)
    assert _gone(pids, within=15), f"procs {pids} outlived a kernel restart"
    assert kernel.run("print(6 * 7)").stdout.strip() == "42"


def test_what_a_proc_started_does_not_outlive_a_sigkilled_kernel(kernel):
    # a vLLM generator's proc starts its engine and workers; monarch's PR_SET_PDEATHSIG takes the proc
    # along with the kernel but not them: the reaper kills the proc's process group
    reply = kernel.run(SPAWN + """
from tests.actors_for_tests import Parent
print("CHILD", *(await mesh.spawn("parent", Parent).start_child.call()).values())
""")
    assert reply.status == "ok", (reply.error, reply.stdout[-2000:])
    pids = _pids(reply)
    children = [int(p) for p in next(line for line in reply.stdout.splitlines()
                                     if line.startswith("CHILD")).split()[1:]]
    assert len(children) == 2 and all(pid_alive(p) for p in children)
    os.kill(kernel.pid, signal.SIGKILL)
    try:
        assert _gone([*pids, *children], within=15), {p: pid_alive(p) for p in [*pids, *children]}
    finally:
        for pid in [*pids, *children]:
            if pid_alive(pid):
                os.kill(pid, signal.SIGKILL)
    kernel.restart(now=True)
