"""verifiers environments as forge_nb episodes: each trajectory is one verifiers rollout against the run's endpoint.

``run.episode_fn = verifiers_episode(env)`` plays a GRPO group of verifiers episodes of one task (verifiers
0.4, ``import verifiers.v1 as vf``): :func:`~forge_nb.agents.episode.agent_episode` gives each trajectory an
``openai.AsyncOpenAI`` bound to its own base URL on the run's OpenAI endpoint, and the agent here hands that
URL, key and model name to ``env.run_episode(task, ModelContext(...))``. verifiers does the rest as in one of
its evals: its interception server (aiohttp on 127.0.0.1, in this process) takes the harness's chat calls,
records them on its trace and forwards them to the trajectory's URL, where forge_nb records the token ids it
trains on; the task's ``@vf.reward`` functions score the trace, and the episode's reward (the mean over its
trainable traces) is the trajectory's. An episode that fails (a harness, a tool server or the env's ``run()``
raised) quarantines its trajectory with verifiers' error as the reason::

    env = local_env(MyTaskset)                  # a vf.Taskset from a cell; every seat in this process
    run.episode_fn = verifiers_episode(env, tools=Tools({"python": python_tool(coder)}))

What is used of verifiers, and why:

- ``Env.run_episode(task, ctx)`` inside ``Env.serving()``, as verifiers' in-process eval runner and prime-rl's
  env server do it. One call covers single-turn tasksets, multi-turn envs (an ``Env.run`` answering the model
  through ``agent.interaction(task).turn(message)``, as verifiers' TextArena env does) and multi-agent ones.
  Considered: ``Agent.run(task)`` (one agent, no env control flow: multi-turn would need a protocol of our
  own) and ``Env.run_slot`` (it retries whole episodes; a retry would add the failed attempt's calls to the
  trajectory).
- The harness. verifiers' harnesses are programs launched in a runtime: ``null`` and ``bash`` are scripts run
  through ``uv`` (which downloads uv and the scripts' packages), the others need Docker or a remote sandbox
  (a seat's default runtime is Prime's cloud). ``Harness.launch`` may run its loop in-process "as long as
  every model call goes through endpoint + secret" (its docstring): ``forge-nb-chat`` (:data:`HARNESS_ID`)
  is such a loop, in the kernel's event loop, with the ``subprocess`` runtime (a scratch folder per rollout,
  nothing started). verifiers loads harnesses and tasksets by id, as importable top-level modules, so this
  module registers its harness (and :func:`local_env` a taskset class from a cell) as modules under
  ``verifiers.v1.harnesses`` / ``verifiers.v1.tasksets`` in ``sys.modules``, when first called (not on import).
  Seats in containers or remote sandboxes, and harnesses that run the model's commands on this machine
  (``bash``), are refused with the fix.
- Tools. The endpoint reads the model's calls out of its text (its ``tool_parser``: Hermes tags, ``@name arg``
  or yours) and answers ``tool_calls``; ``forge-nb-chat`` answers each with a ``tool`` message, from forge_nb's
  :class:`~forge_nb.envs.tools.Tools` run in-process (``python_tool(coder)`` runs in the SandboxedPythonCoder
  service, as verifiers' ``bash`` harness runs its own ``bash`` tool), or from the task's ``vf.Toolset`` MCP
  servers through verifiers' MCP client. verifiers starts those servers itself (``python -m module`` with this
  interpreter: offline, but a process start per rollout, or per group for a taskset's shared ones), and a
  process cannot reach a forge_nb service: that is why the coder is a forge_nb tool.
- The key. verifiers reads an endpoint's key only from an environment variable (``api_key_var``), so the
  endpoint's token is set as ``FORGE_NB_<hash>_API_KEY`` (verifiers' subprocess runtime keeps variables named
  ``*API_KEY*`` out of the processes it starts).
- Serving. ``Env.serving()`` is held while any rollout of the env is in flight and closed after the last:
  nothing runs between steps, and rollout loops that overlap their groups share its interception server and
  that server's relay client, which verifiers keeps one of per endpoint configuration. Every rollout names the
  endpoint's one URL for that (not its trajectory's), and forge_nb's harness binds the rollout's trace id to the
  trajectory (``OpenAIEndpoint.bind_session``): verifiers sends that id with each call it relays
  (``X-Session-ID``). An env with a seat of another harness keeps a URL per trajectory, and a relay client per
  rollout. The harness's own calls go through the endpoint's connection pool (``OpenAIEndpoint.http``).
- A conversation that spends the trajectory's token budget (the endpoint answers "context_length_exceeded")
  ends there and is scored, as verifiers' own chat loop treats a full context.

Which task a group plays: ``sample["vf_task"]`` (an index into the env's taskset) when the run's task gives
one, else the env's own sampling (the taskset shuffled under ``seed``, cycled), one task per group. A taskset
that never ends (``INFINITE``) is bounded with ``num_tasks``.

Logging: verifiers' library logs through stdlib logging only (loguru and rich are its CLIs'), silent until a
handler is added. From the first call here its ``verifiers.v1`` records are re-logged on this module's logger
when that has a handler (a run's ``kernel.log``, or one the user put on the root logger), and dropped
otherwise, as verifiers drops them: never printed into a cell. A toolset server's output goes to a log file in
its runtime's scratch folder.

Limits: a seat that is not trainable (a user simulator's) calls the run's model through the trajectory's URL
too, unless its ``AgentConfig`` names a ``client`` of its own, so its answers are trained as the policy's.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import functools
import hashlib
import importlib.machinery
import inspect
import itertools
import json
import logging
import os
import random
import sys
import types
import weakref
from collections.abc import AsyncIterator, Mapping
from typing import TYPE_CHECKING, Any

from forge_nb.envs.tools import ToolCall, Tools
from forge_nb.system.importpath import require
from forge_nb.system.processes.proclogs import drop_actor_prefix

if TYPE_CHECKING:
    from forge_nb.controller.context import RolloutContext

__all__ = ["HARNESS_ID", "local_env", "verifiers_episode"]

log = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'forge_nb[envs]'"
HARNESS_ID = "forge-nb-chat"
"""The id of forge_nb's in-process harness, for a seat's ``harness={"id": HARNESS_ID}``."""
_HARNESS_MODULE = "verifiers.v1.harnesses.forge_nb_chat"
_TASKSET_PREFIX = "verifiers.v1.tasksets."


@dataclasses.dataclass(frozen=True, slots=True)
class _Seat:
    """What the harness of one rollout needs from forge_nb: the tools it runs, the run's endpoint (its shared
    HTTP client), and the trajectory to bind the rollout's trace to (None: the rollout calls the trajectory's
    own URL)."""

    tools: Tools | None
    endpoint: Any
    trajectory: Any


_SEAT: contextvars.ContextVar[_Seat | None] = contextvars.ContextVar("forge_nb_vf_seat", default=None)
_SERVED: contextvars.ContextVar[Any] = contextvars.ContextVar("forge_nb_vf_endpoint", default=None)


# -- the episode function ---------------------------------------------------------------------------------------


def verifiers_episode(env: Any, *, tools: Tools | Mapping[str, Any] | None = None,
                      sampling: dict[str, Any] | None = None, num_tasks: int | None = None, seed: int = 0,
                      **options: Any) -> Any:
    """An episode function (``async (run, sample) -> group``) playing one verifiers episode of ``env`` per
    trajectory of a group, all of one task; the episode's reward is the trajectory's.

    ``env``: a ``vf.Env`` whose seats run locally (:func:`local_env` makes one); ``tools``: forge_nb tools
    (a :class:`~forge_nb.envs.tools.Tools`, or ``{name: fn}``) the ``forge-nb-chat`` harness offers the model
    and runs, in every seat it plays; ``sampling``: verifiers' sampling settings for every call
    (``{"max_tokens": 64, "temperature": 1.0}``); ``num_tasks``: how many of the taskset's tasks to play
    (required when it never ends); ``seed``: the order the env's own sampling plays them in. Other
    ``options`` go to :func:`~forge_nb.agents.episode.agent_episode`."""
    vf = _plugin().vf
    if not isinstance(env, vf.Env):
        raise TypeError(f"verifiers_episode(env={env!r}): needs a verifiers.v1 Env; make one of a taskset with "
                        "forge_nb.agents.verifiers_env.local_env(MyTaskset)")
    if isinstance(tools, Mapping):
        tools = Tools(tools)
    if tools is not None and not isinstance(tools, Tools):
        raise TypeError(f"verifiers_episode(tools={tools!r}): pass forge_nb.envs.tools.Tools({{name: fn}})")
    _check_seats(env)
    # Every seat plays forge_nb's harness: it binds its rollout's trace to the trajectory, so every rollout can
    # name the endpoint's one URL and verifiers' interception server keeps one client for all of them.
    bind = all(h.id == HARNESS_ID for h in env.config.agent_harnesses().values())
    tasks = _tasks(env, num_tasks)
    order = itertools.cycle(random.Random(seed).sample(range(len(tasks)), len(tasks)))
    sampling_config = vf.SamplingConfig.model_validate(sampling or {})
    serving = _serving(env)

    from forge_nb.agents.episode import agent_episode

    async def agent(client: Any, sample: dict[str, Any]) -> float:
        task, served = tasks[sample["vf_task"]], _SERVED.get()
        own_url = str(client.base_url).rstrip("/")
        trajectory = served.trajectory_at(own_url) if bind else None
        ctx = vf.ModelContext(model=client.model, sampling=sampling_config, client=vf.EvalClientConfig(
            base_url=served.url if trajectory is not None else own_url, api_key_var=_key_variable(client.api_key)))
        token = _SEAT.set(_Seat(tools, served, trajectory))
        try:
            async with serving.hold():
                episode = await env.run_episode(task, ctx)
        finally:
            _SEAT.reset(token)
        return _reward(episode)

    play = agent_episode(agent, **options)

    async def episode(run: RolloutContext, sample: dict[str, Any]) -> Any:
        index = sample.get("vf_task")
        if index is None:
            index = next(order)
        elif isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < len(tasks):
            raise ValueError(f"sample['vf_task']={index!r}: an index into the env's {len(tasks)} tasks")
        token = _SERVED.set(options.get("endpoint") or run.openai or await run.openai_endpoint())
        try:
            return await play(run, {**sample, "vf_task": index, "request": tasks[index].data.prompt_text})
        finally:
            _SERVED.reset(token)

    return episode


def _reward(episode: Any) -> float:
    """The episode's reward: the mean of its trainable traces' rewards; an episode that failed raises."""
    failed = [*episode.errors, *(e for t in episode.traces if not t.ok for e in t.errors[-1:])]
    if failed or not episode.ok:
        why = "; ".join(f"{e.type}: {e.message}" for e in failed) or "an agent's run did not complete"
        raise RuntimeError(f"the verifiers episode failed ({why[:800]})")
    traces = [t for t in episode.traces if t.agent is None or t.agent.trainable] or episode.traces
    return sum(t.reward for t in traces) / len(traces)


def _tasks(env: Any, num_tasks: int | None) -> list[Any]:
    taskset = env.taskset
    if num_tasks is not None:
        if isinstance(num_tasks, bool) or not isinstance(num_tasks, int) or num_tasks < 1:
            raise ValueError(f"verifiers_episode(num_tasks={num_tasks!r}): a positive int")
        taskset = taskset.take(num_tasks)
    elif not taskset.bounded:
        raise ValueError(f"{type(env.taskset).__name__} never ends: bound it with verifiers_episode(num_tasks=N)")
    tasks = list(taskset)
    if not tasks:
        raise ValueError(f"{type(env.taskset).__name__}.load() yielded no task")
    return tasks


def _check_seats(env: Any) -> None:
    """Every seat runs here, in the subprocess runtime (not a container, not a remote sandbox), with a harness
    that does not run the model's commands on this machine (``bash`` would, as the kernel's user)."""
    from verifiers.v1.configs.agent import agent_config_fields
    from verifiers.v1.utils.loaders import harness_class

    fix = "build the env with local_env(), or give the seat vf.AgentConfig(runtime=vf.SubprocessConfig(), " \
          f"harness={{'id': {HARNESS_ID!r}}})"
    harnesses = env.config.agent_harnesses()
    for name, seat in agent_config_fields(env.config).items():
        if seat.runtime.type != "subprocess":
            raise ValueError(f"the env's seat {name!r} runs in a {seat.runtime.type!r} runtime (a container or a "
                             f"remote sandbox), not on this machine: {fix}")
        if harness_class(harnesses[name].id).EXECUTES_CODE:
            raise ValueError(f"the env's seat {name!r} plays with the {harnesses[name].id!r} harness, which runs the "
                             "model's commands on this machine as the kernel's user; run code in forge_nb's sandbox "
                             f"instead (verifiers_episode(tools=Tools({{'python': python_tool(coder)}}))): {fix}")


def _key_variable(api_key: str) -> str:
    """The environment variable verifiers reads the endpoint's key from (it takes no key itself)."""
    name = f"FORGE_NB_{hashlib.sha256(api_key.encode()).hexdigest()[:12].upper()}_API_KEY"
    os.environ[name] = api_key
    return name


