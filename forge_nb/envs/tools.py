"""Tools: a policy's tool call parsed from its action, run by the kernel (a function or a service such as the
sandboxed coder), and its result returned as the trajectory's next observation.

``multi_turn_episode(env, tools=Tools({"python": python_tool(coder)}))``: at each turn the episode asks
``Tools.parse`` whether the action is a tool call. If it is, the tool runs and its result is the next
observation (the environment does not see the call, and the turn earns no reward); if not, the action goes
to the environment's ``step``. A tool turn counts against ``max_turns`` and the token budget like any other.

Two call syntaxes:

- ``"hermes"``: what Qwen3's and most open models' chat templates emit,
  ``<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>``; the result comes back
  as ``<tool_response>...</tool_response>``.
- ``"simple"``, for tiny models that cannot write JSON: a line ``@name argument`` calls ``name`` with the
  rest of the line (and the lines after it) as its one argument, ``input``; the result comes back as its text
  and a newline.

A tool is any callable taking the call's arguments as keyword arguments and returning text (sync or async).
One that raises, times out, or is not known is a failed call: its error is the observation, so the policy can
learn from it, and the turn's info records ``tool_ok=False`` (the dashboard plots the success rate). Tools
run in the kernel's event loop: a tool that does real work should be a service call, as ``python_tool`` is.

Considered: the chat template's own tool parsing in vLLM (``--tool-call-parser hermes``; it works on the
OpenAI server's chat messages, not on the token-id prompts the episode sends) and the ``verifiers``
library's tool environments (they keep the conversation as OpenAI messages and call an OpenAI client).
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal

from forge_nb.system.monarch_compat import await_maybe

__all__ = ["ToolCall", "ToolFailed", "ToolResult", "Tools", "find_tool_calls", "python_tool"]

Syntax = Literal["hermes", "simple"]
_HERMES = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)
_SIMPLE = re.compile(r"^@([A-Za-z_][\w.-]*)(?:[ \t]+|$)(.*)", re.DOTALL | re.MULTILINE)


@dataclass(frozen=True, slots=True)
class ToolCall:
    name: str
    arguments: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ToolResult:
    call: ToolCall
    ok: bool
    output: str


class Tools:
    """The tools a policy may call, by name, and the syntax its calls are written in."""

    def __init__(self, tools: Mapping[str, Callable[..., Any]], *, syntax: Syntax = "hermes",
                 parse: Callable[[str], ToolCall | str | None] | None = None,
                 timeout_s: float = 30.0, max_output: int = 2000):
        if syntax not in ("hermes", "simple"):
            raise ValueError(f"Tools(syntax={syntax!r}): use 'hermes' (<tool_call>{{json}}</tool_call>, what "
                             "chat templates emit) or 'simple' (a line '@name argument', for tiny models)")
        for name, fn in tools.items():
            if not callable(fn):
                raise TypeError(f"Tools: tool {name!r} is {fn!r}, not a callable; a service's endpoint is "
                                "wrapped by a function (see python_tool)")
        self.tools, self.syntax, self.timeout_s, self.max_output = dict(tools), syntax, timeout_s, max_output
        self._parse = parse

    def parse(self, action: str) -> ToolCall | str | None:
        """The action's tool call; None when it makes none; a string saying why when it tried and failed
        (JSON that does not parse, no name): that is answered as a failed call. ``Tools(parse=fn)`` replaces
        this with ``fn`` (a model with a call format of its own); ``syntax`` still says how results read."""
        if self._parse is not None:
            return self._parse(action)
        found = find_tool_calls(action, self.syntax)
        return found[0][1] if found else None

    async def call(self, call: ToolCall | str) -> ToolResult:
        """Run one parsed call; every failure is a result with ``ok=False`` and the reason as its output."""
        if isinstance(call, str):
            return ToolResult(ToolCall("", {}), False, call)
        fn = self.tools.get(call.name)
        if fn is None:
            return ToolResult(call, False, f"no tool named {call.name!r}; the tools are {sorted(self.tools)}")
        try:
            async with asyncio.timeout(self.timeout_s):
                output = await await_maybe(fn(**call.arguments))
        except TimeoutError:
            return ToolResult(call, False, f"tool {call.name!r} took longer than {self.timeout_s:g} s")
        except Exception as e:  # the policy wrote a bad call, or the tool failed: the policy reads why
            return ToolResult(call, False, f"{type(e).__name__}: {e}"[: self.max_output])
        return ToolResult(call, True, str(output)[: self.max_output])

    def content(self, result: ToolResult) -> str:
        """A result as the content of a chat's tool message (the chat template frames it)."""
        return result.output if result.ok else f"error: {result.output}"

    def format(self, result: ToolResult) -> str:
        """The observation that carries a result back to a policy that reads raw text."""
        text = self.content(result)
        return f"<tool_response>\n{text}\n</tool_response>\n" if self.syntax == "hermes" else f"{text}\n"


def find_tool_calls(text: str, syntax: Syntax = "hermes") -> list[tuple[tuple[int, int], ToolCall | str]]:
    """Every tool call written in ``text``, in order, with the span it takes: a :class:`ToolCall`, or a string
    saying why a call that was attempted does not parse. The ``"simple"`` syntax has at most one call (its
    argument runs to the end of the text)."""
    if syntax == "simple":
        match = _SIMPLE.search(text)
        return [] if match is None else [(match.span(), ToolCall(match.group(1), {"input": match.group(2).strip()}))]
    return [(match.span(), _hermes_call(match.group(1))) for match in _HERMES.finditer(text)]


def _hermes_call(body: str) -> ToolCall | str:
    try:
        call = json.loads(body)
    except json.JSONDecodeError as e:
        return f"the tool call is not JSON ({e.msg} at character {e.pos})"
    if not isinstance(call, dict) or not isinstance(call.get("name"), str):
        return 'a tool call is {"name": "<tool>", "arguments": {...}}'
    arguments = call.get("arguments") or {}
    if isinstance(arguments, str):  # some templates write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            arguments = {"input": arguments}
    if not isinstance(arguments, dict):
        return "a tool call's arguments are a JSON object"
    return ToolCall(call["name"], arguments)


class ToolFailed(RuntimeError):
    """Raised by a tool whose work failed (a program that exited non-zero): the policy reads the output."""


def python_tool(coder: Any, timeout_s: float | None = None) -> Callable[..., Any]:
    """A tool running Python in a :class:`~forge_nb.actors.coder.SandboxedPythonCoder` service: the argument
    is ``code`` (or ``input``, the simple syntax's one argument); the result is the program's output."""

    async def python(code: str | None = None, input: str | None = None) -> str:  # noqa: A002 (the call's name)
        source = code if code is not None else input
        if not source:
            raise ValueError("python needs code to run: {\"code\": \"print(1)\"}")
        result = await coder.execute.route(source, timeout_s=timeout_s)
        output = result.stdout + (result.stderr[-500:] if result.stderr else "")
        if result.exit_code != 0:
            raise ToolFailed(f"exit code {result.exit_code}: {output.strip()}")
        return output.strip()

    return python
