"""What killed processes leave in /dev/shm and /tmp is found by who still uses it, and removed."""

from __future__ import annotations

import contextlib
import mmap
import os
import signal
import subprocess
import sys
import time
import uuid

import pytest

from forge_nb.system.processes.leftovers import SHM, engine_patterns, orphaned, remove_leftovers
from forge_nb.system.processes.procs import group_members, kill_groups, pid_alive, started, weight_files_root


def test_a_segment_nobody_maps_is_removed_one_in_use_stays():
    free, mapped = SHM / f"psm_test{uuid.uuid4().hex[:8]}", SHM / f"psm_test{uuid.uuid4().hex[:8]}"
    for path in (free, mapped):
        path.write_bytes(b"\0" * 4096)
    # another live process maps one of them, as an engine maps its ring buffer
    holder = subprocess.Popen([sys.executable, "-c", "import mmap,sys,time\n"
                               f"f=open({str(mapped)!r},'r+b'); m=mmap.mmap(f.fileno(),0); f.close()\n"
                               "print('mapped', flush=True); time.sleep(60)"], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "mapped"
        found = orphaned(engine_patterns(), min_age_s=0)
        assert free in found and mapped not in found
        with open(free, "r+b") as f, mmap.mmap(f.fileno(), 0):  # this process maps it too: in use
            assert free not in orphaned(engine_patterns(), min_age_s=0)
        assert free not in orphaned(engine_patterns(), min_age_s=3600)  # too young to be taken
        removed = remove_leftovers(min_age_s=0)
        assert removed["engine files"] >= 1 and not free.exists() and mapped.exists()
    finally:
        holder.kill()
        holder.wait()
        for path in (free, mapped):
            path.unlink(missing_ok=True)


def test_a_file_held_open_is_in_use(tmp_path):
    path = f"{SHM}/psm_test{uuid.uuid4().hex}"
    fd = os.open(path, os.O_CREAT | os.O_RDWR)
    try:
        assert path not in map(str, orphaned(engine_patterns(), min_age_s=0))
    finally:
        os.close(fd)
    assert path in map(str, orphaned(engine_patterns(), min_age_s=0))
    os.unlink(path)


def test_a_rendezvous_file_in_the_machine_s_temporary_folder_is_left_to_its_owner():
    """A ``vllm_dist_*`` file in /tmp, an hour old and open in no process, is no run's of this kernel (its own
    engines make theirs in their generators' folders): it may be another kernel's engine that is starting, so
    the clean-up leaves it, whatever its age."""
    import tempfile

    path = f"{tempfile.gettempdir()}/vllm_dist_test{uuid.uuid4().hex}"
    with open(path, "w"):
        pass
    an_hour_ago = time.time() - 3600
    os.utime(path, (an_hour_ago, an_hour_ago))
    try:
        remove_leftovers(min_age_s=0)
        assert os.path.exists(path)
    finally:
        os.unlink(path)


@contextlib.contextmanager
def semaphore_maker():
    """A process in its own group holding a multiprocessing lock (spawn context: a named semaphore that its
    resource tracker, started in the same group, unlinks at the end) -> (the process, the semaphore's file).
    Whatever is left of the group and the file goes afterwards."""
    maker = subprocess.Popen([sys.executable, "-c", "import multiprocessing as mp, time\n"
                              "lock = mp.get_context('spawn').Lock()\n"
                              "print(lock._semlock.name, flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    path = None
    try:
        path = SHM / f"sem.{maker.stdout.readline().strip().lstrip('/')}"
        yield maker, path
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(maker.pid, signal.SIGKILL)
        maker.wait()
        if path is not None:
            path.unlink(missing_ok=True)


@pytest.mark.parametrize("killer", ["kill_groups", "SIGKILL"])
def test_a_named_semaphore_is_in_use_while_its_maker_lives_and_removed_after(killer):
    """multiprocessing's named semaphores: sem_open maps a temporary file before naming it, so only the inode
    says the maker still uses it. Killed with its resource tracker (one group), the maker leaves it behind:
    forge_nb's kill_groups removes it, and after any other kill the leftovers' clean-up does."""
    with semaphore_maker() as (maker, path):
        assert path.exists()
        assert path not in orphaned(engine_patterns(), min_age_s=0)
        if killer == "kill_groups":
            kill_groups([maker.pid])
            maker.wait()
        else:
            os.killpg(maker.pid, signal.SIGKILL)
            maker.wait()
            time.sleep(0.2)  # the tracker, in the same group, dies too
            assert path.exists() and path in orphaned(engine_patterns(), min_age_s=0)
            remove_leftovers(min_age_s=0)
        assert not path.exists()


def test_kill_groups_lets_a_dead_maker_s_resource_tracker_unlink_its_semaphore():
    """A killed kernel's procs die by PDEATHSIG before the reaper looks: then only the proc's resource
    tracker (in the proc's group) knows its semaphores, and a kill of the whole group took the tracker
    along before it could unlink them (a fresh-clone CI run found one left). The group is stopped here
    first, as the reaper stops it, so the tracker cannot have cleaned up before kill_groups runs."""
    with semaphore_maker() as (maker, path):
        tracker = [p for p in group_members([maker.pid]) if p != maker.pid]
        assert path.exists() and len(tracker) == 1
        os.killpg(maker.pid, signal.SIGSTOP)
        maker.kill()  # the proc dies alone; its tracker, stopped, is left in the group
        maker.wait()
        assert path.exists() and pid_alive(tracker[0])
        # a loaded machine (the suite beside other work) can need more than the reaper's 2 s for the tracker to
        # wake and unlink: what is tested is that it is let go on first, not how fast it is
        assert kill_groups([maker.pid], tracker_wait_s=20.0) == tracker
        deadline = time.monotonic() + 5
        while pid_alive(tracker[0]) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not pid_alive(tracker[0])
        assert not path.exists(), "the tracker was killed before it could unlink the semaphore"


# A stand-in for a kernel: it starts a process in its own group (as monarch starts a proc) that creates a
# shared-memory segment (as a vLLM engine does), leaves a socket folder and weight file named by that
# process and by itself, starts forge_nb's reaper on the group, and waits to be killed.
KERNEL = """
import os, subprocess, sys, time
from forge_nb.system.processes.procs import SOCKETS_ROOT, start_reaper, weight_files_root
proc = subprocess.Popen([sys.executable, "-c", "from multiprocessing import shared_memory; import time\\n"
                         "m = shared_memory.SharedMemory(create=True, size=4096)\\n"
                         "print(m.name, flush=True); time.sleep(120)"], stdout=subprocess.PIPE, text=True,
                        start_new_session=True)
segment = proc.stdout.readline().strip()
for pid in (proc.pid, os.getpid()):
    (SOCKETS_ROOT / str(pid)).mkdir(parents=True)
    weight_files_root().mkdir(parents=True, exist_ok=True)
    (weight_files_root() / f"{pid}-forge_nb.v1.bin").write_bytes(b"0")
os.close(0)  # as a kernel started without stdin (under a CI runner, nohup): the next fd opened is 0
start_reaper([proc.pid], period=float(sys.argv[1]))
print(proc.pid, segment, flush=True)
time.sleep(120)
"""


@pytest.mark.parametrize("period", [0.1, 600.0])
def test_a_killed_kernel_s_reaper_removes_what_its_procs_left(tmp_path, period):
    """The reaper kills the procs' groups once the kernel is gone and removes their segments, socket folders
    and weight files; a segment another live process maps, and a live process's folder, stay. It learns of
    the kernel's end when its pipe ends, not at its next round (600 s: the test waits 30)."""
    env = {**os.environ, "TMPDIR": str(tmp_path), "FORGE_NB_SHM_DIR": str(tmp_path / "shm")}
    kernel = subprocess.Popen([sys.executable, "-c", KERNEL, str(period)], env=env, stdout=subprocess.PIPE, text=True)
    sockets, weights = tmp_path / "forge_nb-vllm", tmp_path / "shm"
    try:
        leader, segment = kernel.stdout.readline().split()
        leader = int(leader)
        (sockets / str(os.getpid())).mkdir()  # a live process's: stays
        assert (SHM / segment).exists() and pid_alive(leader)
        kernel.kill()
        kernel.wait()
        deadline = time.monotonic() + 30
        while (pid_alive(leader) or (SHM / segment).exists() or len(list(weights.iterdir())) > 0) \
                and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not pid_alive(leader), "the reaper did not kill the proc's group"
        assert not (SHM / segment).exists(), "the proc's segment is left"
        assert sorted(p.name for p in sockets.iterdir()) == [str(os.getpid())]
        assert list(weights.iterdir()) == []
    finally:
        kernel.kill()
        with contextlib.suppress(ProcessLookupError, UnboundLocalError, TypeError):
            os.killpg(leader, signal.SIGKILL)


def test_kill_groups_removes_the_segments_only_the_group_used():
    mine = SHM / f"psm_test{uuid.uuid4().hex[:8]}"
    shared = SHM / f"psm_test{uuid.uuid4().hex[:8]}"
    for path in (mine, shared):
        path.write_bytes(b"\0" * 4096)
    group = subprocess.Popen([sys.executable, "-c", "import mmap,sys,time\n"
                              f"fs=[open(p,'r+b') for p in ({str(mine)!r},{str(shared)!r})]\n"
                              "ms=[mmap.mmap(f.fileno(),0) for f in fs]\n"
                              "print('mapped', flush=True); time.sleep(60)"],
                             stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert group.stdout.readline().strip() == "mapped"
        with open(shared, "r+b") as f, mmap.mmap(f.fileno(), 0):  # this process maps one of them too
            assert kill_groups([group.pid]) == [group.pid]
            assert group.wait(timeout=10) == -signal.SIGKILL
            assert not mine.exists() and shared.exists()
    finally:
        group.kill()
        for path in (mine, shared):
            path.unlink(missing_ok=True)


def test_the_reaper_reads_the_same_weight_folder_as_the_weights(monkeypatch, tmp_path):
    from forge_nb.weights.shm import shm_root

    assert weight_files_root() == shm_root()
    monkeypatch.setenv("FORGE_NB_SHM_DIR", str(tmp_path))
    assert weight_files_root() == shm_root() == tmp_path


def test_kill_groups_spares_a_group_whose_pid_now_names_another_process():
    """A mesh stopped long after its proc died must not kill whoever got the proc's pid since (pid_max is
    32768 here; the suite once lost its own browser so). A recorded start that is not the process's own
    stands for the proc that had the pid before."""
    other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        start = started(other.pid)
        assert start is not None
        assert kill_groups([other.pid], {other.pid: start - 1}) == []  # "our" leader started earlier: not it
        time.sleep(0.2)
        assert pid_alive(other.pid)
        assert kill_groups([other.pid], {other.pid: start}) == [other.pid]  # the leader we recorded: killed
        assert other.wait(timeout=10) == -signal.SIGKILL
    finally:
        other.kill()


# A stand-in for a kernel whose mesh proc died long ago: the group id it recorded now names another
# process group (here: a process it starts in its own session, given an earlier start than its own).
REUSED = """
import subprocess, sys, time
from forge_nb.system.processes.procs import start_reaper, started
other = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], start_new_session=True)
reaper = start_reaper([other.pid], period=0.1, leaders={other.pid: started(other.pid) - 1})
print(other.pid, reaper.pid, flush=True)
time.sleep(120)
"""


def _state(pid: int) -> str:
    return next(line.split()[1] for line in open(f"/proc/{pid}/status") if line.startswith("State:"))


def test_a_killed_kernel_s_reaper_spares_a_group_whose_pid_now_names_another_process():
    """The reaper neither stops nor kills a group whose leader's pid was reused since the proc it watched
    died (the suite once saw its browser stopped or killed so when a test's kernel died)."""
    kernel = subprocess.Popen([sys.executable, "-c", REUSED], stdout=subprocess.PIPE, text=True)
    other = reaper = None
    try:
        other, reaper = map(int, kernel.stdout.readline().split())
        kernel.kill()
        kernel.wait()
        deadline = time.monotonic() + 30
        while pid_alive(reaper) and time.monotonic() < deadline:  # it reaps, then ends
            time.sleep(0.1)
        assert not pid_alive(reaper), "the reaper did not end once the kernel was gone"
        assert pid_alive(other) and _state(other) != "T", "the reaper hit a group that is no longer its own"
    finally:
        kernel.kill()
        for pid in (other, reaper):
            if pid:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pid, signal.SIGKILL)
