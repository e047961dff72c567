"""The coder's sandbox contains model-written code: one test per escape the rlimit-only sandbox allowed.

Where it does no harm on the host, each probe also runs with ``isolation="none"`` (the old rlimit-only
path) and must escape there: that proves the probe would catch the escape.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import socket
import uuid
from pathlib import Path

import pytest

from forge_nb.actors import _sandbox
from forge_nb.actors.coder import SandboxedPythonCoder, check_isolation, run_sandboxed
from forge_nb.rundir import RunDir
from forge_nb.system.runtime import registry

pytestmark = [pytest.mark.timeout(120),
              pytest.mark.skipif(bool(_sandbox.missing_tools()), reason="needs bubblewrap: apt-get install bubblewrap")]


def _marker_pids(marker: str) -> list[int]:
    """Host pids of processes whose command line contains ``marker``."""
    pids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            with contextlib.suppress(OSError):
                if marker in Path(f"/proc/{entry}/cmdline").read_bytes().decode(errors="replace"):
                    pids.append(int(entry))
    return pids


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


async def _gone(pids: list[int], within_s: float = 5.0) -> bool:
    for _ in range(int(within_s * 20)):
        if not any(_alive(p) for p in pids):
            return True
        await asyncio.sleep(0.05)
    return False


def _kill(pids: list[int]) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _daemon(marker: str, setsid: bool = True) -> str:
    """Code that leaves a double-forked (optionally setsid'd) ``sleep`` behind, then returns."""
    return (f"import os\nif os.fork() == 0:\n    {'os.setsid()' if setsid else 'pass'}\n"
            f"    if os.fork() == 0:\n        os.execv('/usr/bin/sleep', ['sleep', '{marker}'])\n    os._exit(0)\n")


READ = "try:\n    print(open({path!r}).read())\nexcept OSError as e:\n    print('denied', e)"


@pytest.fixture
def secret_files(tmp_path: Path) -> dict[str, Path]:
    """Files that model code must never read: in $HOME, a Jupyter runtime dir, /dev/shm/forge_nb."""
    token = uuid.uuid4().hex
    made = {
        "home": Path.home() / f".forge-nb-probe-{token}",
        "kernel_home": Path.home() / ".local/share/jupyter/runtime" / f"kernel-probe-{token}.json",
        "kernel_tmp": tmp_path / "runtime" / f"kernel-probe-{token}.json",
        "weights": Path("/dev/shm/forge_nb") / f"probe-{token}" / "weights.bin",
    }
    for path in made.values():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"key": token[::-1]}))  # not the name: an error message quotes that
    yield made
    for path in made.values():
        path.unlink(missing_ok=True)
    made["weights"].parent.rmdir()


@pytest.mark.parametrize("which", ["home", "kernel_home", "kernel_tmp", "weights"])
async def test_secrets_outside_are_invisible(secret_files: dict[str, Path], which: str) -> None:
    path = str(secret_files[which])
    token = json.loads(secret_files[which].read_text())["key"]
    code = READ.format(path=path)
    assert token in (await run_sandboxed(code, isolation="none")).stdout  # the old sandbox read it
    contained = await run_sandboxed(code)
    assert token not in contained.stdout and "denied" in contained.stdout


async def test_root_and_ssh_do_not_exist_inside() -> None:
    code = "import os; print(os.path.exists('/root'), os.path.exists(os.path.expanduser('~/.ssh')), os.getuid())"
    contained = await run_sandboxed(code)
    assert contained.stdout.split() == ["False", "False", "65534"]


async def test_writing_a_run_directory_does_not_reach_it() -> None:
    run = RunDir.create({"probe": True}, name=f"sandbox-probe-{uuid.uuid4().hex[:8]}", base=None)
    target = run.path / "state.pt"
    code = f"import os; os.makedirs({str(run.path)!r}, exist_ok=True); open({str(target)!r}, 'wb').write(b'pwn')"
    try:
        await run_sandboxed(code, isolation="none")
        assert target.read_bytes() == b"pwn"  # the old sandbox wrote into the run directory
        target.unlink()
        contained = await run_sandboxed(code)
        assert not contained.timed_out and not target.exists()
    finally:
        shutil.rmtree(run.path)


async def test_dev_shm_and_tmp_are_capped_and_private() -> None:
    name = f"fill-{uuid.uuid4().hex}"
    code = ("import os\nfor d in ('/dev/shm', '/tmp'):\n    n = 0\n    try:\n"
            f"        with open(os.path.join(d, {name!r}), 'wb') as f:\n"
            "            for _ in range(1024):\n                f.write(b'x' * 2**20); f.flush(); n += 1\n"
            "    except OSError as e:\n        print(d, n, e.errno)\n    else:\n        print(d, n, 0)\n")
    result = await run_sandboxed(code, tmp_mb=16, memory_mb=256)
    lines = [line.split() for line in result.stdout.splitlines()]
    assert [line[0] for line in lines] == ["/dev/shm", "/tmp"], result
    assert all(int(n) <= 16 and int(errno) != 0 for _, n, errno in lines)  # stopped at the cap, not at 1 GiB
    assert not Path("/dev/shm", name).exists() and not Path("/tmp", name).exists()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


async def _connects(port: int, for_s: float) -> bool:
    for _ in range(int(for_s * 10)):
        with socket.socket() as s, contextlib.suppress(OSError):
            s.settimeout(0.2)
            s.connect(("127.0.0.1", port))
            return True
        await asyncio.sleep(0.1)
    return False


