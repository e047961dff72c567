"""Tools: calls parsed from actions in both syntaxes, run with every failure answered, and the sandboxed
coder as a tool through a real SandboxedPythonCoder service (bubblewrap, real processes)."""

from __future__ import annotations

import asyncio
import os

import pytest

from forge_nb.actors.coder import SandboxedPythonCoder
from forge_nb.envs.tools import ToolCall, Tools, python_tool


def test_hermes_calls_are_parsed_from_the_chat_template_s_tags() -> None:
    tools = Tools({"add": lambda a, b: a + b})
    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    assert tools.parse(text) == ToolCall("add", {"a": 2, "b": 3})
    as_string = '<tool_call>{"name": "add", "arguments": "{\\"a\\": 1, \\"b\\": 1}"}</tool_call>'
    assert tools.parse(as_string) == ToolCall("add", {"a": 1, "b": 1})
    assert tools.parse("the answer is 5") is None
    assert "not JSON" in tools.parse("<tool_call>{name: add}</tool_call>")
    assert "name" in tools.parse('<tool_call>{"arguments": {}}</tool_call>')
    cut = '<tool_call>{"name": "add", "arguments": {"a": 1, "b": 2}}'  # the action ran out of tokens first
    assert tools.parse(cut) == ToolCall("add", {"a": 1, "b": 2})


def test_simple_calls_take_the_rest_of_the_line_as_the_one_argument() -> None:
    tools = Tools({"rev": lambda input: input[::-1]}, syntax="simple")
    assert tools.parse("@rev abc") == ToolCall("rev", {"input": "abc"})
    assert tools.parse("thinking\n@rev a b\nc") == ToolCall("rev", {"input": "a b\nc"})
    assert tools.parse("mail me @ home") is None and tools.parse("abc") is None
    with pytest.raises(ValueError, match="hermes"):
        Tools({}, syntax="json")
    with pytest.raises(TypeError, match="not a callable"):
        Tools({"x": 3})


@pytest.mark.asyncio
async def test_every_failure_is_an_answer_the_policy_reads() -> None:
    def boom(input: str) -> str:
        raise ValueError("bad input " + input)

    async def slow(input: str) -> str:
        await asyncio.sleep(5)
        return input

    tools = Tools({"rev": lambda input: input[::-1], "boom": boom, "slow": slow}, syntax="simple", timeout_s=0.2)
    ok = await tools.call(tools.parse("@rev abc"))
    assert (ok.ok, ok.output, tools.format(ok)) == (True, "cba", "cba\n")
    unknown = await tools.call(tools.parse("@nope x"))
    assert not unknown.ok and "no tool named 'nope'" in unknown.output and "boom" in unknown.output
    failed = await tools.call(tools.parse("@boom x"))
    assert not failed.ok and failed.output == "ValueError: bad input x"
    assert tools.format(failed) == "error: ValueError: bad input x\n"
    late = await tools.call(tools.parse("@slow x"))
    assert not late.ok and "longer than 0.2 s" in late.output
    wrong_args = await tools.call(ToolCall("rev", {"text": "x"}))
    assert not wrong_args.ok and "TypeError" in wrong_args.output
    hermes = Tools({})
    bad = await hermes.call(hermes.parse("<tool_call>{oops</tool_call>"))
    assert not bad.ok and hermes.format(bad).startswith("<tool_response>\nerror: the tool call is not JSON")


@pytest.mark.asyncio
async def test_the_sandboxed_coder_is_a_tool() -> None:
    coder = await SandboxedPythonCoder.options(num_replicas=1).as_service(timeout_s=2.0, memory_mb=256)
    try:
        tools = Tools({"python": python_tool(coder)})
        ran = await tools.call(tools.parse('<tool_call>{"name": "python", "arguments": '
                                           '{"code": "print(sum(range(10)))"}}</tool_call>'))
        assert (ran.ok, ran.output) == (True, "45")
        crashed = await tools.call(ToolCall("python", {"code": "import sys; print('out'); sys.exit(3)"}))
        assert not crashed.ok and "exit code 3" in crashed.output and "out" in crashed.output
        probe = f"/etc/forge_nb_probe_{os.getpid()}"
        wrote = await tools.call(ToolCall("python", {"code": f"open({probe!r}, 'w').write('x'); print('wrote')"}))
        assert not os.path.exists(probe), "the tool's write reached the host"
        assert wrote.output == "wrote" or not wrote.ok  # written inside the sandbox, or refused there
        simple = Tools({"python": python_tool(coder)}, syntax="simple")
        assert (await simple.call(simple.parse("@python print(6*7)"))).output == "42"
    finally:
        await coder.shutdown()
