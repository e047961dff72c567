"""vLLM's engine inside the Generator's own process, stepped by one thread: how the Generator runs on CPU.

On GPUs the Generator uses vLLM's ``AsyncLLM``, whose EngineCore and model worker are two more processes.
On CPU those two processes cost more than they give (``bench/vs_trl.py``): vLLM's CPU platform
starts each with ``spawn``, so each imports vLLM again (~8 s apiece on two cores, most of the time from
``%forge_spawn`` to the first step), and both busy-wait (``sched_yield``) for a second after every message
they exchange, taking a core the trainer needs. :class:`InprocEngine` runs vLLM's ``LLMEngine`` with
its in-process client and the ``uni`` executor instead, so engine core, scheduler and model all live in
the actor's process, and gives the Generator the ``AsyncLLM`` calls it makes besides ``generate``:
``collective_rpc``, ``reset_prefix_cache``, ``add_lora``, ``remove_lora``, ``shutdown``, ``model_config`` and
``renderer``; in place of ``generate``, ``generate_many``: several requests that start in the same engine step
(one is a batch of one).

``LLMEngine`` is not thread-safe and its ``step()`` blocks, so one thread owns it: the actor's event loop
hands it work through a queue (add requests, abort them, run a worker method, drop the prefix cache) and
the thread steps the engine while any request is unfinished, resolving each request's future on the
actor's loop when it finishes. When nothing is unfinished the thread sleeps on the queue: no busy-wait.

The first time a machine's vLLM meets a model class it inspects the class in a Python process of its own, to
keep CUDA out of the engine's process (``_run_in_subprocess`` in ``vllm.model_executor.models.registry``), then
caches what it learnt under ``~/.cache/vllm/modelinfos``. That process imports vLLM again: 10 s of a first
``%forge_spawn`` on two cores (21 s against 11 s with the cache, the quickstart). On CPU there is no CUDA to
keep out and the engine imports the class anyway, so :func:`inspect_models_here` has vLLM inspect it in this
process while the engine is built (also where a CPU Generator runs vLLM's own processes); the cache is written as
before.

Considered: ``AsyncLLM`` with ``VLLM_ENABLE_V1_MULTIPROCESSING=0`` (it always starts an EngineCore process
in vLLM 0.32), and vLLM's ``LLM`` class (its ``generate`` takes a whole batch and returns when all of it
is done; the rollout loops submit groups one by one and must not wait for each other).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import queue
import threading
import weakref
from collections.abc import AsyncIterator, Callable, Iterator
from typing import Any

#: What the thread is handed: a function to run on the engine, and the future that gets its result.
_Work = tuple[Callable[[], Any], asyncio.Future | None]


class EngineStopped(RuntimeError):
    """The in-process engine failed or was shut down; the Generator treats it as a dead engine."""


class InprocEngine:
    """The ``AsyncLLM`` calls the Generator uses, on an ``LLMEngine`` stepped by a thread of this process."""

    def __init__(self) -> None:
        self._engine: Any = None
        self.model_config: Any = None
        self.renderer: Any = None
        self._loop = asyncio.get_running_loop()
        self._work: queue.SimpleQueue[_Work | None] = queue.SimpleQueue()
        self._finals: dict[str, asyncio.Future] = {}  # request id -> its final RequestOutput
        self._ids = itertools.count()
        self.steps = 0  #: engine steps taken (what shared a step shared the model's forward)
        self._dead: EngineStopped | None = None
        self._lock = threading.Lock()  # _dead is set and the queue drained together
        self._thread: threading.Thread | None = None

    @classmethod
    async def start(cls, engine_args: Any) -> InprocEngine:
        """Build the engine on its thread (tens of seconds for a hub model) and start stepping it there."""
        engine = cls()
        built = engine._loop.create_future()
        engine._thread = threading.Thread(target=engine._serve, args=(engine_args, built),
                                          name="forge_nb.vllm-engine", daemon=True)
        engine._thread.start()
        await built
        return engine

    async def generate_many(self, requests: list[tuple[Any, Any, str, Any]]) -> list[Any]:
        """The final output of each ``(engine_input, params, request_id, lora_request)``, in order, or the exception
        that refused or ended it. The requests reach the engine in one hand-over, so they start in the same engine
        step: handed over one by one as each prompt was tokenized, the first step of a quickstart batch often
        ran without its last requests (4.4 engine steps a batch where 4 do)."""
        ids = [f"{request_id}-{next(self._ids)}" for _, _, request_id, _ in requests]
        finals = {request_id: self._loop.create_future() for request_id in ids}
        self._finals.update(finals)

        def add_all() -> dict[str, Exception]:
            refused = {}
            for request_id, (engine_input, params, _, lora) in zip(ids, requests, strict=True):
                try:
                    self._engine.add_request(request_id, engine_input, params, lora_request=lora)
                except Exception as e:  # this request's own error (a bad prompt): the others go on
                    refused[request_id] = e
            return refused

        try:
            refused = await self._call(add_all)
            for request_id, error in refused.items():
                self._finals.pop(request_id, None)
                finals[request_id].set_exception(error)
            return await asyncio.gather(*finals.values(), return_exceptions=True)
        finally:
            unfinished = [request_id for request_id, final in finals.items() if not final.done()]
            for request_id in unfinished:  # cancelled by the caller: the engine stops working on them
                self._finals.pop(request_id, None)
            if unfinished:
                self._work.put((lambda: self._engine.abort_request(unfinished), None))

    async def collective_rpc(self, method: str, timeout: float | None = None, args: tuple = ()) -> list[Any]:
        return await self._call(lambda: self._engine.collective_rpc(method, timeout=timeout, args=args))

    async def reset_prefix_cache(self) -> bool:
        return await self._call(self._engine.reset_prefix_cache)

    async def add_lora(self, lora_request: Any) -> bool:
        return await self._call(lambda: self._engine.add_lora(lora_request))

    async def remove_lora(self, lora_id: int) -> bool:
        return await self._call(lambda: self._engine.remove_lora(lora_id))

    def shutdown(self) -> None:
        """Stop the thread after what it is doing, then the engine."""
        self._work.put(None)
        if self._thread is not None:
            self._thread.join(timeout=60)
        if self._engine is not None:
            self._engine.engine_core.shutdown()

    async def _call(self, fn: Callable[[], Any]) -> Any:
        done = self._loop.create_future()
        with self._lock:
            if self._dead is not None:
                raise EngineStopped(str(self._dead))
            self._work.put((fn, done))
        return await done

    def _build(self, engine_args: Any) -> None:
        import torch
        import torch._dynamo
        from vllm.v1.engine.llm_engine import LLMEngine

        from forge_nb.actors.engine import cpu_norm
        from forge_nb.system.processes import startup_gc

        startup_gc.keep_what_is_loaded()  # vLLM's engine collects garbage three times as it starts

        # One thread builds and steps the engine: OpenMP's thread count is per thread, and vLLM's CPU
        # attention checks that the count its metadata was built with is the one it runs with. vLLM's
        # multiprocess executor gives its worker every core but one (kept for the EngineCore process);
        # here that core is left to the rest of the machine (the trainer, on two cores).
        torch.set_num_threads(max(1, len(os.sched_getaffinity(0)) - 1))
        if engine_args.enforce_eager:
            # vLLM's sampler keeps two helpers under torch.compile even in eager mode (the rank of each
            # sampled token, which logprobs need, and a random sample). Their first call compiled them with
            # inductor: g++ runs and an ISA probe, ~2.8 s between the first batch and the first step on two
            # cores (bench/vs_trl.py). Eager they are one comparison and one sum.
            torch._dynamo.config.disable = True
            if cpu_norm.register():  # eager, vLLM's native norms are many small ops: its C kernels
                cpu_norm.prefer(engine_args)
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # read by from_engine_args: the in-process client
        engine_args.distributed_executor_backend = "uni"  # the model runs in this process, not a worker
        with inspect_models_here():
            self._engine = LLMEngine.from_engine_args(engine_args, enable_multiprocessing=False)
        self.model_config = self._engine.model_config
        self.renderer = self._engine.renderer

    def _serve(self, engine_args: Any, built: asyncio.Future) -> None:
        try:
            self._build(engine_args)
        except BaseException as e:
            self._settle(built, e)
            return
        self._settle(built, None)
        try:
            self._step_until_shutdown()
            error = EngineStopped("the vLLM engine was shut down")
        except BaseException as e:  # a failed step (the Generator then ends its process)
            error = EngineStopped(f"the vLLM engine stopped: {type(e).__name__}: {e}")
        with self._lock:  # every request waiting, and all work handed over and not run, learns it
            self._dead = error
            for final in list(self._finals.values()):
                self._settle(final, error)
            self._finals.clear()
            while True:
                try:
                    item = self._work.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    self._settle(item[1], error)

    def _step_until_shutdown(self) -> None:
        while True:
            busy = self._engine.has_unfinished_requests()
            try:
                item = self._work.get(block=not busy)  # idle: sleep until work arrives
                while True:  # everything handed over so far, before the next engine step
                    if item is None:
                        return
                    self._run(*item)
                    item = self._work.get_nowait()
            except queue.Empty:
                pass
            if self._engine.has_unfinished_requests():
                done = [(self._finals.pop(o.request_id, None), o) for o in self._engine.step() if o.finished]
                self.steps += 1
                if done:  # one wake-up of the actor's loop for all the requests this step finished
                    self._settle_all(done)

    def _run(self, fn: Callable[[], Any], done: asyncio.Future | None) -> None:
        try:
            result: Any = fn()
        except Exception as e:
            result = e
            if done is None:
                return
        self._settle(done, result)

    def _settle(self, future: asyncio.Future | None, result: Any) -> None:
        self._settle_all([(future, result)])

    def _settle_all(self, results: list[tuple[asyncio.Future | None, Any]]) -> None:
        """Resolve each future (None: its request was aborted) with its result, on the actor's loop."""

        def settle() -> None:
            for future, result in results:
                if future is None or future.done():
                    continue
                if isinstance(result, BaseException):
                    future.set_exception(result)
                else:
                    future.set_result(result)

        self._loop.call_soon_threadsafe(settle)


