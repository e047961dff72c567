"""The quickstart driven through the magics in a real kernel: spawn, run, set, interrupt, pause, step, shutdown,
then %forge_attach, a kernel kill (and what it leaves in /dev/shm and the temporary folder), and %forge_attach
in a fresh kernel.

One kernel and one run are shared by the tests of this module (the spawn starts two vLLM engines and
takes about a minute); the tests run in file order and each leaves the run in the state the next expects.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import tempfile
import time
from pathlib import Path

import pytest

from forge_nb.system.processes.procs import SHM, SOCKETS_ROOT, files_in_use, pid_alive, weight_files_root
from tests.kernel_client import Kernel, Reply
from tests.procs import descendants

pytestmark = [pytest.mark.heavy, pytest.mark.timeout(600),
              pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (the cpu or gpu extra)")]

HELPERS = """
import asyncio, json

async def _until(predicate, timeout):
    loop = asyncio.get_running_loop()
    start = loop.time()
    while not predicate():
        if loop.time() - start > timeout:
            return False
        await asyncio.sleep(0.25)
    return True

def _value(*values):
    print("VALUE", json.dumps(values, default=str))
"""


def ok(reply: Reply) -> Reply:
    assert reply.status == "ok", f"{reply.error}\n{reply.stdout[-3000:]}\n{reply.stderr[-3000:]}"
    return reply


def value(reply: Reply) -> list:
    """What the cell passed to ``_value(...)`` (procs' logs share the cell's stdout, hence the marker)."""
    ok(reply)
    line = next(line for line in reversed(reply.stdout.splitlines()) if line.startswith("VALUE "))
    return json.loads(line[len("VALUE "):])


@pytest.fixture(scope="module")
def kernel(tmp_path_factory):
    k = Kernel(cwd=str(tmp_path_factory.mktemp("magics-kernel")))
    try:
        k.loaded = ok(k.run("%load_ext forge_nb\n" + HELPERS))
        spawned = k.run("%forge_spawn quickstart --set loop.rollout_loops=2", timeout=480)
        if spawned.status != "ok":
            pytest.fail(f"the quickstart did not spawn: {spawned.error}\n{spawned.stderr[-3000:]}")
        k.spawned = spawned
        yield k
    finally:
        k.shutdown_runs_and_close()


def test_spawn_binds_the_run_and_its_services(kernel):
    assert "is up (policy x1, trainer x1); bound to `run`, `policy`, `trainer`" in kernel.spawned.stdout
    for cell in (kernel.loaded, kernel.spawned):  # monarch's runtime says where it logs into a file, not the cell
        assert "Monarch internal logs" not in cell.streams, cell.streams
    kinds = value(kernel.run("_value(type(run).__name__, run.name, run.state, sorted(run.services), "
                             "type(policy).__name__, policy is run.policy, trainer is run.trainer)"))
    # the generators' service behind the trainer standing in until they serve (controller.lifecycle.stand_in)
    assert kinds == ["Run", "quickstart", "ready", ["policy", "trainer"], "StandInPolicy", True, True]
    meshes = ok(kernel.run("%forge_meshes")).text
    assert "2 mesh(es) held by this kernel" in meshes  # the generator and the trainer (torchstore: in the kernel)
    assert "quickstart-policy-r0" in meshes and "quickstart-policy-r1" not in meshes and "quickstart-trainer" in meshes


def test_run_trains_in_the_background_and_status_shows_it(kernel):
    started = time.monotonic()
    reply = ok(kernel.run("%forge_run"))
    assert time.monotonic() - started < 30, "%forge_run must return at once"
    assert "is running in the background (2 rollout loop(s) + training)" in reply.stdout
    reached, step, state, error = value(kernel.run(
        "_value(await _until(lambda: run.current_step >= 2 and run.policy.serving, 240), run.current_step, run.state, "
        "run.error)",  # the trainer samples the first steps' rollouts while the generator starts (stand_in)
        timeout=300))
    assert reached and state == "running" and error is None, (step, state, error)
    status = ok(kernel.run("%forge_status")).text
    assert "run 'quickstart': running, step" in status
    assert "train running" in status and "rollout0 running" in status and "rollout1 running" in status
    replica_rows = [line for line in status.splitlines() if line.startswith(("policy ", "trainer "))]
    assert len(replica_rows) == 2 and all(" healthy " in row for row in replica_rows), status


def test_set_is_recorded_as_a_set_event(kernel):
    assert "lr=0.002 applies at the next step boundary" in ok(kernel.run("%forge_set lr=2e-3")).stdout
    recorded, lr = value(kernel.run(
        "_value(await _until(lambda: any(e['kind'] == 'set' and e['changes'] == {'lr': 0.002} "
        "for e in run.metrics.events), 120), run.hparams['lr'])", timeout=180))
    assert recorded and lr == 0.002
    wrong = kernel.run("%forge_set bogus=1")  # a UsageError is shown on stderr, without a traceback
    assert wrong.status == "error" and "UsageError: %forge_set: unknown name(s) ['bogus']; hot-changeable:" \
        in wrong.stderr, wrong


@pytest.mark.parametrize(("code", "raised"), [("import time\ntime.sleep(60)", "KeyboardInterrupt"),
                                              ("await asyncio.sleep(60)", "CancelledError")],
                         ids=["blocking", "awaiting"])
def test_an_interrupt_cancels_only_the_cell(kernel, code, raised):
    msg = kernel.submit("_before = run.current_step\n" + code)
    kernel.wait_busy(msg)
    time.sleep(2)
    kernel.interrupt()
    reply = kernel.collect(msg, timeout=60)
    assert reply.status == "error" and raised in reply.error, reply
    grew, before, after, state, loops = value(kernel.run(
        "_value(await _until(lambda: run.current_step > _before + 1, 180), _before, run.current_step, run.state, "
        "run.status()['loops'])", timeout=240))
    assert grew and state == "running", (before, after, state)
    assert set(loops.values()) == {"running"}, loops


def test_episodes_table(kernel):
    table = ok(kernel.run("%forge_episodes -n 3")).text
    assert "3 episode(s), newest last" in table
    assert "episode_id" in table and "reward" in table and "response" in table


def test_dashboard_displays_the_run(kernel):
    reply = ok(kernel.run("%forge_dashboard"))
    assert reply.results, "nothing was displayed"
    # one dashboard per run: closing it stops its poll task
    ok(kernel.run("import forge_nb.widgets\nforge_nb.widgets.dashboard(run).close()"))


def test_pause_stops_step_growth(kernel):
    assert "pauses at the next boundary" in ok(kernel.run("%forge_pause")).stdout
    # the step in flight finishes; then the count must stay put
    settled, steps, state = value(kernel.run(
        "_seen = [run.current_step, asyncio.get_running_loop().time()]\n"
        "def _settled():\n"
        "    now = asyncio.get_running_loop().time()\n"
        "    if run.current_step != _seen[0]:\n"
        "        _seen[:] = [run.current_step, now]\n"
        "    return now - _seen[1] > 4\n"
        "_ok = await _until(_settled, 60)\n"
        "_a = run.current_step\n"
        "await asyncio.sleep(8)\n"
        "_value(_ok, [_a, run.current_step], run.state)", timeout=120))
    assert settled and steps[0] == steps[1] and state == "paused", (steps, state)


def test_step_waits_for_exactly_n_steps(kernel):
    before = value(kernel.run("_value(run.current_step)"))[0]
    reply = ok(kernel.run("%forge_step 1", timeout=180))
    assert "run 'quickstart': 1 step(s), now paused" in reply.text
    assert value(kernel.run("_value(run.current_step, run.state)")) == [before + 1, "paused"]
    # --steps: in the background, then a pause
    reply = ok(kernel.run("%forge_run --steps 2"))
    assert "2 step(s) in the background" in reply.stdout
    done, step = value(kernel.run(
        "_value(await _until(lambda: run.state == 'paused', 180), run.current_step)", timeout=240))
    assert done and step == before + 3


def test_a_checkpoint_keeps_the_run_for_a_later_attach(kernel):
    kernel.saved = value(kernel.run(
        "await run.checkpoint()\n_value(str(run.dir.path), run.current_step, run.version)", timeout=180))
    assert kernel.saved[1] >= 3 and kernel.saved[2] >= 3


def test_shutdown_leaves_no_process(kernel):
    pids = value(kernel.run("import forge_nb\n_value([p for m in forge_nb.meshes() for p in m.pids])"))[0]
    assert len(pids) == 2 and all(pid_alive(p) for p in pids)  # torchstore lives in the kernel: no mesh
    reply = ok(kernel.run("%forge_shutdown", timeout=180))
    # the generator replica and the trainer
    assert "shut down 1 run(s) and 2 mesh(es): all 2 process(es) exited" in reply.stdout, reply.stdout[-2000:]
    assert not [p for p in pids if pid_alive(p)]
    assert "no meshes" in ok(kernel.run("%forge_meshes")).stdout
    assert "UsageError: no run yet" in kernel.run("%forge_status").stderr
    # whatever else still runs under the kernel, the magic names it
    for pid in descendants(kernel.pid):
        assert f"{pid} (" in reply.stdout, (pid, reply.stdout[-2000:])


def test_no_process_at_all_is_left_under_the_kernel(kernel):
    leftover = descendants(kernel.pid)
    assert not leftover, f"processes left under the kernel after %forge_shutdown: {leftover}"


def _shm_and_tmp() -> set[Path]:
    """The entries of /dev/shm, of the temporary folder and of forge_nb's folders in them."""
    folders = [SHM, Path(tempfile.gettempdir()), weight_files_root(), SOCKETS_ROOT]
    return {entry for folder in folders if folder.is_dir() for entry in folder.iterdir()}


