"""Answers read for tool calls: a parser of the user's own takes its calls' text out of the content, as the
built-in ones do (no engine: parse_answer is plain text in, message out)."""

from __future__ import annotations

import json
import re

from forge_nb.agents.conversation import parse_answer
from forge_nb.envs.tools import ToolCall

TEXT = 'Let me look. [[lookup(city="Oslo")]]'
CALL = re.compile(r"\[\[(\w+)\(city=\"(\w+)\"\)\]\]")


def brackets(text: str) -> tuple[str, list[ToolCall]]:
    """A model's own call syntax: ``[[name(city="...")]]``; returns the text without it, and the calls."""
    calls = [ToolCall(m.group(1), {"city": m.group(2)}) for m in CALL.finditer(text)]
    return CALL.sub("", text), calls


def test_a_parser_function_returns_the_content_without_the_call_s_text() -> None:
    answer = parse_answer(TEXT, brackets)
    assert answer.content == "Let me look." and answer.ok
    (call,) = answer.tool_calls
    assert call["function"]["name"] == "lookup" and json.loads(call["function"]["arguments"]) == {"city": "Oslo"}
    assert parse_answer("Oslo is cold.", brackets).message() == {"role": "assistant", "content": "Oslo is cold."}


def test_a_parser_function_that_returns_calls_alone_answers_no_content_beside_them() -> None:
    answer = parse_answer(TEXT, lambda text: brackets(text)[1])  # it cannot say which text was the call
    assert answer.content is None and len(answer.tool_calls) == 1
    assert parse_answer("Oslo is cold.", lambda text: []).content == "Oslo is cold."


def test_the_built_in_parsers_take_the_call_out_as_before() -> None:
    answer = parse_answer('Sure. <tool_call>{"name": "lookup", "arguments": {"city": "Oslo"}}</tool_call>', "hermes")
    assert answer.content == "Sure." and answer.tool_calls[0]["function"]["name"] == "lookup"
