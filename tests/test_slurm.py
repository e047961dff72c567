"""The notebook on a real SLURM (tests/slurm_cluster.py: munge, slurmctld and three slurmd on this machine,
Debian's SLURM 22.05): %forge_cluster slurm allocates nodes through monarch's SlurmJob, the quickstart's
services (a vLLM generator, the trainer) train there with weights crossing nodes, a kernel that dies leaves
the allocation and a fresh kernel resumes on it, a node that dies has its replica respawn on another, a job
SLURM cancels stops the run with an error that names the job, and %forge_shutdown gives the nodes back.

One test, in the order a user meets these, because each step needs the one before (and vLLM engines are the
suite's heavy cases): two real IPython kernels, real daemons, real workers."""

from __future__ import annotations

import json
import os
import re
import signal

import psutil
import pytest

from forge_nb.system.hosts.slurm import _normalized, job_info, settled_job_info, why_ended
from tests import slurm_cluster
from tests.kernel_client import Kernel, Reply
from tests.waiting import until_sync

pytestmark = pytest.mark.timeout(600)

SETUP = """%load_ext forge_nb
import json, os
import psutil
import forge_nb
from forge_nb import weights
from forge_nb.system.hosts import cluster
from forge_nb.widgets import Dashboard"""


@pytest.fixture(scope="session")
def slurm(tmp_path_factory):
    try:
        started = slurm_cluster.start(tmp_path_factory.mktemp("slurm"))
    except slurm_cluster.Unavailable as e:
        pytest.skip(f"SLURM cannot start here: {e}")
    yield started
    started.stop()


def ok(out: Reply) -> Reply:
    assert out.status == "ok", f"{out.traceback}\n{out.streams[-3000:]}"
    return out


def value(kernel: Kernel, expression: str):
    return json.loads(ok(kernel.run(f"print(json.dumps({expression}))", timeout=120)).stdout)


def left_behind(pids: list[int]) -> list[str]:
    """What still runs of ``pids`` and of SLURM's job steps (slurmstepd) on this machine."""
    alive = [p for p in psutil.process_iter(["pid", "name", "cmdline"]) if p.info["pid"] in pids
             or (p.info["name"] or "").startswith("slurmstepd")]
    return [f"{p.info['pid']} {' '.join(p.info['cmdline'] or [])[:80]}" for p in alive if p.is_running()
            and p.status() != psutil.STATUS_ZOMBIE]


def test_squeue_json_of_old_and_new_slurm_reads_the_same():
    """SLURM 22.05 (a state string, allocated_nodes) and 23.02+ (a state list, nodes.allocation) alike."""
    old = {"job_id": 7, "job_state": "RUNNING", "job_resources": {
        "nodes": "n[1-2]", "allocated_nodes": [{"nodename": "n1"}, {"nodename": "n2"}]}}
    new = {"job_id": 7, "job_state": ["RUNNING"], "job_resources": {
        "nodes": {"allocation": [{"name": "n1"}, {"name": "n2"}]}}}
    for job in (old, new):
        read = _normalized(job)
        assert read["job_state"] == ["RUNNING"]
        assert [n["name"] for n in read["job_resources"]["nodes"]["allocation"]] == ["n1", "n2"]


def test_a_job_ended_says_why_and_not_that_it_is_still_completing():
    """A job that is COMPLETING beside a reason has ended for that reason; COMPLETING alone is said as such."""
    assert why_ended(["RUNNING"]) is None and why_ended([]) is None
    assert why_ended(["CANCELLED", "COMPLETING"]) == "CANCELLED"
    assert why_ended(["COMPLETING"]) == "COMPLETING"  # finishing with no other reason (its script returned)
    assert why_ended(["NODE_FAIL", "TIMEOUT"]) == "NODE_FAIL, TIMEOUT"