@pytest.mark.parametrize("isolation", ["none", "bwrap"])
async def test_listener_on_all_interfaces_is_unreachable(isolation: str) -> None:
    port = _free_port()
    code = (f"import socket, time\ns = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
            f"s.bind(('0.0.0.0', {port})); s.listen(); print('listening', flush=True); time.sleep(2.5)")
    run = asyncio.ensure_future(run_sandboxed(code, timeout_s=5, isolation=isolation))
    reached = await _connects(port, 2.0)
    assert "listening" in (await run).stdout
    assert reached == (isolation == "none")  # the old sandbox's listener answered the host


async def test_host_network_and_abstract_sockets_are_unreachable() -> None:
    name = f"forge-nb-probe-{uuid.uuid4().hex}"
    with socket.socket() as tcp, socket.socket(socket.AF_UNIX) as unix:
        tcp.bind(("127.0.0.1", 0))
        tcp.listen()
        unix.bind("\0" + name)  # monarch's sockets are abstract unix sockets like this one
        unix.listen()
        targets = ((socket.AF_INET, ("127.0.0.1", tcp.getsockname()[1])), (socket.AF_UNIX, "\0" + name))
        code = (f"import socket\nfor fam, addr in {[(int(f), a) for f, a in targets]!r}:\n"
                "    s = socket.socket(fam)\n    try:\n        s.connect(addr); print('reached')\n"
                "    except OSError as e:\n        print('blocked', e.errno)\n")
        assert (await run_sandboxed(code, isolation="none")).stdout.split().count("reached") == 2
        contained = await run_sandboxed(code)
    assert contained.stdout.split().count("blocked") == 2, contained


@pytest.mark.parametrize("setsid", [True, False])
async def test_daemonized_grandchild_dies_at_timeout(setsid: bool) -> None:
    marker = f"300.{uuid.uuid4().int % 10**9}"
    run = asyncio.ensure_future(run_sandboxed(_daemon(marker, setsid) + "import time; time.sleep(60)", timeout_s=2))
    pids: list[int] = []
    for _ in range(30):
        await asyncio.sleep(0.05)
        if pids := _marker_pids(marker):
            break
    result = await run
    try:
        assert pids and result.timed_out
        assert await _gone(pids)
    finally:
        _kill(pids)


async def test_grandchild_dies_when_the_code_returns_and_killpg_race_is_clean() -> None:
    marker = f"300.{uuid.uuid4().int % 10**9}"
    # The old path: the parent exits, a setsid'd grandchild keeps stdout open, and killpg finds no group
    # (it raised ProcessLookupError): now it returns timed_out, and the grandchild is left (killed here).
    old = await run_sandboxed(_daemon(marker), timeout_s=1, isolation="none")
    left = _marker_pids(marker)
    _kill(left)
    assert old.timed_out and left  # the escape the old sandbox allowed
    result = await run_sandboxed(_daemon(marker), timeout_s=5)
    assert (result.exit_code, result.timed_out) == (0, False)
    assert await _gone(_marker_pids(marker), within_s=2)


async def test_process_count_is_capped() -> None:
    code = ("import os, time\nn = 0\ntry:\n    for _ in range(200):\n        if os.fork() == 0:\n"
            "            time.sleep(5); os._exit(0)\n        n += 1\nexcept OSError as e:\n    print(n, e.errno)\n")
    result = await run_sandboxed(code, max_procs=10, timeout_s=10)
    forked, errno = map(int, result.stdout.split())
    assert forked < 10 and errno == 11  # EAGAIN at the cap, not 200 processes on the host


async def test_coder_actor_keeps_output_before_timeout_and_kills_on_shutdown(runtime) -> None:
    coder = await SandboxedPythonCoder.options(num_replicas=1).as_service(timeout_s=2.0)
    marker = f"300.{uuid.uuid4().int % 10**9}"
    pids: list[int] = []
    run: asyncio.Future | None = None
    try:
        partial = await coder.execute.route("import sys; print('partial'); sys.stderr.write('err-partial')\n"
                                            "while True: pass")
        assert (partial.stdout, partial.stderr, partial.timed_out) == ("partial\n", "err-partial", True)
        home = await coder.execute.route("import os; print(os.listdir('/'), os.getppid())")
        assert "root" not in home.stdout and "home" not in home.stdout and home.stdout.split()[-1] == "1"

        run = asyncio.ensure_future(coder.execute.route(_daemon(marker) + "import time; time.sleep(60)",
                                                        timeout_s=60.0))
        for _ in range(100):
            await asyncio.sleep(0.1)
            if pids := _marker_pids(marker):
                break
        assert pids
    finally:
        await coder.shutdown()
    try:
        assert await _gone(pids, within_s=10)  # shutdown ended the sandbox, daemon included
    finally:
        _kill(pids)
        if run is not None:
            run.cancel()
            with contextlib.suppress(BaseException):
                await run


async def test_without_bwrap_the_coder_refuses_and_none_warns(monkeypatch, runtime) -> None:
    with pytest.raises(ValueError, match="isolation='docker'"):
        check_isolation("docker")
    with pytest.warns(RuntimeWarning, match="isolation='none'"):
        coder = await SandboxedPythonCoder.as_service(isolation="none")
    try:
        assert (await coder.execute.route("print(1)")).stdout == "1\n"
    finally:
        await coder.shutdown()
    monkeypatch.setattr(_sandbox.shutil, "which", lambda name, path=None: None)  # a machine without bwrap
    with pytest.raises(RuntimeError, match="apt-get install -y bubblewrap"):
        await SandboxedPythonCoder.as_service()
    assert registry.meshes() == []
