"""A run's policy while its generators start: the trainer answers the rollouts until they serve.

::

    spawn ──> trainer up ──> the Run is returned; its loops may start
                  run.policy.generate.route(prompt) ──> trainer.generate: the policy as it is (training.sample)
    generators: vLLM imported, engine built ──> catch up to the run's pushed version ──> healthy
                  run.policy.generate.route(prompt) ──> the generators' service, as in any run

On a small machine the generators' start (vLLM's import and the engine's build) is the longest chain from a
run's launch to its first step: the quickstart's trainer is up seconds sooner and would wait for them. With a
stand-in it samples the first groups itself (the calls that wait meanwhile go out together: ``_TrainerCalls``),
trains on them, and pushes its versions as any run does. Nothing downstream can tell the two sources apart: the
trainer returns the Completions a Generator returns, each with the version (trainer step) that sampled it, so the
buffer's ``max_policy_age`` applies to them as to any; their ``metadata["served_by"]`` is ``"trainer"`` and a
step's row counts them (``rollout/from_trainer``).

The generators load the run's newest pushed version before they take a request: the service's catch-up hook
(``WeightSync.catch_up``) runs in each replica's first start, and loads again if a push landed meanwhile. Until
a replica is healthy a weight load has nothing to reach (``update_weights.fanout`` is a no-op). While one is, every
call goes to the service (while none is, as during the respawn of a run's only replica, the trainer samples again);
the first time, a "generators_up" event says with which version and after how many groups from the trainer. A
call the trainer cannot honour (a sampling parameter outside ``training.sample.SAMPLED_HERE``, an endpoint other
than ``generate``, which waits for their whole start, every replica up, as after a spawn that waited for them)
goes to the generators. A start that fails is raised by every later ``generate`` (the run stops with it);
``await run.policy.started()`` waits for the start and raises its error.

Everything else (``replicas``, ``status()``, ``subscribe``, ``set_catch_up``...) is the generators' service's own.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

from forge_nb.actors.training.sample import not_sampled_here
from forge_nb.service import Service

__all__ = ["StandInPolicy", "stands_in"]

logger = logging.getLogger(__name__)

#: The policies (their ids) whose ``session()`` the current task is in, begun before their generators served: its
#: calls stay on their trainer.
_ON_TRAINER: contextvars.ContextVar[frozenset[int]] = contextvars.ContextVar("forge_nb_on_trainer",
                                                                             default=frozenset())


def stands_in(trainer_cls: type, procs: int, generator_cls: type) -> bool:
    """Whether a run's trainer can sample its rollouts while its generators start: forge_nb's vLLM generators
    (or a subclass's: another class's completions may be of another kind), and a trainer of one proc whose class
    has ``generate_many`` (forge_nb's ``RLTrainer``)."""
    from forge_nb.actors.generator import Generator

    return procs == 1 and issubclass(generator_cls, Generator) and "generate_many" in trainer_cls.endpoint_names()


class _TrainerCalls:
    """The stand-in's calls to the trainer: one ``generate_many`` in flight at a time, and the calls that arrive
    meanwhile go out together in the next (those with equal sampling values in one call). A call of four prompts
    costs the tiny model about what one prompt's does (7 ms), so the quickstart's rollout loops, whose calls come
    a few at a time, would otherwise queue small calls at the trainer, which also trains. A call that fails fails
    every caller it carried (a trainer's death, a prompt it cannot read)."""

    def __init__(self) -> None:
        self.trainer: Any = None
        self._pending: list[tuple[Any, dict[str, Any], asyncio.Future[Any]]] = []
        self._sending: asyncio.Task[None] | None = None

    async def route(self, prompt: Any, values: dict[str, Any]) -> Any:
        answer = asyncio.get_running_loop().create_future()
        self._pending.append((prompt, values, answer))
        if self._sending is None or self._sending.done():
            self._sending = asyncio.get_running_loop().create_task(self._send(), name="forge_nb.stand_in.send")
        return await answer

    async def _send(self) -> None:
        while self._pending:
            pending, self._pending = self._pending, []
            groups: list[tuple[dict[str, Any], list[tuple[Any, asyncio.Future[Any]]]]] = []
            for prompt, values, answer in pending:
                members = next((m for v, m in groups if v == values), None)
                if members is None:
                    members = []
                    groups.append((values, members))
                members.append((prompt, answer))
            for values, members in groups:
                try:
                    results = await self.trainer.generate_many.call_one([p for p, _ in members], **values)
                except Exception as error:
                    results = [error] * len(members)
                for (_, answer), result in zip(members, results, strict=True):
                    if answer.done():  # its caller was cancelled meanwhile
                        continue
                    if isinstance(result, Exception):
                        answer.set_exception(result)
                    else:
                        answer.set_result(result)


class StandInPolicy:
    """``run.policy``: the generators' service (prepared, not yet started), with the run's ``trainer`` answering
    ``generate.route`` until it serves (see the module docstring). ``sampling``: what the generators were spawned
    with, under every call's own overrides."""

    def __init__(self, service: Service, sampling: dict[str, Any]):
        self.service = service
        # read on every attribute this class has not (``ctl.policy.replicas`` a few times per rollout): listing a
        # class's endpoints walks all its attributes (dir), ~0.4 ms of the kernel's CPU a step when done each time
        self._after_start = frozenset(service.actor_cls.endpoint_names())
        self._calls = _TrainerCalls()
        self.trainer_groups = 0  #: groups the trainer sampled
        self.error: BaseException | None = None  #: why the generators failed to start
        self._sampling = dict(sampling)
        self._starting: asyncio.Task[None] | None = None
        self._keeping: asyncio.Task[None] | None = None  # the cores kept for the generators' start (keep_cores)
        self._when_started: list[Callable[[StandInPolicy], None]] = []
        self.generate = _Generate(self)
        self.update_weights = _UpdateWeights(self)

    def begin(self, setup_after: asyncio.Future[Any] | None = None) -> None:
        """Start the generators' replicas in the background (``Service.begin``)."""
        self._starting = asyncio.get_running_loop().create_task(
            self._start(setup_after), name=f"forge_nb.{self.service.name}.start")
        self._starting.add_done_callback(lambda t: t.cancelled() or t.exception())  # kept in ``error``

    def keep_cores(self, reservation: contextlib.AbstractAsyncContextManager[Any]) -> None:
        """Hold ``reservation`` (``start_cores.generators_first``) until the generators serve or fail: once the
        trainer is up, their start is what the run's steps wait for to go faster (the trainer samples and trains in
        one process; with them serving it trains while they sample)."""
        async def hold() -> None:
            async with reservation:
                if self._starting is not None:
                    await asyncio.wait({self._starting})

        self._keeping = asyncio.get_running_loop().create_task(hold(), name="forge_nb.stand_in.cores")

    async def _start(self, setup_after: asyncio.Future[Any] | None) -> None:
        try:
            await self.service.begin(setup_after=setup_after)
        except BaseException as error:  # begin stopped what it had started
            self.error = error
            logger.error("the generators failed to start: %s: %s", type(error).__name__, error)
            raise
        finally:
            for callback in self._when_started:
                callback(self)

    def when_started(self, callback: Callable[[StandInPolicy], None]) -> None:
        """``callback(self)`` once the generators serve, or failed to start (``error`` says why); at once if they
        did already."""
        if self._starting is not None and self._starting.done():
            callback(self)
        else:
            self._when_started.append(callback)

    @property
    def trainer(self) -> Any:
        """The run's trainer (an ActorHandle), once it is up."""
        return self._calls.trainer

    @trainer.setter
    def trainer(self, handle: Any) -> None:
        self._calls.trainer = handle

    @property
    def serving(self) -> bool:
        """Whether a generator serves now: then every call goes to the service, else to the trainer."""
        return any(r.healthy for r in self.service.replicas)

    async def started(self) -> None:
        """Return once the generators serve; raise their start's error if it failed."""
        if self._starting is not None:
            await asyncio.shield(self._starting)

    async def shutdown(self) -> None:
        """Stop the generators: a start in flight finishes first (its replicas' processes are then stopped too)."""
        if self._starting is not None:
            await asyncio.wait({self._starting})
            with contextlib.suppress(BaseException):
                self._starting.result()  # read, so asyncio does not report it unread
        if self._keeping is not None:
            await asyncio.wait({self._keeping})
        if self.error is None:  # a failed start stopped itself
            await self.service.shutdown()

    @contextlib.asynccontextmanager
    async def session(self, affinity: Any = None) -> AsyncIterator[None]:
        """The service's ``session()``; one that begins before the generators serve stays on the trainer (the turns
        of one episode from one sampler and version)."""
        if self.serving:
            async with self.service.session(affinity):
                yield
            return
        token = _ON_TRAINER.set(_ON_TRAINER.get() | {id(self)})
        try:
            yield
        finally:
            _ON_TRAINER.reset(token)

    def failed(self) -> RuntimeError:
        """What a call raises once the generators failed to start (the words of a spawn that failed)."""
        return RuntimeError(f"service 'policy' failed to start: {type(self.error).__name__}: {self.error}")

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or "_after_start" not in self.__dict__:
            raise AttributeError(name)
        service = self.__dict__["service"]
        if name in self._after_start:  # the generators' other endpoints: after their start
            return _AfterStart(self, name)
        return getattr(service, name)

    def __repr__(self) -> str:
        return f"<{self.service!r}, the trainer standing in until it serves>"


class _AfterStart:
    """``run.policy.<endpoint>`` of the generators': its calls wait for their whole start (every replica up, as a spawn
    that waited for them left them), then go to the service."""

    def __init__(self, front: StandInPolicy, name: str):
        self._front, self._name = front, name

    def __getattr__(self, adverb: str) -> Any:
        target = getattr(getattr(self._front.service, self._name), adverb)

        async def after_start(*args: Any, **kwargs: Any) -> Any:
            await self._front.started()
            return await target(*args, **kwargs)

        return after_start


class _Generate(_AfterStart):
    """``run.policy.generate``: the trainer's ``generate`` until the generators serve, then theirs."""

    def __init__(self, front: StandInPolicy):
        super().__init__(front, "generate")

    async def route(self, prompt: Any, **overrides: Any) -> Any:
        front = self._front
        if front.error is not None:
            raise front.failed() from front.error
        values = front._sampling | overrides
        if not_sampled_here(values) or (front.serving and id(front) not in _ON_TRAINER.get()):
            return await front.service.generate.route(prompt, **overrides)
        front.trainer_groups += 1
        return await front._calls.route(prompt, values)


class _UpdateWeights(_AfterStart):
    """``run.policy.update_weights``: nothing to load until a generator is up (each loads the run's version as it
    comes up: its catch-up), then the generators' own."""

    def __init__(self, front: StandInPolicy):
        super().__init__(front, "update_weights")

    async def fanout(self, *args: Any, **kwargs: Any) -> list[Any]:
        if not self._front.serving:
            return []
        return await self._front.service.update_weights.fanout(*args, **kwargs)