@pytest.mark.parametrize("ignore_term", [False, True], ids=["plain", "ignores-SIGTERM"])
def test_a_cancelled_job_is_said_to_be_cancelled_at_once(slurm, monkeypatch, tmp_path, ignore_term):
    """Right after ``scancel`` SLURM shows the job as COMPLETING alone until its processes are gone (for a job
    that ignores SIGTERM, KillWait: 5 s here); what forge_nb reads says CANCELLED."""
    for name, setting in slurm.env.items():
        monkeypatch.setenv(name, setting)
    started = tmp_path / "started"
    script = ("trap '' TERM; " if ignore_term else "") + f"touch {started}; sleep 300"  # sleep inherits the trap
    job_id = slurm.run("sbatch", "--parsable", "--nodes", "1", "--output", "/dev/null",  # no slurm-N.out here
                       "--wrap", script).strip().split(";")[0]
    try:
        assert until_sync(started.exists, timeout=60), slurm.jobs()  # running its script, not being launched
    finally:
        slurm.run("scancel", job_id)
    if ignore_term:
        assert job_info(job_id)["job_state"] == ["COMPLETING"]
    assert why_ended(settled_job_info(job_id)["job_state"]) == "CANCELLED"
    assert until_sync(lambda: not slurm.jobs(), timeout=60), slurm.jobs()  # gone before the next test asks


