"""Services on the hosts of a monarch job: ProcessJob simulates three hosts on this machine (one worker
process each), and forge_nb places, watches, respawns and releases what runs on them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path

import pytest

from forge_nb.system.hosts import cluster as clusters
from forge_nb.system.processes.procs import pid_alive
from forge_nb.system.runtime import registry, spawning
from tests.actors_for_tests import Worker
from tests.waiting import waiter

pytestmark = pytest.mark.timeout(240)

FAST = dict(restart_backoff=0.1, route_wait_timeout=60.0)
_until = waiter(timeout=60.0, interval=0.1)


def _worker_of(sid: int) -> bool:
    """Is ``sid`` a ProcessJob host's worker (monarch's ``run_worker_loop_forever``)?"""
    return b"run_worker_loop_forever" in Path(f"/proc/{sid}/cmdline").read_bytes()


@pytest.fixture
async def job(runtime, tmp_path):
    from monarch.job import ProcessJob

    cluster = await clusters.use_job(ProcessJob({"trainer": 1, "generators": 2}), log_dir=tmp_path)
    workers = [os.getsid(h.probe_pid) for h in cluster.hosts]  # each host's worker leads the host's session
    try:
        yield cluster
    finally:
        try:
            await registry.stop_all(timeout=10)
        finally:
            await clusters.release_job()
        assert clusters.current() is None
        assert await _until(lambda: not any(pid_alive(p) for p in workers)), "the job's workers live on"


async def test_replicas_spread_over_the_job_s_hosts_and_run_under_their_workers(runtime, job):
    assert [h.name for h in job.hosts] == ["trainer[0]", "generators[0]", "generators[1]"]
    assert all(h.local and h.lost is None and h.gpus == spawning.visible_gpus() for h in job.hosts)
    gens = await Worker.options(num_replicas=2, hosts="generators", **FAST).as_service()
    anywhere = await Worker.options(num_replicas=3, **FAST).as_service()
    try:
        assert sorted(r.mesh.host for r in gens.replicas) == ["generators[0]", "generators[1]"]
        assert sorted(r.mesh.host for r in anywhere.replicas) == ["generators[0]", "generators[1]", "trainer[0]"]
        for svc in (gens, anywhere):
            for replica, (host, pid, sid) in zip(svc.replicas, await svc.where.fanout(), strict=True):
                assert host == replica.mesh.host and pid == replica.mesh.pids[0]
                assert _worker_of(sid) and sid != os.getpid()  # a child of the host's worker, not the kernel's
        sessions = {host: sid for host, _, sid in await anywhere.where.fanout()}
        assert len(set(sessions.values())) == 3  # three hosts, three workers
        with pytest.raises(ValueError, match=r"Worker: hosts='gpus' is not a host mesh of the job; it has \["):
            await Worker.options(hosts="gpus").as_service()
    finally:
        await gens.shutdown()
        await anywhere.shutdown()


async def test_a_host_that_dies_takes_its_replicas_and_they_respawn_on_the_hosts_left(runtime, job):
    gens = await Worker.options(num_replicas=2, hosts="generators", **FAST).as_service()
    try:
        where = {host: sid for host, _, sid in await gens.where.fanout()}
        requests = [asyncio.ensure_future(gens.work.route(i, 0.3)) for i in range(30)]
        await asyncio.sleep(0.5)
        os.kill(where["generators[1]"], signal.SIGKILL)  # the host's worker, and so the host, dies
        answers = await asyncio.gather(*requests)  # each answered, by a replica on the host left if need be
        assert len(answers) == 30
        assert await _until(lambda: job.host("generators[1]").lost is not None), "the probe did not notice"
        assert job.host("generators[1]").lost.startswith("its probe")
        assert await _until(lambda: all(r.state == "healthy" for r in gens.replicas)), [r.state for r in gens.replicas]
        assert [r.mesh.host for r in gens.replicas] == ["generators[0]", "generators[0]"]
        assert sum(r.restarts for r in gens.replicas) == 1
        assert {host for host, _, _ in await gens.where.fanout()} == {"generators[0]"}
        more = await spawning.spawn_mesh("more", hosts="generators")  # placement passes over the lost host
        assert more.host == "generators[0]"
    finally:
        await gens.shutdown()



def test_placement_spreads_a_service_counts_gpus_per_host_and_says_why_no_host_fits():
    hosts = [clusters.Host(name=f"g[{i}]", group="g", mesh=None, gpus=2) for i in range(2)]
    job = clusters.Cluster(None, [*hosts, clusters.Host(name="t[0]", group="t", mesh=None, gpus=1)])
    running = [("g[0]", "svc", [0]), ("g[0]", "other", [])]
    assert job.place("a", group=None, procs=1, with_gpus=False, owner="svc", meshes=running).name == "g[1]"
    assert job.place("a", group=None, procs=1, with_gpus=False, owner="x", meshes=running).name == "g[1]"
    assert job.place("a", group="g", procs=2, with_gpus=True, owner="x", meshes=running).name == "g[1]"
    assert job.gpu_ids(hosts[0], 1, running) == [1]
    hosts[1].lost = "its probe failed"
    why = r"g\[0\] has 1 of 2 GPUs free; g\[1\] is lost \(its probe failed\)"
    with pytest.raises(clusters.ResourceError, match=why):
        job.place("a", group="g", procs=2, with_gpus=True, owner="x", meshes=running)
    with pytest.raises(clusters.ResourceError, match=r"asks for 4 GPU\(s\) but the job's live hosts have 2 free"):
        job.check_gpus(4, "svc", running)


async def test_a_run_trains_across_hosts_fetches_a_version_once_per_host_and_outlives_a_host(runtime, job, tmp_path):
    """Trainer on one host, three generator replicas on two others (two share a host): steps train, and each
    version reaches the generators' hosts once per host (the trainer's stream), shared there in shared memory."""
    import socket

    import forge_nb
    from forge_nb import weights
    from forge_nb.config import GeneratorConfig, TrainerConfig
    from tests.controller.conftest import light_config
    from tests.light_actors import LightGenerator, LightTrainer

    cfg = light_config(str(tmp_path), "across", generator=GeneratorConfig(num_replicas=3, hosts="generators"),
                       trainer=TrainerConfig(optimizer={"lr": 0.1}, loss="grpo", loss_config={"beta": 0.0},
                                             hosts="trainer"))
    run = await forge_nb.spawn(cfg, progress=False, actors={"policy": LightGenerator, "trainer": LightTrainer})
    try:
        assert run.trainer.replicas[0].mesh.host == "trainer[0]"
        placed = [r.mesh.host for r in run.policy.replicas]
        assert sorted(placed) == ["generators[0]", "generators[0]", "generators[1]"]
        rows = await run.step(3)
        assert [r["step"] for r in rows] == [1, 2, 3] and all(r["reward/mean"] >= 0 for r in rows)
        version = run.version
        assert version >= 3 and await run.policy.get_version.fanout() == [version] * 3
        root, ns = weights.shm_root(), run.weights_namespace
        copies = {}
        for host in ("generators_0_", "generators_1_"):  # the host ids, made file-name safe
            made = list(root.glob(f"*-{ns}.v{version}@{host}_{socket.gethostname()}.json"))
            assert len(made) == 1, (host, sorted(p.name for p in root.iterdir()))  # one copy per host ...
            copy = json.loads(made[0].read_text())
            assert copy["via"] == "stream", copy["via"]  # ... pulled through the trainer's TCP stream
            copies[host] = copy["fetched_by"]
        pids = {h: [r.mesh.pids[0] for r in run.policy.replicas if r.mesh.host == h] for h in set(placed)}
        assert copies["generators_0_"] in pids["generators[0]"]  # ... made by one of that host's replicas
        assert copies["generators_1_"] in pids["generators[1]"]
        assert not list(root.glob(f"*-{ns}.v{version}@trainer*"))  # the trainer's host reads its own file

        # a generators' host dies mid-run: its replica respawns on the other, training goes on, nothing is lost
        os.kill(os.getsid(pids["generators[1]"][0]), signal.SIGKILL)  # the host's worker leads its session
        rows = await run.step(4)
        assert [r["step"] for r in rows] == [4, 5, 6, 7]
        assert await _until(lambda: all(r.healthy for r in run.policy.replicas)), run.policy.status()
        assert [r.mesh.host for r in run.policy.replicas] == ["generators[0]"] * 3
        assert job.host("generators[1]").lost is not None
        assert run.ledger()["balanced"], run.ledger()
        assert await run.policy.get_version.fanout() == [run.version] * 3
    finally:
        await run.shutdown()


async def test_weights_reach_other_hosts_by_stream_or_torchstore_and_a_writer_dying_mid_stream_leaves_nothing(
        runtime, job, monkeypatch):
    """A writer on one host, readers on the two others (shm+stream, forge_nb.weights.stream): a version comes
    through the writer's TCP stream bit for bit; refused (as by a firewall), through torchstore; the writer
    killed mid-stream, a clear error and no partial file, mapping or leftover in shared memory."""
    import shutil
    import uuid

    from forge_nb import weights
    from tests.store_actors import HostReader, StreamWriter, digests, stream_state

    shm = Path("/dev/shm") / f"forge_nb-test-{uuid.uuid4().hex[:8]}"  # tmpfs, as in a run
    env = {"FORGE_NB_SHM_DIR": str(shm)}
    monkeypatch.setenv("FORGE_NB_SHM_DIR", str(shm))
    await weights.initialize_store()
    try:
        writer_mesh = await spawning.spawn_mesh("writer", hosts="trainer", env=env)
        reader_meshes = [await spawning.spawn_mesh("reader", hosts="generators", env=env) for _ in range(2)]
        assert sorted(m.host for m in reader_meshes) == ["generators[0]", "generators[1]"]
        writer = writer_mesh.spawn("writer", StreamWriter)
        near, far = (m.spawn("reader", HostReader) for m in reader_meshes)

        pushed = await writer.push.call_one(1, seed=1)
        assert pushed["stream"]["addr"] == "127.0.0.1" and pushed["publisher"]  # one machine: loopback
        got, via = await near.digests.call_one(1)
        assert got == digests(stream_state(1)) and via == "stream"

        await writer.push.call_one(2, seed=2)
        await writer.stop_serving.call_one()  # the stream is refused from now on
        got, via = await far.digests.call_one(2)
        assert got == digests(stream_state(2))
        port = pushed["stream"]["port"]
        assert via.startswith(f"torchstore (its stream at 127.0.0.1:{port} could not be reached (ConnectionRefused")
        assert await weights.drop_version(2) > 1  # the manifest, and the tensors its Publisher put for the reader
        assert await weights.stored_versions() == [1]

        # the writer serves again (a push starts a server), and is stopped mid-stream; again if the stream
        # was done by then
        victim_pid, reader_pid = writer_mesh.pids[0], reader_meshes[0].pids[0]
        for version in (3, 4, 5):
            await writer.push.call_one(version, seed=version, mb=128)
            reading = asyncio.ensure_future(near.digests.call_one(version))
            while not list(shm.glob(f"{reader_pid}-policy.v{version}@*.tmp")):  # the reader has the header
                assert not reading.done(), reading.exception() or "the reader copied nothing"
                await asyncio.sleep(0.001)
            os.kill(victim_pid, signal.SIGSTOP)
            await asyncio.sleep(0.5)
            if not reading.done():
                break
            os.kill(victim_pid, signal.SIGCONT)
        else:
            pytest.fail("three streams of 128 MiB were done before the writer could be stopped")
        os.kill(victim_pid, signal.SIGKILL)
        broken = rf"stream of .*policy\.v{version}\.bin (ended|broke) after \d+ of \d+ bytes"
        with pytest.raises(Exception, match=broken):
            await reading
        assert await near.leftovers.call_one(version) == ([], [])  # no partial file, and none mapped
        assert weights.remove_orphaned_shm()  # the dead writer's files go as every dead writer's do
        assert not list(shm.glob(f"{victim_pid}-*")) and not list(shm.glob("*.tmp"))
        assert await weights.drop_version(version) >= 1
    finally:
        await weights.shutdown_store()  # while its volume runs: every version dropped, spares and locks removed
        await registry.stop_all(timeout=10)
        weights.remove_orphaned_shm()
        left = sorted(p.name for p in shm.iterdir()) if shm.exists() else []
        shutil.rmtree(shm, ignore_errors=True)
    assert left == [], left  # every process's copies, spares and the hosts' lock files are gone


async def test_a_host_s_probe_ends_that_host_s_processes_and_no_other(runtime, job):
    """How a mesh on a host whose pids the kernel cannot signal is cleaned up: the host's probe kills them."""
    mesh = await spawning.spawn_mesh("far", procs=2, hosts="generators")
    try:
        other = [h for h in job.hosts if h.group == "generators" and h.name != mesh.host][0]
        assert await clusters.end_on(other.name, mesh.pids) == []  # not that host's processes
        assert await clusters.end_on(mesh.host, [os.getpid(), *mesh.pids]) == sorted(mesh.pids)  # never the kernel
        assert not any(pid_alive(p) for p in mesh.pids)
        assert await clusters.end_on("kernel", [os.getpid()]) == []
    finally:
        await mesh.stop()


