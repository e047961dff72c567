"""Weights for readers on other hosts: the writer serves a version's shared-memory file over one TCP stream.

::

    writer's process                                    a reader host (its first reader of the version)
    write_shm -> /dev/shm/<pid>-<key>.bin                host_copy: flock(<host>.lock)
    Server thread: accept, check token, flock(shared) <─── connect(addr, port), {"token", "path"}
                   sendfile(the whole file)  ────────────> recv_into a file of this host's shared memory
    manifest in torchstore: host, path, entries,           (a spare's pages, kept mapped: no page faults),
      stream = {addr, port, token}, publisher              renamed <pid>-<key>@<host>.bin; the host's
                                                           other readers map it (weights.open_version)

Only the manifest goes through torchstore. The writer's process runs one :class:`Server` (a thread, started
with its first push for other hosts, ended with the process), bound to the job's network address
(:func:`bind_address`: loopback when every host of the job is on one machine) on a free port. A request
names a file of this process's versions and carries the server's token (random, 128 bits), which only
the manifest in torchstore and the processes handed it know. The server holds a shared lock on the file
while it sends, so the writer never reuses it for a later version under a reader (``forge_nb.weights.shm``).

Failures. The stream cannot be reached (refused, filtered, no route): the reader says why in the log and
takes torchstore's path: it asks the writer's :class:`Publisher` actor (spawned in the writer's process,
its reference in the manifest) to put the version's tensors in torchstore, then fetches them as every
tensor travels there, as monarch messages (~0.25 GB/s). A reader process that could not reach a stream
does not try it again. The version was dropped before the server opened it: FileNotFoundError. The
writer died or the stream broke mid-transfer: ConnectionError saying how many bytes came; the partial
file and its mapping are removed before it is raised (``write_file``), and a reader killed mid-transfer
leaves a ``.tmp`` named after its pid, which ``remove_orphaned_shm`` removes. A version dropped while
its stream is being sent arrives whole: the server's lock keeps the file's bytes until the send ends.
A reader gets the version's tensors only once all of it is in (``open_version`` returns after the pull):
copying tensors into a model while later ones still arrive would overlap the two, but a broken stream
would then leave that model half loaded.

Both ends of the stream, the per-host copy and the fallback are one protocol, so they share this module
(longer than most for that reason).

Considered:

* torchstore's own path (what this replaces as the first choice): every tensor as monarch messages,
  ~0.1 GB/s for a reader on another host here, against ~3 GB/s for one loopback TCP stream.
* monarch RDMA buffers (``monarch.rdma``, what torchstore uses when ``is_rdma_available()``): the right
  transport where hosts have RDMA NICs; these machines have none, and it is False here.
* ``torch.distributed`` gloo broadcast: needs a process group over the writer and every reader, formed
  again whenever a generator respawns or a host is lost, and a collective the writer must join for each
  version; readers here come and go and fetch when they need a version, which a server answers best.
* asyncio streams in the writer's event loop: a trainer's loop is busy through a training step, and a
  copy through Python buffers costs a pass more than ``sendfile`` from the tmpfs file.
* a server per host rather than per writer process: a daemon of its own to start, find and stop; the
  writer's process already owns its files, which go when it does (``remove_orphaned_shm``), and the
  server goes with them.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hmac
import ipaddress
import json
import logging
import mmap
import os
import pickle
import re
import secrets
import socket
import struct
import threading
from pathlib import Path
from typing import Any

import torch
from monarch.actor import Actor, endpoint, this_proc

from forge_nb.weights.shm import _lock_shared, _views, file_size, host_id, retire, shm_root, write_file, write_shm

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT_S = 5.0  #: a reader waits this long for the writer's server to accept (then torchstore)
IO_TIMEOUT_S = 60.0  #: a stream that moves nothing (the body: less than a chunk) for this long is broken
_CHUNK = 16 * 2**20  #: the body is received in calls of this many bytes
_SHM_MANIFEST = "__shm__"  # weights.SHM_MANIFEST (this module is below weights: it cannot import it)


class Unreachable(ConnectionError):
    """The writer's stream could not be reached: the reader takes torchstore's path instead."""


# -- the writer's side ----------------------------------------------------------------------------------


def bind_address() -> str:
    """The address this process's server binds to: ``FORGE_NB_WEIGHTS_ADDR`` if set; loopback outside a job
    of several hosts or when all of them are on this machine (``FORGE_NB_JOB_LOCAL``, from
    ``forge_nb.system.hosts.cluster``); otherwise the address this host's name resolves to, as monarch's TCP transport
    binds (a host whose name names only loopback gets loopback, and readers elsewhere take torchstore's path)."""
    if os.environ.get("FORGE_NB_WEIGHTS_ADDR"):
        return os.environ["FORGE_NB_WEIGHTS_ADDR"]
    if int(os.environ.get("FORGE_NB_JOB_HOSTS", "1")) <= 1 or os.environ.get("FORGE_NB_JOB_LOCAL") == "1":
        return "127.0.0.1"
    with contextlib.suppress(OSError, ValueError):
        for *_, sockaddr in socket.getaddrinfo(socket.gethostname(), None, type=socket.SOCK_STREAM):
            address = ipaddress.ip_address(sockaddr[0])
            if not (address.is_loopback or address.is_link_local):
                return str(address)
    return "127.0.0.1"


class Server:
    """Serves this process's shared-memory versions to readers that hold its token (one per process)."""

    def __init__(self, address: str):
        family = socket.AF_INET6 if ":" in address else socket.AF_INET
        self.sock = socket.create_server((address, 0), family=family, backlog=64)
        self.address, self.port = address, self.sock.getsockname()[1]
        self.token = secrets.token_hex(16)
        self.pid = os.getpid()
        self.roots: set[str] = set()  # the shm folders this process pushed to: it serves their files only
        threading.Thread(target=self._accept, name="forge_nb.weights.stream", daemon=True).start()

    def offer(self, path: str) -> dict[str, Any]:
        """What a manifest carries so that readers elsewhere can fetch ``path`` (a file of this process's)."""
        self.roots.add(str(Path(path).parent))
        return {"addr": self.address, "port": self.port, "token": self.token}

    def close(self) -> None:
        """Stop accepting (streams being sent finish); readers are refused from now on."""
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            threading.Thread(target=self._serve, args=(conn,), name="forge_nb.weights.send", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(IO_TIMEOUT_S)
            try:
                request = _read_json(conn)
                if not hmac.compare_digest(str(request.get("token", "")), self.token):
                    _send_json(conn, {"error": "PermissionError", "message": "wrong token"})
                    return
                path = str(request.get("path", ""))
                if os.path.dirname(path) not in self.roots or not re.fullmatch(
                        rf"{self.pid}-[A-Za-z0-9_-]+\.v\d+\.bin", os.path.basename(path)):
                    _send_json(conn, {"error": "PermissionError", "message": f"{path} is not a version of this writer"})
                    return
                try:
                    fd = os.open(path, os.O_RDONLY)
                except FileNotFoundError:
                    _send_json(conn, {"error": "FileNotFoundError", "message": "dropped"})
                    return
                try:
                    try:
                        _lock_shared(fd, path)  # held until the file is sent: the writer will not reuse it
                    except FileNotFoundError:
                        _send_json(conn, {"error": "FileNotFoundError", "message": "dropped"})
                        return
                    size = os.fstat(fd).st_size
                    _send_json(conn, {"size": size})
                    with open(fd, "rb", closefd=False) as file:
                        conn.sendfile(file, 0, size)
                finally:
                    os.close(fd)  # the lock goes with it
            except (OSError, ValueError) as e:  # the reader went away, or sent nonsense: its side reports it
                logger.info("weights stream to a reader ended early: %s: %s", type(e).__name__, e)


_server: Server | None = None
_server_lock = threading.Lock()


def server() -> Server:
    """This process's server, started on first use (again in a forked child: threads do not fork)."""
    global _server
    with _server_lock:
        if _server is None or _server.pid != os.getpid():
            _server = Server(bind_address())
        return _server


def stop_serving() -> None:
    """Close this process's server (readers of the versions it offered take torchstore's path)."""
    global _server
    with _server_lock:
        if _server is not None and _server.pid == os.getpid():
            _server.close()
        _server = None


class Publisher(Actor):
    """In the writer's process: puts a version's tensors in torchstore for a reader that cannot reach its
    stream, once per version (those who ask later find them there)."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()

    @endpoint
    async def publish(self, key: str, path: str, entries: list[Any]) -> None:
        from forge_nb.weights.torchstore import ts

        async with self._lock:
            if await ts.exists(f"{key}/MAPPING"):  # torchstore's index of a state dict: put already
                return
            fd = os.open(path, os.O_RDONLY)
            try:
                _lock_shared(fd, path)  # FileNotFoundError: dropped
                view = mmap.mmap(fd, os.fstat(fd).st_size, flags=mmap.MAP_PRIVATE,
                                 prot=mmap.PROT_READ | mmap.PROT_WRITE)  # copy-on-write: nothing copied here
                state_dict = _views(torch.frombuffer(view, dtype=torch.uint8), {"entries": entries})
                await ts.put_state_dict(state_dict, key)
            finally:
                os.close(fd)
            # weights.drop_version deletes the manifest first, then lists the keys: tensors put after that
            # listing are found gone here, and deleted
            if not await ts.exists(f"{key}/{_SHM_MANIFEST}"):
                for k in await ts.keys(key.rsplit(".v", 1)[0]):
                    if k.startswith(key + "/"):
                        await ts.delete(k)
                raise FileNotFoundError(f"{key} was dropped while it was being put in torchstore")


_publisher: tuple[int, bytes] | None = None


def publisher() -> bytes:
    """The pickled reference of this process's Publisher actor, spawned on first use."""
    global _publisher
    if _publisher is None or _publisher[0] != os.getpid():
        _publisher = (os.getpid(), pickle.dumps(this_proc().spawn("forge_nb_weights_publisher", Publisher)))
    return _publisher[1]


# -- a reader's side ------------------------------------------------------------------------------------

_unreachable: dict[tuple[str, int], str] = {}  # streams this process could not reach, and why


async def host_copy(key: str, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """The manifest of this host's copy of ``key``, pushed on another host: the first reader here fetches
    it (its stream, else torchstore) and lays it out in shared memory (under the host's lock file in the
    folder, so once per host); the others wait for it and map it. Older copies of the namespace on this
    host are retired first (their pages carry this one, when no reader holds them). The copy's files are
    named after the reader that made them, so they go when it does (remove_orphaned_shm)."""
    root = shm_root()
    root.mkdir(parents=True, exist_ok=True)
    host = re.sub(r"[^A-Za-z0-9_.-]", "_", host_id())
    # one lock per host: hosts a ProcessJob simulates share this machine's folder, but copy side by side
    fd = os.open(root / f"{host}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    try:
        await asyncio.to_thread(fcntl.flock, fd, fcntl.LOCK_EX)
        for made in root.glob(f"*-{key}@{host}.json"):
            copy = json.loads(made.read_text())
            if Path(copy["path"]).exists():
                return copy
        for old in root.glob(f"*-{namespace}.v*@{host}.json"):  # this host needs the newest only
            with contextlib.suppress(FileNotFoundError, ValueError, KeyError):
                retire(Path(json.loads(old.read_text())["path"]))
            old.unlink(missing_ok=True)
        try:
            copy = await asyncio.to_thread(_pull, f"{key}@{host}", manifest)
            copy["via"] = "stream"
        except Unreachable as e:
            logger.warning("%s: %s; fetching it through torchstore instead (every tensor as monarch messages)",
                           key, e)
            try:
                copy = await _through_torchstore(key, host, manifest)
            except Exception as failed:
                raise RuntimeError(f"{key}: {e}, and fetching it through torchstore failed too "
                                   f"({type(failed).__name__}: {failed})") from failed
            copy["via"] = f"torchstore ({e})"
        copy["fetched_by"] = os.getpid()
        local = root / f"{os.getpid()}-{key}@{host}.json"
        local.with_suffix(".tmp").write_text(json.dumps(copy))
        local.with_suffix(".tmp").replace(local)
        return copy
    finally:
        os.close(fd)  # the lock goes with it


def _pull(name: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """Fetch the writer's file through its stream into this process's file ``name``; the copy's manifest."""
    stream = manifest.get("stream")
    if stream is None:
        raise Unreachable("its writer serves no stream")
    where = (stream["addr"], stream["port"])
    if where in _unreachable:
        raise Unreachable(_unreachable[where])
    try:
        conn = socket.create_connection(where, timeout=CONNECT_TIMEOUT_S)
    except OSError as e:
        _unreachable[where] = f"its stream at {where[0]}:{where[1]} could not be reached ({type(e).__name__}: {e})"
        raise Unreachable(_unreachable[where]) from e
    with conn:
        conn.settimeout(IO_TIMEOUT_S)
        try:
            _send_json(conn, {"token": stream["token"], "path": manifest["path"]})
            header = _read_json(conn)
        except (OSError, ValueError) as e:
            raise ConnectionError(f"the writer's stream at {where[0]}:{where[1]} ended before it began "
                                  f"({type(e).__name__}: {e}): its process died or dropped the connection") from e
        if header.get("error") == "FileNotFoundError":
            raise FileNotFoundError(f"{manifest['path']} was dropped before its stream began")
        if "error" in header:
            raise PermissionError(f"the writer's stream at {where[0]}:{where[1]} refused: {header['message']}")
        size = int(header["size"])
        if size != file_size(manifest["entries"]):
            raise ValueError(f"the writer's file has {size} bytes; its manifest needs {file_size(manifest['entries'])}")

        _wait_for_whole_chunks(conn)

        def receive(buffer: torch.Tensor) -> None:
            view, got = memoryview(buffer.numpy()), 0
            try:
                while got < size:
                    n = conn.recv_into(view[got:], min(size - got, _CHUNK), socket.MSG_WAITALL)
                    if n == 0:
                        break
                    got += n
            except OSError as e:
                raise ConnectionError(f"the stream of {manifest['path']} broke after {got} of {size} bytes "
                                      f"({type(e).__name__}: {e}): the writer's process died?") from e
            finally:
                view.release()  # nothing of a failed copy stays mapped (nor referenced from the traceback)
                del buffer
            if got < size:
                raise ConnectionError(f"the stream of {manifest['path']} ended after {got} of {size} bytes: "
                                      "the writer's process died or dropped the connection")

        path = write_file(name, size, receive)
    return {"host": host_id(), "path": str(path), "entries": manifest["entries"]}


async def _through_torchstore(key: str, host: str, manifest: dict[str, Any]) -> dict[str, Any]:
    """torchstore's path: the writer's Publisher puts the tensors there (unless its push did), then they
    come as monarch messages and are laid out in this host's shared memory."""
    from forge_nb.weights.torchstore import ts

    if not manifest.get("torchstore"):
        actor = pickle.loads(manifest["publisher"])
        await actor.publish.call_one(key, manifest["path"], manifest["entries"])
    return write_shm(await ts.get_state_dict(key), f"{key}@{host}")


def _wait_for_whole_chunks(conn: socket.socket) -> None:
    """Make ``conn`` blocking with the kernel's receive timeout instead of Python's, so that a receive with
    ``MSG_WAITALL`` returns once its whole chunk is in (or the stream ends, or ``IO_TIMEOUT_S`` passes:
    BlockingIOError). A Python timeout makes the socket non-blocking, where each call returns the few
    64 KiB segments already queued: a wake-up and a call per segment, ~40% more of the reader's CPU for
    a version (two 512 MiB pulls at once on this machine: 0.15 against 0.09 CPU s per reader)."""
    conn.settimeout(None)
    seconds = int(IO_TIMEOUT_S)
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO,
                    struct.pack("ll", seconds, int((IO_TIMEOUT_S - seconds) * 1e6)))


def _send_json(conn: socket.socket, message: dict[str, Any]) -> None:
    data = json.dumps(message).encode()
    conn.sendall(struct.pack("!I", len(data)) + data)


def _read_json(conn: socket.socket) -> dict[str, Any]:
    (length,) = struct.unpack("!I", _read_exactly(conn, 4))
    if length > 2**16:
        raise ValueError(f"a {length}-byte header: not a weights stream")
    message = json.loads(_read_exactly(conn, length))
    if not isinstance(message, dict):
        raise ValueError("not a weights stream")
    return message


def _read_exactly(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        more = conn.recv(n - len(data))
        if not more:
            raise ConnectionError(f"closed after {len(data)} of {n} header bytes")
        data += more
    return data
