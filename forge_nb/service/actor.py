"""ForgeActor: a monarch Actor with TorchForge's ``.options(...).as_service()/.as_actor()`` front.

A user writes ``class Counter(ForgeActor)`` with ``@endpoint`` methods, sync or async (monarch alone
refuses a class that mixes them; we make every endpoint async, see ``_monarch_compat.async_endpoints``).
Heavy initialisation goes in an async ``setup()`` endpoint, which the service calls after spawning
so that its errors reach the caller. An exception in ``__init__`` reaches the caller too, with its type,
message and traceback, and an endpoint can be called on ``self`` (``self.reset()``, even from ``__init__``
as the documents' CustomEnv does): see ``_actor_side``.

``options()`` returns a configured *subclass*, as in TorchForge. That subclass is never sent to a
process: it is not importable there. We spawn the class the user wrote and keep the options here.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar, Self

from monarch.actor import Actor, endpoint

from forge_nb._monarch_compat import async_endpoints
from forge_nb.service._actor_side import ForgeActorMeta, bind_endpoints

if TYPE_CHECKING:
    from forge_nb.service.service import ActorHandle, Service


@dataclass(kw_only=True, slots=True)
class Options:
    """Resources and service behaviour of an actor, as given to ``ForgeActor.options(...)``."""

    procs: int = 1
    """Processes per replica (one monarch ProcMesh per replica)."""
    with_gpus: bool = False
    """Give each replica ``procs`` GPUs; an error on a machine without enough of them."""
    num_replicas: int = 1
    """Replicas of a service (``as_service``); an actor has one."""
    hosts: int | None = None
    """Hosts per replica; forge_nb spawns on the kernel's host only (None or 1)."""
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
    route_wait_timeout: float = 120.0
    """Seconds ``route`` waits for a healthy replica (e.g. a respawn) before it raises."""
    restart_backoff: float = 0.5
    """First delay before a respawn; doubles with each restart of the same replica."""
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
        if self.route_wait_timeout < 0 or self.restart_backoff < 0 or self.restart_reset_s < 0:
            raise ValueError("route_wait_timeout, restart_backoff and restart_reset_s must be >= 0")


_OPTION_NAMES = frozenset(f.name for f in fields(Options))


class ForgeActor(Actor, metaclass=ForgeActorMeta):
    """Base class of every forge_nb actor: ``Cls.options(...).as_service(...)`` or ``.as_actor(...)``."""

    _options: ClassVar[Options] = Options()
    _spawn_class: ClassVar[type[ForgeActor] | None] = None
    needs_store: ClassVar[bool] = False
    """Whether the class moves weights through torchstore: spawning it starts the kernel's store."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "_spawn_class" not in cls.__dict__:  # a user's class, not one made by options()
            async_endpoints(cls)
            bind_endpoints(cls)

    @endpoint
    async def setup(self) -> None:
        """Heavy initialisation; runs after spawning (and after every respawn). Override it."""

    @classmethod
    def options(cls, **options: Any) -> type[Self]:
        """A configured version of this class; see :class:`Options` for the names."""
        unknown = set(options) - _OPTION_NAMES
        if unknown:
            raise ValueError(
                f"{cls.__name__}.options() got unknown option(s) {sorted(unknown)}; "
                f"known: {sorted(_OPTION_NAMES)}"
            )
        merged = {f.name: getattr(cls._options, f.name) for f in fields(Options)} | options
        base = cls._spawn_class or cls
        return type(cls.__name__, (cls,), {
            "_options": Options(**merged), "_spawn_class": base, "__module__": cls.__module__,
        })

    @classmethod
    def spawn_class(cls) -> type[ForgeActor]:
        """The class processes import: the user's own, never a subclass made by ``options()``."""
        return cls._spawn_class or cls

    @classmethod
    async def as_service(cls, *args: Any, **kwargs: Any) -> Service:
        """Spawn ``num_replicas`` replicas, each on its own mesh, and return the Service."""
        from forge_nb.service.service import Service

        return await Service.start(cls, cls._options, args, kwargs)

    @classmethod
    async def as_actor(cls, *args: Any, **kwargs: Any) -> ActorHandle:
        """Spawn one replica and return its handle (``await actor.ep.call_one(...)``)."""
        from forge_nb.service.service import ActorHandle

        if cls._options.num_replicas != 1:
            raise ValueError(
                f"{cls.__name__} has num_replicas={cls._options.num_replicas}; an actor has one. "
                "Use .as_service() for replicas."
            )
        return await ActorHandle.start(cls, cls._options, args, kwargs)

    @classmethod
    def endpoint_names(cls) -> list[str]:
        from monarch._src.actor.endpoint import EndpointProperty

        return sorted(n for n in dir(cls) if isinstance(getattr(cls, n, None), EndpointProperty))


bind_endpoints(ForgeActor)  # its own setup too: a subclass that does not override it gets the guarded one
