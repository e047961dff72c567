"""Options of an actor (``ForgeActor.options(...)``) and what a service needs to know of an actor class.

Kept apart from ``actor`` so that the service and its replicas, which ``ForgeActor.as_service`` starts,
never import the module that imports them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

__all__ = ["ActorClass", "Options"]


class ActorClass(Protocol):
    """A ``ForgeActor`` subclass, as a service and its replicas use it."""

    __name__: str
    needs_store: bool

    def spawn_class(self) -> type: ...

    def endpoint_names(self) -> list[str]: ...


@dataclass(kw_only=True, slots=True)
class Options:
    """Resources and service behaviour of an actor, as given to ``ForgeActor.options(...)``."""

    procs: int = 1
    """Processes per replica (one monarch ProcMesh per replica)."""
    with_gpus: bool = False
    """Give each replica ``procs`` GPUs; an error on a machine without enough of them."""
    num_replicas: int = 1
    """Replicas of a service (``as_service``); an actor has one."""
    hosts: int | str | None = None
    """Where each replica runs: None or 1 (TorchForge's hosts per replica: one host; a job's host chosen by
    ``forge_nb.system.hosts.cluster`` when one is in use), the name of one of the job's host meshes, or "kernel"."""
    mesh_name: str | None = None
    """Base name of the replicas' meshes; defaults to the class name in lower case."""
    max_restarts: int = 3
    """Respawns of one replica in a row (each dying within ``restart_reset_s`` of the last) before it
    stays failed and traffic goes elsewhere."""
    restart_reset_s: float = 60.0
    """A replica that has served this long since its last respawn gets its ``max_restarts`` budget and
    backoff back: the budget stops crash loops, not the occasional deaths of a long run."""
    request_timeout: float | None = 300.0
    """Seconds before a request counts as hung: its replica is restarted, the request retried."""
    fanout_grace_s: float | None = 5.0
    """Once one replica has answered a ``fanout``, how long it waits for the others (or four times that
    first answer's time, if longer) before it counts a silent one as hung: that replica is restarted
    and left out of the answers, so one hung replica cannot stall every caller. None: only
    ``request_timeout`` bounds the wait."""
    route_wait_timeout: float = 120.0
    """Seconds ``route`` waits for a healthy replica (e.g. a respawn) before it raises."""
    restart_backoff: float = 0.5
    """First delay before a respawn; doubles with each restart of the same replica."""
    log_dir: str | None = None
    """Folder for the replicas' process output (``<mesh>.log``); a run's services log into ``<run_dir>/logs``,
    others into a private folder of the kernel's (``forge_nb.system.processes.proclogs.default_log_dir``)."""
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment variables for the replicas' processes."""

    def __post_init__(self) -> None:
        for name in ("procs", "num_replicas"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name}={value!r}: must be an integer >= 1")
        if not isinstance(self.with_gpus, bool):
            raise ValueError(f"with_gpus={self.with_gpus!r}: must be True or False")
        if not isinstance(self.max_restarts, int) or self.max_restarts < 0:
            raise ValueError(f"max_restarts={self.max_restarts!r}: must be an integer >= 0")
        if self.request_timeout is not None and self.request_timeout <= 0:
            raise ValueError(f"request_timeout={self.request_timeout!r}: must be > 0, or None for no limit")
        if self.fanout_grace_s is not None and self.fanout_grace_s <= 0:
            raise ValueError(f"fanout_grace_s={self.fanout_grace_s!r}: must be > 0, or None to wait up to "
                             "request_timeout")
        if self.route_wait_timeout < 0 or self.restart_backoff < 0 or self.restart_reset_s < 0:
            raise ValueError("route_wait_timeout, restart_backoff and restart_reset_s must be >= 0")