@contextlib.contextmanager
def inspect_models_here() -> Iterator[None]:
    """Meanwhile vLLM inspects a model class it has not cached in this process, not in a new one (see the
    module docstring). Only for engines without CUDA: vLLM's subprocess is there to keep CUDA out of the
    process that inspects. Where vLLM has no such function (another version), nothing changes."""
    from vllm.model_executor.models import registry

    in_subprocess = getattr(registry, "_run_in_subprocess", None)
    if in_subprocess is None:
        yield
        return
    registry._run_in_subprocess = lambda fn: fn()
    try:
        yield
    finally:
        registry._run_in_subprocess = in_subprocess


class AloneGate:
    """Lets requests that must have an engine to themselves wait for it to empty, and holds the others back
    meanwhile; the others share it as before.

    Why: vLLM 0.32 maps a LoRA batch's adapters to the logits one row a sequence, while prompt logprobs take a row
    a prompt token, so a request with an adapter that asks for prompt logprobs, in an engine step with other
    requests, fails the step and the engine with it (``einsum(): subscript b has size 33 ... does not broadcast``;
    vllm#16668 and vllm#29955): a Tinker ``compute_logprobs`` while the served run's rollouts were in the engine killed
    the generator. Alone, such a request is served. A request waiting to go alone holds new ones back, so the
    rollouts that keep an engine busy cannot starve it."""

    def __init__(self) -> None:
        self._sharing = 0
        self._alone = False
        self._waiting_alone = 0
        self._changed = asyncio.Condition()

    @contextlib.asynccontextmanager
    async def entered(self, alone: bool) -> AsyncIterator[None]:
        async with self._changed:
            if alone:
                self._waiting_alone += 1
                try:
                    await self._changed.wait_for(lambda: not self._alone and not self._sharing)
                finally:
                    self._waiting_alone -= 1
                self._alone = True
            else:
                await self._changed.wait_for(lambda: not self._alone and not self._waiting_alone)
                self._sharing += 1
        try:
            yield
        finally:
            async with self._changed:
                if alone:
                    self._alone = False
                else:
                    self._sharing -= 1
                self._changed.notify_all()


