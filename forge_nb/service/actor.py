"""ForgeActor: a monarch Actor with TorchForge's ``.options(...).as_service()/.as_actor()`` front.

A user writes ``class Counter(ForgeActor)`` with ``@endpoint`` methods, sync or async (monarch alone
refuses a class that mixes them; we make every endpoint async, see ``forge_nb.system.monarch_compat.async_endpoints``).
Heavy initialisation goes in an async ``setup()`` endpoint, which the service calls after spawning
so that its errors reach the caller. An exception in ``__init__`` reaches the caller too, with its type,
message and traceback, and an endpoint can be called on ``self`` (``self.reset()``, even from ``__init__``
as the documents' CustomEnv does): see ``_actor_side``.

``options()`` returns a configured *subclass*, as in TorchForge. That subclass is never sent to a
process: it is not importable there. We spawn the class the user wrote and keep the options here.
``Options`` lives in ``options`` (the service and its replicas read it without importing this module).
"""

from __future__ import annotations

from dataclasses import fields
from typing import TYPE_CHECKING, Any, ClassVar, Self

from monarch.actor import Actor, endpoint

from forge_nb.service._actor_side import ForgeActorMeta, bind_endpoints
from forge_nb.service.options import Options
from forge_nb.system.monarch_compat import async_endpoints

if TYPE_CHECKING:
    from forge_nb.service.service import ActorHandle, Service


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
    def prepared_service(cls, *args: Any, **kwargs: Any) -> Service:
        """``as_service`` in two halves: the Service, checked, its replicas not started; ``await svc.begin()``
        starts them (``Service.prepare``)."""
        from forge_nb.service.service import Service

        return Service.prepare(cls, cls._options, args, kwargs)

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
