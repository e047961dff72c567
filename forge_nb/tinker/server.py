"""TinkerServer: the Tinker API (the ``tinker`` SDK's wire format, pinned to 0.38.0) in front of a LoRA run, in the
kernel. ``server = await run.serve_tinker()`` (or ``%forge_serve --tinker``), then, in any cell or process::

    service = tinker.ServiceClient(base_url=server.url, api_key=server.token)
    training = service.create_lora_training_client(base_model=server.base_model, rank=8)

Each training client is a LoRA run on the served run's base (``forge_nb.tinker.models``); its ``forward_backward``,
``optim_step``, ``save_weights_for_sampler``, ``save_state`` / ``load_state`` and its sampling clients' ``sample``
land on that run's trainer and the shared generators, while the notebook watches the run as any other.

The routes are the SDK's (``tinker/resources``): calls that do work answer a request id at once and the SDK fetches
the result with ``retrieve_future`` (``forge_nb.tinker.futures``); bodies are read and written with the SDK's own
pydantic types and protobuf messages (``forge_nb.tinker.wire``). What the SDK asks of a server beyond that is
answered as a server without those features answers (``forge_nb.tinker.edge``, with the token check and the error
shape every request goes through). It leaves on the SDK's default HTTP transport, pyqwest (reqwest/hyper, in Rust):
its requests cost the caller's process less Python than httpx's, Python that runs beside the trainer's work
(``bench/tinker_api.py``'s quickstart step measured 0.8 to 1.4 ms faster with it than with httpx, side by side on
two cores).

**Threads.** The server answers on a thread of its own (its own event loop), and hands the work on a run to the
kernel's event loop, where the run's services live: each call goes there while its request id is being answered,
and its result comes back to the server's loop, where a waiting ``retrieve_future`` answers it, the moment it is
done (one hop each way, ``forge_nb.tinker.threads``; a result is encoded on the server's thread). So the SDK's
synchronous calls that only talk to the server (``tinker.ServiceClient(...)``, ``get_info``, ``get_tokenizer``) work
in a cell as they are; a call that trains or samples needs the kernel's loop, which a cell blocked on ``.result()``
holds: in a cell, ``await`` the SDK's calls (every one returns an awaitable), and run synchronous client code (a
script, the cookbook's ``main``) in a thread (``await asyncio.to_thread(...)``). A call that finds the kernel's loop
blocked for 30 s (``threads.BLOCKED_S``) fails with a message that says this, instead of hanging the kernel.

**Who can reach it.** It binds 127.0.0.1 only, and every request must carry ``X-API-Key: <token>`` (the SDK's
``api_key``; a random ``tml-...`` token made for this server, compared in constant time), else 401. Whoever holds
the token can train adapters on the run's base and sample from them; it reads and writes nothing outside the run
directories of the runs it spawns. It stops when the served run shuts down, and its clients' runs with it.

Errors: a request the server cannot take is answered 400 in the SDK's error shape (``{"error", "category"}``); a
call that fails answers that shape from ``retrieve_future``, ``category`` "user" for a refusal (an unknown loss,
Datums of disagreeing lengths, a base model other than the run's, an image chunk, a path that does not exist) and
"server" for a failure of the run; the SDK raises either as ``RequestFailedError`` with the message.

Considered: FastAPI (SkyRL's choice), which would add a second web stack beside the aiohttp the OpenAI endpoint
runs on the kernel's loop (``forge_nb.agents.server`` says why aiohttp), for routes whose bodies the SDK's own
pydantic models validate anyway.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import secrets
from pathlib import Path
from typing import Any

from aiohttp import web
from tinker import types
from tinker.proto import tinker_public_pb2 as pb

from forge_nb.controller.outside import calls_allowed, drive_from_outside, record_outside_sample
from forge_nb.models import load_tokenizer
from forge_nb.rl.losses.tinker import TINKER_LOSSES
from forge_nb.system.local_http import serve_local
from forge_nb.tinker import wire
from forge_nb.tinker.edge import PREFIX, SESSION_ROUTES, Tally, guard, json_of, read_body, refused
from forge_nb.tinker.futures import Futures, Outcome
from forge_nb.tinker.models import (
    BaseLane,
    SamplingSession,
    TrainingModel,
    lora_section,
    new_id,
    resolve_state,
    sampler_path,
)
from forge_nb.tinker.threads import ServerThread

logger = logging.getLogger(__name__)

__all__ = ["TinkerServer"]

class TinkerServer:
    """See the module docstring. ``url``, ``token``, ``base_model``, ``models`` (model id -> TrainingModel)."""

    def __init__(self, run: Any, spawn: Any, *, token: str) -> None:
        if run.base is None:
            raise ValueError(f"run {run.name!r} trains the whole model; the Tinker API trains LoRA adapters on a "
                             "run's base: spawn the run with trainer.lora (e.g. --lora 8)")
        self.run, self._spawn, self.token = run, spawn, token
        # the name clients give as base_model: the hub id, or for a tiny model built here its folder, which
        # AutoTokenizer (the SDK's get_tokenizer, the cookbook's) loads offline
        self.base_model: str = str(run.model) if run.config.model == "tiny" else run.config.model
        self._clients = 0  # training clients made so far (their runs are numbered after it)
        self.limits = wire.Limits.of(run.model, run.config.engine_args().get("max_model_len"))  # what it takes
        self._base = BaseLane(run)
        self._thread = ServerThread(f"forge_nb.{run.name}.tinker")  # where the server answers (runs: the kernel's)
        self.futures = Futures(self._thread, f"{run.name}-tinker")
        self.models: dict[str, TrainingModel] = {}
        self.sessions: dict[str, SamplingSession] = {}
        self.tally = Tally()  # requests, and those refused (the token, a bad body, an unknown id)
        self._runner: web.AppRunner | None = None
        self.host, self.port = "127.0.0.1", 0

    @classmethod
    async def start(cls, run: Any, spawn: Any, *, port: int = 0, token: str | None = None) -> TinkerServer:
        """Serve the Tinker API for ``run`` on 127.0.0.1:``port`` (0: a free one). ``spawn(cfg, overrides=)``
        spawns a run on ``run``'s base (``forge_nb.spawn`` with ``base=run``)."""
        server = cls(run, spawn, token=token or f"tml-{secrets.token_urlsafe(24)}")
        thread = server._thread
        try:
            await thread.call(server._serve(port))
        except BaseException:
            await thread.stop()
            raise
        return server

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def serving(self) -> bool:
        return self._runner is not None

    def status(self) -> dict[str, Any]:
        return {"url": self.url, "base_model": self.base_model, "serving": self.serving,
                "requests": self.tally.requests, "refused": self.tally.refused,
                "clients": {m.model_id: m.run.name for m in self.models.values()},
                "sampling_sessions": len(self.sessions), "in_flight": self.futures.in_flight()}

    async def stop(self) -> None:
        """Stop serving (from the kernel's loop); every training client's run shuts down (its adapter leaves the
        base)."""
        if self._thread.running:
            await self._thread.call(self._close_http())
        await self._thread.stop()
        models, self.models = list(self.models.values()), {}
        self.sessions.clear()
        await asyncio.gather(*(m.run.shutdown() for m in models), return_exceptions=True)
        with contextlib.suppress(Exception):  # the generators may be going with the run already
            await self._base.drop()

    async def close_client(self, model_id: str) -> None:
        """End a training client (from the kernel's loop): its run shuts down, its adapter leaves the base, and its
        sampling sessions go."""
        model = self.models.pop(model_id, None)
        if model is not None:
            for session_id in [k for k, v in self.sessions.items() if v.model is model]:
                del self.sessions[session_id]
            await model.run.shutdown()

    async def _close_http(self) -> None:
        runner, self._runner = self._runner, None
        await self.futures.close()
        if runner is not None:
            await runner.cleanup()

    # -- serving ---------------------------------------------------------------------------------------

    async def _serve(self, port: int) -> None:
        app = web.Application(middlewares=[guard(self.token, self.tally)], client_max_size=256 * 2**20)
        for (method, path), handler in SESSION_ROUTES.items():
            app.router.add_route(method, f"{PREFIX}/{path}", handler)
        posts = {"create_model": self._create_model, "get_info": self._get_info,
                 "forward_backward": self._forward_backward, "optim_step": self._optim_step,
                 "save_weights_for_sampler": self._save_for_sampler, "save_weights": self._save_weights,
                 "load_weights": self._load_weights, "create_sampling_session": self._create_sampling_session,
                 "asample": self._asample, "retrieve_future": self._retrieve, "unload_model": self._unload}
        for path, handler in posts.items():
            app.router.add_post(f"{PREFIX}/{path}", handler)
        app.router.add_get(f"{PREFIX}/get_server_capabilities", self._capabilities)
        app.router.add_get(f"{PREFIX}/samplers/{{sampler_id}}", self._get_sampler)
        self._runner, self.port = await serve_local(app, self.host, port, self.run.name)
        logger.info("Tinker API of run %s at %s", self.run.name, self.url)

    def _model(self, model_id: str) -> TrainingModel:
        model = self.models.get(model_id)
        if model is None:
            raise KeyError(f"no training client {model_id!r} on this server (it has {sorted(self.models)})")
        return model

    def _submit(self, kind: str, work: Any, model: TrainingModel | None = None) -> web.Response:
        """Start ``work`` on the kernel's loop (after ``model``'s earlier calls, once its run is not paused) and
        answer its request id."""
        async def on_kernel() -> Outcome:
            if model is not None:
                await calls_allowed(model.run.controller)  # %forge_pause holds the call here
            return await work()

        request_id = self.futures.submit(kind, on_kernel, lane=model.lane if model is not None else None)
        return web.json_response({"request_id": request_id, **({"model_id": model.model_id} if model else {})})

    # -- the served model ------------------------------------------------------------------------------

    async def _capabilities(self, request: web.Request) -> web.Response:
        model = types.SupportedModel(model_name=self.base_model, trainable=True, sampleable=True,
                                     max_context_length=self.run.config.max_req_tokens + self.run.config.max_res_tokens)
        return json_of(types.GetServerCapabilitiesResponse(supported_models=[model]))

    # -- training clients ------------------------------------------------------------------------------

    async def _create_model(self, request: web.Request) -> web.Response:
        body = await read_body(request, types.CreateModelRequest)
        model_id = f"{body.session_id}:train:{body.model_seq_id}"  # as the SDK derives it (create via load_weights)

        async def create() -> Outcome:
            self._check_base(body.base_model)
            await self._new_model(model_id, lora_section(body.lora_config))
            return Outcome(json=types.CreateModelResponse(model_id=model_id).model_dump(mode="json"))

        return self._submit("create_model", create)

    def _check_base(self, base_model: str | None) -> None:
        if base_model not in (None, self.base_model, self.run.config.model):
            raise wire.TinkerRefusal(f"base_model={base_model!r}: this server trains adapters on {self.base_model!r} "
                                     "only (the served run's base)")

    async def _new_model(self, model_id: str, lora: dict[str, Any], name: str | None = None) -> TrainingModel:
        """A training client's run on the served run's base (on the kernel's loop), driven by its calls alone.
        ``name``: the run's (a state's adapter loads into a run of the name that saved it: the adapter is named
        after the run's weights namespace)."""
        if model_id in self.models:
            raise wire.TinkerRefusal(f"model {model_id!r} exists already")
        if name is not None and any(m.run.name == name for m in self.models.values()):
            raise wire.TinkerRefusal(f"the training client that saved this state (run {name!r}) is still open: "
                                     "load_state on it, or close it first")
        self._clients += 1
        name = name or f"{self.run.name}-tinker-{self._clients}"
        config = dataclasses.replace(self.run.config, name=name, run_dir=str(self._runs_root / name), exporters={})
        try:
            run = await self._spawn(config, overrides={"trainer.lora": lora})
        except ValueError as e:  # no room on the base's generators, a rank they cannot serve: the caller's to fix
            raise wire.TinkerRefusal(str(e)) from None
        await drive_from_outside(run.controller)
        model = self.models[model_id] = TrainingModel(model_id, run, lora)
        run.metrics.event("tinker", model_id=model_id, rank=lora["rank"], server=self.url)
        return model

    async def _get_info(self, request: web.Request) -> web.Response:
        body = await read_body(request, types.GetInfoRequest)
        model = self._model(body.model_id)
        return json_of(types.GetInfoResponse(
            model_id=model.model_id, model_name=self.base_model, is_lora=True, lora_rank=model.lora["rank"],
            model_data=types.ModelData(arch=self.run.config.model, model_name=self.base_model,
                                       tokenizer_id=str(self.run.model))))

    async def _forward_backward(self, request: web.Request) -> web.Response:
        message = pb.ForwardBackwardRequest()
        try:
            message.ParseFromString(await request.read())
        except Exception:
            raise ValueError("the body is not a ForwardBackwardRequest (protobuf)") from None
        model = self._model(message.model_id)
        loss_fn, backward = message.loss_fn, not message.forward_only

        async def run() -> Outcome:
            if loss_fn not in TINKER_LOSSES:
                raise wire.TinkerRefusal(f"loss_fn={loss_fn!r}: this server serves {sorted(TINKER_LOSSES)}")
            datums = wire.datums_from_proto(message, self.limits)
            result = await model.forward_backward(datums, loss_fn, wire.loss_config(message), backward)
            return Outcome(encode=lambda: wire.forward_backward_output(result))

        return self._submit("forward_backward" if backward else "forward", run, model)

    async def _optim_step(self, request: web.Request) -> web.Response:
        body = await read_body(request, types.OptimStepRequest)
        model = self._model(body.model_id)
        if not isinstance(body.optim_params, types.AdamParams):
            raise ValueError(f"optim_step: {type(body.optim_params).__name__}; this server's trainers step with Adam "
                             "(AdamParams)")
        adam = body.optim_params.model_dump()

        async def step() -> Outcome:
            metrics = await model.optim_step(adam)
            return Outcome(json=types.OptimStepResponse(metrics=metrics).model_dump(mode="json"))

        return self._submit("optim_step", step, model)

    async def _save_for_sampler(self, request: web.Request) -> web.Response:
        body = await read_body(request, types.SaveWeightsForSamplerRequest)
        model = self._model(body.model_id)

        async def save() -> Outcome:
            version = await model.save_for_sampler()
            if body.path is not None:
                path = sampler_path(model.model_id, body.path)
                model.samplers[path] = version
                return Outcome(json={"path": path, "type": "save_weights_for_sampler"})
            return Outcome(json={"sampling_session_id": self._new_session(model, version),
                                 "type": "save_weights_for_sampler"})

        return self._submit("save_weights_for_sampler", save, model)

    async def _save_weights(self, request: web.Request) -> web.Response:
        body = await read_body(request, types.SaveWeightsRequest)
        model = self._model(body.model_id)
        name = body.path or f"step-{model.run.current_step}"
        if "/" in name or name in ("", ".", ".."):
            raise ValueError(f"path={body.path!r}: a name without '/'")

        async def save() -> Outcome:
            path = await model.save_state(name, self._runs_root)
            return Outcome(json=types.SaveWeightsResponse(path=path, type="save_weights").model_dump(mode="json"))

        return self._submit("save_weights", save, model)

    async def _load_weights(self, request: web.Request) -> web.Response:
        body = await read_body(request, types.LoadWeightsRequest)
        if body.model_id is not None:  # a training client's load_state
            model = self._model(body.model_id)

            async def load() -> Outcome:
                await model.load_state(body.path, body.optimizer, self._runs_root)
                return Outcome(json={"path": body.path, "model_id": model.model_id, "type": "load_weights"})

            return self._submit("load_weights", load, model)
        if body.session_id is None or body.model_seq_id is None:
            raise ValueError("load_weights: give model_id, or session_id and model_seq_id (a new training client)")
        model_id = f"{body.session_id}:train:{body.model_seq_id}"

        async def create_and_load() -> Outcome:  # create_training_client_from_state(_with_optimizer)
            self._check_base(body.base_model)
            saved = resolve_state(body.path, self._runs_root)
            model = await self._new_model(model_id, saved["lora"], saved["run"])
            await model.load_state(body.path, body.optimizer, self._runs_root)
            return Outcome(json={"path": body.path, "model_id": model_id, "type": "load_weights"})

        return self._submit("load_weights", create_and_load)

    async def _unload(self, request: web.Request) -> web.Response:
        body = await read_body(request, types.UnloadModelRequest)
        model = self._model(body.model_id)

        async def unload() -> Outcome:
            await self.close_client(model.model_id)
            return Outcome(json={"model_id": model.model_id, "type": "unload_model"})

        return self._submit("unload_model", unload, model)

    def _tokenizer(self) -> Any:
        return load_tokenizer(str(self.run.model))

    @property
    def _runs_root(self) -> Path:
        return Path(self.run.dir.path).parent

    # -- sampling --------------------------------------------------------------------------------------

    async def _create_sampling_session(self, request: web.Request) -> web.Response:
        body = await read_body(request, types.CreateSamplingSessionRequest)
        if body.model_path is None:  # the base model alone
            self._check_base(body.base_model)
            session_id = self._new_session(None, 0)
        else:
            model = next((m for m in self.models.values() if body.model_path in m.samplers), None)
            if model is None:
                raise wire.TinkerRefusal(f"model_path={body.model_path!r}: no sampler weights of that path on this "
                                         "server (save_weights_for_sampler(name) makes them)")
            session_id = self._new_session(model, model.samplers[body.model_path])
        return json_of(types.CreateSamplingSessionResponse(sampling_session_id=session_id))

    def _new_session(self, model: TrainingModel | None, version: int) -> str:
        """A sampling session on ``model``'s adapter at ``version`` (None: the base model); returns its id."""
        session = SamplingSession(new_id("sampler"), model, version)
        self.sessions[session.session_id] = session
        return session.session_id

    async def _get_sampler(self, request: web.Request) -> web.Response:
        session = self.sessions.get(request.match_info["sampler_id"])
        if session is None:
            return refused(f"no sampling session {request.match_info['sampler_id']!r}", 404)
        return web.json_response({"sampler_id": session.session_id, "base_model": self.base_model})

    async def _asample(self, request: web.Request) -> web.Response:
        body = await read_body(request, types.SampleRequest)
        session = self.sessions.get(body.sampling_session_id or "")
        if session is None:
            raise KeyError(f"sampling_session_id={body.sampling_session_id!r}: no such sampling session")
        prompt = wire.tokens_of(body.prompt.chunks, "prompt")
        self.limits.check(prompt, "prompt", prompt=True)
        overrides = wire.sample_overrides(body)

        request_id = self.futures.new_id()
        ids = [f"{request_id}-{i}" for i in range(body.num_samples)]

        async def sample() -> Outcome:
            completions = list(await session.sample(prompt, overrides, self._base))
            run = session.run or self.run  # shown among that run's episodes, where the explorer reads them
            text = self._tokenizer().decode(prompt)
            for sample_id, completion in zip(ids, completions, strict=False):
                record_outside_sample(run.controller, sample_id, text, completion, "tinker")
            return Outcome(encode=lambda: wire.sample_response(completions, body))

        self.futures.submit("sample", sample, request_id=request_id)
        return web.json_response({"request_id": request_id, "sample_sequence_ids": ids})

    # -- results ---------------------------------------------------------------------------------------

    async def _retrieve(self, request: web.Request) -> web.Response:
        body = await read_body(request, types.FutureRetrieveRequest)
        try:
            outcome = await self.futures.retrieve(body.request_id)
        except KeyError:
            return refused(f"request_id={body.request_id!r}: no such request on this server", 404)
        if outcome is None:
            return web.json_response({"type": "try_again", "request_id": body.request_id, "queue_state": "active"})
        if outcome.error is not None:
            return web.json_response({"error": outcome.error, "category": outcome.category})
        if outcome.proto is not None:
            return web.Response(body=outcome.proto, content_type="application/x-protobuf")
        return web.json_response(outcome.json)