_gates: weakref.WeakKeyDictionary[Any, AloneGate] = weakref.WeakKeyDictionary()


async def final_outputs(engine: Any, requests: list[tuple[Any, Any, str, Any]]) -> list[Any]:
    """The final output of each ``(engine_input, params, request_id, lora_request)``, or its exception: added to
    the engine in one go where the engine can (``InprocEngine.generate_many``), else one ``generate`` each. A
    request with an adapter that asks for prompt logprobs has the engine to itself (``AloneGate``), even apart
    from the requests it came with, and is refused with n > 1: its samples are sequences of one step, which fails
    as above."""
    if not requests:  # every prompt of the call failed before the engine (each answers its own error)
        return []
    alone = [params.prompt_logprobs is not None and lora is not None for _, params, _, lora in requests]
    if any(alone) and len(requests) > 1:
        return [out for (out,) in await asyncio.gather(*(final_outputs(engine, [r]) for r in requests))]
    if alone[0] and requests[0][1].n > 1:
        return [ValueError(f"prompt_logprobs with n={requests[0][1].n}: with an adapter, vLLM 0.32 fails the engine "
                           "over prompt logprobs of several sequences at once (vllm#16668); ask for them with n=1 "
                           "and sample the others apart")]
    async with _gates.setdefault(engine, AloneGate()).entered(alone[0]):
        if isinstance(engine, InprocEngine):
            return await engine.generate_many(requests)

        async def final(engine_input: Any, params: Any, request_id: str, lora: Any) -> Any:
            outputs = [o async for o in engine.generate(engine_input, params, request_id, lora_request=lora)]
            return outputs[-1]  # FINAL_ONLY: the one output

        return await asyncio.gather(*(final(*request) for request in requests), return_exceptions=True)
