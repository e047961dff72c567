"""Concurrent ``route()`` calls of one endpoint, sent as one message per replica.

An actor class may name, for an endpoint that takes one item and keyword options, a second endpoint that
takes a list of items with the same options and returns one answer per item, an exception instance where
that item failed (best an ``ActorError`` made where it was raised, which keeps its traceback; any other is
wrapped in one, so that a gathered call raises what a call of its own would)::

    class Generator(ForgeActor):
        batched_endpoints = {"generate": "generate_many"}

A service of such a class (one proc per replica) gathers the ``route()`` calls of ``generate`` made in one
turn of the event loop, outside a session: those with equal keyword arguments go out as ``generate_many``,
split over the healthy replicas (as many messages as replicas, or fewer), and each caller gets its own
answer or its own exception, as if it had been routed alone. A call with nothing beside it goes out as
itself, unchanged. The quickstart's rollout loops wake together when a batch answers, so their next
prompts go out together again: one message to the generator a step instead of one per group, and the
engine starts the groups in the same step (``bench/vs_trl.py``).

A batch is one request to ``_route``: if its replica dies, the batch is retried elsewhere as a single call
would be, and a caller cancelled meanwhile only stops waiting (the others get their answers).

Considered: batching on the replica's side (Ray Serve's ``@serve.batch``: the messages still travel one by
one, and their cost in the kernel and the actor is what this saves); a batch endpoint the episode code calls
itself (TorchForge's ``generate_episode`` routes one prompt a call, and must run as it is written).
"""

from __future__ import annotations

import asyncio
from typing import Any

from monarch.actor import ActorError


class Coalescer:
    """Gathers one service endpoint's concurrent ``route()`` calls (see the module docstring)."""

    def __init__(self, service: Any, endpoint: str, batch_endpoint: str):
        """``service``: the ``forge_nb.service.Service`` whose calls these are (its ``_route`` and ``replicas``)."""
        self.service, self.endpoint, self.batch_endpoint = service, endpoint, batch_endpoint
        self._pending: list[tuple[Any, dict[str, Any], asyncio.Future[Any]]] = []
        self._sending: set[asyncio.Task[None]] = set()  # referenced until done
        self.batches = 0  #: messages sent as the batch endpoint (for tests and benchmarks)

    async def route(self, item: Any, kwargs: dict[str, Any]) -> Any:
        loop = asyncio.get_running_loop()
        answer = loop.create_future()
        if not self._pending:
            loop.call_soon(self._flush)  # after every call made in this turn of the loop
        self._pending.append((item, kwargs, answer))
        return await answer

    def _flush(self) -> None:
        pending, self._pending = self._pending, []
        groups: list[tuple[dict[str, Any], list[tuple[Any, asyncio.Future[Any]]]]] = []
        for item, kwargs, answer in pending:
            if answer.done():  # its caller was cancelled meanwhile
                continue
            same = next((members for options, members in groups if _equal(options, kwargs)), None)
            if same is None:
                groups.append((kwargs, [(item, answer)]))
            else:
                same.append((item, answer))
        healthy = sum(1 for r in self.service.replicas if r.healthy)
        for options, members in groups:
            for chunk in split(members, max(1, healthy)):
                task = asyncio.ensure_future(self._send(options, chunk))
                self._sending.add(task)
                task.add_done_callback(self._sending.discard)

    async def _send(self, options: dict[str, Any], chunk: list[tuple[Any, asyncio.Future[Any]]]) -> None:
        answers = [answer for _, answer in chunk]
        try:
            if len(chunk) == 1:
                results = [await self.service._route(self.endpoint, (chunk[0][0],), options)]
            else:
                self.batches += 1
                results = await self.service._route(self.batch_endpoint, ([item for item, _ in chunk],), options)
                if len(results) != len(chunk):
                    raise RuntimeError(f"{self.service.name}.{self.batch_endpoint} answered {len(results)} "
                                       f"items for {len(chunk)}")
        except asyncio.CancelledError:
            for answer in answers:
                answer.cancel()
            raise
        except BaseException as error:  # what a single call would have raised, to every caller of the batch
            for answer in answers:
                if not answer.done():
                    answer.set_exception(error)
            return
        for answer, result in zip(answers, results, strict=True):
            if answer.done():
                continue
            if isinstance(result, BaseException):  # raised as a call of its own raises it: an ActorError
                answer.set_exception(result if isinstance(result, ActorError) else ActorError(result))
            else:
                answer.set_result(result)


def _equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two calls' keyword arguments are the same (values that cannot say so, e.g. tensors: not)."""
    try:
        return bool(a == b)
    except Exception:
        return False


def split(members: list[Any], n: int) -> list[list[Any]]:
    """``members`` in at most ``n`` chunks of nearly equal size, in order."""
    n = min(n, len(members))
    size, extra = divmod(len(members), n)
    chunks, start = [], 0
    for i in range(n):
        end = start + size + (i < extra)
        chunks.append(members[start:end])
        start = end
    return chunks
