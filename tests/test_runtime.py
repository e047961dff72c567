"""The runtime spawns real monarch meshes, validates resources, survives dead procs and cleans up."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from forge_nb.system.hosts import gpus
from forge_nb.system.processes.procs import pid_alive
from forge_nb.system.runtime import lifecycle, registry, spawning
from tests.procs import children
from tests.waiting import waiter

pytestmark = pytest.mark.timeout(120)


_wait_for = waiter(timeout=15.0, interval=0.05)


async def test_spawn_records_pids_and_stop_removes_them(runtime):
    mesh = await spawning.spawn_mesh("t-spawn", procs=2)
    assert len(mesh.pids) == 2 and len(set(mesh.pids)) == 2
    assert all(pid_alive(p) for p in mesh.pids)
    assert mesh in registry.meshes()
    info = mesh.info()
    assert (info.procs, info.state, info.with_gpus) == (2, "running", False)

    await mesh.stop()
    assert mesh.state == "stopped"
    assert mesh not in registry.meshes()
    assert await _wait_for(lambda: not mesh.alive_pids(), timeout=5)


async def test_names_are_unique_per_kernel(runtime):
    a = await spawning.spawn_mesh("twin")
    b = await spawning.spawn_mesh("twin")
    assert (a.name, b.name) == ("twin", "twin-2")
    assert registry.get_mesh("twin-2") is b
    with pytest.raises(KeyError, match="no mesh named 'nope'"):
        registry.get_mesh("nope")


@pytest.mark.parametrize("procs", [0, -1, 1.5, True])
async def test_bad_procs_is_a_clear_error(runtime, procs):
    with pytest.raises(ValueError, match="procs"):
        await spawning.spawn_mesh("bad", procs=procs)
    assert registry.meshes() == []


async def test_gpus_beyond_the_machine_are_refused_before_spawning(runtime):
    before = children(os.getpid())
    ask = spawning.visible_gpus() + 1
    with pytest.raises(gpus.ResourceError) as err:
        await spawning.spawn_mesh("gpu-hungry", procs=ask, with_gpus=True)
    msg = str(err.value)
    assert "gpu-hungry" in msg and f"{ask} GPU" in msg
    assert ("no CUDA device" in msg) if spawning.visible_gpus() == 0 else ("visible are free" in msg)
    assert registry.meshes() == []
    assert children(os.getpid()) <= before


async def test_multi_host_is_refused_with_advice(runtime):
    with pytest.raises(gpus.ResourceError, match="span several hosts are not supported yet"):
        await spawning.spawn_mesh("far", hosts=2)
    with pytest.raises(ValueError, match="no job is in use"):
        await spawning.spawn_mesh("far", hosts="generators")


async def test_sigkill_is_recorded_for_the_owner_and_the_survivor_answers(runtime):
    from tests.actors_for_tests import StoreUser

    mesh = await spawning.spawn_mesh("t-kill", procs=2)
    actor = mesh.spawn("user", StoreUser)
    assert len(await actor.pid.call()) == 2  # spawned on both procs before the kill
    seen = []
    mesh.on_failure(seen.append)
    os.kill(mesh.pids[1], signal.SIGKILL)

    assert await _wait_for(lambda: bool(seen), timeout=15), "the failure never reached the owner"
    assert mesh.state == "failed"
    assert seen[0].mesh == "t-kill" and 1 in seen[0].ranks
    # This process, which ran the fault hook, lives on, and the other proc still answers.
    assert await actor.slice(procs=0).pid.call_one() == mesh.pids[0]
    with pytest.raises(RuntimeError, match="is failed"):
        mesh.spawn("late", StoreUser)


async def test_mixed_sync_and_async_endpoints_work_after_async_endpoints(runtime):
    from tests.actors_for_tests import Mixed

    mesh = await spawning.spawn_mesh("t-mixed")
    actor = mesh.spawn("mixed", Mixed)
    assert await actor.add.call_one(2, 3) == 5
    assert await actor.add_later.call_one(2, 3) == 5


async def test_torchstore_state_dict_between_kernel_and_an_actor_process(runtime):
    import torch

    from forge_nb.weights.torchstore import ts
    from tests.actors_for_tests import StoreUser

    await ts.initialize()
    try:
        sd = {"layer.weight": torch.randn(8, 4), "layer.bias": torch.arange(4.0)}
        await ts.put_state_dict(sd, "kernel/v1")
        mesh = await spawning.spawn_mesh("t-store")
        actor = mesh.spawn("user", StoreUser)
        assert await actor.pid.call_one() != os.getpid()
        # The actor reads what the kernel wrote ...
        expected = float(sum(v.sum() for v in sd.values()))
        assert await actor.checksum.call_one("kernel/v1") == pytest.approx(expected)
        # ... and the kernel reads what the actor wrote.
        await actor.write.call_one("actor/v1", 3.0)
        back = await ts.get_state_dict("actor/v1")
        assert set(back) == {"w"} and torch.equal(back["w"], torch.full((5, 5), 3.0))
    finally:
        await ts.shutdown()
        ts.reset_client()


SCRIPT = textwrap.dedent(
    """
    import asyncio, os, signal, sys
    from forge_nb.system.runtime import lifecycle, registry, spawning
    from forge_nb.system.hosts import gpus

    async def main():
        mesh = await spawning.spawn_mesh("exit-test", procs=2)
        print("PIDS", *mesh.pids, flush=True)
        if sys.argv[1] == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if sys.argv[1] == "end":
            print("work done")  # not flushed: end_process must flush it
            lifecycle.end_process(3)

    asyncio.run(main())
    """
)


@pytest.mark.parametrize("how", ["exit", "kill", "end"])
def test_no_process_outlives_its_controller(tmp_path, how):
    script = tmp_path / "ctl.py"
    script.write_text(SCRIPT)
    out = subprocess.run([sys.executable, str(script), how], capture_output=True, text=True, timeout=90)
    pids = [int(p) for line in out.stdout.splitlines() if line.startswith("PIDS") for p in line.split()[1:]]
    assert len(pids) == 2, out.stdout + out.stderr
    if how == "end":  # end_process: the status it was given, the output flushed, the meshes killed
        assert out.returncode == 3 and "work done" in out.stdout.splitlines(), out.stdout + out.stderr
        assert not [p for p in pids if pid_alive(p)]
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
        time.sleep(0.2)
    assert not [p for p in pids if pid_alive(p)], f"procs outlived a controller that {how}ed"



async def test_a_dead_procs_own_children_do_not_outlive_it(runtime):
    """vLLM's engine and workers are children of the generator's proc: when it is SIGKILLed they are
    re-parented, not killed. The runtime kills the dead proc's process group."""
    from tests.actors_for_tests import Parent

    mesh = await spawning.spawn_mesh("t-orphans")
    grandchild = await mesh.spawn("parent", Parent).start_child.call_one()
    assert pid_alive(grandchild)
    os.kill(mesh.pids[0], signal.SIGKILL)
    assert await _wait_for(lambda: not pid_alive(grandchild), timeout=15), "an orphan outlived its proc"

    again = await spawning.spawn_mesh("t-orphans-stop")
    grandchild = await again.spawn("parent", Parent).start_child.call_one()
    await again.stop()
    assert await _wait_for(lambda: not pid_alive(grandchild), timeout=15), "stop() left a child behind"


