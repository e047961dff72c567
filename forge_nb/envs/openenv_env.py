"""OpenEnvEnv: an `OpenEnv <https://github.com/meta-pytorch/OpenEnv>`_ environment (``openenv-core``) hosted in
EnvPool, in-process: no server, no container, no network.

OpenEnv's server-side ``Environment`` (``openenv.core.env_server.interfaces``) is a plain object with
pydantic models: ``reset(seed=None, episode_id=None, **kw) -> Observation`` and ``step(action: Action,
timeout_s=None, **kw) -> Observation``, where the observation carries ``done``, ``reward`` (``None``
allowed) and ``metadata`` besides its own fields; ``reset_async`` / ``step_async`` default to the sync
methods and an environment overrides them for real async work (OpenEnv's server awaits an override and
otherwise runs the sync method in a thread pool). This adapter turns the policy's text into the
environment's ``Action`` model and the ``Observation`` back into text::

    env = await EnvPool.options(num_replicas=2).as_service(OpenEnvEnv, environment="my_envs:GuessEnv",
                                                            max_number=20)
    run.episode_fn = multi_turn_episode(env, max_turns=5)

``pip install 'forge_nb[envs]'`` installs ``openenv-core==0.3.0``; it is imported by the class, never by
this module. Importing ``openenv.core`` takes a few seconds (it loads FastAPI, fastmcp and gradio for its
server and web interface) in every process that hosts the environment, once. openenv-core ships no
environments: the catalogue's are separate packages (an ``Environment`` subclass in a ``server`` module,
hostable here once installed), Docker images, or Hugging Face Spaces.

Remote environments: openenv-core's clients (``EnvClient``, ``GenericEnvClient``, ``SyncEnvClient``) talk
to an OpenEnv server over a WebSocket, one session (one environment object on the server) per client;
their ``reset``/``step`` are async and return ``StepResult(observation, reward, done)`` with the
observation's ``metadata`` dropped by the server's serializer. That is another shape (and a network
connection per trajectory), so this adapter does not drive them; it hosts the ``Environment`` class the
server would host, which is the same code without the wire. A client adapter would be a small sibling (a
client per trajectory in place of the environment object), with ``info`` always empty.
"""

from __future__ import annotations

import inspect
import json
import logging
import typing
from collections.abc import Callable
from typing import Any

from forge_nb.actors.coder import StepResult
from forge_nb.envs.adapters import _quiet, _require, clean_action
from forge_nb.system.importpath import import_path
from forge_nb.system.monarch_compat import await_maybe

__all__ = ["OpenEnvEnv", "render_observation"]

log = logging.getLogger(__name__)

_NOT_FIELDS = {"reward", "done", "metadata"}  # what OpenEnv's own serializer leaves out of an observation
_WARNED_SEEDLESS: set[type] = set()