class _Serving:
    """``env.serving()`` held while any rollout of the env is in flight (verifiers keeps its state on the env)."""

    def __init__(self, env: Any):
        self.env, self.users, self.context = env, 0, None
        self.lock = asyncio.Lock()

    @contextlib.asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        async with self.lock:
            if self.users == 0:
                context = self.env.serving()
                await context.__aenter__()
                self.context = context
            self.users += 1
        try:
            yield
        finally:
            async with self.lock:
                self.users -= 1
                if self.users == 0:
                    context, self.context = self.context, None
                    await context.__aexit__(None, None, None)


_SERVINGS: weakref.WeakKeyDictionary[Any, _Serving] = weakref.WeakKeyDictionary()


def _serving(env: Any) -> _Serving:
    if env not in _SERVINGS:
        _SERVINGS[env] = _Serving(env)
    return _SERVINGS[env]


# -- a local env from a taskset class ---------------------------------------------------------------------------


def local_env(taskset: Any, env: type | None = None, **config: Any) -> Any:
    """A verifiers Env playing ``taskset`` (a ``vf.Taskset`` subclass, or an instance for its config) with
    every seat in this process: the ``subprocess`` runtime, and ``forge-nb-chat`` as the harness of a seat
    that names none or verifiers' ``null`` (the same tool-less loop, run through uv), unless ``config`` says
    otherwise. ``env``: the ``vf.Env`` subclass (``vf.SingleAgentEnv`` by default); ``config``: its config's
    fields (``agent=vf.AgentConfig(max_turns=3)``, a multi-agent env's roles).

    The taskset class may live in a notebook cell: it is registered under an id verifiers can load."""
    vf = _plugin().vf
    from verifiers.v1.configs.agent import AgentConfig
    from verifiers.v1.utils.generic import concrete_type

    cls = taskset if isinstance(taskset, type) else type(taskset)
    if not issubclass(cls, vf.Taskset):
        raise TypeError(f"local_env(taskset={taskset!r}): needs a verifiers.v1 Taskset subclass or instance")
    env_cls = env or vf.SingleAgentEnv
    if not (isinstance(env_cls, type) and issubclass(env_cls, vf.Env)):
        raise TypeError(f"local_env(env={env!r}): needs a verifiers.v1 Env subclass")
    taskset_id = _register(_TASKSET_PREFIX + _module_name(cls), cls)
    config_cls = concrete_type(env_cls, vf.EnvConfig, origin=vf.Env) or vf.EnvConfig
    data = {k: v.model_dump(exclude_unset=True) if isinstance(v, vf.BaseConfig) else v for k, v in config.items()}
    own = {} if isinstance(taskset, type) else taskset.config.model_dump(exclude_unset=True)
    data["taskset"] = {**own, **data.get("taskset", {}), "id": taskset_id}
    for name, field in config_cls.model_fields.items():
        if isinstance(field.default, AgentConfig):
            seat = dict(data.get(name) or {})
            declared = field.default.harness
            if "harness" not in seat and (declared is None or declared.id == "null"):  # null: the same loop, uv's
                seat["harness"] = {"id": HARNESS_ID}
            seat.setdefault("runtime", {"type": "subprocess"})
            data[name] = seat
    return env_cls(config_cls.model_validate(data))


