"""``%forge_serve``: the run's policy as an OpenAI-compatible endpoint (``Run.serve_openai``, ``forge_nb.agents``), or
with ``--tinker`` the Tinker API on the run's base (``Run.serve_tinker``, ``forge_nb.tinker``)."""

from __future__ import annotations

from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any

from IPython.core.error import UsageError
from IPython.core.magic import Magics, line_magic, magics_class
from IPython.core.magic_arguments import argument, magic_arguments, parse_argstring

from forge_nb.magics._runs import Runs

if TYPE_CHECKING:
    from forge_nb.run import Run


@magics_class
class ServeMagics(Magics):
    def __init__(self, shell: Any, runs: Runs):
        super().__init__(shell)
        self.runs = runs

    @magic_arguments()
    @argument("--port", type=int, default=0, help="the port on 127.0.0.1 (default: a free one)")
    @argument("--tool-parser", default="hermes", choices=("hermes", "simple"),
              help="how the model writes tool calls: hermes (<tool_call>{json}</tool_call>, Qwen3 and most open "
                   "models) or simple (a line '@name argument', the tiny local models)")
    @argument("--tinker", action="store_true", help="serve the Tinker API instead (tinker.ServiceClient; each "
                                                     "training client a LoRA run on this run's base)")
    @argument("--stop", action="store_true", help="stop serving (the run's shutdown does it too)")
    @argument("-o", dest="var", default=None, help="the variable to bind the endpoint to (default endpoint; with "
                                                   "--tinker, tinker_server)")
    @argument("--name", help="the run to serve (a run's name or a variable holding a Run); needed when several "
                             "runs are live")
    @line_magic
    def forge_serve(self, line: str) -> Coroutine[Any, Any, None]:
        """Serve the run's policy as an OpenAI-compatible endpoint on 127.0.0.1, behind a bearer token.

        Agent code then talks to the policy through ``endpoint.client()`` (an ``openai.AsyncOpenAI``),
        ``endpoint.sync_client()`` (an ``openai.OpenAI``, off the kernel's loop) or any OpenAI client given
        ``endpoint.url`` and ``endpoint.token``; ``forge_nb.agents.agent_episode(agent)`` trains such code. The
        endpoint stops when the run shuts down.

        ``--tinker``: the Tinker API instead (a LoRA run's), bound to ``tinker_server``:
        ``tinker.ServiceClient(base_url=tinker_server.url, api_key=tinker_server.token)``; each training client
        is a LoRA run on this run's base (``forge_nb.tinker``)."""
        args = parse_argstring(self.forge_serve, line)
        args.var = args.var or ("tinker_server" if args.tinker else "endpoint")
        if not args.var.isidentifier():
            raise UsageError(f"-o {args.var}: give a Python variable name")
        run = self.runs.get(args.name)
        if args.tinker:
            return self._stop(run, tinker=True) if args.stop else self._serve_tinker(run, args)
        return self._stop(run) if args.stop else self._serve(run, args)

    async def _serve_tinker(self, run: Run, args: Any) -> None:
        if run.base is None:
            raise UsageError(f"run {run.name!r} trains the whole model; the Tinker API trains LoRA adapters on a "
                             "run's base: spawn one with --lora (e.g. %forge_spawn quickstart --lora 8)")
        server = await run.serve_tinker(port=args.port)
        self.shell.user_ns[args.var] = server
        print(f"run {run.name!r} serves the Tinker API at {server.url} (base_model {server.base_model!r}); bound to "
              f"`{args.var}`.\n  service = tinker.ServiceClient(base_url={args.var}.url, api_key={args.var}.token)\n"
              "  In a cell, await the SDK's calls; run synchronous client code in a thread (asyncio.to_thread).")

    async def _serve(self, run: Run, args: Any) -> None:
        if run.state == "shut down":
            raise UsageError(f"run {run.name!r} is shut down; spawn a new one (%forge_spawn) and serve that")
        served = run.openai is not None and run.openai.serving
        endpoint = await run.serve_openai(port=args.port, tool_parser=args.tool_parser)
        self.shell.user_ns[args.var] = endpoint
        again = " (already serving: the same endpoint)" if served else ""
        print(f"run {run.name!r} serves the OpenAI API at {endpoint.url}, model {endpoint.model!r}{again}; bound to "
              f"`{args.var}`.\n  client = {args.var}.client()   # openai.AsyncOpenAI; elsewhere: "
              f"base_url={args.var}.url, api_key={args.var}.token\n  run.episode_fn = "
              "forge_nb.agents.agent_episode(my_agent)   # trains `[async] def my_agent(client, sample) -> reward`")

    async def _stop(self, run: Run, tinker: bool = False) -> None:
        front, what = (run.tinker, "Tinker API") if tinker else (run.openai, "OpenAI endpoint")
        if front is None or not front.serving:
            print(f"run {run.name!r} serves no {what}")
            return
        await front.stop()
        print(f"run {run.name!r}: the {what} stopped" + (", and its training clients' runs with it" if tinker else ""))