async def test_releasing_a_runtime_lease_stops_the_meshes_its_holder_left_behind(runtime):
    await lifecycle.lease("holder-a")
    await lifecycle.lease("holder-b")
    left = await spawning.spawn_mesh("left-behind", owner="holder-a")
    kept = await spawning.spawn_mesh("kept", owner="holder-b")
    mine = await spawning.spawn_mesh("not-leased", owner="user")
    assert {"holder-a", "holder-b"} <= lifecycle.lease_holders()
    await lifecycle.release("holder-a")
    assert left.state == "stopped" and await _wait_for(lambda: not left.alive_pids())
    assert kept.state == "running" and mine.state == "running"
    await lifecycle.release("holder-a")  # released already: nothing happens
    await kept.stop()
    await lifecycle.release("holder-b")
    assert "holder-b" not in lifecycle.lease_holders() and mine.state == "running"  # not a holder's mesh
    await mine.stop()


def test_monarchs_log_folder_is_private_to_its_user(runtime):
    import stat

    from forge_nb.system.monarch_compat import private_log_dir

    folder = private_log_dir()  # the runtime fixture's ensure_started already called it
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700
    folder.chmod(0o755)  # as monarch creates it
    assert private_log_dir() == folder and stat.S_IMODE(folder.stat().st_mode) == 0o700
    for log in folder.glob("monarch_log*"):
        assert stat.S_IMODE(log.stat().st_mode) & 0o077 == 0, log
