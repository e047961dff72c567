"""The process sandbox behind SandboxedPythonCoder: bubblewrap namespaces plus rlimits, or rlimits alone.

``run_sandboxed(code, isolation="bwrap")`` runs ``python -I -u -c code`` under Debian's ``bwrap`` with new
user, pid, network, mount, IPC, UTS and cgroup namespaces (``--unshare-all``). What the code can see:

============================  ======================================================================
``/usr`` (and ``/bin``, ``/lib*``)  read-only
``/opt/python``               the interpreter's installation (``sys.base_prefix``), read-only
``/opt/venv``                 the venv's site-packages and a ``pyvenv.cfg``, read-only
``/tmp``, ``/dev/shm``        private tmpfs of ``tmp_mb`` MiB each, gone when the code ends
``/proc``, ``/dev``           the sandbox's own (its processes only; null, zero, urandom, tty)
============================  ======================================================================

Nothing else: no ``$HOME`` or ``/root`` (ssh keys, the Jupyter runtime dir and its kernel connection
files), no ``/etc``, no ``/dev/shm/forge_nb`` (weights), no run directories, no host network (a listener
on 0.0.0.0 is inside the sandbox's own loopback), no host abstract unix sockets (monarch's). Inside,
``prlimit`` caps address space (``memory_mb``), CPU seconds, file size, and processes plus threads
(``max_procs``, counted in the sandbox's own user namespace). When the wall clock runs out the outer
bwrap is killed; ``--die-with-parent`` then kills the sandbox's pid 1, and the kernel kills every process of
that pid namespace, ``setsid()``-ed or double-forked ones included. Output printed before that is returned.

Running as root (the usual container): RLIMIT_NPROC does not apply to uid 0, and root's files would
be readable inside a user namespace mapped to uid 0. So the sandbox is started through util-linux:
``unshare --mount`` (a private mount namespace that only this sandbox's launcher sees) bind-mounts the
interpreter and site-packages on a private tmpfs (at ``/mnt``, or another folder holding none of
them), then ``setpriv`` drops to a uid of its own
(``_UID_BASE`` + the launcher's pid, unique among live sandboxes) and execs bwrap unprivileged. As
another user, bwrap runs directly as that user.

Memory is bounded per process (RLIMIT_AS) and by the process cap: at most ``max_procs * memory_mb``
plus the two tmpfs. A total memory cap needs cgroups, which this does not use.

Considered: nsjail (not packaged in Debian 12), firejail (setuid, far larger attack surface), gVisor or
docker/podman (a runtime or daemon, and ~0.3 s per execution), WebAssembly CPython (no numpy and other
C extensions). ``isolation="none"`` is the old rlimit-only path: a separate process group with CPU and
address-space limits in a temporary directory, for machines without bwrap; it contains nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import shutil
import signal
import sys
import sysconfig
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cache
from typing import Literal

Isolation = Literal["bwrap", "none"]
ISOLATIONS: tuple[str, ...] = ("bwrap", "none")
_UID_BASE = 0x5A000000
"""Outside uids of sandboxes started by root: far above any real account, below 2**32 with any pid."""
_SANDBOX_PY = "/opt/python"
_SANDBOX_VENV = "/opt/venv"
_GRACE_S = 5.0
"""How long to wait for pipes to close after a kill (the rlimit-only path can leave writers behind)."""

INSTALL_HINT = (
    "SandboxedPythonCoder runs model-written code inside bubblewrap, which is not installed on this machine. "
    "Install it with `apt-get install -y bubblewrap` (scripts/setup.sh does it when run as root; "
    "`dnf install bubblewrap` / `pacman -S bubblewrap` elsewhere). To run code with CPU and memory limits only "
    "and no isolation at all, pass isolation='none' (never for untrusted code)."
)


@dataclass(kw_only=True, slots=True)
class ExecResult:
    """What ``execute`` returns. It unpacks as the documents' ``stdout, stderr = await
    coder.execute.route(code)``; ``exit_code`` and ``timed_out`` say the rest."""

    stdout: str
    stderr: str
    exit_code: int | None
    timed_out: bool

    def __iter__(self) -> Iterator[str]:
        return iter((self.stdout, self.stderr))


@dataclass(kw_only=True, slots=True, frozen=True)
class Limits:
    """Per-execution limits; the coder validates them (all must be > 0)."""

    timeout_s: float = 5.0
    cpu_s: int = 5
    memory_mb: int = 512
    max_procs: int = 32
    tmp_mb: int = 64
    max_output: int = 10_000


def missing_tools() -> list[str]:
    """The programs the bwrap sandbox needs that this machine lacks (empty when it can run)."""
    needed = ["bwrap", "prlimit"] + (["unshare", "setpriv", "mount"] if os.geteuid() == 0 else [])
    return [name for name in needed if shutil.which(name, path="/usr/sbin:/usr/bin:/sbin:/bin") is None]


async def run_sandboxed(code: str, stdin: str = "", timeout_s: float = 5.0, cpu_s: int = 5, memory_mb: int = 512,
                        max_output: int = 10_000, *, max_procs: int = 32, tmp_mb: int = 64,
                        isolation: Isolation = "bwrap") -> ExecResult:
    """Run ``code`` in a fresh sandbox and return its output; never raises for what the code does."""
    if not isinstance(code, str):
        raise TypeError(f"execute(code) takes a string of Python, got {type(code).__name__}")
    limits = Limits(timeout_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, max_procs=max_procs, tmp_mb=tmp_mb,
                    max_output=max_output)
    if isolation == "none":
        return await _run_rlimited(code, stdin, limits)
    if isolation != "bwrap":
        raise ValueError(f"isolation={isolation!r}: use 'bwrap' (the default) or 'none' (no isolation)")
    if missing := missing_tools():
        raise RuntimeError(f"{INSTALL_HINT} (missing: {', '.join(missing)})")
    cfg_read, cfg_write = os.pipe()
    try:
        os.write(cfg_write, f"home = {_SANDBOX_PY}/bin\ninclude-system-site-packages = false\n".encode())
        os.close(cfg_write)
        proc = await asyncio.create_subprocess_exec(
            *_command(code, limits, cfg_read), env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, pass_fds=(cfg_read,),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True,
        )
    finally:
        os.close(cfg_read)
    return await _collect(proc, stdin, limits)


@dataclass(frozen=True, slots=True)
class _View:
    """Where the interpreter lives on the host and where the sandbox sees it."""

    base: str
    exe: str
    """The interpreter's path inside ``base``, e.g. ``bin/python3.11``."""
    sites: tuple[tuple[str, str], ...]
    """(host dir, sandbox dir) for each of the venv's site-packages; empty outside a venv."""

    @property
    def python(self) -> str:
        """The interpreter the sandbox runs (the venv's, when there is one)."""
        return f"{_SANDBOX_VENV}/bin/python" if self.sites else f"{_SANDBOX_PY}/{self.exe}"


