"""A kernel that dies leaves its job's hosts running; a new kernel re-attaches to them and resumes the run
there (ProcessJob: three hosts simulated on this machine; light actors, no vLLM; real IPython kernels)."""

from __future__ import annotations

import json
import os
import signal
import time

import pytest

from forge_nb.system.processes.procs import pid_alive
from tests.kernel_client import Kernel, Reply

pytestmark = pytest.mark.timeout(400)

SETUP = """%load_ext forge_nb
import json, os
import forge_nb
from forge_nb.system.hosts import cluster
from forge_nb.config import GeneratorConfig, LoopConfig, TrainerConfig
from tests.controller.conftest import light_config
from tests.light_actors import LightGenerator, LightTrainer
LIGHT = {"policy": LightGenerator, "trainer": LightTrainer}"""


def ok(out: Reply) -> Reply:
    assert out.status == "ok", f"{out.traceback}\n{out.streams[-3000:]}"
    return out


def value(kernel: Kernel, expression: str):
    return json.loads(ok(kernel.run(f"print(json.dumps({expression}))")).stdout)


def wait_gone(pids: list[int], seconds: float = 30.0) -> list[int]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.2)
    return [p for p in pids if pid_alive(p)]


def test_a_new_kernel_re_attaches_to_the_job_s_hosts_and_resumes_the_run_there(tmp_path):
    save, runs = tmp_path / "job.pkl", tmp_path / "runs"
    first = Kernel(cwd=str(tmp_path))
    workers: list[int] = []
    try:
        ok(first.run(SETUP))
        out = ok(first.run(f"%forge_cluster --processes trainer=1 generators=2 --save {save}"))
        assert "3 host(s) of the job in use: trainer[0], generators[0], generators[1]" in out.stdout
        workers = value(first, "[os.getsid(h.probe_pid) for h in cluster.current().hosts]")
        ok(first.run(
            f"run = await forge_nb.spawn(light_config({str(runs)!r}, 'hosted', "
            "generator=GeneratorConfig(num_replicas=2, hosts='generators'), "
            "trainer=TrainerConfig(optimizer={'lr': 0.1}, loss='grpo', loss_config={'beta': 0.0}, hosts='trainer'), "
            "loop=LoopConfig(rollout_loops=2, checkpoint_every=2)), progress=False, actors=LIGHT)"))
        ok(first.run("await run.step(4)"))
        shown = ok(first.run("%forge_cluster")).stdout
        assert "generators[1]" in shown and "hosted-policy" in shown and "LOST" not in shown
        run_dir = value(first, "str(run.dir.path)")
        left = value(first, "[p for m in forge_nb.meshes() if m.host != 'kernel' for p in m.pids]")
        os.kill(first.pid, signal.SIGKILL)  # the kernel dies; the job's hosts, and what ran there, stay
        assert all(pid_alive(p) for p in workers + left)
    finally:
        first.shutdown(now=True)

    second = Kernel(cwd=str(tmp_path))
    try:
        ok(second.run(SETUP))
        ok(second.run(f"run = await forge_nb.resume({run_dir!r}, progress=False, actors=LIGHT)"))
        assert wait_gone(left) == [], "the dead kernel's processes on the job's hosts were not ended"
        assert value(second, "[len(h.reaped) for h in cluster.current().hosts]") != [0, 0, 0]
        assert value(second, "sorted({m.host for m in forge_nb.meshes()})") == \
            ["generators[0]", "generators[1]", "trainer[0]"]  # torchstore lives in the kernel: no mesh
        rows = value(second, "[r['step'] for r in await run.step(2)]")
        assert rows == [5, 6]  # from the checkpoint of step 4, on the same hosts
        out = ok(second.run("%forge_shutdown")).stdout
        assert "released the job's 3 host(s)" in out
        assert wait_gone(workers) == [], "the job's workers outlived %forge_shutdown"
    finally:
        second.shutdown(now=True)
        for pid in workers:  # whatever a failed assertion left
            if pid_alive(pid):
                os.killpg(pid, signal.SIGKILL)
