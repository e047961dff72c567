"""ForgeActor on its own process: endpoints callable on ``self``, and a constructor's exception kept for the caller.

Two things monarch 0.7 does not do that the TorchForge documents rely on:

* **``self.<endpoint>(...)`` inside the actor.** The documents' ``CustomEnv`` runs ``self.state = self.reset()``
  in ``__init__``. monarch's endpoint descriptor returns itself for an instance, and it is not callable. Here
  ``self.ep(...)`` calls the method: from another endpoint, an async endpoint gives a coroutine to await
  (``await self.reset()``) and a sync one its value. ``__init__`` cannot await, so while a ForgeActor is being
  constructed an async endpoint is run to completion on the spot when it finishes without suspending (the
  documents' ``reset`` returns a state); one that must wait (I/O, sleep) raises a TypeError that says to move
  the call into ``async def setup(self)``, which runs right after ``__init__`` on every replica.
* **An exception in ``__init__``.** monarch aborts the actor and the text reaches the caller only inside a
  supervision report (``MeshFailure`` / ``SupervisionError``: the traceback as text, among monarch's own
  frames), by way of the process-death machinery. When monarch's ``Init`` message constructs a ForgeActor we
  keep the exception instead; the actor stays up and its ``setup`` endpoint, the replica's first call, raises
  it. It reaches the caller as an ``ActorError`` whose ``.exception`` is of the user's type, with the user's
  traceback and nothing else, and the replica turns it into ``ActorStartFailed``. A ForgeActor constructed by
  anything else (a test, a notebook cell) raises as any class does.

Recognising monarch's constructor call reads the caller's frame (monarch's ``_prepare``, in
``monarch._src.actor.actor_mesh``). If a later monarch renames it, nothing breaks: the exception then takes
monarch's own path, and the replica still reports monarch's text, traceback included.
"""

from __future__ import annotations

import contextvars
import functools
import inspect
import os
import sys
from abc import ABCMeta
from collections.abc import Callable, Coroutine
from types import TracebackType
from typing import Any

from monarch._src.actor.endpoint import EndpointProperty

from forge_nb.system.processes import startup_gc

_INIT_ERROR = "_forge_nb_init_error"
#: True while a ForgeActor's ``__init__`` runs in this context.
_constructing: contextvars.ContextVar[bool] = contextvars.ContextVar("forge_nb_constructing", default=False)


class ForgeActorMeta(ABCMeta):
    """The metaclass of ForgeActor (monarch's Actor is an ABC): keeps a constructor's exception, see above."""

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        by_monarch = _is_monarch_init(sys._getframe(1))
        token = _constructing.set(True)
        try:
            return super().__call__(*args, **kwargs)
        except Exception as error:
            if not by_monarch:
                raise
            error.add_note(f"(raised in {cls.__qualname__}.__init__, in the actor's process {os.getpid()})")
            instance = cls.__new__(cls)  # type: ignore[call-overload]
            tb = error.__traceback__
            instance.__dict__[_INIT_ERROR] = (error, tb.tb_next if tb is not None else None)  # not this frame
            return instance
        finally:
            _constructing.reset(token)


def _is_monarch_init(frame: Any) -> bool:
    return frame.f_code.co_name == "_prepare" and str(frame.f_globals.get("__name__", "")).startswith("monarch.")


class LocalEndpoint(EndpointProperty[Any, Any]):
    """An endpoint that is also callable on the actor itself (``self.ep(...)``)."""

    def __init__(self, method: Callable[..., Any], propagator: Any, explicit_response_port: bool,
                 instrument: bool, local: Callable[..., Any]):
        super().__init__(method, propagator, explicit_response_port, instrument)
        self._local = local

    def __get__(self, instance: Any, owner: Any) -> Any:
        if instance is None:
            return self
        return _BoundEndpoint(self, instance)


class _BoundEndpoint(EndpointProperty[Any, Any]):
    """``self.ep`` on an actor instance. Still an EndpointProperty: monarch's dispatch looks endpoints up on
    the instance and calls ``_method`` with it, exactly as for its own descriptor."""

    def __init__(self, prop: LocalEndpoint, instance: Any):
        super().__init__(prop._method, prop._propagator, prop._explicit_response_port, prop._instrument)
        self._local, self._instance = prop._local, instance

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        result = self._local(self._instance, *args, **kwargs)
        if _constructing.get() and inspect.iscoroutine(result):
            return _finish_now(result, f"{type(self._instance).__name__}.{self._local.__name__}")
        return result


def _finish_now(coro: Coroutine[Any, Any, Any], name: str) -> Any:
    """Run ``coro`` to its end without an event loop; a TypeError if it has to wait for something."""
    try:
        waiting_for = coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise TypeError(
        f"{name}() was called from __init__ and waits for something ({waiting_for!r}); __init__ cannot await. "
        f"Call it from the actor's setup instead, which runs right after __init__:\n"
        f"    @endpoint\n    async def setup(self):\n        ... = await self.{name.rsplit('.', 1)[1]}()"
    )


def bind_endpoints(cls: type) -> None:
    """Make the endpoints ``cls`` defines callable on ``self``; guard ``setup`` with the constructor's error.

    Runs after ``async_endpoints``: every endpoint here is async, and a converted sync one is called
    locally through its original function (``self.ep()`` stays synchronous for whoever wrote it so).
    Endpoints of monarch's own subclasses (``concurrent_endpoint``) are left as they are.
    """
    for name, prop in list(vars(cls).items()):
        if type(prop) is not EndpointProperty:
            continue
        method = prop._method
        local = getattr(method, "__forge_nb_sync__", method)
        if name == "setup":
            method = _guarded(method)
        setattr(cls, name, LocalEndpoint(method, prop._propagator, prop._explicit_response_port,
                                         prop._instrument, local))


def _guarded(setup: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(setup)
    async def setup_after_init(self: Any, *args: Any, **kwargs: Any) -> Any:
        failed: tuple[BaseException, TracebackType | None] | None = self.__dict__.get(_INIT_ERROR)
        try:
            if failed is not None:  # raised here, not in a helper: one frame less in the traceback the user reads
                raise failed[0].with_traceback(failed[1])
            return await setup(self, *args, **kwargs)
        finally:  # the process's start is over: full garbage collections again
            startup_gc.settle()

    return setup_after_init
