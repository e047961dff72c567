"""Bridges over monarch 0.7 behaviour that forge_nb and the libraries it uses rely on."""

from __future__ import annotations

import functools
import getpass
import inspect
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def async_endpoints(cls: type) -> type:
    """Re-declare every synchronous ``@endpoint`` of ``cls`` as an async one, in place.

    monarch >= 0.3 refuses an actor class whose endpoints mix ``def`` and ``async def``. A sync
    endpoint wrapped this way still runs on the actor's event loop thread, exactly as it would
    inside an async actor. Used for user ``ForgeActor`` subclasses and torchstore's Controller.
    """
    from monarch._src.actor.endpoint import EndpointProperty

    for attr in dir(cls):
        prop = getattr(cls, attr, None)
        if not isinstance(prop, EndpointProperty) or inspect.iscoroutinefunction(prop._method):
            continue
        setattr(cls, attr, EndpointProperty(
            _as_coroutine(prop._method), prop._propagator, prop._explicit_response_port, prop._instrument
        ))
    return cls


def _as_coroutine(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        return fn(*args, **kwargs)

    wrapper.__forge_nb_sync__ = fn  # type: ignore[attr-defined]  # what ``self.ep()`` calls on the actor
    return wrapper


async def await_maybe(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value


def private_log_dir() -> Path:
    """Make monarch's log folder readable by this user only, and return it.

    monarch 0.7 writes every process's log to ``<tmp>/<user>/monarch_log.log`` and creates the folder
    world-readable; the log names the abstract unix sockets of every actor, which any local user can
    connect to. A folder only its owner can enter keeps the log (and so the names) private. What
    remains: a local user who guesses or scans abstract socket names can still connect to them;
    monarch 0.7 offers no transport that file permissions protect (ChannelTransport: Unix, Tcp,
    MetaTls, Local; Unix sockets are abstract)."""
    folder = Path(tempfile.gettempdir()) / getpass.getuser()
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    if folder.stat().st_uid == os.getuid():
        folder.chmod(0o700)
        for log in folder.glob("monarch_log*"):
            log.chmod(0o600)
    return folder
