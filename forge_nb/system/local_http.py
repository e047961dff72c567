"""An aiohttp application served on this machine's loopback, for the fronts a run serves (the OpenAI endpoint, the
Tinker API): one way to start it, so both bind and log the same way."""

from __future__ import annotations

import asyncio

from aiohttp import web

from forge_nb.system.processes.proclogs import run_context

__all__ = ["serve_local"]


async def serve_local(app: web.Application, host: str, port: int, run_name: str) -> tuple[web.AppRunner, int]:
    """Serve ``app`` on ``host``:``port`` (0: a free port) from the running loop; returns its runner (``cleanup()``
    stops it) and the port. The site starts in the run's context, so the tasks that answer requests log as the run's
    (its kernel.log)."""
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, host, port, reuse_address=True)
    await asyncio.get_running_loop().create_task(site.start(), context=run_context(run_name))
    return runner, site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
