"""The Tinker server's HTTP edge: the token check, errors in the SDK's shape, bodies as the SDK's types, and the
session routes that do no work.

``TinkerServer`` (``forge_nb.tinker.server``) holds the routes that train and sample; what every request goes
through before them, and what the SDK asks of a server beyond them, is here, so that the server's module reads as
what a training client's calls do to its run.

``guard`` is the middleware: it counts requests, refuses one without the server's token (``X-API-Key``, compared in
constant time) with a 401, and answers whatever a handler raises in the SDK's error shape (``{"error",
"category"}``): a 4xx, ``category`` "user", for what the request got wrong (aiohttp's own refusals, a body that
does not validate, an unknown id), a 500, ``category`` "server", for a fault of the server's own (its traceback in
the log).

``SESSION_ROUTES`` answer what the SDK asks as a server without those features answers: the client config turns
off the batched ``retrieve_futures`` poller and server-side custom losses (``forward_backward_custom`` then runs
its loss in the caller's process over ``forward``'s logprobs, as the SDK does by default) and keeps the SDK's
default pyqwest transport; sessions are ids, heartbeats and telemetry are accepted and dropped.
"""

from __future__ import annotations

import hmac
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from pydantic import ValidationError
from tinker import types

from forge_nb.tinker.models import new_id

logger = logging.getLogger(__name__)

__all__ = ["PREFIX", "SESSION_ROUTES", "Tally", "guard", "json_of", "read_body", "refused"]

PREFIX = "/api/v1"

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def json_of(model: Any) -> web.Response:
    """One of the SDK's pydantic responses, as JSON without its unset fields."""
    return web.json_response(model.model_dump(mode="json", exclude_none=True))


def refused(message: str, status: int = 400) -> web.Response:
    """A refusal in the SDK's error shape, ``category`` "user": the SDK raises it as ``RequestFailedError``."""
    return web.json_response({"error": message, "category": "user"}, status=status)


async def read_body(request: web.Request, model: type) -> Any:
    """The request's JSON body as the SDK's ``model``; a body that is not one is a 400 (via ``guard``)."""
    try:
        data = await request.json()
    except Exception:
        raise ValueError("the body is not JSON") from None
    return model.model_validate(data)


@dataclass
class Tally:
    """Requests the server got, and how many of them it refused (``TinkerServer.status``)."""

    requests: int = 0
    refused: int = 0


def guard(token: str, tally: Tally) -> Any:
    """The middleware: the token, then the handler; what goes wrong is answered in the SDK's error shape (see the
    module docstring), counted in ``tally``."""

    @web.middleware
    async def guarded(request: web.Request, handler: Handler) -> web.StreamResponse:
        tally.requests += 1
        given = request.headers.get("X-API-Key", "")
        if not hmac.compare_digest(given.encode(), token.encode()):
            tally.refused += 1
            return refused("no valid api key: pass api_key=server.token (X-API-Key) to tinker.ServiceClient", 401)
        try:
            response = await handler(request)
        except web.HTTPException as e:  # aiohttp's own: no such route, wrong method, body too large
            tally.refused += 1
            return refused(f"{request.method} {request.path}: {e.reason}", e.status)
        except (ValidationError, ValueError, TypeError, KeyError) as e:
            tally.refused += 1
            return refused(f"{request.path}: {_first_line(e)}")
        except Exception as e:  # a fault of this server's own: still in the SDK's shape, its traceback in the log
            logger.exception("Tinker API: %s %s failed", request.method, request.path)
            return web.json_response({"error": f"{request.path}: {type(e).__name__}: {_first_line(e)}",
                                      "category": "server"}, status=500)
        if response.status >= 400:  # a handler's own refusal (an unknown request id or sampler)
            tally.refused += 1
        return response

    return guarded


def _first_line(error: BaseException) -> str:
    text = str(error.args[0]) if isinstance(error, KeyError) and error.args else str(error)
    return text.splitlines()[0][:500] if text else type(error).__name__


# -- the session: what the SDK asks beyond the work ------------------------------------------------------

async def _client_config(request: web.Request) -> web.Response:
    return json_of(types.ClientConfigResponse(use_pyqwest_transport=True, sample_use_retrieve_futures=False,
                                              custom_loss_server_side=False, sample_join_sampling_session=False))


async def _dynamic_config(request: web.Request) -> web.Response:
    return json_of(types.ClientDynamicConfigResponse())


async def _create_session(request: web.Request) -> web.Response:
    await read_body(request, types.CreateSessionRequest)
    return json_of(types.CreateSessionResponse(session_id=new_id("session")))


async def _heartbeat(request: web.Request) -> web.Response:
    return json_of(types.SessionHeartbeatResponse())


async def _telemetry(request: web.Request) -> web.Response:
    return json_of(types.TelemetryResponse(status="accepted"))


async def _finish(request: web.Request) -> web.Response:
    return web.json_response({})


async def _healthz(request: web.Request) -> web.Response:
    return web.json_response({"status": "ok"})


#: (method, path under ``PREFIX``) -> handler, for the routes that need no run
SESSION_ROUTES: dict[tuple[str, str], Handler] = {
    ("POST", "client/config"): _client_config, ("POST", "client/dynamic_config"): _dynamic_config,
    ("POST", "create_session"): _create_session, ("POST", "session_heartbeat"): _heartbeat,
    ("POST", "telemetry"): _telemetry, ("POST", "sessions/{session_id}/finish"): _finish,
    ("GET", "healthz"): _healthz,
}