def _module_name(cls: type) -> str:
    digest = hashlib.sha256(f"{cls.__module__}.{cls.__qualname__}".encode()).hexdigest()[:10]
    return f"forge_nb_{cls.__name__.lower()}_{digest}"


def _register(name: str, *exports: type) -> str:
    """A module named ``name`` exporting ``exports`` in ``sys.modules``, as verifiers' plugin loader finds
    one; its id (the last part of the name)."""
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None)
    module.__all__ = [cls.__name__ for cls in exports]
    for cls in exports:
        setattr(module, cls.__name__, cls)
    sys.modules[name] = module
    return name.rsplit(".", 1)[-1]


# -- the in-process harness -------------------------------------------------------------------------------------


@functools.cache
def _plugin() -> types.SimpleNamespace:
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
            seat = _SEAT.get()
            if seat is not None and seat.trajectory is not None:  # the calls reach the endpoint's own URL
                seat.endpoint.bind_session(trace.id, seat.trajectory)
            code, detail = await _chat(ctx.model, endpoint, secret, system, prompt, mcp_urls, seat)
            return ProgramResult(exit_code=code, stdout="", stderr=detail)

    _register(_HARNESS_MODULE, ForgeChatHarness, ForgeChatHarnessConfig)
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
                mcp_urls: dict[str, str], seat: _Seat | None) -> tuple[int, str]:
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
