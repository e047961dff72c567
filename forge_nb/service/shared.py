"""A service several runs use at once: each run holds a share, and the service stops with the last share.

Several LoRA runs on one base model share its generator service and its trainer's processes
(``forge_nb.controller.lifecycle.on_base``). Each run talks to its share as to a service of its own:

    shared = SharedService(policy)                               # the base run's generator service
    mine = shared.share("run-b", inject={"generate": {"adapter": "policy-run-b"}}, leave=drop_my_adapter)
    await mine.generate.route(prompt)                            # = policy.generate.route(prompt, adapter=...)
    mine.set_catch_up(hook)                                      # a respawned replica runs every share's hook
    await mine.shutdown()                                        # leave(); the service stops if none is left

A share answers every attribute of the service it stands for (``replicas``, ``status()``, ``session()``,
``subscribe``...), with the keyword arguments of ``inject`` added to the calls of those endpoints, so the code that
drives one run (the controller, the episode functions, the documents' ``policy.generate.route(prompt)``) needs no
change. ``own``: the share's own handle on the same processes (a run's trainer actor beside the base run's), shut
down with the share instead of the shared one.

Considered: a refcount inside ``Service`` (every service would carry the notion of runs, and ``Run.shutdown``
would still need to tell its own adapter's leaving from the service's stop); a share is a thin front the run
holds, and ``Service`` stays what the documents' ``as_service()`` returns.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["Share", "SharedService"]

logger = logging.getLogger(__name__)


class SharedService:
    """``service``, shared: :meth:`share` hands a run its front; the service shuts down when the last share does.
    A respawned replica runs the catch-up hook of every share (``Share.set_catch_up``) in the order they came."""

    def __init__(self, service: Any):
        self.service = service
        self.shares: list[Share] = []
        self._catch_ups: dict[int, Callable[[Any], Awaitable[None]]] = {}  # id(share) -> its hook
        if hasattr(service, "set_catch_up"):
            service.set_catch_up(self._catch_up)

    def share(self, name: str, *, own: Any = None, inject: dict[str, dict[str, Any]] | None = None,
              defaults: dict[str, dict[str, Any]] | None = None,
              leave: Callable[[], Awaitable[None]] | None = None) -> Share:
        """A front for the run ``name``: calls go to ``own`` (else the shared service), those of the endpoints in
        ``inject`` with its keyword arguments added (they win), those in ``defaults`` with its keyword arguments
        where the caller gave none; ``leave()`` runs when the run's share shuts down."""
        share = Share(self, name, own if own is not None else self.service, inject or {}, defaults or {}, leave)
        self.shares.append(share)
        return share

    @property
    def names(self) -> list[str]:
        """The runs holding a share, in the order they came."""
        return [share.run_name for share in self.shares]

    async def _catch_up(self, replica: Any) -> None:
        for hook in list(self._catch_ups.values()):
            await hook(replica)

    async def _left(self, share: Share) -> None:
        self._catch_ups.pop(id(share), None)
        if share in self.shares:
            self.shares.remove(share)
        if not self.shares:
            await self.service.shutdown()


class Share:
    """One run's front on a :class:`SharedService` (see the module's docstring)."""

    def __init__(self, shared: SharedService, name: str, target: Any, inject: dict[str, dict[str, Any]],
                 defaults: dict[str, dict[str, Any]], leave: Callable[[], Awaitable[None]] | None):
        self._shared, self._target, self._leave = shared, target, leave
        self._inject, self._defaults = inject, defaults
        self.run_name = name
        self._endpoints: dict[str, _Injected] = {}
        self._gone = False

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        if name not in self._inject and name not in self._defaults:
            return getattr(self._target, name)
        endpoint = self._endpoints.get(name)
        if endpoint is None:
            endpoint = self._endpoints[name] = _Injected(getattr(self._target, name), self._inject.get(name, {}),
                                                         self._defaults.get(name, {}))
        return endpoint

    @property
    def shared(self) -> SharedService:
        return self._shared

    def set_catch_up(self, hook: Callable[[Any], Awaitable[None]] | None) -> None:
        """This run's part of what a respawned replica of the shared service runs before it takes traffic."""
        if self._target is not self._shared.service:
            self._target.set_catch_up(hook)
        elif hook is None:
            self._shared._catch_ups.pop(id(self), None)
        else:
            self._shared._catch_ups[id(self)] = hook

    async def shutdown(self) -> None:
        """This run leaves: its ``leave()``, its own handle's shutdown, and the shared service's with the last."""
        if self._gone:
            return
        self._gone = True
        try:
            if self._leave is not None and self._shared.shares != [self]:  # the last one's goes with the service
                try:
                    await self._leave()
                except Exception as e:  # the run leaves all the same: the shared service must not outlive it
                    logger.warning("run %s: leaving the shared %s failed: %s: %s", self.run_name,
                                   getattr(self._shared.service, "name", "service"), type(e).__name__, e)
            if self._target is not self._shared.service:
                await self._target.shutdown()
        finally:
            await self._shared._left(self)

    def __repr__(self) -> str:
        return f"<{self.run_name}'s share of {self._shared.service!r} (with {', '.join(self._shared.names)})>"


class _Injected:
    """An endpoint whose calls get extra keyword arguments, and defaults the caller's own override (the adverbs of
    a service and of an actor)."""

    def __init__(self, endpoint: Any, extra: dict[str, Any], defaults: dict[str, Any]):
        self._endpoint, self._extra, self._defaults = endpoint, extra, defaults

    def __getattr__(self, adverb: str) -> Any:
        call = getattr(self._endpoint, adverb)
        if not callable(call):
            return call
        return lambda *args, **kwargs: call(*args, **{**self._defaults, **kwargs, **self._extra})
