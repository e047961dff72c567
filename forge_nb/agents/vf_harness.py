"""forge_nb's in-process verifiers harness: the chat loop every seat of a ``verifiers_episode`` runs in the kernel.

verifiers' harnesses are programs launched in a runtime (``null`` and ``bash`` through ``uv``, the others in Docker
or a remote sandbox). ``Harness.launch`` may run its loop in-process "as long as every model call goes through
endpoint + secret" (its docstring): ``forge-nb-chat`` (:data:`HARNESS_ID`) is such a loop, on the kernel's event
loop, with the ``subprocess`` runtime. It calls the model through the rollout's endpoint on the run's endpoint's
connection pool, answers each tool call with a ``tool`` message (forge_nb's :class:`~forge_nb.envs.tools.Tools`
run in-process, or the task's MCP servers through verifiers' MCP client) and stops at a reply that calls no tool,
or when the trajectory's token budget is spent. What of verifiers is used, and why, is in
``forge_nb.agents.verifiers_env``, the episode function that sets each rollout's :class:`Seat`.

verifiers loads harnesses and tasksets by id, as importable top-level modules: :func:`register` puts a module of
that name into ``sys.modules`` (the harness here, a taskset class from a cell for ``local_env``), when first
called, never on import. :func:`plugin` imports verifiers, registers the harness and routes verifiers' log records
to forge_nb's loggers (never printed into a cell).
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import functools
import importlib.machinery
import inspect
import json
import logging
import sys
import types
from typing import Any

from forge_nb.envs.tools import ToolCall, Tools
from forge_nb.system.importpath import require
from forge_nb.system.processes.proclogs import drop_actor_prefix

__all__ = ["HARNESS_ID", "SEAT", "Seat", "plugin", "register"]

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'forge_nb[envs]'"
HARNESS_ID = "forge-nb-chat"
"""The id of forge_nb's in-process harness, for a seat's ``harness={"id": HARNESS_ID}``."""
_HARNESS_MODULE = "verifiers.v1.harnesses.forge_nb_chat"


@dataclasses.dataclass(frozen=True, slots=True)
class Seat:
    """What the harness of one rollout needs from forge_nb: the tools it runs, the run's endpoint (its shared
    HTTP client), and the trajectory to bind the rollout's trace to (None: the rollout calls the trajectory's
    own URL)."""

    tools: Tools | None
    endpoint: Any
    trajectory: Any


SEAT: contextvars.ContextVar[Seat | None] = contextvars.ContextVar("forge_nb_vf_seat", default=None)


def register(name: str, *exports: type) -> str:
    """A module named ``name`` exporting ``exports`` in ``sys.modules``, as verifiers' plugin loader finds
    one; its id (the last part of the name)."""
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__all__ = [cls.__name__ for cls in exports]
    for cls in exports:
        setattr(module, cls.__name__, cls)
    sys.modules[name] = module
    return name.rsplit(".", 1)[-1]


@functools.cache
def plugin() -> types.SimpleNamespace:
    """verifiers, imported; forge_nb's harness registered with it; its log records routed to forge_nb's."""
    vf = require("verifiers.v1", missing=f"verifiers environments need the verifiers library: {INSTALL_HINT}")
    from verifiers.v1.runtimes import ProgramResult

    class ForgeChatHarnessConfig(vf.HarnessConfig):
        """forge_nb's in-process chat harness; it has no knobs of its own."""

        id: str = HARNESS_ID

    class ForgeChatHarness(vf.Harness[ForgeChatHarnessConfig]):
        """An OpenAI chat loop in the kernel's event loop: reply, tool calls answered, until a reply calls none."""

        APPENDS_SYSTEM_PROMPT = True
        SUPPORTS_MCP = True
        SUPPORTS_RESUME = True  # a user's turn relaunches the loop on the conversation so far
        EXECUTES_CODE = False  # its tools run where they live (the coder in its sandbox)
        NEEDS_CONTAINER = False

        async def launch(self, ctx: Any, trace: Any, runtime: Any, endpoint: str, secret: str,
                         mcp_urls: dict[str, str], data: Any, **_: Any) -> Any:
            system, prompt = self.resolve_prompt(data)
            seat = SEAT.get()
            if seat is not None and seat.trajectory is not None:  # the calls reach the endpoint's own URL
                seat.endpoint.bind_session(trace.id, seat.trajectory)
            code, detail = await _chat(ctx.model, endpoint, secret, system, prompt, mcp_urls, seat)
            return ProgramResult(exit_code=code, stdout="", stderr=detail)

    register(_HARNESS_MODULE, ForgeChatHarness, ForgeChatHarnessConfig)
    library = logging.getLogger("verifiers.v1")
    if not any(isinstance(h, _Forward) for h in library.handlers):
        forward = _Forward()
        library.addHandler(forward)
        drop_actor_prefix(forward)  # the kernel log's handler prefixes nothing either
        library.propagate = False
    return types.SimpleNamespace(vf=vf)


