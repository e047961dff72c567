"""The runtime's life in this process: started once, held by leases, ended without monarch's teardown.

:func:`ensure_started` runs once per process: it applies monarch's environment defaults (which monarch reads only
when it is *imported*: we set them when we are first to import it), installs our fault hook
(``forge_nb.system.runtime.faults``) and an ``atexit`` handler that kills what still runs.
Importing this module has no side effects.

Nothing outlives the kernel: spawned procs are its children with PR_SET_PDEATHSIG, a reaper kills their groups
if the kernel is killed (``forge_nb.system.processes.procs``), and a clean exit kills what still runs. (A job's hosts,
``forge_nb.system.hosts.cluster``, are the job's; their pids are watched only on this machine.) :func:`end_process`
skips monarch's exit-time teardown.

Leases (:func:`lease` / :func:`release`, a ``forge_nb.system.leases.Shared``): services and the leased
torchstore hold the runtime under a holder id, and meshes they spawn carry that id as ``owner``. The
first lease starts the runtime (``ensure_started``); releasing a holder stops every mesh it still owns
(what a shutdown left behind, e.g. a respawn caught midway); the last release also ends the pid
watchdog when no mesh is left. What a lease does not cover: the process-wide start-up stays for the
life of the kernel (monarch cannot be un-imported, and its late failure reports still need our
hook), and meshes spawned without a lease (``%spawn``, tests) are the spawner's to stop.
"""

from __future__ import annotations

import atexit
import logging
import os
import sys
import threading
from typing import NoReturn

from forge_nb.system.leases import Shared
from forge_nb.system.monarch_compat import private_log_dir
from forge_nb.system.processes.proclogs import default_log_dir, native_stderr_to
from forge_nb.system.runtime import faults, registry

logger = logging.getLogger(__name__)

#: Environment defaults applied before monarch starts (a user's own values win).
MONARCH_ENV_DEFAULTS = {
    # Not set: HYPERACTOR_MESH_SUPERVISION_POLL_FREQUENCY stays monarch's 10 s. Our pid watchdog notices a dead
    # process within half a second and fails its requests in flight (forge_nb.system.runtime.faults); each of
    # monarch's polls leaves native memory in the kernel for good (its senders' sequence tables keep one entry
    # per reply port), so a 1 s poll grew a long run's kernel ~0.7 MB per 1000 quickstart steps
    # (bench/kernel_memory.py; bench/HISTORY.md).
    # Weight dicts travel as single messages; torchstore sets the same on import.
    "HYPERACTOR_CODEC_MAX_FRAME_LENGTH": "910737418240",
    # A job's host that dies leaves messages queued to it; after this long monarch returns them, and a kernel
    # handed back an undeliverable message exits (measured: 30 s, the default, after a ProcessJob host died
    # mid-run, pytest was gone). The host's probe finds it lost within seconds (forge_nb.system.hosts.cluster).
    "HYPERACTOR_MESSAGE_DELIVERY_TIMEOUT": "7d",
}

_started = False
_start_lock = threading.Lock()


def ensure_started() -> None:
    """Apply monarch's environment defaults and install our fault hook and exit handler, once."""
    global _started
    with _start_lock:
        if _started:
            return
        if "monarch" in sys.modules:
            late = [k for k in MONARCH_ENV_DEFAULTS if k not in os.environ]
            if late:
                logger.info(
                    "monarch was imported before forge_nb started it, so %s does not apply: a message "
                    "queued to a lost host comes back after monarch's 30 s, which ends the kernel. "
                    "%%load_ext forge_nb first to avoid that.",
                    ", ".join(late),
                )
        for key, value in MONARCH_ENV_DEFAULTS.items():
            os.environ.setdefault(key, value)
        private_log_dir()  # monarch's log names every actor's socket: owner-only, before monarch writes it
        import monarch.actor

        with native_stderr_to(default_log_dir() / "monarch-start.log"):  # not a cell: where monarch logs
            monarch.actor.context()  # the first context starts monarch's runtime, which says so on descriptor 2
        monarch.actor.unhandled_fault_hook = faults.fault_hook
        atexit.register(registry.kill_everything)
        _started = True


# -- Leases ----------------------------------------------------------------------------------------

async def _lease_start() -> None:
    ensure_started()


async def _lease_stop() -> None:
    faults.stop_watchdog_if_idle()  # a released runtime leaves no task


_leases = Shared("runtime", start=_lease_start, stop=_lease_stop)


async def lease(holder: str) -> None:
    """Hold the runtime for ``holder`` (a unique id; give it as ``owner`` to the meshes it spawns)."""
    await _leases.acquire(holder)


async def release(holder: str) -> None:
    """End ``holder``'s lease: stop the meshes it still owns; the last release ends the watchdog if no
    mesh is left. A holder that holds nothing: no-op."""
    if holder not in _leases.holders:
        return
    for mesh in [m for m in registry.meshes() if m.owner == holder]:
        logger.info("mesh %s was left running by %s; stopping it", mesh.name, holder)
        await mesh.stop()
    await _leases.release(holder)


def lease_holders() -> frozenset[str]:
    """Who holds the runtime now."""
    return _leases.holders


# -- The end ---------------------------------------------------------------------------------------

def end_process(status: int) -> NoReturn:
    """End this process now with exit status ``status``: kill every mesh it still holds, flush the
    output, and skip Python's exit-time teardown. For programs whose exit status matters (the test
    runner, scripts); a notebook kernel does not need it.

    Why: monarch 0.7 shuts its client down in an ``atexit`` handler. A controller it keeps in this
    process (the one behind ``get_or_spawn_controller``, torchstore's) then tells its subscribers that
    it stopped; a subscriber that was SIGKILLed earlier (a replica that died) can make that notice loop
    until its TTL expires, and the failure that follows reaches a client that is already gone, so
    monarch calls ``exit(1)``. Nothing is printed: only monarch's log says "failed to send supervision
    event to actor ... Crash the process". It happens after the program's work is done, now and then,
    and turns a passing run into exit status 1.
    """
    try:
        registry.kill_everything()
        logging.shutdown()
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
    finally:
        os._exit(status)
