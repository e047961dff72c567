"""OpenAIEndpoint: an OpenAI-compatible HTTP endpoint in front of a run's policy service, in the kernel.

``endpoint = await run.serve_openai()`` (or ``%forge_serve``) listens on 127.0.0.1::

    GET  /v1/models                     the run's model, and the weight version its generators hold
    POST /v1/chat/completions           messages -> the model's chat template -> policy.generate.route
    POST /v1/completions                a prompt (text or token ids) -> policy.generate.route
    ...  /t/<trajectory>/v1/...         the same, recorded as that trajectory's tokens (agents.recorder)

Every request goes through the policy service's adverbs (``policy.generate.route``, inside a session per
trajectory), so a generator replica that dies mid-request is retried on another one or on its respawn, and
weight updates apply between requests as for forge_nb's own episodes. A request that outlives
``request_timeout_s`` (the service waiting for a respawn that does not come) is answered 503: none hangs.

**Who can reach it.** It binds 127.0.0.1 only, and every request must carry ``Authorization: Bearer <token>``
(a random token made for this endpoint, compared in constant time); without it the answer is 401, as
Jupyter's token and the panel app's signed session do it. The token is ``endpoint.token`` (the api_key of
an OpenAI client); anyone who holds it can generate with the policy and write into trajectories it knows the
id of. It stops when the run shuts down.

Trajectories are named in the base URL (``/t/<id>/v1``) rather than in a header or a request field: every
OpenAI client and library takes a ``base_url``, while not all of them let a caller set headers per request
or pass extra body fields, so agent code and libraries such as verifiers need no change to be recorded.

The server is aiohttp's, run as a task on the kernel's event loop (the loop the services live on): requests
await the policy directly. Considered: FastAPI under uvicorn (uvicorn's ``serve()`` takes over SIGINT in the
main thread, which is the kernel's interrupt, and polls every 0.1 s) and a thread of its own (every request
would cross back to the kernel's loop, where the services are). Streaming answers are Server-Sent Events in
OpenAI's chunk shapes; the policy returns whole completions, so a choice's text arrives in one chunk when
the engine finishes it. The ``openai.AsyncOpenAI`` clients of ``endpoint.client()`` share one connection pool,
aiohttp's (httpx-aiohttp, the ``openai`` package's ``aiohttp`` extra): httpx's own pool costs the kernel
several milliseconds a request once tens of requests are in flight (``forge_nb.agents.clients``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import hmac
import json
import logging
import secrets
import statistics
import time
from collections import deque
from pathlib import Path
from typing import Any, Protocol

from aiohttp import web
from pydantic import ValidationError

from forge_nb.agents import responses
from forge_nb.agents.clients import KEEP_ALIVE_HEADER, shared_http, sync_http
from forge_nb.agents.conversation import ToolParser, hf_message, message_key, message_text, parse_answer
from forge_nb.agents.protocol import ApiError, ChatRequest, CompletionRequest, error_body
from forge_nb.agents.recorder import TrajectoryLog
from forge_nb.envs.chat import after_action_ids, render_ids
from forge_nb.models import load_tokenizer
from forge_nb.service import ActorFailure
from forge_nb.system.local_http import serve_local

logger = logging.getLogger(__name__)

__all__ = ["OpenAIEndpoint"]

#: Connections kept open after an answer to a client of another kind than the endpoint's own: past this many
#: open connections, the answer closes its connection. httpx's own pool (httpcore: what ``openai.AsyncOpenAI``
#: uses unless given another, what verifiers' relay uses) asks every idle connection whether its socket was
#: closed each time it places or finishes a request, so with 32 requests in flight each request cost ~4.7 ms of
#: the kernel's CPU in that scan alone; reconnecting costs ~2.4 ms. Measured (bench/openai_endpoint.py's short
#: request through such a client): 32 in flight 165 ms kept open, 90 ms closed; one at a time 11.9 kept, 14.3
#: closed; 4 at a time 28.5 kept, 22.2 with this bound.
KEEP_OPEN = 4


class ServedRun(Protocol):
    """What the endpoint reads of the run it serves: a run's ``RolloutContext`` (``forge_nb.controller.context``),
    whose ``sampling_overrides`` and ``version`` are read at each request, as ``run.set`` and the weight loads change
    them."""

    @property
    def name(self) -> str: ...
    @property
    def model(self) -> str | None: ...
    @property
    def config(self) -> Any: ...
    @property
    def policy(self) -> Any: ...
    @property
    def sampling_overrides(self) -> dict[str, Any]: ...
    @property
    def version(self) -> int: ...


class OpenAIEndpoint:
    """See the module docstring. ``url`` (the ``/v1`` base), ``token``, ``model`` (the served name)."""

    def __init__(self, run: ServedRun, *, tokenizer: Any, token: str, tool_parser: ToolParser = "hermes",
                 request_timeout_s: float = 600.0, template_kwargs: dict[str, Any] | None = None,
                 max_model_len: int | None = None) -> None:
        if not callable(tool_parser) and tool_parser not in ("hermes", "simple"):
            raise ValueError(f"tool_parser={tool_parser!r}: use 'hermes' (<tool_call>{{json}}</tool_call>, Qwen3 and "
                             "most open models), 'simple' (a line '@name argument', tiny models) or a function from "
                             "text to (content without the calls, [forge_nb.envs.tools.ToolCall, ...])")
        self.run, self.tokenizer, self.token = run, tokenizer, token
        self.model: str = run.name
        self.tool_parser, self.request_timeout_s = tool_parser, request_timeout_s
        self.template_kwargs = dict(template_kwargs or {})
        self.max_model_len = max_model_len
        self.trajectories: dict[str, TrajectoryLog] = {}
        self._sessions: dict[str, TrajectoryLog] = {}  # X-Session-ID -> trajectory (bind_session)
        self.requests = self.errors = 0
        self._latency: deque[float] = deque(maxlen=200)
        self._runner: web.AppRunner | None = None
        self._http: Any = None  # the httpx client every openai client of this endpoint shares
        self._sync_http: Any = None  # and the one under its synchronous clients
        self.host, self.port = "127.0.0.1", 0

    @classmethod
    async def start(cls, run: ServedRun, *, port: int = 0, token: str | None = None, tool_parser: ToolParser = "hermes",
                    request_timeout_s: float = 600.0, chat_template_kwargs: dict[str, Any] | None = None
                    ) -> OpenAIEndpoint:
        """Serve ``run``'s policy on 127.0.0.1:``port`` (0: a free one)."""
        if run.model is None:
            raise ValueError(f"run {run.name!r} has no model path to read its tokenizer from; spawn it with "
                             "forge_nb.spawn")
        tokenizer = await asyncio.to_thread(load_tokenizer, run.model)
        endpoint = cls(run, tokenizer=tokenizer, token=token or secrets.token_urlsafe(24), tool_parser=tool_parser,
                       request_timeout_s=request_timeout_s, template_kwargs=chat_template_kwargs,
                       max_model_len=_max_model_len(run))
        await endpoint._serve(port)
        return endpoint

    # -- what callers use ----------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/v1"

    @property
    def serving(self) -> bool:
        return self._runner is not None

    def open_trajectory(self, budget: int | None = None, request_len: int | None = None,
                        later_request_len: int | None = None) -> TrajectoryLog:
        """A trajectory whose calls are recorded; its base URL is ``trajectory_url(log)``."""
        log = TrajectoryLog(budget=budget or self.run.config.max_res_tokens, request_len=request_len,
                            later_request_len=later_request_len)
        self.trajectories[log.id] = log
        return log

    def close_trajectory(self, log: TrajectoryLog) -> None:
        """Stop recording: later requests to its URL are answered 404, its sessions are forgotten."""
        self.trajectories.pop(log.id, None)
        for session in log.sessions:
            self._sessions.pop(session, None)

    def bind_session(self, session: str, log: TrajectoryLog) -> None:
        """Record requests to the endpoint's own ``/v1`` that carry ``X-Session-ID: <session>`` (the header
        verifiers' interception server sends with each of a rollout's calls, its trace id) as ``log``'s, as if
        they came to its base URL: a relay that keeps one client for many rollouts (one base URL) can still
        say whose each call is."""
        if log.id not in self.trajectories:
            raise ValueError(f"no open trajectory {log.id!r} to bind session {session!r} to")
        log.sessions.append(session)
        self._sessions[session] = log

    def trajectory_url(self, log: TrajectoryLog) -> str:
        return f"http://{self.host}:{self.port}/t/{log.id}/v1"

    def trajectory_at(self, url: str) -> TrajectoryLog | None:
        """The open trajectory whose base URL ``url`` is (what a client of ``client(log)`` was given), or None."""
        prefix = f"http://{self.host}:{self.port}/t/"
        tid = url.rstrip("/").removeprefix(prefix).removesuffix("/v1") if url.startswith(prefix) else None
        return self.trajectories.get(tid) if tid else None

    @property
    def http(self) -> Any:
        """The ``httpx.AsyncClient`` under every client of this endpoint, on aiohttp's connection pool: one for
        the run (a client of its own costs ~35 ms to make, most of it the TLS context httpx builds even for
        http URLs). Code of the run's that talks HTTP on the kernel's loop may share it; the endpoint closes it
        when it stops."""
        if self._http is None:
            self._http = shared_http(self.request_timeout_s + 30)
        return self._http

    def client(self, log: TrajectoryLog | None = None, **options: Any) -> Any:
        """An ``openai.AsyncOpenAI`` for this endpoint (bound to ``log``'s trajectory when given); its
        ``model`` attribute names the served model. The clients share one connection pool (``http``), which the
        endpoint closes when it stops: do not close them yourself."""
        import openai

        client = openai.AsyncOpenAI(base_url=self.trajectory_url(log) if log is not None else self.url,
                                    api_key=self.token, http_client=self.http, **({"max_retries": 0} | options))
        client.model = self.model  # type: ignore[attr-defined]
        return client

    def sync_client(self, log: TrajectoryLog | None = None, **options: Any) -> Any:
        """A synchronous ``openai.OpenAI`` for this endpoint (bound to ``log``'s trajectory when given), for code
        that runs off the kernel's event loop (a plain ``def`` agent runs in a thread): called on the loop's own
        thread it would wait for an answer the blocked loop cannot give. The clients share one connection pool,
        which the endpoint closes when it stops."""
        import openai

        if self._sync_http is None:
            self._sync_http = sync_http(self.request_timeout_s + 30)
        client = openai.OpenAI(base_url=self.trajectory_url(log) if log is not None else self.url,
                               api_key=self.token, http_client=self._sync_http, **({"max_retries": 0} | options))
        client.model = self.model  # type: ignore[attr-defined]
        return client

    def status(self) -> dict[str, Any]:
        latency = sorted(self._latency)
        return {"url": self.url, "model": self.model, "serving": self.serving, "requests": self.requests,
                "errors": self.errors, "trajectories": len(self.trajectories),
                "p50_s": statistics.median(latency) if latency else None}

    async def stop(self) -> None:
        runner, self._runner = self._runner, None
        http, self._http = self._http, None
        if http is not None:
            await http.aclose()
        sync_http, self._sync_http = self._sync_http, None
        if sync_http is not None:
            sync_http.close()
        if runner is not None:
            await runner.cleanup()
        self.trajectories.clear()
        self._sessions.clear()

    def __repr__(self) -> str:
        return f"<OpenAIEndpoint {self.url} model={self.model!r} {'serving' if self.serving else 'stopped'}>"

    # -- serving ---------------------------------------------------------------------------------------

    async def _serve(self, port: int) -> None:
        app = web.Application(middlewares=[self._errors, self._auth], client_max_size=64 * 2**20)
        for prefix in ("", "/t/{trajectory}"):
            app.router.add_get(prefix + "/v1/models", self._models)
            app.router.add_post(prefix + "/v1/chat/completions", self._chat)
            app.router.add_post(prefix + "/v1/completions", self._completions)
        self._runner, self.port = await serve_local(app, self.host, port, self.run.name)
        logger.info("OpenAI endpoint of run %s at %s", self.run.name, self.url)

    @web.middleware
    async def _auth(self, request: web.Request, handler: Any) -> web.StreamResponse:
        given = request.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {self.token}".encode()):
            raise ApiError(401, "no valid api key: send 'Authorization: Bearer <token>' with this endpoint's token "
                           "(endpoint.token; the api_key of openai.AsyncOpenAI)", code="invalid_api_key")
        return await handler(request)

    @web.middleware
    async def _errors(self, request: web.Request, handler: Any) -> web.StreamResponse:
        self.requests += 1
        started = time.perf_counter()
        try:
            response = await handler(request)
        except ApiError as e:
            self.errors += 1
            return web.json_response(e.body(), status=e.status)
        except web.HTTPException as e:  # aiohttp's own: no such route, wrong method
            self.errors += 1
            return web.json_response(error_body(f"{request.method} {request.path}: {e.reason}"), status=e.status)
        except Exception as e:
            self.errors += 1
            logger.exception("OpenAI endpoint: %s %s failed", request.method, request.path)
            return web.json_response(error_body(f"{type(e).__name__}: {e}", kind="server_error"), status=500)
        self._latency.append(time.perf_counter() - started)
        if KEEP_ALIVE_HEADER not in request.headers and len(self._runner.server.connections) > KEEP_OPEN:
            response.force_close()  # see KEEP_OPEN
        return response

    async def _models(self, request: web.Request) -> web.Response:
        self._trajectory(request)
        return web.json_response(responses.models(self.model, self.run.model, self.run.version))

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        req = await self._parse(request, ChatRequest)
        log = self._trajectory(request)
        messages = [hf_message(m) for m in req.messages]
        kwargs = {**self.template_kwargs, **(req.chat_template_kwargs or {})}
        if req.tools:
            kwargs["tools"] = req.tools
        keys = [message_key(m) for m in req.messages]

        def render() -> list[int]:
            return render_ids(self.tokenizer, messages, **kwargs)

        def after(action_ids: list[int], start: int) -> list[int]:
            return after_action_ids(self.tokenizer, action_ids, messages[start:], **kwargs)

        def new_text(start: int) -> str:
            return "\n".join(message_text(m.get("content")) for m in req.messages[start:])

        async with log.lock if log is not None else contextlib.nullcontext():  # one call of a trajectory at a time
            if log is not None:
                prompt, room = log.chat_prompt(keys, [m["role"] for m in req.messages], render=render, after=after,
                                               new_text=new_text)
            else:
                prompt, room = render(), None
            choices = await self._generate(req, prompt, room, log)
            parser = self.tool_parser if req.parse_tools else None
            answers = [parse_answer(c.text, parser) for c in choices]
            if log is not None:
                infos = [{"tool": ",".join(t["function"]["name"] for t in a.tool_calls) or "?", "tool_ok": a.ok}
                         if a.tool_calls or not a.ok else {} for a in answers]
                log.answered(keys, choices, [message_key(a.message()) for a in answers], infos)
        body = responses.chat(self.model, prompt, choices, answers, self.tokenizer, req)
        if req.stream:
            return await self._stream(request, responses.chat_chunks(body, req))
        return web.json_response(body)

    async def _completions(self, request: web.Request) -> web.StreamResponse:
        req = await self._parse(request, CompletionRequest)
        log = self._trajectory(request)
        prompt_in: str | list[int] = req.prompt  # type: ignore[assignment]

        def tokenize(text: str) -> list[int]:
            return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

        async with log.lock if log is not None else contextlib.nullcontext():  # one call of a trajectory at a time
            if log is not None:
                prompt, room = log.completion_prompt(prompt_in, tokenize=tokenize)
            else:
                prompt, room = (tokenize(prompt_in) if isinstance(prompt_in, str) else list(prompt_in)), None
            choices = await self._generate(req, prompt, room, log, default_max=16)
            if log is not None:
                log.answered(prompt_in, choices, [c.text for c in choices], [{} for _ in choices])
        body = responses.completion(self.model, prompt, choices, self.tokenizer, req)
        if req.stream:
            return await self._stream(request, responses.completion_chunks(body, req))
        return web.json_response(body)

    # -- the parts ----------------------------------------------------------------------------------------

    async def _parse(self, request: web.Request, kind: type[ChatRequest] | type[CompletionRequest]) -> Any:
        try:
            body = await request.json(loads=json.loads)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise ApiError(400, f"the request body is not JSON ({e})", code="invalid_json") from e
        if not isinstance(body, dict):
            raise ApiError(400, "the request body must be a JSON object", code="invalid_json")
        try:
            req = kind.model_validate(body)
        except ValidationError as e:
            first = e.errors()[0]
            param = ".".join(str(p) for p in first["loc"]) or None
            raise ApiError(400, f"{param}: {first['msg']}" if param else first["msg"], param=param,
                           code="invalid_value") from e
        if req.model != self.model:
            raise ApiError(404, f"the model {req.model!r} does not exist here; this endpoint serves {self.model!r} "
                           "(GET /v1/models)", param="model", code="model_not_found")
        return req

    def _trajectory(self, request: web.Request) -> TrajectoryLog | None:
        tid = request.match_info.get("trajectory")
        if tid is None:
            session = request.headers.get("X-Session-ID")
            return self._sessions.get(session) if session else None
        log = self.trajectories.get(tid)
        if log is None:
            raise ApiError(404, f"no open trajectory {tid!r}: it ended (its episode was built) or never began; "
                           "use the base URL of a trajectory agent_episode opened, or the endpoint's own /v1",
                           code="trajectory_not_found")
        return log

    async def _generate(self, req: Any, prompt: list[int], room: int | None, log: TrajectoryLog | None,
                        default_max: int | None = None) -> list[Any]:
        limit = self.max_model_len
        vocab = _vocab_size(self.run)
        if vocab is not None and prompt and not 0 <= min(prompt) <= max(prompt) < vocab:
            raise ApiError(400, f"prompt: token ids go from 0 to {vocab - 1} for this model; the prompt holds "
                           f"{min(prompt) if min(prompt) < 0 else max(prompt)}", param="prompt", code="invalid_value")
        if limit is not None and len(prompt) >= limit:
            raise ApiError(400, f"This model's maximum context length is {limit} tokens; the prompt has "
                           f"{len(prompt)}.", param="messages", code="context_length_exceeded")
        left = (limit - len(prompt)) if limit is not None else None
        wanted = req.max_tokens or default_max or left or 256
        if left is not None and req.max_tokens is not None and req.max_tokens > left:
            raise ApiError(400, f"This model's maximum context length is {limit} tokens. However, you requested "
                           f"{len(prompt) + req.max_tokens} tokens ({len(prompt)} in the prompt, {req.max_tokens} in "
                           "the completion). Reduce the prompt or max_tokens.", param="max_tokens",
                           code="context_length_exceeded")
        max_tokens = min(x for x in (wanted, left, room) if x is not None)
        if max_tokens < 1:
            raise ApiError(400, "no room left for an answer in this trajectory's token budget",
                           code="context_length_exceeded")
        sampling = {**self.run.sampling_overrides, **req.sampling(max_tokens)}
        policy = self.run.policy
        try:
            async with asyncio.timeout(self.request_timeout_s):
                async with policy.session(log.affinity) if log is not None else contextlib.nullcontext():
                    return list(await policy.generate.route(prompt, **sampling))
        except TimeoutError as e:
            raise ApiError(503, f"the policy did not answer within {self.request_timeout_s:g} s (no healthy "
                           "generator replica came back); try again", code="timeout") from e
        except ActorFailure as e:
            raise ApiError(503, f"the policy service could not serve this request: {e}"[:1000],
                           code="policy_unavailable") from e
        except Exception as e:  # the generator refused the prompt or a sampling value (its actor's ValueError)
            refused = getattr(e, "exception", e)
            if not isinstance(refused, ValueError):
                raise
            raise ApiError(400, str(refused)[:1000], code="invalid_value") from e

    async def _stream(self, request: web.Request, chunks: list[dict[str, Any]]) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        for chunk in chunks:
            await response.write(f"data: {json.dumps(chunk)}\n\n".encode())
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response



@functools.cache
def _model_config(path: str) -> dict[str, Any]:
    try:
        config = json.loads((Path(path) / "config.json").read_text())
    except (OSError, ValueError):
        return {}
    return config.get("text_config", config)


def _vocab_size(run: ServedRun) -> int | None:
    """The model's vocabulary (its config's ``vocab_size``): the token ids a prompt may hold lie below it."""
    return _model_config(str(run.model)).get("vocab_size")


def _max_model_len(run: ServedRun) -> int | None:
    """The generators' context: what the run gives their engines (``RunConfig.engine_args``), else the model's
    ``max_position_embeddings``."""
    engine_args = run.config.engine_args() if hasattr(run.config, "engine_args") else {}
    if engine_args.get("max_model_len"):
        return int(engine_args["max_model_len"])
    return _model_config(str(run.model)).get("max_position_embeddings")