@cache
def _view() -> _View:
    base = os.path.realpath(sys.base_prefix)
    real_exe = os.path.realpath(sys.executable)
    exe = (os.path.relpath(real_exe, base) if real_exe.startswith(base + os.sep)
           else f"bin/python{sys.version_info.major}.{sys.version_info.minor}")
    sites: dict[str, str] = {}
    if os.path.realpath(sys.prefix) != base:  # a venv: its site-packages, laid out as a venv inside
        for key in ("purelib", "platlib"):
            path = sysconfig.get_paths()[key]
            if os.path.isdir(path):
                sites.setdefault(os.path.realpath(path), f"{_SANDBOX_VENV}/{os.path.relpath(path, sys.prefix)}")
    return _View(base=base, exe=exe, sites=tuple(sites.items()))


def _stage_dir(sources: list[str]) -> str:
    """An existing folder, outside every one of ``sources``, for the launcher's private tmpfs."""
    for folder in ("/mnt", "/media", "/srv", "/tmp", "/run"):
        inside = any(os.path.commonpath([folder, os.path.realpath(src)]) == folder for src in sources)
        if os.path.isdir(folder) and not inside:
            return folder
    raise RuntimeError(f"no folder for the sandbox's staging mount lies outside {sources}")


def _command(code: str, limits: Limits, cfg_fd: int) -> list[str]:
    """The argv: bwrap (behind unshare + setpriv when root), then prlimit, then the interpreter."""
    view = _view()
    as_root = os.geteuid() == 0
    # As root the sources are re-mounted by the launcher on a private tmpfs (see the module docstring),
    # at a folder that holds none of them: mounting over /tmp would hide a venv that lives under /tmp.
    stage = _stage_dir([view.base, *(host for host, _ in view.sites)])
    base = f"{stage}/python" if as_root else view.base
    sites = [(f"{stage}/site{i}" if as_root else host, inside) for i, (host, inside) in enumerate(view.sites)]
    tmp_bytes = str(limits.tmp_mb * 2**20)
    bwrap = ["bwrap", "--unshare-all", "--unshare-user", "--disable-userns", "--die-with-parent", "--new-session",
             "--clearenv", "--setenv", "PATH", "/usr/bin:/bin", "--setenv", "HOME", "/tmp",
             "--setenv", "LD_LIBRARY_PATH", f"{_SANDBOX_PY}/lib", "--uid", "65534", "--gid", "65534",
             "--hostname", "sandbox", "--ro-bind", "/usr", "/usr"]
    for top in ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32"):
        if os.path.islink(top):
            bwrap += ["--symlink", os.readlink(top), top]
        elif os.path.isdir(top):
            bwrap += ["--ro-bind", top, top]
    bwrap += ["--ro-bind-try", "/etc/ld.so.cache", "/etc/ld.so.cache", "--ro-bind", base, _SANDBOX_PY]
    if view.sites:
        bwrap += ["--ro-bind-data", str(cfg_fd), f"{_SANDBOX_VENV}/pyvenv.cfg",
                  "--symlink", f"{_SANDBOX_PY}/{view.exe}", view.python]
        for source, inside in sites:
            bwrap += ["--ro-bind", source, inside]
    bwrap += ["--proc", "/proc", "--dev", "/dev", "--size", tmp_bytes, "--tmpfs", "/tmp",
              "--size", tmp_bytes, "--tmpfs", "/dev/shm", "--chdir", "/tmp",
              "prlimit", f"--as={limits.memory_mb * 2**20}", f"--cpu={limits.cpu_s}", f"--nproc={limits.max_procs}",
              f"--fsize={tmp_bytes}", "--core=0", "--",
              view.python, "-I", "-u", "-c", code]
    if not as_root:
        return bwrap
    mounts = " && ".join(
        [f"mount -t tmpfs -o mode=0755,size=64k forge-nb-sandbox {stage}", f"mkdir {stage}/python",
         f'mount --bind "$1" {stage}/python']
        + [f'mkdir {stage}/site{i} && mount --bind "${i + 2}" {stage}/site{i}' for i in range(len(sites))])
    launcher = (f'{mounts} && shift {1 + len(sites)} && uid=$(({_UID_BASE} + $$)) && '
                'exec setpriv --reuid=$uid --regid=$uid --clear-groups --inh-caps=-all --no-new-privs -- "$@"')
    return ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", launcher, "forge-nb-sandbox",
            view.base, *(host for host, _ in view.sites), *bwrap]


