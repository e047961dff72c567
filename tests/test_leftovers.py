"""What killed processes leave in /dev/shm and /tmp is found by who still uses it, and removed."""

from __future__ import annotations

import mmap
import os
import subprocess
import sys
import uuid

from forge_nb._leftovers import SHM, engine_patterns, orphaned, remove_leftovers


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
    import tempfile

    path = tempfile.gettempdir() + f"/vllm_dist_test{uuid.uuid4().hex}"
    fd = os.open(path, os.O_CREAT | os.O_RDWR)
    try:
        assert path not in map(str, orphaned(engine_patterns(), min_age_s=0))
    finally:
        os.close(fd)
    assert path in map(str, orphaned(engine_patterns(), min_age_s=0))
    os.unlink(path)
