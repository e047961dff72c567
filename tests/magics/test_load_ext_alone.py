"""A kernel that loads forge_nb and spawns nothing starts no process and leaves none behind.

``%load_ext forge_nb`` starts monarch's runtime inside the kernel's own process
(``forge_nb.system.runtime.lifecycle``); every other process comes with a run's spawn, whose first rollouts the
trainer samples while the generators start (``forge_nb.controller.lifecycle.stand_in``). So nothing is begun early
that a kernel without a run would have to release: these tests hold that to be true in a real kernel.
"""

from __future__ import annotations

import time

import pytest

from forge_nb.system.processes.procs import pid_alive
from tests.kernel_client import Kernel, Reply
from tests.procs import descendants

pytestmark = [pytest.mark.timeout(180)]


def ok(reply: Reply) -> Reply:
    assert reply.status == "ok", f"{reply.error}\n{reply.stdout[-3000:]}\n{reply.stderr[-3000:]}"
    return reply


def _gone(pid: int, timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def test_a_kernel_that_loads_forge_nb_shuts_down_and_exits_without_a_run_leaves_no_process(tmp_path):
    kernel = Kernel(cwd=str(tmp_path))
    pid = kernel.pid
    try:
        ok(kernel.run("%load_ext forge_nb"))
        assert "no meshes" in ok(kernel.run("%forge_meshes")).stdout
        assert not descendants(pid), "processes started by %load_ext forge_nb alone"
        ok(kernel.run("%forge_shutdown"))  # nothing to shut down: says so, starts nothing
        assert not descendants(pid), "processes left under the kernel by %forge_shutdown without a run"
    finally:
        kernel.shutdown()
    assert _gone(pid), f"the kernel {pid} did not exit"