def _render(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


def _blank(value: Any) -> bool:
    return value is None or (isinstance(value, str) and not value)


def render_observation(observation: Any) -> str:
    """The default ``to_text``: an observation's own fields (all but ``reward``, ``done`` and ``metadata``,
    which OpenEnv's server leaves out too), in declaration order. A single field is shown as its value
    alone; several as ``name: value`` lines (a value with line breaks starts on the line after its name),
    strings as they are and anything else as JSON (``model_dump(mode="json")``). Fields that are ``None`` or
    ``""`` are left out."""
    try:  # JSON-ready values: nested models as dicts, enums as their values
        fields = observation.model_dump(mode="json", exclude=_NOT_FIELDS, serialize_as_any=True)
    except Exception:  # a field pydantic cannot serialize (arbitrary types are allowed): the objects
        fields = {name: getattr(observation, name) for name in type(observation).model_fields
                  if name not in _NOT_FIELDS}
    shown = {name: value for name, value in fields.items() if not _blank(value)}
    if len(fields) == 1:
        return _render(next(iter(shown.values()), ""))
    lines = []
    for name, value in shown.items():
        text = _render(value)
        lines.append(f"{name}:\n{text}" if "\n" in text else f"{name}: {text}")
    return "\n".join(lines)


def _overrides(env: Any, name: str, base: type) -> bool:
    """Whether ``env``'s class overrides ``base.name`` (how OpenEnv's server picks ``reset_async``)."""
    return getattr(type(env), name, None) is not getattr(base, name, None)


def _action_class(env_cls: type, base_action: type, base_env: type) -> type | None:
    """The environment's Action model: the annotation of ``step``'s (or ``step_async``'s) ``action``, else
    the first argument of ``Environment[ActT, ObsT, StateT]`` among its bases; None if neither names one."""

    def specific(candidate: Any) -> type | None:
        ok = isinstance(candidate, type) and issubclass(candidate, base_action) and candidate is not base_action
        return candidate if ok else None

    for method in ("step_async", "step"):
        fn = getattr(env_cls, method, None)
        if fn is None or fn is getattr(base_env, method):
            continue
        try:
            found = specific(typing.get_type_hints(fn).get("action"))
        except Exception:  # an annotation that does not resolve: try the generic parameters
            found = None
        if found:
            return found
    for klass in env_cls.__mro__:
        for generic in getattr(klass, "__orig_bases__", ()):
            origin = typing.get_origin(generic)
            if isinstance(origin, type) and issubclass(origin, base_env):
                args = typing.get_args(generic)
                if args and (found := specific(args[0])):
                    return found
    return None


def _text_field(action_cls: type) -> str | None:
    required = [(name, f) for name, f in action_cls.model_fields.items() if f.is_required()]
    if len(required) == 1 and required[0][1].annotation is str:
        return required[0][0]
    return None


class OpenEnvEnv:
    """``OpenEnvEnv(environment, *, to_action=None, to_text=None, **kwargs)``: one OpenEnv environment,
    ``environment(**kwargs)``, per trajectory. ``environment`` is an ``openenv.core`` ``Environment``
    subclass, a function that makes one, or its path ``"package.module:Class"``; the replicas import it by
    name, so it (and ``to_action`` / ``to_text``) must live in an importable module, not a notebook cell.

    Actions: ``to_action(text) -> Action`` makes the environment's ``Action`` model from the policy's text,
    cleaned first (surrounding whitespace and trailing end-of-text tokens dropped, see
    :func:`~forge_nb.envs.adapters.clean_action`). Without it, an Action model with exactly one required
    ``str`` field gets the text in that field (OpenEnv's echo template, ``message: str``); any other model is
    a TypeError at construction that says to pass ``to_action``. The model is the annotation of ``step``'s
    ``action`` or the ``Environment[Action, Observation, State]`` parameter. Text the model refuses (a
    length or pattern constraint) is a ValueError, as the server's 422 would be: the trajectory is dropped.

    Observations: ``to_text(observation) -> str`` (default :func:`render_observation`: the observation's own
    fields, one alone as its value, several as ``name: value`` lines), laid out as the other adapters do:
    the first observation ends with a newline, later ones start and end with one.

    ``reset(seed)`` passes ``seed`` when the environment's ``reset`` takes one (or ``**kwargs``); one that
    does not is warned about once per process, as a GRPO group then does not share a start. ``step``
    returns the observation's text, its ``reward`` (``None``, which OpenEnv allows for "no reward this
    step", is 0.0), ``done``, and ``info``: a copy of the observation's ``metadata``. ``reset_async`` /
    ``step_async`` are awaited when the environment overrides them; otherwise the sync methods run on the
    replica's event loop (as EnvPool runs any sync environment), so an environment with slow steps should
    override ``step_async``. What the sync methods print goes to DEBUG on ``forge_nb.envs.adapters`` (not
    what async ones print: see :meth:`_call`), and ``close`` calls the environment's ``close``. The OpenEnv
    object is ``.env``.
    """

    def __init__(self, environment: type | Callable[..., Any] | str, *, to_action: Callable[[str], Any] | None = None,
                 to_text: Callable[[Any], str] | None = None, **kwargs: Any):
        self.core = _require("openenv.core.env_server", "openenv-core")
        base_env, self.base_action = self.core.Environment, self.core.Action
        if isinstance(environment, str):
            environment = import_path(environment, label="OpenEnvEnv(environment)", where="in this process")
        if not callable(environment):
            raise TypeError(f"OpenEnvEnv(environment={environment!r}): pass an openenv Environment subclass, a "
                            "function that makes one, or its path 'package.module:Class'")
        with _quiet(f"{getattr(environment, '__name__', environment)}()"):
            self.env = environment(**kwargs)
        if not isinstance(self.env, base_env):
            hint = (" That is a client for an OpenEnv server; host the server's Environment class here instead."
                    if any(k.__name__.endswith("EnvClient") for k in type(self.env).__mro__) else "")
            raise TypeError(f"OpenEnvEnv: {type(self.env).__name__} is not an openenv.core Environment.{hint}")
        self.name = type(self.env).__name__
        self.to_text = to_text or render_observation
        self.action_cls = _action_class(type(self.env), self.base_action, base_env)
        if to_action is not None:
            self.to_action, self.field = to_action, None
        else:
            self.field = _text_field(self.action_cls) if self.action_cls else None
            if self.field is None:
                raise TypeError(self._no_default_action())
            self.to_action = self._fill
        self.async_reset = _overrides(self.env, "reset_async", base_env)
        self.async_step = _overrides(self.env, "step_async", base_env)
        reset = self.env.reset_async if self.async_reset else self.env.reset
        params = inspect.signature(reset).parameters.values()
        self.takes_seed = any(p.name == "seed" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
        self.started = self.done = False

    def _no_default_action(self) -> str:
        if self.action_cls is None:
            what = (f"{self.name}.step does not name its Action model (annotate step's action, or subclass "
                    "Environment[MyAction, MyObservation, State])")
        else:
            fields = ", ".join(f"{n}: {getattr(f.annotation, '__name__', f.annotation)}"
                               f"{'' if f.is_required() else ' (optional)'}"
                               for n, f in self.action_cls.model_fields.items() if n != "metadata")
            what = f"{self.action_cls.__name__} has fields ({fields}), not exactly one required str field"
        return (f"OpenEnvEnv({self.name}): {what}, so the policy's text has no default place; pass "
                "to_action=a function (text) -> Action, defined in an importable module")

    def _fill(self, text: str) -> Any:
        try:
            return self.action_cls(**{self.field: text})
        except ValueError as e:  # pydantic's ValidationError is a ValueError
            errors = e.errors() if hasattr(e, "errors") else []
            why = "; ".join(f"{'.'.join(map(str, err['loc']))}: {err['msg']}" for err in errors) or str(e)
            raise ValueError(f"OpenEnvEnv({self.name}): {self.action_cls.__name__} refuses the action "
                             f"{text[:200]!r} ({why})") from e

    def _text(self, observation: Any, first: bool) -> str:
        if not isinstance(observation, self.core.Observation):
            raise TypeError(f"OpenEnvEnv: {self.name} returned a {type(observation).__name__}, not an openenv "
                            "Observation")
        body = str(self.to_text(observation)).strip("\n")
        return f"{body}\n" if first else f"\n{body}\n" if body else "\n"

    async def reset(self, seed: int | None = None) -> str:
        kwargs: dict[str, Any] = {}
        if self.takes_seed:
            kwargs["seed"] = seed
        elif seed is not None and type(self.env) not in _WARNED_SEEDLESS:
            _WARNED_SEEDLESS.add(type(self.env))
            log.warning("OpenEnvEnv: %s.reset takes no seed, so the seed is not passed: a GRPO group's "
                        "trajectories start from different states", self.name)
        observation = await self._call("reset", self.async_reset, **kwargs)
        self.started, self.done = True, False
        return self._text(observation, first=True)

    async def step(self, action: str) -> StepResult:
        if not self.started:
            raise RuntimeError(f"OpenEnvEnv({self.name}).step() before reset()")
        if self.done:
            raise RuntimeError(f"OpenEnvEnv({self.name}): the episode has ended; reset() for another")
        act = self.to_action(clean_action(action))
        if not isinstance(act, self.base_action) or (self.action_cls and not isinstance(act, self.action_cls)):
            want = self.action_cls.__name__ if self.action_cls else "an openenv Action"
            raise TypeError(f"OpenEnvEnv({self.name}): to_action returned a {type(act).__name__}; "
                            f"{self.name}.step takes {want}")
        observation = await self._call("step", self.async_step, act)
        text = self._text(observation, first=False)
        self.done = bool(observation.done)
        reward = 0.0 if observation.reward is None else float(observation.reward)
        return StepResult(observation=text, reward=reward, done=self.done, info=dict(observation.metadata))

    async def close(self) -> None:
        await self._call("close", False)

    async def _call(self, method: str, use_async: bool, *args: Any, **kwargs: Any) -> Any:
        """``env.<method>_async`` awaited, or ``env.<method>`` called with its prints kept out of the cell.
        Only a plain call is quieted: stdout redirected across an await would catch what other trajectories
        print meanwhile, and two such redirections ending out of order would leave it redirected."""
        if use_async:
            return await getattr(self.env, f"{method}_async")(*args, **kwargs)
        with _quiet(f"{self.name}.{method}"):
            result = getattr(self.env, method)(*args, **kwargs)
        return await await_maybe(result)  # an environment that made the plain method async