KERNEL_AFTER_A_HOST_DIED = """
import asyncio, os, signal, sys, tempfile
import forge_nb
from forge_nb.system.hosts import cluster
from forge_nb.system.runtime import lifecycle
lifecycle.ensure_started()  # before monarch is imported, as %load_ext forge_nb does in a kernel
from forge_nb.config import GeneratorConfig
from monarch.job import ProcessJob
from tests.controller.conftest import light_config
from tests.light_actors import LightGenerator, LightTrainer

async def main():
    job = await cluster.use_job(ProcessJob({"generators": 2}))
    cfg = light_config(tempfile.mkdtemp(), "orphaned", generator=GeneratorConfig(num_replicas=2, hosts="generators"))
    run = await forge_nb.spawn(cfg, progress=False, actors={"policy": LightGenerator, "trainer": LightTrainer})
    await run.step(2)
    victim = [r for r in run.policy.replicas if r.mesh.host == "generators[1]"][0]
    os.kill(os.getsid(victim.mesh.pids[0]), signal.SIGKILL)
    await run.step(2)
    await run.shutdown()
    await asyncio.sleep(40)  # monarch gives up on what was queued to the dead host after its delivery timeout
    await cluster.release_job()
    print("the kernel outlived the dead host", flush=True)
    lifecycle.end_process(0)

asyncio.run(main())
"""


@pytest.mark.timeout(300)
def test_the_kernel_outlives_what_was_queued_to_a_dead_host(tmp_path):
    """monarch returns the messages queued to a dead host once its delivery timeout passes, and a process handed
    back an undeliverable message exits: with the default 30 s a kernel died 30 s after a ProcessJob host did
    (the whole test suite with it). forge_nb sets the timeout far beyond a session (lifecycle.MONARCH_ENV_DEFAULTS)."""
    import subprocess
    import sys

    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    env.pop("HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT", None)  # forge_nb's default, as in a kernel
    done = subprocess.run([sys.executable, "-c", KERNEL_AFTER_A_HOST_DIED], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=280)
    assert done.returncode == 0 and "the kernel outlived the dead host" in done.stdout, done.stderr[-3000:]