async def _run_rlimited(code: str, stdin: str, limits: Limits) -> ExecResult:
    """The rlimit-only path (``isolation="none"``): its own process group, CPU and memory caps, a temp dir."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_CPU, (limits.cpu_s, limits.cpu_s))
        memory = limits.memory_mb * 2**20
        resource.setrlimit(resource.RLIMIT_AS, (memory, memory))

    with tempfile.TemporaryDirectory(prefix="forge-nb-sandbox-") as workdir:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-u", "-c", code, cwd=workdir, env={"PATH": "/usr/bin:/bin"},
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            start_new_session=True, preexec_fn=limit,
        )
        return await _collect(proc, stdin, limits)


async def _collect(proc: asyncio.subprocess.Process, stdin: str, limits: Limits) -> ExecResult:
    """Feed stdin, read both pipes as the code writes, and kill the whole sandbox at the deadline."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    keep = limits.max_output * 4  # bytes: enough for max_output characters of UTF-8
    out, err = bytearray(), bytearray()  # filled as the code prints, so a timeout keeps what came before
    tasks = [asyncio.ensure_future(_drain(proc.stdout, out, keep)),
             asyncio.ensure_future(_drain(proc.stderr, err, keep)),
             asyncio.ensure_future(_feed(proc.stdin, stdin.encode()))]
    finished = asyncio.gather(proc.wait(), tasks[0], tasks[1])
    timed_out = False
    try:
        await asyncio.wait_for(asyncio.shield(finished), limits.timeout_s)
    except TimeoutError:
        timed_out = True
    finally:
        if proc.returncode is None:  # not reaped yet, so its process group is still the sandbox's
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        await asyncio.wait(tasks, timeout=_GRACE_S)
        finished.cancel()
        for task in tasks:
            task.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(proc.wait(), _GRACE_S)
    return ExecResult(stdout=out.decode(errors="replace")[:limits.max_output],
                      stderr=err.decode(errors="replace")[:limits.max_output],
                      exit_code=proc.returncode, timed_out=timed_out)


async def _drain(stream: asyncio.StreamReader, kept: bytearray, keep: int) -> None:
    """Append what the stream says to ``kept`` up to ``keep`` bytes; read on past that so the writer never blocks."""
    while chunk := await stream.read(2**16):
        if len(kept) < keep:
            kept += chunk[:keep - len(kept)]


async def _feed(pipe: asyncio.StreamWriter, data: bytes) -> None:
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        if data:
            pipe.write(data)
            await pipe.drain()
        pipe.close()