def _left_by(pids: set[int], new: set[Path], used: set[str]) -> dict[str, list[Path]]:
    """Which of the ``new`` entries belong to the processes ``pids`` (``used``: the files they mapped or held
    open), by kind. An entry counts when they used it or something under it, when it is named by one of
    their pids (generator folders, weight files), or when it is a vLLM rendezvous file in the temporary folder
    (no live process holds one open, so these are told apart only by being new: none may be there, each
    engine makes its own in its generator's folder); others' entries never count."""
    left: dict[str, list[Path]] = {}
    for entry in sorted(new):
        by_pid = entry.parent in (SOCKETS_ROOT, weight_files_root())
        if ((by_pid and entry.name.split("-")[0] in map(str, pids)) or entry.name.startswith("vllm_dist_")
                or str(entry) in used or any(u.startswith(f"{entry}/") for u in used)):
            kind = "<pid>" if by_pid else re.match(r"[A-Za-z]*", entry.name)[0]
            left.setdefault(f"{entry.parent}/{kind}*", []).append(entry)
    return left


def test_attach_then_a_killed_kernel_leaves_nothing_and_attach_in_a_fresh_kernel_resumes(kernel):
    """Last in the module: it kills the shared kernel. %forge_attach brings the shut-down run back from its
    directory; a SIGKILLed kernel takes every process of it along within 15 s (monarch's procs by
    PDEATHSIG, vLLM's engines by forge_nb's reaper); a fresh kernel attaches again and goes on.

    What the killed run leaves in /dev/shm and the temporary folder, from listings before the attach and
    after its processes are gone (only what the run's processes used or named counts). Its processes run no
    clean-up (SIGKILL), but the reaper that kills the engines removes their ``psm_*`` segments, and the
    folders and weight files named by the kernel and its procs (a generator's folder holds its vLLM sockets
    and its engine's ``vllm_dist_*`` rendezvous file): none of these may be left."""
    run_dir, step, version = kernel.saved
    before = _shm_and_tmp()
    reply = ok(kernel.run(f"%forge_attach {run_dir}", timeout=480))
    assert "run 'quickstart' is up" in reply.stdout, reply.stdout[-2000:]
    assert value(kernel.run("_value(run.current_step, run.version, run.state)")) == [step, version, "ready"]
    ok(kernel.run("%forge_step 1", timeout=180))
    ok(kernel.run("await run.checkpoint()", timeout=180))
    under = descendants(kernel.pid)  # mesh procs, vLLM engines and their workers, the reapers
    assert len(under) >= 4, under
    pids = {kernel.pid, *under}
    used = files_in_use(pids)
    os.kill(kernel.pid, signal.SIGKILL)
    deadline = time.monotonic() + 15
    while [p for p in under if pid_alive(p)] and time.monotonic() < deadline:
        time.sleep(0.25)
    assert not [p for p in under if pid_alive(p)], {p: c for p, c in under.items() if pid_alive(p)}

    left = _left_by(pids, _shm_and_tmp() - before, used)
    print("what the killed run left:", {kind: len(entries) for kind, entries in left.items()})
    assert not left, f"the killed run left {left}"

    kernel.restart(now=True)  # a fresh kernel, as after the kill the notebook starts a new one
    ok(kernel.run("%load_ext forge_nb\n" + HELPERS))
    reply = ok(kernel.run(f"%forge_attach {run_dir}", timeout=480))
    assert "run 'quickstart' is up" in reply.stdout, reply.stdout[-2000:]
    assert value(kernel.run("_value(run.current_step, run.version)")) == [step + 1, version + 1]
    ok(kernel.run("%forge_shutdown", timeout=180))
