"""The service layer's failures: ``ActorFailure`` and its forms (died mid-request, none healthy, never started).

One hierarchy, so that the TorchForge documents' ``except ActorFailure:`` catches whatever means "the actor or
replica is gone", whichever layer noticed it::

    RuntimeError
    └── ActorFailure            an actor/replica is gone; what a caller catches
        ├── ReplicaDied         its process died (or hung) while the request was in flight
        ├── NoHealthyReplica    every replica of a service is down and none came back in time
        └── ActorStartFailed    a replica could not come up: __init__ or setup raised, or its process died

Why ``RuntimeError``: monarch 0.7 reports a dead process to an in-flight call as ``SupervisionError``, a final
``RuntimeError`` subclass (it cannot be a base), and the replicas turn it into :class:`ReplicaDied`; code that
caught ``RuntimeError`` before keeps working. TorchForge itself defines no ``ActorFailure`` class: the name
comes from its concepts document (Monarch's fault-tolerance example).

An exception raised by an endpoint's own code is *not* an ActorFailure: it reaches the caller as monarch's
``ActorError`` (the user's exception in ``.exception``) and the replica stays healthy.
"""

from __future__ import annotations

from typing import Any


def last_line(error: BaseException) -> str:
    """The last line of ``error``'s message (its type's name if it has none): an endpoint's error, as monarch's
    ``ActorError`` carries it, ends with the actor's own exception line after the remote traceback."""
    lines = str(error).strip().splitlines()
    return lines[-1] if lines else type(error).__name__


class ActorFailure(RuntimeError):
    """An actor or a replica is gone: its process died or hung, or it could not start.

    ``try: await svc.ep.route(x) except ActorFailure: ...``. A service already retries a request whose
    replica died on another replica, so a caller sees this only when no replica could serve it; an actor
    (``.as_actor()``) holds state and is never retried, so its caller sees every death.
    """


class ReplicaDied(ActorFailure):
    """The replica's process died (or hung) while the request was in flight."""


class NoHealthyReplica(ActorFailure):
    """Every replica of a service is down and none came back within ``route_wait_timeout``."""


class ActorStartFailed(ActorFailure):
    """A replica could not come up. The message names the user's exception (type and message) and carries
    the traceback text from the actor's process; ``__cause__`` is that exception when it could travel.

    Attributes: ``replica`` (e.g. ``"Counter[0]"``), ``exception`` (the user's exception, or None when
    the process died without one), ``remote_traceback`` (text; empty when there is none).
    """

    def __init__(self, message: str, *, replica: str, exception: BaseException | None = None,
                 remote_traceback: str = ""):
        super().__init__(message)
        self.replica = replica
        self.exception = exception
        self.remote_traceback = remote_traceback

    def __reduce__(self) -> tuple[Any, ...]:  # keyword-only fields survive pickling (e.g. through monarch)
        return (_rebuild_start_failed, (str(self), self.replica, self.exception, self.remote_traceback))


def _rebuild_start_failed(message: str, replica: str, exception: BaseException | None,
                          remote_traceback: str) -> ActorStartFailed:
    return ActorStartFailed(message, replica=replica, exception=exception, remote_traceback=remote_traceback)