class _Forward(logging.Handler):
    """verifiers' records, re-logged on this module's logger (where a run's kernel.log picks them up) when that
    has a handler: never through Python's last-resort handler, which prints into whichever cell ran last."""

    def emit(self, record: logging.LogRecord) -> None:
        if log.hasHandlers():
            log.handle(record)


async def _chat(model: str, endpoint: str, secret: str, system: str | None, prompt: Any,
                mcp_urls: dict[str, str], seat: Seat | None) -> tuple[int, str]:
    """The loop; (exit code, what went wrong) as a program would report them to verifiers. Its client sends
    through the run's endpoint's connection pool (``seat.endpoint.http``), not one of its own per rollout."""
    import openai
    from verifiers.v1.dialects.chat import message_to_wire
    from verifiers.v1.errors import MODEL_TRANSPORT_ERROR_EXIT_CODE
    from verifiers.v1.harnesses.utils.compaction import is_context_overflow
    from verifiers.v1.harnesses.utils.mcp import call_mcp, connect_mcp

    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    if isinstance(prompt, str):
        messages.append({"role": "user", "content": prompt})
    else:
        messages += [message_to_wire(m) for m in prompt or []]
    tools = seat.tools if seat is not None else None
    http = seat.endpoint.http if seat is not None else None
    client = openai.AsyncOpenAI(base_url=endpoint, api_key=secret, max_retries=0, http_client=http)
    async with contextlib.AsyncExitStack() as stack:
        if http is None:  # a client of its own (the harness called outside verifiers_episode)
            stack.push_async_callback(client.close)
        own = dict(tools.tools) if tools is not None else {}
        schemas, dispatch, servers = ((await connect_mcp({"mcpServers": {n: {"url": u} for n, u in mcp_urls.items()}},
                                                         stack, set(own))) if mcp_urls else ([], {}, {}))
        schemas = [_schema(name, fn) for name, fn in own.items()] + schemas
        while True:
            try:
                completion = await client.chat.completions.create(
                    model=model, messages=messages, **({"tools": schemas} if schemas else {}))
            except openai.APIConnectionError as e:
                return MODEL_TRANSPORT_ERROR_EXIT_CODE, f"the model call did not connect: {e}"
            except openai.APIStatusError as e:
                if is_context_overflow(e):  # the trajectory's token budget is spent: the run ends, and is scored
                    return 0, ""
                return 1, f"the model call failed: {e.status_code} {e.message}"  # or a limit refused it
            message = completion.choices[0].message
            calls = message.tool_calls or []
            messages.append({"role": "assistant", "content": message.content or "",
                             **({"tool_calls": [c.model_dump() for c in calls]} if calls else {})})
            if not calls:
                return 0, ""
            for call in calls:
                content = await _run_call(call, tools, dispatch, servers, call_mcp)
                messages.append({"role": "tool", "tool_call_id": call.id, "name": call.function.name,
                                 "content": content})


async def _run_call(call: Any, tools: Tools | None, dispatch: dict[str, Any], servers: dict[str, Any],
                    call_mcp: Any) -> Any:
    """One structured tool call's result, or the error the model reads."""
    name = call.function.name
    try:
        arguments = json.loads(call.function.arguments or "{}")
    except json.JSONDecodeError as e:
        return f"error: the arguments are not JSON ({e.msg}); resend the call with a JSON object"
    if not isinstance(arguments, dict):
        return "error: the arguments must be a JSON object"
    if name in dispatch:
        try:
            return await call_mcp(servers, dispatch, name, arguments)
        except Exception as e:  # the model reads why, as with forge_nb's own tools
            return f"error: {type(e).__name__}: {e}"
    if tools is None:
        return f"error: no tool named {name!r}"
    return tools.content(await tools.call(ToolCall(name, arguments)))


def _schema(name: str, fn: Any) -> dict[str, Any]:
    """An OpenAI function schema from a tool's signature: each parameter a string unless annotated otherwise."""
    kinds = {int: "integer", float: "number", bool: "boolean", "int": "integer", "float": "number",
             "bool": "boolean"}
    properties, required = {}, []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue
        properties[param.name] = {"type": kinds.get(param.annotation, "string")}
        if param.default is param.empty:
            required.append(param.name)
    doc = inspect.getdoc(fn) or f"the {name} tool"
    return {"type": "function", "function": {"name": name, "description": doc.split("\n\n")[0],
                                             "parameters": {"type": "object", "properties": properties,
                                                            "required": required}}}