def test_quickstart_on_three_slurm_nodes_outlives_its_kernel_a_node_and_ends_with_its_job(slurm, tmp_path):
    save, runs = tmp_path / "job.pkl", tmp_path / "runs"
    first = Kernel(cwd=str(tmp_path), env=slurm.env)
    workers: list[int] = []
    try:
        ok(first.run(SETUP))
        for asked, says in (("--nodes 4", r"SLURM job \d+ can never start \((PartitionConfig|PartitionNodeLimit): "
                                          r"[^;]+\); it was cancelled"),
                            ("--nodes 1 --partition gpu", r"sbatch refused the job \(1 node\(s\), partition gpu\): "
                                                          "sbatch: error: invalid partition specified: gpu; [^\n]+")):
            refused = first.run(f"%forge_cluster slurm {asked}", timeout=60)  # a clear error, not a wait forever
            assert refused.status == "error", refused
            assert re.search(f"UsageError: {says}. `sinfo` lists the partitions and their nodes", refused.stderr), \
                refused
        assert slurm.jobs() == [] and value(first, "cluster.current() is None")
        out = ok(first.run(f"%forge_cluster slurm --nodes trainer=1 generators=2 --save {save}", timeout=120))
        job_id = value(first, "cluster.current().job.job_id")
        assert f"SLURM job {job_id} (RUNNING) on 127.0.0.11, 127.0.0.12, 127.0.0.13" in out.stdout
        assert out.stderr == "", out.stderr  # monarch's job messages go to the log folder
        assert [line.split()[:2] for line in slurm.jobs()] == [[job_id, "RUNNING"]]
        workers = value(first, "[psutil.Process(h.probe_pid).ppid() for h in cluster.current().hosts]")
        assert all("forge_nb.system.hosts.slurm_worker" in " ".join(psutil.Process(w).cmdline()) for w in workers)

        ok(first.run(f"%forge_spawn quickstart --set name=onslurm run_dir={runs} loop.checkpoint_every=5 "
                     "trainer.hosts=trainer generator.hosts=generators", timeout=300))
        ok(first.run("await run.policy.started()", timeout=300))  # the spawn came back once the trainer was up
        hosts = value(first, "{s: [r.mesh.host for r in getattr(run, s).replicas] for s in ('policy', 'trainer')}")
        assert hosts["trainer"] == ["trainer[0]"] and hosts["policy"][0].startswith("generators[")  # weights cross
        ok(first.run("%forge_step 10", timeout=300))
        assert value(first, "run.current_step") == 10
        via = value(first, "sorted({json.load(open(p))['via'] for p in weights.shm_root().glob("
                           "f'*-{run.weights_namespace}.v*@*.json')})")
        assert via == ["stream"], via  # the generator's node pulled each version from the trainer's stream
        shown = ok(first.run("%forge_status")).text
        assert f"SLURM job {job_id}: RUNNING" in shown and hosts["policy"][0] in shown
        page = value(first, "Dashboard(run, start=False).to_html()")
        assert f"data-job='{job_id}' data-job-state='RUNNING'" in page  # the dashboard names the job too
        run_dir = value(first, "str(run.dir.path)")
        os.kill(first.pid, signal.SIGKILL)  # the kernel dies; the allocation and what runs on it stay
        assert [line.split()[:2] for line in slurm.jobs()] == [[job_id, "RUNNING"]]
    finally:
        first.shutdown(now=True)

    second = Kernel(cwd=str(tmp_path), env=slurm.env)
    try:
        ok(second.run(SETUP))
        out = ok(second.run(f"%forge_attach {run_dir}", timeout=300))  # back on the job's nodes
        ok(second.run("await run.policy.started()", timeout=300))
        assert value(second, "cluster.current().job.job_id") == job_id
        assert value(second, "sorted({m.host for m in forge_nb.meshes()} - {'kernel'})") == \
            sorted(set(hosts["policy"] + hosts["trainer"]))
        assert value(second, "[r['step'] for r in await run.step(2)]") == [11, 12]

        # the generator's node dies, as SLURM sees it: the job goes on without it (--no-kill), the worker
        # there is killed, and the replica respawns on the other generators' node. (Not the trainer's: SLURM
        # runs the batch script on the job's first node, and that node's end is the job's, as on a cluster.)
        victim = hosts["policy"][0]
        node = value(second, f"cluster.current().described['nodes'][{1 + int(victim[-2])}]")
        worker = value(second, f"psutil.Process(cluster.current().host({victim!r}).probe_pid).ppid()")
        slurm.run("scontrol", "update", f"nodename={node}", "state=down", "reason=forge_nb test")
        assert until_sync(lambda: not psutil.pid_exists(worker), timeout=30), "SLURM left the node's worker"
        assert value(second, "[r['step'] for r in await run.step(3)]") == [13, 14, 15]
        lost = f"cluster.current().host({victim!r}).lost is not None"
        assert until_sync(lambda: value(second, lost), timeout=30)
        # its respawn elsewhere (the trainer samples meanwhile, when no generator serves)
        assert until_sync(lambda: value(second, "[r.healthy for r in run.policy.replicas]") == [True], timeout=120)
        moved = value(second, "run.policy.replicas[0].mesh.host")
        assert moved != victim and moved.startswith("generators[")
        left = slurm.run("scontrol", "show", "hostlist", ",".join(n for n in slurm_cluster.NODES if n != node))
        assert [line.split()[1:] for line in slurm.jobs()] == [["RUNNING", left.strip()]]  # two nodes go on
        assert value(second, "run.ledger()['balanced']")
        assert value(second, "await run.policy.get_version.fanout() == [run.version]")

        # SLURM ends the job under a running loop: the run stops with an error naming the job; the kernel lives
        ok(second.run("%forge_run"))
        slurm.run("scancel", job_id)
        assert until_sync(lambda: value(second, "run.state") == "failed", timeout=120), \
            value(second, "[run.state, run.error]")
        error = value(second, "run.error")
        assert f"SLURM job {job_id} ended (CANCELLED), and its hosts with it" in error, error
        # each replica gives up at the first respawn that learns the job ended, and says so, instead of trying
        # max_restarts times
        for service in ("policy", "trainer"):
            replicas = f"[(r.state, r.last_error) for r in run.{service}.replicas]"
            failed = until_sync(lambda r=replicas: value(second, r)[0][0] == "failed", timeout=60)
            assert failed, value(second, replicas)
            assert value(second, replicas)[0][1].startswith(f"SLURM job {job_id} ended"), value(second, replicas)
        shown = ok(second.run("%forge_status")).text
        assert f"job {job_id} ended" in shown, shown
        assert value(second, "1 + 1") == 2
        out = ok(second.run("%forge_shutdown", timeout=120)).stdout
        assert "released the job's 3 host(s)" in out
        assert until_sync(lambda: not slurm.jobs(), timeout=60), slurm.jobs()
        assert until_sync(lambda: not left_behind(workers), timeout=30), left_behind(workers)
    finally:
        second.shutdown(now=True)
        for pid in workers:
            if psutil.pid_exists(pid):
                os.kill(pid, signal.SIGKILL)
