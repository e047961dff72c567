"""The HTTP clients under an endpoint's openai clients: one shared pool for the kernel's loop, one for threads.

``OpenAIEndpoint.client()`` and ``sync_client()`` (``forge_nb.agents.server``) hand out ``openai`` clients that all
send through the endpoint's two pools, made here. Which pool they use decides what a request costs the kernel:
httpcore's own pool (what ``openai.AsyncOpenAI`` uses unless given another) looks at every connection it holds,
and asks the idle ones' sockets whether they were closed, each time it places a request, so with tens of requests
in flight each one pays milliseconds of the kernel's CPU. The asynchronous clients therefore send through
aiohttp's pool (httpx-aiohttp, what the ``openai`` package's ``aiohttp`` extra installs), whose idle connections
cost nothing per request, and mark their requests with ``KEEP_ALIVE_HEADER`` so that the endpoint keeps their
connections open (it closes those of other clients past a few open ones: ``KEEP_OPEN`` there). The synchronous
clients, for code on threads off the kernel's loop, share one plain ``httpx.Client``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["KEEP_ALIVE_HEADER", "shared_http", "sync_http"]

#: Sent by the endpoint's own clients (``OpenAIEndpoint.http``: aiohttp's pool, which keeps idle connections at
#: no cost per request): their connections stay open.
KEEP_ALIVE_HEADER = "X-Forge-NB-Keep-Alive"


def shared_http(timeout_s: float) -> Any:
    """The httpx client under every openai client of an endpoint, sending through aiohttp's connection pool
    (httpx-aiohttp, what the ``openai`` package's ``aiohttp`` extra installs "for improved concurrency").
    httpcore's own pool looks at every connection it holds, and asks the idle ones' sockets whether they were
    closed, each time it places a request: with the agent recipe's 32 requests in flight, one took 5.5 ms longer
    than a bare ``policy.generate.route`` on httpx's pool and 1.9 ms on aiohttp's, and the recipe trained 1.8x
    faster (bench/openai_endpoint.py, bench/HISTORY.md).
    No limit on connections; the session is made on the first request, in the loop that sends it."""
    import aiohttp
    import httpx
    from httpx_aiohttp import AiohttpTransport

    transport = AiohttpTransport(client=lambda: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)))
    return httpx.AsyncClient(transport=transport, timeout=httpx.Timeout(timeout_s, connect=10),
                             headers={KEEP_ALIVE_HEADER: "1"})


def sync_http(timeout_s: float) -> Any:
    """The ``httpx.Client`` under every synchronous openai client of an endpoint (``sync_client``)."""
    import httpx

    return httpx.Client(timeout=httpx.Timeout(timeout_s, connect=10),
                        limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
