"""Chat messages to the policy's token ids and back: the chat template, and tool calls parsed out of an answer.

The endpoint renders a request's messages with the model's own chat template (``apply_chat_template`` with
the request's ``tools``), as vLLM's server does. What the model writes is read back for tool calls in the
syntax the endpoint was started with: ``"hermes"`` (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
what Qwen3's and most open models' templates teach) or ``"simple"`` (a line ``@name argument``, for the tiny
local models); both are :func:`forge_nb.envs.tools.find_tool_calls`, the parser the multi-turn episodes use.

Messages are compared by :func:`message_key`: role, text, tool calls (name and arguments as JSON values) and
``tool_call_id``. Two renderings of one conversation can differ in whitespace or key order where the
messages do not, which is why the recorder matches messages and never re-tokenised text.

Considered: vLLM's tool parsers (``vllm.tool_parsers``, one per model family). Importing one brings vLLM into
the kernel (8 s, 670 MB here); the two syntaxes above cover the models forge_nb recipes use, and a model with
a format of its own passes ``tool_parser=fn`` (text -> ``(content, calls)``, as vLLM's parsers answer).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from forge_nb.envs.tools import ToolCall, find_tool_calls

__all__ = ["ParsedAnswer", "ToolParser", "hf_message", "message_key", "message_text", "parse_answer"]

ToolParser = str | Callable[[str], "tuple[str | None, list[ToolCall]] | list[ToolCall]"]
"""``"hermes"``, ``"simple"``, or a function of the answer's text returning ``(content, calls)``: the text without
the calls, and the calls (what vLLM's tool parsers return). A function that returns the calls alone answers
with no content where it found calls: it does not say which text was the call."""


def message_text(content: Any) -> str:
    """A message's content as text (a list of text parts joined; None is empty)."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(str(part.get("text", "")) for part in content)


def _arguments(value: Any) -> Any:
    """Tool-call arguments as JSON values (OpenAI sends them as a JSON string; templates want the object)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value


def _calls(message: dict[str, Any]) -> list[tuple[str, Any]]:
    out = []
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        out.append((str(function.get("name", "")), _arguments(function.get("arguments", {}))))
    return out


def message_key(message: dict[str, Any]) -> str:
    """What identifies a message in a conversation, as one comparable string."""
    return json.dumps([message.get("role"), message_text(message.get("content")), _calls(message),
                       message.get("tool_call_id")], sort_keys=True)


def hf_message(message: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI message in the shape chat templates read: text content, tool calls with object arguments."""
    out: dict[str, Any] = {"role": message["role"], "content": message_text(message.get("content"))}
    if message.get("tool_calls"):
        out["tool_calls"] = [{"type": "function", "id": c.get("id"), "function": {"name": name, "arguments": args}}
                             for c, (name, args) in zip(message["tool_calls"], _calls(message), strict=True)]
    for name in ("tool_call_id", "name"):
        if message.get(name) is not None:
            out[name] = message[name]
    return out


@dataclass(slots=True)
class ParsedAnswer:
    """An answer read for tool calls: the text around them, the calls, and whether every attempt parsed."""

    content: str | None
    tool_calls: list[dict[str, Any]]
    ok: bool

    def message(self) -> dict[str, Any]:
        """The assistant message as the client receives it (what a next request sends back)."""
        message: dict[str, Any] = {"role": "assistant", "content": self.content}
        if self.tool_calls:
            message["tool_calls"] = self.tool_calls
        return message


def parse_answer(text: str, parser: ToolParser | None) -> ParsedAnswer:
    """``text`` with its tool calls taken out (``parser`` None: no tools asked for, the text as it is).
    A call that was attempted but does not parse stays in the text and marks the answer not ``ok``."""
    if parser is None:
        return ParsedAnswer(text, [], True)
    if callable(parser):
        parsed, ok = parser(text), True
        if isinstance(parsed, tuple):  # (content, calls): the parser took its calls' text out itself
            content, calls = parsed[0] or "", list(parsed[1])
        else:
            calls = list(parsed)
            content = "" if calls else text
    else:
        found = find_tool_calls(text, parser)  # type: ignore[arg-type]
        calls = [call for _, call in found if isinstance(call, ToolCall)]
        ok = len(calls) == len(found)
        content = text
        for (start, end), call in reversed(found):
            if isinstance(call, ToolCall):
                content = content[:start] + content[end:]
    wire = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
             "function": {"name": call.name, "arguments": json.dumps(call.arguments)}} for call in calls]
    content = content.strip() if calls else content
    return ParsedAnswer(content or None if calls else content, wire, ok)
